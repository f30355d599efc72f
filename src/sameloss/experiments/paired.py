"""Paired fork designs (``isoloss``; the size and dose forks to come): forks of one base run
per seed, compared at one exact KL, differences paired across seeds.

* matching: ``iso_loss_target`` (the lowest KL every fork reaches among its candidate
  checkpoints) and ``select_iso_loss`` (each fork's checkpoint nearest it);
* the report: ``differences`` (paired differences with t and bootstrap intervals, MDE and
  power verdicts), ``sensitivity`` (the primary differences over the pairs within the KL
  tolerance, and corrected for each pair's ΔKL), ``regression`` (accuracy on trace and KL
  within seeds, cluster bootstrap; the KL tolerance checked by its consequence).

A model's row has ``seed``, ``fork``, ``kl_match`` (its KL where it was matched),
``trace_fisher`` and the accuracy columns compared (fractions; shown in points).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .claims import fmt
from .report import Claim, Column, Section, Table
from .stats import (DEGENERATE, DETECTED, DETECTED_AGAINST, NONE_LARGER, cluster_bootstrap_ols,
                    covariate_adjusted_mean, interval_power, paired_difference, power_verdict)


@dataclass(frozen=True)
class Comparison:
    """``recipe − reference`` of the paired design; ``sign``: the paper's direction of the
    accuracy difference (the trace's is the opposite)."""

    name: str
    recipe: str
    reference: str
    sign: int
    paper: str


# ---- matching forks at one KL ---------------------------------------------------------------
def iso_loss_target(kls: dict[str, dict[int, float]], candidates: dict[str, list[int]]) -> float:
    """The lowest KL every fork reaches among its candidates: the largest of the forks'
    smallest candidate KLs (each fork's decay starts above it, so each passes near it)."""
    return max(min(kls[name][s] for s in candidates[name]) for name in candidates)


def select_iso_loss(kls: dict[int, float], candidates: list[int], target: float, tolerance: float) -> int:
    """The latest candidate step whose KL is within ``tolerance`` of ``target`` (the most
    decayed learning rate: the least batch noise), else the nearest (the latest of ties)."""
    within = [s for s in candidates if abs(kls[s] - target) <= tolerance]
    if within:
        return max(within)
    return min(candidates, key=lambda s: (abs(kls[s] - target), -s))


# ---- the report ------------------------------------------------------------------------------
def pairs(rows: list[dict], c: Comparison, key: str, scale: float = 1.0) -> tuple[list[int], np.ndarray, np.ndarray]:
    """The seeds where both forks of ``c`` were measured, ``scale × (recipe − reference)`` of
    ``key`` per seed, and the pairs' ΔKL."""
    by = {(r["seed"], r["fork"]): r for r in rows}
    seeds = sorted({s for s, _ in by if (s, c.recipe) in by and (s, c.reference) in by})
    d = np.array([scale * (float(by[(s, c.recipe)][key]) - float(by[(s, c.reference)][key])) for s in seeds])
    dkl = np.array([by[(s, c.recipe)]["kl_match"] - by[(s, c.reference)]["kl_match"] for s in seeds])
    return seeds, d, dkl


def differences(section: Section, rows: list[dict], comparisons: tuple[Comparison, ...], accuracies: list[tuple[str, str]],
                primary_key: str, tolerance: float) -> dict:
    """Per comparison, the paired differences of every accuracy column (``(key, what)``,
    in points, the paper's sign) and of the trace (the opposite sign): ``differences.csv``,
    a table of the primary accuracy and the trace with their claims, a table of the
    secondary endpoints; returns the primary ``PairedDifference`` per comparison."""
    out_rows, claims, primary = [], [], {}
    for c in comparisons:
        quantities = [(key, what, c.sign, 100.0) for key, what in accuracies]
        quantities.append(("trace_fisher", "trace of Hessian (Fisher)", -c.sign, 1.0))
        for key, what, sign, scale in quantities:
            _, d, dkl = pairs(rows, c, key, scale)
            within = int(np.sum(np.abs(dkl) <= tolerance))
            pd = paired_difference(d.tolist(), seed=len(out_rows))
            row = {"comparison": f"{c.name}: {key}", "recipe": c.recipe, "reference": c.reference, "quantity": key,
                   "n_seeds": pd.n, "mean": pd.mean, "sd": pd.sd, "t_low": pd.t_low, "t_high": pd.t_high,
                   "boot_low": pd.boot_low, "boot_high": pd.boot_high, "p_value": pd.p_value, "mde": pd.mde,
                   "expected_sign": sign, "verdict": power_verdict(pd, sign),
                   "mean_dkl": float(np.mean(dkl)), "mean_abs_dkl": float(np.mean(np.abs(dkl))),
                   "max_abs_dkl": float(np.max(np.abs(dkl))), "within_tolerance": within}
            out_rows.append(row)
            if key == primary_key or key == "trace_fisher":
                unit = " pts" if scale == 100 else ""
                claims.append(Claim(
                    c.paper,
                    f"{c.recipe} − {c.reference}, {what}, paired over {pd.n} seeds: {fmt(pd.mean)}{unit}, 95% t "
                    f"interval [{fmt(pd.t_low)}, {fmt(pd.t_high)}], bootstrap [{fmt(pd.boot_low)}, "
                    f"{fmt(pd.boot_high)}], paired SD {fmt(pd.sd)}, MDE (80% power) {fmt(pd.mde)}{unit}; ΔKL mean "
                    f"|{fmt(row['mean_abs_dkl'])}|, max |{fmt(row['max_abs_dkl'])}| nats, {within} of {pd.n} pairs "
                    f"within the tolerance {tolerance:g}.", row["verdict"]))
                if key == primary_key:
                    primary[c.name] = pd
    section.files["differences.csv"] = out_rows
    shown = [r for r in out_rows if r["quantity"] in (primary_key, "trace_fisher")]
    section.tables.append(Table(
        "Paired differences (recipe − reference) across seeds: primary probe (points) and trace", [
            Column("n", "n_seeds", fmt="d"), Column("mean", "mean", ci=("t_low", "t_high"), fmt=".3g"),
            Column("bootstrap 95%", "boot_low", fmt=".3g"), Column("to", "boot_high", fmt=".3g"),
            Column("paired SD", "sd", fmt=".3g"), Column("MDE 80%", "mde", fmt=".3g"),
            Column("p", "p_value", fmt=".3g"), Column("max abs ΔKL", "max_abs_dkl", fmt=".2e"),
            Column("pairs within tol.", "within_tolerance", fmt="d"), Column("verdict", "verdict", text=True)],
        shown, source="differences.csv", key="comparison", key_header="comparison"))
    secondary = [r for r in out_rows if r["quantity"] not in (primary_key, "trace_fisher")]
    section.tables.append(Table(
        "Secondary endpoints (other probe sizes, the AdamW probe, the all-positions probe): paired differences in "
        "points", [Column("mean [t 95%]", "mean", ci=("t_low", "t_high"), fmt=".3g"), Column("MDE", "mde", fmt=".3g"),
                   Column("verdict", "verdict", text=True)],
        secondary, source="differences.csv", key="comparison", key_header="comparison"))
    section.claims += claims
    counts = {v: sum(r["verdict"] == v for r in secondary) for v in (DETECTED, DETECTED_AGAINST, NONE_LARGER,
                                                                      DEGENERATE)}
    section.notes.append(f"Secondary endpoints ({len(secondary)} tests, not corrected for multiplicity): "
                         + ", ".join(f"{k}: {v}" for k, v in counts.items() if v or k != DEGENERATE) + ".")
    return primary


def sensitivity(section: Section, rows: list[dict], comparisons: tuple[Comparison, ...], key: str,
                tolerance: float) -> None:
    """The primary paired differences two more ways, so a residual ΔKL cannot carry a verdict:
    over the pairs within the tolerance only, and corrected for each pair's ΔKL (the
    intercept of the differences regressed on ΔKL)."""
    out = []
    for c in comparisons:
        _, d, dkl = pairs(rows, c, key, 100.0)
        ok = np.abs(dkl) <= tolerance
        within = paired_difference(d[ok].tolist(), seed=0)
        adjusted = covariate_adjusted_mean(d, 1000 * dkl)
        out.append({"comparison": f"{c.name}: {key}", "n_within": within.n, "within_mean": within.mean,
                    "within_low": within.t_low, "within_high": within.t_high, "adjusted": adjusted.estimate,
                    "adjusted_low": adjusted.low, "adjusted_high": adjusted.high})
    section.files["sensitivity.csv"] = out
    section.tables.append(Table(
        "Sensitivity of the primary differences (points) to the residual ΔKL: the pairs within the tolerance "
        "only, and the mean corrected for each pair's ΔKL (t intervals, 95%)",
        [Column("pairs within tol.", "n_within", fmt="d"),
         Column("mean of those", "within_mean", ci=("within_low", "within_high"), fmt=".3g"),
         Column("ΔKL-corrected mean", "adjusted", ci=("adjusted_low", "adjusted_high"), fmt=".3g")],
        out, source="sensitivity.csv", key="comparison", key_header="comparison"))


def regression(section: Section, rows: list[dict], key: str, tolerance: float, primary: dict,
               without: str = "adv") -> None:
    """Fig. 1 within seeds: the primary accuracy (points) regressed on the trace and the KL
    with seed fixed effects (cluster bootstrap over seeds), over all forks and without the
    fork ``without`` (an objective aimed at the task: its accuracy loss is by construction,
    not through flatness); its claims, and the KL tolerance checked by its consequence."""
    mean_dkl = {r["recipe"] + " − " + r["reference"]: r["mean_dkl"] for r in section.files["differences.csv"]
                if r["quantity"] == key}
    reg_rows = []
    # all models, and without the adversarial fork (aimed at the task itself: its accuracy
    # loss is by construction, not through flatness)
    for subset, models in (("all forks", list(rows)), (f"without {without}", [r for r in rows if r["fork"] != without])):
        good = [r for r in models if math.isfinite(float(r["trace_fisher"]))]
        y = np.array([100 * float(r[key]) for r in good])
        X = np.array([[float(r["trace_fisher"]), 1000 * float(r["kl_match"])] for r in good])
        seeds = np.array([r["seed"] for r in good])
        ivs = cluster_bootstrap_ols(y, X, seeds, n_boot=2000, seed=0)
        n_seeds = len(set(seeds.tolist()))
        for what, iv in zip(("per unit of trace", "per 0.001 nats of KL"), ivs):
            verdict, mde = interval_power(iv, max(n_seeds - 1, 1), -1)
            reg_rows.append({"coefficient": f"{subset}: accuracy (pts) {what}", "estimate": iv.estimate,
                             "low": iv.low, "high": iv.high, "mde": mde, "n_models": len(good), "n_seeds": n_seeds,
                             "verdict": verdict})
    section.files["regression.csv"] = reg_rows
    section.tables.append(Table(
        "Fig. 1 within seeds: primary accuracy (pts) regressed on trace and KL with seed fixed effects "
        "(cluster bootstrap over seeds, 95%)",
        [Column("estimate [95%]", "estimate", ci=("low", "high"), fmt=".3g"), Column("MDE 80%", "mde", fmt=".3g"),
         Column("models", "n_models", fmt="d"),
         Column("verdict", "verdict", text=True)], reg_rows, source="regression.csv", key="coefficient",
        key_header="coefficient"))
    for tr in (reg_rows[0], reg_rows[2]):
        section.claims.append(Claim(
            "at the same loss, flatter models transfer better (Fig. 1): a negative slope of accuracy on the trace.",
            f"within seeds, holding KL fixed ({tr['coefficient'].split(':')[0]}, {tr['n_models']} models): "
            f"{fmt(tr['estimate'])} pts per unit of trace, 95% cluster-bootstrap interval [{fmt(tr['low'])}, "
            f"{fmt(tr['high'])}] over {tr['n_seeds']} seeds (MDE {fmt(tr['mde'])}).", tr["verdict"]))
    # the tolerance by consequence: |slope on KL| × tolerance against half the smallest MDE.
    # The slope is the one without the adversarial fork: its accuracy loss is aimed at the
    # task and has nothing to do with its KL, so with it the KL coefficient is not the
    # accuracy a small KL difference is worth (it may even come out positive).
    slope = abs(reg_rows[3]["estimate"]) * 1000  # pts per nat
    mdes = [d.mde for d in primary.values() if math.isfinite(d.mde)]
    if mdes and math.isfinite(slope):
        effect = slope * tolerance
        ok = effect <= min(mdes) / 2
        worst = max(mean_dkl, key=lambda k: abs(mean_dkl[k])) if mean_dkl else None
        section.notes.append(
            f"KL tolerance by consequence: the measured within-seed slope of the primary accuracy on KL (without "
            f"the adversarial fork, whose accuracy loss is aimed at the task) is {fmt(slope / 1000)} pts per 0.001 "
            f"nats (all forks: {fmt(reg_rows[1]['estimate'])}); times the tolerance {tolerance:g} nats that "
            f"is {fmt(effect)} pts, {'at most' if ok else 'MORE than'} half the smallest primary MDE "
            f"({fmt(min(mdes))} pts)" + ("." if ok else ": the tolerance is too loose for this design.")
            + (f" The largest mean ΔKL of a compared pair ({worst}: {fmt(mean_dkl[worst])} nats) is worth "
               f"{fmt(slope * abs(mean_dkl[worst]))} pts at that slope." if worst else ""))
