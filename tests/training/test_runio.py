"""Run I/O: one loader with no global side effects; no two modules import each other."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

import sameloss
from sameloss.training import checkpoint as ckpt
from sameloss.training import runio

PACKAGE = Path(sameloss.__file__).parent
# (the layers' order is checked in tests/experiments/test_layering.py)


def test_load_checkpoint_returns_everything_once_and_leaves_the_global_rng_alone(checkpoint, monkeypatch):
    reads = []
    real = ckpt.read_meta
    monkeypatch.setattr(ckpt, "read_meta", lambda path: reads.append(path) or real(path))
    torch.manual_seed(1234)
    before = torch.get_rng_state()
    model, language, cfg, meta = runio.load_checkpoint(checkpoint)
    assert torch.equal(torch.get_rng_state(), before)  # loading reseeds nothing
    assert len(reads) == 1  # meta.json is read once
    assert meta["step"] == 120 and meta["config"]["name"] == cfg.name
    assert not model.training
    assert language.vocab_size == model(torch.zeros(1, 3, dtype=torch.long)).shape[-1]
    # the weights are the checkpoint's, not a fresh initialisation
    again = runio.load_checkpoint(checkpoint).model
    fresh = runio.init_model(cfg, language)
    name, weight = next(iter(model.state_dict().items()))
    assert torch.equal(weight, again.state_dict()[name])
    assert not torch.equal(weight, fresh.state_dict()[name])


def test_metrics_are_read_through_runio(tmp_path):
    from sameloss.errors import UserError

    runio.append_metrics(tmp_path, {"step": 10, "train_loss": 1.5})
    runio.append_metrics(tmp_path, {"step": 20, "eval": {"kl": 0.25}})
    runio.append_metrics(tmp_path, {"step": 30, "train_loss": 1.2, "eval": {"kl": 0.125}})
    assert [r["step"] for r in runio.read_metrics(tmp_path)] == [10, 20, 30]
    assert runio.eval_history(tmp_path) == {20: {"kl": 0.25}, 30: {"kl": 0.125}}
    path = tmp_path / "metrics.jsonl"
    path.write_text(path.read_text() + '{"step": 4')  # a kill mid-write: the unfinished line is left out
    assert len(runio.read_metrics(tmp_path)) == 3
    path.write_text('{"step": 1}\nnot json\n{"step": 2}\n')
    with pytest.raises(UserError, match=r"metrics.jsonl:2: not a metrics record"):
        runio.read_metrics(tmp_path)
    with pytest.raises(UserError, match="unreadable"):
        runio.read_metrics(tmp_path / "nowhere")


def _imported_modules(path: Path) -> set[str]:
    """The sameloss modules a file imports, at its top or inside functions."""
    module = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if module[-1] == "__init__":
        module = module[:-1] + ["__init__"]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = module[:-node.level] if node.level else []
            name = ".".join(base + ([node.module] if node.module else []))
            found.add(name)
            found.update(f"{name}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return {n for n in found if n.startswith("sameloss.")}


def test_no_two_modules_import_each_other():
    """A circle (``lm_generated`` ↔ ``lm_train`` was one) hides which module is the base."""
    paths = {".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts): p for p in PACKAGE.rglob("*.py")
             if p.name != "__init__.py"}
    imports = {name: _imported_modules(path) & set(paths) for name, path in paths.items()}
    circles = sorted({tuple(sorted((a, b))) for a in imports for b in imports[a] if a in imports.get(b, ())})
    assert circles == []
