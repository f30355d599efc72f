"""The engine's ensembles (``reproduce --ensemble N``): several units walked together, their
runs trained as ensembles (``training.ensemble``) of at most N members.

A study's declaration stays per seed and fork; the engine places runs into ensembles. The
units of a job are walked in lockstep, as every job's are (``walk.walk_units``): once every
unit that is not finished waits for a group of runs, all the runs asked for are trained
together (``train_together``): grouped by ``training.ensemble.groups`` (equal
``ensemble_key``, at most N a group), each group of several runs by ``train_ensemble`` into
the runs' own folders and recorded in their studies (``Study.record``), a group of one by
``Study.train`` as ever. The seeds of an isoloss study reach their base
runs together, then — each after its own gate — their forks: a fork of every seed and kind
lands in one ensemble.

Strategy: ``training.ensemble.default_strategy`` of the device — ``vmap`` on a GPU (runs with
dropout from the global RNG are not batchable there: each trains alone, unless its config
says ``dropout_draws = keyed``), ``loop`` on the CPU (every run batchable; every number the
one-model run's, bit for bit, at one model's cost: not faster, hence off by default).

Launchers: ``inprocess`` walks all the units of a stage in this process; ``local`` and
``slurm`` give each worker (``--workers``; Slurm: one array task per worker, default one) a
share of the units, dealt round robin (``dispatch.chunks``), which it walks together. A unit whose run fails (a
member that diverged, a refused resume) stops with that line, the others go on; the study
then reports it as for any unit. A unit's CPU seconds count its share of each ensemble it
trained in (the ensemble's CPU split evenly among its members).
"""

from __future__ import annotations

import functools
import time
from pathlib import Path
from typing import Any, Callable

from ...errors import UserError
from . import layout

# (the engine, and through it torch, is imported where used: ``parse_ensemble`` runs while the
# command line is parsed, before the threads policy is applied)


@functools.lru_cache(maxsize=None)
def _training():
    from ...training import ensemble  # (torch: imported when an ensemble is first asked for)

    return ensemble


def parse_ensemble(text: str) -> int | None:
    """``--ensemble``: ``off`` (``None``) or a cap of at least 2 members."""
    if text == "off":
        return None
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 2:
        raise ValueError(f"--ensemble takes 'off' or a number of members >= 2, got {text!r}")
    return n


# ---- training the runs of several units -------------------------------------------------------
def train_together(requests: list, cap: int, log: Callable[[str], None]) -> list[tuple[Any, float, float]]:
    """Train the runs of ``requests`` (``(actor, Run, record)``: an ``engine.Execute`` actor of
    the run's study) in ensembles of at most ``cap``; per request ``(RunInfo or the UserError
    that stopped it, CPU seconds, wall seconds)`` — a share of its ensemble's."""
    from .walk import start_spec, timed

    ens = _training()
    items = [(actor.study, start_spec(run, actor, record)) for actor, run, record in requests]
    cfgs = [study.run_config(spec) for study, spec in items]
    out: list = [None] * len(items)
    known = [spec.name in study.runs for study, spec in items]
    device = cfgs[0].device if cfgs else "cpu"
    strategy = ens.default_strategy(_resolved(device))
    fresh = [i for i in range(len(items)) if not known[i]]
    folders: dict[Path, int] = {}
    for group in ens.groups([cfgs[i] for i in fresh], cap, strategy):
        members = [fresh[k] for k in group]
        unique = []
        for i in members:  # one folder asked for twice (a run two recipes share): trained once
            where = layout.run_dir(items[i][0].root, items[i][1].name).resolve()
            if where in folders:
                known[i] = True
            else:
                folders[where] = i
                unique.append(i)
        if len(unique) > 1:
            _train_group(items, cfgs, unique, strategy, out, log)
        else:
            for i in unique:
                out[i] = timed(items[i][0].train, items[i][1])
    for i, (study, spec) in enumerate(items):
        if out[i] is None:  # known to its study (or trained just now under another request)
            out[i] = timed(study.train, spec)
    return out


def _resolved(device: str) -> str:
    from ...training.runio import resolve_device

    return str(resolve_device(device))


def _train_group(items, cfgs, group: list[int], strategy: str, out: list, log) -> None:
    """Runs ``group`` of ``items`` as one ensemble, each recorded in its study (``Study.record``)."""
    from .core import FRESH_HINT
    from .walk import cpu_time

    ens = _training()
    studies = [items[i][0] for i in group]
    specs = [items[i][1] for i in group]
    dirs = [layout.run_dir(s.root, spec.name) for s, spec in zip(studies, specs)]
    status: dict[int, str] = {}

    def planned(k: int, plan) -> None:
        status[k] = plan.status
        if plan.action != "reuse":
            studies[k].log(plan.message)

    log(f"ensemble of {len(group)} runs ({strategy}): {', '.join(spec.name for spec in specs)}")
    wall, cpu = time.perf_counter(), cpu_time()
    first = studies[0].settings
    hooks = ens.Hooks(first.tracker, planned, FRESH_HINT)
    results = ens.train_ensemble([cfgs[i] for i in group], dirs, "auto", first.progress, strategy, hooks=hooks)
    wall_share, cpu_share = (time.perf_counter() - wall) / len(group), (cpu_time() - cpu) / len(group)
    for k, (i, study, spec, result) in enumerate(zip(group, studies, specs, results)):
        if isinstance(result, ens.Failure):
            out[i] = (UserError(result.message), cpu_share, wall_share)
        else:
            out[i] = (study.record(spec, cfgs[i], status.get(k, "trained"), wall_share), cpu_share, wall_share)
