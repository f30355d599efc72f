"""Paired fork designs (``isoloss``): forks of one base run per seed — at one or more fork
points (a late fork continues the base; a fork at step 0 trains the recipe from the same
initial weights) — compared at one exact KL, differences paired across seeds.

* estimation at the target (``comparison_target``, ``at_target``, ``estimate_pairs``):
  each fork is measured at several checkpoints of its stretch at the final learning rate
  (one lr factor for all); per comparison and seed one target KL, chosen from the two
  forks' measured KL ranges alone (the middle of their overlap, or of the gap between
  them); each fork's accuracy and trace are estimated *at* that target by the
  least-squares line of the quantity on KL through its own checkpoints. Every pair is
  used unless a fork's estimate lies more than a stated limit outside its measured KL
  range — such a pair is named with its reason, never dropped silently. (Selecting the
  pairs whose forks happened to land near each other would condition on a
  post-treatment variable: a SAM fork's KL floor sits above the others'.)
* the report: ``differences`` (per comparison, fork point and quantity: the paired
  differences over the used pairs, t and bootstrap intervals, the noncentral-t MDE, raw
  and Holm p values per family, equivalence by TOST against a margin fixed in the preset;
  beside it the sensitivity row that excludes the pairs whose KL ranges lie more than the
  tolerance apart), ``dose`` (the effect at one fork point minus at another, paired by
  seed), ``regression`` (accuracy on trace and KL within seeds, cluster bootstrap),
  ``replication`` (one comparison on several languages: which way it replicates, and the
  random-effects pooled estimate with the Hartung–Knapp–Sidik–Jonkman interval) and
  ``dose_response`` (flatness as the treatment: the paired accuracy difference per unit of
  relative trace change over forks trained with a trace penalty, within seeds).

A model's row (one probed checkpoint) has ``seed``, ``point`` (its fork point's name),
``fork``, ``kl`` (its exact KL on the shared held-out set), ``trace_fisher`` and the
accuracy columns (fractions; shown in points).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .claims import fmt
from .report import Claim, Column, Section, Table
from .stats import (DEGENERATE, DETECTED, DETECTED_AGAINST, EQUIVALENT, INCONCLUSIVE,
                    cluster_bootstrap_ols, holm, interval_power, paired_difference, power_verdict)

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
    reference fork's mean trace), how far outside its measured KL range a fork's estimate
    may lie (``limit``, nats; a pair beyond it is named and not used), the tolerance of the
    exclusion sensitivity row (``tolerance``, nats: only the pairs whose forks' KL ranges lie
    at most this far apart) and whether the task has headroom (without it every verdict is
    ``uninformative``)."""

    margin: float
    trace_margin: float
    limit: float
    tolerance: float
    headroom: bool = True
    # an adaptive study's pilot seeds (``allocation``): a test over more seeds than these is
    # Stein's two-stage test, its spread from them alone (``stats.paired_difference``)
    pilot: tuple[int, ...] = ()


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
    x = np.asarray(kls, dtype=float)
    y = np.asarray(values, dtype=float)
    if x.size == 0:
        return math.nan
    if x.size < 2 or np.ptp(x) == 0:
        return float(y.mean())
    xm = x.mean()
    slope = float(((x - xm) * (y - y.mean())).sum() / ((x - xm) ** 2).sum())
    return float(y.mean() + slope * (target - xm))


def column(row: dict, key: str) -> float:
    """A measured number of a model's row; a column the row lacks is an error naming it
    (never a silent NaN that drops out of a test)."""
    if key not in row or row[key] is None or row[key] == "":
        raise ValueError(f"model {row.get('model', '?')} has no measured column {key!r}: the study measured "
                         "something else (a stale cache or another measure spec); rerun it")
    return float(row[key])


def estimate_pairs(rows: list[dict], tests: list[tuple[Comparison, str]], quantities: list[str],
                   design: Design) -> list[dict]:
    """Per comparison, fork point (``tests``) and seed where both forks were measured: the
    target KL (``comparison_target``), each fork's measured KL range and how far its
    estimate lies outside it, and each fork's estimate at the target of every quantity (the
    reference's trace from ``reference_trace``: one parameter space for a size contrast)
    with the paired difference ``d_<quantity>``; ``used`` is False, with the ``reason``,
    where a fork's estimate lies beyond ``design.limit``; ``within_tolerance`` marks the
    pairs of the exclusion sensitivity row."""
    out = []
    for c, point in tests:
        by: dict[tuple[int, str], list[dict]] = {}
        for r in rows:
            if r["point"] == point and r["fork"] in (c.recipe, c.reference):
                by.setdefault((int(r["seed"]), r["fork"]), []).append(r)
        seeds = sorted({s for s, f in by if (s, c.recipe) in by and (s, c.reference) in by})
        for seed in seeds:
            rec, ref = by[(seed, c.recipe)], by[(seed, c.reference)]
            kl_rec = [column(r, "kl") for r in rec]
            kl_ref = [column(r, "kl") for r in ref]
            target = comparison_target(kl_rec, kl_ref)
            far = {c.recipe: outside(kl_rec, target), c.reference: outside(kl_ref, target)}
            worst = max(far, key=far.get)
            used = far[worst] <= design.limit
            pair = {"pair": f"{c.name} @ {point}, seed {seed}", "test": f"{c.name} @ {point}", "comparison": c.name,
                    "point": point, "seed": seed,
                    "recipe": c.recipe, "reference": c.reference, "target": target,
                    "recipe_kl_low": min(kl_rec), "recipe_kl_high": max(kl_rec), "recipe_checkpoints": len(rec),
                    "reference_kl_low": min(kl_ref), "reference_kl_high": max(kl_ref),
                    "reference_checkpoints": len(ref), "recipe_outside": far[c.recipe],
                    "reference_outside": far[c.reference],
                    "gap": max(0.0, max(min(kl_rec), min(kl_ref)) - min(max(kl_rec), max(kl_ref))),
                    "used": used,
                    "reason": "" if used else (f"{worst} estimated {far[worst]:.2e} nats outside its measured KL "
                                               f"range (limit {design.limit:g})")}
            pair["within_tolerance"] = pair["gap"] <= design.tolerance
            for key in quantities:
                ref_key = c.reference_trace if key == "trace_fisher" else key
                a = at_target(kl_rec, [column(r, key) for r in rec], target)
                b = at_target(kl_ref, [column(r, ref_key) for r in ref], target)
                pair[f"recipe_{key}"], pair[f"reference_{key}"], pair[f"d_{key}"] = a, b, a - b
            out.append(pair)
    return out


def _used(pairs: list[dict], c: Comparison, point: str) -> list[dict]:
    return [p for p in pairs if p["comparison"] == c.name and p["point"] == point and p["used"]]


# ---- the paired differences ------------------------------------------------------------------
def _verdict(pd, sign: int, margin: float, design: Design) -> str:
    return power_verdict(pd, sign, margin) if design.headroom else UNINFORMATIVE


def differences(pairs: list[dict], tests: list[tuple[Comparison, str]], accuracies: list[tuple[str, str]],
                primary_key: str, design: Design, n_boot: int = 2000) -> list[dict]:
    """Per comparison and fork point (``tests``), the paired differences at the target
    (``estimate_pairs``' rows) over the used pairs of every accuracy column (``(key,
    what)``, points, the paper's sign; δ = ``design.margin``) and of the trace (the opposite
    sign; δ = ``design.trace_margin`` × the reference's mean trace at the target), with the
    exclusion sensitivity beside each (only the pairs within the tolerance: ``tol_*``);
    Holm-adjusted p values — of the detection tests and, apart, of the equivalence tests
    (TOST) — within each family: the primary accuracies, the traces, the secondary
    accuracies. Returns the rows (``differences.csv``); ``n_boot``: the bootstrap intervals'
    resamples (shown beside the t intervals, never read by a verdict: 0 leaves them out)."""
    out = []
    for c, point in tests:
        everyone = [p for p in pairs if p["comparison"] == c.name and p["point"] == point]
        used = [p for p in everyone if p["used"]]
        within = [p for p in used if p["within_tolerance"]]
        quantities = [(key, what, c.sign, 100.0) for key, what in accuracies]
        one_space = "" if c.reference_trace == "trace_fisher" else f" ({c.reference} embedded: one parameter space)"
        quantities.append(("trace_fisher", f"trace of Hessian (Fisher){one_space}", -c.sign, 1.0))
        for key, what, sign, scale in quantities:
            d = [scale * p[f"d_{key}"] for p in used]
            pd = paired_difference(d, seed=len(out), n_boot=n_boot, pilot=_pilot_part(used, key, scale, design))
            tol = paired_difference([scale * p[f"d_{key}"] for p in within], seed=len(out), n_boot=n_boot,
                                    pilot=_pilot_part(within, key, scale, design))
            if key == "trace_fisher":
                reference_mean = float(np.mean([p[f"reference_{key}"] for p in used])) if used else math.nan
                margin = design.trace_margin * abs(reference_mean)
            else:
                margin = design.margin
            family = "primary" if key == primary_key else "trace" if key == "trace_fisher" else "secondary"
            out.append({
                "test": f"{c.name} @ {point}: {key}", "comparison": c.name, "point": point, "recipe": c.recipe,
                "reference": c.reference, "quantity": key, "what": what, "family": family, "n_pairs": len(everyone),
                "n_used": pd.n, "n_beyond_limit": len(everyone) - len(used), "mean": pd.mean, "sd": pd.sd,
                "df": pd.df,
                "t_low": pd.t_low, "t_high": pd.t_high, "eq_low": pd.eq_low, "eq_high": pd.eq_high,
                "boot_low": pd.boot_low, "boot_high": pd.boot_high, "p_value": pd.p_value,
                "tost_p": pd.tost_p(margin), "mde": pd.mde, "margin": margin, "expected_sign": sign,
                "verdict": _verdict(pd, sign, margin, design),
                "max_outside": max((max(p["recipe_outside"], p["reference_outside"]) for p in used), default=math.nan),
                "tol_n": tol.n, "tol_mean": tol.mean, "tol_low": tol.t_low, "tol_high": tol.t_high, "tol_mde": tol.mde,
                "tol_verdict": _verdict(tol, sign, margin, design) if tol.n >= 2 else f"{tol.n} pair(s): no interval"})
    for family in ("primary", "trace", "secondary"):
        members = [r for r in out if r["family"] == family]
        for r, q, qe in zip(members, holm([r["p_value"] for r in members]), holm([r["tost_p"] for r in members])):
            r["holm_p"], r["tost_holm_p"] = q, qe
            r["after_holm"] = _after_holm(r["verdict"], q, qe)
    return out


def _pilot_part(pairs: list[dict], key: str, scale: float, design: Design) -> list[float] | None:
    """The differences of the pilot's seeds among ``pairs`` (an adaptive study), else None."""
    if not design.pilot:
        return None
    return [scale * p[f"d_{key}"] for p in pairs if p["seed"] in design.pilot]


def _after_holm(verdict: str, holm_p: float, tost_holm_p: float) -> str:
    """Whether a detection (its two-sided test) or an equivalence (its TOST) survives Holm's
    correction within its family."""
    if verdict in (DETECTED, DETECTED_AGAINST):
        return "survives" if holm_p <= HOLM_LEVEL else "does not survive"
    if verdict == EQUIVALENT:
        return "survives" if tost_holm_p <= HOLM_LEVEL else "does not survive"
    return ""


HOLM_FAMILIES = ("Holm's correction is applied within each family separately — the primary accuracies (every "
                 "comparison and fork point), the traces, the secondary accuracies — once to the detection tests' p "
                 "values and once to the equivalence tests' (TOST) p values; the dose tests are a family of their "
                 "own, and so are the flatness forks' dose-response slopes (over the fork points); the Fig. 1 regression and the sensitivity rows are not corrected.")


def difference_tables(section: Section, out: list[dict], comparisons: dict[str, Comparison]) -> None:
    """The tables and claims of ``differences``' rows: the primary accuracy and the trace
    (with the exclusion sensitivity beside them), then the secondary endpoints."""
    section.files["differences.csv"] = out
    shown = [r for r in out if r["family"] in ("primary", "trace")]
    section.tables.append(Table(
        "Paired differences (recipe − reference) at the target KL across seeds, every pair used unless a fork's "
        "estimate lies beyond the limit: primary probe (points) and trace; 95% t and bootstrap intervals, the 90% "
        "interval of the equivalence test (TOST), p raw and Holm-adjusted within each family; beside it the "
        "exclusion sensitivity (only the pairs whose KL ranges lie within the tolerance)", [
            Column("used", "n_used", fmt="d"), Column("beyond limit", "n_beyond_limit", fmt="d"),
            Column("mean [t 95%]", "mean", ci=("t_low", "t_high"), fmt=".3g"),
            Column("bootstrap 95%", "boot_low", fmt=".3g"), Column("to", "boot_high", fmt=".3g"),
            Column("90% (TOST)", "eq_low", fmt=".3g"), Column("to ", "eq_high", fmt=".3g"),
            Column("paired SD", "sd", fmt=".3g"), Column("MDE 80%", "mde", fmt=".3g"),
            Column("δ", "margin", fmt=".3g"), Column("p", "p_value", fmt=".3g"),
            Column("p Holm", "holm_p", fmt=".3g"), Column("TOST p Holm", "tost_holm_p", fmt=".3g"),
            Column("max outside (nats)", "max_outside", fmt=".2e"), Column("verdict", "verdict", text=True),
            Column("after Holm", "after_holm", text=True), Column("within tolerance", "tol_n", fmt="d"),
            Column("their mean [t 95%]", "tol_mean", ci=("tol_low", "tol_high"), fmt=".3g"),
            Column("their verdict", "tol_verdict", text=True)],
        shown, source="differences.csv", key="test", key_header="comparison @ fork point"))
    for r in shown:
        c = comparisons[r["comparison"]]
        unit = " pts" if r["family"] == "primary" else ""
        holm_note = f", Holm p {fmt(r['holm_p'])}" + (f" ({r['after_holm']})" if r["after_holm"] else "")
        section.claims.append(Claim(
            c.paper,
            f"{c.recipe} − {c.reference} forked at {r['point']}, {r['what']}, at the target KL, paired over "
            f"{r['n_used']} seeds ({r['n_beyond_limit']} beyond the extrapolation limit): {fmt(r['mean'])}{unit}, "
            f"95% t interval [{fmt(r['t_low'])}, {fmt(r['t_high'])}], paired SD {fmt(r['sd'])}, MDE (80% power) "
            f"{fmt(r['mde'])}{unit}, δ {fmt(r['margin'])}{unit}, p {fmt(r['p_value'])}{holm_note}; estimates at "
            f"most {fmt(r['max_outside'])} nats outside a fork's measured KL range. Only the {r['tol_n']} pairs "
            f"within the KL tolerance: {fmt(r['tol_mean'])}{unit} [{fmt(r['tol_low'])}, {fmt(r['tol_high'])}].",
            r["verdict"]))
    secondary = [r for r in out if r["family"] == "secondary"]
    section.tables.append(Table(
        "Secondary endpoints (other probe sizes, the AdamW probe, the all-positions probe): paired differences in "
        "points at the target KL over the used pairs; Holm within the secondary family",
        [Column("mean [t 95%]", "mean", ci=("t_low", "t_high"), fmt=".3g"), Column("MDE", "mde", fmt=".3g"),
         Column("p Holm", "holm_p", fmt=".3g"), Column("verdict", "verdict", text=True),
         Column("after Holm", "after_holm", text=True)],
        secondary, source="differences.csv", key="test", key_header="comparison @ fork point"))
    counts = {v: sum(r["verdict"] == v for r in secondary) for v in (DETECTED, DETECTED_AGAINST, EQUIVALENT,
                                                                      INCONCLUSIVE, DEGENERATE, UNINFORMATIVE)}
    survive = sum(r["after_holm"] == "survives" for r in secondary)
    section.notes.append(f"Secondary endpoints ({len(secondary)} tests): "
                         + ", ".join(f"{k}: {v}" for k, v in counts.items() if v)
                         + f"; {survive} verdicts survive Holm's correction within the family.")


def pairs_table(section: Section, pairs: list[dict], primary_key: str) -> None:
    """The estimation table: per pair its target, each fork's measured KL range and how far
    outside it its estimate lies, the estimates and whether the pair is used (the reason
    when not)."""
    section.files["pairs.csv"] = pairs
    section.tables.append(Table(
        "Estimation at the target KL, per pair (comparison, fork point, seed): the target (from the two forks' "
        "measured KL ranges alone), each fork's measured range, how far (nats) each fork's estimate lies outside "
        "it, the primary accuracy (points) and trace estimated at the target, and whether the pair is used",
        [Column("target KL", "target", fmt=".5f"),
         Column("recipe KL from", "recipe_kl_low", fmt=".5f"), Column("to", "recipe_kl_high", fmt=".5f"),
         Column("reference KL from", "reference_kl_low", fmt=".5f"), Column("to ", "reference_kl_high", fmt=".5f"),
         Column("recipe outside", "recipe_outside", fmt=".2e"),
         Column("reference outside", "reference_outside", fmt=".2e"),
         Column("recipe acc (%)", f"recipe_{primary_key}", scale=100, fmt=".2f"),
         Column("reference acc (%)", f"reference_{primary_key}", scale=100, fmt=".2f"),
         Column("recipe tr(H)", "recipe_trace_fisher", fmt=".4g"),
         Column("reference tr(H)", "reference_trace_fisher", fmt=".4g"),
         Column("within tolerance", "within_tolerance", text=True), Column("used", "used", text=True),
         Column("why not", "reason", text=True)],
        pairs, source="pairs.csv", key="pair", key_header="pair"))
    beyond = [p for p in pairs if not p["used"]]
    section.notes.append(
        f"Estimation at the target: {len(pairs) - len(beyond)} of {len(pairs)} pairs used; "
        + ("none lies beyond the extrapolation limit." if not beyond else
           "not used (beyond the extrapolation limit): " + "; ".join(f"{p['test']}, seed {p['seed']}: {p['reason']}"
                                                                     for p in beyond) + "."))


def dose(section: Section, pairs: list[dict], comparisons: list[Comparison], points: tuple[str, str], key: str,
         design: Design) -> list[dict]:
    """Does the effect grow with how long the recipe acts? Per comparison, the paired
    difference at the target at ``points[1]`` minus at ``points[0]`` per seed (the seeds
    whose pairs are used at both), with its interval; Holm over the comparisons."""
    out = []
    for c in comparisons:
        per_point = [{p["seed"]: 100.0 * p[f"d_{key}"] for p in _used(pairs, c, point)} for point in points]
        common = sorted(set(per_point[0]) & set(per_point[1]))
        pilot = [per_point[1][s] - per_point[0][s] for s in common if s in design.pilot] if design.pilot else None
        pd = paired_difference([per_point[1][s] - per_point[0][s] for s in common], seed=len(out), pilot=pilot)
        out.append({"test": f"{c.name}: {points[1]} − {points[0]}", "comparison": c.name, "n_seeds": pd.n,
                    "at_first": float(np.mean([per_point[0][s] for s in common])) if common else math.nan,
                    "at_second": float(np.mean([per_point[1][s] for s in common])) if common else math.nan,
                    "mean": pd.mean, "t_low": pd.t_low, "t_high": pd.t_high, "sd": pd.sd, "mde": pd.mde,
                    "p_value": pd.p_value, "tost_p": pd.tost_p(design.margin),
                    "verdict": _verdict(pd, c.sign, design.margin, design)})
    for r, q, qe in zip(out, holm([r["p_value"] for r in out]), holm([r["tost_p"] for r in out])):
        r["holm_p"], r["tost_holm_p"] = q, qe
        r["after_holm"] = _after_holm(r["verdict"], q, qe)
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


# ---- dose-response: flatness as the treatment ------------------------------------------------
def dose_points(pairs: list[dict], comparisons: list[Comparison], point: str, key: str) -> list[dict]:
    """One row per used pair of the flatness comparisons (``comparisons``: each a λ fork
    against the same reference) at fork point ``point``: its seed, fork, relative trace
    change at the target (``x``: recipe ÷ reference − 1, both at the pair's target KL) and
    paired primary difference (``y``, points)."""
    out = []
    for c in comparisons:
        for p in _used(pairs, c, point):
            ref = p["reference_trace_fisher"]
            out.append({"seed": int(p["seed"]), "fork": c.recipe, "comparison": c.name, "point": point,
                        "x": p["recipe_trace_fisher"] / ref - 1 if ref else math.nan, "y": 100.0 * p[f"d_{key}"]})
    return [r for r in out if math.isfinite(r["x"]) and math.isfinite(r["y"])]


def within_seed_slopes(points: list[dict]) -> dict[int, float]:
    """Per seed, the least-squares slope of ``y`` on ``x`` through the origin over its forks
    (``Σxy / Σx²``): the reference is the origin of every pair of its seed (no trace change,
    no difference), so the line has no intercept; a seed whose forks did not move the trace
    has no slope."""
    by: dict[int, list[dict]] = {}
    for r in points:
        by.setdefault(r["seed"], []).append(r)
    out = {}
    for seed, rs in sorted(by.items()):
        x = np.array([r["x"] for r in rs])
        y = np.array([r["y"] for r in rs])
        if float((x * x).sum()) > 0:
            out[seed] = float((x * y).sum() / (x * x).sum())
    return out


# the dose-response slope's equivalence margin: the accuracy margin δ over this relative
# trace change (the smallest change the flatness forks are calibrated to make)
DOSE_TRACE_CHANGE = 0.2


def dose_response(section: Section | None, pairs: list[dict], comparisons: list[Comparison],
                  points: list[str], key: str, design: Design, n_boot: int = 2000) -> list[dict]:
    """The causal counterpart of Fig. 1's slope: at each fork point, the paired primary
    difference (points) per unit of relative trace change, within seeds — each seed's slope
    through the origin over its flatness forks (``within_seed_slopes``), then their mean
    over the seeds with its t interval, MDE and p (``stats.paired_difference``; an adaptive
    study's pilot seeds give Stein's spread), Holm over the fork points. The paper's
    direction is negative (a smaller trace, a higher accuracy); the equivalence margin is
    ``design.margin / DOSE_TRACE_CHANGE`` (δ points over a 20 % change), fixed before the
    data. Adds the table (``dose_response.csv``) and the per-pair points
    (``dose_points.csv``, the figure's) to ``section`` when given; ``n_boot``: the
    bootstrap interval's resamples (in the CSV beside the t interval; 0 leaves it out)."""
    out, every = [], []
    margin = design.margin / DOSE_TRACE_CHANGE
    for point in points:
        pts = dose_points(pairs, comparisons, point, key)
        every += pts
        slopes = within_seed_slopes(pts)
        seeds = sorted(slopes)
        pilot = [slopes[s] for s in seeds if s in design.pilot] if design.pilot else None
        pd = paired_difference([slopes[s] for s in seeds], seed=len(out), n_boot=n_boot, pilot=pilot)
        out.append({"test": f"dose-response @ {point}", "point": point, "n_seeds": pd.n, "n_pairs": len(pts),
                    "forks": ", ".join(dict.fromkeys(r["fork"] for r in pts)),
                    "min_change": min((r["x"] for r in pts), default=math.nan),
                    "max_change": max((r["x"] for r in pts), default=math.nan),
                    "slope": pd.mean, "t_low": pd.t_low, "t_high": pd.t_high, "boot_low": pd.boot_low,
                    "boot_high": pd.boot_high, "sd": pd.sd, "mde": pd.mde,
                    "p_value": pd.p_value, "tost_p": pd.tost_p(margin), "margin": margin,
                    "verdict": _verdict(pd, -1, margin, design)})
    for r, q, qe in zip(out, holm([r["p_value"] for r in out]), holm([r["tost_p"] for r in out])):
        r["holm_p"], r["tost_holm_p"] = q, qe
        r["after_holm"] = _after_holm(r["verdict"], q, qe)
    if section is not None and out:
        section.files["dose_response.csv"] = out
        section.files["dose_points.csv"] = every
        section.tables.append(Table(
            "Dose-response: the paired primary difference at the target KL (points) per unit of relative trace "
            "change (fork ÷ reference − 1, both at the pair's target), each seed's slope through the origin over "
            "its flatness forks, mean over the seeds; the paper's direction is negative; equivalence margin "
            f"±{fmt(margin)} (δ over a {DOSE_TRACE_CHANGE:.0%} change); Holm over the fork points",
            [Column("seeds", "n_seeds", fmt="d"), Column("pairs", "n_pairs", fmt="d"),
             Column("trace change from", "min_change", fmt=".2f"), Column("to", "max_change", fmt=".2f"),
             Column("slope [t 95%]", "slope", ci=("t_low", "t_high"), fmt=".3g"), Column("MDE", "mde", fmt=".3g"),
             Column("p Holm", "holm_p", fmt=".3g"), Column("verdict", "verdict", text=True),
             Column("after Holm", "after_holm", text=True)],
            out, source="dose_response.csv", key="test", key_header="fork point"))
        for r in out:
            section.claims.append(Claim(
                "at the same loss, flatter transfers better — tested as a treatment (a trace penalty), not in the "
                "paper: a negative slope of accuracy on the relative trace change.",
                f"at fork point {r['point']}, over {r['n_seeds']} seeds ({r['n_pairs']} pairs of {r['forks']} against "
                f"the reference; trace changes {r['min_change']:+.0%} to {r['max_change']:+.0%}): {fmt(r['slope'])} "
                f"points per unit of relative trace change, 95% t interval [{fmt(r['t_low'])}, {fmt(r['t_high'])}] "
                f"(MDE {fmt(r['mde'])}, Holm p {fmt(r['holm_p'])}).",
                r["verdict"] + (f" ({r['after_holm']} Holm)" if r["after_holm"] else "")))
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


# ---- replication across languages ------------------------------------------------------------
REPLICATED = "replicated (paper's direction)"
REPLICATED_AGAINST = "replicated (against the paper)"
CONTRADICTED = "contradicted: detected in opposite directions"
NOT_REPLICATED = "not replicated"
REPLICATION_UNINFORMATIVE = "uninformative: fewer than two languages with headroom and an estimate"
REPLICATION_VERDICTS = (REPLICATED, REPLICATED_AGAINST, CONTRADICTED, NOT_REPLICATED, REPLICATION_UNINFORMATIVE)


def replication_verdict(verdicts: list[str | None]) -> str:
    """One comparison across languages, from each language's own verdict (``None``: a
    language without headroom or without an estimate — left out): with fewer than two
    informative languages, uninformative; "contradicted" when detections point both ways;
    "replicated" — saying which way — only when every informative language detects the
    effect in that one direction; else "not replicated" (one detects and another does not,
    or none detects)."""
    informative = [v for v in verdicts if v is not None]
    if len(informative) < 2:
        return REPLICATION_UNINFORMATIVE
    if DETECTED in informative and DETECTED_AGAINST in informative:
        return CONTRADICTED
    if all(v == DETECTED for v in informative):
        return REPLICATED
    if all(v == DETECTED_AGAINST for v in informative):
        return REPLICATED_AGAINST
    return NOT_REPLICATED


def replication(section: Section, studies: list[dict], family: str = "primary") -> list[dict]:
    """The replication table: per comparison and fork point of ``family``, each language's
    mean [t 95 %] and verdict, the replication verdict (``replication_verdict``) and the
    random-effects pooled estimate over the informative languages (each language's standard
    error sd/√n of its own used pairs) with the Hartung–Knapp–Sidik–Jonkman interval, the
    fixed-effect estimate and the heterogeneity (Cochran's Q, I², τ²). ``studies``: per
    language ``{"language": spec, "tag": str, "ok": headroom passed, "diffs": its
    differences rows, "tests": the names of its comparisons, "comparison @ point"}``."""
    from .stats import pool_inverse_variance, pooled_verdict

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
        verdicts, pool_m, pool_se = [], [], []
        for s in studies:
            r = by.get(s["tag"])
            n = 0 if r is None else int(r["n_used"])
            mean, low, high, sd = ((float(r[k]) for k in ("mean", "t_low", "t_high", "sd")) if n >= 2
                                   else (math.nan,) * 4)
            se = sd / math.sqrt(n) if n >= 2 else math.nan
            informative = s["ok"] and math.isfinite(se) and se > 0
            verdict = (UNINFORMATIVE if not s["ok"] else r["verdict"] if n >= 2 else f"{n} pair(s) used: no interval")
            row.update({f"{s['tag']}_mean": mean, f"{s['tag']}_low": low, f"{s['tag']}_high": high,
                        f"{s['tag']}_verdict": verdict, f"{s['tag']}_used": n})
            verdicts.append(verdict if informative else None)
            if informative:
                pool_m.append(mean)
                pool_se.append(se)
        row["replication"] = replication_verdict(verdicts)
        row["pooled_languages"] = len(pool_m)
        row.update(dict.fromkeys(("pooled", "pooled_low", "pooled_high", "random", "random_low", "random_high",
                                  "random_p", "random_mde", "q", "q_p", "i2", "tau2"), math.nan))
        row["pooled_verdict"] = REPLICATION_UNINFORMATIVE
        if len(pool_m) >= 2:  # one language is nothing to pool
            pooled = pool_inverse_variance(pool_m, pool_se)
            # the comparison's direction and δ, as every language's study fixed them (a study of an
            # earlier version did not write them: its pooled estimate stands without a verdict)
            first = next(iter(by.values()))
            if first.get("expected_sign") not in (None, "") and first.get("margin") not in (None, ""):
                row["pooled_verdict"], row["random_mde"] = pooled_verdict(
                    pooled, int(float(first["expected_sign"])), float(first["margin"]))
            else:
                row["pooled_verdict"] = "no verdict: the studies did not record the direction and δ (rerun them)"
            row.update(pooled=pooled.fixed, pooled_low=pooled.fixed_low, pooled_high=pooled.fixed_high,
                       random=pooled.random, random_low=pooled.random_low, random_high=pooled.random_high,
                       random_p=pooled.random_p, q=pooled.q, q_p=pooled.q_p, i2=pooled.i2, tau2=pooled.tau2)
        out.append(row)
    name = "replication.csv" if family == "primary" else f"replication_{family}.csv"
    section.files[name] = out
    columns = [Column("pooled verdict (random effects, HKSJ)", "pooled_verdict", text=True),
               Column("pooled, random (HKSJ) [95%]", "random", ci=("random_low", "random_high"), fmt=".2f"),
               Column("pooled MDE", "random_mde", fmt=".2f"), Column("languages pooled", "pooled_languages", fmt="d")]
    for s in studies:
        columns += [Column(f"{s['tag']} [95%]", f"{s['tag']}_mean", ci=(f"{s['tag']}_low", f"{s['tag']}_high"),
                           fmt=".2f"),
                    Column(f"{s['tag']} verdict", f"{s['tag']}_verdict", text=True)]
    columns += [Column("replication", "replication", text=True),
                Column("pooled, fixed [95%]", "pooled", ci=("pooled_low", "pooled_high"), fmt=".2f"),
                Column("Q", "q", fmt=".2f"), Column("p(Q)", "q_p", fmt=".2g"), Column("I²", "i2", fmt=".2f"),
                Column("τ²", "tau2", fmt=".3g")]
    what = "primary accuracy (points)" if family == "primary" else family
    section.tables.append(Table(
        f"Replication across languages: per comparison and fork point, first the verdict about languages — the "
        "random-effects pooled estimate over the languages with headroom, when there are at least two (each "
        "language's standard error sd/√n of its used pairs; DerSimonian–Laird τ²), with the "
        "Hartung–Knapp–Sidik–Jonkman t interval on k − 1 degrees of freedom: detected where its 95 % interval "
        "excludes 0, no effect beyond ±δ where its 90 % interval lies inside the study's δ, and its MDE at 80 % "
        f"power — then the {what} difference on each language, whether it replicates (every language with "
        "headroom detects it, in one direction — which is said), the fixed effect and the heterogeneity "
        "(Cochran's Q, I², τ²)", columns, out, source=name, key="test",
        key_header="comparison @ fork point"))
    return out



