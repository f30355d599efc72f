"""What the safety tests share: the tiny pre-training settings, snapshots of folders, the
one-error-line check, and the ways a checkpoint gets damaged."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from sameloss import config as configlib
from sameloss.training import PretrainConfig

TINY = ["batch_size=16", "model.size=micro", "language.name=hmm", "language.preset=micro", "eval.every=0",
        "eval.n_sentences=32", "optim.warmup_steps=2", "device=cpu"]


def tiny_config(*overrides: str) -> PretrainConfig:
    return configlib.load(PretrainConfig, None, [*TINY, *overrides])


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` with its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("sameloss: error: "), err
    return err[0]


def copy_run(runs: Path, name: str, tmp_path: Path) -> Path:
    out = tmp_path / "runs"
    out.mkdir(exist_ok=True)
    shutil.copytree(runs / name, out / name)
    return out / name


def _garbage(path: Path) -> None:
    path.write_bytes(bytes(range(256)) * 3)


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _wrong_shape(path: Path) -> None:
    from safetensors.torch import load_file
    tensors = load_file(str(path))
    name = next(iter(tensors))
    tensors[name] = torch.zeros(*(s + 1 for s in tensors[name].shape))
    save_file(tensors, str(path))


def _no_config(path: Path) -> None:
    meta = json.loads(path.read_text())
    del meta["config"]
    path.write_text(json.dumps(meta))


CHECKPOINT_DAMAGE = {
    "safetensors-truncated": ("model.safetensors", _truncate),
    "safetensors-garbage": ("model.safetensors", _garbage),
    "safetensors-empty": ("model.safetensors", lambda p: p.write_bytes(b"")),
    "safetensors-missing": ("model.safetensors", Path.unlink),
    "safetensors-wrong-shape": ("model.safetensors", _wrong_shape),
    "state-truncated": ("state.pt", _truncate),
    "state-garbage": ("state.pt", _garbage),
    "state-missing": ("state.pt", Path.unlink),
    "meta-garbage": ("meta.json", _garbage),
    "meta-empty": ("meta.json", lambda p: p.write_text("")),
    "meta-no-config": ("meta.json", _no_config),
}


WEIGHT_DAMAGE = [k for k, (f, _) in CHECKPOINT_DAMAGE.items() if f != "state.pt"]  # what measure/embed read


def damage(checkpoint: Path, kind: str) -> Path:
    name, how = CHECKPOINT_DAMAGE[kind]
    how(checkpoint / name)
    return checkpoint / name

