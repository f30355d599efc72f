"""Languages with headroom, found by search (issue 36): ``sameloss language search``
(how to run it, its stages, costs and history: docs/how-to/other-languages.md).

A study's verdict is about a language only where a trained model has room to differ from
what needs no training and from what knows the answer (``isoloss``'s headroom gate). Which
languages have that room is measured here, for any draw of a family's random constructor
(``draws``: ranges of its settings, ``KEY=LO..HI``, sampled uniformly from ``--seed``), in
the isoloss study's own terms (its preset at ``--scale``), cheapest first: ``screen`` (no
training: majority, random-init encoder, look-up table and oracle at the study's primary
probe, on a smaller design; the *gap* oracle − max(look-up, random-init)), ``gate`` (the
first promising draws trained as the study trains seed 0, its base gated by the study's own
rule on the study's own probe design: a declared unit walked by the engine), and the gate on
more seeds' bases. The folder is a sameloss experiment folder (a ``Study``) of one scale
(``search.json``): a rerun reuses every finished candidate, an interrupted one resumes; the
first CPU cost of each candidate is kept (``costs.json``, ``Costs``).
"""

from __future__ import annotations

import inspect
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from ... import files, storage
from ...errors import UserError
from .tables import tables, write_files

SEARCH_FILE = "search.json"  # the folder's search settings: what makes it a search folder
COSTS_FILE = "costs.json"  # CPU seconds of each stage of each candidate when it was computed
SEED_RANGE = (0, 999)  # a draw's language seed when ``seed`` is not searched or fixed
SIGNIFICANT = 3  # digits a decimal setting is drawn to (its spec reads back exactly)


# ---- the ranges ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Range:
    """One searched setting: ``key`` fixed (``lo == hi``) or drawn uniformly from
    ``[lo, hi]``; ``kind``: ``int`` or ``float``."""

    key: str
    lo: int | float
    hi: int | float
    kind: type

    def draw(self, rng: np.random.Generator) -> int | float:
        if self.lo == self.hi:
            return self.lo
        if self.kind is int:
            return int(rng.integers(self.lo, self.hi + 1))
        value = float(f"{rng.uniform(self.lo, self.hi):.{SIGNIFICANT}g}")
        return min(max(value, self.lo), self.hi)

    @property
    def text(self) -> str:
        return f"{self.key}={self.lo}" if self.lo == self.hi else f"{self.key}={self.lo}..{self.hi}"


def family_params(family: str) -> dict[str, type]:
    """The settings a family's random constructor takes (``language.params``) and ``seed``;
    ``UserError`` for a family without one."""
    from ... import registry

    known = registry.languages()
    if family not in known:
        raise UserError(f"language search: unknown language {family!r}; choose from {', '.join(known)}")
    entry = known[family]
    # the builder's module declares what ``language.params`` takes (``PARAMS``: name -> int or float)
    params = getattr(inspect.getmodule(entry.builder()), "PARAMS", None) if "params" in entry.settings else None
    if not params or "seed" not in entry.settings:
        takers = [n for n, e in known.items() if "params" in e.settings and "seed" in e.settings]
        raise UserError(f"language search: {family} has no random constructor to search (languages with one: "
                        f"{', '.join(takers)})")
    return {**params, "seed": int}


def parse_settings(family: str, texts: list[str]) -> list[Range]:
    """``KEY=LO..HI`` / ``KEY=V`` → the searched settings, each checked (``UserError``, one line,
    naming what is wrong: an unknown key, a key given twice, a decimal for an integer setting,
    a range whose low end is above its high end, a negative seed)."""
    from ...registry import _number

    accepted = family_params(family)
    out: dict[str, Range] = {}
    for text in texts:
        key, eq, value = (part.strip() for part in text.partition("="))
        if not eq or not key or not value:
            raise UserError(f"language search: {text!r} is not KEY=LO..HI or KEY=VALUE (e.g. n_states=4..8)")
        if key not in accepted:
            raise UserError(f"language search: {family} takes no {key!r}; it takes {', '.join(accepted)}")
        if key in out:
            raise UserError(f"language search: {key} is given twice")
        lo_text, dots, hi_text = value.partition("..")
        if dots and (not lo_text.strip() or not hi_text.strip()):
            raise UserError(f"language search: {text!r}: a range needs both ends, LO..HI")
        try:
            lo = _number(lo_text.strip(), f"language search: {key}")
            hi = _number(hi_text.strip(), f"language search: {key}") if dots else lo
        except ValueError as exc:
            raise UserError(str(exc)) from None
        kind = accepted[key]
        if kind is int and not (isinstance(lo, int) and isinstance(hi, int)):
            raise UserError(f"language search: {key} is an integer setting; {value!r} is not an integer "
                            f"{'range' if dots else 'value'}")
        if lo > hi:
            raise UserError(f"language search: {text!r}: the low end {lo} is above the high end {hi}")
        if key == "seed" and lo < 0:
            raise UserError(f"language search: seed must be a non-negative integer, got {lo}")
        out[key] = Range(key, kind(lo), kind(hi), kind)
    return list(out.values())


def draws(family: str, size: str, task: str, settings: list[Range], n: int, seed: int) -> list:
    """``n`` draws (distinct ``isoloss.LanguageChoice``s, in drawing order; fewer when the
    ranges hold fewer distinct languages): each setting in key order, then the language seed."""
    from ..recipes.isoloss import LanguageChoice

    rng = np.random.default_rng(seed)
    given = sorted(settings, key=lambda s: s.key)
    if not any(s.key == "seed" for s in given):
        given.append(Range("seed", *SEED_RANGE, int))
    out: dict[str, LanguageChoice] = {}
    for _ in range(n):
        values = {s.key: s.draw(rng) for s in given}
        lang_seed = values.pop("seed")
        params = ",".join(f"{k}={v}" for k, v in values.items()) or None
        choice = LanguageChoice(family, size, task, lang_seed, params)
        out.setdefault(choice.spec, choice)
    return list(out.values())


# ---- the stages ------------------------------------------------------------------------------
@dataclass(frozen=True)
class SearchDesign:
    """The search's settings beyond its draws (the command's options)."""

    scale: str = "tiny"
    screen_subsets: int = 10
    screen_test: int = 2000
    min_gap: float = 15.0
    train_top: int = 3
    gate_seeds: int = 0  # 0: seed 0 only (the train stage)
    gate_pass: float = 15 / 16
    screen_only: bool = False


def _preset(choice, scale: str):
    from ..recipes.isoloss import PRESETS

    return PRESETS[scale].on(choice, choice.tag)


def _fewshot(p, seed: int, subsets: int | None = None, test: int | None = None):
    """The study's primary endpoint alone — the span view, the L-BFGS probe, n =
    ``probes.primary_size`` from its pool, its l2, the seed's data and subsets — with the primary size's subsets and
    the test set (``subsets``, ``test``: the screen's smaller ones)."""
    from ...measures.fewshot import FewShot
    from ...measures.headroom import span_view

    pr = p.probes
    return FewShot(p.task, (("pos", span_view(p.span)),), (pr.primary_size,), (subsets or pr.primary_subsets,),
                   pr.pool, test or pr.test, (("pos", "lbfgs"),), pr.epochs, pr.l2, seed=seed)


def _references(study, p, cfg, fewshot) -> dict[str, dict]:
    from ...measures.run import MeasureSpec

    spec = MeasureSpec(fewshot=fewshot)
    return {kind: study.reference(kind, cfg, spec) for kind in ("random-init", "lookup", "oracle")}


def _cpu() -> float:
    return time.process_time()


def build(choice) -> str | None:
    """Why the draw ``choice`` cannot be studied (its language refused, or its task has no fixed
    span and posterior), or ``None``."""
    from ..recipes.isoloss import task_span

    try:
        task_span(choice)
    except UserError as exc:
        return str(exc)
    return None


def screen(study, choice, design: SearchDesign) -> dict:
    """The screen row of one draw: majority, random-init, look-up, oracle (points), the gap."""
    from ..recipes.isoloss import base_run

    p = _preset(choice, design.scale)
    c0 = _cpu()
    cfg = base_run(p, 0).config()
    fewshot = _fewshot(p, 0, min(design.screen_subsets, 10**6), min(design.screen_test, p.probes.test))
    refs = _references(study, p, cfg, fewshot)
    key = p.primary_key
    row = {"majority": 100 * refs["oracle"]["fewshot_majority"],
           **{name: 100 * float(refs[kind][key]) for name, kind in
              (("random_init", "random-init"), ("lookup", "lookup"), ("oracle", "oracle"))}}
    row["gap"] = row["oracle"] - max(row["lookup"], row["random_init"])
    row["cpu_s"] = _cpu() - c0
    return row


def gate(study, choice, design: SearchDesign, seed: int, fork: bool = False) -> dict:
    """Seed ``seed``'s base trained as the study trains it (and with ``fork`` its ``adamw``
    fork), and the study's gate applied to the base on the study's own probe design (module
    docstring): a declared unit (``gate_unit``) walked by the engine on the search's study."""
    from ...training.runio import eval_history
    from ..engine.walk import Execute, walk
    from ..recipes.isoloss import headroom_gate

    p = _preset(choice, design.scale)
    c0 = _cpu()
    record = walk(gate_unit(p, seed, fork), Execute(study))
    key = p.primary_key
    got = {t["of"]: row for t, row in record.tagged(role="gate")}
    ok, _ = headroom_gate(p, seed, got["trained"], got["random-init"], got["lookup"], got["oracle"])
    ((_, base),) = record.tagged_runs(role="base")
    row = {"seed": seed, "base_kl": float(eval_history(base.path)[p.base_steps]["kl"]),
           **{name: 100 * float(got[kind][key]) for name, kind in (("random_init", "random-init"),
                                                                  ("lookup", "lookup"), ("trained", "trained"),
                                                                  ("oracle", "oracle"))}}
    row.update(above_lookup=row["trained"] - row["lookup"], above_random_init=row["trained"] - row["random_init"],
               below_oracle=row["oracle"] - row["trained"], ok=ok)
    if fork:
        ((_, run),), ((t, end),) = record.tagged_runs(role="fork"), record.tagged(role="fork-end")
        candidates = set(p.candidates(p.forks[0]))
        kls = [float(ev["kl"]) for step, ev in eval_history(run.path).items() if step in candidates]
        row.update(fork_end=t["step"], fork_min_kl=min(kls), fork_end_kl=kls[-1], trained_end=100 * float(end[key]))
    row["cpu_s"] = _cpu() - c0
    return row


def gate_unit(p, seed: int, fork: bool = False):
    """The search's gate of seed ``seed`` as a unit (``declare.Unit``): the base
    (``isoloss.base_run``), its trained checkpoint and the three references probed on the
    study's primary endpoint alone (``_fewshot``), and with ``fork`` the ``adamw`` fork from
    the base's last checkpoint and its end probed likewise. Its rows are read back by their
    tags (``gate``): ``role`` base / fork for the runs, gate (``of`` trained or the reference)
    / fork-end for the measures."""
    from ...measures.run import MeasureSpec
    from ..engine.declare import Checkpoint, Measure, Reference, Run, Unit, tags
    from ..recipes.isoloss import base_run, fork_run
    from ..recipes.isoloss.study import BASE_COST, REFERENCES

    base = base_run(p, seed)
    spec = MeasureSpec(fewshot=_fewshot(p, seed))
    items: tuple = (Run(base, None, BASE_COST, tags(seed=seed, role="base")),
                    Measure(Checkpoint(base.name, p.base_steps), spec, tags=tags(seed=seed, role="gate", of="trained")),
                    *(Measure(Reference(kind, base.name), spec, tags=tags(seed=seed, role="gate", of=kind))
                      for kind in REFERENCES))
    if fork:
        adamw = p.forks[0]
        run, end = fork_run(p, seed, adamw, p.base_steps), p.fork_end(adamw)
        items = (*items, Run(run, Checkpoint(base.name, p.base_steps), tags=tags(seed=seed, role="fork")),
                 Measure(Checkpoint(run.name, end), spec, tags=tags(seed=seed, role="fork-end", step=end)))
    # the search's study folder itself (runs and rows where earlier searches left them)
    return Unit(f"gate seed {seed}", "", items, seed=seed)


# ---- the search ------------------------------------------------------------------------------
def _open(out: Path, design: SearchDesign, progress: bool, device: str, log):
    """The search's folder as a ``Study`` (locked, marked), refusing a folder that is not a search
    folder of this scale."""
    import json

    from ..engine.core import Study, StudySettings
    from ..engine.folder import record_output

    out = Path(out)
    marker = out / SEARCH_FILE
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} exists and is not a folder")
    if out.is_dir() and not files.is_empty_dir(out) and not marker.is_file():
        raise UserError(f"--out {out} exists and is not a language search folder (no {SEARCH_FILE}); "
                        "give a new folder")
    study = Study(out, StudySettings(progress=progress, device=device), log=log)
    try:
        if marker.is_file():
            try:
                saved = json.loads(marker.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
                raise UserError(f"{marker}: cannot be read ({exc}); give a new --out") from None
            if not isinstance(saved, dict) or saved.get("scale") != design.scale:
                got = saved.get("scale") if isinstance(saved, dict) else None
                raise UserError(f"--out {out} holds a search at scale {got!r}, not {design.scale!r}: its runs follow "
                                "another schedule; give a new --out")
        else:
            with storage.storage_errors(marker):
                files.atomic_write_json(marker, {"what": "sameloss language search", "scale": design.scale})
            record_output(marker)
    except BaseException:
        study.close()
        raise
    return study


@dataclass(frozen=True)
class Draws:
    """What the search draws (the command's arguments): the family, its settings' ranges
    (``key=lo..hi``, ``parse_settings``), the task probed (default: the family's), the size
    drawn from, how many distinct draws and the seed they are drawn with."""

    family: str
    texts: tuple[str, ...] = ()
    task: str | None = None
    size: str = "headroom"
    n: int = 20
    seed: int = 0


@dataclass(frozen=True)
class SearchOutput:
    """Where the search writes and what it says: its folder, progress bars, device, the log;
    ``register``: the name under which the first passing draw is registered (``found``; in
    ``registered``, default the package's folder), with ``command`` the command line that
    found it."""

    out: str | Path = "runs/language-search"
    progress: bool = True
    device: str = "auto"
    log: Callable[[str], None] = print
    register: str | None = None
    command: str = ""
    registered: Path | None = None


def run_search(draw: Draws, design: SearchDesign = SearchDesign(), output: SearchOutput = SearchOutput()) -> dict:
    """The whole search (module docstring); returns its tables (``"screen"``, ``"train"``,
    ``"gate"`` rows), the specs that pass and the text printed."""
    from ..recipes.isoloss import DEFAULT_TASKS, PRESETS

    if design.scale not in PRESETS:
        raise UserError(f"--scale {design.scale!r}: isoloss has no such scale; choose from {', '.join(PRESETS)}")
    settings = parse_settings(draw.family, list(draw.texts))
    task = draw.task or DEFAULT_TASKS.get(draw.family)
    if task is None:
        raise UserError(f"language search: say which task to probe (--task: one of {draw.family}'s tasks with a "
                        "span and a posterior)")
    from ... import registry

    if draw.size not in registry.languages()[draw.family].sizes:
        raise UserError(f"--size {draw.size!r}: {draw.family} has no such size; its sizes: "
                        f"{', '.join(registry.languages()[draw.family].sizes)}")
    if design.gate_seeds and design.screen_only:
        raise UserError("--gate-seeds trains bases: it cannot go with --screen-only")
    if output.register is not None:
        _check_register(output.register, draw.family, design)
    candidates = draws(draw.family, draw.size, task, settings, draw.n, draw.seed)
    refused = {c.spec: why for c in candidates if (why := build(c)) is not None}
    if len(refused) == len(candidates):
        first = next(iter(refused.values()))
        raise UserError(f"language search: none of the {len(candidates)} draws can be studied; the first: {first}")
    output.log(f"language search: {draw.family} ({draw.size}) task {task}, {len(candidates)} distinct draws of "
               f"{' '.join(s.text for s in settings) or 'the size'} (seed {draw.seed}), {len(refused)} refused; "
               f"isoloss scale {design.scale}")
    result = {"screen": [], "train": [], "gate": [], "passed": []}
    with _open(Path(output.out), design, output.progress, output.device, output.log) as study:
        cost = Costs(study.root)
        t0 = time.perf_counter()
        for i, c in enumerate(candidates):
            if c.spec in refused:
                result["screen"].append({"spec": c.spec, "note": refused[c.spec]})
                continue
            row = cost("screen", c.spec, f"{design.screen_subsets}x{design.screen_test}", screen(study, c, design))
            result["screen"].append({"spec": c.spec, **row, "promising": row["gap"] >= design.min_gap})
            output.log(f"screened {i + 1}/{len(candidates)} ({time.perf_counter() - t0:.0f} s): {c.spec}: "
                       f"look-up {row['lookup']:.1f}, random-init {row['random_init']:.1f}, oracle "
                       f"{row['oracle']:.1f}, gap {row['gap']:.1f}")
        # in drawing order, not largest gap first: the largest gaps come with the hardest languages,
        # whose trained probe stays at the look-up table's level (module docstring)
        promising = [r for r in result["screen"] if r.get("promising")]
        shortlist = [] if design.screen_only else [next(c for c in candidates if c.spec == r["spec"])
                                                   for r in promising[:design.train_top]]
        for i, c in enumerate(shortlist):
            output.log(f"training {i + 1}/{len(shortlist)}: {c.spec} (seed 0: the study's base and its adamw "
                       "fork)")
            row = cost("train", c.spec, 0, gate(study, c, design, 0, fork=True))
            result["train"].append({"spec": c.spec, **row})
            output.log(f"  seed 0: trained {row['trained']:.1f} (look-up {row['lookup']:.1f}, random-init "
                       f"{row['random_init']:.1f}, oracle {row['oracle']:.1f}): gate "
                       f"{'passed' if row['ok'] else 'FAILED'}")
        winners = [c for c, r in zip(shortlist, result["train"]) if r["ok"]]
        if design.gate_seeds > 1:
            for c, first in zip(winners, [r for r in result["train"] if r["ok"]]):
                rows = [{"spec": c.spec, **{k: v for k, v in first.items() if k != "spec"}}]
                allowed = design.gate_seeds - math.ceil(design.gate_pass * design.gate_seeds - 1e-9)
                for s in range(1, design.gate_seeds):
                    if sum(not r["ok"] for r in rows) > allowed:
                        break
                    row = cost("gate", c.spec, s, gate(study, c, design, s))
                    rows.append({"spec": c.spec, **row})
                    output.log(f"  {c.spec} seed {s}: trained {row['trained']:.1f}, margins "
                               f"{row['above_lookup']:+.1f} / {row['above_random_init']:+.1f} / "
                               f"{row['below_oracle']:+.1f}: {'passed' if row['ok'] else 'FAILED'} "
                               f"({sum(r['ok'] for r in rows)} of {len(rows)})")
                result["gate"] += rows
                if len(rows) == design.gate_seeds and sum(r["ok"] for r in rows) >= design.gate_pass * len(rows) - 1e-9:
                    result["passed"].append(c.spec)
        else:
            result["passed"] = [c.spec for c in winners]
        result["text"] = tables(result, draw.family, task, design)
        write_files(study, result)
    if output.register is not None:
        result["registered"] = _register(result, output.register, output.command, design, output.registered,
                                         output.log)
    return result


def _check_register(name: str, family: str, design: SearchDesign) -> None:
    """``--register NAME`` before anything runs: a name of the family, and a gate on several seeds
    (a registered language is one a study keeps on its seeds, not on seed 0 alone)."""
    from ... import registry
    from ...found import check_name

    check_name(name, family, registry.languages()[family].sizes)
    if design.gate_seeds < 2:
        raise UserError("--register needs --gate-seeds N (e.g. 16): a language is registered with its gate on N seeds")


def _register(result: dict, name: str, command: str, design: SearchDesign, folder: Path | None, log) -> str | None:
    """Register the first draw that passed, in drawing order (``result["passed"]`` keeps it),
    with its gate per seed; ``None`` (and a line saying so) when none passed."""
    from ...found import Found, write
    from ..recipes.isoloss import PRESETS

    if not result["passed"]:
        log(f"--register {name}: no draw passed, nothing registered")
        return None
    spec = result["passed"][0]
    rows = tuple({k: (bool(r[k]) if k == "ok" else int(r[k]) if k == "seed" else float(r[k])) for k in
                  ("seed", "trained", "lookup", "random_init", "oracle", "above_lookup", "above_random_init",
                   "below_oracle", "ok")} for r in result["gate"] if r["spec"] == spec)
    margin = PRESETS[design.scale].verdicts.headroom_margin
    found = Found(name, spec, command, design.scale, design.gate_pass, margin, rows)
    path = write(found, folder)
    log(f"registered {name} = {spec} ({path})")
    return name


class Costs:
    """The CPU seconds each (stage, candidate, detail) took when it was computed, kept in the
    folder (``costs.json``, tidy rows ``{"stage", "spec", "detail", "cpu_s"}``): a rerun
    reuses the runs and rows and reports the first cost, not the seconds its cache look-ups
    took. ``detail``: the screen's design (``subsets x test``), or the gate's seed."""

    def __init__(self, root: Path):
        import json

        self.path = Path(root) / COSTS_FILE
        try:
            saved = json.loads(self.path.read_text(encoding="utf-8")) if self.path.is_file() else []
            self.seen = {(r["stage"], r["spec"], str(r["detail"])): float(r["cpu_s"]) for r in saved}
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError):  # unreadable: this call's costs
            self.seen = {}

    def __call__(self, stage: str, spec: str, detail, row: dict) -> dict:
        """``row`` with the first cost of ``(stage, spec, detail)`` (its own, and recorded,
        when it is the first)."""
        from ..engine.folder import record_output

        key = (stage, spec, str(detail))
        if key not in self.seen:
            self.seen[key] = row["cpu_s"]
            rows = [{"stage": a, "spec": b, "detail": c, "cpu_s": v} for (a, b, c), v in self.seen.items()]
            with storage.storage_errors(self.path):
                record_output(self.path)
                files.atomic_write_json(self.path, rows, indent=1)
        return {**row, "cpu_s": self.seen[key]}


__all__ = ["Draws", "Range", "SearchDesign", "SearchOutput", "draws", "parse_settings", "run_search"]
