"""The pre-training loop behind ``sameloss pretrain``.

``pretrain(config, run_dir)`` builds the language, the model (``runio``) and the optimiser
(``optim``), then runs four stages, each a function below:

* **restore** — on ``--resume``, the newest checkpoint that loads: weights, optimiser,
  schedule, RNG state and the open log window;
* **step** — batch ``step`` of the stream (``data.global_batch``, a pure function of seed
  and step), forward/backward (SAM: ascent on one half-batch, update on the other;
  adversarial objective and flatness penalty: added to the loss), clipping, optimiser and
  schedule step;
* **log window** — train loss, tokens/s and steps/s over the steps since the last log
  line, the learning rate and the gradient norm of the log step's update; the exact
  held-out loss (``evaluate.make_evaluator``: exact on a synthetic language, cross-entropy on a corpus) every ``eval.every`` steps; appended to
  ``metrics.jsonl`` and mirrored to the run's tracker (``tracking``: TensorBoard or W&B);
* **save** — checkpoints that make ``resume=True`` continue a killed run to bit-identical
  weights on CPU, and ``summary.json`` at the end.

Under ``torchrun`` it runs data-parallel (DDP); each process takes a slice of the same
global batch and the loss is normalised by the global number of targets, so the update
equals the single-process one.
"""

from __future__ import annotations

import contextlib
import math
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from .. import config as configlib
from .. import files, storage
from ..errors import UserError
from ..progress import progress_bar
from . import checkpoint as ckpt
from . import distributed as dist
from . import keyed, runfolder, runio
from .objectives.adversarial import AdversarialObjective
from .config import PretrainConfig
from .data import global_batch
from .evaluate import make_evaluator
from .objectives.flatness import FlatnessPenalty
from .fork import init_from_checkpoint
from .optim import build_optimizer
from .objectives.sam import SAM
from .tracking import Tracker, check_tracker, open_tracker, record_scalars

class TrainingDiverged(UserError):
    """The loss became NaN or infinite."""


def mlm_loss(model, batch, n_targets_global: int, world_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Cross-entropy summed over this process's targets / global target count, times the
    world size (DDP averages gradients over processes), and the plain sum for logging."""
    logits = model(batch.inputs)
    summed = F.cross_entropy(batch.at_masked(logits).float(), batch.at_masked(batch.targets), reduction="sum")
    return summed * (world_size / n_targets_global), summed.detach()


def _warn(message: str) -> None:
    print(f"sameloss: warning: {message}", file=sys.stderr, flush=True)


def pretrain(cfg: PretrainConfig, run_dir: str | Path, resume: bool = False, progress: bool = True,
             stop_after: int | None = None, fresh: bool = False, plan: runfolder.Plan | None = None,
             tracker: str = "none") -> dict:
    """Pre-train the MLM of ``cfg`` into the run folder ``run_dir``.

    Args:
        cfg: every setting of the run (``config.load(PretrainConfig, file, overrides)``).
        run_dir: the run's folder (``runs/NAME``): config.toml, metrics.jsonl, checkpoints.
        resume: continue from the newest checkpoint that loads.
        progress: show a progress bar.
        stop_after: end the call early, as if killed right after that step's checkpoint
            (used to test resuming).
        fresh: replace an earlier run in ``run_dir`` (only a folder sameloss made as a run).
        plan: what to do with the folder, if the caller decided it under the run's lock.
        tracker: ``none``, ``tensorboard`` or ``wandb`` (``tracking``; not part of the
            config: it never changes the trajectory).

    Returns:
        the final exact evaluation: ``loss``, ``entropy``, ``kl`` (with ``kl_std``) and
        ``n_tokens`` on a synthetic language; held-out and training cross-entropy on a corpus.

    What to do with the folder is ``runfolder.plan``'s decision — ``plan`` if the caller
    made it under this run's lock, else made here from ``resume`` / ``fresh``: ``resume``
    continues from the newest checkpoint that loads (damaged newer ones are skipped with a
    warning on stderr), and a finished run is left untouched and its final evaluation
    returned; ``fresh`` replaces a run folder — only one that ``files.is_run_dir``
    recognises, and only once everything else is built; neither refuses an existing run.
    A new run's folder is created after the language, model and evaluator are built, and
    removed again if this call fails before its first checkpoint.

    The run folder's lock (``files.folder_lock``, rank 0 only under DDP) is held for the
    whole call: a second process on the same run gets one line naming the holder."""
    if resume and fresh:
        raise ValueError("resume and fresh contradict each other")
    run_dir = Path(run_dir)
    check_tracker(tracker)  # an unknown tracker or a missing package: one line, before anything is built
    rank, _ = dist.setup()
    with files.folder_lock(run_dir, "run") if rank == 0 else contextlib.nullcontext():
        plan = plan or runfolder.plan(run_dir, cfg, "resume" if resume else "fresh" if fresh else "new")
        if plan.action == "reuse":
            return plan.evaluation
        return _pretrain(cfg, run_dir, plan.action == "resume", progress, stop_after, plan.action == "replace",
                         tracker)


def _pretrain(cfg: PretrainConfig, run_dir: Path, resume: bool, progress: bool, stop_after: int | None,
              fresh: bool, tracker: str) -> dict:
    rank, world_size = dist.setup()
    device = dist.process_device(runio.resolve_device(cfg.device), world_size)
    language = runio.build_language(cfg)
    runio.check_pretrain(cfg, language, device)  # a model or held-out set that cannot fit: one line, now
    torch.manual_seed(cfg.seed)  # the run's RNG stream: the initial weights, then dropout
    model = runio.init_model(cfg, language, device)
    optimizer, schedule = build_optimizer(cfg, model)
    adversary = None
    if cfg.adversarial.weight > 0:
        if world_size > 1:
            raise UserError("the adversarial objective does not support DDP yet; run it in one process")
        a = cfg.adversarial
        adversary = AdversarialObjective(language, a.task, a.weight, a.batch_size, a.pool_size, a.ridge, cfg.seed)
    flatness = None
    if cfg.flatness.weight != 0:
        flatness = FlatnessPenalty(cfg.flatness, language.vocab_size, cfg.seed, rank, world_size)
        flatness.check(model)  # a regex that matches nothing: one line, before the run folder
    rate = None if cfg.masking == "single" else cfg.mask_rate
    evaluator = make_evaluator(language, cfg.eval.n_sentences, rate, cfg.eval.seed, cfg.eval.n_subsets) \
        if rank == 0 else None

    start, window, created = 1, LogWindow(), False
    if resume:
        if rank == 0:  # the run's lock is held: a checkpoint half-saved by a killed call is nobody's
            ckpt.remove_cut_saves(run_dir)
        # (runfolder.plan refused a run past cfg.steps: its newest checkpoint, and so any it restores, is not)
        model, optimizer, schedule, state = _restore(cfg, language, device, run_dir, rank)
        if state["step"] == cfg.steps:  # finished, but summary.json was never written
            meta = ckpt.read_meta(ckpt.checkpoint_dir(run_dir, state["step"]))
            if rank == 0:
                runio.write_summary(run_dir, state["step"], meta.get("eval") or {}, model)
            return meta.get("eval") or {}
        torch.set_rng_state(state["rng"])
        if device.type == "cuda" and state.get("cuda_rng") is not None:
            torch.cuda.set_rng_state(state["cuda_rng"])
        start = state["step"] + 1
        window = LogWindow.restore(state.get("window") or {})
        if rank == 0:
            runio.truncate_metrics(run_dir / "metrics.jsonl", state["step"])
    elif cfg.init_from:  # a fork (training.fork): the checkpoint's weights, moments and step
        start = init_from_checkpoint(cfg, model, optimizer, schedule)
    if cfg.dropout_draws == "keyed":  # keyed masks (training.keyed): the model's dropout sites swapped
        if world_size > 1:
            raise UserError("dropout_draws = keyed does not support DDP yet; run it in one process")
        keyed.install(model, cfg.model.dropout)
    if not resume and rank == 0:
        created = _create_run_dir(cfg, run_dir, fresh)
    run = Run(cfg, run_dir, language, model, dist.wrap(model, device) if world_size > 1 else model, optimizer,
              schedule, evaluator, adversary, device, rank, world_size, window, flatness=flatness)
    try:
        if rank == 0:  # a resumed run's tracker drops what the killed call logged past the checkpoint
            run.tracker = open_tracker(tracker, run_dir, cfg.name, purge_step=start if resume else None,
                                       config=configlib.to_dict(cfg))
        return _train(run, start, progress, stop_after)
    except BaseException:
        # a new run that failed before its first checkpoint holds nothing to resume from:
        # remove what this call created, so the corrected command can run again
        if created and not ckpt.complete_checkpoints(run_dir):
            shutil.rmtree(run_dir, ignore_errors=True)
        raise


def _create_run_dir(cfg: PretrainConfig, run_dir: Path, fresh: bool) -> bool:
    """Make the run folder with its marker and resolved config (``fresh``: replacing a
    run folder); whether this call created it."""
    if fresh and run_dir.exists():
        runio.remove_run(run_dir)
    created = not run_dir.exists()
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        files.mark(run_dir, files.RUN_MARKER, f"sameloss run {cfg.name}")
        files.atomic_write_text(run_dir / "config.toml",
                                f"{files.RUN_CONFIG_HEADER} {cfg.name}\n" + configlib.to_toml(cfg))
    except OSError as exc:
        if created:
            shutil.rmtree(run_dir, ignore_errors=True)
        raise storage.write_error(run_dir, exc) from None
    return created


# ----------------------------------------------------------------------------- restore


def _restore(cfg: PretrainConfig, language, device: torch.device, run_dir: Path, rank: int):
    """Model, optimiser and schedule restored from the newest checkpoint that loads, and
    its training state; every damaged newer one is named in a warning."""
    found = ckpt.step_dirs(run_dir)
    if not found:
        raise UserError(f"nothing to resume in {run_dir}: no complete checkpoint")
    problems = []
    for path in reversed(found):
        with torch.random.fork_rng(devices=[]):  # the weights are overwritten: no draw counts
            model = runio.init_model(cfg, language, device)
        optimizer, schedule = build_optimizer(cfg, model)
        try:
            if not (path / "meta.json").exists():
                raise ckpt.CorruptCheckpoint(path / "meta.json", "missing (not a complete checkpoint)")
            ckpt.read_meta(path)
            state = ckpt.load_state(path)
            ckpt.load_weights(path, model)
            try:
                optimizer.load_state_dict(state["optimizer"])
                schedule.load_state_dict(state["schedule"])
                rng = state["rng"]
                if not (isinstance(rng, torch.Tensor) and rng.dtype == torch.uint8
                        and rng.shape == torch.get_rng_state().shape):
                    raise ValueError("its RNG state is not a CPU generator state")
            except Exception as exc:
                raise ckpt.CorruptCheckpoint(path / "state.pt", f"does not fit this run ({exc})") from None
        except ckpt.CorruptCheckpoint as exc:
            problems.append(str(exc))
            continue
        if rank == 0:
            for problem in problems:
                _warn(f"{problem}; resuming from {path} instead")
        return model, optimizer, schedule, state
    raise UserError(f"nothing to resume in {run_dir}: no valid checkpoint ({problems[0]})")


# ----------------------------------------------------------------------------- step


@dataclass
class StepResult:
    """What a step leaves for the log. Tensors stay on the device: nothing in a step
    waits for the device (``LogWindow`` reads them once per log line)."""

    summed_loss: torch.Tensor  # this process's summed cross-entropy (detached, on the device)
    n_targets: int  # prediction targets of the global batch the update used (counted on the host)
    tokens: torch.Tensor  # non-pad tokens this process saw (on the device)
    downstream: torch.Tensor | None  # the adversarial objective's downstream loss, if any
    grad_norm: torch.Tensor | None = None  # the update's gradient norm (before clipping), at log steps
    flatness: torch.Tensor | None = None  # the flatness penalty's trace estimate (before its weight), if any


@dataclass
class Run:
    """What one training call works on, built once by ``pretrain`` (nanoGPT's train.py keeps
    the same things as module globals). ``model`` is the module whose weights are saved;
    ``train_model`` the one the loss runs through (the DDP wrapper under ``torchrun``)."""

    cfg: PretrainConfig
    run_dir: Path
    language: object
    model: torch.nn.Module
    train_model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    schedule: torch.optim.lr_scheduler.LRScheduler
    evaluator: object | None  # rank 0 only
    adversary: AdversarialObjective | None
    device: torch.device
    rank: int
    world_size: int
    window: LogWindow
    tracker: Tracker = field(default_factory=Tracker)  # rank 0's; a no-op elsewhere
    flatness: FlatnessPenalty | None = None
    last_eval: dict = field(default_factory=dict)
    last_train_loss: float = float("nan")  # shown on the progress bar

    def __post_init__(self):
        self.rate = None if self.cfg.masking == "single" else self.cfg.mask_rate
        self.keep = set(self.cfg.checkpoint_steps())
        self.evaluate_at = set(self.cfg.evaluation_steps())
        self.autocast = runio.autocast(self.cfg.precision, self.device)
        # finite data (a corpus): epochs are logged, as sequences drawn / training sequences
        self.n_train = self.language.n_sequences("train") if hasattr(self.language, "n_sequences") else None


def _step(run: Run, step: int, grad_norm: bool = False) -> StepResult:
    """One update on batch ``step`` of the stream (SAM: ascent on the first half-batch,
    update on the second; ``update_half``: the update on the second half alone; the flatness
    penalty on a slice of the batch the update uses). ``grad_norm``:
    keep the update's gradient norm (a tensor: read at the log step, so no step waits on the
    device for it)."""
    cfg, optimizer = run.cfg, run.optimizer
    draws = _draws(run, step)
    full = global_batch(run.language, cfg.seed, step, cfg.batch_size, run.rate, cfg.mask_replace)
    n_targets, used = full.n_targets, full  # used: the global batch the update uses
    optimizer.zero_grad(set_to_none=True)
    if isinstance(optimizer, SAM):
        ascent, update = full.halves()
        # ascent: this process's own half-batch gradient, not averaged across processes
        with dist.no_sync(run.train_model), run.autocast, draws(keyed.PASS_ASCENT):
            ascent_loss, _ = mlm_loss(run.train_model, ascent.shard(run.rank, run.world_size).to(run.device),
                                      ascent.n_targets, run.world_size)
        ascent_loss.backward()
        optimizer.ascend()
        optimizer.zero_grad(set_to_none=True)
        batch, n_targets, used = update.shard(run.rank, run.world_size).to(run.device), update.n_targets, update
    elif cfg.update_half:  # SAM's update half, without the ascent (the control of its batch size)
        update = full.halves()[1]
        batch, n_targets, used = update.shard(run.rank, run.world_size).to(run.device), update.n_targets, update
    else:
        batch = full.shard(run.rank, run.world_size).to(run.device)
    downstream = None
    with run.autocast:
        with draws(keyed.PASS_UPDATE):
            loss, summed = mlm_loss(run.train_model, batch, n_targets, run.world_size)
        if run.adversary is not None:
            with draws(keyed.PASS_ADVERSARIAL):
                adv_loss, downstream = run.adversary.loss(run.model, step, run.device)
            loss = loss + adv_loss
    flatness = None
    if run.flatness is not None:  # outside autocast: the penalty computes in float32
        penalty, flatness = run.flatness.loss(run.model, used, step)
        loss = loss + penalty
    # a non-finite loss is noticed by the log window (``LogWindow.check``) before the
    # next log line, evaluation or checkpoint: testing it here would wait for the device
    loss.backward()
    norm = None
    if cfg.optim.grad_clip is not None:
        norm = torch.nn.utils.clip_grad_norm_(run.model.parameters(), cfg.optim.grad_clip)
    elif grad_norm:
        norm = torch.nn.utils.get_total_norm([p.grad for p in run.model.parameters() if p.grad is not None])
    optimizer.step()
    run.schedule.step()
    return StepResult(summed, n_targets, (batch.inputs != run.language.pad_id).sum(), downstream,
                      norm if grad_norm else None, flatness)


def _draws(run: Run, step: int):
    """``draws(pass)``: the context of a forward pass's dropout masks (``training.keyed``;
    nothing to open under ``dropout_draws = global``)."""
    cfg = run.cfg
    if cfg.dropout_draws != "keyed":
        return lambda pass_: contextlib.nullcontext()
    sites = run.model.keyed_sites
    return lambda pass_: keyed.draws(keyed.one_model(cfg.seed, step, pass_, cfg.model.dropout, sites, run.device))


# ----------------------------------------------------------------------------- log window


@dataclass
class LogWindow:
    """Sums over the steps since the last log line. Saved in ``state.pt`` so that after a
    resume ``metrics.jsonl`` reads exactly as an uninterrupted run's.

    The per-step sums (loss, tokens, downstream loss, flatness estimate) and the first non-finite loss stay
    on the device, added without reading anything back: a step never waits for the
    device. They are read once per log line, evaluation or checkpoint (``check``,
    ``close``, ``state``). The loss is summed in float64 in step order, exactly as
    Python floats were before (the same numbers in ``metrics.jsonl``)."""

    tokens: int | torch.Tensor = 0
    loss: float | torch.Tensor = 0.0
    targets: int = 0
    downstream: float | torch.Tensor = 0.0
    steps: int = 0
    started: float = field(default_factory=time.perf_counter)
    # (step, loss) of the first step whose loss was not finite; NaN while none was
    diverged: torch.Tensor | None = None
    grad_norm: torch.Tensor | None = None  # of the window's last step (the log step), on the device
    flatness: float | torch.Tensor = 0.0  # the flatness penalty's trace estimates, summed

    @classmethod
    def restore(cls, saved: dict) -> LogWindow:
        return cls(saved.get("tokens", 0), saved.get("loss", 0.0), saved.get("targets", 0),
                   saved.get("downstream", 0.0), saved.get("steps", 0),
                   time.perf_counter() - saved.get("seconds", 0.0), flatness=saved.get("flatness", 0.0))

    def state(self) -> dict:
        return {"tokens": int(self.tokens), "loss": float(self.loss), "targets": self.targets,
                "downstream": float(self.downstream), "steps": self.steps,
                "seconds": time.perf_counter() - self.started, "flatness": float(self.flatness)}

    def add(self, result: StepResult, world_size: int, step: int) -> None:
        summed = result.summed_loss.detach().double()
        self.tokens = self.tokens + result.tokens * world_size
        self.loss = self.loss + summed * world_size
        self.targets += result.n_targets
        if result.downstream is not None:
            self.downstream = self.downstream + result.downstream.detach().double()
        if result.flatness is not None:
            self.flatness = self.flatness + result.flatness.detach().double()
        if result.grad_norm is not None:
            self.grad_norm = result.grad_norm.detach()  # read by ``close``, at the log line
        self.steps += 1
        if self.diverged is None:
            self.diverged = torch.full((2,), float("nan"), dtype=torch.float64, device=summed.device)
        first = torch.isnan(self.diverged[0]) & ~torch.isfinite(summed)
        self.diverged = torch.where(first, torch.stack([torch.full_like(summed, step), summed]), self.diverged)

    def check(self, run_dir: Path) -> None:
        """``TrainingDiverged`` naming the first step whose loss was not finite, and the
        last good checkpoint (reads the device once)."""
        if self.diverged is None:
            return
        step, value = self.diverged.tolist()
        if math.isnan(step):
            return
        good = ckpt.complete_checkpoints(run_dir)
        where = f"; the last good checkpoint is {good[-1]}" if good else ""
        raise TrainingDiverged(f"the training loss became {value} at step {int(step)}{where}")

    def close(self, step: int, lr: float, adversarial: bool, flatness: bool = False) -> dict:
        """The log record of the window, which then starts again (``flatness``: with the mean
        trace estimate of the flatness penalty, ``flatness_trace``)."""
        elapsed = time.perf_counter() - self.started
        record = {"step": step, "lr": lr, "train_loss": float(self.loss) / max(self.targets, 1),
                  "tokens_per_s": int(self.tokens) / max(elapsed, 1e-9), "steps_per_s": self.steps / max(elapsed, 1e-9)}
        if self.grad_norm is not None:
            record["grad_norm"] = float(self.grad_norm)
        if adversarial:
            record["adversarial_downstream_loss"] = float(self.downstream) / self.steps
        if flatness:
            record["flatness_trace"] = float(self.flatness) / self.steps
        self.__init__()
        return record


def _log(run: Run, step: int, bar, logs: bool, evaluates: bool) -> None:
    """Close the log window when ``logs`` (every ``log_every`` steps), evaluate when
    ``evaluates`` (every ``eval.every``, the last step, the kept checkpoints under
    ``eval.at_checkpoints``; rank 0) and append the record to
    ``metrics.jsonl``; the progress bar shows the latest."""
    cfg = run.cfg
    record = None
    if logs:
        record = run.window.close(step, run.schedule.get_last_lr()[0], run.adversary is not None,
                                  run.flatness is not None)
        if run.n_train:
            record["epoch"] = step * cfg.batch_size / run.n_train
    if run.rank != 0:
        return
    if evaluates:
        run.last_eval = run.evaluator.evaluate(run.model, run.device)
        record = (record or {"step": step}) | {"eval": run.last_eval}
    if record is None:
        return
    runio.append_metrics(run.run_dir, record)
    run.tracker.log(record_scalars(record), step)
    run.last_train_loss = record.get("train_loss", run.last_train_loss)
    postfix = {"loss": f"{run.last_train_loss:.4f}"}
    if run.last_eval.get("kl") is not None:
        postfix["KL"] = f"{run.last_eval['kl']:.4f}"
    elif run.last_eval.get("gap") is not None:
        postfix["gap"] = f"{run.last_eval['gap']:.4f}"
    if "tokens_per_s" in record:
        postfix["tok/s"] = f"{record['tokens_per_s']:.0f}"
    bar.set_postfix(postfix, refresh=False)


# ----------------------------------------------------------------------------- save


def _save(run: Run, step: int) -> None:
    """A checkpoint at ``step`` (weights, optimiser, schedule, RNG, the open log window);
    rolling ones not in ``keep`` are pruned."""
    state = {"step": step, "optimizer": run.optimizer.state_dict(), "schedule": run.schedule.state_dict(),
             "rng": torch.get_rng_state(),
             "cuda_rng": torch.cuda.get_rng_state() if run.device.type == "cuda" else None,
             "window": run.window.state()}
    meta = {"config": configlib.to_dict(run.cfg), "eval": run.last_eval if step in run.keep else None}
    ckpt.save(run.run_dir, step, run.model, state, meta)
    ckpt.prune(run.run_dir, run.keep)


# ----------------------------------------------------------------------------- the loop


def _train(run: Run, start: int, progress: bool, stop_after: int | None) -> dict:
    cfg = run.cfg
    bar = progress_bar(total=cfg.steps, initial=start - 1, desc=cfg.name, unit="step",
                       disable=not progress or run.rank != 0)
    step = start - 1
    try:
        run.train_model.train()
        for step in range(start, cfg.steps + 1):
            logs = step % cfg.log_every == 0 or step == cfg.steps
            run.window.add(_step(run, step, grad_norm=logs), run.world_size, step)
            bar.update(1)
            evaluates = run.rank == 0 and step in run.evaluate_at
            saves = step in run.keep or step % cfg.save_every == 0 or step == stop_after
            if logs or evaluates or saves:  # the one read of the device between log lines
                run.window.check(run.run_dir)  # a diverged loss stops the run before it is logged or saved
            _log(run, step, bar, logs, evaluates)
            if saves:
                if run.rank == 0:
                    _save(run, step)
                dist.barrier()
            if stop_after is not None and step >= stop_after:
                break
    finally:
        bar.close()
        run.tracker.close()
    if run.rank == 0 and step == cfg.steps:
        runio.write_summary(run.run_dir, step, run.last_eval, run.model)
    return run.last_eval
