"""The iso-loss study's tables of its estimates (``stats.paired``'s rows, written here: the
statistics estimate, the report shows): the paired differences with the exclusion
sensitivity, the estimation per pair, the dose, the regression of Fig. 1 within seeds, and
the margins the claims were tested against."""

from __future__ import annotations

import math

from ...reports.claims import fmt
from ...reports.document import Claim, Column, Section, Table
from ...stats.inference import DEGENERATE, DETECTED, DETECTED_AGAINST, EQUIVALENT, INCONCLUSIVE
from ...stats.paired import UNINFORMATIVE, Comparison

HOLM_FAMILIES = ("Holm's correction is applied within each family separately — the claims (fixed in the preset before "
                 "the data: the paper's claims, the flatness treatment and the positive control), the other "
                 "comparisons' primary accuracies, the traces, the secondary accuracies — once to the detection tests' "
                 "p values and once to the equivalence tests' (TOST) p values; a family's size counts every test in "
                 "it, those without a p value (n ≤ 1) too. The dose tests are a family of their own, and so are the "
                 "flatness arms' trend tests (over the fork points); the Fig. 1 regression and the sensitivity "
                 "columns are not corrected. A verdict is *decided* when it survives Holm. The power of a verdict as "
                 "made is at Holm's first step (α/m, a lower bound of Holm's): a detection's against the claim's "
                 "margin δ, a \"no effect beyond ±δ\"'s TOST power at a true 0.")

# the words a reader meets in the verdict columns, defined once (the report's notes)
VERDICT_WORDS = {
    DETECTED: "the 95 % interval excludes 0 on the paper's side",
    DETECTED_AGAINST: "the 95 % interval excludes 0 on the other side",
    EQUIVALENT: "the 90 % interval lies inside ±δ, δ the claim's margin (TOST at α = 0.05 per side)",
    INCONCLUSIVE: "neither: the interval holds 0 and effects as large as δ",
    DEGENERATE: "the differences have no spread",
    UNINFORMATIVE: "the headroom gate failed",
}


def margins_table(section: Section, comparisons: dict[str, Comparison], tests: list[str], claims: tuple[str, ...]
                  ) -> None:
    """The margin every test's verdict reads (its smallest effect of interest), where it comes
    from, and the effect a design planned it for."""
    out = []
    for t in tests:
        c = comparisons[t.split(" @ ")[0]]
        out.append({"test": t, "family": "claims" if t in claims else "other comparisons", "margin": c.margin,
                    "effect": c.planned_effect, "source": c.margin_source or "—"})
    section.files["margins.csv"] = out
    section.tables.append(Table(
        "Margins, fixed in the preset before any data: each comparison's smallest effect of interest δ (points of "
        "primary accuracy; \"no effect beyond ±δ\" is TOST against it and a detection's power is stated at it), "
        "taken from the effects the paper reports for that mechanism, and the effect the design planned its power "
        "for (the margin, or a positive control's expected effect)",
        [Column("family", "family", text=True), Column("δ (points)", "margin", fmt=".2f"),
         Column("planned for", "effect", fmt=".2f"), Column("from the paper", "source", text=True)],
        out, source="margins.csv", key="test", key_header="comparison @ fork point"))


def difference_tables(section: Section, out: list[dict], comparisons: dict[str, Comparison]) -> None:
    """The tables and claims of ``differences``' rows: the primary accuracy and the trace
    (with the exclusion sensitivity beside them), then the secondary endpoints."""
    section.files["differences.csv"] = out
    shown = [r for r in out if r["family"] in ("primary", "trace")]
    limit = fmt(shown[0]["limit"], ".1e") if shown else "?"
    section.tables.append(Table(
        "Paired differences (recipe − reference) at the target KL across seeds: primary probe (points) and trace; "
        "the precision-weighted estimate (weights from the pairs' KL positions, random effects) over the pairs whose "
        f"forks' targets lie at most {limit} nats outside their measured KL ranges, with its 95% HKSJ interval and "
        "a bootstrap interval beside it, the 90% interval of the equivalence test (TOST) against the comparison's "
        "δ, p raw and Holm-adjusted within each family, the power of the verdict as made after Holm and the share "
        "of the estimate's variance that is extrapolation; the same estimate at limit 0 (pairs whose target lies "
        "inside both ranges) and with every pair beside it; the curvature test of the forks' lines",
        [Column("used", "n_used", fmt="d"), Column("beyond limit", "n_beyond_limit", fmt="d"),
         Column("estimate [HKSJ 95%]", "mean", ci=("t_low", "t_high"), fmt=".2f"),
         Column("bootstrap 95%", "boot_low", fmt=".2f"), Column("to", "boot_high", fmt=".2f"),
         Column("90% (TOST)", "eq_low", fmt=".2f"), Column("to ", "eq_high", fmt=".2f"),
         Column("effective SD", "sd", fmt=".2f"), Column("MDE 80%", "mde", fmt=".2f"),
         Column("δ", "margin", fmt=".2f"), Column("p", "p_value", fmt=".2g"),
         Column("Holm family", "holm_family", text=True), Column("p Holm", "holm_p", fmt=".2g"),
         Column("TOST p Holm", "tost_holm_p", fmt=".2g"), Column("power after Holm", "power", fmt=".2f"),
         Column("extrapolation share", "extrapolation", fmt=".2f"),
         Column("max outside (nats)", "max_outside", fmt=".1e"), Column("verdict", "verdict", text=True),
         Column("after Holm", "after_holm", text=True),
         Column("limit 0: pairs", "inside_n", fmt="d"),
         Column("their estimate [95%]", "inside_mean", ci=("inside_low", "inside_high"), fmt=".2f"),
         Column("their verdict", "inside_verdict", text=True), Column("no limit: pairs", "all_n", fmt="d"),
         Column("their estimate [95%] ", "all_mean", ci=("all_low", "all_high"), fmt=".2f"),
         Column("their verdict ", "all_verdict", text=True),
         Column("forks tested for curvature", "curvature_tested", fmt="d"),
         Column("curved (p < 0.05)", "curvature_rejected", fmt="d"), Column("curvature p (Fisher)", "curvature_p",
                                                                            fmt=".2g")],
        shown, source="differences.csv", key="test", key_header="comparison @ fork point"))
    for r in shown:
        section.claims.append(Claim(comparisons[r["comparison"]].paper, _claim_text(r, comparisons), r["verdict"]))
    _secondary(section, out)


def _claim_text(r: dict, comparisons: dict[str, Comparison]) -> str:
    c = comparisons[r["comparison"]]
    unit = " pts" if r["family"] == "primary" else ""
    holm_note = f", Holm p {fmt(r['holm_p'])}" + (f" ({r['after_holm']})" if r["after_holm"] else "")
    return (f"{c.recipe} − {c.reference} forked at {r['point']}, {r['what']}, at the target KL, over {r['n_used']} "
            f"seeds ({r['n_beyond_limit']} beyond the extrapolation limit): {fmt(r['mean'], '.2f')}{unit}, 95% HKSJ "
            f"interval [{fmt(r['t_low'], '.2f')}, {fmt(r['t_high'], '.2f')}], MDE (80% power) {fmt(r['mde'], '.2f')}"
            f"{unit}, δ {fmt(r['margin'], '.2f')}{unit}, p {fmt(r['p_value'])}{holm_note}; in the {r['holm_family']} "
            f"family of {r['holm_m']} the power of its verdict after Holm is {fmt(r['power'], '.2f')}; "
            f"{_share(r['extrapolation'])} of its variance is extrapolation (estimates at most "
            f"{fmt(r['max_outside'])} nats outside a fork's measured KL range). At limit 0 ({r['inside_n']} pairs): "
            f"{fmt(r['inside_mean'], '.2f')}{unit} [{fmt(r['inside_low'], '.2f')}, {fmt(r['inside_high'], '.2f')}]; "
            f"with every pair ({r['all_n']}): {fmt(r['all_mean'], '.2f')}{unit} [{fmt(r['all_low'], '.2f')}, "
            f"{fmt(r['all_high'], '.2f')}].")


def _share(x: float) -> str:
    return f"{x:.0%}" if math.isfinite(x) else "an unknown share (no checkpoint noise measured)"


def _secondary(section: Section, out: list[dict]) -> None:
    secondary = [r for r in out if r["family"] == "secondary"]
    if not secondary:
        return
    section.tables.append(Table(
        "Secondary endpoints (other probe sizes, the AdamW probe, the all-positions probe): paired differences in "
        "points at the target KL over the used pairs (the weighted estimate); Holm within the secondary family",
        [Column("estimate [HKSJ 95%]", "mean", ci=("t_low", "t_high"), fmt=".2f"), Column("MDE", "mde", fmt=".2f"),
         Column("p Holm", "holm_p", fmt=".2g"), Column("verdict", "verdict", text=True),
         Column("after Holm", "after_holm", text=True)],
        secondary, source="differences.csv", key="test", key_header="comparison @ fork point"))
    counts = {v: sum(r["verdict"] == v for r in secondary) for v in VERDICT_WORDS}
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
         Column("recipe outside", "recipe_outside", fmt=".1e"),
         Column("reference outside", "reference_outside", fmt=".1e"), Column("leverage", "leverage", fmt=".2f"),
         Column("recipe acc (%)", f"recipe_{primary_key}", scale=100, fmt=".2f"),
         Column("reference acc (%)", f"reference_{primary_key}", scale=100, fmt=".2f"),
         Column("recipe tr(H)", "recipe_trace_fisher", fmt=".4g"),
         Column("reference tr(H)", "reference_trace_fisher", fmt=".4g"),
         Column("inside both ranges", "inside", text=True), Column("used", "used", text=True),
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


def dose_table(section: Section, out: list[dict], points: tuple[str, str]) -> None:
    section.files["dose.csv"] = out
    section.tables.append(Table(
        f"Dose: the primary difference at the target KL (points) with the recipe acting from {points[1]} minus "
        f"acting from {points[0]}, per seed (the seeds whose pairs are used at both); positive = the effect grows "
        "in the paper's direction when its sign is +, shrinks when −; Holm over the comparisons",
        [Column("seeds", "n_seeds", fmt="d"), Column(f"at {points[0]}", "at_first", fmt=".2f"),
         Column(f"at {points[1]}", "at_second", fmt=".2f"),
         Column("difference [t 95%]", "mean", ci=("t_low", "t_high"), fmt=".2f"), Column("MDE", "mde", fmt=".2f"),
         Column("p Holm", "holm_p", fmt=".2g"), Column("verdict", "verdict", text=True),
         Column("after Holm", "after_holm", text=True)],
        out, source="dose.csv", key="test", key_header="comparison"))


def regression_table(section: Section, reg: list[dict]) -> None:
    """Fig. 1 within seeds (``paired.regression``'s rows) and its claim, per fork point."""
    section.files["regression.csv"] = reg
    section.tables.append(Table(
        "Fig. 1 within seeds (observational): primary accuracy (pts) regressed on trace and KL with seed fixed "
        "effects, per fork point, one row per fork (the mean of its measured checkpoints), one model size, without "
        "the forks whose treatment is the task or the trace (cluster bootstrap over seeds, 95%; MDE from the "
        "noncentral t on seeds − 1 degrees of freedom; no equivalence margin is set for a slope)",
        [Column("estimate [95%]", "estimate", ci=("low", "high"), fmt=".3g"), Column("MDE 80%", "mde", fmt=".3g"),
         Column("models", "n_models", fmt="d"), Column("verdict", "verdict", text=True)], reg,
        source="regression.csv", key="coefficient", key_header="coefficient"))
    for tr in reg[::2]:  # the trace's coefficient of each fork point
        section.claims.append(Claim(
            "at the same loss, flatter models transfer better (Fig. 1): a negative slope of accuracy on the trace.",
            f"within seeds at fork point {tr['point']}, holding KL fixed (one model size, without {tr['without']}; "
            f"{tr['n_models']} forks, each the mean of its measured checkpoints): {fmt(tr['estimate'])} pts per unit "
            f"of trace, 95% cluster-bootstrap interval [{fmt(tr['low'])}, {fmt(tr['high'])}] over {tr['n_seeds']} "
            f"seeds (MDE {fmt(tr['mde'])}; observational).", tr["verdict"]))
