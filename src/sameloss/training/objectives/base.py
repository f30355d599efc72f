"""The ``Objective`` type and its registry (the package docstring says what an objective is)."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import pkgutil
from pathlib import Path
from typing import ClassVar

import torch
from torch import nn
from torch.func import functional_call

from ... import registry
from ...errors import UserError


class Objective:
    """One training objective (module docstring); an instance is one member's, built by the
    member's set-up (``training.member``) from its run's config."""

    name: ClassVar[str] = ""  # its settings' section (and the registry's key)
    order: ClassVar[int] = 50  # where its term is added (MLM 0; the adversary 20, the penalty 30)
    logs: ClassVar[str | None] = None  # the metrics.jsonl key of its logged value's window mean
    window: ClassVar[str | None] = None  # that sum's key in a checkpoint's log window (default: logs)
    per_member: ClassVar[tuple[str, ...]] = ()  # settings that may differ between members
    term: ClassVar[bool] = True  # adds a term to the update pass's loss (SAM does not)
    autocast: ClassVar[bool] = True  # its term runs under the run's autocast (bf16 runs)
    # a plugin's: its settings (a frozen dataclass with ``step_forwards``), ``cfg.objectives[name]``
    Settings: ClassVar[type | None] = None

    def __init__(self, cfg, language, rank: int = 0, world_size: int = 1):
        self.settings = self.settings_of(cfg)

    @classmethod
    def build(cls, cfg, language, rank: int = 0, world_size: int = 1) -> Objective:
        """One member's instance, from its run's config (``UserError``: settings that cannot work)."""
        return cls(cfg, language, rank, world_size)

    # ---- what a config says -------------------------------------------------------------
    @classmethod
    def settings_of(cls, cfg):
        """Its settings in ``cfg``: the section ``cfg.<name>``, or ``cfg.objectives[name]``."""
        return getattr(cfg, cls.name) if cls.built_in() else cfg.objectives.get(cls.name)

    @classmethod
    def built_in(cls) -> bool:
        """Whether its settings are a field of ``PretrainConfig`` (else ``cfg.objectives[name]``)."""
        from ..config import PretrainConfig

        return cls.name in {f.name for f in dataclasses.fields(PretrainConfig)}

    @classmethod
    def on(cls, cfg) -> bool:
        """Whether ``cfg``'s run trains on it (by default: a weight other than 0)."""
        settings = cls.settings_of(cfg)
        return settings is not None and getattr(settings, "weight", 0) != 0

    @classmethod
    def cost(cls, cfg, vocab: int) -> float:
        """What it adds to a step of ``cfg``, in full-length sentence forwards."""
        return cls.settings_of(cfg).step_forwards(cfg.batch_size, vocab) if cls.on(cfg) else 0.0

    @classmethod
    def window_key(cls) -> str | None:
        return cls.window or cls.logs

    @classmethod
    def section(cls) -> str:
        """Its settings' dotted prefix in a config (``sam.``, or ``objectives.NAME.``)."""
        return f"{cls.name}." if cls.built_in() else f"objectives.{cls.name}."

    # ---- one member, and the stack ------------------------------------------------------
    def check(self, model) -> None:
        """One line (``UserError``) before anything is written, if it cannot run on ``model``."""

    def loss(self, run, batch, step: int):
        """``(term, logged)`` of one member (``run``: its ``Member``; ``batch``: the global
        host batch its update uses); ``logged``: a 0-d tensor for the window, or ``None``."""
        raise NotImplementedError

    @classmethod
    def losses(cls, objectives: list, stack, batches: list, step: int):
        """``(terms [S], logged [S] or None)`` of a ``vmap`` stack: by default each member's
        ``loss`` on its module with its stacked weights swapped in."""
        pairs = [stack.call(i, lambda run, o=o, b=b: o.loss(run, b, step))
                 for i, (o, b) in enumerate(zip(objectives, batches))]
        logged = [v for _, v in pairs]
        return torch.stack([t for t, _ in pairs]), None if logged[0] is None else torch.stack(logged)

    @classmethod
    def before_update(cls, objectives: list, stack, batches: list, step: int) -> list | None:
        """Before the update pass (SAM's ascent): the batches the update uses instead, or ``None``."""
        return None

    @classmethod
    def before_optimizer(cls, objectives: list, stack) -> None:
        """After the gradients are clipped, before the optimiser (SAM's return)."""

    def saved_optimizer(self, state: dict, cfg) -> dict:
        """The optimiser state as a checkpoint of this run holds it (by default torch's own)."""
        return state


def _discover() -> None:
    """The built-in objectives (the modules of this folder), then the plugins'."""
    for module in pkgutil.iter_modules([str(Path(__file__).parent)]):
        importlib.import_module(f"{__package__}.{module.name}")
    registry.load_plugins()


OBJECTIVES: registry.Registry[type[Objective]] = registry.Registry("training objective", loader=_discover)


def register(cls: type[Objective]) -> type[Objective]:
    """Add an objective class to the registry (a class decorator); a plugin's ``Settings``
    become the config's ``objectives.NAME`` section (``config.register_objective``)."""
    OBJECTIVES.add(cls.name, cls)
    if cls.Settings is not None:
        from ..config import register_objective

        register_objective(cls.name, cls.Settings)
    return cls


def ordered() -> list[type[Objective]]:
    """Every registered objective, in ``order``."""
    return sorted(OBJECTIVES.values(), key=lambda c: c.order)


def classes_of(cfg) -> list[type[Objective]]:
    """The objectives ``cfg``'s run trains on, in ``order`` (MLM first)."""
    unknown = [name for name in cfg.objectives if name not in OBJECTIVES]
    if unknown:  # (settings registered without their class)
        raise UserError(f"objectives.{unknown[0]}: no training objective {unknown[0]!r} is registered")
    return [c for c in ordered() if c.on(cfg)]


def build(cfg, language, rank: int = 0, world_size: int = 1) -> list[Objective]:
    """One member's objectives, built from its run's config (each checks its settings)."""
    return [c.build(cfg, language, rank, world_size) for c in classes_of(cfg)]


def autocast(run, objective: type[Objective] | Objective):
    """The run's autocast for an objective that runs under it, else nothing."""
    return run.autocast if objective.autocast else contextlib.nullcontext()


class _Bound(nn.Module):
    """``fn(module, *args)`` as a module's forward: what ``functional_call`` swaps weights in for."""

    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module

    def forward(self, fn, *args):
        return fn(self.module, *args)


def swapped(module: nn.Module, params: dict, fn, *args):
    """``fn(module, *args)`` with ``params`` (by parameter name) in place of ``module``'s own
    weights (``torch.func.functional_call``: the gradients flow to ``params``)."""
    return functional_call(_Bound(module), {f"module.{n}": p for n, p in params.items()}, (fn, *args))
