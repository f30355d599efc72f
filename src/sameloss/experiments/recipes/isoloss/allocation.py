"""The design rule of every scale, claims first: ``choose_design`` plans the claims (the
paper's claims, the flatness treatment, the positive control) each for 80 % power to be
decided after Holm over the claims planned, at its own margin, from the prior paired SDs and
the planner's cost per fork, within a budget; other comparisons only with the budget left.
``--budget`` chooses again by the same rule; ``sameloss plan`` prints first which claims the
budget is expected to decide and at what power (``plan_notes``)."""

from __future__ import annotations

import dataclasses
import math
import re

from ....errors import UserError
from ...engine.declare import CostPart
from ...stats.allocation import ClaimSpec, DesignPlan, decide_power, plan_design
from .design import CONTROLS, IsolossPreset, forks_of, planned


def seed_cost(p: IsolossPreset, costs: dict[CostPart, float], tests: list[str]) -> float:
    """What one seed that runs the forks of ``tests`` costs by ``costs`` (seconds by
    ``CostPart``: the planner's): every part of its base (its training, gate and references),
    the training of every run those forks read (``IsolossPreset.runs_read``, the rule
    ``study.wanted`` trains by) and the measures of the forks."""
    forks = forks_of(p, tests)
    return (sum(v for k, v in costs.items() if k.fork == "base")
            + sum(costs.get(CostPart(pt, name, "train"), 0.0) for pt, name in p.runs_read(forks))
            + sum(costs.get(CostPart(pt, name, "measure"), 0.0) for pt, name in forks))


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
        p.seed_design, plan=(), left=()))
    e = estimate(dry_plan("isoloss", "tiny", preset=one), device, 1, cpu_peak, memory=False)
    costs: dict[CostPart, float] = {}
    for item in (*e.runs, *e.measures):
        key = _cost_key(item["run"], "train" if "steps" in item else "measure")
        costs[key] = costs.get(key, 0.0) + item["seconds"] / len(one.seeds)
    return costs


def _cost_key(run: str, stage: str) -> CostPart:
    """The cost part of a planned run or measure (its run's name ``…-s<seed>-<point>-<fork>``
    or ``…-base``; a reference's measure belongs to the base)."""
    found = re.search(r"-s\d+-(?P<rest>.+)$", run)
    if found is None or found["rest"] == "base":
        return CostPart("", "base", stage)
    point, _, fork = found["rest"].partition("-")
    return CostPart(point, fork, stage)


def specs(p: IsolossPreset) -> tuple[list[ClaimSpec], list[ClaimSpec]]:
    """Every test of the preset (before a plan) as the rule plans it: the claims, then the
    other comparisons, each with its prior SD, margin and planned effect."""
    prior = dict(p.seed_design.prior_sds)
    claims, others = [], []
    for c, pt in p.all_tests():
        test = str(c.key(pt))
        spec = ClaimSpec(test, float(prior.get(test, math.nan)), c.margin, c.planned_effect, c.name in CONTROLS,
                         c.pooled)
        (claims if test in p.claims else others).append(spec)
    return claims, others


def wall_of(p: IsolossPreset, costs: dict[CostPart, float], workers: int, languages: int = 1):
    """The wall seconds of a plan ``{test: seeds}``: seed i runs the forks of the tests planned
    more than i seeds, every language its own seeds, the units shared out longest first over
    ``workers`` (the planner's ``Estimate.wall``: five equal seeds on 2 workers take 3 seeds'
    time, not 2.5)."""
    from ...engine.plan import longest_first

    def wall(plan: dict[str, int]) -> float:
        seeds = max(plan.values(), default=0)
        return longest_first([seed_cost(p, costs, [t for t, n in plan.items() if n > i]) for i in range(seeds)]
                             * languages, workers)
    return wall


def choose_design(p: IsolossPreset, costs: dict[CostPart, float], budget_seconds: float, workers: int,
                  languages: int = 1, cap: int = 48) -> DesignPlan:
    """A design fixed before any data for a budget, claims first (``stats.allocation
    .plan_design``): each claim of the preset planned the seeds that decide it — detected at
    its planned effect and, unless a positive control, "no effect beyond ±δ" at a true 0, each
    with 80 % power at Holm's first step over the claims planned — at its prior paired SD
    (``prior_sds``), across ``languages`` languages pooled by the stratified fixed-effects
    model; claims are left out, the dearest first, until the wall time (``wall_of``: the
    planner's ``costs``) fits ``budget_seconds``; the other comparisons fill what is left.
    Tests whose forks run anyway ride along on the seeds where both forks run."""
    claims, others = specs(p)
    chosen = plan_design(claims, others, wall_of(p, costs, workers, languages), budget_seconds,
                         languages=languages, cap=cap)
    seeds = dict(chosen.seeds)
    for c, pt in p.all_tests():  # a test whose two forks run anyway is reported where both do
        t = str(c.key(pt))
        if t in seeds:
            continue
        both = sum(1 for i in range(max(seeds.values(), default=0))
                   if forks_of(p, [t]) <= forks_of(p, [x for x, n in seeds.items() if n > i]))
        if both >= 2:
            seeds[t] = both
    order = [str(c.key(pt)) for c, pt in p.all_tests()]
    return dataclasses.replace(chosen, seeds={t: seeds[t] for t in order if t in seeds},
                               left={t: chosen.left[t] for t in order if t in chosen.left})


def with_budget(p: IsolossPreset, minutes: float) -> IsolossPreset:
    """``reproduce isoloss --budget MINUTES``: the scale's design chosen again by the same rule
    (``choose_design``: the planner's costs at this project's CPU, the design's workers) for that
    budget (``UserError`` for one the rule cannot use)."""
    from ...engine.hardware import REFERENCE_CPU_PEAK
    from .design import TINY_DESIGN

    if not (isinstance(minutes, (int, float)) and math.isfinite(minutes) and minutes > 0):
        raise UserError(f"--budget must be a positive number of minutes, got {minutes:g}")
    d = p.seed_design
    if not d.plan:
        raise UserError("--budget: this scale runs every fork on every seed (no design fixed by a budget): "
                        "`sameloss plan` says what it costs")
    if p.replicate:
        raise UserError("--budget: the study across languages keeps its pinned design (`sameloss plan isoloss "
                        "--scale languages` prices it)")
    full = _unplanned(p)
    costs = planned_costs(full, "cpu", REFERENCE_CPU_PEAK, d.workers)
    chosen = choose_design(full, costs, 60 * minutes, d.workers)
    if not chosen.seeds:
        raise UserError(f"--budget {minutes:g}: no claim can be decided within {minutes:g} minutes "
                        "(`sameloss plan isoloss --scale tiny` lists what each needs)")
    q = planned("tiny", TINY_DESIGN, tuple(chosen.seeds.items()), tuple(chosen.left.items()), float(minutes))
    return dataclasses.replace(q, seed_design=dataclasses.replace(q.seed_design, rebudgeted=True))


def _unplanned(p: IsolossPreset) -> IsolossPreset:
    """``p`` with every fork and fork point of tiny's design and no plan (what the rule chooses from)."""
    from .design import TINY_DESIGN, _preset

    return _preset("tiny", **{**TINY_DESIGN, "seed_design": dataclasses.replace(p.seed_design, plan=(), left=())})


def decided_forecast(p: IsolossPreset, languages: int = 1) -> list[str]:
    """Per claim the design plans, the seeds and its planned power at Holm's first step over
    the planned claims: to detect its planned effect, and (unless a positive control) to show
    no effect beyond ±δ at a true 0 — the claims the budget is expected to decide."""
    claims, _ = specs(p)
    plan = dict(p.seed_design.plan)
    mine = [c for c in claims if c.test in plan and c.test in p.claims]
    alpha = 0.05 / max(len(mine), 1)
    out = []
    for c in mine:
        each = " a language" if languages > 1 and c.pooled else ""
        if not (math.isfinite(c.sd) and c.sd > 0):
            out.append(f"{c.test} ({plan[c.test]} seeds{each}; δ {c.margin:g}; no prior SD: its power is unknown)")
            continue
        detect, null = decide_power(c, plan[c.test], alpha, languages)
        role = "positive control: " if c.control else ""
        out.append(f"{c.test} ({role}{plan[c.test]} seeds{each}; δ {c.margin:g}, prior SD {c.sd:.2f}: power "
                   f"{detect:.2f} to detect {c.effect:g}" + ("" if c.control else f", {null:.2f} to show none "
                                                                                   f"beyond ±{c.margin:g}") + ")")
    return out


def plan_notes(p: IsolossPreset, device: str, workers: int, cpu_peak: float | None) -> tuple[list[str], str]:
    """What ``sameloss plan`` adds for this preset (the recipe's ``plan_notes`` hook), first:
    the claims its design is expected to decide, at what power after Holm (``decided_forecast``),
    and those it leaves out with what each would need; then a scale's measured end-to-end run."""
    from .design import MEASURED_RUNTIMES, PRESETS

    d = p.seed_design
    extra: list[str] = []
    if d.plan:
        languages = max(len(p.replicate), 1)
        expected = decided_forecast(p, languages)
        budget = f"{d.budget_minutes:g}-minute budget on {d.workers} workers" if d.budget_minutes else "design"
        extra.append(f"Claims first: the {budget} is expected to decide {len(expected)} claims "
                     f"(80 % power after Holm over the {len(expected)}, each at its margin; prior paired SDs from "
                     f"{d.prior_source or 'none'}): " + "; ".join(expected) + "."
                     + (" Left out: " + "; ".join(f"{t} ({why})" for t, why in d.left) + "." if d.left else ""))
    extra += [line for scale, line in MEASURED_RUNTIMES.items() if device == "cpu" and p == PRESETS.get(scale)]
    return extra, ""


__all__ = ["choose_design", "decided_forecast", "plan_notes", "planned_costs", "seed_cost", "specs", "wall_of",
           "with_budget"]
