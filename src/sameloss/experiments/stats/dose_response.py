"""Flatness as the treatment (``isoloss``'s trace-penalty forks): the paired primary
difference at the target KL per unit of relative trace change, within seeds.

One line through the origin pooled over every seed's forks — ``b = Σxy / Σx²`` (the
reference is every pair's origin: no trace change, no difference) — with a delete-one-seed
jackknife interval (t on seeds − 1 degrees of freedom): a seed that lost a fork, or kept one
that barely moved the trace, weighs by its Σx² instead of contributing its own slope (a
seed's slope through one fork at x = 0.02 has an SD of 25 points per unit). The flattening
(x < 0) and the sharpening (x > 0) forks' slopes are shown apart: one line through both
assumes a symmetric response. Pairs whose relative trace change is under the preset's floor
(``Design.dose_floor``), or whose reference trace is 0, are named and left out."""

from __future__ import annotations

import math

import numpy as np
from scipy.stats import t as student_t

from ..reports.claims import fmt
from .paired import Comparison, Design, UNINFORMATIVE, after_holm, holm_counted, used_pairs
from ..reports.document import Claim, Column, Section, Table
from .inference import Interval, interval_power, t_quantile

# the dose-response slope's equivalence margin: the accuracy margin δ over this relative
# trace change (the smallest change the flatness forks are calibrated to make)
DOSE_TRACE_CHANGE = 0.2


def dose_points(pairs: list[dict], comparisons: list[Comparison], point: str, key: str, floor: float = 0.0
                ) -> tuple[list[dict], list[str]]:
    """One row per used pair of the flatness comparisons (``comparisons``: each a λ fork
    against the same reference) at fork point ``point``: its seed, fork, relative trace change
    at the target (``x``: recipe ÷ reference − 1, both at the pair's target KL) and paired
    primary difference (``y``, points); and the pairs left out, named (a reference trace of
    0, or ``|x|`` under ``floor``)."""
    out, left = [], []
    for c in comparisons:
        for p in used_pairs(pairs, c, point):
            ref = p["reference_trace_fisher"]
            x = p["recipe_trace_fisher"] / ref - 1 if ref else math.nan
            where = f"{c.name} @ {point}, seed {p['seed']}"
            if not math.isfinite(x):
                left.append(f"{where}: the reference's trace is {ref:g} (no relative change)")
            elif abs(x) < floor:
                left.append(f"{where}: trace change {x:+.1%}, under the floor ±{floor:.0%}")
            else:
                out.append({"seed": int(p["seed"]), "fork": c.recipe, "comparison": c.name, "point": point,
                            "x": x, "y": 100.0 * p[f"d_{key}"]})
    return out, left


def pooled_slope(points: list[dict]) -> dict:
    """``Σxy / Σx²`` over ``points`` with its delete-one-seed jackknife standard error
    (``(g − 1)/g · Σ (b₋ₛ − b̄₋)²`` over the g seeds; t on g − 1 degrees of freedom)."""
    x = np.array([r["x"] for r in points], dtype=float)
    y = np.array([r["y"] for r in points], dtype=float)
    seeds = np.array([r["seed"] for r in points])
    groups = sorted(set(seeds.tolist()))
    g = len(groups)
    slope = float((x * y).sum() / (x * x).sum()) if float((x * x).sum()) > 0 else math.nan
    if g < 2:
        return {"slope": slope, "se": math.nan, "df": 0, "n_seeds": g, "n_pairs": len(points)}
    loo = np.array([float((x * y)[seeds != s].sum() / (x * x)[seeds != s].sum()) for s in groups])
    se = math.sqrt((g - 1) / g * float(((loo - loo.mean()) ** 2).sum()))
    return {"slope": slope, "se": se, "df": g - 1, "n_seeds": g, "n_pairs": len(points)}


def _test(fit: dict, margin: float, design: Design) -> dict:
    """The t interval, p, TOST p, MDE and verdict of a pooled slope (paper's direction: −)."""
    nan = math.nan
    out = {"low": nan, "high": nan, "p_value": nan, "tost_p": nan, "mde": nan,
           "verdict": f"no interval: {fit['n_seeds']} seed(s)"}
    if fit["df"] < 1 or not fit["se"] > 0:
        if not design.headroom:
            out["verdict"] = UNINFORMATIVE
        return out
    b, se, df = fit["slope"], fit["se"], fit["df"]
    half = t_quantile(0.975, df) * se
    verdict, mde = interval_power(Interval(b, b - half, b + half), df, -1, margin=margin)
    out.update(low=b - half, high=b + half, p_value=float(2 * student_t.sf(abs(b) / se, df)), mde=mde,
               tost_p=float(max(student_t.sf((b + margin) / se, df), student_t.cdf((b - margin) / se, df))),
               verdict=verdict if design.headroom else UNINFORMATIVE)
    return out


def dose_response(section: Section | None, pairs: list[dict], comparisons: list[Comparison],
                  points: list[str], key: str, design: Design) -> list[dict]:
    """The causal counterpart of Fig. 1's slope: per fork point the pooled slope through the
    origin of the paired primary difference (points) on the relative trace change over every
    seed's flatness forks (``pooled_slope``: jackknife over seeds), Holm over the fork points;
    beside it the flattening and the sharpening forks' slopes apart. The paper's direction
    is negative (a smaller trace, a higher accuracy); the equivalence margin is
    ``design.margin / DOSE_TRACE_CHANGE`` (δ points over a 20 % change), fixed before the
    data. Adds the table (``dose_response.csv``), the per-pair points (``dose_points.csv``,
    the figure's) and the pairs left out to ``section`` when given."""
    out, every, left = [], [], []
    margin = design.margin / DOSE_TRACE_CHANGE
    for point in points:
        pts, gone = dose_points(pairs, comparisons, point, key, design.dose_floor)
        every += pts
        left += gone
        fit = pooled_slope(pts)
        row = {"test": f"dose-response @ {point}", "point": point, "n_seeds": fit["n_seeds"],
               "n_pairs": fit["n_pairs"], "n_left_out": len(gone),
               "forks": ", ".join(dict.fromkeys(r["fork"] for r in pts)),
               "min_change": min((r["x"] for r in pts), default=math.nan),
               "max_change": max((r["x"] for r in pts), default=math.nan), "slope": fit["slope"], "sd": fit["se"],
               "margin": margin}
        tested = _test(fit, margin, design)
        row.update({"t_low": tested["low"], "t_high": tested["high"], **{k: tested[k] for k in (
            "p_value", "tost_p", "mde", "verdict")}})
        for side, mine in (("flattening", [r for r in pts if r["x"] < 0]),
                           ("sharpening", [r for r in pts if r["x"] > 0])):
            part = pooled_slope(mine)
            t = _test(part, margin, design)
            row.update({f"{side}_slope": part["slope"], f"{side}_low": t["low"], f"{side}_high": t["high"],
                        f"{side}_pairs": part["n_pairs"]})
        out.append(row)
    for r, q, qe in zip(out, holm_counted([r["p_value"] for r in out]), holm_counted([r["tost_p"] for r in out])):
        r["holm_p"], r["tost_holm_p"] = q, qe
        r["after_holm"] = after_holm(r["verdict"], q, qe)
    if section is not None and out:
        _tables(section, out, every, left, margin, design)
    return out


def _tables(section: Section, out: list[dict], every: list[dict], left: list[str], margin: float,
            design: Design) -> None:
    section.files["dose_response.csv"] = out
    section.files["dose_points.csv"] = every
    section.tables.append(Table(
        "Dose-response: the paired primary difference at the target KL (points) per unit of relative trace "
        "change (fork ÷ reference − 1, both at the pair's target), one line through the origin pooled over every "
        "seed's flatness forks (Σxy/Σx²), its 95% t interval from a delete-one-seed jackknife; beside it the "
        "flattening (trace change < 0) and sharpening (> 0) forks' slopes apart; the paper's direction is "
        f"negative; pairs whose trace moved less than ±{design.dose_floor:.0%} are left out (named below); "
        f"equivalence margin ±{fmt(margin)} (δ over a {DOSE_TRACE_CHANGE:.0%} change); Holm over the fork points",
        [Column("seeds", "n_seeds", fmt="d"), Column("pairs", "n_pairs", fmt="d"),
         Column("left out", "n_left_out", fmt="d"),
         Column("trace change from", "min_change", fmt=".2f"), Column("to", "max_change", fmt=".2f"),
         Column("slope [t 95%]", "slope", ci=("t_low", "t_high"), fmt=".3g"), Column("MDE", "mde", fmt=".3g"),
         Column("p Holm", "holm_p", fmt=".3g"), Column("verdict", "verdict", text=True),
         Column("after Holm", "after_holm", text=True),
         Column("flattening [t 95%]", "flattening_slope", ci=("flattening_low", "flattening_high"), fmt=".3g"),
         Column("sharpening [t 95%]", "sharpening_slope", ci=("sharpening_low", "sharpening_high"), fmt=".3g")],
        out, source="dose_response.csv", key="test", key_header="fork point"))
    if left:
        section.notes.append("Dose-response: pairs left out of the slope: " + "; ".join(left) + ".")
    for r in out:
        section.claims.append(Claim(
            "at the same loss, flatter transfers better — tested as a treatment (a trace penalty), not in the "
            "paper: a negative slope of accuracy on the relative trace change.",
            f"at fork point {r['point']}, over {r['n_seeds']} seeds ({r['n_pairs']} pairs of {r['forks']} against "
            f"the reference; trace changes {r['min_change']:+.0%} to {r['max_change']:+.0%}): {fmt(r['slope'])} "
            f"points per unit of relative trace change, 95% t interval [{fmt(r['t_low'])}, {fmt(r['t_high'])}] "
            f"(jackknife over seeds; MDE {fmt(r['mde'])}, Holm p {fmt(r['holm_p'])}); flattening forks alone "
            f"{fmt(r['flattening_slope'])}, sharpening alone {fmt(r['sharpening_slope'])}.",
            r["verdict"] + (f" ({r['after_holm']} Holm)" if r["after_holm"] else "")))
