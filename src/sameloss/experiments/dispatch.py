"""Units through a launcher: ``run_units(study, units)`` hands a study's units to its
launcher (``launch.py``: in this process, local workers, Slurm), one job per unit
(``core.execute_unit``) or, under ``--ensemble``, one per share of units walked together
(``ensembles.execute_units``), and adds what they ran to the study (its runs, timings,
counts and the rows the workers measured). It sits above ``core`` and ``ensembles``, which
it joins, so that neither imports the other's way round.
"""

from __future__ import annotations

import functools
import sys

from ..errors import UserError
from .core import Study, UnitResult, execute_unit
from .declare import Unit
from .launch import StudyProgress, WorkerJob


def run_units(study: Study, units: list[Unit]) -> list:
    """Run ``units`` through the study's launcher (those already run by this call: not
    again) and return what each returned, in order. The runs, timings and counts of
    the studies they ran in are added to this one, and the rows they measured to its
    cache. A unit refused for a reason a user can fix stops the study with its line,
    once the others are done."""
    if study.dropout_draws != "global":
        from .ensembles import with_setting

        units = with_setting(units, "dropout_draws", study.dropout_draws)
    todo = [u for u in units if u.name not in study.done]
    if todo:
        if study.launcher.name != "inprocess":
            study.log(f"{len(todo)} units through the {study.launcher.name} launcher"
                      + (f" ({study.launcher.workers} at once)" if study.launcher.workers else ""))
        root = study.root.absolute()
        mine = study if study.launcher.name == "inprocess" else None
        if study.ensemble:  # shares of the units, each walked together (ensembles.py)
            from .ensembles import chunks, execute_units, unit_outcomes

            shares = chunks(todo, study.launcher.workers or 1)
            settings = {"seed": study.seed, "progress": study.progress, "device": study.device,
                        "tracker": study.tracker}
            jobs = [WorkerJob(functools.partial(execute_units, share, root, settings, study.ensemble, mine),
                              threads=_threads(), name=f"{len(share)} units together") for share in shares]
        else:
            jobs = [WorkerJob(functools.partial(execute_unit, u, root, study.seed, study.progress, study.device,
                                                study.tracker, mine), threads=_threads(), name=u.name) for u in todo]
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
        if failed:
            raise UserError("\n".join(failed))
    return [study.done[u.name] for u in units]


def _absorb(study: Study, result: UnitResult) -> None:
    study.runs.update(result.runs)
    for k, v in result.timings.items():
        study.timings[k] += v
    for k, v in result.counts.items():
        study.counts[k] += v


def _threads() -> int:
    import torch

    return torch.get_num_threads()
