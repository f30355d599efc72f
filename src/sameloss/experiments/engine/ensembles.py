"""The engine's ensembles (``reproduce --ensemble N``): several units walked together, their
runs trained as ensembles (``training.ensemble``) of at most N members.

A study's declaration stays per seed and fork; the engine places runs into ensembles. The
units of a job are walked in lockstep (``walk_together``): each walk (``engine.steps``) goes
on — measuring, gating — until it asks for a group of consecutive runs, and once every unit
that is not finished waits so, all the runs asked for are trained together
(``train_together``): grouped by ``training.ensemble.groups`` (equal ``ensemble_key``, at
most N a group), each group of several runs by ``train_ensemble`` into the runs' own folders,
a group of one by ``Study.train`` as ever. The seeds of an isoloss study reach their base
runs together, then — each after its own gate — their forks: a fork of every seed and kind
lands in one ensemble.

Strategy: ``training.ensemble.default_strategy`` of the device — ``vmap`` on a GPU (runs with
dropout from the global RNG are not batchable there: each trains alone, unless its config
says ``dropout_draws = keyed``), ``loop`` on the CPU (every run batchable; every number the
one-model run's, bit for bit, at one model's cost: not faster, hence off by default).

Launchers: ``inprocess`` walks all the units of a stage in this process; ``local`` and
``slurm`` give each worker (``--workers``; Slurm: one array task per worker, default one) a
share of the units, dealt round robin, which it walks together. A unit whose run fails (a
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
    from .walk import with_start

    ens = _training()
    items = []
    for actor, run, record in requests:
        spec = run.spec if run.start is None else with_start(run.spec, actor.path(run.start, record))
        items.append((actor.study, spec))
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
                out[i] = _alone(*items[i])
    for i, (study, spec) in enumerate(items):
        if out[i] is None:  # known to its study (or trained just now under another request)
            out[i] = _alone(study, spec)
    return out


def _resolved(device: str) -> str:
    from ...training.runio import resolve_device

    return str(resolve_device(device))


def _alone(study, spec) -> tuple[Any, float, float]:
    from .walk import cpu_time

    wall, cpu = time.perf_counter(), cpu_time()
    try:
        info = study.train(spec)
    except UserError as exc:
        info = exc
    return info, cpu_time() - cpu, time.perf_counter() - wall


def _train_group(items, cfgs, group: list[int], strategy: str, out: list, log) -> None:
    """Runs ``group`` of ``items`` as one ensemble, each ``RunInfo`` recorded in its study."""
    from .runspec import RunInfo
    from .walk import cpu_time
    from ...training.runio import read_summary

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
    first = studies[0]
    hooks = ens.Hooks(first.tracker, planned, "pass --fresh to redo the experiment")
    results = ens.train_ensemble([cfgs[i] for i in group], dirs, "auto", first.progress, strategy, hooks=hooks)
    wall_share, cpu_share = (time.perf_counter() - wall) / len(group), (cpu_time() - cpu) / len(group)
    for k, (i, study, spec, run_dir, result) in enumerate(zip(group, studies, specs, dirs, results)):
        if isinstance(result, ens.Failure):
            out[i] = (UserError(result.message), cpu_share, wall_share)
            continue
        if status.get(k) == "reused" and study.tracker != "none":
            study._mirror(cfgs[i], run_dir)
        info = RunInfo(spec, cfgs[i], run_dir, status.get(k, "trained"), wall_share, read_summary(run_dir) or {})
        study.runs[spec.name] = info
        study.timings["train"] += wall_share
        out[i] = (info, cpu_share, wall_share)


# ---- walking several units together -----------------------------------------------------------
def walk_together(units: list, actors: list, train: Callable[[list], list]) -> list:
    """Walk ``units`` (each with its actor) in lockstep (module docstring); per unit its
    ``engine.UnitRecord``, or the ``UserError`` that stopped it. ``train(requests)``:
    ``train_together``."""
    from .walk import UnitRecord, cpu_time, steps

    records = [UnitRecord(u.name, u.study, seed=u.seed) for u in units]
    walks = [steps(u.items, a, r) for u, a, r in zip(units, actors, records)]
    outcome: list = [None] * len(units)
    pending: dict[int, list] = {}

    def advance(i: int, send=None, error: Exception | None = None) -> None:
        wall, cpu = time.perf_counter(), cpu_time()
        try:
            if error is not None:
                pending[i] = walks[i].throw(error)
            else:
                pending[i] = walks[i].send(send)
        except StopIteration:
            outcome[i] = records[i]
        except UserError as exc:
            outcome[i] = exc
        records[i].seconds += time.perf_counter() - wall
        records[i].cpu_seconds += cpu_time() - cpu

    for i in range(len(units)):
        advance(i)
    while pending:
        asked = list(pending.items())
        pending.clear()
        flat = [(i, run) for i, runs in asked for run in runs]
        done = iter(train([(actors[i], run, records[i]) for i, run in flat]))
        for i, runs in asked:
            infos, error = [], None
            for run in runs:
                info, cpu, wall = next(done)
                records[i].seconds += wall
                records[i].cpu_seconds += cpu
                if run.cost:
                    records[i].cpu[run.cost] = records[i].cpu.get(run.cost, 0.0) + cpu
                if isinstance(info, UserError):
                    error = error or info
                infos.append(info)
            advance(i, error=error) if error is not None else advance(i, infos)
    return outcome


# ---- a study-wide setting ---------------------------------------------------------------------


# ---- the launchers' jobs --------------------------------------------------------------------
def chunks(units: list, n: int) -> list[list]:
    """``units`` dealt round robin into at most ``n`` non-empty shares (in order within each)."""
    n = max(1, min(n, len(units)))
    return [units[k::n] for k in range(n)]


def unit_outcomes(shares: list[list], outcomes: list) -> dict:
    """Each unit's ``launch.Outcome`` from its share's (a share's own error: each of its units')."""
    from .launch import Outcome

    per_unit: dict[str, Any] = {}
    for share, outcome in zip(shares, outcomes):
        for k, unit in enumerate(share):
            if outcome.error is not None:
                per_unit[unit.name] = outcome
            else:
                got = outcome.value[k]
                per_unit[unit.name] = Outcome(None, got, outcome.worker) if isinstance(got, str) else \
                    Outcome(got, None, outcome.worker)
    return per_unit
