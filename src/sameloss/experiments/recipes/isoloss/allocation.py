"""The stage after an adaptive study's pilot: the later seeds planned from the pilot's paired
SDs and measured cost (``experiments.allocation``: Stein's two-stage plan, cut to the
budget), kept in ``allocation.json`` so that every later call plans the same seeds; and the
budget's forecast before anything trains (``sameloss plan``'s cost model)."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path

import numpy as np

from ....errors import UserError
from ...stats import paired
from ...stats.allocation import Allocation, afford, allocate
from ...engine.declare import CostPart, cost_parts, cost_rows
from .design import PRIOR_SOURCE, IsolossPreset, forks_of

def allocation_of(setup, p: IsolossPreset, pilot: list[dict]) -> Allocation:
    """The plan of the seeds after the pilot (``allocation``): each test's paired SD of the
    primary accuracy over the pilot's pairs, the seeds its MDE target needs, cut to what the
    budget buys (``budget_minutes``: the pilot's measured CPU per fork, shared over the
    launcher's workers). The pilot's spread and cost are written to ``allocation.json`` the
    first time and read back after (a reused seed costs no CPU, so a second call could not
    measure the pilot again), with the allocation each call plans (another ``--budget`` plans
    again from the same pilot), in one write: what the report reads (``recorded_allocation``)
    instead of planning a second time. A dry plan (``sameloss plan``) has no pilot data,
    plans with ``prior_sds`` and writes nothing."""
    tests = [f"{c.name} @ {pt}" for c, pt in p.tests()]
    saved = _saved_allocation(setup, p)
    if saved is not None:
        sds, costs, pilot_wall = saved["sds"], saved["costs"], saved["pilot_wall"]
    elif not _writes(setup):  # a dry plan: no pilot data
        sds, costs, pilot_wall = dict(p.seed_design.prior_sds), {}, 0.0
    else:
        sds, costs, pilot_wall = _pilot_sds(p, pilot), _pilot_costs(pilot), _pilot_wall(setup, pilot)
    sds = {t: float(sds.get(t, math.nan)) for t in tests}
    d = p.seed_design
    alloc = allocate(sds, d.pilot_seeds, len(p.seeds), d.mde_target, d.exempt, family=p.claims or None)
    if d.budget_minutes is not None and costs:
        alloc = afford(alloc, lambda active: seed_cost(p, costs, active), pilot_wall, 60 * d.budget_minutes,
                       _workers(setup))
    if _writes(setup):
        _save_allocation(setup, p, {"sds": sds, "costs": cost_rows(costs), "pilot_wall": pilot_wall}, alloc)
    return alloc


def seed_cost(p: IsolossPreset, costs: dict[CostPart, float], tests: list[str]) -> float:
    """What one seed that runs the forks of ``tests`` costs by ``costs`` (seconds by
    ``CostPart``: the pilot's measured ones, or the planner's): every part of its base (its
    training, gate and references), the training of every run those forks read
    (``IsolossPreset.runs_read``, the rule ``study.wanted`` trains by) and the measures of the
    forks."""
    forks = forks_of(p, tests)
    return (sum(v for k, v in costs.items() if k.fork == "base")
            + sum(costs.get(CostPart(pt, name, "train"), 0.0) for pt, name in p.runs_read(forks))
            + sum(costs.get(CostPart(pt, name, "measure"), 0.0) for pt, name in forks))


def _pilot_sds(p: IsolossPreset, pilot: list[dict]) -> dict[str, float]:
    """Each test's effective SD of the primary accuracy (points) over the pilot's used pairs:
    the weighted estimate's standard error × √n (``weighted.estimate``; the plain paired SD
    where every pair weighs the same), what the final test's standard error is planned from."""
    from ...stats.weighted import estimate, fits_of

    rows = [r for res in pilot for r in res["rows"]]
    tests = p.tests()
    design = p.design()
    pairs = paired.estimate_pairs(rows, tests, [p.primary_key], design)
    out = {}
    for c, pt in tests:
        est = estimate(fits_of(paired.used_pairs(pairs, c, pt), p.primary_key, 100.0), design.slope_level)
        out[f"{c.name} @ {pt}"] = est.sd if est.n >= 2 else math.nan
    return out


def _pilot_costs(pilot: list[dict]) -> dict[CostPart, float]:
    """The pilot's mean CPU seconds per fork point, fork and stage (``cost`` rows)."""
    sums: dict[CostPart, list[float]] = {}
    for res in pilot:
        for r in res.get("cost", []):
            sums.setdefault(CostPart(r["point"], r["fork"], r["stage"]), []).append(r["cpu_seconds"])
    return {k: float(np.mean(v)) for k, v in sums.items()}


def _pilot_wall(setup, pilot: list[dict]) -> float:
    """The pilot's wall seconds, as its seeds shared the workers (their summed CPU over them)."""
    return sum(res["cpu_seconds"] for res in pilot) / _workers(setup)


def _workers(setup) -> int:
    """The workers the units share (``engine.Setup.workers``)."""
    return setup.workers


def _writes(setup) -> bool:
    """A real study (a plan has no pilot data and writes nothing)."""
    return not setup.planning


def _allocation_path(setup, p: IsolossPreset) -> Path:
    return setup.root / (f"{p.tag}-allocation.json" if p.tag else "allocation.json")


def _allocation_key(p: IsolossPreset) -> dict:
    return {"pilot": p.seed_design.pilot_seeds, "seeds": list(p.seeds),
            "tests": [f"{c.name} @ {pt}" for c, pt in p.tests()]}


def _saved_allocation(setup, p: IsolossPreset) -> dict | None:
    """What the first call measured of the pilot (``allocation.json``), if it is this design's."""
    if not _writes(setup):
        return None
    path = _allocation_path(setup, p)
    try:
        saved = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise UserError(f"{path}: cannot be read ({exc}); it records the pilot's spread and cost — remove it to "
                        "measure the pilot again") from None
    if not (isinstance(saved, dict) and saved.get("key") == _allocation_key(p)):
        return None
    try:
        saved["costs"] = cost_parts(saved["costs"])
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise UserError(f"{path}: its costs cannot be read ({exc}); remove it to measure the pilot again") from None
    return saved


def _save_allocation(setup, p: IsolossPreset, pilot: dict, alloc: Allocation | None) -> None:
    """``allocation.json``: this design's key, what the pilot measured (``pilot``: its
    ``sds``, ``costs`` rows and ``pilot_wall``) and the allocation planned from it."""
    from ....files import atomic_write_json
    from ....storage import storage_errors

    path = _allocation_path(setup, p)
    planned = {} if alloc is None else {"allocation": dataclasses.asdict(alloc)}
    with storage_errors(path):
        atomic_write_json(path, {"key": _allocation_key(p), **pilot, **planned}, indent=1)


def recorded_allocation(setup, p: IsolossPreset) -> Allocation | None:
    """The plan this study's later stage recorded (``allocation_of``); ``None``: none
    was (no adaptive stage ran: the pilot's forks did not run)."""
    saved = _saved_allocation(setup, p)
    if saved is None or "allocation" not in saved:
        return None
    try:
        a = saved["allocation"]
        return Allocation(**{**a, "exempt": tuple(a["exempt"]), "family": tuple(a["family"])})
    except (KeyError, TypeError) as exc:
        raise UserError(f"{_allocation_path(setup, p)}: its allocation cannot be read ({exc!r}); remove it to plan "
                        "the later seeds again") from None


def planned_costs(p: IsolossPreset, device: str = "cpu", cpu_peak: float | None = None,
                  workers: int = 1) -> dict[CostPart, float]:
    """The planner's CPU (or device) seconds per seed by fork point, fork and stage
    (``CostPart``; fork ``base``, stages ``train`` and ``measure``: the base, its gate and the
    references): ``sameloss plan``'s cost model on one seed of the study planned with every
    fork, each seed run by one of ``workers`` workers (on the CPU, a peak not given is measured
    with the threads each worker runs)."""
    from ...engine.hardware import measure_cpu_peak
    from ...engine.plan import dry_plan, estimate

    if device == "cpu" and cpu_peak is None:
        cpu_peak = measure_cpu_peak(workers=workers)
    one = dataclasses.replace(p, seeds=p.seeds[:2], replicate=(), seed_design=dataclasses.replace(
        p.seed_design, pilot_seeds=0, budget_minutes=None, plan=(), left=()))
    e = estimate(dry_plan("isoloss", "tiny", preset=one), device, 1, cpu_peak, memory=False)
    costs: dict[CostPart, float] = {}
    for item in (*e.runs, *e.measures):
        key = _cost_key(item["run"], "train" if "steps" in item else "measure")
        costs[key] = costs.get(key, 0.0) + item["seconds"] / len(one.seeds)
    return costs


@dataclasses.dataclass(frozen=True)
class ChosenDesign:
    """What ``choose_design`` chose: per test the seeds it runs on (``plan``), the tests left
    out with what they would need (``left``), and the forecast wall seconds."""

    plan: tuple[tuple[str, int], ...]
    left: tuple[tuple[str, str], ...]
    wall_seconds: float


@dataclasses.dataclass(frozen=True)
class SeedRule:
    """How ``choose_design`` sizes a test: at least ``min_seeds``; an exempt test (an effect
    of several points) ``exempt_seeds``; never more than ``cap``; across ``languages`` > 1
    languages, per language, from the pooled MDE at a spread ``tau`` of the true effects."""

    min_seeds: int = 3
    exempt_seeds: int = 4
    cap: int = 48
    languages: int = 1
    tau: float = 0.0

    @property
    def each(self) -> str:
        return f" a language × {self.languages} languages" if self.languages > 1 else ""


def choose_design(p: IsolossPreset, costs: dict[CostPart, float], budget_seconds: float, workers: int,
                  rule: SeedRule = SeedRule()) -> ChosenDesign:
    """A design fixed before any data, for a budget: the rule of the adaptive study
    (``allocation.needed_seeds``: the seeds whose MDE at 80 % power reaches ``mde_target`` at
    the test's prior paired SD, ``prior_sds``, sized by ``rule``: ``SeedRule``) applied to the
    tests that a budget can decide.

    The tests are taken in order of what they cost to decide — their seeds times the CPU of
    the forks they add, from ``costs`` (``planned_costs``: the planner's seconds per
    ``CostPart``) — and each is kept if the design's wall time, every seed's base,
    gate and forks, its units shared out longest first over ``workers``, stays within
    ``budget_seconds``; seed i runs the forks of the tests planned more than i seeds. A test
    whose two forks both run without being planned (e.g. SAM against −dropout−WD when SAM's control runs both) is reported on
    the seeds where both ran. Left out, with what they would need: tests with no prior SD,
    those whose seeds exceed ``cap`` or the budget.

    Across ``languages`` > 1 languages (the languages scale): a test's seeds are per language,
    the fewest whose pooled MDE (``pooling.pooled_mde``: the HKSJ test of the languages'
    estimates, a spread ``tau`` of the true effects between them) reaches the target, and
    every language runs them: the wall time shares all languages' seeds over the workers,
    each language's seed priced as ``costs`` (one language's)."""
    from ...engine.plan import longest_first

    need, left = _needed(p, rule)
    prior = dict(p.seed_design.prior_sds)

    def wall(plan: dict[str, int]) -> float:
        # a seed is one unit: the units shared out longest first over the workers, as the
        # planner's ``Estimate.wall`` (five equal seeds on 2 workers take 3 seeds' time, not 2.5)
        seeds = max(plan.values(), default=0)
        return longest_first([seed_cost(p, costs, [t for t, n in plan.items() if n > i]) for i in range(seeds)]
                             * rule.languages, workers)

    chosen: dict[str, int] = {}
    order = sorted(need, key=lambda t: (need[t] * (seed_cost(p, costs, [*chosen, t])
                                                   - seed_cost(p, costs, list(chosen))), t))
    for t in order:
        trial = {**chosen, t: need[t]}
        if wall(trial) <= budget_seconds:
            chosen = trial
        else:
            left[t] = f"{need[t]} seeds{rule.each} (prior SD {prior.get(t, math.nan):.3g}): beyond the budget"
    _ride_along(p, chosen, left)
    order_all = [f"{c.name} @ {pt}" for c, pt in p.all_tests()]
    plan = tuple((t, chosen[t]) for t in order_all if t in chosen)
    return ChosenDesign(plan, tuple((t, left[t]) for t in order_all if t in left), wall(dict(plan)))


def _needed(p: IsolossPreset, rule: SeedRule) -> tuple[dict[str, int], dict[str, str]]:
    """The seeds each test needs by ``rule``, and the tests left out before any budget, with why."""
    from ...stats.allocation import needed_seeds
    from ...stats.pooling import pooled_mde

    def seeds_for(sd: float) -> int | None:
        if rule.languages < 2:
            return needed_seeds(sd, p.seed_design.mde_target, start=rule.min_seeds)
        return next((m for m in range(rule.min_seeds, rule.cap + 1)
                     if pooled_mde(sd, rule.tau, rule.languages, m) <= p.seed_design.mde_target), None)

    prior = dict(p.seed_design.prior_sds)
    need: dict[str, int] = {}
    left: dict[str, str] = {}
    for c, pt in p.all_tests():
        t = f"{c.name} @ {pt}"
        sd = prior.get(t, math.nan)
        if c.name in p.seed_design.exempt:
            need[t] = rule.exempt_seeds
        elif not (math.isfinite(sd) and sd > 0):
            left[t] = "no prior paired SD to plan with (the full study's pilot measures it)"
        else:
            n = seeds_for(sd)
            if n is None or n > rule.cap:
                left[t] = f"more than {rule.cap} seeds{rule.each} (prior SD {sd:.3g})"
            else:
                need[t] = n
    return need, left


def _ride_along(p: IsolossPreset, chosen: dict[str, int], left: dict[str, str]) -> None:
    """The tests whose forks run anyway, added to ``chosen`` on the seeds where both do."""
    for c, pt in p.all_tests():
        t = f"{c.name} @ {pt}"
        if t in chosen:
            continue
        both = sum(1 for i in range(max(chosen.values(), default=0))
                   if forks_of(p, [t]) <= forks_of(p, [x for x, n in chosen.items() if n > i]))
        if both >= 2:
            chosen[t] = both
            left.pop(t, None)


def _short(test: str, cut, prior: dict) -> str:
    """A comparison the forecast does not expect to decide, and why: no prior SD to plan it
    with (it is planned once the pilot has measured its spread), or the seeds it needs."""
    if not (math.isfinite(prior.get(test, math.nan)) and prior[test] > 0):
        return f"{test} (no prior SD: planned from the pilot's)"
    needed = cut.needed[test] or f"more than {cut.cap}"
    return f"{test} (needs {needed} seeds, gets {cut.planned[test]})"


def forecast(p: IsolossPreset, device: str, workers: int, cpu_peak: float | None = None) -> str:
    """What the budget buys, before anything trains: the planner's cost per fork and stage
    (``sameloss plan``'s model: one seed of the study planned with every fork), the
    allocation the ``prior_sds`` would give (the pilot's own SDs plan the seeds once it has
    run) cut to the budget; the comparisons it expects to decide and those it does not."""
    costs = planned_costs(p, device, cpu_peak, workers)
    per_seed = sum(costs.values())
    tests = [f"{c.name} @ {pt}" for c, pt in p.tests()]
    d = p.seed_design
    prior = dict(d.prior_sds)
    if not prior:
        pilot = _minutes(d.pilot_seeds * per_seed / workers)
        return (f"Budget forecast: the pilot ({d.pilot_seeds} seeds, every fork) costs ~{pilot} "
                f"on {workers} worker(s) by the planner; no prior paired SDs in the preset, so the later seeds are "
                "planned only once the pilot has run.")
    alloc = allocate({t: prior.get(t, math.nan) for t in tests}, d.pilot_seeds, len(p.seeds), d.mde_target, d.exempt,
                     family=p.claims or None)
    pilot_wall = d.pilot_seeds * per_seed / workers
    # a later seed priced as the allocation after the pilot prices it (``seed_cost``: with the
    # late runs its forks' entries read, which the forecast's own sum once left out)
    cut = (afford(alloc, lambda active: seed_cost(p, costs, active), pilot_wall, 60 * d.budget_minutes, workers)
           if d.budget_minutes else alloc)
    expect = [t for t in tests if cut.needed[t] is not None and cut.planned[t] >= cut.needed[t]]
    exempt = tuple(f"{x} @" for x in d.exempt)
    short = [_short(t, cut, prior) for t in tests if t not in expect and t in cut.family and not t.startswith(exempt)]
    return (f"Budget forecast ({device}, {workers} worker(s), the planner's cost model: ~{_minutes(per_seed)} per seed "
            f"with every fork): the pilot of {d.pilot_seeds} seeds ~{_minutes(pilot_wall)}; "
            + (cut.budget_note + "; " if cut.budget_note else "")
            + f"with the prior paired SDs ({_prior_source(p)}) the MDE target {d.mde_target:g} points after Holm "
            f"over the {len(cut.family)} claims is expected for: {', '.join(expect) or 'none'}; not for: "
            f"{'; '.join(short) or 'none'}"
            + (f"; exempt (tested on the pilot): {', '.join(d.exempt)}" if d.exempt else "") + ".")


def _cost_key(run: str, stage: str) -> CostPart:
    """The cost part of a planned run or measure (its run's name ``…-s<seed>-<point>-<fork>``
    or ``…-base``; a reference's measure belongs to the base)."""
    found = re.search(r"-s\d+-(?P<rest>.+)$", run)
    if found is None or found["rest"] == "base":
        return CostPart("", "base", stage)
    point, _, fork = found["rest"].partition("-")
    return CostPart(point, fork, stage)


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 60 else f"{seconds:.0f} s"


def _prior_source(p: IsolossPreset) -> str:
    return PRIOR_SOURCE if p.seed_design.prior_sds else "none"


def plan_notes(p: IsolossPreset, device: str, workers: int, cpu_peak: float | None) -> tuple[list[str], str]:
    """What ``sameloss plan`` adds for this preset (the recipe's ``plan_notes`` hook): the
    budget's forecast (``forecast``) with the ceiling the plan's wall time then shows, and for a
    study across languages its pooled MDEs (``allocation.pooled_forecast``)."""
    from .design import MEASURED_RUNTIMES, PRESETS

    extra, ceiling = [], ""
    # a scale's measured end-to-end run, quoted where the plan is of that very preset on a CPU
    extra += [line for scale, line in MEASURED_RUNTIMES.items() if device == "cpu" and p == PRESETS[scale]]
    d = p.seed_design
    if d.budget_minutes is not None:  # --budget, or the scale's own
        extra.append(forecast(p, device, workers, cpu_peak))
        ceiling = (f"the ceiling (every seed the prior SDs plan, up to the study's {len(p.seeds)}, as if the "
                   f"{d.budget_minutes:g} min budget did not stop it)")
    if len(p.replicate) > 1 and d.plan:  # a design fixed before the data across languages: its own seeds
        extra.append(planned_pooled(p))
    elif len(p.replicate) > 1:  # a study across languages: its pooled MDEs
        from ...stats.allocation import pooled_forecast

        extra.append(pooled_forecast([f"{c.name} @ {pt}" for c, pt in p.tests()], dict(d.prior_sds),
                                     len(p.replicate), len(p.seeds), d.mde_target,
                                     PRIOR_SOURCE if d.prior_sds else "none", d.exempt))
    return extra, ceiling



def planned_pooled(p: IsolossPreset) -> str:
    """The pooled forecast of a design fixed before the data across languages (the languages
    scale): per planned test its seeds per language and the pooled MDE (``pooling.pooled_mde``)
    at each spread τ between languages (``allocation.TAUS``), and the tests it leaves out."""
    from ...stats.allocation import TAUS
    from ...stats.pooling import pooled_mde

    d = p.seed_design
    prior, n_lang = dict(d.prior_sds), len(p.replicate)
    lines = [f"Pooled forecast of the design fixed before the data ({n_lang} languages: "
             f"{', '.join(c.label or c.spec for c in p.replicate)}; prior paired SDs: {_prior_source(p)}; the pooled "
             f"MDE at 80 % power of the HKSJ test on {n_lang - 1} degrees of freedom, target {d.mde_target:g} "
             "points):",
             f"{'comparison @ point':<24} {'seeds':>11} {'prior SD':>9} " + " ".join(f"{f'MDE τ={t:g}':>10}" for t in TAUS)]
    for test, n in d.plan:
        sd = prior.get(test, math.nan)
        cells = " ".join(f"{pooled_mde(sd, t, n_lang, n):>10.2f}" if math.isfinite(sd) else f"{'no prior':>10}"
                         for t in TAUS)
        lines.append(f"{test:<24} {f'{n} × {n_lang}':>11} {sd:>9.3g} {cells}")
    lines += [f"left out: {t} ({why})" for t, why in d.left]
    return "\n".join(lines)
