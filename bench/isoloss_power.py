"""Power stated is power had: the isoloss designs' error rates and power after Holm, simulated
through the study's own estimation and decision code (``paired.differences``: the weighted
estimate at the target KL, the verdicts against each claim's margin, Holm, "decided"), and the
statistics' choices checked by Monte Carlo (issues 58 item 6, 59 item 5).

    OMP_NUM_THREADS=1 python bench/isoloss_power.py                  # ~10 CPU-min at the defaults
    OMP_NUM_THREADS=1 python bench/isoloss_power.py --json docs/records/isoloss-power.json

1. The designs (quick, the main job; tiny): each claim on the seeds its design plans, its pairs
   drawn with the prior paired SD the design was planned from (``PRIOR_SDS``), every claim at
   once and Holm over them as the report applies it. Per claim: at a true 0, the rate of a
   detection (type-I) and of a decided "no effect beyond ±δ" (the power of the null verdict); at
   the margin δ in the paper's direction, the rate of a decided detection (power) and of a
   decided "no effect" (TOST's type-I at the margin); a positive control also at its planned
   effect.
2. Pooling across languages (the languages scale's k and seeds): the stratified fixed-effects
   model's type-I error at 0 and TOST's size at the margin, effects equal and unequal across
   languages, spreads unequal; beside it random effects with HKSJ untruncated and truncated at
   max(1, q*).
3. Flatness by assigned arm: the trend test's size (every arm at 0) and power (the strongest arm
   at δ, linear in λ), on the seeds a design plans the arms.
4. The extrapolation rule with a curved KL–accuracy relation: the bias and coverage of the
   estimate at limit 0, the preset's limit and with every pair, forks of 3 and of 5 checkpoints.

A pair's geometry: each fork's checkpoints evenly over a KL range ``--range`` (nats); the
forks' ranges overlap (a random shift) or lie a gap apart (share ``--gap-share``, the gap uniform
up to ``--gap-max``); the accuracy on a line in KL (``--slope`` points per 1e-3 nats) with noise
``--checkpoint-sd`` (points) at each checkpoint; the spread over seeds τ set so that a pair's SD
is the prior SD. Monte-Carlo standard error of a rate near 0.05 over 1,000 studies: 0.007;
over 2,000: 0.005. Not part of the test suite.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from dataclasses import dataclass

import numpy as np

from sameloss.experiments.recipes import isoloss
from sameloss.experiments.recipes.isoloss.across import LANGUAGES_PLAN
from sameloss.experiments.stats import paired
from sameloss.experiments.stats.dose_response import LAMBDA_UNIT, trend
from sameloss.experiments.stats.inference import DETECTED, EQUIVALENT
from sameloss.experiments.stats.pooling import pool_inverse_variance, stratified
from sameloss.experiments.stats.weighted import estimate, fits_of

KEY = "acc"


@dataclass(frozen=True)
class Geometry:
    range: float = 1e-3  # each fork's KL range along its stretch (nats)
    gap_share: float = 0.3  # the share of pairs whose ranges do not overlap
    gap_max: float = 8e-4  # such a gap, uniform up to this (nats)
    slope: float = -0.5  # accuracy (points) per 1e-3 nats of KL along a stretch
    checkpoint_sd: float = 0.2  # points about a fork's line
    curve: float = 0.0  # points per (1e-3 nats)² (part 4)


def _fork(rng, centre, m, g: Geometry, extra, n):
    """``n`` forks' checkpoints: KLs evenly over a range about ``centre``, accuracies (points)."""
    x = centre[:, None] + np.linspace(-g.range / 2, g.range / 2, m)[None, :]
    u = 1000 * x
    y = extra[:, None] + g.slope * u + g.curve * u * u + g.checkpoint_sd * rng.standard_normal((n, m))
    return x, y


def _line_at(x, y, t):
    xm, ym = x.mean(1), y.mean(1)
    sxx = ((x - xm[:, None]) ** 2).sum(1)
    b = ((x - xm[:, None]) * (y - ym[:, None])).sum(1) / sxx
    rss = ((y - ym[:, None] - b[:, None] * (x - xm[:, None])) ** 2).sum(1)
    lev = 1 / x.shape[1] + (t - xm) ** 2 / sxx
    return ym + b * (t - xm), lev, rss


def draw_pairs(rng, n, truth, sd, g: Geometry, m=3, test="x @ late", limit=math.inf):
    """``n`` pairs of one test as ``paired.estimate_pairs`` writes them (the fields the decision
    code reads), the recipe's true difference ``truth`` (points) at every KL (the forks share
    their KL–accuracy curve: with ``g.curve``, a line read outside its range is biased)."""
    gap = np.where(rng.random(n) < g.gap_share, rng.uniform(0, g.gap_max, n), -1.0)
    shift = np.where(gap >= 0, g.range + gap, rng.uniform(-1, 1, n) * g.range * 0.999)
    ref_c, rec_c = np.zeros(n), shift
    lo = np.maximum(rec_c - g.range / 2, ref_c - g.range / 2)
    hi = np.minimum(rec_c + g.range / 2, ref_c + g.range / 2)
    t = (lo + hi) / 2
    tau = math.sqrt(max(sd ** 2 - g.checkpoint_sd ** 2 * 2 * (1 / m + 0.1), 0.0))
    mu = truth + tau * rng.standard_normal(n)
    xr, yr = _fork(rng, ref_c, m, g, np.zeros(n), n)
    xc, yc = _fork(rng, rec_c, m, g, mu, n)
    a_rec, l_rec, r_rec = _line_at(xc, yc, t)
    a_ref, l_ref, r_ref = _line_at(xr, yr, t)
    out_rec = np.maximum(0, np.maximum(xc.min(1) - t, t - xc.max(1)))
    out_ref = np.maximum(0, np.maximum(xr.min(1) - t, t - xr.max(1)))
    far = np.maximum(out_rec, out_ref)
    name, _, point = test.partition(" @ ")
    return [{"test": test, "comparison": name, "point": point, "seed": i, "used": bool(far[i] <= limit),
             "inside": bool(far[i] == 0), "readable": True, "short": "", "max_outside": float(far[i]),
             "d_" + KEY: float(a_rec[i] - a_ref[i]) / 100, "leverage": float(l_rec[i] + l_ref[i]),
             "leverage_mean": 2 / m, "rss_" + KEY: float(r_rec[i] + r_ref[i]) / 1e4, "rss_df": 2 * (m - 2),
             f"recipe_curvature_p_{KEY}": math.nan, f"reference_curvature_p_{KEY}": math.nan,
             "d_trace_fisher": 0.0, "rss_trace_fisher": 0.0, "recipe_trace_fisher": 1.0,
             "reference_trace_fisher": 1.0, "recipe_curvature_p_trace_fisher": math.nan,
             "reference_curvature_p_trace_fisher": math.nan} for i in range(n)]


# ---- 1. the designs -------------------------------------------------------------------------------
def design_power(rng, p, studies: int, g: Geometry) -> list[dict]:
    """Part 1 for one preset: per claim and cell the rates over ``studies`` simulated studies."""
    prior = dict(p.seed_design.prior_sds)
    plan = dict(p.seed_design.plan)
    tests = [(c, pt) for c, pt in p.tests() if f"{c.name} @ {pt}" in p.claims]
    design = paired.Design(p.verdicts.trace_margin, p.verdicts.extrapolation_limit, claims=p.claims)
    cells = {"zero": lambda c: 0.0, "margin": lambda c: c.sign * c.margin,
             "planned": lambda c: c.sign * c.planned_effect}
    counts = {(str(c.key(pt)), cell, what): 0 for c, pt in tests for cell in cells for what in ("detect", "null")}
    for cell, truth in cells.items():
        for _ in range(studies):
            pairs = []
            for c, pt in tests:
                t = str(c.key(pt))
                checkpoints = p.checkpoints_of({f.name: f for f in p.forks}[c.recipe])
                pairs += draw_pairs(rng, plan[t], truth(c), prior[t], g, checkpoints, t, p.verdicts.extrapolation_limit)
            rows = paired.differences(pairs, tests, [(KEY, "primary")], KEY, design, n_boot=0)
            for r in rows:
                if r["quantity"] != KEY:
                    continue
                t = f"{r['comparison']} @ {r['point']}"
                counts[(t, cell, "detect")] += r["decided"] and r["verdict"] == DETECTED
                counts[(t, cell, "null")] += r["decided"] and r["verdict"] == EQUIVALENT
    out = []
    for c, pt in tests:
        t = str(c.key(pt))
        rate = {k[1:]: v / studies for k, v in counts.items() if k[0] == t}
        out.append({"test": t, "seeds": plan[t], "sd": prior[t], "margin": c.margin, "control": c.name in
                    isoloss.CONTROLS, "type1_at_0": rate[("zero", "detect")], "null_power_at_0": rate[("zero", "null")],
                    "power_at_margin": rate[("margin", "detect")], "tost_size_at_margin": rate[("margin", "null")],
                    "power_at_planned": rate[("planned", "detect")], "planned": c.planned_effect})
    return out


# ---- 2. pooling across languages ----------------------------------------------------------------------
def pooling(rng, studies: int, g: Geometry, k: int, seeds: int, margin: float) -> list[dict]:
    out = []
    sds = np.linspace(0.4, 1.0, k)
    for label, spread in (("equal effects", np.zeros(k)), ("unequal effects", np.linspace(-0.3, 0.3, k))):
        hits = {"fe_type1": 0, "fe_tost": 0, "re_type1": 0, "re_tost": 0, "hksj_tost": 0}
        for _ in range(studies):
            for at, typ in ((0.0, "type1"), (margin, "tost")):
                fits, means, ses = [], [], []
                for j in range(k):
                    pairs = draw_pairs(rng, seeds, at + spread[j], float(sds[j]), g)
                    f = fits_of(pairs, KEY, 100.0)
                    fits.append(f)
                    e = estimate(f)
                    means.append(e.mean)
                    ses.append(e.se)
                fe = stratified(fits)
                if typ == "type1":
                    hits["fe_type1"] += fe.p_value <= 0.05
                else:
                    hits["fe_tost"] += fe.tost_p(margin) <= 0.05
                if all(s > 0 for s in ses):
                    re = pool_inverse_variance(means, ses)
                    from sameloss.experiments.stats.weighted import tost_p
                    if typ == "type1":
                        hits["re_type1"] += re.random_p <= 0.05
                    else:
                        hits["re_tost"] += tost_p(re.random, re.random_se, k - 1, margin) <= 0.05
                        untruncated = math.sqrt(re.hksj_q) * re.random_se / math.sqrt(max(1.0, re.hksj_q))
                        hits["hksj_tost"] += tost_p(re.random, untruncated, k - 1, margin) <= 0.05
        out.append({"case": label, "languages": k, "seeds": seeds, **{key: v / studies for key, v in hits.items()}})
    return out


# ---- 3. flatness by assigned arm ----------------------------------------------------------------------
def arms(rng, studies: int, g: Geometry, seeds: int, lambdas: dict[str, float], margin: float, sd: float) -> dict:
    lam = {f: w / LAMBDA_UNIT for f, w in lambdas.items()}
    strongest = max(abs(v) for v in lam.values())
    design = paired.Design(0.05, math.inf)
    out = {}
    for label, per_lambda in (("size (every arm at 0)", 0.0), ("power (strongest arm at δ)", margin / strongest)):
        hits = 0
        for _ in range(studies):
            pts = []
            for fork, v in lam.items():
                for q in draw_pairs(rng, seeds, per_lambda * v, sd, g):
                    pts.append({"seed": q["seed"], "fork": fork, "lam": v, "x": math.nan, "y": 100 * q["d_" + KEY],
                                "comparison": fork, "point": "late"})
            r = trend(pts, margin, design)
            hits += r["verdict"] == DETECTED if per_lambda else (r["p_value"] <= 0.05)
        out[label] = hits / studies
    return out


# ---- 4. the extrapolation rule with a curved relation -------------------------------------------------
def extrapolation(rng, studies: int, g: Geometry, limit: float, seeds: int = 10) -> list[dict]:
    out = []
    curved = Geometry(g.range, 0.6, 2e-3, g.slope, g.checkpoint_sd, curve=0.6)
    for m in (3, 5):
        for name, lim in (("limit 0", 0.0), (f"limit {limit:.0e} nats", limit), ("every pair", math.inf)):
            est, cover = [], 0
            for _ in range(studies):
                pairs = draw_pairs(rng, seeds, 1.0, 0.5, curved, m, limit=lim)
                chosen = [q for q in pairs if (q["inside"] if lim == 0 else q["used"])]
                e = estimate(fits_of(chosen, KEY, 100.0))
                if e.n >= 2 and math.isfinite(e.t_low):
                    est.append(e.mean)
                    cover += e.t_low <= 1.0 <= e.t_high
            out.append({"checkpoints": m, "rule": name, "bias": float(np.mean(est) - 1.0) if est else math.nan,
                        "coverage": cover / max(len(est), 1), "studies_with_an_estimate": len(est)})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--studies", type=int, default=1000, help="studies per cell of part 1 (default 1000)")
    ap.add_argument("--mc", type=int, default=2000, help="studies per cell of parts 2-4 (default 2000)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="also write every table as JSON here (the docs' record)")
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    g = Geometry()
    started, cpu = time.time(), time.process_time()
    record = {"command": "python bench/isoloss_power.py" + (f" --studies {args.studies}" if args.studies != 1000 else ""),
              "geometry": g.__dict__, "designs": {}}
    for scale in ("quick", "tiny"):
        p = isoloss.PRESETS[scale]
        rows = design_power(rng, p, args.studies, g)
        record["designs"][scale] = rows
        print(f"\n1. {scale}: each claim on its planned seeds, Holm over the {len(rows)} claims ({args.studies} studies "
              "a cell); rates of a verdict that survives Holm")
        print(f"{'claim':<22}{'seeds':>6}{'SD':>6}{'δ':>5} | {'type-I @0':>10}{'null @0':>9} | {'power @δ':>9}"
              f"{'TOST size @δ':>13} | {'power @planned':>15}")
        for r in rows:
            planned = f"{r['power_at_planned']:>9.3f} @{r['planned']:g}" if r["control"] else ""
            print(f"{r['test']:<22}{r['seeds']:>6}{r['sd']:>6.2f}{r['margin']:>5g} | {r['type1_at_0']:>10.3f}"
                  f"{r['null_power_at_0']:>9.3f} | {r['power_at_margin']:>9.3f}{r['tost_size_at_margin']:>13.3f} | "
                  f"{planned:>15}")
    k = len(isoloss.PRESETS["languages"].replicate)
    seeds = min(n for _, n in LANGUAGES_PLAN)
    record["pooling"] = pooling(rng, args.mc, g, k, seeds, 1.0) + pooling(rng, args.mc, g, 3, seeds, 1.0)
    print(f"\n2. pooling across languages ({args.mc} studies a cell; margin 1 point; spreads 0.4–1.0 across languages): "
          "type-I at 0 and TOST's size at the margin")
    print(f"{'case':<18}{'k':>3}{'seeds':>6} | {'stratified FE':>14}{'TOST':>7} | {'RE trunc.':>10}{'TOST':>7} | "
          f"{'HKSJ untrunc. TOST':>19}")
    for r in record["pooling"]:
        print(f"{r['case']:<18}{r['languages']:>3}{r['seeds']:>6} | {r['fe_type1']:>14.3f}{r['fe_tost']:>7.3f} | "
              f"{r['re_type1']:>10.3f}{r['re_tost']:>7.3f} | {r['hksj_tost']:>19.3f}")
    q = isoloss.PRESETS["quick"]
    weights = isoloss.flatness_weights(q) or isoloss.flatness_weights(isoloss.PRESETS["tiny"])
    arm_seeds = min((n for t, n in q.seed_design.plan if t.split(" @ ")[0] in weights), default=5)
    prior = dict(q.seed_design.prior_sds)
    arm_sd = max(prior.get(f"{f} @ late", 0.5) for f in weights)
    record["arms"] = {"seeds": arm_seeds, "sd": arm_sd, "arms": list(weights),
                      **arms(rng, args.mc, g, arm_seeds, weights, 1.0, arm_sd)}
    print(f"\n3. flatness by assigned arm ({args.mc} studies; arms {', '.join(weights)} on {arm_seeds} seeds, SD "
          f"{arm_sd:.2f}): the trend test's size (two-sided 0.05) and power (a decided detection)")
    for label in ("size (every arm at 0)", "power (strongest arm at δ)"):
        print(f"   {label:<28}{record['arms'][label]:.3f}")
    record["extrapolation"] = extrapolation(rng, args.mc, g, q.verdicts.extrapolation_limit)
    print(f"\n4. the extrapolation rule with a curved KL–accuracy relation ({args.mc} studies; 10 pairs; 60 % of the "
          "pairs' ranges up to 2e-3 nats apart; true difference 1 point): bias and 95 % coverage")
    for r in record["extrapolation"]:
        print(f"   {r['checkpoints']} checkpoints, {r['rule']:<22} bias {r['bias']:+.3f}   coverage {r['coverage']:.3f}")
    wall, used = time.time() - started, time.process_time() - cpu
    load = os.getloadavg()[0]
    print(f"\n{wall:.0f} s wall, {used:.0f} CPU-s, load {load:.1f}")
    record.update(wall_min=wall / 60, cpu_s=used, load=f"{load:.1f} at the end", date=time.strftime("%Y-%m-%d"))
    if args.json:  # a docs record (scripts/docs_records.py: its required fields; the "power" view renders it)
        import platform
        import subprocess
        from pathlib import Path

        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        record.update(name=Path(args.json).stem, commit=commit,
                      machine=f"{os.cpu_count()} cores, {platform.processor() or platform.machine()}",
                      source="written by the bench itself (--json), from the study's own estimation and decision code")
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
