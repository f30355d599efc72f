"""Layers that hold.

Imports flow one way: ``<base>`` (the top-level modules every layer uses: ``errors``,
``files``, ``config``, ``registry``, ``resources``, ...) < ``data`` < ``languages`` <
``models`` < ``training`` < ``hf`` < ``measures`` < ``experiments`` < ``<cli>`` (``cli.py``,
``cli_text.py``, ``cli_language.py``). A module imports from its own layer or those before it, at its top or
inside a function alike, with no exception by name; and no module imports a name from its
own package's ``__init__`` (which imports its modules, so sits above them).

Recipes declare, the layers do: nothing under ``experiments/`` trains or differentiates
(no optimiser, ``.backward()``, ``autograd.grad``, L-BFGS, ``functional_call``, nor the
training loop's pieces) — training lives in ``training/``, measuring in ``measures/``."""

from __future__ import annotations

import ast
from pathlib import Path

import sameloss

PACKAGE = Path(sameloss.__file__).parent
EXPERIMENTS = PACKAGE / "experiments"
LAYERS = ["<base>", "data", "languages", "models", "training", "hf", "measures", "experiments", "<cli>"]
CLI_MODULES = {"cli", "cli_text", "cli_language"}
# attribute or name uses that mean training or differentiating by hand
FORBIDDEN_NAMES = {"backward", "zero_grad", "LBFGS", "AdamW", "Adam", "SGD", "functional_call", "grad", "vjp", "jvp",
                   "vmap", "build_optimizer", "make_optimizer", "mlm_loss", "global_batch", "clip_grad_norm_"}
FORBIDDEN_MODULES = ("torch.optim", "torch.autograd", "torch.func", "sameloss.training.optim",
                     "sameloss.training.objectives.sam", "sameloss.training.data")


# ---- the layers -------------------------------------------------------------------------------
def _layer(parts: tuple[str, ...], package: Path) -> str:
    """The layer of the module ``sameloss.<parts>`` (``()``: the package's own ``__init__``)."""
    if not parts:
        return "<base>"
    if len(parts) == 1 and not (package / parts[0]).is_dir():
        return "<cli>" if parts[0] in CLI_MODULES else "<base>"
    return parts[0]


def _is_module(parts: tuple[str, ...], package: Path) -> bool:
    where = package.joinpath(*parts) if parts else package
    return where.with_suffix(".py").is_file() or (where / "__init__.py").is_file()


def _imports(path: Path, package: Path):
    """``(line, imported module parts, names taken from a package's __init__)`` of every
    sameloss import of ``path`` (relative ones resolved)."""
    own = path.relative_to(package).with_suffix("").parts
    if own[-1] == "__init__":
        own = own[:-1] + ("__init__",)
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == package.name:
                    yield node.lineno, tuple(alias.name.split(".")[1:]), ()
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = list(own[:-node.level])
                name = base + (node.module.split(".") if node.module else [])
            elif node.module and node.module.split(".")[0] == package.name:
                name = node.module.split(".")[1:]
            else:
                continue
            target = tuple(name)
            submodules = [a.name for a in node.names if _is_module(target + (a.name,), package)]
            others = tuple(a.name for a in node.names if a.name not in submodules)
            for sub in submodules:
                yield node.lineno, target + (sub,), ()
            if others:
                yield node.lineno, target, others


def layering_violations(package: Path = PACKAGE) -> list[str]:
    wrong = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package)
        parts = rel.with_suffix("").parts
        mine = _layer(parts if parts[-1] != "__init__" else parts[:-1], package)
        ancestors = {parts[:i] for i in range(1, len(parts))}  # its own packages, the root's excepted
        for line, target, names in _imports(path, package):
            theirs = _layer(target, package)
            if LAYERS.index(theirs) > LAYERS.index(mine):
                wrong.append(f"{rel}:{line} ({mine}) imports {'.'.join(target)} ({theirs})")
            if names and target in ancestors:
                wrong.append(f"{rel}:{line} imports {', '.join(names)} from its own package's __init__ "
                             f"({'.'.join(target)})")
    return wrong


def test_imports_flow_one_way_through_the_layers():
    assert layering_violations() == []


def test_the_layer_check_catches_upward_imports(tmp_path):
    pkg = tmp_path / "sameloss"
    for folder in ("training", "measures", "experiments"):
        (pkg / folder).mkdir(parents=True)
        (pkg / folder / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("__version__ = '0'\n")
    (pkg / "errors.py").write_text("")
    (pkg / "cli.py").write_text("from .experiments import common\n")  # the top: fine
    (pkg / "resources.py").write_text("from . import errors\ndef f():\n    from .training import loop\n")
    (pkg / "training" / "loop.py").write_text("from ..measures.curve import trace\nfrom .. import __version__\n")
    (pkg / "measures" / "curve.py").write_text("from ..training import loop\n")
    (pkg / "experiments" / "__init__.py").write_text("SCALES = ()\n")
    (pkg / "experiments" / "common.py").write_text("from . import SCALES\nfrom .. import resources\n")
    found = "\n".join(layering_violations(pkg))
    assert "resources.py:3 (<base>) imports training.loop (training)" in found
    assert "training/loop.py:1 (training) imports measures.curve (measures)" in found
    assert "experiments/common.py:1 imports SCALES from its own package's __init__ (experiments)" in found
    assert len(found.splitlines()) == 3, found  # cli → experiments, measures → training, __version__: fine


# ---- experiments declare ------------------------------------------------------------------
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
