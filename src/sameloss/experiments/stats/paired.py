"""Paired fork designs (``isoloss``): forks of one base run per seed — at one or more fork
points (a late fork continues the base; a fork at step 0 trains the recipe from the same
initial weights) — compared at one exact KL, differences paired across seeds.

* estimation at the target (``comparison_target``, ``at_target``, ``estimate_pairs``):
  each fork is measured at several checkpoints of its stretch at the final learning rate
  (one lr factor for all); per comparison and seed one target KL, chosen from the two
  forks' measured KL ranges alone (the middle of their overlap, or of the gap between
  them); each fork's accuracy and trace are estimated *at* that target by the
  least-squares line of the quantity on KL through its own checkpoints, with the line's
  leverage there (what the KL positions alone say of the estimate's variance). Every pair
  is used unless a fork's target lies more than ``Design.limit`` × its own measured KL range
  outside that range, or a fork has fewer than two distinct KLs — such a pair is named
  with its reason, never dropped silently; a fork with fewer than ``Design.points``
  checkpoints is named. (Selecting the pairs whose forks happened to land near each other
  would condition on a post-treatment variable: a SAM fork's KL floor sits above the
  others'.)
* the report: ``differences`` (per comparison, fork point and quantity: the
  precision-weighted estimate over the used pairs — ``weighted.estimate``: weights from
  the KL positions, random effects with the HKSJ interval, a common KL slope where the
  ranges touch and the slopes test equal — its MDE, the power of the claim after Holm, the
  share of its variance that is extrapolation, raw and Holm p values per family with the
  primary family the preset's claims, equivalence by TOST against a margin fixed in the
  preset; beside it the sensitivity row that keeps only the pairs whose KL ranges lie
  within the tolerance, a plain paired t test), ``dose`` (the effect at one fork point minus
  at another, paired by seed) and ``regression`` (accuracy on trace and KL within seeds,
  cluster bootstrap). The dose-response of the flatness forks is ``dose_response.py``'s, the
  replication across languages ``replication.py``'s.

A model's row (one probed checkpoint) has ``run``, ``step``, ``seed``, ``point`` (its fork
point's name), ``fork``, ``kl`` (its exact KL on the shared held-out set), ``trace_fisher``
and the accuracy columns (fractions; shown in points).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ...errors import UserError
from ..reports.claims import fmt
from ..reports.document import Claim, Column, Section, Table
from .inference import (DEGENERATE, DETECTED, DETECTED_AGAINST, EQUIVALENT, INCONCLUSIVE, cluster_bootstrap_ols,
    holm, interval_power, noncentral_mde, paired_difference, power_verdict)
from .weighted import Line, estimate, fits_of, line

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


@dataclass(frozen=True)
class Design:
    """What the verdicts of one study share, all fixed in the preset before any data: the
    equivalence margins (``margin``: points of accuracy; ``trace_margin``: a fraction of the
    reference fork's mean trace), how far outside its measured KL range a fork's target may
    lie (``limit``: a multiple of that fork's own range; a pair beyond it is named and not
    used), the tolerance of the exclusion sensitivity row (``tolerance``, nats: only the
    pairs whose forks' KL ranges lie at most this far apart) and whether the task has
    headroom (without it every verdict is ``uninformative``)."""

    margin: float
    trace_margin: float
    limit: float
    tolerance: float
    headroom: bool = True
    # an adaptive study's pilot seeds (``allocation``): a test over more seeds than these is
    # Stein's two-stage test, its spread from them alone (``weighted.estimate``)
    pilot: tuple[int, ...] = ()
    points: int = 3  # the checkpoints each fork should have (``probe_points``): a fork with fewer is named
    # the primary family, fixed before the data ("comparison @ point"): Holm over these claims
    # alone; the other comparisons' primary accuracies are a family of their own. Empty: all
    claims: tuple[str, ...] = ()
    # the fork × KL model (a KL slope common to both forks): only where every pair's forks'
    # ranges lie at most ``borrow_gap`` × the smaller range apart, and a test of equal slopes
    # does not reject at ``slope_level``
    borrow_gap: float = 0.25
    slope_level: float = 0.2
    # the dose-response: pairs whose relative trace change is under this are named and left out
    dose_floor: float = 0.05


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
    contrast); ``used`` False with the ``reason`` beyond the limit."""
    out = []
    for c, point in tests:
        by = _forks(rows, c, point)
        seeds = sorted({s for s, f in by if (s, c.recipe) in by and (s, c.reference) in by})
        out += [_pair(c, point, seed, by[(seed, c.recipe)], by[(seed, c.reference)], quantities, design)
                for seed in seeds]
    return out


def _beyond(fork: str, kls: list[float], target: float, design: Design) -> str:
    """Why a fork's line cannot be read at ``target`` ('' when it can)."""
    if len(set(kls)) < 2:
        return f"{fork} has {len(set(kls))} distinct measured KL(s): no line to read at the target"
    far, width = outside(kls, target), max(kls) - min(kls)
    if far > design.limit * width:
        return (f"{fork} estimated {far:.2e} nats outside its measured KL range ({width:.2e} wide; limit "
                f"{design.limit:g} × its range)")
    return ""


def _pair(c: Comparison, point: str, seed: int, rec: list[dict], ref: list[dict], quantities: list[str],
          design: Design) -> dict:
    """One pair of ``estimate_pairs`` (its fields are ``pairs.csv``'s columns)."""
    kl_rec, kl_ref = [column(r, "kl") for r in rec], [column(r, "kl") for r in ref]
    target = comparison_target(kl_rec, kl_ref)
    why = [w for w in (_beyond(c.recipe, kl_rec, target, design), _beyond(c.reference, kl_ref, target, design)) if w]
    short = [f"{f} has {len(k)} of {design.points} checkpoints" for f, k in ((c.recipe, kl_rec), (c.reference, kl_ref))
             if len(k) < design.points]
    g_rec, g_ref = line(kl_rec, kl_rec), line(kl_ref, kl_ref)  # the KL geometry alone
    gap = max(0.0, max(min(kl_rec), min(kl_ref)) - min(max(kl_rec), max(kl_ref)))
    narrow = min(max(kl_rec) - min(kl_rec), max(kl_ref) - min(kl_ref))
    pair = {"pair": f"{c.name} @ {point}, seed {seed}", "test": f"{c.name} @ {point}", "comparison": c.name,
            "point": point, "seed": seed, "recipe": c.recipe, "reference": c.reference, "target": target,
            "recipe_kl_low": min(kl_rec), "recipe_kl_high": max(kl_rec), "recipe_checkpoints": len(rec),
            "reference_kl_low": min(kl_ref), "reference_kl_high": max(kl_ref), "reference_checkpoints": len(ref),
            "recipe_outside": outside(kl_rec, target), "reference_outside": outside(kl_ref, target), "gap": gap,
            "used": not why, "reason": "; ".join(why), "short": "; ".join(short),
            "recipe_kl_mean": g_rec.kl_mean, "reference_kl_mean": g_ref.kl_mean, "recipe_sxx": g_rec.sxx,
            "reference_sxx": g_ref.sxx, "leverage": g_rec.leverage(target) + g_ref.leverage(target),
            "leverage_mean": 1 / len(rec) + 1 / len(ref), "rss_df": max(len(rec) - 2, 0) + max(len(ref) - 2, 0),
            "touching": gap <= design.borrow_gap * narrow}
    pair["within_tolerance"] = gap <= design.tolerance
    for key in quantities:
        ref_key = c.reference_trace if key == "trace_fisher" else key
        a: Line = line(kl_rec, [column(r, key) for r in rec])
        b: Line = line(kl_ref, [column(r, ref_key) for r in ref])
        pair[f"recipe_{key}"], pair[f"reference_{key}"] = a.at(target), b.at(target)
        pair[f"d_{key}"] = pair[f"recipe_{key}"] - pair[f"reference_{key}"]
        pair[f"recipe_slope_{key}"], pair[f"reference_slope_{key}"] = a.slope, b.slope
        pair[f"rss_{key}"] = a.rss + b.rss
    return pair


def used_pairs(pairs: list[dict], c: Comparison, point: str) -> list[dict]:
    return [p for p in pairs if p["comparison"] == c.name and p["point"] == point and p["used"]]


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
    (``(key, what)``, points, the paper's sign; δ = ``design.margin``) and of the trace (the
    opposite sign; δ = ``design.trace_margin`` × the reference's mean trace at the target),
    with the exclusion sensitivity beside each (only the pairs within the tolerance, a plain
    paired t test: ``tol_*``); Holm-adjusted p values — of the detection tests and, apart, of
    the equivalence tests (TOST) — within each family (``_holm_families``), and the power of
    each claim as made. Returns the rows (``differences.csv``); ``n_boot``: the bootstrap
    intervals' resamples (beside the intervals, never read by a verdict: 0 leaves them out)."""
    out = []
    for c, point in tests:
        everyone = [p for p in pairs if p["comparison"] == c.name and p["point"] == point]
        quantities = [(key, what, c.sign, 100.0) for key, what in accuracies]
        one_space = "" if c.reference_trace == "trace_fisher" else f" ({c.reference} embedded: one parameter space)"
        quantities.append(("trace_fisher", f"trace of Hessian (Fisher){one_space}", -c.sign, 1.0))
        for key, what, sign, scale in quantities:
            family = "primary" if key == primary_key else "trace" if key == "trace_fisher" else "secondary"
            row = _difference(c, point, key, everyone, (sign, scale), design, n_boot, len(out))
            row.update(what=what, family=family, holm_family=_holm_family(family, f"{c.name} @ {point}", design))
            out.append(row)
    _holm_families(out)
    return out


def _holm_family(family: str, test: str, design: Design) -> str:
    if family != "primary":
        return family
    return "primary" if not design.claims else "claims" if test in design.claims else "other comparisons"


def _difference(c: Comparison, point: str, key: str, everyone: list[dict], how: tuple[int, float], design: Design,
                n_boot: int, seed: int) -> dict:
    """One row of ``differences``: the estimate of ``key`` (``how``: the paper's sign and the
    scale to points) over the used pairs and the sensitivity over those within the tolerance."""
    sign, scale = how
    used = [p for p in everyone if p["used"]]
    within = [p for p in used if p["within_tolerance"]]
    est = estimate(fits_of(used, key, scale, design.pilot), design.slope_level, stein=bool(design.pilot),
                   n_boot=n_boot, seed=seed)
    tol = paired_difference([scale * p[f"d_{key}"] for p in within], seed=seed, n_boot=0,
                            pilot=_pilot_part(within, key, scale, design))
    if key == "trace_fisher":
        reference_mean = float(np.mean([p[f"reference_{key}"] for p in used])) if used else math.nan
        margin = design.trace_margin * abs(reference_mean)
    else:
        margin = design.margin
    return {
        "test": f"{c.name} @ {point}: {key}", "comparison": c.name, "point": point, "recipe": c.recipe,
        "reference": c.reference, "quantity": key, "n_pairs": len(everyone), "n_used": est.n,
        "n_beyond_limit": len(everyone) - len(used), "n_short": sum(bool(p["short"]) for p in everyone),
        "mean": est.mean, "sd": est.sd, "se": est.se, "df": est.df, "pilot_pairs": est.pilot_pairs,
        "t_low": est.t_low, "t_high": est.t_high,
        "eq_low": est.eq_low, "eq_high": est.eq_high, "boot_low": est.boot_low, "boot_high": est.boot_high,
        "p_value": est.p_value, "tost_p": est.tost_p(margin), "mde": est.mde, "margin": margin,
        "expected_sign": sign, "verdict": _verdict(est, sign, margin, design), "estimator": est.model,
        "slope_p": est.slope_p, "extrapolation": est.extrapolation, "tau2": est.tau2, "sigma2": est.sigma2,
        "max_outside": max((max(p["recipe_outside"], p["reference_outside"]) for p in used), default=math.nan),
        "tol_n": tol.n, "tol_mean": tol.mean, "tol_low": tol.t_low, "tol_high": tol.t_high, "tol_mde": tol.mde,
        "tol_verdict": _verdict(tol, sign, margin, design)}


def _holm_families(out: list[dict]) -> None:
    """Holm within each family (``holm_family``; its size m counts every test of it, those
    without a p value too), and per row the power of the claim as made: the two-sided test's
    power against δ at Holm's first step α/m (a lower bound of Holm's power) and the MDE there."""
    from .inference import t_test_power

    for family in dict.fromkeys(r["holm_family"] for r in out):
        members = [r for r in out if r["holm_family"] == family]
        m = len(members)
        alpha = HOLM_LEVEL / m
        holms = zip(holm_counted([r["p_value"] for r in members]), holm_counted([r["tost_p"] for r in members]))
        for r, (q, qe) in zip(members, holms):
            r["holm_p"], r["tost_holm_p"], r["holm_m"] = q, qe, m
            r["after_holm"] = after_holm(r["verdict"], q, qe)
            ok = r["n_used"] >= 2 and r["se"] > 0 and math.isfinite(r["margin"])
            r["power"] = t_test_power(r["margin"] / r["se"], r["df"], 1 - alpha) if ok else math.nan
            r["holm_mde"] = noncentral_mde(r["se"], r["df"], 1 - alpha) if ok else math.nan


def _pilot_part(pairs: list[dict], key: str, scale: float, design: Design) -> list[float] | None:
    """The differences of the pilot's seeds among ``pairs`` (an adaptive study), else None."""
    if not design.pilot:
        return None
    return [scale * p[f"d_{key}"] for p in pairs if p["seed"] in design.pilot]


def after_holm(verdict: str, holm_p: float, tost_holm_p: float) -> str:
    """Whether a detection (its two-sided test) or an equivalence (its TOST) survives Holm's
    correction within its family."""
    if verdict in (DETECTED, DETECTED_AGAINST):
        return "survives" if holm_p <= HOLM_LEVEL else "does not survive"
    if verdict == EQUIVALENT:
        return "survives" if tost_holm_p <= HOLM_LEVEL else "does not survive"
    return ""


HOLM_FAMILIES = ("Holm's correction is applied within each family separately — the primary family (the claims "
                 "fixed in the preset before the data; the other comparisons' primary accuracies are a family of their "
                 "own), the traces, the secondary accuracies — once to the detection tests' p values and once to the "
                 "equivalence tests' (TOST) p values; a family's size counts every test in it, those without a p "
                 "value (n ≤ 1) too; the dose tests are a family of their own, and so are the flatness forks' "
                 "dose-response slopes (over the fork points); the Fig. 1 regression and the sensitivity rows are "
                 "not corrected. The power of a claim as made is its test's power against δ at Holm's first step "
                 "(α/m: a lower bound of Holm's).")


def difference_tables(section: Section, out: list[dict], comparisons: dict[str, Comparison]) -> None:
    """The tables and claims of ``differences``' rows: the primary accuracy and the trace
    (with the exclusion sensitivity beside them), then the secondary endpoints."""
    section.files["differences.csv"] = out
    shown = [r for r in out if r["family"] in ("primary", "trace")]
    section.tables.append(Table(
        "Paired differences (recipe − reference) at the target KL across seeds, every pair used unless a fork's "
        "target lies beyond the limit: primary probe (points) and trace; the precision-weighted estimate (weights "
        "from the pairs' KL positions, random effects) with its 95% HKSJ interval and a bootstrap interval beside it, "
        "the 90% interval of the equivalence test (TOST), p raw and Holm-adjusted within each family, the power "
        "against δ after Holm, the share of the estimate's variance that is extrapolation, and the model (a line "
        "per fork, or a common KL slope where the ranges touch and the slopes test equal: its test's p); beside it "
        "the exclusion sensitivity (only the pairs whose KL ranges lie within the tolerance, a plain paired t test)", [
            Column("used", "n_used", fmt="d"), Column("beyond limit", "n_beyond_limit", fmt="d"),
            Column("estimate [HKSJ 95%]", "mean", ci=("t_low", "t_high"), fmt=".3g"),
            Column("bootstrap 95%", "boot_low", fmt=".3g"), Column("to", "boot_high", fmt=".3g"),
            Column("90% (TOST)", "eq_low", fmt=".3g"), Column("to ", "eq_high", fmt=".3g"),
            Column("effective SD", "sd", fmt=".3g"), Column("MDE 80%", "mde", fmt=".3g"),
            Column("δ", "margin", fmt=".3g"), Column("p", "p_value", fmt=".3g"),
            Column("Holm family", "holm_family", text=True), Column("p Holm", "holm_p", fmt=".3g"),
            Column("TOST p Holm", "tost_holm_p", fmt=".3g"), Column("power at δ after Holm", "power", fmt=".2f"),
            Column("extrapolation share", "extrapolation", fmt=".2f"), Column("model", "estimator", text=True),
            Column("equal slopes p", "slope_p", fmt=".2g"),
            Column("max outside (nats)", "max_outside", fmt=".2e"), Column("verdict", "verdict", text=True),
            Column("after Holm", "after_holm", text=True), Column("within tolerance", "tol_n", fmt="d"),
            Column("their mean [t 95%]", "tol_mean", ci=("tol_low", "tol_high"), fmt=".3g"),
            Column("their verdict", "tol_verdict", text=True)],
        shown, source="differences.csv", key="test", key_header="comparison @ fork point"))
    for r in shown:
        section.claims.append(Claim(comparisons[r["comparison"]].paper, _claim_text(r, comparisons), r["verdict"]))
    _secondary(section, out)


def _claim_text(r: dict, comparisons: dict[str, Comparison]) -> str:
    c = comparisons[r["comparison"]]
    unit = " pts" if r["family"] == "primary" else ""
    holm_note = f", Holm p {fmt(r['holm_p'])}" + (f" ({r['after_holm']})" if r["after_holm"] else "")
    return (f"{c.recipe} − {c.reference} forked at {r['point']}, {r['what']}, at the target KL, over {r['n_used']} "
            f"seeds ({r['n_beyond_limit']} beyond the extrapolation limit; {r['estimator']}): {fmt(r['mean'])}{unit}, "
            f"95% HKSJ interval [{fmt(r['t_low'])}, {fmt(r['t_high'])}], MDE (80% power) {fmt(r['mde'])}{unit}, "
            f"δ {fmt(r['margin'])}{unit}, p {fmt(r['p_value'])}{holm_note}; in the {r['holm_family']} family of "
            f"{r['holm_m']} its power against δ after Holm is {fmt(r['power'], '.2f')}; "
            f"{_share(r['extrapolation'])} of its variance is extrapolation (estimates at most "
            f"{fmt(r['max_outside'])} nats outside a fork's measured KL range). Only the {r['tol_n']} pairs within "
            f"the KL tolerance: {fmt(r['tol_mean'])}{unit} [{fmt(r['tol_low'])}, {fmt(r['tol_high'])}].")


def _share(x: float) -> str:
    return f"{x:.0%}" if math.isfinite(x) else "an unknown share (no checkpoint noise measured)"


def _secondary(section: Section, out: list[dict]) -> None:
    secondary = [r for r in out if r["family"] == "secondary"]
    section.tables.append(Table(
        "Secondary endpoints (other probe sizes, the AdamW probe, the all-positions probe): paired differences in "
        "points at the target KL over the used pairs (the weighted estimate); Holm within the secondary family",
        [Column("estimate [HKSJ 95%]", "mean", ci=("t_low", "t_high"), fmt=".3g"), Column("MDE", "mde", fmt=".3g"),
         Column("p Holm", "holm_p", fmt=".3g"), Column("verdict", "verdict", text=True),
         Column("after Holm", "after_holm", text=True)],
        secondary, source="differences.csv", key="test", key_header="comparison @ fork point"))
    counts = {v: sum(r["verdict"] == v for r in secondary) for v in (DETECTED, DETECTED_AGAINST, EQUIVALENT,
                                                                      INCONCLUSIVE, DEGENERATE, UNINFORMATIVE)}
    counts["no interval"] = sum(r["verdict"].startswith("no interval") for r in secondary)
    survive = sum(r["after_holm"] == "survives" for r in secondary)
    section.notes.append(f"Secondary endpoints ({len(secondary)} tests): "
                         + ", ".join(f"{k}: {v}" for k, v in counts.items() if v)
                         + f"; {survive} verdicts survive Holm's correction within the family.")


def pairs_table(section: Section, pairs: list[dict], primary_key: str) -> None:
    """The estimation table: per pair its target, each fork's measured KL range and how far
    outside it its estimate lies, the lines' leverage at the target, the estimates and
    whether the pair is used (the reason when not); the notes name the pairs not used and the
    forks with fewer checkpoints than planned."""
    section.files["pairs.csv"] = pairs
    section.tables.append(Table(
        "Estimation at the target KL, per pair (comparison, fork point, seed): the target (from the two forks' "
        "measured KL ranges alone), each fork's measured range, how far (nats) each fork's estimate lies outside "
        "it, the leverage of the forks' lines at the target (the difference's variance in units of the checkpoint "
        "noise: Σ 1/m + (t − x̄)²/Sxx, from the KLs alone), the primary accuracy (points) and trace estimated at "
        "the target, and whether the pair is used",
        [Column("target KL", "target", fmt=".5f"),
         Column("recipe KL from", "recipe_kl_low", fmt=".5f"), Column("to", "recipe_kl_high", fmt=".5f"),
         Column("reference KL from", "reference_kl_low", fmt=".5f"), Column("to ", "reference_kl_high", fmt=".5f"),
         Column("recipe outside", "recipe_outside", fmt=".2e"),
         Column("reference outside", "reference_outside", fmt=".2e"), Column("leverage", "leverage", fmt=".3g"),
         Column("recipe acc (%)", f"recipe_{primary_key}", scale=100, fmt=".2f"),
         Column("reference acc (%)", f"reference_{primary_key}", scale=100, fmt=".2f"),
         Column("recipe tr(H)", "recipe_trace_fisher", fmt=".4g"),
         Column("reference tr(H)", "reference_trace_fisher", fmt=".4g"),
         Column("within tolerance", "within_tolerance", text=True), Column("used", "used", text=True),
         Column("why not", "reason", text=True)],
        pairs, source="pairs.csv", key="pair", key_header="pair"))
    beyond = [p for p in pairs if not p["used"]]
    short = [p for p in pairs if p["short"]]
    section.notes.append(
        f"Estimation at the target: {len(pairs) - len(beyond)} of {len(pairs)} pairs used; "
        + ("none lies beyond the extrapolation limit." if not beyond else
           "not used (beyond the extrapolation limit): " + "; ".join(f"{p['test']}, seed {p['seed']}: {p['reason']}"
                                                                     for p in beyond) + ".")
        + ("" if not short else " Forks with fewer checkpoints than planned: "
           + "; ".join(f"{p['test']}, seed {p['seed']}: {p['short']}" for p in short) + "."))


def dose(section: Section, pairs: list[dict], comparisons: list[Comparison], points: tuple[str, str], key: str,
         design: Design) -> list[dict]:
    """Does the effect grow with how long the recipe acts? Per comparison, the paired
    difference at the target at ``points[1]`` minus at ``points[0]`` per seed (the seeds
    whose pairs are used at both), with its interval; Holm over the comparisons."""
    out = []
    for c in comparisons:
        per_point = [{p["seed"]: 100.0 * p[f"d_{key}"] for p in used_pairs(pairs, c, point)} for point in points]
        common = sorted(set(per_point[0]) & set(per_point[1]))
        pilot = [per_point[1][s] - per_point[0][s] for s in common if s in design.pilot] if design.pilot else None
        pd = paired_difference([per_point[1][s] - per_point[0][s] for s in common], seed=len(out), pilot=pilot)
        out.append({"test": f"{c.name}: {points[1]} − {points[0]}", "comparison": c.name, "n_seeds": pd.n,
                    "at_first": float(np.mean([per_point[0][s] for s in common])) if common else math.nan,
                    "at_second": float(np.mean([per_point[1][s] for s in common])) if common else math.nan,
                    "mean": pd.mean, "t_low": pd.t_low, "t_high": pd.t_high, "sd": pd.sd, "mde": pd.mde,
                    "p_value": pd.p_value, "tost_p": pd.tost_p(design.margin),
                    "verdict": _verdict(pd, c.sign, design.margin, design)})
    for r, q, qe in zip(out, holm_counted([r["p_value"] for r in out]), holm_counted([r["tost_p"] for r in out])):
        r["holm_p"], r["tost_holm_p"] = q, qe
        r["after_holm"] = after_holm(r["verdict"], q, qe)
    section.files["dose.csv"] = out
    section.tables.append(Table(
        f"Dose: the primary difference at the target KL (points) with the recipe acting from {points[1]} minus "
        f"acting from {points[0]}, per seed (the seeds whose pairs are used at both); positive = the effect grows "
        "in the paper's direction when its sign is +, shrinks when −; Holm over the comparisons",
        [Column("seeds", "n_seeds", fmt="d"), Column(f"at {points[0]}", "at_first", fmt=".3g"),
         Column(f"at {points[1]}", "at_second", fmt=".3g"),
         Column("difference [t 95%]", "mean", ci=("t_low", "t_high"), fmt=".3g"), Column("MDE", "mde", fmt=".3g"),
         Column("p Holm", "holm_p", fmt=".3g"), Column("verdict", "verdict", text=True),
         Column("after Holm", "after_holm", text=True)],
        out, source="dose.csv", key="test", key_header="comparison"))
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


def regression(section: Section, rows: list[dict], key: str, point: str, without: tuple[str, ...],
               design: Design) -> list[dict]:
    """Fig. 1 within seeds at one fork point: the primary accuracy (points) regressed on the
    trace and the KL (per 0.001 nats) with seed fixed effects (cluster bootstrap over
    seeds), one row per fork (``fork_means``: its checkpoints' means) of one size and
    without the forks ``without`` (an objective aimed at the task: its accuracy loss is by
    construction, not through flatness). No equivalence margin is fixed for a slope, so a
    slope is detected or inconclusive, never "no effect"."""
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
                    "verdict": verdict if design.headroom else UNINFORMATIVE})
    tr = out[0]
    section.claims.append(Claim(
        "at the same loss, flatter models transfer better (Fig. 1): a negative slope of accuracy on the trace.",
        f"within seeds at fork point {point}, holding KL fixed (one model size, without {', '.join(without)}; "
        f"{tr['n_models']} forks, each the mean of its measured checkpoints): {fmt(tr['estimate'])} pts per unit of "
        f"trace, 95% cluster-bootstrap interval [{fmt(tr['low'])}, {fmt(tr['high'])}] over {tr['n_seeds']} seeds "
        f"(MDE {fmt(tr['mde'])}).", tr["verdict"]))
    return out
