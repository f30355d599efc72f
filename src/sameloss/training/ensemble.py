"""S runs of one model shape trained as one computation: ``train_ensemble(cfgs, run_dirs)``.

A study's models are small and many (a tiny seed is 19 runs, a decisive study 16–48 seeds):
trained one at a time, each step of each run is a few hundred small kernel launches that leave
a GPU idle. An ensemble is the training call of a run alone (``loop.train``) with S members:
one set-up each (``member.build``), one step for the stack (``step.train_step``), one loop
that logs, evaluates and saves each member as its run alone would. ``strategy``: ``vmap`` (the
default on a GPU) computes every member's passes as one batched computation — dropout must be
keyed (``batchable``), and each member equals its run alone within float32 rounding —;
``loop`` (the default elsewhere) computes each member as its run alone, bit for bit (on the
CPU a batched pass gains nothing: ``bench/bench_ensemble.py``).

Every member keeps its own numbers (data stream, dropout masks, clipping, SAM perturbation,
adversarial batch, flatness penalty, schedule, weight decay, ρ, λ:
``tests/training/test_ensemble.py``), its own run folder (written as its run alone writes it:
``--resume``, reuse, ``measure``, plots and the HF export read it as any run; a member can be
resumed alone, a run alone resumed in an ensemble) and its own fate (a member that cannot be
set up or whose loss is no longer finite fails alone with its run's error, ``Failure``).
Members with different step counts join the stack at their first step and leave after their
last (``loop.Trainer``); the engine (``experiments/engine/ensembles.py``) puts runs that start
together into one ensemble. They share (``ensemble_key``) everything but ``PER_MEMBER``: the
language, the model's kind and shape, the batch, precision and device, the optimiser's kind and
constants, which objectives train and their shared settings. A killed ensemble resumes bit for
bit; the caller's global RNG is left as it was; DDP trains one run (``pretrain``), not an
ensemble.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

import torch

from .. import config as configlib
from .. import files
from ..errors import UserError
from . import runfolder, runio
from .config import PretrainConfig
from .loop import Failure, Options, train
from .objectives.base import ordered

__all__ = ["Failure", "Hooks", "STRATEGIES", "PER_MEMBER", "batchable", "default_strategy", "ensemble_key",
           "groups", "train_ensemble"]

# config keys whose values may differ between members of one ensemble (besides ``eval.*``),
# and each objective's own (``Objective.per_member``)
RUN_PER_MEMBER = frozenset({
    "name", "seed", "steps", "checkpoints", "checkpoints_log", "save_every", "log_every", "init_from",
    "init_optimizer", "init_step", "model.dropout", "optim.lr", "optim.weight_decay", "optim.warmup_steps",
    "optim.warmup_fraction", "optim.decay_steps", "optim.final_lr_factor", "optim.final_steps", "optim.grad_clip"})
STRATEGIES = ("vmap", "loop")


def per_member() -> frozenset[str]:
    """``RUN_PER_MEMBER`` and every registered objective's per-member settings."""
    return RUN_PER_MEMBER | {c.section() + key for c in ordered() for key in c.per_member}


def __getattr__(name: str):
    if name == "PER_MEMBER":  # (the objectives are found when first asked for)
        return per_member()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def default_strategy(device) -> str:
    """``vmap`` on a GPU (one batched forward pass: the point of an ensemble there); ``loop``
    elsewhere (on the CPU a batched pass is no faster, ``bench/bench_ensemble.py``, and the
    member-by-member pass is the run alone's own computation)."""
    return "vmap" if torch.device(device).type == "cuda" else "loop"


def batchable(cfg: PretrainConfig, strategy: str = "vmap") -> str | None:
    """Why ``cfg``'s run cannot be an ensemble member under ``strategy`` (``None``: it can).
    The loop strategy takes every run; ``vmap`` one whose dropout, if any, is keyed."""
    if strategy == "vmap" and cfg.model.dropout > 0 and cfg.dropout_draws != "keyed":
        return (f"{cfg.name}: dropout {cfg.model.dropout:g} drawn from the global RNG cannot be reproduced batched "
                "(dropout_draws = keyed can)")
    return None


def _shared(cfg: PretrainConfig) -> dict:
    """``cfg``'s settings that the members of one ensemble share, by dotted key."""
    flat = configlib.flatten(configlib.to_dict(cfg))
    own = per_member()
    # (dropout_draws: a member without dropout draws nothing; one with dropout is keyed: batchable)
    return {k: v for k, v in flat.items()
            if k not in own and not k.startswith("eval.") and k not in ("device", "dropout_draws")}


def ensemble_key(cfg: PretrainConfig) -> tuple:
    """What the members of one ensemble share (module docstring): equal keys, one ensemble."""
    device = str(runio.resolve_device(cfg.device))
    shared = sorted((k, repr(v)) for k, v in _shared(cfg).items())
    return (device, *shared, *((c.name, c.on(cfg)) for c in ordered()))


def groups(cfgs: list[PretrainConfig], cap: int, strategy: str = "vmap") -> list[list[int]]:
    """Indices of ``cfgs`` in ensembles of at most ``cap`` members with equal keys, in the
    order of first appearance; a config that is not ``batchable`` alone."""
    out: list[list[int]] = []
    open_: dict[tuple, list[int]] = {}
    for i, cfg in enumerate(cfgs):
        if batchable(cfg, strategy) is not None or cap <= 1:
            out.append([i])
            continue
        key = ensemble_key(cfg)
        if key not in open_ or len(open_[key]) >= cap:
            open_[key] = []
            out.append(open_[key])
        open_[key].append(i)
    return out


@dataclass(frozen=True)
class Hooks:
    """How a caller follows an ensemble: the tracker its members log to (``training.tracking``),
    ``on_plan(i, plan)`` told each member's plan (a study logs and records it), and the end of
    the line of a run folder refused (``runfolder.plan``'s ``fresh_hint``)."""

    tracker: str = "none"
    on_plan: object = None
    fresh_hint: str = "pass --fresh to replace it"


def train_ensemble(cfgs: list[PretrainConfig], run_dirs: list[str | Path], mode: str = "auto", progress: bool = True,
                   strategy: str | None = None, stop_after: int | None = None, hooks: Hooks = Hooks()
                   ) -> list[dict | Failure]:
    """Train ``cfgs`` (one ``ensemble_key``) into ``run_dirs`` as one ensemble; returns, per
    member, its final evaluation (as ``pretrain``) or its ``Failure``. ``mode``: what to do
    with each run folder (``runfolder.plan``'s ``new``, ``resume``, ``fresh``, ``auto``; a
    member whose folder is refused fails alone); ``strategy``: ``vmap`` or ``loop``
    (``None``: ``default_strategy`` of the device); ``stop_after``: end after that step's
    checkpoints (as if killed: tests of resuming). Every member's folder lock is held for
    the whole call."""
    if len(cfgs) != len(run_dirs) or not cfgs:
        raise ValueError("one run folder per config, and at least one")
    strategy = strategy or default_strategy(runio.resolve_device(cfgs[0].device))
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}, not {strategy!r}")
    for cfg in cfgs:
        reason = batchable(cfg, strategy)
        if reason is not None:
            raise UserError(reason)
    if len({ensemble_key(c) for c in cfgs}) > 1:
        raise UserError("these runs cannot train as one ensemble: they differ in "
                        + ", ".join(_differences(cfgs)))
    run_dirs = [Path(d) for d in run_dirs]
    results: list = [None] * len(cfgs)
    with contextlib.ExitStack() as held:
        for d in run_dirs:
            held.enter_context(files.folder_lock(d, "run"))
        plans = []
        for i, (d, c) in enumerate(zip(run_dirs, cfgs)):
            try:
                plans.append(runfolder.plan(d, c, mode, fresh_hint=hooks.fresh_hint))
            except UserError as exc:
                plans.append(None)
                results[i] = Failure(str(exc).splitlines()[0])
                continue
            if hooks.on_plan is not None:
                hooks.on_plan(i, plans[-1])
            if plans[-1].action == "reuse":
                results[i], plans[-1] = plans[-1].evaluation, None
        return train(cfgs, run_dirs, plans, Options(progress, stop_after, strategy, hooks.tracker), results)


def _differences(cfgs: list[PretrainConfig]) -> list[str]:
    shared = [_shared(c) | {"device": str(runio.resolve_device(c.device))} for c in cfgs]
    keys = sorted({k for s in shared for k in s})
    return [k for k in keys if len({repr(s.get(k)) for s in shared}) > 1] or ["which objectives train"]
