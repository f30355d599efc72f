"""Error rates and cost of the isoloss study's designs, by simulating whole studies through the
study's own decision code (issue 35 item 3).

    OMP_NUM_THREADS=1 python bench/isoloss_allocation.py runs/isoloss-tiny-even      # ~2 CPU-min
    OMP_NUM_THREADS=1 python bench/isoloss_allocation.py FOLDER --studies 4000 --budget 90 --workers 2

FOLDER is a finished ``reproduce isoloss`` study whose seeds ran every fork (the even
design): its ``pairs.csv`` gives each comparison's measured paired SD of the primary
accuracy at the target KL (over every used pair) and its share of pairs beyond the
extrapolation limit; its ``cost.csv`` the measured CPU seconds per fork point, fork and stage.

Each simulated study draws, per comparison, one paired difference per seed from a normal
with that SD and a true mean of 0 (the null) or ± δ = the preset's MDE target in the paper's
direction (the alternative), a pair beyond the limit with the measured probability, and runs
both designs on the same draws:

* even: the preset's first ``--even-seeds`` seeds run every fork;
* adaptive: the first ``pilot_seeds`` seeds run every fork, ``allocation.allocate`` plans each
  comparison's seeds from the pilot's SDs (``afford`` cuts them to ``--budget`` minutes with the
  measured costs), each comparison's test uses its planned seeds (Stein's two-stage test: its
  spread from the pilot's seeds).

Every verdict comes from ``paired.differences`` (the t interval, TOST against the preset's δ,
Holm within the primary family): type-I error = the share of studies whose test detects an
effect (either way) under the null; power = the share detecting it in the paper's direction
under the alternative; decided = detected or no effect beyond ±δ. Comparisons are simulated
independently (in a real study those sharing a fork are correlated; the rates per comparison
do not depend on it). Monte-Carlo standard error of a rate near 0.05 with 2,000 studies: 0.005.
Not part of the test suite.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import math
import os
import time
from pathlib import Path

import numpy as np

from sameloss.experiments import paired
from sameloss.experiments.allocation import afford, allocate
from sameloss.experiments.recipes import isoloss
from sameloss.experiments.stats import DETECTED, DETECTED_AGAINST, EQUIVALENT


def read(path: Path) -> list[dict]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def measured(folder: Path, p) -> tuple[dict[str, float], dict[str, float], dict[str, float]]:
    """Per test the paired SD and the share of pairs beyond the limit; the mean CPU seconds per
    ``point|fork|stage`` over the seeds."""
    pairs = read(folder / "pairs.csv")
    sds, beyond = {}, {}
    for c, pt in p.tests():
        mine = [q for q in pairs if q["comparison"] == c.name and q["point"] == pt]
        d = [100 * float(q[f"d_{p.primary_key}"]) for q in mine if q["used"] == "True"]
        test = f"{c.name} @ {pt}"
        sds[test] = float(np.std(d, ddof=1)) if len(d) >= 2 else math.nan
        beyond[test] = 1 - len(d) / len(mine) if mine else 1.0
    sums: dict[str, list[float]] = {}
    for r in read(folder / "cost.csv"):
        sums.setdefault(f"{r['point']}|{r['fork']}|{r['stage']}", []).append(float(r["cpu_seconds"]))
    return sds, beyond, {k: float(np.mean(v)) for k, v in sums.items()}


def seed_cost_of(p, costs: dict[str, float]):
    def seed_cost(tests: list[str]) -> float:
        forks = isoloss.forks_of(p, tests)
        runs = {(p.point_name(p.fork_point_of(f, k)), f.name) for k in p.fork_points for f in p.forks_at(k)
                if (p.point_name(k), f.name) in forks}
        return costs.get("|base|train+gate", 0.0) + sum(costs.get(f"{pt}|{f}|train", 0.0) for pt, f in runs) + \
            sum(costs.get(f"{pt}|{f}|measure", 0.0) for pt, f in forks)
    return seed_cost


def verdicts(p, tests, draws: dict[str, np.ndarray], used: dict[str, np.ndarray], n: dict[str, int],
             pilot: tuple[int, ...] = ()) -> dict:
    """``paired.differences`` on the first ``n[test]`` seeds' draws of every test (the study's
    own decision code: verdicts, TOST, Holm; ``pilot``: an adaptive study's pilot seeds, whose
    spread its tests read — Stein's test)."""
    pairs = []
    for c, pt in p.tests():
        t = f"{c.name} @ {pt}"
        for s in range(n[t]):
            pairs.append({"comparison": c.name, "point": pt, "seed": s, "used": bool(used[t][s]),
                          "within_tolerance": True,
                          f"d_{p.primary_key}": draws[t][s] / 100, "d_trace_fisher": 0.0,
                          "reference_trace_fisher": 1.0, "recipe_outside": 0.0, "reference_outside": 0.0})
    out = paired.differences(pairs, p.tests(), [(p.primary_key, "primary")], p.primary_key,
                             p.design(pilot=pilot), n_boot=0)
    return {f"{r['comparison']} @ {r['point']}": r for r in out if r["family"] == "primary"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, help="a finished isoloss study whose seeds ran every fork")
    parser.add_argument("--scale", default="tiny", help="the preset whose design is simulated (default tiny)")
    parser.add_argument("--studies", type=int, default=2000, help="simulated studies per hypothesis")
    parser.add_argument("--even-seeds", type=int, default=16, help="the even design's seeds (default 16)")
    parser.add_argument("--budget", type=float, default=None, help="minutes (default: the preset's budget)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--pilot", type=int, default=None, help="the pilot's seeds (default: the preset's)")
    parser.add_argument("--cap", type=int, default=None, help="the most seeds (default: the preset's)")
    parser.add_argument("--no-budget", action="store_true", help="no budget: every comparison gets its planned seeds")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    p = isoloss.PRESETS[args.scale]
    if args.cap is not None:
        p = dataclasses.replace(p, seeds=tuple(range(args.cap)))
    if args.pilot is not None:
        p = dataclasses.replace(p, pilot_seeds=args.pilot)
    if args.budget is not None or args.no_budget:
        p = dataclasses.replace(p, budget_minutes=None if args.no_budget else args.budget)
    sds, beyond, costs = measured(args.folder, p)
    seed_cost = seed_cost_of(p, costs)
    tests = [f"{c.name} @ {pt}" for c, pt in p.tests()]
    signs = {f"{c.name} @ {pt}": c.sign for c, pt in p.tests()}
    full = seed_cost(tests)
    rng = np.random.default_rng(args.seed)
    cap = len(p.seeds)
    tally = {(h, d): {t: {"detect": 0, "right": 0, "decided": 0, "seeds": 0} for t in tests}
             for h in ("null", "alt") for d in ("even", "adaptive")}
    cost = {(h, d): 0.0 for h in ("null", "alt") for d in ("even", "adaptive")}
    start = time.process_time()
    for h in ("null", "alt"):
        for _ in range(args.studies):
            draws = {t: rng.normal((p.mde_target * signs[t]) if h == "alt" else 0.0,
                                   sds[t] if math.isfinite(sds[t]) else 1.0, cap) for t in tests}
            used = {t: rng.random(cap) >= beyond[t] for t in tests}
            even = {t: args.even_seeds for t in tests}
            pilot = verdicts(p, tests, draws, used, {t: p.pilot_seeds for t in tests})
            alloc = allocate({t: pilot[t]["sd"] for t in tests}, p.pilot_seeds, cap, p.mde_target, p.exempt)
            if p.budget_minutes:
                alloc = afford(alloc, seed_cost, p.pilot_seeds * full / args.workers, 60 * p.budget_minutes,
                               args.workers)
            for design, n, first in (("even", even, ()), ("adaptive", alloc.planned, tuple(range(p.pilot_seeds)))):
                out = verdicts(p, tests, draws, used, n, first)
                for t in tests:
                    v, row = out[t]["verdict"], tally[(h, design)][t]
                    row["detect"] += v in (DETECTED, DETECTED_AGAINST)
                    row["right"] += v == DETECTED
                    row["decided"] += v in (DETECTED, DETECTED_AGAINST, EQUIVALENT)
                    row["seeds"] += n[t]
                if design == "even":
                    cost[(h, design)] += args.even_seeds * full
                else:
                    cost[(h, design)] += sum(seed_cost(alloc.active(i)) if i >= p.pilot_seeds else full
                                             for i in range(alloc.seeds))
    R = args.studies
    print(f"load {os.getloadavg()[0]:.2f}; {R} studies per hypothesis, {time.process_time() - start:.0f} CPU s; "
          f"scale {args.scale}: even {args.even_seeds} seeds; adaptive: pilot {p.pilot_seeds}, at most {cap} seeds, "
          f"MDE target {p.mde_target:g}, budget {p.budget_minutes} min on {args.workers} workers; δ under the "
          f"alternative = {p.mde_target:g} points in the paper's direction; measured SDs and costs: {args.folder}")
    print(f"{'comparison @ point':<22}{'SD':>6}{'beyond':>7} | {'type-I even':>11}{'adaptive':>9} | "
          f"{'power even':>10}{'adaptive':>9} | {'decided|H0 even':>15}{'adaptive':>9} | {'seeds even':>10}"
          f"{'adaptive':>9}")
    for t in tests:
        e0, a0 = tally[("null", "even")][t], tally[("null", "adaptive")][t]
        e1, a1 = tally[("alt", "even")][t], tally[("alt", "adaptive")][t]
        print(f"{t:<22}{sds[t]:6.2f}{beyond[t]:7.2f} | {e0['detect'] / R:11.3f}{a0['detect'] / R:9.3f} | "
              f"{e1['right'] / R:10.3f}{a1['right'] / R:9.3f} | {e0['decided'] / R:15.3f}{a0['decided'] / R:9.3f} | "
              f"{e0['seeds'] / R:10.1f}{(a0['seeds'] + a1['seeds']) / (2 * R):9.1f}")
    for design in ("even", "adaptive"):
        hours = (cost[("null", design)] + cost[("alt", design)]) / (2 * R) / 3600
        decided = sum(tally[(h, design)][t]["decided"] for h in ("null", "alt") for t in tests) / (2 * R)
        print(f"{design:>8}: {hours:.2f} CPU-hours per study (measured cost per fork), {decided:.1f} of {len(tests)} "
              f"comparisons decided on average, {decided / hours:.2f} decisions per CPU-hour, "
              f"{hours * 60 / args.workers:.0f} min wall on {args.workers} workers")


if __name__ == "__main__":
    main()
