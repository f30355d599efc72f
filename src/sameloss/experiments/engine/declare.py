"""A study as data: what a recipe's ``units(setup, preset)`` returns.

A declaration is a list of ``Unit``s — the parts of a study that run apart, each in one
process holding one folder's lock — and ``Later`` stages, whose units are declared from
earlier units' results (an adaptive study's seeds after its pilot). A unit is a list of
items, in order:

* ``Run`` — a run to train (or reuse, resume); ``start`` forks it from a ``Checkpoint``
  of another run of the same study folder, or from an ``Embedded`` one (the engine writes
  the path into ``init_from``: a recipe never types a folder);
* ``Measure`` — a ``MeasureSpec`` of a checkpoint, an embedded checkpoint or a
  ``Reference`` representation (the look-up table, a random-init encoder, the look-up or
  oracle representation of a run's language);
* ``Gate`` — a data-dependent stop: a pure check of measured rows that decides whether the
  items under it run (isoloss's headroom gate).

Nothing here runs anything. ``walk.py`` walks a declaration for real (``reproduce``), as
a plan (``sameloss plan``: every gate assumed to pass, a ``Later`` stage declared from what
the recipe offers for planning) or for a shard (``reproduce --seeds``); the report reads
what the walk produced (``engine.Records``) by the tags given here (``tags``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, NamedTuple, Union

from ...measures.run import MeasureSpec
from .layout import embedded_name, run_folder, seed_folder
from .runspec import RunSpec


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint of run ``run`` of the same study folder: its ``step`` (``None``: its last)."""

    run: str
    step: int | None = None


@dataclass(frozen=True)
class Embedded:
    """Checkpoint ``of`` embedded function-preservingly into a larger transformer
    (``models.embed``, App. B.4): the size named ``into``, or ``width_factor``× wider with
    ``extra_layers`` more blocks; ``optimizer="embedded"`` maps the checkpoint's optimiser
    moments onto it, for a fork to continue."""

    of: Checkpoint
    into: str | None = None
    width_factor: int | None = None
    extra_layers: int = 0
    optimizer: str = "fresh"

    @property
    def shape(self) -> str:
        """The target shape as a folder and model name tells it (``w2+1``, or the size)."""
        return self.into or f"w{self.width_factor or 1}+{self.extra_layers}"

    def folder(self, run: str, step: int) -> str:
        """The folder (under the study's ``embedded/``) of run ``run``'s checkpoint at ``step``
        embedded so: the same name for the engine and the planner."""
        return embedded_name(run, step, self.shape, self.optimizer)


@dataclass(frozen=True)
class Reference:
    """A representation measured on no checkpoint, of run ``run``'s language (and, for
    ``random-init``, its model and seed): ``lookup-table``, ``random-init``, ``lookup`` or
    ``oracle`` (``core.Study.reference``)."""

    kind: str
    run: str


Target = Union[Checkpoint, Embedded, Reference]


class CostPart(NamedTuple):
    """The part of a unit's CPU time a run or measure counts to, as a row's tags: the fork
    point (``""`` for the base), the fork (``base`` for the base, its gate and references)
    and the stage (``train``, ``measure``, ``train+gate``)."""

    point: str
    fork: str
    stage: str

    def row(self, cpu_seconds: float) -> dict:
        """A tidy cost row: the tags and the seconds."""
        return {**self._asdict(), "cpu_seconds": cpu_seconds}


def cost_rows(cpu: dict) -> list[dict]:
    """CPU seconds by ``CostPart`` as tidy rows (what ``cost.json`` keeps)."""
    return [part.row(seconds) for part, seconds in cpu.items()]


def cost_parts(rows: list[dict]) -> dict:
    """``cost_rows``' rows read back as CPU seconds by ``CostPart``. Anything else raises
    ``KeyError``, ``TypeError`` or ``ValueError`` (the callers say which file)."""
    if not isinstance(rows, list):
        raise TypeError(f"cost rows are a list, not {type(rows).__name__}")
    return {CostPart(r["point"], r["fork"], r["stage"]): float(r["cpu_seconds"]) for r in rows}


Tags = tuple  # ((name, value), ...): what a declared item is in its study (``tags``)


def tags(**values) -> Tags:
    """A declared run's or measure's tags — e.g. its seed, language, fork point, fork, stage,
    step and role in the study — in the order given: what its rows of the engine's tidy tables
    carry (``engine.Records.rows``, ``measured.csv``), so that a report finds them by asking for
    them and never re-derives what was declared."""
    return tuple(values.items())


@dataclass(frozen=True)
class Run:
    """A run to train or reuse; ``start``: the checkpoint it is forked from (its
    ``init_step`` setting says whether it continues that checkpoint's step or restarts).
    ``cost``: the part of its unit's CPU time it counts to (``engine.UnitRecord.cpu``);
    ``tags``: what it is in the study (``tags``; ``engine.Records.runs``)."""

    spec: RunSpec
    start: Checkpoint | Embedded | None = None
    cost: CostPart | None = None
    tags: Tags = ()

    @property
    def name(self) -> str:
        return self.spec.name


@dataclass(frozen=True)
class Measure:
    """``spec`` measured on ``of``; ``cost`` as ``Run``'s. ``optional``: a target that cannot
    be made for a reason a user can read (a shape that cannot hold the model) is skipped
    with that reason (``engine.Records.skipped``) instead of stopping the study. ``tags``:
    what it is in the study (``tags``): its row in ``engine.Records.rows`` carries them."""

    of: Target
    spec: MeasureSpec
    cost: CostPart | None = None
    optional: bool = False
    tags: Tags = ()


@dataclass(frozen=True)
class Gate:
    """A data-dependent stop: ``check(rows, *args) -> (ok, text)`` on the rows of ``reads``
    (measured before it in the unit); the items ``then`` run when it passes, and also when
    it fails if ``on_fail`` is ``"mark"`` (the report marks its verdicts instead). A check
    that finds the study broken raises. A plan assumes every gate passes."""

    name: str
    check: Callable
    reads: tuple[Measure, ...]
    then: tuple = ()
    args: tuple = ()
    on_fail: str = "stop"

    def __post_init__(self):
        if self.on_fail not in ("stop", "mark"):
            raise ValueError(f"gate {self.name}: on_fail is 'stop' or 'mark', not {self.on_fail!r}")


Item = Union[Run, Measure, Gate]


@dataclass(frozen=True)
class Unit:
    """A part of a study that runs apart from the rest, in any process: its ``items`` on
    the study of the folder ``study`` (relative to the experiment folder; ``""``: the
    experiment's own), holding the lock of ``folder`` (what it writes besides rows of
    ``measurements.json``). ``name`` is unique in a study and shown in the log; ``seed``
    marks a seed's unit (``reproduce --seeds`` selects them). Units that write one folder
    are run as one (``merge_units``: a run two recipes share)."""

    name: str
    folder: str
    items: tuple = ()
    seed: int | None = None
    study: str = ""


@dataclass(frozen=True)
class Later:
    """Units declared from earlier units' results: ``declare(records, *args)`` once the
    units named ``after`` have run (``records``: an ``engine.Records`` of theirs);
    ``plan(setup, *args)`` in a plan, which has no results. ``seeds``: the seeds its units
    may have (``reproduce --seeds`` accepts them before they are declared)."""

    after: tuple[str, ...]
    declare: Callable
    plan: Callable
    args: tuple = ()
    seeds: tuple[int, ...] = ()


def measured(spec: RunSpec, mspec: MeasureSpec, **run_tags) -> list[Measure]:
    """The measures of a run's ``measure_steps`` checkpoints (none given: its last), tagged
    with ``run_tags`` (what the run is in its study: ``measured_run``), the run and the step
    (the last checkpoint's measure has no step tag: its row's own ``step`` says which it was,
    where a tag of ``None`` would hide it in ``Records.rows`` and ``measured.csv``)."""
    return [Measure(Checkpoint(spec.name, step), mspec,
                    tags=tags(**run_tags, run=spec.name, **({} if step is None else {"step": step})))
            for step in spec.measure_steps or (None,)]


def measured_run(spec: RunSpec, mspec: MeasureSpec, start: Checkpoint | Embedded | None = None,
                 **run_tags) -> tuple[Item, ...]:
    """A run (forked from ``start``) and the measures of its ``measure_steps`` checkpoints
    (``measured``). ``run_tags`` say what the run is in its study — the recipe's runs carry
    their ``experiment`` and ``language`` (``common.measured_runs`` finds them so) — and tag
    the run, with its group and label, and each of its measures."""
    return (Run(spec, start, tags=tags(**run_tags, group=spec.group, label=spec.label)),
            *measured(spec, mspec, **run_tags))


def run_unit(spec: RunSpec, mspec: MeasureSpec, *extra: Item, **run_tags) -> Unit:
    """The unit of one run: trained (or reused, resumed), then its ``measure_steps``
    checkpoints measured with ``mspec``, then ``extra``; the run and its measures tagged
    with ``run_tags`` (``measured_run``)."""
    return Unit(f"run {spec.name}", run_folder(spec.name), (*measured_run(spec, mspec, **run_tags), *extra))


def seed_unit(seed: int, items: tuple, group: str = "") -> Unit:
    """A seed's unit: ``items`` in the seed's own study folder ``seeds/seed<N>/`` (``group``:
    ``seeds/<group>/seed<N>/``, one of several studies in one experiment), which it locks."""
    where = seed_folder(seed, group)
    return Unit(f"{group} seed {seed}" if group else f"seed {seed}", where, items, seed=seed, study=where)


def merge_units(units: list[Unit]) -> list[Unit]:
    """Units that write the same folder (a run two recipes share, in ``figure1``) made one
    unit with their items in order; the others as they are, in order."""
    groups: dict[tuple[str, str], list[Unit]] = {}
    for u in units:
        groups.setdefault((u.study, u.folder), []).append(u)
    out = []
    for group in groups.values():
        first = group[0]
        out.append(first if len(group) == 1 else
                   Unit(first.name, first.folder, tuple(i for u in group for i in u.items), first.seed, first.study))
    return out


def with_setting(units: list, key: str, value) -> list:
    """``units`` with the config setting ``key = value`` on every run they train (inside
    gates too): how ``--dropout-draws keyed`` reaches every run of a study, its forks and
    its later stages included."""

    def item(x):
        if isinstance(x, Run):
            return dataclasses.replace(x, spec=dataclasses.replace(x.spec, settings=(*x.spec.settings, (key, value))))
        if isinstance(x, Gate):
            return dataclasses.replace(x, then=tuple(item(y) for y in x.then))
        return x

    return [dataclasses.replace(u, items=tuple(item(x) for x in u.items)) for u in units]
