"""The one engine that executes a declared study (``declare.py``).

``walk_units(units, actors, train)`` goes through each unit's items in order and hands each to
its actor: ``Execute`` trains and measures on a ``core.Study`` (``reproduce``, in any
launcher's worker: ``dispatch.execute``), ``plan.Record`` records what would be trained and
measured (``sameloss plan``). Either way the walk is the same: a ``Gate`` asks the actor
(``Execute`` runs its check on the measured rows; a plan passes it), a fork's start is
resolved by the actor (``start_spec``: a checkpoint folder, or the embedded checkpoint it
writes first). The units go in lockstep, so that the runs they ask for at once may train
together (``train``: one after another, ``one_by_one``, or as ensembles,
``ensembles.train_together``); one unit is the case of one (``walk``). Each unit's wall and
CPU seconds are charged as it goes (``UnitRecord.charge``).

``run_stages(declaration, run, resolve)`` runs the declared units stage by stage: the
units declared up front, then each ``Later`` stage once the units it reads have run
(``resolve``: ``Later.declare`` on their records for real, ``Later.plan`` in a plan), until
nothing new is declared; ``seeds=[...]``: only those seeds' units (a shard), with the
stages a later seed needs first.

``Records`` is what the report reads — the rows, runs and gates of every unit, found by
the tags the declaration gave them (``records.rows(role="probe", seed=3)``, ``runs(...)``;
``declare.tags``: a report asks for what was declared, it never declares it again), a run
and a gate also by name (``run``, ``gate``), and the study's tidy tables (``measured_rows``,
``cost_rows``: ``measured.csv``, ``costs.csv``) — and the figures it writes (``figure``); it
trains and measures nothing. ``Setup`` is what ``units`` is given: the seed, the experiment
folder and the data a recipe prepares before it declares its runs (``setup.data``: prepared
for real, or as a plan would find it).
"""

from __future__ import annotations

import dataclasses
import json
import resource
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ...errors import UserError
from .declare import (Checkpoint, Embedded, Gate, Later, Measure, Reference, Run, Unit, cost_parts, cost_rows,
    merge_units)
# COST_FILE: a seed unit's CPU as the call that computed it measured it (a later call reuses its
# runs and rows for ~0 s; a budget planned from the pilot must not take that for the seed's
# cost); one of the files sameloss owns in a study folder (``folder.OWN_FILES``)
from .layout import COST_FILE


def measure_key(measure: Measure) -> tuple:
    """What identifies a measured row: its target and its settings (not the device)."""
    from .runspec import spec_fingerprint

    return measure.of, spec_fingerprint(measure.spec)


@dataclass
class UnitRecord:
    """What walking one unit produced: its measured rows (by ``measure_key``), its runs
    (``core.RunInfo`` by name), its gates (``(ok, text)`` by name), its CPU seconds per
    ``cost`` part and in all, and its wall seconds."""

    name: str
    study: str = ""
    rows: dict = field(default_factory=dict)
    runs: dict = field(default_factory=dict)
    gates: dict = field(default_factory=dict)
    skipped: list = field(default_factory=list)  # optional measures not made: (their tags, why)
    cpu: dict = field(default_factory=dict)  # CostPart → CPU seconds
    cpu_seconds: float = 0.0
    seconds: float = 0.0
    seed: int | None = None  # the unit's (``declare.Unit.seed``)
    # the tidy tables' rows of this unit, in the order walked: a tagged measure's (tags, row),
    # a tagged run's tags and name (``declare.tags``; ``Records.rows`` / ``Records.runs``)
    measured: list = field(default_factory=list)
    trained: list = field(default_factory=list)

    def charge(self, cpu: float, wall: float = 0.0, part=None, total: bool = True) -> None:
        """``cpu`` seconds charged to ``part`` (a ``CostPart``; ``None``: to none), and with
        ``total`` the CPU and ``wall`` seconds to the unit's."""
        if part:
            self.cpu[part] = self.cpu.get(part, 0.0) + cpu
        if total:
            self.cpu_seconds += cpu
            self.seconds += wall

    def row(self, measure: Measure) -> dict:
        return dict(self.rows[measure_key(measure)])

    def tagged(self, **where) -> list[tuple[dict, dict]]:
        """Every tagged measure's tags and row (copies) whose tags equal ``where``, as walked."""
        return [(dict(t), dict(row)) for t, row in self.measured if _matches(t, where)]

    def tagged_runs(self, **where) -> list[tuple[dict, Any]]:
        """Every tagged run's tags (with its name, ``run``) and ``core.RunInfo`` whose tags
        equal ``where``, as trained."""
        return [(dict(t), self.runs[t["run"]]) for t in self.trained if _matches(t, where)]


def cpu_time() -> float:
    """This process's CPU seconds (user and system)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


# ---- the walk -----------------------------------------------------------------------------
def walk_units(units: list[Unit], actors: list, train: Callable[[list], list] | None = None) -> list:
    """Walk ``units``, each with its actor, in lockstep: each walk (``steps``) goes on —
    measuring, gating — until it asks for a group of consecutive runs; once every unit not
    finished waits so, all the runs asked for are trained by one call of ``train(requests)``
    (a request: ``(actor, Run, record)``; per request ``(RunInfo or the UserError that
    stopped it, CPU seconds, wall seconds)``: ``one_by_one``, the default, or
    ``ensembles.train_together``, runs of several units trained as ensembles). Per unit its
    ``UnitRecord`` — its wall and CPU seconds charged as it goes, a run's CPU also to the
    run's ``cost`` part — or the ``UserError`` that stopped it."""
    train = train or one_by_one
    records = [UnitRecord(u.name, u.study, seed=u.seed) for u in units]
    walks = [steps(u.items, a, r) for u, a, r in zip(units, actors, records)]
    outcome: list = [None] * len(units)
    pending: dict[int, list] = {}

    def advance(i: int, infos: list | None = None) -> None:
        wall, cpu = time.perf_counter(), cpu_time()
        error = next((x for x in infos or () if isinstance(x, UserError)), None)
        try:
            pending[i] = walks[i].throw(error) if error is not None else walks[i].send(infos)
        except StopIteration:
            outcome[i] = records[i]
        except UserError as exc:
            outcome[i] = exc
        records[i].charge(cpu_time() - cpu, time.perf_counter() - wall)

    for i in range(len(units)):
        advance(i)
    while pending:
        asked = list(pending.items())
        pending.clear()
        done = iter(train([(actors[i], run, records[i]) for i, runs in asked for run in runs]))
        for i, runs in asked:
            infos = []
            for run in runs:
                info, cpu, wall = next(done)
                records[i].charge(cpu, wall, run.cost)
                infos.append(info)
            advance(i, infos)
    return outcome


def walk(unit: Unit, actor) -> UnitRecord:
    """One unit walked (``walk_units``), its runs trained one after another: its record, or
    the ``UserError`` that stopped it raised."""
    (record,) = walk_units([unit], [actor])
    if isinstance(record, UserError):
        raise record
    return record


def one_by_one(requests: list) -> list[tuple[Any, float, float]]:
    """``walk_units``' default ``train``: each run by its own actor (``actor.train``), one
    after another; a unit's runs after the one that stopped it are not trained."""
    out, stopped = [], set()
    for actor, run, record in requests:
        if id(record) in stopped:
            out.append((None, 0.0, 0.0))
            continue
        out.append(timed(actor.train, run, record))
        if isinstance(out[-1][0], UserError):
            stopped.add(id(record))
    return out


def timed(train: Callable, *args) -> tuple[Any, float, float]:
    """``train(*args)`` — a run trained — or the ``UserError`` that stopped it, with the CPU
    and wall seconds it took."""
    wall, cpu = time.perf_counter(), cpu_time()
    try:
        info = train(*args)
    except UserError as exc:
        info = exc
    return info, cpu_time() - cpu, time.perf_counter() - wall


def steps(items, actor, record: UnitRecord):
    """The walk of ``items`` as a generator: it measures and gates through ``actor`` and
    yields each group of consecutive runs to train (a list of ``Run``), taking back their
    infos (``send``) — so that several units' runs may train together (``walk_units``)."""
    for group in _groups(items):
        if isinstance(group, Gate):
            rows = [record.rows[measure_key(m)] for m in group.reads]
            ok, text = actor.gate(group, rows)
            record.gates[group.name] = (ok, text)
            if ok or group.on_fail == "mark":
                yield from steps(group.then, actor, record)
            continue
        if isinstance(group[0], Run):
            infos = yield group
            record.runs.update((run.name, info) for run, info in zip(group, infos))
            record.trained += [{**dict(run.tags), "run": run.name} for run in group if run.tags]
            continue
        for item in actor.bar(group, record):
            spent = cpu_time()
            try:
                record.rows[measure_key(item)] = actor.measure(item, record)
                if item.tags:
                    record.measured.append((dict(item.tags), record.rows[measure_key(item)]))
            except UserError as exc:
                if not item.optional:
                    raise
                record.skipped.append((dict(item.tags), str(exc)))
            record.charge(cpu_time() - spent, part=item.cost, total=False)


def _groups(items) -> list:
    """The items as gates and lists: consecutive measures of one run's checkpoints together
    (a progress bar counts them), consecutive runs together (they may train as one ensemble),
    every other item alone."""
    out: list = []
    for item in items:
        run = _run_of(item)
        if run is not None and out and isinstance(out[-1], list) and _run_of(out[-1][-1]) == run:
            out[-1].append(item)
        elif isinstance(item, Run) and out and isinstance(out[-1], list) and isinstance(out[-1][-1], Run):
            out[-1].append(item)
        else:
            out.append(item if isinstance(item, Gate) else [item])
    return out


def _run_of(item) -> str | None:
    if isinstance(item, Measure) and isinstance(item.of, Checkpoint):
        return item.of.run
    return None


class Execute:
    """The actor of ``reproduce``: every item done on a ``core.Study`` (a run trained or
    reused, a row measured or read from the cache)."""

    def __init__(self, study):
        self.study = study

    def bar(self, items: list, record: UnitRecord):
        run = _run_of(items[0])
        return self.study.bar(items, f"measuring {run}") if run is not None else items

    def path(self, at, record: UnitRecord) -> Path:
        """The folder of a checkpoint (an embedded one: written first, or reused)."""
        if isinstance(at, Embedded):
            return self.study.embed(self.path(at.of, record), at)
        return self.study.checkpoint(self._info(at.run, record), at.step)

    def _info(self, run: str, record: UnitRecord):
        return record.runs[run] if run in record.runs else self.study.runs[run]

    def train(self, run: Run, record: UnitRecord):
        return self.study.train(start_spec(run, self, record))

    def measure(self, m: Measure, record: UnitRecord) -> dict:
        if isinstance(m.of, Reference):
            return self.study.reference(m.of.kind, self._info(m.of.run, record).config, m.spec)
        path = self.path(m.of, record)
        self.study.log(f"measure {self.study.rel(path)}" + (f" (embedded into {m.of.shape})"
                                                           if isinstance(m.of, Embedded) else ""))
        return self.study.measure(path, m.spec)

    def gate(self, gate: Gate, rows: list[dict]) -> tuple[bool, str]:
        ok, text = gate.check(rows, *gate.args)
        self.study.log(text)
        return ok, text


def start_spec(run: Run, actor, record: UnitRecord):
    """The spec ``run`` trains: its own, forked from its start when it has one (``with_start``;
    the start's checkpoint folder as the actor resolves it: ``actor.path``)."""
    return run.spec if run.start is None else with_start(run.spec, actor.path(run.start, record))


def with_start(spec, path: Path):
    """``spec`` forked from the checkpoint at ``path`` (``init_from``, absolute: a worker in
    another folder, or a later call from elsewhere, reads the same run config)."""
    return dataclasses.replace(spec, settings=(*spec.settings, ("init_from", str(Path(path).resolve()))))


def keep_first_cost(root: Path, record: UnitRecord, log: Callable[[str], None]) -> UnitRecord:
    """A seed unit's CPU as the call that computed it measured it: kept in its folder
    (``cost.json``) the first time, read back by every later call."""
    from ...files import atomic_write_json
    from ...storage import storage_errors

    path = Path(root) / COST_FILE
    try:
        saved = json.loads(path.read_text())
        cpu = cost_parts(saved["rows"])
        return dataclasses.replace(record, cpu=cpu, cpu_seconds=float(saved["cpu_seconds"]))
    except FileNotFoundError:
        pass
    except (OSError, ValueError, KeyError, TypeError):
        log(f"note: {path} is unreadable; this call's CPU is kept instead")
    with storage_errors(path):
        atomic_write_json(path, {"rows": cost_rows(record.cpu), "cpu_seconds": record.cpu_seconds}, indent=1)
    return record


# ---- stages ---------------------------------------------------------------------------------
def declared_seeds(declaration: list) -> set[int]:
    """Every seed the declaration's units have or its later stages may give."""
    return {u.seed for u in declaration if isinstance(u, Unit) and u.seed is not None} | {
        s for d in declaration if isinstance(d, Later) for s in d.seeds}


def run_stages(declaration: list, run: Callable[[list[Unit]], list], resolve: Callable[[Later, list], list],
               seeds: list[int] | None = None, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run the declared units stage by stage (module docstring); returns every unit's
    record by name. ``run(units)``: their records, in order; ``resolve(later, records)``:
    the units a later stage declares from the records of the units it reads."""
    static = [u for u in declaration if isinstance(u, Unit)]
    stages = [d for d in declaration if isinstance(d, Later)]
    declared: dict[int, list[Unit]] = {}
    done: dict[str, Any] = {}
    while True:
        units = merge_units(static + [u for i in sorted(declared) for u in declared[i]])
        todo = [u for u in units if u.name not in done and (seeds is None or u.seed in seeds)]
        if todo:
            done.update(zip((u.name for u in todo), run(todo)))
            continue
        open_ = [i for i in range(len(stages)) if i not in declared]
        waiting = set(seeds or ()) - {u.seed for u in units}
        if seeds is not None:  # a shard declares only the stages that give one of its seeds
            open_ = [i for i in open_ if waiting & set(stages[i].seeds)]
        before = [u for u in units if u.name not in done and any(u.name in stages[i].after for i in open_)]
        if before:  # (a shard's) the units its seeds' stage is declared from
            log(f"seeds {_listed(waiting)} are planned from an earlier stage: its units run first")
            done.update(zip((u.name for u in before), run(before)))
            continue
        ready = [i for i in open_ if all(a in done for a in stages[i].after)]
        if not ready:
            if waiting:
                log(f"seeds {_listed(waiting)}: the study's plan runs nothing on them")
            return done
        for i in ready:
            declared[i] = resolve(stages[i], [done[a] for a in stages[i].after])


def _listed(seeds) -> str:
    return ", ".join(map(str, sorted(seeds)))


# ---- what units and reports are given -----------------------------------------------------
class Setup:
    """What a recipe's ``units(setup, preset)`` is given: the seed of the study (``--seed``),
    its folder ``root``, ``log``, whether this is a plan (``planning``), the workers units
    share (a budget divides by them), and ``data``: what the recipe prepares before it can
    declare its runs (a corpus, a generator), prepared once per call."""

    def __init__(self, root: Path, seed: int, log: Callable[[str], None], planning: bool = False,
                 workers: int = 1):
        self.root, self.seed, self.log, self.planning, self.workers = Path(root), seed, log, planning, workers
        self.prepared: dict[str, Any] = {}
        # a plan's stand-in shapes of data not prepared yet: corpus folder -> (vocab, max_len)
        self.language_shapes: dict[str, tuple[int, int]] = {}

    def data(self, name: str, make: Callable, planned: Callable | None = None, *args):
        """``make(setup, *args)`` — in a plan ``planned(setup, *args)`` when given (it may
        not write: it says what ``make`` would give) — once per call under ``name``."""
        key = f"{name}{args!r}"
        if key not in self.prepared:
            self.prepared[key] = (planned if self.planning and planned is not None else make)(self, *args)
        return self.prepared[key]


class Records:
    """What the report reads (module docstring): every unit's record and the study's
    figures. It trains and measures nothing. ``setup`` is the ``Setup`` the units were
    declared with (the seed, folder, workers and prepared data a report may read again:
    ``records.setup.seed``); the queries run over the tidy tables (``rows``, ``runs``,
    ``cost_rows``)."""

    def __init__(self, setup: Setup, study, records: dict[str, UnitRecord]):
        self.setup, self.study, self.units = setup, study, records
        self._runs: dict = {}
        self._gates: dict = {}
        for r in records.values():
            self._runs.update({(r.study, k): v for k, v in r.runs.items()})
            self._gates.update({(r.study, k): v for k, v in r.gates.items()})

    # the records, by name
    def unit(self, name: str) -> UnitRecord:
        return self.units[name]

    def unit_in(self, study: str) -> UnitRecord:
        """The record of the unit that ran in the study folder ``study`` (a seed's unit:
        ``layout.seed_folder``)."""
        (found,) = [u for u in self.units.values() if u.study == study]
        return found

    def run(self, name: str, study: str = ""):
        """The ``core.RunInfo`` of run ``name``."""
        return self._runs[(study, name)]

    def gate(self, name: str, study: str = "") -> tuple[bool, str]:
        return self._gates[(study, name)]

    # the tidy tables, by tags (``declare.tags``)
    def rows(self, **where) -> list[dict]:
        """The rows of every tagged measure whose tags equal ``where`` (copies, in the order
        the units were walked): each its measured values and its tags (a tag wins over a
        value of its name: it says what the measure is in the study)."""
        return [{**row, **t} for t, row in self.tagged(**where)]

    def tagged(self, **where) -> list[tuple[dict, dict]]:
        """As ``rows``, each row's tags and its measured values apart (copies)."""
        return [pair for u in self.units.values() for pair in u.tagged(**where)]

    def skipped(self, **where) -> list[tuple[dict, str]]:
        """Every optional measure not made (``declare.Measure.optional``) whose tags equal
        ``where``: its tags and why, in the order walked."""
        return [(dict(t), why) for u in self.units.values() for t, why in u.skipped if _matches(t, where)]

    def runs(self, **where) -> list[tuple[dict, Any]]:
        """Every tagged run whose tags equal ``where``: its tags (with its name, ``run``) and
        its ``core.RunInfo``, in the order trained."""
        return [pair for u in self.units.values() for pair in u.tagged_runs(**where)]

    def cost_rows(self) -> list[dict]:
        """The costs table: per unit and ``CostPart``, its CPU seconds as first computed."""
        return [{"unit": u.name, "seed": u.seed, **row} for u in self.units.values() for row in cost_rows(u.cpu)]

    def measured_rows(self) -> list[dict]:
        """The measured table: every tagged measure's row with its unit."""
        return [{"unit": u.name, **t, **{k: v for k, v in row.items() if k not in t}}
                for u in self.units.values() for t, row in u.measured]

    def figure(self, fig, stem: str, *, shows: str, sample: str, claim: str):
        return self.study.figure(fig, stem, shows=shows, sample=sample, claim=claim)

    def rel(self, path) -> str:
        return self.study.rel(path)

    @property
    def launcher(self):
        return self.study.launcher


def _matches(tagged: dict, where: dict) -> bool:
    return all(k in tagged and tagged[k] == v for k, v in where.items())


def eval_history(info) -> dict:
    """A run's held-out evaluations by step (its ``metrics.jsonl``): what the run recorded."""
    from ...training.runio import eval_history as read

    return read(info.path)


def metrics(info) -> list[dict]:
    """A run's ``metrics.jsonl`` records."""
    from ...training.runio import read_metrics

    return read_metrics(info.path)
