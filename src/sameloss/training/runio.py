"""Run I/O: the one place that turns a config or a run folder into objects.

* ``resolve_device`` — ``auto`` / ``cpu`` / ``cuda`` to a ``torch.device``;
  ``resolve_precision`` / ``autocast`` — the training arithmetic (``precision``);
* ``build_language`` — the language a config names;
* ``init_model`` — the config's model, freshly constructed (no optimiser, no SAM);
* ``load_checkpoint`` — ``(model, language, config, meta)`` from a checkpoint folder,
  reading ``meta.json`` once and leaving the global RNG as it was (as nanoGPT's
  ``sample.py`` rebuilds a model from its saved ``model_args``);
* the run folder's own files: ``read_config_dict`` (``config.toml``), ``read_summary`` /
  ``write_summary`` (``summary.json``; whether a run finished is ``runfolder``'s to say), ``append_metrics`` /
  ``read_metrics`` / ``eval_history`` / ``truncate_metrics`` (``metrics.jsonl``) and
  ``remove_run`` (``--fresh``).

Checkpoint files themselves (safetensors, ``state.pt``, ``meta.json``) are read and
written by ``checkpoint.py``; the optimiser is built by ``optim.py``.
"""

from __future__ import annotations

import json
import shutil
import tomllib
from pathlib import Path
from typing import NamedTuple

import torch

from .. import config as configlib
from .. import files, resources, storage
from ..errors import UserError, first_line
from ..jsonl import read_jsonl
from ..languages import CausalSettings, make_language
from ..models import model_kind
from . import checkpoint as ckpt
from .config import PretrainConfig


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise UserError("device 'cuda' requested but no CUDA device is available")
    return torch.device(name)


def resolve_precision(precision: str, device: torch.device | str) -> torch.dtype:
    """The dtype the training passes compute in: ``"bf16"`` → ``torch.bfloat16`` (under
    ``torch.autocast``), ``"fp32"`` → ``torch.float32``; ``"auto"`` is bfloat16 on CUDA
    (its tensor cores; ``bench/bench_bf16.py`` times the two) and float32 on the CPU, where
    the tiny models here gain less and the project's published numbers were taken in
    float32."""
    if precision == "auto":
        return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
    if precision == "bf16":
        return torch.bfloat16
    if precision == "fp32":
        return torch.float32
    raise UserError(f"precision must be auto, bf16 or fp32, got {precision!r}")


def autocast(precision: str, device: torch.device | str):
    """The context the training forward passes run in: ``torch.autocast`` to bfloat16 for
    ``bf16`` (on any device type; the parameters stay float32 master weights), nothing for
    ``fp32``. Measures never run inside it."""
    import contextlib

    device = torch.device(device)
    if resolve_precision(precision, device) == torch.bfloat16 and device.type != "meta":  # meta: no arithmetic
        # (the placement tests run the loop on meta tensors, which autocast does not take)
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def build_language(cfg: PretrainConfig):
    lc = cfg.language
    if lc.name == "causal" and cfg.masking != "single":
        # refused before anything is written: the exact loss needs one masked word per sentence
        raise UserError("the causal language needs masking=single: its exact conditionals take one masked "
                        "position per sentence (m masked positions cost K^m forward passes)")
    return make_language(lc.name, preset=lc.size, seed=lc.seed, params=lc.params, grammar=lc.grammar, data=lc.data,
                         causal=CausalSettings(generator=lc.generator, k=lc.k, length=lc.length, pool=lc.pool),
                         device=cfg.device)


def init_model(cfg: PretrainConfig, language, device: torch.device | str = "cpu") -> torch.nn.Module:
    """The config's model, constructed on the CPU and moved to ``device``. Its initial
    weights are drawn from the global RNG: ``pretrain`` seeds it with ``cfg.seed`` first,
    ``load_checkpoint`` draws inside ``fork_rng`` and overwrites them."""
    kind = model_kind(cfg.model.kind)
    return kind.build(cfg.model.size, language.vocab_size, language.max_len, **kind.overrides(cfg.model)).to(device)


class LoadedCheckpoint(NamedTuple):
    model: torch.nn.Module
    language: object
    config: PretrainConfig
    meta: dict


def checkpoint_config(path: Path, meta: dict) -> PretrainConfig:
    """The ``PretrainConfig`` stored in a checkpoint's ``meta.json``; a damaged one is a
    ``CorruptCheckpoint`` naming the file."""
    try:
        return configlib.from_dict(PretrainConfig, meta["config"])
    except UserError as exc:
        raise ckpt.CorruptCheckpoint(Path(path) / "meta.json", f"its config is invalid ({exc})") from None


def load_checkpoint(path: str | Path, device: str | torch.device = "cpu") -> LoadedCheckpoint:
    """Load a checkpoint folder with the language and config it was trained on.

    No global side effect: the throw-away initialisation runs inside ``fork_rng``.

    Args:
        path: a checkpoint folder (``runs/NAME/checkpoints/step_N``).
        device: where the model goes.

    Returns:
        ``(model, language, config, meta)``: the model in eval mode, its language, its
        ``PretrainConfig`` and the checkpoint's ``meta.json`` (step, ...).
    """
    path = Path(path)
    if not path.is_dir():
        raise UserError(f"no such checkpoint: {path}")
    if not (path / "meta.json").exists():
        raise UserError(f"{path} is not a checkpoint (no meta.json)")
    meta = ckpt.read_meta(path)
    cfg = checkpoint_config(path, meta)
    language = build_language(cfg)
    with torch.random.fork_rng(devices=[]):
        model = init_model(cfg, language, device)
    ckpt.load_weights(path, model)
    model.eval()
    return LoadedCheckpoint(model, language, cfg, meta)


def read_config_dict(path: Path) -> dict:
    """A run's ``config.toml`` as a dict, as ``configlib.to_dict`` of its config would be:
    old key names renamed, and a missing key filled with its default (a run saved before
    the key existed, or a ``None`` value, which TOML omits). A saved config that is no
    longer valid is returned as read, to be compared key by key. ``UserError`` naming the
    file if missing or damaged."""
    if not path.exists():
        raise UserError(f"cannot resume: {path} is missing")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise UserError(f"{path}: unreadable ({exc})") from None
    data = configlib.renamed(PretrainConfig, data)
    try:
        return configlib.to_dict(configlib.from_dict(PretrainConfig, data))
    except (UserError, TypeError, ValueError):
        return data


def read_summary(run_dir: str | Path) -> dict | None:
    """``summary.json`` of a run (None if absent); ``UserError`` naming it if damaged."""
    path = Path(run_dir) / "summary.json"
    if not path.exists():
        return None
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserError(f"{path}: unreadable ({first_line(exc)})") from None
    if not isinstance(summary, dict):
        raise UserError(f"{path}: not a JSON object")
    return summary


def write_summary(run_dir: Path, step: int, last_eval: dict, model: torch.nn.Module) -> None:
    summary = {"step": step, "eval": last_eval, "parameters": sum(p.numel() for p in model.parameters())}
    try:
        files.atomic_write_text(run_dir / "summary.json", json.dumps(summary, indent=2))
    except OSError as exc:
        raise storage.write_error(run_dir / "summary.json", exc) from None


METRICS = "metrics.jsonl"


def append_metrics(run_dir: Path, record: dict) -> None:
    """One log record (a JSON line) at the end of the run's ``metrics.jsonl``."""
    path = Path(run_dir) / METRICS
    try:
        with path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
    except OSError as exc:
        raise storage.write_error(path, exc) from None


def _metric_lines(path: Path, hint: str = "") -> list[tuple[str, dict]]:
    """``(line, record)`` for every record of a ``metrics.jsonl``; an unfinished last line
    (a kill or a full disk mid-write) is left out; any other line that is not a record is
    a ``UserError`` naming the file and line (``hint`` appended)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: unreadable ({first_line(exc)})") from None
    return read_jsonl(path, text, lambda r: isinstance(r.get("step"), int),
                      "a metrics record (JSON with an integer 'step')", unfinished_last=True, hint=hint)


def read_metrics(run_dir: str | Path) -> list[dict]:
    """The records of a run's ``metrics.jsonl``, in order (``UserError`` naming the file,
    and the line, if it is missing or damaged; an unfinished last line is left out)."""
    return [record for _, record in _metric_lines(Path(run_dir) / METRICS)]


def eval_history(run_dir: str | Path) -> dict[int, dict]:
    """``{step: the exact held-out evaluation logged at that step}`` of a run."""
    return {r["step"]: r["eval"] for r in read_metrics(run_dir) if r.get("eval")}


def truncate_metrics(path: Path, step: int) -> None:
    """Drop log lines written after the checkpoint a run resumes from (they will be
    redone). An unfinished last line (a kill or a full disk mid-write) is dropped too; a
    damaged line before it is an error naming the file and line."""
    if not path.exists():
        return
    kept = [line for line, record in _metric_lines(path, "; repair or delete the line to resume")
            if record["step"] <= step]
    try:
        files.atomic_write_text(path, "".join(ln + "\n" for ln in kept))
    except OSError as exc:
        raise storage.write_error(path, exc) from None


def remove_run(run_dir: Path) -> None:
    """Delete a run folder for ``--fresh`` — only one sameloss recognises as a run, and only
    when everything in it is sameloss's (``files.foreign_in_run``)."""
    if run_dir.is_symlink() or not files.is_run_dir(run_dir):
        raise UserError(f"{run_dir} is not a sameloss run folder (no {files.RUN_MARKER} marker and no config.toml "
                        "written by sameloss pretrain); --fresh deletes only run folders: remove it yourself or "
                        "choose another name=")
    check_only_ours(run_dir, "--fresh")
    shutil.rmtree(run_dir)


def check_only_ours(folder: Path, what: str) -> None:
    """``UserError`` naming the first entry of the run (or embed) folder ``folder`` that
    sameloss did not write: ``what`` (``--fresh``, ``--force``) deletes nothing then."""
    foreign = files.foreign_in_run(folder)
    if foreign:
        more = f" (and {len(foreign) - 1} more)" if len(foreign) > 1 else ""
        raise UserError(f"{what} deletes only what sameloss wrote, and {folder} also holds {foreign[0]}{more}; "
                        "move it away (or delete the folder yourself) and run again")


# ---- what a run needs, checked before it allocates (``resources``) -----------------------
def training_bytes(cfg, language, model) -> int:
    """A lower bound of one training step: the weights, their gradients, AdamW's two
    moments (SAM: one more copy for the ascent) in float32, and the activations the
    backward pass keeps (``model`` on the meta device gives the shapes)."""
    n_params = sum(p.numel() for p in model.parameters())
    copies = 4 + (1 if cfg.sam.rho > 0 else 0)
    from ..models import kind_of_config

    kind = kind_of_config(model.config)  # its activations per token: the kind says (a lower bound)
    per_token = kind.activations_per_token(model.config, language.max_len) if kind is not None else 0
    tokens = cfg.batch_size * language.max_len
    logits = tokens * language.vocab_size * 2  # the logits and their gradient
    return (n_params * copies + tokens * per_token + logits) * resources.FLOAT32


def meta_model(cfg, language):
    """The config's model built on the meta device: shapes only, no memory, no RNG draw."""
    with torch.random.fork_rng(devices=[]), torch.device("meta"):
        return init_model(cfg, language, torch.device("meta"))


def check_pretrain(cfg, language, device) -> None:
    """Refuse a pre-training run whose model or held-out evaluation cannot fit."""
    model = meta_model(cfg, language)
    n_params = sum(p.numel() for p in model.parameters())
    resources.check(training_bytes(cfg, language, model),
                    f"training {cfg.name!r} ({n_params:.3g} parameters, batch {cfg.batch_size} of "
                    f"{language.max_len} tokens)",
                    "choose a smaller model (model.size, model.d_model, model.n_layers, ...) or batch_size", device)
    rate = None if cfg.masking == "single" else cfg.mask_rate
    resources.check(resources.evaluation_bytes(cfg.eval.n_sentences, language, rate),
                    f"the held-out evaluation of eval.n_sentences={cfg.eval.n_sentences}", "lower eval.n_sentences")

