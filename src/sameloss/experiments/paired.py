"""Paired fork designs (``isoloss``): forks of one base run per seed — at one or more fork
points (a late fork continues the base; a fork at step 0 trains the recipe from the same
initial weights) — compared at one exact KL, differences paired across seeds.

* matching (``choose_target``, ``nearest_candidate``): every fork's candidates lie on its
  stretch at the final learning rate (one lr factor for all); per seed and fork point one
  target KL, the one whose nearest candidates leave the fewest compared pairs outside the
  KL tolerance, then the smallest largest |ΔKL| among the others;
* the report: ``differences`` (paired differences over the pairs within the tolerance —
  the others excluded and counted —, t and bootstrap intervals, MDE, raw and Holm p values
  per family, verdicts: detected / no effect beyond ±δ / inconclusive / degenerate),
  ``dose`` (the effect at one fork point minus at another, paired by seed),
  ``sensitivity`` (all pairs, and each difference corrected by the along-fork slope of
  accuracy on KL), ``tolerance_check`` (that slope, its sign kept, against every kept
  pair), ``regression`` (accuracy on trace and KL within seeds, cluster bootstrap).

A model's row has ``seed``, ``point`` (its fork point's name), ``fork``, ``kl_match`` (its
KL where it was matched), ``trace_fisher`` and the accuracy columns (fractions; shown in
points).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .claims import fmt
from .report import Claim, Column, Section, Table
from .stats import (DEGENERATE, DETECTED, DETECTED_AGAINST, EQUIVALENT, INCONCLUSIVE, Z95, cluster_bootstrap_ols,
                    holm, interval_power, paired_difference, power_verdict)

UNINFORMATIVE = "uninformative: no headroom"
HOLM_LEVEL = 0.05


@dataclass(frozen=True)
class Comparison:
    """``recipe − reference`` of the paired design; ``sign``: the paper's direction of the
    accuracy difference (the trace's is the opposite)."""

    name: str
    recipe: str
    reference: str
    sign: int
    paper: str
    # the reference's trace column compared with the recipe's ``trace_fisher``: a size
    # contrast compares traces in one parameter space (the small model embedded)
    reference_trace: str = "trace_fisher"


# ---- matching forks at one KL ---------------------------------------------------------------
def nearest_candidate(kls: dict[int, float], candidates: list[int], target: float) -> int:
    """The candidate step whose KL is nearest ``target`` (the latest of ties)."""
    return min(candidates, key=lambda s: (abs(kls[s] - target), -s))


def choose_target(kls: dict[str, dict[int, float]], candidates: dict[str, list[int]],
                  pairs: list[tuple[str, str]], tolerance: float) -> float:
    """One target KL for the forks of one seed and fork point: with every fork at its
    candidate nearest the target, the fewest ``pairs`` outside ``tolerance``, then the
    smallest |ΔKL|s of the pairs within it, largest first (the largest as small as it can
    be, then the next, …), then the same over all pairs, then the forks nearest the target
    (the sum of their distances to it). The objective changes only where a fork's nearest
    candidate does, so the candidates' KLs and the midpoints between neighbours are every
    target worth trying."""
    values = sorted({kls[f][s] for f in candidates for s in candidates[f]})
    trials = values + [(a + b) / 2 for a, b in zip(values, values[1:])]
    forks = [f for f in candidates]

    def cost(target: float) -> tuple:
        at = {f: kls[f][nearest_candidate(kls[f], candidates[f], target)] for f in forks}
        gaps = sorted((abs(at[a] - at[b]) for a, b in pairs), reverse=True)
        inside = [g for g in gaps if g <= tolerance]
        spread = sum(abs(v - target) for v in at.values())
        return (len(gaps) - len(inside), inside, gaps, spread, target)

    return min(trials, key=cost)


# ---- the paired differences ------------------------------------------------------------------
def pairs(rows: list[dict], c: Comparison, point: str, key: str, scale: float = 1.0, reference_key: str | None = None
          ) -> tuple[list[int], np.ndarray, np.ndarray]:
    """The seeds where both forks of ``c`` were measured at fork point ``point``,
    ``scale × (recipe − reference)`` of ``key`` (the reference's ``reference_key``, if
    given) per seed, and the pairs' ΔKL."""
    by = {(r["seed"], r["fork"]): r for r in rows if r["point"] == point}
    seeds = sorted({s for s, _ in by if (s, c.recipe) in by and (s, c.reference) in by})
    ref = reference_key or key
    d = np.array([scale * (float(by[(s, c.recipe)][key]) - float(by[(s, c.reference)].get(ref, math.nan)))
                  for s in seeds])
    dkl = np.array([by[(s, c.recipe)]["kl_match"] - by[(s, c.reference)]["kl_match"] for s in seeds])
    return seeds, d, dkl


@dataclass(frozen=True)
class Design:
    """What the verdicts of one study share: the KL tolerance of a kept pair, the
    equivalence margin of the accuracies (points; a trace's margin is its own MDE), and
    whether the task has headroom (without it every verdict is ``uninformative``)."""

    tolerance: float
    margin: float
    headroom: bool = True


def _verdict(pd, sign: int, margin: float, design: Design) -> str:
    return power_verdict(pd, sign, margin) if design.headroom else UNINFORMATIVE


def differences(section: Section, rows: list[dict], tests: list[tuple[Comparison, str]],
                accuracies: list[tuple[str, str]], primary_key: str, design: Design) -> list[dict]:
    """Per comparison and fork point (``tests``), the paired differences over the pairs
    within the tolerance (the others excluded and counted) of every accuracy column
    (``(key, what)``, points, the paper's sign) and of the trace (the opposite sign), with
    Holm-adjusted p values within each family — the primary accuracies, the traces, the
    secondary accuracies; returns the rows (``differences.csv``)."""
    out = []
    for c, point in tests:
        quantities = [(key, what, c.sign, 100.0) for key, what in accuracies]
        one_space = "" if c.reference_trace == "trace_fisher" else f" ({c.reference} embedded: one parameter space)"
        quantities.append(("trace_fisher", f"trace of Hessian (Fisher){one_space}", -c.sign, 1.0))
        for key, what, sign, scale in quantities:
            seeds, d, dkl = pairs(rows, c, point, key, scale, c.reference_trace if key == "trace_fisher" else None)
            kept = np.abs(dkl) <= design.tolerance
            pd = paired_difference(d[kept].tolist(), seed=len(out))
            margin = design.margin if scale == 100.0 else pd.mde
            family = "primary" if key == primary_key else "trace" if key == "trace_fisher" else "secondary"
            out.append({
                "test": f"{c.name} @ {point}: {key}", "comparison": c.name, "point": point, "recipe": c.recipe,
                "reference": c.reference, "quantity": key, "what": what, "family": family, "n_pairs": len(seeds),
                "n_kept": pd.n, "n_excluded": int((~kept).sum()), "mean": pd.mean, "sd": pd.sd, "t_low": pd.t_low,
                "t_high": pd.t_high, "boot_low": pd.boot_low, "boot_high": pd.boot_high, "p_value": pd.p_value,
                "mde": pd.mde, "margin": margin, "expected_sign": sign,
                "verdict": _verdict(pd, sign, margin, design),
                "mean_dkl": float(np.mean(dkl[kept])) if kept.any() else math.nan,
                "max_abs_dkl": float(np.max(np.abs(dkl[kept]))) if kept.any() else math.nan,
                "max_abs_dkl_all": float(np.max(np.abs(dkl))) if len(dkl) else math.nan})
    for family in ("primary", "trace", "secondary"):
        members = [r for r in out if r["family"] == family]
        for r, q in zip(members, holm([r["p_value"] for r in members])):
            r["holm_p"] = q
            r["after_holm"] = _after_holm(r["verdict"], q)
    return out


def _after_holm(verdict: str, holm_p: float) -> str:
    if verdict not in (DETECTED, DETECTED_AGAINST):
        return ""
    return "survives" if holm_p <= HOLM_LEVEL else "does not survive"


def difference_tables(section: Section, out: list[dict], comparisons: dict[str, Comparison],
                      primary_key: str) -> None:
    """The tables and claims of ``differences``' rows: the primary accuracy and the trace,
    then the secondary endpoints."""
    section.files["differences.csv"] = out
    shown = [r for r in out if r["family"] in ("primary", "trace")]
    section.tables.append(Table(
        "Paired differences (recipe − reference) across seeds over the pairs within the KL tolerance: primary "
        "probe (points) and trace; p raw and Holm-adjusted within each family (primary accuracies; traces)", [
            Column("kept", "n_kept", fmt="d"), Column("excluded", "n_excluded", fmt="d"),
            Column("mean", "mean", ci=("t_low", "t_high"), fmt=".3g"),
            Column("bootstrap 95%", "boot_low", fmt=".3g"), Column("to", "boot_high", fmt=".3g"),
            Column("paired SD", "sd", fmt=".3g"), Column("MDE 80%", "mde", fmt=".3g"),
            Column("δ", "margin", fmt=".3g"), Column("p", "p_value", fmt=".3g"),
            Column("p Holm", "holm_p", fmt=".3g"), Column("mean ΔKL", "mean_dkl", fmt=".2e"),
            Column("max abs ΔKL", "max_abs_dkl", fmt=".2e"), Column("verdict", "verdict", text=True),
            Column("after Holm", "after_holm", text=True)],
        shown, source="differences.csv", key="test", key_header="comparison @ fork point"))
    for r in shown:
        c = comparisons[r["comparison"]]
        unit = " pts" if r["family"] == "primary" else ""
        holm_note = f", Holm p {fmt(r['holm_p'])} ({r['after_holm']})" if r["after_holm"] else ""
        section.claims.append(Claim(
            c.paper,
            f"{c.recipe} − {c.reference} forked at {r['point']}, {r['what']}, paired over {r['n_kept']} seeds "
            f"({r['n_excluded']} pairs outside the KL tolerance excluded): {fmt(r['mean'])}{unit}, 95% t interval "
            f"[{fmt(r['t_low'])}, {fmt(r['t_high'])}], paired SD {fmt(r['sd'])}, MDE (80% power) "
            f"{fmt(r['mde'])}{unit}, δ {fmt(r['margin'])}{unit}, p {fmt(r['p_value'])}{holm_note}; mean ΔKL "
            f"{fmt(r['mean_dkl'])}, max |ΔKL| {fmt(r['max_abs_dkl'])} nats.", r["verdict"]))
    secondary = [r for r in out if r["family"] == "secondary"]
    section.tables.append(Table(
        "Secondary endpoints (other probe sizes, the AdamW probe, the all-positions probe): paired differences in "
        "points over the kept pairs; Holm within the secondary family",
        [Column("mean [t 95%]", "mean", ci=("t_low", "t_high"), fmt=".3g"), Column("MDE", "mde", fmt=".3g"),
         Column("p Holm", "holm_p", fmt=".3g"), Column("verdict", "verdict", text=True),
         Column("after Holm", "after_holm", text=True)],
        secondary, source="differences.csv", key="test", key_header="comparison @ fork point"))
    counts = {v: sum(r["verdict"] == v for r in secondary) for v in (DETECTED, DETECTED_AGAINST, EQUIVALENT,
                                                                      INCONCLUSIVE, DEGENERATE, UNINFORMATIVE)}
    survive = sum(r["after_holm"] == "survives" for r in secondary)
    section.notes.append(f"Secondary endpoints ({len(secondary)} tests): "
                         + ", ".join(f"{k}: {v}" for k, v in counts.items() if v)
                         + f"; {survive} detections survive Holm's correction within the family.")


def dose(section: Section, rows: list[dict], comparisons: list[Comparison], points: tuple[str, str], key: str,
         design: Design) -> list[dict]:
    """Does the effect grow with how long the recipe acts? Per comparison, the paired
    difference at ``points[1]`` minus at ``points[0]`` per seed (pairs within the tolerance
    at both), with its interval; Holm over the comparisons."""
    out = []
    for c in comparisons:
        per_point = []
        for point in points:
            seeds, d, dkl = pairs(rows, c, point, key, 100.0)
            per_point.append({s: x for s, x, k in zip(seeds, d, dkl) if abs(k) <= design.tolerance})
        common = sorted(set(per_point[0]) & set(per_point[1]))
        pd = paired_difference([per_point[1][s] - per_point[0][s] for s in common], seed=len(out))
        out.append({"test": f"{c.name}: {points[1]} − {points[0]}", "comparison": c.name, "n_seeds": pd.n,
                    "at_first": float(np.mean([per_point[0][s] for s in common])) if common else math.nan,
                    "at_second": float(np.mean([per_point[1][s] for s in common])) if common else math.nan,
                    "mean": pd.mean, "t_low": pd.t_low, "t_high": pd.t_high, "sd": pd.sd, "mde": pd.mde,
                    "p_value": pd.p_value,
                    "verdict": _verdict(pd, c.sign, design.margin, design)})
    for r, q in zip(out, holm([r["p_value"] for r in out])):
        r["holm_p"] = q
        r["after_holm"] = _after_holm(r["verdict"], q)
    section.files["dose.csv"] = out
    section.tables.append(Table(
        f"Dose: the primary difference (points) with the recipe acting from {points[1]} minus acting from "
        f"{points[0]}, per seed (pairs within the KL tolerance at both); positive = the effect grows in the "
        "paper's direction when its sign is +, shrinks when −; Holm over the comparisons",
        [Column("seeds", "n_seeds", fmt="d"), Column(f"at {points[0]}", "at_first", fmt=".3g"),
         Column(f"at {points[1]}", "at_second", fmt=".3g"),
         Column("difference [t 95%]", "mean", ci=("t_low", "t_high"), fmt=".3g"), Column("MDE", "mde", fmt=".3g"),
         Column("p Holm", "holm_p", fmt=".3g"), Column("verdict", "verdict", text=True),
         Column("after Holm", "after_holm", text=True)],
        out, source="dose.csv", key="test", key_header="comparison"))
    return out


# ---- the KL tolerance, by its consequence ------------------------------------------------
@dataclass(frozen=True)
class Slope:
    """Points of primary accuracy per 0.001 nats of KL along one fork's decay and stretch
    (seed fixed effects, cluster-bootstrap 95 % interval over seeds)."""

    estimate: float
    low: float
    high: float
    n_seeds: int
    n_models: int


def along_fork_slope(slope_rows: list[dict], key: str) -> Slope:
    """The within-seed least-squares slope of accuracy (points) on KL (per 0.001 nats)
    over the checkpoints of one fork per seed (``slope_rows``: ``seed``, ``kl_match``,
    ``key``) — not across forks, where it is confounded with the fork."""
    y = np.array([100 * float(r[key]) for r in slope_rows])
    x = np.array([[1000 * float(r["kl_match"])] for r in slope_rows])
    seeds = np.array([r["seed"] for r in slope_rows])
    if len(set(seeds.tolist())) < 2:
        return Slope(math.nan, math.nan, math.nan, len(set(seeds.tolist())), len(y))
    (iv,) = cluster_bootstrap_ols(y, x, seeds, n_boot=2000, seed=0)
    return Slope(iv.estimate, iv.low, iv.high, iv.n, len(y))


def tolerance_check(section: Section, rows: list[dict], diffs: list[dict], tests: list[tuple[Comparison, str]],
                    key: str, slope: Slope, design: Design) -> list[dict]:
    """The KL tolerance by its consequence: per comparison and fork point, what the kept
    pairs' residual ΔKL is worth at the along-fork slope — its bias on the mean
    (``slope × mean ΔKL``, over the slope's interval, sign kept) and the largest over
    every kept pair (``max |slope| × |ΔKL|``) — against half the comparison's MDE; and the
    difference corrected pair by pair (``d − slope × ΔKL``)."""
    primary = {(r["comparison"], r["point"]): r for r in diffs if r["family"] == "primary"}
    out = []
    worst_slope = max(abs(slope.low), abs(slope.high)) if math.isfinite(slope.low) else math.nan
    for c, point in tests:
        _, d, dkl = pairs(rows, c, point, key, 100.0)
        kept = np.abs(dkl) <= design.tolerance
        r = primary[(c.name, point)]
        dk = 1000 * dkl[kept]
        bias = [slope.estimate * float(np.mean(dk)), slope.low * float(np.mean(dk)),
                slope.high * float(np.mean(dk))] if kept.any() else [math.nan] * 3
        worst = worst_slope * float(np.max(np.abs(dk))) if kept.any() else math.nan
        corrected = paired_difference((d[kept] - slope.estimate * dk).tolist(), seed=len(out))
        all_pairs = paired_difference(d.tolist(), seed=len(out))
        out.append({"test": f"{c.name} @ {point}", "n_kept": int(kept.sum()), "n_all": len(d),
                    "bias": bias[0], "bias_low": min(bias[1:]), "bias_high": max(bias[1:]),
                    "worst_pair": worst, "half_mde": r["mde"] / 2,
                    "ok": bool(math.isfinite(worst) and worst <= r["mde"] / 2),
                    "corrected": corrected.mean, "corrected_low": corrected.t_low,
                    "corrected_high": corrected.t_high, "all_mean": all_pairs.mean, "all_low": all_pairs.t_low,
                    "all_high": all_pairs.t_high})
    section.files["tolerance.csv"] = out
    section.tables.append(Table(
        "The KL tolerance by its consequence and the sensitivity of the primary differences (points): the bias "
        "of the mean from the kept pairs' residual ΔKL at the along-fork slope (its 95% interval), the largest "
        "any kept pair could carry (the slope's far end × its |ΔKL|) against half the MDE, the mean corrected "
        "pair by pair, and the mean over all pairs (excluded ones too)",
        [Column("kept / all", "n_kept", fmt="d"), Column("of", "n_all", fmt="d"),
         Column("bias [slope 95%]", "bias", ci=("bias_low", "bias_high"), fmt=".2g"),
         Column("worst pair", "worst_pair", fmt=".2g"), Column("MDE / 2", "half_mde", fmt=".2g"),
         Column("within", "ok", text=True),
         Column("slope-corrected mean", "corrected", ci=("corrected_low", "corrected_high"), fmt=".3g"),
         Column("all pairs' mean", "all_mean", ci=("all_low", "all_high"), fmt=".3g")],
        out, source="tolerance.csv", key="test", key_header="comparison @ fork point"))
    bad = [r["test"] for r in out if not r["ok"] and r["n_kept"]]
    none_kept = [r["test"] for r in out if not r["n_kept"]]
    section.notes.append(
        f"KL tolerance by consequence: along one fork's decay and stretch (the AdamW fork, {slope.n_models} "
        f"checkpoints of {slope.n_seeds} seeds, seed fixed effects) the primary accuracy moves "
        f"{fmt(slope.estimate)} [{fmt(slope.low)}, {fmt(slope.high)}] points per 0.001 nats of KL (positive: a "
        f"higher KL probes better). With the tolerance {design.tolerance:g} nats, every kept pair's residual ΔKL "
        + ("is worth at most half its comparison's MDE." if not bad else
           f"is NOT within half the MDE for: {', '.join(bad)} (read those with the corrected means).")
        + (f" No pair was kept for: {', '.join(none_kept)} (nothing to check; the comparison gives no verdict)."
           if none_kept else ""))
    return out


# ---- Fig. 1 within seeds -----------------------------------------------------------------
def regression(section: Section, rows: list[dict], key: str, point: str, without: tuple[str, ...],
               design: Design) -> list[dict]:
    """Fig. 1 within seeds at one fork point: the primary accuracy (points) regressed on the
    trace and the KL (per 0.001 nats) with seed fixed effects (cluster bootstrap over
    seeds), over the models of one size and without the forks ``without`` (an objective
    aimed at the task: its accuracy loss is by construction, not through flatness)."""
    out = []
    models = [r for r in rows if r["point"] == point and r["fork"] not in without
              and math.isfinite(float(r["trace_fisher"]))]
    y = np.array([100 * float(r[key]) for r in models])
    X = np.array([[float(r["trace_fisher"]), 1000 * float(r["kl_match"])] for r in models])
    seeds = np.array([r["seed"] for r in models])
    n_seeds = len(set(seeds.tolist()))
    if n_seeds < 2:
        return out
    ivs = cluster_bootstrap_ols(y, X, seeds, n_boot=2000, seed=0)
    for what, iv in zip(("per unit of trace", "per 0.001 nats of KL"), ivs):
        verdict, mde = interval_power(iv, max(n_seeds - 1, 1), -1)
        out.append({"coefficient": f"{point}: accuracy (pts) {what}", "point": point, "estimate": iv.estimate,
                    "low": iv.low, "high": iv.high, "mde": mde, "n_models": len(models), "n_seeds": n_seeds,
                    "verdict": verdict if design.headroom else UNINFORMATIVE})
    tr = out[0]
    section.claims.append(Claim(
        "at the same loss, flatter models transfer better (Fig. 1): a negative slope of accuracy on the trace.",
        f"within seeds at fork point {point}, holding KL fixed (one model size, without {', '.join(without)}; "
        f"{tr['n_models']} models): {fmt(tr['estimate'])} pts per unit of trace, 95% cluster-bootstrap interval "
        f"[{fmt(tr['low'])}, {fmt(tr['high'])}] over {tr['n_seeds']} seeds (MDE and δ {fmt(tr['mde'])}).",
        tr["verdict"]))
    return out


# ---- replication across languages (issue 24) -------------------------------------------------
REPLICATED = "replicated"
CONTRADICTED = "contradicted: detected in opposite directions"
NOT_REPLICATED = "not replicated"
NO_DETECTION = "detected on no language"


def replication_verdict(verdicts: list[str], means: list[float]) -> str:
    """One comparison across languages: ``replicated`` only where every informative
    language agrees in direction (the point estimates' signs) and at least one detects;
    ``contradicted`` when detections point both ways; a language without headroom (or a
    comparison it could not test) counts as not agreeing."""
    detected = [v in (DETECTED, DETECTED_AGAINST) for v in verdicts]
    if any(v == DETECTED for v in verdicts) and any(v == DETECTED_AGAINST for v in verdicts):
        return CONTRADICTED
    if not any(detected):
        return NO_DETECTION
    usable = all(v != UNINFORMATIVE and math.isfinite(m) for v, m in zip(verdicts, means))
    signs = {np.sign(m) for m in means if math.isfinite(m)}
    return REPLICATED if usable and len(signs) == 1 and 0 not in signs else NOT_REPLICATED


def replication(section: Section, studies: list[dict], family: str = "primary") -> list[dict]:
    """The replication table: per comparison and fork point of ``family``, each language's
    mean [t 95 %] and verdict, the replication verdict (``replication_verdict``) and the
    inverse-variance pooled estimate over the languages that have headroom, with its random-
    effects interval and heterogeneity (Cochran's Q, I², τ²). ``studies``: per language
    ``{"language": spec, "tag": str, "ok": headroom passed, "diffs": its differences rows,
    "tests": the names of its comparisons, "comparison @ point"}``."""
    from .stats import pool_inverse_variance

    tests: dict[str, dict] = {}
    for s in studies:
        for name in s.get("tests", ()):  # a language without headroom tested nothing: listed all the same
            tests.setdefault(name, {})
        for r in s["diffs"]:
            if r["family"] == family:
                tests.setdefault(f"{r['comparison']} @ {r['point']}", {})[s["tag"]] = r
    out = []
    for test, by in tests.items():
        row: dict = {"test": test}
        verdicts, means, pool_m, pool_se, kept = [], [], [], [], []
        for s in studies:
            r = by.get(s["tag"])
            n_kept = 0 if r is None else int(r["n_kept"])
            mean, low, high = (float(r[k]) for k in ("mean", "t_low", "t_high")) if n_kept >= 2 else (math.nan,) * 3
            verdict = (UNINFORMATIVE if not s["ok"] else r["verdict"] if n_kept >= 2
                       else f"{n_kept} pair(s) kept: no interval")
            row.update({f"{s['tag']}_mean": mean, f"{s['tag']}_low": low, f"{s['tag']}_high": high,
                        f"{s['tag']}_verdict": verdict, f"{s['tag']}_kept": n_kept})
            verdicts.append(verdict)
            means.append(mean)
            # the standard error backed out of the language's own 95 % t interval (half width / z):
            # with a few seeds a t interval is much wider than ± z · sd / √n, and pooling must not
            # forget that each language's mean rests on n − 1 degrees of freedom
            se = (high - low) / (2 * Z95)
            if s["ok"] and math.isfinite(se) and se > 0:
                pool_m.append(mean)
                pool_se.append(se)
                kept.append(s["tag"])
        row["replication"] = replication_verdict(verdicts, means)
        row["pooled_languages"] = len(kept)
        row.update(dict.fromkeys(("pooled", "pooled_low", "pooled_high", "random", "random_low", "random_high", "q",
                                  "q_p", "i2", "tau2"), math.nan))
        if len(kept) >= 2:  # one language is nothing to pool
            pooled = pool_inverse_variance(pool_m, pool_se)
            row.update(pooled=pooled.fixed, pooled_low=pooled.fixed_low, pooled_high=pooled.fixed_high,
                       random=pooled.random, random_low=pooled.random_low, random_high=pooled.random_high,
                       q=pooled.q, q_p=pooled.q_p, i2=pooled.i2, tau2=pooled.tau2)
        out.append(row)
    name = "replication.csv" if family == "primary" else f"replication_{family}.csv"
    section.files[name] = out
    columns = []
    for s in studies:
        columns += [Column(f"{s['tag']} [95%]", f"{s['tag']}_mean", ci=(f"{s['tag']}_low", f"{s['tag']}_high"),
                           fmt=".2f"),
                    Column(f"{s['tag']} verdict", f"{s['tag']}_verdict", text=True)]
    columns += [Column("replication", "replication", text=True),
                Column("pooled, fixed [95%]", "pooled", ci=("pooled_low", "pooled_high"), fmt=".2f"),
                Column("pooled, random [95%]", "random", ci=("random_low", "random_high"), fmt=".2f"),
                Column("Q", "q", fmt=".2f"), Column("p(Q)", "q_p", fmt=".2g"), Column("I²", "i2", fmt=".2f")]
    what = "primary accuracy (points)" if family == "primary" else family
    # (pooled over ≥ 2 languages with headroom; each language's standard error from its t interval)
    section.tables.append(Table(
        f"Replication across languages: the {what} difference per comparison and fork point on each language, "
        "whether it replicates (every language with headroom agrees in direction and at least one detects), and the "
        "inverse-variance pooled estimate over the languages with headroom, when there are at least two (each "
        "language's standard error from its own 95% t interval; fixed effect and DerSimonian–Laird random effects) "
        "with its heterogeneity (Cochran's Q, I²)", columns, out, source=name, key="test",
        key_header="comparison @ fork point"))
    return out
