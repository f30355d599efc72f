"""Units through a launcher: ``run_units(study, units)`` hands a study's units to its
launcher (``launch.py``: in this process, local workers, Slurm), one job per unit
(``core.execute_unit``) or, under ``--ensemble``, one per share of units walked together
(``execute_units``, the runs trained as ensembles: ``ensembles.py``), and adds what they ran
to the study (its runs, timings, counts and the rows the workers measured). It sits above
``core`` (one unit on one ``Study``) and ``ensembles`` (units walked together), which it
joins, so that neither imports the other.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from pathlib import Path

from ... import files
from ...errors import UserError
from .core import Study, StudySettings, UnitResult, execute_unit
from .declare import Unit, with_setting
from .ensembles import chunks, train_together, unit_outcomes, walk_together
from .launch import WorkerJob
from .study_log import StudyProgress


def run_units(study: Study, units: list[Unit]) -> list:
    """Run ``units`` through the study's launcher (those already run by this call: not
    again) and return what each returned, in order. The runs, timings and counts of
    the studies they ran in are added to this one, and the rows they measured to its
    cache. A unit refused for a reason a user can fix stops the study with its line,
    once the others are done (several: the first one's, with how many more; the launcher's
    log names each unit's reason)."""
    if study.dropout_draws != "global":
        units = with_setting(units, "dropout_draws", study.dropout_draws)
    todo = [u for u in units if u.name not in study.done]
    if todo:
        if study.launcher.name != "inprocess":
            study.log(f"{len(todo)} units through the {study.launcher.name} launcher"
                      + (f" ({study.launcher.workers} at once)" if study.launcher.workers else ""))
        root = study.root.absolute()
        mine = study if study.launcher.name == "inprocess" else None
        if study.ensemble:  # shares of the units, each walked together (ensembles.py)
            shares = chunks(todo, study.launcher.workers or 1)
            jobs = [WorkerJob(functools.partial(execute_units, share, root, study.settings, study.ensemble, mine),
                              threads=_threads(), name=f"{len(share)} units together") for share in shares]
        else:
            jobs = [WorkerJob(functools.partial(execute_unit, u, root, study.settings, mine), threads=_threads(),
                              name=u.name) for u in todo]
        # study-level progress with the time left: a bar on a terminal, else words on each unit's line
        progress = StudyProgress(len(jobs), terminal=study.progress and sys.stderr.isatty())
        study._units_bar = progress.bar
        try:
            outcomes = study.launcher.run(jobs, study.log, progress.finished)
        finally:
            progress.close()
            study._units_bar = None
        if study.ensemble:
            per_unit = unit_outcomes(shares, outcomes)
            outcomes = [per_unit[u.name] for u in todo]
        failed = []
        for unit, outcome in zip(todo, outcomes):
            if outcome.error is not None:
                failed.append(f"{unit.name}: {outcome.error}")
                continue
            _absorb(study, outcome.value)
            study.done[unit.name] = outcome.value.value
        study.cache.update(study._read_cache())  # the rows the workers measured
        if failed:  # one line (issue 63: a full disk was a line per seed); each unit's is in the log above
            more = f" (and {len(failed) - 1} more unit(s) stopped; the log says why each)" if len(failed) > 1 else ""
            raise UserError(failed[0] + more)
    return [study.done[u.name] for u in units]


def execute_units(units: list, root: Path, settings: StudySettings, cap: int, study=None) -> list:
    """Walk ``units`` of the experiment in ``root`` together (a launcher's worker calls this),
    holding each unit's folder lock; per unit a ``UnitResult`` or the one line of the
    ``UserError`` that stopped it. ``settings``: the experiment's (each unit's study
    takes ``settings.for_unit()``); ``cap``: the ensembles' members at most; ``study``: the
    in-process launcher's own, for the experiment's units (as ``execute_unit``)."""
    from .walk import Execute, keep_first_cost

    root = Path(root)
    with contextlib.ExitStack() as held:
        subs, actors = [], []
        for u in units:
            held.enter_context(files.folder_lock(root / u.folder, "unit"))
            if study is not None and not u.study:
                subs.append(None)
                actors.append(Execute(study))
                continue
            sub = held.enter_context(Study(root / u.study, settings.for_unit(), lock=False, shared=root))
            subs.append(sub)
            actors.append(Execute(sub))
        log = (study or subs[0]).log
        records = walk_together(units, actors, lambda requests: train_together(requests, cap, log))
        out = []
        for u, sub, record in zip(units, subs, records):
            if isinstance(record, UserError):
                out.append(str(record).splitlines()[0] if str(record) else type(record).__name__)
            elif sub is None:
                out.append(UnitResult(record))
            else:
                if u.study:
                    record = keep_first_cost(sub.root, record, sub.log)
                out.append(UnitResult(record, sub.runs, sub.timings, sub.counts))
        return out


def _absorb(study: Study, result: UnitResult) -> None:
    study.runs.update(result.runs)
    for k, v in result.timings.items():
        study.timings[k] += v
    for k, v in result.counts.items():
        study.counts[k] += v


def _threads() -> int:
    import torch

    return torch.get_num_threads()
