"""The pre-training loop behind ``sameloss pretrain``.

One function, ``pretrain(config, run_dir)``: builds the language, the model and the
optimiser from the config, streams fresh batches (``data.training_batch``), evaluates the
exact loss on a fixed held-out set (``evaluate.ExactEvaluator``), logs to
``metrics.jsonl``, and writes checkpoints that make ``resume=True`` continue a killed run
to bit-identical weights on CPU. Under ``torchrun`` it runs data-parallel (DDP); each
process takes a slice of the same global batch and the loss is normalised by the global
number of targets, so the update equals the single-process one.
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from .. import config as configlib
from ..errors import UserError
from ..languages import make_language
from ..models import build_model
from . import checkpoint as ckpt
from . import distributed as dist
from .config import PretrainConfig
from .adversarial import AdversarialObjective
from .data import global_batch
from .evaluate import make_evaluator
from .sam import SAM

# Config keys that may differ when a run is resumed (they do not change the trajectory).
RESUMABLE_CHANGES = {"steps", "checkpoints", "checkpoints_log", "save_every", "log_every", "device",
                     "eval.every"}


class TrainingDiverged(UserError):
    """The loss became NaN or infinite."""


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise UserError("device 'cuda' requested but no CUDA device is available")
    return torch.device(name)


def build_language(cfg: PretrainConfig):
    lc = cfg.language
    if lc.name == "causal" and cfg.masking != "single":
        # refused before anything is written: the exact loss needs one masked word per sentence
        raise UserError("the causal language needs masking=single: its exact conditionals take one masked "
                        "position per sentence (m masked positions cost K^m forward passes)")
    return make_language(lc.name, preset=lc.size, seed=lc.seed, grammar=lc.grammar,
                         generator=lc.generator, k=lc.k, length=lc.length, device=cfg.device, data=lc.data)


def build(cfg: PretrainConfig, language, device: torch.device):
    """Model, optimiser and learning-rate schedule, freshly initialised from the seed."""
    torch.manual_seed(cfg.seed)
    overrides = {"dropout": cfg.model.dropout, **cfg.model.shape_overrides()}
    if cfg.model.kind == "transformer":
        # the paper's "dropout 0.1" is BERT's: hidden and attention-probability dropout
        overrides.update(norm=cfg.model.norm, attn_dropout=cfg.model.dropout)
    model = build_model(cfg.model.kind, cfg.model.size, language.vocab_size, language.max_len, **overrides).to(device)
    optimizer = make_optimizer(cfg, model)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, cfg.lr_factor)
    if cfg.sam.rho > 0:
        optimizer = SAM(model.parameters(), optimizer, cfg.sam.rho, cfg.sam.adaptive)
    return model, optimizer, schedule


def make_optimizer(cfg: PretrainConfig, model: torch.nn.Module) -> torch.optim.Optimizer:
    """Weight decay on matrices only: biases, LayerNorm parameters and nothing else
    1-dimensional are not decayed (as BERT and the paper's training code do)."""
    o = cfg.optim
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [{"params": decay, "weight_decay": o.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    if o.name == "adamw":
        return torch.optim.AdamW(groups, lr=o.lr, betas=tuple(o.betas), eps=o.eps)
    # torch's SGD couples the decay as an L2 term (weight_decay·θ is added to the gradient),
    # unlike AdamW's decoupled decay: the two coincide only without momentum; with it the
    # decay term is accumulated in the momentum buffer too (the steps recipe's SGD uses 0.9)
    return torch.optim.SGD(groups, lr=o.lr, momentum=o.momentum)


def mlm_loss(model, batch, n_targets_global: int, world_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Cross-entropy summed over this process's targets / global target count, times the
    world size (DDP averages gradients over processes), and the plain sum for logging."""
    logits = model(batch.inputs)
    summed = F.cross_entropy(logits[batch.masked].float(), batch.targets[batch.masked], reduction="sum")
    return summed * (world_size / n_targets_global), summed.detach()


def _check_resumable(saved: dict, current: dict) -> None:
    def flat(d, prefix=""):
        out = {}
        for k, v in d.items():
            if isinstance(v, dict):
                out.update(flat(v, prefix + k + "."))
            else:
                out[prefix + k] = v
        return out

    a, b = flat(saved), flat(current)
    # the number of steps shapes the schedule when warm-up or decay depend on it
    schedule_uses_steps = b.get("optim.warmup_fraction") is not None or b.get("optim.decay_steps", 0) > 0
    for key in sorted(set(a) | set(b)):
        if key in RESUMABLE_CHANGES and not (key == "steps" and schedule_uses_steps):
            continue
        va, vb = a.get(key), b.get(key)
        if isinstance(va, list):
            va = tuple(va)
        if isinstance(vb, list):
            vb = tuple(vb)
        if va != vb:
            raise UserError(f"cannot resume: config key {key!r} was {va!r} and is now {vb!r}")


def pretrain(cfg: PretrainConfig, run_dir: str | Path, resume: bool = False, progress: bool = True,
             stop_after: int | None = None) -> dict:
    """Train; returns the final exact evaluation. ``stop_after`` ends the call early
    (as if killed right after that step's checkpoint) — used to test resuming."""
    run_dir = Path(run_dir)
    rank, world_size = dist.setup()
    device = resolve_device(cfg.device)
    if world_size > 1 and device.type == "cuda":
        device = torch.device("cuda", dist.local_rank())
    language = build_language(cfg)
    model, optimizer, schedule = build(cfg, language, device)
    train_model = dist.wrap(model, device) if world_size > 1 else model
    adversary = None
    if cfg.adversarial.weight > 0:
        if world_size > 1:
            raise UserError("the adversarial objective does not support DDP yet; run it in one process")
        a = cfg.adversarial
        adversary = AdversarialObjective(language, a.task, a.weight, a.batch_size, a.pool_size, a.ridge, cfg.seed)
    rate = None if cfg.masking == "single" else cfg.mask_rate
    keep = set(cfg.checkpoint_steps())
    config_path = run_dir / "config.toml"
    metrics_path = run_dir / "metrics.jsonl"

    start = 1
    if resume:
        found = ckpt.complete_checkpoints(run_dir)
        if not found:
            raise UserError(f"nothing to resume in {run_dir}: no complete checkpoint")
        latest = found[-1]
        _check_resumable(read_config_dict(config_path), configlib.to_dict(cfg))
        ckpt.load_weights(latest, model)
        state = ckpt.load_state(latest)
        optimizer.load_state_dict(state["optimizer"])
        schedule.load_state_dict(state["schedule"])
        torch.set_rng_state(state["rng"])
        if device.type == "cuda" and state.get("cuda_rng") is not None:
            torch.cuda.set_rng_state(state["cuda_rng"])
        start = state["step"] + 1
        if rank == 0:
            _truncate_metrics(metrics_path, state["step"])
    if rank == 0:
        run_dir.mkdir(parents=True, exist_ok=True)
        config_path.write_text(f"# resolved config of run {cfg.name}\n" + configlib.to_toml(cfg))

    evaluator = make_evaluator(language, cfg.eval.n_sentences, rate, cfg.eval.seed, cfg.eval.n_subsets) \
        if rank == 0 else None
    # finite data (a corpus): epochs are logged, as sequences drawn / training sequences
    n_train = language.n_sequences("train") if hasattr(language, "n_sequences") else None
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else contextlib.nullcontext()
    last_eval: dict = {}
    last_train_loss = float("nan")
    tokens_seen, window_loss, window_targets, window_start = 0, 0.0, 0, time.perf_counter()
    window_downstream, window_steps = 0.0, 0
    bar = tqdm(total=cfg.steps, initial=start - 1, desc=cfg.name, unit="step",
               disable=not progress or rank != 0, dynamic_ncols=True, leave=True)
    train_model.train()
    step = start - 1
    for step in range(start, cfg.steps + 1):
        full = global_batch(language, cfg.seed, step, cfg.batch_size, rate, cfg.mask_replace)
        n_targets = full.n_targets
        optimizer.zero_grad(set_to_none=True)
        if isinstance(optimizer, SAM):
            ascent, update = full.halves()
            # ascent: this process's own half-batch gradient, not averaged across processes
            with dist.no_sync(train_model), autocast:
                ascent_loss, _ = mlm_loss(train_model, ascent.shard(rank, world_size).to(device),
                                          ascent.n_targets, world_size)
            ascent_loss.backward()
            optimizer.ascend()
            optimizer.zero_grad(set_to_none=True)
            batch, n_targets = update.shard(rank, world_size).to(device), update.n_targets
        else:
            batch = full.shard(rank, world_size).to(device)
        with autocast:
            loss, summed = mlm_loss(train_model, batch, n_targets, world_size)
            if adversary is not None:
                adv_loss, downstream = adversary.loss(model, step, device)
                loss = loss + adv_loss
        if not torch.isfinite(summed):
            good = ckpt.complete_checkpoints(run_dir)
            where = f"; the last good checkpoint is {good[-1]}" if good else ""
            bar.close()
            raise TrainingDiverged(f"the training loss became {summed.item()} at step {step}{where}")
        loss.backward()
        if cfg.optim.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.grad_clip)
        optimizer.step()
        schedule.step()

        tokens_seen += int((batch.inputs != language.pad_id).sum()) * world_size
        window_loss += float(summed) * world_size
        window_targets += n_targets
        if adversary is not None:
            window_downstream += float(downstream)
        window_steps += 1
        bar.update(1)
        record = None
        if step % cfg.log_every == 0 or step == cfg.steps:
            elapsed = time.perf_counter() - window_start
            record = {"step": step, "lr": schedule.get_last_lr()[0],
                      "train_loss": window_loss / max(window_targets, 1),
                      "tokens_per_s": tokens_seen / max(elapsed, 1e-9)}
            if n_train:
                record["epoch"] = step * cfg.batch_size / n_train
            if adversary is not None:
                record["adversarial_downstream_loss"] = window_downstream / window_steps
            tokens_seen, window_loss, window_targets, window_start = 0, 0.0, 0, time.perf_counter()
            window_downstream, window_steps = 0.0, 0
        if rank == 0 and ((cfg.eval.every and step % cfg.eval.every == 0) or step == cfg.steps):
            last_eval = evaluator.evaluate(model, device)
            record = (record or {"step": step}) | {"eval": last_eval}
        if rank == 0 and record is not None:
            with metrics_path.open("a") as f:
                f.write(json.dumps(record) + "\n")
            last_train_loss = record.get("train_loss", last_train_loss)
            postfix = {"loss": f"{last_train_loss:.4f}"}
            if last_eval and last_eval.get("kl") is not None:
                postfix["KL"] = f"{last_eval['kl']:.4f}"
            elif last_eval.get("gap") is not None:
                postfix["gap"] = f"{last_eval['gap']:.4f}"
            if "tokens_per_s" in record:
                postfix["tok/s"] = f"{record['tokens_per_s']:.0f}"
            bar.set_postfix(postfix, refresh=False)
        if step in keep or step % cfg.save_every == 0 or step == stop_after:
            if rank == 0:
                state = {"step": step, "optimizer": optimizer.state_dict(), "schedule": schedule.state_dict(),
                         "rng": torch.get_rng_state(),
                         "cuda_rng": torch.cuda.get_rng_state() if device.type == "cuda" else None}
                meta = {"config": configlib.to_dict(cfg), "eval": last_eval if step in keep else None}
                ckpt.save(run_dir, step, model, state, meta)
                ckpt.prune(run_dir, keep)
            dist.barrier()
        if stop_after is not None and step >= stop_after:
            break
    bar.close()
    if rank == 0 and step == cfg.steps:
        summary = {"step": step, "eval": last_eval, "parameters": sum(p.numel() for p in model.parameters())}
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return last_eval


def read_config_dict(path: Path) -> dict:
    import tomllib
    if not path.exists():
        raise UserError(f"cannot resume: {path} is missing")
    return configlib.renamed(PretrainConfig, tomllib.loads(path.read_text()))


def _truncate_metrics(path: Path, step: int) -> None:
    """Drop log lines written after the checkpoint we resume from (they will be redone)."""
    if not path.exists():
        return
    lines = [ln for ln in path.read_text().splitlines() if ln.strip() and json.loads(ln)["step"] <= step]
    path.write_text("".join(ln + "\n" for ln in lines))


def load_model_from_checkpoint(path: str | Path, device: str = "cpu"):
    """``(model, language, config)`` from a checkpoint directory (eval mode)."""
    path = Path(path)
    if not (path / "meta.json").exists():
        raise UserError(f"{path} is not a checkpoint (no meta.json)")
    cfg = configlib.from_dict(PretrainConfig, ckpt.read_meta(path)["config"])
    language = build_language(cfg)
    model, _, _ = build(cfg, language, torch.device(device))
    ckpt.load_weights(path, model)
    model.eval()
    return model, language, cfg
