"""Checkpoints: ``<run>/checkpoints/step_NNNNNNN/`` holding

* ``model.safetensors`` — the weights (tied embeddings handled by ``save_model``);
* ``state.pt`` — optimiser, schedule and RNG states, for an exact resume;
* ``meta.json`` — step, config and metrics at that step; written last, so a directory
  without it is an interrupted write and is ignored.

Each checkpoint is written into a temporary directory and renamed into place, so a
crash never leaves a half-written checkpoint under a real name.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_model, save_model

PREFIX = "step_"


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / "checkpoints" / f"{PREFIX}{step:07d}"


def save(run_dir: Path, step: int, model: torch.nn.Module, state: dict, meta: dict) -> Path:
    final = checkpoint_dir(run_dir, step)
    tmp = final.parent / f".tmp-{final.name}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    save_model(model, str(tmp / "model.safetensors"))
    torch.save(state, tmp / "state.pt")
    (tmp / "meta.json").write_text(json.dumps({"step": step, **meta}, indent=2))
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    return final


def complete_checkpoints(run_dir: Path) -> list[Path]:
    """Finished checkpoints of a run, oldest first."""
    root = Path(run_dir) / "checkpoints"
    if not root.exists():
        return []
    found = [p for p in root.iterdir() if p.name.startswith(PREFIX) and (p / "meta.json").exists()]
    return sorted(found, key=lambda p: int(p.name[len(PREFIX):]))


def read_meta(path: Path) -> dict:
    return json.loads((Path(path) / "meta.json").read_text())


def load_weights(path: Path, model: torch.nn.Module) -> None:
    missing, unexpected = load_model(model, str(Path(path) / "model.safetensors"), strict=False)
    # tied output weights are stored once; anything else missing is a real mismatch
    missing = [m for m in missing if not _is_tied_alias(model, m)]
    if missing or unexpected:
        raise RuntimeError(f"checkpoint {path} does not fit the model: missing {missing}, unexpected {unexpected}")


def _is_tied_alias(model: torch.nn.Module, name: str) -> bool:
    params = dict(model.named_parameters(remove_duplicate=False))
    if name not in params:
        return False
    return any(p is params[name] and n != name for n, p in params.items())


def load_state(path: Path) -> dict:
    return torch.load(Path(path) / "state.pt", weights_only=False)


def prune(run_dir: Path, keep_steps: set[int], keep_latest: int = 1) -> None:
    """Delete rolling checkpoints not in ``keep_steps``, except the newest ``keep_latest``."""
    found = complete_checkpoints(run_dir)
    for path in found[:-keep_latest] if keep_latest else found:
        if int(path.name[len(PREFIX):]) not in keep_steps:
            shutil.rmtree(path)
