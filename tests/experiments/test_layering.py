"""Recipes declare, the layers do: nothing under ``experiments/`` trains or differentiates
(no optimiser, ``.backward()``, ``autograd.grad``, L-BFGS, ``functional_call``, nor the
training loop's pieces) — training lives in ``training/``, measuring in ``measures/``."""

from __future__ import annotations

import ast
from pathlib import Path

import sameloss

EXPERIMENTS = Path(sameloss.__file__).parent / "experiments"
# attribute or name uses that mean training or differentiating by hand
FORBIDDEN_NAMES = {"backward", "zero_grad", "LBFGS", "AdamW", "Adam", "SGD", "functional_call", "grad", "vjp", "jvp",
                   "vmap", "build_optimizer", "make_optimizer", "mlm_loss", "global_batch", "clip_grad_norm_"}
FORBIDDEN_MODULES = ("torch.optim", "torch.autograd", "torch.func", "sameloss.training.optim",
                     "sameloss.training.sam", "sameloss.training.data")


def _violations(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    module = "sameloss." + ".".join(path.relative_to(EXPERIMENTS.parent).with_suffix("").parts)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in FORBIDDEN_NAMES:
            found.append(f"{path.name}:{node.lineno} .{node.attr}")
        elif isinstance(node, ast.Name) and node.id in FORBIDDEN_NAMES:
            found.append(f"{path.name}:{node.lineno} {node.id}")
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            if isinstance(node, ast.ImportFrom):
                base = module.split(".")[:-node.level] if node.level else []
                names = [".".join(base + ([node.module] if node.module else []))]
                names += [f"{names[0]}.{a.name}" for a in node.names]
                found += [f"{path.name}:{node.lineno} imports {a.name}" for a in node.names
                          if a.name in FORBIDDEN_NAMES]
            else:
                names = [a.name for a in node.names]
            found += [f"{path.name}:{node.lineno} imports {n}" for n in names if n.startswith(FORBIDDEN_MODULES)]
    return found


def test_nothing_under_experiments_trains_or_differentiates():
    paths = sorted(EXPERIMENTS.rglob("*.py"))
    assert any(p.parent.name == "recipes" for p in paths)
    assert [v for p in paths for v in _violations(p)] == []


def test_the_check_catches_a_hand_written_training_loop(tmp_path):
    (tmp_path / "experiments").mkdir()
    bad = tmp_path / "experiments" / "bad.py"
    bad.write_text("import torch\nfrom torch.func import functional_call\nfrom ..training.loop import mlm_loss\n"
                   "def f(model, batch):\n    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
                   "    loss = mlm_loss(model, batch, 1, 1)[0]\n    loss.backward()\n    opt.step()\n"
                   "    torch.autograd.grad(loss, [])\n")
    global EXPERIMENTS
    saved, EXPERIMENTS = EXPERIMENTS, tmp_path / "experiments"
    try:
        found = " ".join(_violations(bad))
    finally:
        EXPERIMENTS = saved
    for what in ("functional_call", "imports mlm_loss", ".SGD", ".backward", ".grad", "imports torch.func"):
        assert what in found, what
