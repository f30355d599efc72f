"""Error rates, power after Holm and seeds of the isoloss study's designs, simulated through the
study's own estimators and decision code at the tiny pilot's measured KL gaps and paired SDs
(issue 46 item 6; issue 35 item 3).

    OMP_NUM_THREADS=1 python bench/isoloss_allocation.py                 # ~4 CPU-min
    OMP_NUM_THREADS=1 python bench/isoloss_allocation.py --parts 3 --grid    # + ~3 CPU-min: pilots, caps

No study folder is read: the pilot (2026-11-27, 6 seeds, docs/results/tiny.md) is in the
preset (``TINY_PRIOR_SDS``: each comparison's paired SD) and in ``PILOT_GAPS`` below (each
pair's gap between the forks' KL ranges, from the doc's table), the costs are the planner's
(``sameloss plan``'s model, the tiny preset) scaled to the pilot's measured CPU per seed. What the pilot did not publish is an assumption,
printed with the results: each fork's KL range ``R`` along its stretch (``--range``, default
1e-3 nats: "along one stretch at one lr KL moves by about 1e-3 nats", the recipe's docstring)
and the checkpoint noise about a fork's line ``σ_e`` (``--checkpoint-sd``, default 0.2 points:
noreg@late's SD of 0.188 at full overlap bounds it at 0.23). Each comparison's spread over
seeds ``τ`` is then what makes the old estimator's SD at its pilot gaps the measured one.

A simulated pair: the reference's 3 checkpoints evenly over a KL range of width R, the
recipe's over another, a gap drawn from the comparison's pilot gaps (0: the ranges overlap,
shifted at random); each checkpoint's accuracy on a line in KL (slope ``--slope``, the same
for both forks unless said) plus N(0, σ_e²), the recipe's line higher by the pair's true
difference at its target, μ + N(0, τ²). The pairs' statistics are checked once against
``paired.estimate_pairs``. Three parts:

1. fixed n (6, 16 pairs), μ = 0: the type-I error of the old estimator (the paired t test
   over every pair within 1e-3 nats of its range) and of the new one (``weighted.estimate``:
   weights from the KL positions, HKSJ; pairs within 0.5 × the fork's range), per test;
2. the fork × KL model with slopes that differ: type-I forced, after the equal-slopes test at
   the preset's level, and never used, where the ranges touch and where they do not;
3. whole adaptive studies, before (old estimator, plan at α = 0.05, Holm over every primary
   test) and after (new estimator, the preset's claims, plan at α/m, Holm over the claims):
   per test type-I, power after Holm at μ = δ in the paper's direction, seeds, decided, and
   the CPU hours (the adversary at its measured −6.89 points throughout: a positive control).
   ``--grid``: the after design's claims' power and cost for other pilot sizes and caps.

Comparisons are simulated independently (in a study those sharing a fork are correlated; the
rates per comparison do not depend on it). Monte-Carlo standard error of a rate near 0.05 with
2,000 studies: 0.005. Not part of the test suite.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import time

import numpy as np

from sameloss.experiments.stats import paired
from sameloss.experiments.stats.allocation import afford, allocate
from sameloss.experiments.engine.declare import CostPart
from sameloss.experiments.recipes import isoloss
from sameloss.experiments.recipes.isoloss.design import TINY_PRIOR_SDS
from sameloss.experiments.stats.inference import (DETECTED, DETECTED_AGAINST, EQUIVALENT, paired_difference,
    power_verdict)
from sameloss.experiments.stats.weighted import Fits, estimate

# docs/results/tiny.md, "KL ranges of the compared forks": per test 6 pairs — as many zeros as pairs
# whose ranges overlapped, the median and the largest gap as published; * the values between them the
# doc does not give, filled in evenly
PILOT_GAPS = {
    "longer @ late": (0, 0, 5.69e-5, 5.69e-5, 7.5e-5, 9.32e-5),  # * 7.5e-5
    "noreg @ late": (0,) * 6,
    "sam05 @ late": (0, 0, 2.32e-4, 2.32e-4, 2.61e-4, 2.90e-4),  # * 2.61e-4
    "sam05-half @ late": (0,) * 6,
    "adv @ late": (0, 0, 0, 0, 0, 7.51e-5),
    "size @ late": (0,) * 6,
    "noreg @ scratch": (0, 0, 0, 0, 2.17e-4, 4.34e-4),  # * 2.17e-4
    "sam05 @ scratch": (4e-4, 6e-4, 8.35e-4, 8.35e-4, 1.2e-3, 1.64e-3),  # * 4e-4, 6e-4, 1.2e-3
    "sam05-half @ scratch": (0,) * 6,
    "size @ scratch": (0, 0, 0, 2.52e-4, 4.2e-4, 5.87e-4),  # * 4.2e-4
}
FIXED = {"adv @ late": -6.89}  # the pilot's adversary estimate: simulated at it under both hypotheses
OLD_LIMIT = 1e-3  # the old absolute extrapolation limit (nats)


@dataclasses.dataclass(frozen=True)
class Scenario:
    R: float  # each fork's KL range
    sigma: float  # checkpoint noise about a fork's line (points)
    slope: float  # points per nat, both forks (the recipe's + slope_diff)
    slope_diff: float = 0.0
    ratio: float = 1.0  # the recipe's range ÷ the reference's


def draw(rng, gaps, sc: Scenario, shape, mu, tau):
    """Pairs of one test as arrays (``shape``: studies × seeds): each fork's 3 checkpoints'
    KL (center ± R/2) and accuracy, the target, and the fields ``paired.estimate_pairs`` writes."""
    g = rng.choice(np.asarray(gaps, dtype=float), size=shape)
    h_ref, h_rec = sc.R / 2, sc.ratio * sc.R / 2
    shift = np.where(g > 0, h_rec + h_ref + g, rng.uniform(-1, 1, shape) * (h_rec + h_ref) * 0.999)
    lo, hi = np.maximum(shift - h_rec, -h_ref), np.minimum(h_ref, shift + h_rec)
    t = (lo + hi) / 2
    truth = mu + tau * rng.standard_normal(shape)
    steps = np.array([-1.0, 0.0, 1.0])
    out = {}
    for side, c, h, beta, extra in (("reference", np.zeros(shape), h_ref, sc.slope, 0.0),
                                    ("recipe", shift, h_rec, sc.slope + sc.slope_diff, truth)):
        x = c[..., None] + h * steps
        y = (extra[..., None] if side == "recipe" else 0.0) + beta * (x - t[..., None]) \
            + sc.sigma * rng.standard_normal((*shape, 3))
        slope = (y[..., 2] - y[..., 0]) / (2 * h)
        out[side] = {"x": x, "y": y, "mean": y.mean(-1), "slope": slope, "c": c, "h": h,
                     "rss": (y[..., 0] - 2 * y[..., 1] + y[..., 2]) ** 2 / 6,
                     "at": y.mean(-1) + slope * (t - c), "lev": 1 / 3 + (t - c) ** 2 / (2 * h * h),
                     "outside": np.maximum(0, np.maximum(c - h - t, t - c - h))}
    out["t"], out["gap"] = t, g
    return out


def fits(p: dict, s: int, n: int, used: np.ndarray, pilot: int, borrow: float) -> Fits:
    """``Fits`` of study ``s``'s first ``n`` pairs, the ``used`` ones."""
    rec, ref = p["recipe"], p["reference"]
    k = slice(0, n)
    u = used[s, k]

    def a(v):
        return np.broadcast_to(v, p["t"].shape)[s, k][u]

    narrow = min(rec["h"], ref["h"]) * 2
    return Fits(a(rec["at"] - ref["at"]), a(rec["lev"] + ref["lev"]), a(np.full(p["t"].shape, 2 / 3)),
                a(rec["rss"] + ref["rss"]), a(np.full(p["t"].shape, 2.0)), a(rec["mean"] - ref["mean"]),
                a(rec["c"] - ref["c"]), a(np.full(p["t"].shape, 2 * rec["h"] ** 2)),
                a(np.full(p["t"].shape, 2 * ref["h"] ** 2)), a(rec["slope"]), a(ref["slope"]),
                a(p["gap"] <= borrow * narrow), np.arange(n)[u] < pilot)


def used_masks(p: dict, R_rec: float, R_ref: float, limit: float) -> tuple[np.ndarray, np.ndarray]:
    """The old rule (within 1e-3 nats) and the new (within ``limit`` × the fork's own range)."""
    far = np.maximum(p["recipe"]["outside"], p["reference"]["outside"])
    new = (p["recipe"]["outside"] <= limit * R_rec) & (p["reference"]["outside"] <= limit * R_ref)
    return far <= OLD_LIMIT, new


def check_against_estimate_pairs(rng, sc: Scenario) -> None:
    """The bench's closed forms are ``paired.estimate_pairs``' numbers (one draw of 4 pairs)."""
    p = draw(rng, (0, 2e-4, 1e-3), sc, (1, 4), 0.3, 0.1)
    rows = []
    for seed in range(4):
        for side in ("recipe", "reference"):
            for j in range(3):
                rows.append({"run": f"{side}{seed}", "step": j, "seed": seed, "point": "late", "fork": side,
                             "kl": 0.005 + p[side]["x"][0, seed, j], "acc": p[side]["y"][0, seed, j] / 100})
    c = paired.Comparison("x", "recipe", "reference", 1, "")
    got = paired.estimate_pairs(rows, [(c, "late")], ["acc"], paired.Design(0.35, 0.05, 0.5, 3e-4))
    for seed, q in enumerate(got):
        want = p["recipe"]["at"][0, seed] - p["reference"]["at"][0, seed]
        assert abs(100 * q["d_acc"] - want) < 1e-8 and abs(q["leverage"] - p["recipe"]["lev"][0, seed]
                                                           - p["reference"]["lev"][0, seed]) < 1e-6 * q["leverage"]


def leverages(sc: Scenario, rng) -> dict[str, float]:
    """Per test the old estimator's mean leverage at the pilot's gaps (its SD² = τ² + σ_e² × it)."""
    out = {}
    for test, gaps in PILOT_GAPS.items():
        p = draw(rng, gaps, sc, (1, 20000), 0.0, 0.0)
        out[test] = float((p["recipe"]["lev"] + p["reference"]["lev"]).mean())
    return out


def calibrate(sds: dict[str, float], sc: Scenario, lev: dict[str, float]) -> dict[str, float]:
    """Per test the τ that gives the old estimator's SD at the pilot's gaps the measured one
    (0 where σ_e alone explains it)."""
    return {test: math.sqrt(max(sd ** 2 - sc.sigma ** 2 * lev[test], 0.0)) for test, sd in sds.items()}


def part1(rng, p, sds, taus, sc: Scenario, studies: int) -> None:
    print(f"\n1. type-I error at fixed n (μ = 0; {studies} studies; two-sided α = 0.05, unadjusted): old = paired t over "
          f"the pairs within {OLD_LIMIT:g} nats, new = weighted HKSJ over the pairs within "
          f"{p.verdicts.extrapolation_limit:g} × the fork's range (and a common slope where eligible)")
    print("   (used: pairs within the new limit, of n; var new/old: the estimates' variance over studies, new ÷ old — "
          "the seeds the new estimator needs for the old one's precision; share: the new estimate's variance that is "
          "extrapolation)")
    print(f"{'test':<22}{'SD':>6}{'τ':>6} | {'n=6 old':>8}{'new':>7}{'used':>6} | {'n=16 old':>9}{'new':>7}"
          f"{'used':>6}{'var new/old':>12} | {'share':>6}")
    pooled = {n: [0, 0] for n in (6, 16)}
    for test in sds:
        cells = []
        for n in (6, 16):
            q = draw(rng, PILOT_GAPS[test], sc, (studies, n), 0.0, taus[test])
            old_used, new_used = used_masks(q, sc.ratio * sc.R, sc.R, p.verdicts.extrapolation_limit)
            old, new, used, means, shares = 0, 0, 0, [], []
            for s in range(studies):
                d = (q["recipe"]["at"] - q["reference"]["at"])[s][old_used[s]]
                pd = paired_difference(d, n_boot=0)
                e = estimate(fits(q, s, n, new_used, 0, p.verdicts.borrow_gap), p.verdicts.slope_level)
                old, new, used = old + (pd.p_value <= 0.05), new + (e.p_value <= 0.05), used + e.n
                means.append((pd.mean, e.mean))
                shares.append(e.extrapolation)
            ratio = np.nanvar([m[1] for m in means]) / np.nanvar([m[0] for m in means])
            cells.append(f"{old / studies:8.3f}{new / studies:7.3f}{used / studies:6.1f}")
            pooled[n][0] += old
            pooled[n][1] += new
        print(f"{test:<22}{sds[test]:6.3f}{taus[test]:6.3f} | {cells[0]} | {cells[1]:>22}{ratio:12.2f} | "
              f"{np.nanmean(shares):6.2f}")
    total = studies * len(sds)
    print(f"{'all tests':<34} | {pooled[6][0] / total:8.3f}{pooled[6][1] / total:7.3f}{'':6} | "
          f"{pooled[16][0] / total:9.3f}{pooled[16][1] / total:7.3f}   (Monte-Carlo SE {math.sqrt(0.0475 / total):.3f})")


def part2(rng, p, sc: Scenario, studies: int) -> None:
    print(f"\n2. the fork × KL model with slopes that differ (μ = 0, τ = 0.1, recipe's range {2:g}× the reference's; "
          f"type-I at α = 0.05; equal-slopes test at {p.verdicts.slope_level:g}; {studies} studies)")
    print(f"{'geometry':<34}{'Δslope (pts/1e-3 nats)':>24}{'n':>4} | {'forced':>7}{'tested':>8}{'never':>7}"
          f"{'pooled':>8}")
    for label, gaps, borrow in (("ranges touch (gap 0–0.25 R)", (1e-12, 1e-4, 0.25 * sc.R), p.verdicts.borrow_gap),
                                ("gap = R (eligible by fiat)", (sc.R,), 10.0)):
        for diff in (0.0, 0.2, 0.5, 2.0):
            for n in (6, 16):
                s2 = dataclasses.replace(sc, slope_diff=diff * 1000, ratio=2.0)
                q = draw(rng, gaps, s2, (studies, n), 0.0, 0.1)
                every = np.ones((studies, n), dtype=bool)
                hits = {"forced": 0, "tested": 0, "never": 0}
                pooled = 0
                for s in range(studies):
                    f = fits(q, s, n, every, 0, borrow)
                    for key, level in (("forced", 0.0), ("tested", p.verdicts.slope_level), ("never", 1.01)):
                        e = estimate(f, level)
                        hits[key] += bool(e.p_value <= 0.05)
                        pooled += key == "tested" and e.model != "a line per fork"
                print(f"{label:<34}{diff:>24g}{n:>4} | {hits['forced'] / studies:7.3f}{hits['tested'] / studies:8.3f}"
                      f"{hits['never'] / studies:7.3f}{pooled / studies:8.2f}")


# the tiny pilot's measured CPU seconds per seed, every fork but the flatness forks (mean of 6 seeds,
# 1,080-1,410: docs/results/tiny.md); the planner's costs are scaled to it: its CPU peak is measured
# when it runs, and on this shared machine that moved the costs by 30 % with the load
PILOT_SEED_CPU = 1300.0


def costs_of(p) -> dict[str, float]:
    """CPU seconds per ``point|fork|stage`` of one seed: the planner's cost model (``sameloss
    plan``), scaled so that a seed without the flatness forks costs ``PILOT_SEED_CPU``."""
    from sameloss.experiments.engine.plan import dry_plan, estimate as plan_estimate
    from sameloss.experiments.recipes.isoloss.allocation import _cost_key

    one = dataclasses.replace(p, seeds=p.seeds[:2], replicate=(),
                              seed_design=dataclasses.replace(p.seed_design, pilot_seeds=0, budget_minutes=None))
    e = plan_estimate(dry_plan("isoloss", "tiny", preset=one), "cpu", 1, None, memory=False)
    costs: dict[str, float] = {}
    for item in (*e.runs, *e.measures):
        key = _cost_key(item["run"], "train" if "steps" in item else "measure")
        costs[key] = costs.get(key, 0.0) + item["seconds"] / len(one.seeds)
    flat = set(isoloss.flatness_forks(p))
    scale = PILOT_SEED_CPU / sum(v for k, v in costs.items() if k.split("|")[1] not in flat)
    return {k: v * scale for k, v in costs.items()}


def seed_cost_of(p, costs: dict[str, float]):
    """One seed's CPU seconds when it runs the forks of ``tests`` (a base-recipe fork's run and
    measures are the late ones, paid once)."""
    def seed_cost(tests: list[str]) -> float:
        forks = isoloss.forks_of(p, tests)
        runs = {(p.point_name(p.fork_point_of(f, k)), f.name) for k in p.fork_points for f in p.forks_at(k)
                if (p.point_name(k), f.name) in forks}
        return costs.get(CostPart("", "base", "train"), 0.0) + costs.get(CostPart("", "base", "measure"), 0.0) + sum(
            costs.get(CostPart(pt, f, stage), 0.0) for pt, f in runs for stage in ("train", "measure"))
    return seed_cost


# the design before issue 46 (tiny's pilot and cap then), simulated as "before"
BEFORE = {"pilot_seeds": 6, "seeds": tuple(range(48))}


def with_pilot(p, pilot: int, seeds: tuple[int, ...]):
    """The preset with a pilot of ``pilot`` seeds and the seeds ``seeds`` (at most)."""
    return dataclasses.replace(p, seeds=seeds, seed_design=dataclasses.replace(p.seed_design, pilot_seeds=pilot))


def _study(q: dict, masks: dict, s: int, p, design: str, tests: list[str], budget) -> dict:
    """One simulated study of one design: its pilot, its plan, its verdicts after Holm."""
    k, cap, target = p.seed_design.pilot_seeds, len(p.seeds), p.seed_design.mde_target
    new = design == "after"
    pilot_sd = {}
    for t in tests:
        if new:
            pilot_sd[t] = estimate(fits(q[t], s, k, masks[t][1], k, p.verdicts.borrow_gap), p.verdicts.slope_level).sd
        else:
            d = (q[t]["recipe"]["at"] - q[t]["reference"]["at"])[s, :k][masks[t][0][s, :k]]
            pilot_sd[t] = float(np.std(d, ddof=1)) if d.size >= 2 else math.nan
    family = tuple(t for t in p.claims if t in tests) if new else tuple(tests)
    alloc = allocate(pilot_sd, k, cap, target, p.seed_design.exempt, family=family,
                     alpha=0.05 if new else 0.05 * len(family))
    if budget is not None:
        alloc = afford(alloc, *budget)
    rows = []
    for t in tests:
        n = alloc.planned[t]
        if new:
            e = estimate(fits(q[t], s, n, masks[t][1], k, p.verdicts.borrow_gap), p.verdicts.slope_level, stein=True)
        else:
            d = (q[t]["recipe"]["at"] - q[t]["reference"]["at"])[s, :n][masks[t][0][s, :n]]
            first = (q[t]["recipe"]["at"] - q[t]["reference"]["at"])[s, :k][masks[t][0][s, :k]]
            e = paired_difference(d, n_boot=0, pilot=first)
        delta = p.verdicts.equivalence_margin
        verdict = power_verdict(e, q[t]["sign"], delta) if e.n >= 2 else "no interval"
        rows.append({"test": t, "n": n, "p": e.p_value, "tost": e.tost_p(delta), "verdict": verdict,
                     "family": "claims" if t in family else "other"})
    for fam in ("claims", "other"):
        mine = [r for r in rows if r["family"] == fam]
        for r, hp, ht in zip(mine, paired.holm_counted([r["p"] for r in mine]),
                             paired.holm_counted([r["tost"] for r in mine])):
            r["after"] = paired.after_holm(r["verdict"], hp, ht)
    return {"rows": {r["test"]: r for r in rows}, "alloc": alloc}


def simulate(rng, p, sds, taus, sc, costs, studies, workers, designs=("before", "after"), hypotheses=("null", "alt")):
    """Whole studies: per design and hypothesis, per test the counts and the mean cost."""
    tests = list(sds)
    signs = {f"{c.name} @ {pt}": c.sign for c, pt in p.tests()}
    seed_cost = seed_cost_of(p, costs)
    full = seed_cost(tests)
    presets = {d: with_pilot(p, BEFORE["pilot_seeds"], BEFORE["seeds"]) if d == "before" else p for d in designs}
    tally = {}
    for h in hypotheses:
        q, masks = {}, {}
        for t in tests:
            mu = FIXED.get(t, signs[t] * p.seed_design.mde_target if h == "alt" else 0.0)
            q[t] = draw(rng, PILOT_GAPS[t], sc, (studies, max(len(x.seeds) for x in presets.values())), mu, taus[t])
            q[t]["sign"] = signs[t]
            masks[t] = used_masks(q[t], sc.ratio * sc.R, sc.R, p.verdicts.extrapolation_limit)
        for design, pd in presets.items():
            d = pd.seed_design
            budget = ((seed_cost, d.pilot_seeds * full / workers, 60 * d.budget_minutes, workers)
                      if d.budget_minutes else None)
            counts = {t: {"raw": 0, "holm": 0, "right": 0, "decided": 0, "seeds": 0} for t in tests}
            hours = 0.0
            for s in range(studies):
                out = _study(q, masks, s, pd, design, tests, budget)
                for t, r in out["rows"].items():
                    c = counts[t]
                    c["raw"] += r["verdict"] in (DETECTED, DETECTED_AGAINST)
                    c["holm"] += r["verdict"] in (DETECTED, DETECTED_AGAINST) and r["after"] == "survives"
                    c["right"] += r["verdict"] == DETECTED and r["after"] == "survives"
                    c["decided"] += r["verdict"] in (DETECTED, DETECTED_AGAINST, EQUIVALENT) and r["after"] == "survives"
                    c["seeds"] += r["n"]
                alloc = out["alloc"]
                hours += sum(full if i < alloc.pilot else seed_cost(alloc.active(i)) for i in range(alloc.seeds)) / 3600
            tally[(design, h)] = (counts, hours / studies)
    return tally


def part3(rng, p, sds, taus, sc, costs, studies, workers) -> None:
    t0 = time.process_time()
    tally = simulate(rng, p, sds, taus, sc, costs, studies, workers)
    claims = [t for t in p.claims if t in sds]
    d = p.seed_design
    print(f"\n3. whole adaptive studies ({studies} per hypothesis, {time.process_time() - t0:.0f} CPU s): before pilot "
          f"{BEFORE['pilot_seeds']}, at most {len(BEFORE['seeds'])} seeds; after pilot {d.pilot_seeds}, at most "
          f"{len(p.seeds)} seeds; MDE target {d.mde_target:g} points, budget "
          f"{d.budget_minutes} min on {workers} workers (the planner's costs); the alternative: δ = {d.mde_target:g} in "
          f"the paper's direction for every test (adv at {FIXED['adv @ late']:g} throughout). before: the old estimator, "
          "seeds planned at α = 0.05, Holm over every primary test; after: the weighted estimator, seeds planned at "
          f"α/{len(claims)} for the claims ({', '.join(claims)}), Holm over the claims (the rest: their own family)")
    print(f"{'test':<22}{'':>6} | {'type-I raw':>10}{'':>6} | {'type-I Holm':>11}{'':>6} | {'power Holm':>10}{'':>6} | "
          f"{'seeds':>6}{'':>6} | {'seeds/decided':>13}{'':>6}")
    print(f"{'':<22}{'claim':>6} | {'before':>10}{'after':>6} | {'before':>11}{'after':>6} | {'before':>10}{'after':>6} | "
          f"{'before':>6}{'after':>6} | {'before':>13}{'after':>6}")
    for t in sds:
        b0, a0 = tally[("before", "null")][0][t], tally[("after", "null")][0][t]
        b1, a1 = tally[("before", "alt")][0][t], tally[("after", "alt")][0][t]
        seeds = [(x0["seeds"] + x1["seeds"]) / (2 * studies) for x0, x1 in ((b0, b1), (a0, a1))]
        per = [sd / (x1["decided"] / studies) if x1["decided"] else math.inf for sd, x1 in zip(seeds, (b1, a1))]
        print(f"{t:<22}{'yes' if t in claims else '':>6} | {b0['raw'] / studies:10.3f}{a0['raw'] / studies:6.3f} | "
              f"{b0['holm'] / studies:11.3f}{a0['holm'] / studies:6.3f} | {b1['right'] / studies:10.3f}"
              f"{a1['right'] / studies:6.3f} | {seeds[0]:6.1f}{seeds[1]:6.1f} | {per[0]:13.1f}{per[1]:6.1f}")
    for design in ("before", "after"):
        hours = (tally[(design, "null")][1] + tally[(design, "alt")][1]) / 2
        power = np.mean([tally[(design, "alt")][0][t]["right"] / studies for t in claims if t not in FIXED])
        print(f"{design:>7}: {hours:.2f} CPU-hours per study ({hours * 60 / workers:.0f} min on {workers} workers); "
              f"the claims' mean power after Holm (adv left out) {power:.3f}")


def grid(rng, p, sds, taus, sc, costs, studies, workers) -> None:
    """The after design's claims' power after Holm and cost at other pilots and caps (the
    alternative only), beside the even design of the same budget's seeds."""
    claims = [t for t in p.claims if t in sds and t not in FIXED]
    print(f"\n   pilot and cap (after design, alternative only, {studies} studies each; budget "
          f"{p.seed_design.budget_minutes} min):")
    print(f"   {'pilot':>5}{'cap':>5} | " + "".join(f"{t.split(' @ ')[0][:10]:>11}" for t in claims)
          + f" | {'mean':>6}{'seeds':>7}{'hours':>7}")
    for pilot in (6, 8, 10, 12):
        for cap in (32, 48):
            q = with_pilot(p, pilot, tuple(range(cap)))
            tally = simulate(rng, q, sds, taus, sc, costs, studies, workers, designs=("after",), hypotheses=("alt",))
            counts, hours = tally[("after", "alt")]
            powers = [counts[t]["right"] / studies for t in claims]
            seeds = np.mean([counts[t]["seeds"] / studies for t in claims])
            print(f"   {pilot:>5}{cap:>5} | " + "".join(f"{x:11.3f}" for x in powers)
                  + f" | {np.mean(powers):6.3f}{seeds:7.1f}{hours:7.2f}")


def part4(p, sds, costs, workers) -> None:
    """``allocation.plan_claims`` on the priors: what a budget's seeds decide (issue 52's rule)."""
    from sameloss.experiments.stats.allocation import plan_claims

    seed_cost = seed_cost_of(p, costs)
    claims = {t: sds[t] for t in p.claims if t in sds}
    targets = {t: abs(FIXED.get(t, p.seed_design.mde_target)) for t in claims}
    print(f"\n4. allocation.plan_claims on the prior SDs: the claims a budget decides (target "
          f"{p.seed_design.mde_target:g} points, "
          f"adv at its {FIXED['adv @ late']:g}; 80 % power after Holm over the claims kept; {workers} workers)")
    for minutes, pilot in ((25, 0), (60, 0), (180, p.seed_design.pilot_seeds)):
        plan = plan_claims(claims, seed_cost, 60 * minutes * workers, targets, pilot=pilot, cap=len(p.seeds))
        kept = ", ".join(f"{t} {n} seeds (power {plan.power[t]:.2f})" for t, n in plan.seeds.items())
        gone = ", ".join(f"{t} ({n or f'> {len(p.seeds)}'} seeds)" for t, n in plan.left_out.items())
        print(f"   {minutes:>4} min, pilot {pilot}: α/m = {1 - plan.level:.4f}; {kept}; left out: {gone or 'none'}; "
              f"{plan.cost / 60 / workers:.0f} min")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--studies", type=int, default=800, help="simulated studies per hypothesis (part 3)")
    parser.add_argument("--fixed-studies", type=int, default=1000, help="studies per cell of parts 1 and 2")
    parser.add_argument("--range", type=float, default=1e-3, help="each fork's KL range along its stretch (nats)")
    parser.add_argument("--checkpoint-sd", type=float, default=None,
                        help="checkpoint noise about a line, points (default: 0.9 × the largest every pilot SD allows)")
    parser.add_argument("--slope", type=float, default=-400.0, help="accuracy on KL, points per nat")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--grid", action="store_true", help="part 3's after design at other pilots and caps")
    parser.add_argument("--parts", default="1234")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    p = isoloss.PRESETS["tiny"]
    sds = dict(TINY_PRIOR_SDS)
    rng = np.random.default_rng(args.seed)
    lev = leverages(Scenario(args.range, 0.0, args.slope), rng)
    largest = min(sd / math.sqrt(lev[t]) for t, sd in sds.items())  # σ_e that explains some SD alone
    sc = Scenario(args.range, 0.9 * largest if args.checkpoint_sd is None else args.checkpoint_sd, args.slope)
    check_against_estimate_pairs(rng, sc)
    taus = calibrate(sds, sc, lev)
    start = time.process_time()
    print(f"load {os.getloadavg()[0]:.2f}; assumed: each fork's KL range R = {sc.R:g} nats, checkpoint noise σ_e = "
          f"{sc.sigma:.3g} points (the pilot's SDs allow at most {largest:.3g}), slope {sc.slope:g} points/nat; τ per "
          "test from the pilot's SD at its gaps (below)")
    if "1" in args.parts:
        part1(rng, p, sds, taus, sc, args.fixed_studies)
    if "2" in args.parts:
        part2(rng, p, sc, args.fixed_studies)
    if "3" in args.parts:
        costs = costs_of(p)
        part3(rng, p, sds, taus, sc, costs, args.studies, args.workers)
        if args.grid:
            grid(rng, p, sds, taus, sc, costs, max(args.studies // 4, 100), args.workers)
    if "4" in args.parts:
        part4(p, sds, costs_of(p), args.workers)
    print(f"({time.process_time() - start:.0f} CPU s)")


if __name__ == "__main__":
    main()
