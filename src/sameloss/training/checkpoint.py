"""Checkpoints: ``<run>/checkpoints/step_NNNNNNN/`` holding

* ``model.safetensors`` — the weights (tied embeddings handled by ``save_model``);
* ``state.pt`` — optimiser, schedule and RNG states, for an exact resume;
* ``meta.json`` — step, config and metrics at that step; written last, so a directory
  without it is an interrupted write and is ignored.

Each checkpoint is written into a temporary directory and renamed into place, so a
crash never leaves a half-written checkpoint under a real name; a failed write (a full
disk, also when a library reports it as its own error type) removes the temporary
directory and raises a one-line ``UserError``. Files get the mode a plain ``open`` would
give them (the umask), whatever the writing library does.

Reading a damaged file (truncated, garbage, empty, missing, weights of another shape)
raises ``CorruptCheckpoint`` naming the file, never a library traceback.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_model

from ..errors import UserError
from ..files import honour_umask
from ..storage import storage_reason, write_error

PREFIX = "step_"


class CorruptCheckpoint(UserError):
    """A checkpoint file that cannot be read; the message names the file."""

    def __init__(self, path: Path, reason: str):
        self.path = Path(path)
        super().__init__(f"{path}: {reason}")


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / "checkpoints" / f"{PREFIX}{step:07d}"


def save(run_dir: Path, step: int, model: torch.nn.Module, state: dict, meta: dict) -> Path:
    final = checkpoint_dir(run_dir, step)
    tmp = final.parent / f".tmp-{final.name}-{os.getpid()}"
    try:
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
        save_model(model, str(tmp / "model.safetensors"))
        honour_umask(tmp / "model.safetensors")  # safetensors creates it 0600, the others are 0666 - umask
        with open(tmp / "state.pt", "wb") as f:  # a file object: a full disk stays an OSError in the chain
            torch.save(state, f)
        (tmp / "meta.json").write_text(json.dumps({"step": step, **meta}, indent=2))
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException as exc:  # a full disk, a kill: no half-written folder stays behind
        shutil.rmtree(tmp, ignore_errors=True)
        if not isinstance(exc, KeyboardInterrupt) and isinstance(exc.__context__, KeyboardInterrupt):
            # torch.save turns a Ctrl-C or SIGTERM that lands inside one of its writes into a
            # RuntimeError ("unexpected pos ..."): still the interrupt, for every caller
            raise KeyboardInterrupt from None
        if isinstance(exc, OSError) or storage_reason(exc) is not None:
            raise write_error(final, exc) from None
        raise
    return final


def remove_cut_saves(run_dir: Path) -> None:
    """Remove the temporary folders of checkpoint saves cut by a kill (``.tmp-step_N-PID``,
    which ``save`` renames into place only when whole); the caller holds the run's lock."""
    root = Path(run_dir) / "checkpoints"
    if root.is_dir():
        for path in root.glob(f".tmp-{PREFIX}*"):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)


def complete_checkpoints(run_dir: Path) -> list[Path]:
    """Finished checkpoints of a run, oldest first."""
    root = Path(run_dir) / "checkpoints"
    if not root.exists():
        return []
    found = [p for p in root.iterdir() if p.name.startswith(PREFIX) and (p / "meta.json").exists()]
    return sorted(found, key=lambda p: int(p.name[len(PREFIX):]))


def step_dirs(run_dir: Path) -> list[Path]:
    """Every ``step_*`` folder of a run, complete or not, oldest first."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.name.startswith(PREFIX) and p.name[len(PREFIX):].isdigit()]
    return sorted(found, key=lambda p: int(p.name[len(PREFIX):]))


def read_meta(path: Path) -> dict:
    """``meta.json`` of a checkpoint; ``CorruptCheckpoint`` unless it is a JSON object with
    an integer ``step`` and a ``config`` table."""
    file = Path(path) / "meta.json"
    try:
        meta = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CorruptCheckpoint(file, "missing (not a complete checkpoint)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CorruptCheckpoint(file, f"unreadable ({_reason(exc)})") from None
    if not isinstance(meta, dict):
        raise CorruptCheckpoint(file, "not a JSON object")
    if not isinstance(meta.get("step"), int) or isinstance(meta.get("step"), bool):
        raise CorruptCheckpoint(file, "has no integer 'step'")
    if not isinstance(meta.get("config"), dict):
        raise CorruptCheckpoint(file, "has no 'config' table")
    return meta


def load_weights(path: Path, model: torch.nn.Module) -> None:
    """Load ``model.safetensors`` into ``model``; ``CorruptCheckpoint`` if it is missing,
    damaged or holds tensors of other names or shapes (the model is then unchanged)."""
    file = Path(path) / "model.safetensors"
    if not file.is_file():
        raise CorruptCheckpoint(file, "missing")
    try:
        tensors = load_file(str(file))
    except Exception as exc:  # safetensors raises its own error types for damaged files
        raise CorruptCheckpoint(file, f"unreadable ({_reason(exc)})") from None
    expected = model.state_dict()
    # tied output weights are stored once; anything else missing is a real mismatch
    missing = [m for m in expected if m not in tensors and not _is_tied_alias(model, m)]
    unexpected = [n for n in tensors if n not in expected]
    if missing or unexpected:
        raise CorruptCheckpoint(file, f"does not fit the model of meta.json's config: missing {missing[:3]}, "
                                      f"unexpected {unexpected[:3]}")
    wrong = [n for n, t in tensors.items() if t.shape != expected[n].shape]
    if wrong:
        n = wrong[0]
        raise CorruptCheckpoint(file, f"does not fit the model of meta.json's config: {n} has shape "
                                      f"{tuple(tensors[n].shape)}, the model {tuple(expected[n].shape)}")
    model.load_state_dict(tensors, strict=False)  # tied aliases share the one stored tensor


def _is_tied_alias(model: torch.nn.Module, name: str) -> bool:
    params = dict(model.named_parameters(remove_duplicate=False))
    if name not in params:
        return False
    return any(p is params[name] and n != name for n, p in params.items())


def load_state(path: Path) -> dict:
    """``state.pt`` (optimiser, schedule, RNG); ``CorruptCheckpoint`` if unreadable."""
    file = Path(path) / "state.pt"
    if not file.is_file():
        raise CorruptCheckpoint(file, "missing")
    try:
        state = torch.load(file, weights_only=False)
    except Exception as exc:  # pickle, zip and EOF errors of a damaged file
        raise CorruptCheckpoint(file, f"unreadable ({_reason(exc)})") from None
    if not isinstance(state, dict) or not {"step", "optimizer", "schedule", "rng"} <= set(state):
        raise CorruptCheckpoint(file, "is not a sameloss training state")
    return state


def _reason(exc: BaseException) -> str:
    """The first line of an exception's message, short."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text if len(text) <= 120 else text[:117] + "..."


def prune(run_dir: Path, keep_steps: set[int], keep_latest: int = 1) -> None:
    """Delete rolling checkpoints not in ``keep_steps``, except the newest ``keep_latest``."""
    found = complete_checkpoints(run_dir)
    for path in found[:-keep_latest] if keep_latest else found:
        if int(path.name[len(PREFIX):]) not in keep_steps:
            shutil.rmtree(path)
