"""Units through a launcher: ``run_units(study, units)`` hands a study's units to its
launcher (``launch.py``: in this process, local workers, Slurm) as jobs — one unit a job, or
under ``--ensemble`` one share of the units a worker (``chunks``), its runs trained as
ensembles (``ensembles.py``) — and gives what they ran to the study (``Study.absorb``). A job
executes its units in their folders (``execute``): each unit's folder locked, each walked on
its own study (a seed's) or the experiment's, all of them together (``walk.walk_units``).
It sits above ``core`` (the ``Study``) and ``ensembles`` (runs trained together), which it
joins, so that neither imports the other.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from pathlib import Path
from typing import Any

from ... import files
from ...errors import UserError, first_line
from .core import Study, StudySettings, UnitResult
from .declare import Unit, with_setting
from .launch import Outcome, WorkerJob
from .study_log import StudyProgress


def run_units(study: Study, units: list[Unit]) -> list:
    """Run ``units`` through the study's launcher (those already run by this call: not
    again) and return what each returned, in order. The runs, timings and counts of
    the studies they ran in are added to this one, and the rows they measured to its
    cache. A unit refused for a reason a user can fix stops the study with its line,
    once the others are done (several: the first one's, with how many more; the launcher's
    log names each unit's reason)."""
    settings, launcher = study.settings, study.launcher
    if settings.dropout_draws != "global":
        units = with_setting(units, "dropout_draws", settings.dropout_draws)
    todo = [u for u in units if u.name not in study.done]
    if todo:
        if launcher.name != "inprocess":
            study.log(f"{len(todo)} units through the {launcher.name} launcher"
                      + (f" ({launcher.workers} at once)" if launcher.workers else ""))
        root = study.root.absolute()
        mine = study if launcher.name == "inprocess" else None
        # one unit a job, or (``--ensemble``) a share of the units a worker, walked together
        shares = chunks(todo, launcher.workers or 1) if settings.ensemble else [[u] for u in todo]
        jobs = [WorkerJob(functools.partial(execute_job, share, root, settings, mine), threads=_threads(),
                          name=share[0].name if len(share) == 1 else f"{len(share)} units together")
                for share in shares]
        # study-level progress with the time left: a bar on a terminal, else words on each unit's line
        progress = StudyProgress(len(jobs), terminal=settings.progress and sys.stderr.isatty())
        try:
            with study.showing(progress.bar):
                outcomes = launcher.run(jobs, study.log, progress.finished)
        finally:
            progress.close()
        per_unit = unit_outcomes(shares, outcomes)
        failed = []
        for unit in todo:
            outcome = per_unit[unit.name]
            if outcome.error is not None:
                failed.append(f"{unit.name}: {outcome.error}")
            else:
                study.absorb(unit.name, outcome.value)
        study.reread()  # the rows the workers measured
        if failed:  # one line (a full disk was a line per seed); each unit's is in the log above
            more = f" (and {len(failed) - 1} more unit(s) stopped; the log says why each)" if len(failed) > 1 else ""
            raise UserError(failed[0] + more)
    return [study.done[u.name] for u in units]


def execute(units: list[Unit], root: Path, settings: StudySettings, study: Study | None = None) -> list:
    """Walk ``units`` of the experiment in ``root`` together (``walk.walk_units``; a launcher's
    worker calls this), each holding its folder's lock, each on its own study
    (``settings.for_unit()``, opened with ``lock=False``: the process that started the units
    holds the experiment's, or, for ``reproduce --seeds``, nobody does) — or, for the
    experiment's own units, on ``study`` (the in-process launcher's, whose evaluators and task
    data they then share). Runs are trained one after another, or as ensembles of at most
    ``settings.ensemble``. Per unit a ``UnitResult`` — a seed unit's CPU the first call's
    (``walk.keep_first_cost``) — or the ``UserError`` that stopped it."""
    from .ensembles import train_together
    from .walk import Execute, keep_first_cost, walk_units

    root = Path(root)
    with contextlib.ExitStack() as held:
        studies = []
        for u in units:
            held.enter_context(files.folder_lock(root / u.folder, "unit"))
            studies.append(study if study is not None and not u.study else
                           held.enter_context(Study(root / u.study, settings.for_unit(), lock=False, shared=root)))
        log = (study or studies[0]).log
        cap = settings.ensemble
        train = (lambda requests: train_together(requests, cap, log)) if cap else None
        records = walk_units(units, [Execute(s) for s in studies], train)
        out = []
        for u, sub, record in zip(units, studies, records):
            if isinstance(record, UserError):
                out.append(record)
            elif sub is study:
                out.append(UnitResult(record))
            else:
                if u.study:
                    record = keep_first_cost(sub.root, record, sub.log)
                out.append(UnitResult(record, sub.runs, sub.timings, sub.counts))
        return out


def execute_job(units: list[Unit], root: Path, settings: StudySettings, study: Study | None = None) -> list:
    """A launcher's job: ``units`` executed (``execute``). A unit alone raises the
    ``UserError`` that stopped it (its launcher reports it: the in-process one at once);
    units walked together each give its one line instead, the others going on."""
    out = execute(units, root, settings, study)
    if len(units) == 1 and not settings.ensemble and isinstance(out[0], UserError):
        raise out[0]
    return [first_line(r) if isinstance(r, UserError) else r for r in out]


def chunks(units: list, n: int) -> list[list]:
    """``units`` dealt round robin into at most ``n`` non-empty shares (in order within each)."""
    n = max(1, min(n, len(units)))
    return [units[k::n] for k in range(n)]


def unit_outcomes(shares: list[list], outcomes: list) -> dict:
    """Each unit's ``launch.Outcome`` from its share's (a share's own error: each of its units')."""
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


def _threads() -> int:
    import torch

    return torch.get_num_threads()
