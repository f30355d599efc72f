"""Paired fork designs (``isoloss``): forks of one base run per seed — at one or more fork
points (a late fork continues the base; a fork at step 0 trains the recipe from the same
initial weights) — compared at one exact KL, differences paired across seeds. Estimation
only: the tables that show it are the recipe's (``recipes/isoloss/tables.py``).

* estimation at the target (``comparison_target``, ``at_target``, ``estimate_pairs``):
  each fork is measured at several checkpoints of its stretch at the final learning rate
  (one lr factor for all); per comparison and seed one target KL, chosen from the two
  forks' measured KL ranges alone (the middle of their overlap, or of the gap between
  them); each fork's accuracy and trace are estimated *at* that target by the
  least-squares line of the quantity on KL through its own checkpoints (a line per fork:
  the one line model, fixed before the data), with the line's leverage there (what the KL
  positions alone say of the estimate's variance), and where a fork has 4 or more
  checkpoints, a test of curvature (``weighted.curvature_p``). A pair is used unless a
  fork's target lies more than ``Design.limit`` nats outside that fork's measured range
  (one limit in nats for every fork, fixed before the data), or a fork has fewer than two
  distinct KLs — such a pair is named with its reason, never dropped silently; and every
  estimate is given beside it at limit 0 (only pairs whose target lies inside both ranges)
  and at no limit (every pair), so a reader sees whether the exclusion moves it.
* ``differences``: per comparison, fork point and quantity the precision-weighted estimate
  over the used pairs (``weighted.estimate``: weights from the KL positions, random effects
  with the HKSJ interval), its MDE, the verdict against the claim's own margin (``Comparison
  .margin``: its smallest effect of interest, from the paper's effects, fixed in the preset;
  TOST for "no effect beyond ±δ"), the secondary reading at ±``Design.secondary_margin``,
  raw and Holm p values per family (the primary family the preset's claims), and the power
  of the verdict as made after Holm: against δ for a detection, TOST's at a true 0 for a "no
  effect"; ``decided`` is a verdict that survives Holm.
* ``dose`` (the effect at one fork point minus at another, paired by seed) and
  ``regression`` (accuracy on trace and KL within seeds, cluster bootstrap). Flatness as a
  treatment, by arm, is ``dose_response.py``'s; pooling across languages
  ``replication.py``'s.

A model's row (one probed checkpoint) has ``run``, ``step``, ``seed``, ``point`` (its fork
point's name), ``fork``, ``kl`` (its exact KL on the shared held-out set), ``trace_fisher``
and the accuracy columns (fractions; shown in points).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from scipy.stats import combine_pvalues

from ...errors import UserError
from .inference import (DETECTED, DETECTED_AGAINST, EQUIVALENT, cluster_bootstrap_ols, holm, interval_power,
                        noncentral_mde, paired_difference, power_verdict, t_test_power, tost_power)
from .weighted import Line, curvature_p, estimate, fits_of, line, tost_p

UNINFORMATIVE = "uninformative: no headroom"
HOLM_LEVEL = 0.05


class TestKey(NamedTuple):
    """A test of the paired design: a comparison at a fork point, written ``"name @ point"``."""

    comparison: str
    point: str

    def __str__(self) -> str:
        return f"{self.comparison} @ {self.point}"

    @classmethod
    def of(cls, row: dict) -> TestKey:
        """The test of a row that names its ``comparison`` and ``point``."""
        return cls(row["comparison"], row["point"])

    @classmethod
    def parse(cls, text: str) -> TestKey:
        name, sep, point = str(text).partition(" @ ")
        if not sep or not name or not point:
            raise ValueError(f"a test is written 'comparison @ point', got {text!r}")
        return cls(name, point)


@dataclass(frozen=True)
class Comparison:
    """``recipe − reference`` of the paired design; ``sign``: the paper's direction of the
    accuracy difference (the trace's is the opposite). ``margin``: the claim's smallest
    effect of interest (points of accuracy) — equivalence is tested against it and a
    detection's power is stated at it — taken from the effects the paper reports for the
    mechanism (``margin_source`` says which), fixed before any data; ``effect``: the effect a
    design plans its power for when it is not the margin (a positive control's expected
    effect). ``pooled``: pooled across languages (False: its size is the language's — an
    objective aimed at the language's own task — and it is reported per language only)."""

    name: str
    recipe: str
    reference: str
    sign: int
    paper: str
    # the reference's trace column compared with the recipe's ``trace_fisher``: a size
    # contrast compares traces in one parameter space (the small model embedded)
    reference_trace: str = "trace_fisher"
    margin: float = 1.0
    margin_source: str = ""
    effect: float | None = None
    pooled: bool = True

    @property
    def planned_effect(self) -> float:
        """The effect a design plans this comparison's power for (points)."""
        return self.margin if self.effect is None else self.effect

    def key(self, point: str) -> TestKey:
        return TestKey(self.name, point)


@dataclass(frozen=True)
class Design:
    """What the verdicts of one study share, all fixed in the preset before any data: the
    trace's equivalence margin (``trace_margin``: a fraction of the reference fork's mean
    trace; the accuracies' margins are each comparison's), how far (nats, the same for every
    fork) outside its measured KL range a fork's target may lie (``limit``; a pair beyond it is
    named and not used), the secondary equivalence reading (``secondary_margin`` points), the
    claims (Holm over these alone) and whether the task has headroom (without it every verdict
    is ``uninformative``)."""

    trace_margin: float
    limit: float
    headroom: bool = True
    points: int = 3  # the checkpoints each fork should have (``probe_points``): a fork with fewer is named
    # the primary family, fixed before the data ("comparison @ point"): Holm over these claims
    # alone; the other comparisons' primary accuracies are a family of their own. Empty: all
    claims: tuple[str, ...] = ()
    secondary_margin: float = 0.35


# ---- estimation at the target KL ----------------------------------------------------------
def comparison_target(kl_a, kl_b) -> float:
    """One target KL for a pair of forks, from their measured KL ranges alone: the middle of
    the ranges' overlap, or where they do not overlap, the middle of the gap between them
    (both forks then extrapolate by half the gap, the least either can).

    Args:
        kl_a: the KLs of one fork's measured checkpoints.
        kl_b: the other fork's.

    Returns:
        the target KL (nats).
    """
    low = max(min(kl_a), min(kl_b))
    high = min(max(kl_a), max(kl_b))
    return (low + high) / 2


def outside(kls, target: float) -> float:
    """How far (nats) ``target`` lies outside the KL range ``kls`` (0 inside it)."""
    return max(0.0, min(kls) - target, target - max(kls))


def at_target(kls, values, target: float) -> float:
    """The least-squares line of ``values`` on ``kls`` (one fork's checkpoints on its stretch)
    evaluated at ``target``; the mean of ``values`` when the KLs do not vary (nothing to fit).
    A line, not an interpolation between the two nearest checkpoints: it reads every
    checkpoint, so its estimate inside the range is less noisy than any one checkpoint's.

    Args:
        kls: the exact KLs of one fork's measured checkpoints.
        values: the quantity at each (an accuracy, a trace).
        target: the KL to estimate it at.

    Returns:
        the estimate (``nan`` without checkpoints).
    """
    if len(kls) == 0:
        return math.nan
    return line(kls, values).at(target)


def column(row: dict, key: str) -> float:
    """A measured number of a model's row; a column the row lacks is an error naming it, and
    a NaN one an error naming the run, the checkpoint and the column (never a silent NaN that
    turns a comparison's mean into NaN and drops its test from Holm's count)."""
    if key not in row or row[key] is None or row[key] == "":
        raise ValueError(f"model {row.get('model', '?')} has no measured column {key!r}: the study measured "
                         "something else (a stale cache or another measure spec); rerun it")
    value = float(row[key])
    if math.isnan(value):
        raise UserError(f"run {row.get('run', row.get('model', '?'))}, checkpoint step {row.get('step', '?')}: "
                        f"{key} is NaN (the measure failed there); remove that checkpoint's measurement and rerun")
    return value


def _forks(rows: list[dict], c: Comparison, point: str) -> dict[tuple[int, str], list[dict]]:
    by: dict[tuple[int, str], list[dict]] = {}
    for r in rows:
        if r["point"] == point and r["fork"] in (c.recipe, c.reference):
            by.setdefault((int(r["seed"]), r["fork"]), []).append(r)
    return by


def estimate_pairs(rows: list[dict], tests: list[tuple[Comparison, str]], quantities: list[str],
                   design: Design) -> list[dict]:
    """Per comparison, fork point (``tests``) and seed where both forks were measured, one
    pair (``_pair``): the target KL, each fork's measured KL range, line and leverage, and
    its estimate at the target of every quantity with the paired difference ``d_<quantity>``
    (the reference's trace from ``reference_trace``: one parameter space for a size
    contrast) and each fork's curvature test; ``used`` False with the ``reason`` beyond the
    limit, ``inside`` whether the target lies inside both ranges (limit 0), ``readable``
    whether both forks have a line at all (no limit)."""
    out = []
    for c, point in tests:
        by = _forks(rows, c, point)
        seeds = sorted({s for s, f in by if (s, c.recipe) in by and (s, c.reference) in by})
        out += [_pair(c, point, seed, by[(seed, c.recipe)], by[(seed, c.reference)], quantities, design)
                for seed in seeds]
    return out


def _unreadable(fork: str, kls: list[float]) -> str:
    """Why a fork has no line to read ('' when it has one)."""
    distinct = len(set(kls))
    return "" if distinct >= 2 else f"{fork} has {distinct} distinct measured KL(s): no line to read at the target"


def _pair(c: Comparison, point: str, seed: int, rec: list[dict], ref: list[dict], quantities: list[str],
          design: Design) -> dict:
    """One pair of ``estimate_pairs`` (its fields are ``pairs.csv``'s columns)."""
    kl_rec, kl_ref = [column(r, "kl") for r in rec], [column(r, "kl") for r in ref]
    target = comparison_target(kl_rec, kl_ref)
    far = max(outside(kl_rec, target), outside(kl_ref, target))
    why = [w for w in (_unreadable(c.recipe, kl_rec), _unreadable(c.reference, kl_ref)) if w]
    readable = not why
    if readable and far > design.limit:
        fork = c.recipe if outside(kl_rec, target) >= outside(kl_ref, target) else c.reference
        why.append(f"{fork} estimated {far:.2e} nats outside its measured KL range (limit {design.limit:.1e} nats)")
    short = [f"{f} has {len(k)} of {design.points} checkpoints" for f, k in ((c.recipe, kl_rec), (c.reference, kl_ref))
             if len(k) < design.points]
    g_rec, g_ref = line(kl_rec, kl_rec), line(kl_ref, kl_ref)  # the KL geometry alone
    gap = max(0.0, max(min(kl_rec), min(kl_ref)) - min(max(kl_rec), max(kl_ref)))
    pair = {"pair": f"{c.name} @ {point}, seed {seed}", "test": str(c.key(point)), "comparison": c.name,
            "point": point, "seed": seed, "recipe": c.recipe, "reference": c.reference, "target": target,
            "recipe_kl_low": min(kl_rec), "recipe_kl_high": max(kl_rec), "recipe_checkpoints": len(rec),
            "reference_kl_low": min(kl_ref), "reference_kl_high": max(kl_ref), "reference_checkpoints": len(ref),
            "recipe_outside": outside(kl_rec, target), "reference_outside": outside(kl_ref, target),
            "max_outside": far, "gap": gap, "used": not why, "inside": readable and far == 0.0,
            "readable": readable, "reason": "; ".join(why), "short": "; ".join(short),
            "recipe_kl_mean": g_rec.kl_mean, "reference_kl_mean": g_ref.kl_mean,
            "leverage": g_rec.leverage(target) + g_ref.leverage(target),
            "leverage_mean": 1 / len(rec) + 1 / len(ref), "rss_df": max(len(rec) - 2, 0) + max(len(ref) - 2, 0)}
    for key in quantities:
        ref_key = c.reference_trace if key == "trace_fisher" else key
        y_rec, y_ref = [column(r, key) for r in rec], [column(r, ref_key) for r in ref]
        a: Line = line(kl_rec, y_rec)
        b: Line = line(kl_ref, y_ref)
        pair[f"recipe_{key}"], pair[f"reference_{key}"] = a.at(target), b.at(target)
        pair[f"d_{key}"] = pair[f"recipe_{key}"] - pair[f"reference_{key}"]
        pair[f"rss_{key}"] = a.rss + b.rss
        pair[f"recipe_curvature_p_{key}"] = curvature_p(kl_rec, y_rec)
        pair[f"reference_curvature_p_{key}"] = curvature_p(kl_ref, y_ref)
    return pair


def used_pairs(pairs: list[dict], c: Comparison, point: str) -> list[dict]:
    return [p for p in pairs if p["comparison"] == c.name and p["point"] == point and _flag(p["used"])]


def _flag(value) -> bool:
    """A pair's yes/no field, from a row or from ``pairs.csv`` read back."""
    return value in (True, "True")


# ---- the paired differences ------------------------------------------------------------------
def _verdict(pd, sign: int, margin: float, design: Design) -> str:
    if not design.headroom:
        return UNINFORMATIVE
    if pd.n < 2:
        return f"no interval: {pd.n} pair(s)"
    return power_verdict(pd, sign, margin)


def holm_counted(pvalues: list[float]) -> list[float]:
    """Holm's adjusted p values over a family fixed before the data: a test without a p value
    (n ≤ 1, no spread) counts in the family's size as p = 1 — it cannot relax the correction
    for the others — and keeps nan."""
    adjusted = holm([p if math.isfinite(p) else 1.0 for p in pvalues])
    return [q if math.isfinite(p) else math.nan for p, q in zip(pvalues, adjusted)]


def differences(pairs: list[dict], tests: list[tuple[Comparison, str]], accuracies: list[tuple[str, str]],
                primary_key: str, design: Design, n_boot: int = 2000) -> list[dict]:
    """Per comparison and fork point (``tests``), the estimate at the target over the used
    pairs (``estimate_pairs``' rows; ``weighted.estimate``) of every accuracy column
    (``(key, what)``, points, the paper's sign; δ the comparison's ``margin``) and of the
    trace (the opposite sign; δ = ``design.trace_margin`` × the reference's mean trace at the
    target), with the same estimate at limit 0 and at no limit beside it (``inside_*``,
    ``all_*``); Holm-adjusted p values — of the detection tests and, apart, of the
    equivalence tests (TOST) — within each family (``_holm_families``), the power of each
    verdict as made and whether it is decided. Returns the rows (``differences.csv``);
    ``n_boot``: the bootstrap intervals' resamples (beside the intervals, never read by a
    verdict: 0 leaves them out)."""
    out = []
    for c, point in tests:
        everyone = [p for p in pairs if p["comparison"] == c.name and p["point"] == point]
        quantities = [(key, what, c.sign, 100.0) for key, what in accuracies]
        one_space = "" if c.reference_trace == "trace_fisher" else f" ({c.reference} embedded: one parameter space)"
        quantities.append(("trace_fisher", f"trace of Hessian (Fisher){one_space}", -c.sign, 1.0))
        for key, what, sign, scale in quantities:
            family = "primary" if key == primary_key else "trace" if key == "trace_fisher" else "secondary"
            row = _difference(c, point, key, everyone, (sign, scale), design, n_boot, len(out))
            row.update(what=what, family=family, holm_family=_holm_family(family, str(c.key(point)), design))
            out.append(row)
    _holm_families(out, design)
    return out


def _holm_family(family: str, test: str, design: Design) -> str:
    if family != "primary":
        return family
    return "primary" if not design.claims else "claims" if test in design.claims else "other comparisons"


def _difference(c: Comparison, point: str, key: str, everyone: list[dict], how: tuple[int, float], design: Design,
                n_boot: int, seed: int) -> dict:
    """One row of ``differences``: the estimate of ``key`` (``how``: the paper's sign and the
    scale to points) over the used pairs, and over the pairs inside both ranges and every
    readable pair beside it."""
    sign, scale = how
    used = [p for p in everyone if _flag(p["used"])]
    est = estimate(fits_of(used, key, scale), n_boot=n_boot, seed=seed)
    if key == "trace_fisher":
        reference_mean = float(np.mean([float(p[f"reference_{key}"]) for p in used])) if used else math.nan
        margin = design.trace_margin * abs(reference_mean)
    else:
        margin = c.margin
    row = {
        "test": f"{c.key(point)}: {key}", "comparison": c.name, "point": point, "recipe": c.recipe,
        "reference": c.reference, "quantity": key, "n_pairs": len(everyone), "n_used": est.n,
        "n_beyond_limit": len(everyone) - len(used), "n_short": sum(bool(p["short"]) for p in everyone),
        "mean": est.mean, "sd": est.sd, "se": est.se, "df": est.df,
        "t_low": est.t_low, "t_high": est.t_high,
        "eq_low": est.eq_low, "eq_high": est.eq_high, "boot_low": est.boot_low, "boot_high": est.boot_high,
        "p_value": est.p_value, "tost_p": est.tost_p(margin), "mde": est.mde, "margin": margin,
        "margin_source": c.margin_source if key != "trace_fisher" else f"{design.trace_margin:g} × the reference's trace",
        "effect": c.planned_effect if key != "trace_fisher" else margin,
        "expected_sign": sign, "pooled": c.pooled, "verdict": _verdict(est, sign, margin, design),
        "extrapolation": est.extrapolation, "tau2": est.tau2, "sigma2": est.sigma2, "limit": design.limit,
        "max_outside": max((float(p["max_outside"]) for p in used), default=math.nan)}
    if key != "trace_fisher":
        row.update(secondary_margin=design.secondary_margin, secondary_tost_p=est.tost_p(design.secondary_margin),
                   secondary_verdict=_verdict(est, sign, design.secondary_margin, design))
    for tag, chosen in (("inside", [p for p in everyone if _flag(p["inside"])]),
                        ("all", [p for p in everyone if _flag(p["readable"])])):
        other = estimate(fits_of(chosen, key, scale))
        row.update({f"{tag}_n": other.n, f"{tag}_mean": other.mean, f"{tag}_low": other.t_low,
                    f"{tag}_high": other.t_high, f"{tag}_verdict": _verdict(other, sign, margin, design)})
    row.update(_curvature(used, key))
    return row


def _curvature(used: list[dict], key: str) -> dict:
    """The curvature tests of the used pairs' forks (4 or more checkpoints each): how many
    were tested and rejected linearity at 0.05, and Fisher's combination of their p values
    (a fork shared by two pairs is counted once)."""
    by_fork: dict[tuple, float] = {}
    for p in used:
        for side in ("recipe", "reference"):
            q = float(p[f"{side}_curvature_p_{key}"])
            if math.isfinite(q):
                by_fork[(p["seed"], p[side])] = q
    values = list(by_fork.values())
    combined = float(combine_pvalues(np.clip(values, 1e-300, 1.0), method="fisher").pvalue) if values else math.nan
    return {"curvature_tested": len(values), "curvature_rejected": sum(q < 0.05 for q in values),
            "curvature_p": combined}


def _holm_families(out: list[dict], design: Design) -> None:
    """Holm within each family (``holm_family``; its size m counts every test of it, those
    without a p value too), and per row the power of the verdict as made at Holm's first step
    α/m (a lower bound of Holm's power): against the margin (``power_detect``; and against the
    planned ``effect``, ``power_effect``), TOST's at a true 0 (``power_equivalence``), ``power``
    the one the verdict claims (a detection's: at the planned effect, which is the margin but for
    a positive control); ``decided``: a detection or a "no effect" that survives Holm."""
    for family in dict.fromkeys(r["holm_family"] for r in out):
        members = [r for r in out if r["holm_family"] == family]
        m = len(members)
        alpha = HOLM_LEVEL / m
        holms = zip(holm_counted([r["p_value"] for r in members]), holm_counted([r["tost_p"] for r in members]),
                    holm_counted([r.get("secondary_tost_p", math.nan) for r in members]))
        for r, (q, qe, qs) in zip(members, holms):
            r["holm_p"], r["tost_holm_p"], r["holm_m"] = q, qe, m
            r["after_holm"] = after_holm(r["verdict"], q, qe)
            r["decided"] = r["after_holm"] == "survives"
            if "secondary_verdict" in r:
                r["secondary_after_holm"] = after_holm(r["secondary_verdict"], q, qs)
            ok = r["n_used"] >= 2 and r["se"] > 0 and math.isfinite(r["margin"])
            r["power_detect"] = t_test_power(r["margin"] / r["se"], r["df"], 1 - alpha) if ok else math.nan
            r["power_effect"] = t_test_power(r["effect"] / r["se"], r["df"], 1 - alpha) if ok else math.nan
            r["power_equivalence"] = tost_power(r["margin"], r["se"], r["df"], alpha) if ok else math.nan
            # a detection's power is to detect the effect it was planned for: the margin, or a positive
            # control's planned effect (its margin is no effect anyone expects of it)
            r["power"] = r["power_equivalence"] if r["verdict"] == EQUIVALENT else r["power_effect"]
            r["holm_mde"] = noncentral_mde(r["se"], r["df"], 1 - alpha) if ok else math.nan


def after_holm(verdict: str, holm_p: float, tost_holm_p: float) -> str:
    """Whether a detection (its two-sided test) or an equivalence (its TOST) survives Holm's
    correction within its family."""
    if verdict in (DETECTED, DETECTED_AGAINST):
        return "survives" if holm_p <= HOLM_LEVEL else "does not survive"
    if verdict == EQUIVALENT:
        return "survives" if tost_holm_p <= HOLM_LEVEL else "does not survive"
    return ""


# ---- the dose: the effect at one fork point minus at another ---------------------------------
def dose(pairs: list[dict], comparisons: list[Comparison], points: tuple[str, str], key: str,
         design: Design) -> list[dict]:
    """Does the effect grow with how long the recipe acts? Per comparison, the paired
    difference at the target at ``points[1]`` minus at ``points[0]`` per seed (the seeds
    whose pairs are used at both), with its interval; Holm over the comparisons."""
    out = []
    for c in comparisons:
        per_point = [{p["seed"]: 100.0 * p[f"d_{key}"] for p in used_pairs(pairs, c, point)} for point in points]
        common = sorted(set(per_point[0]) & set(per_point[1]))
        pd = paired_difference([per_point[1][s] - per_point[0][s] for s in common], seed=len(out))
        out.append({"test": f"{c.name}: {points[1]} − {points[0]}", "comparison": c.name, "n_seeds": pd.n,
                    "at_first": float(np.mean([per_point[0][s] for s in common])) if common else math.nan,
                    "at_second": float(np.mean([per_point[1][s] for s in common])) if common else math.nan,
                    "mean": pd.mean, "t_low": pd.t_low, "t_high": pd.t_high, "sd": pd.sd, "mde": pd.mde,
                    "p_value": pd.p_value, "tost_p": pd.tost_p(c.margin), "margin": c.margin,
                    "verdict": _verdict(pd, c.sign, c.margin, design)})
    for r, q, qe in zip(out, holm_counted([r["p_value"] for r in out]), holm_counted([r["tost_p"] for r in out])):
        r["holm_p"], r["tost_holm_p"] = q, qe
        r["after_holm"] = after_holm(r["verdict"], q, qe)
    return out


# ---- Fig. 1 within seeds -----------------------------------------------------------------
def fork_means(rows: list[dict], key: str, point: str, without: tuple[str, ...]) -> list[dict]:
    """One row per seed and fork at fork point ``point`` (without the forks ``without``):
    the means over its measured checkpoints of the accuracy ``key`` (points), the trace and
    the KL (what Fig. 1 within seeds regresses and draws)."""
    by: dict[tuple[int, str], list[dict]] = {}
    for r in rows:
        if r["point"] == point and r["fork"] not in without:
            by.setdefault((int(r["seed"]), r["fork"]), []).append(r)
    return [{"seed": s, "fork": f, "acc": float(np.mean([100 * column(r, key) for r in rs])),
             "trace": float(np.mean([column(r, "trace_fisher") for r in rs])),
             "kl": float(np.mean([column(r, "kl") for r in rs]))} for (s, f), rs in sorted(by.items())]


def regression(rows: list[dict], key: str, point: str, without: tuple[str, ...], design: Design) -> list[dict]:
    """Fig. 1 within seeds at one fork point: the primary accuracy (points) regressed on the
    trace and the KL (per 0.001 nats) with seed fixed effects (cluster bootstrap over
    seeds), one row per fork (``fork_means``: its checkpoints' means) of one size and
    without the forks ``without`` (an objective aimed at the task: its accuracy loss is by
    construction, not through flatness). An observational slope: no equivalence margin is
    fixed for it, so it is detected or inconclusive, never "no effect"."""
    out = []
    models = [m for m in fork_means(rows, key, point, without) if math.isfinite(m["trace"])]
    y = np.array([m["acc"] for m in models])
    X = np.array([[m["trace"], 1000 * m["kl"]] for m in models])
    seeds = np.array([m["seed"] for m in models])
    n_seeds = len(set(seeds.tolist()))
    if n_seeds < 2:
        return out
    ivs = cluster_bootstrap_ols(y, X, seeds, n_boot=2000, seed=0)
    for what, iv in zip(("per unit of trace", "per 0.001 nats of KL"), ivs):
        verdict, mde = interval_power(iv, max(n_seeds - 1, 1), -1)
        out.append({"coefficient": f"{point}: accuracy (pts) {what}", "point": point, "estimate": iv.estimate,
                    "low": iv.low, "high": iv.high, "mde": mde, "n_models": len(models), "n_seeds": n_seeds,
                    "verdict": verdict if design.headroom else UNINFORMATIVE, "without": ", ".join(without)})
    return out


__all__ = ["Comparison", "Design", "HOLM_LEVEL", "TestKey", "UNINFORMATIVE", "after_holm", "at_target", "column",
           "comparison_target", "differences", "dose", "estimate_pairs", "fork_means", "holm_counted", "outside",
           "regression", "tost_p", "used_pairs"]
