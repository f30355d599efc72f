"""The estimate of a comparison at the target KL (``weighted``: leverage weights, HKSJ, a line
per fork fixed before the data) against brute force, statsmodels and simulation; the pairs'
leverage, residuals and curvature tests against least squares; the extrapolation limit in
nats with the sensitivity at 0 and with every pair; the power of a verdict as made and
"decided" after Holm; nothing silent (NaN, n ≤ 1, a short fork, Holm's count); and flatness
by assigned arm (``dose_response``: the trend over λ, the Wald ratio with Fieller's interval)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sameloss.errors import UserError
from sameloss.experiments.recipes.isoloss.tables import pairs_table
from sameloss.experiments.reports.document import Section
from sameloss.experiments.stats import paired
from sameloss.experiments.stats.dose_response import LAMBDA_UNIT, dose_points, dose_response, fieller, trend, wald
from sameloss.experiments.stats.inference import (DETECTED, EQUIVALENT, INCONCLUSIVE, paired_difference,
                                                  t_test_power, tost_power)
from sameloss.experiments.stats.paired import Comparison, Design
from sameloss.experiments.stats.paired import TestKey as Key
from sameloss.experiments.stats.weighted import Fits, curvature_p, estimate, fits_of, line

LAMBDAS = {"flat": 2e-4, "sharp": -1e-4, "flatter": 3e-4}
FLAT = [Comparison(name, name, "adamw", +1 if w > 0 else -1, "") for name, w in LAMBDAS.items()]
DESIGN = Design(trace_margin=0.05, limit=1e-3)
X = Comparison("x", "x", "r", +1, "", margin=1.0)


def _fits(d, lev, rss=None, rdf=None) -> Fits:
    n = len(d)
    return Fits(np.asarray(d, dtype=float), np.asarray(lev, dtype=float), np.full(n, 2 / 3),
                np.zeros(n) if rss is None else np.asarray(rss, float),
                np.full(n, 2.0) if rdf is None else np.asarray(rdf, float))


# ---- the weighted estimate -------------------------------------------------------------------------
def test_equal_leverages_give_the_paired_t_test_exactly():
    rng = np.random.default_rng(0)
    d = rng.normal(0.3, 0.5, 9)
    rss = rng.chisquare(2, 9) * 0.04
    for lev in (np.full(9, 2 / 3), np.full(9, 4.0)):  # any common leverage: equal weights
        e, t = estimate(_fits(d, lev, rss)), paired_difference(d, n_boot=0)
        assert e.n == t.n == 9 and e.df == t.df == 8
        for got, want in ((e.mean, t.mean), (e.sd, t.sd), (e.t_low, t.t_low), (e.t_high, t.t_high),
                          (e.p_value, t.p_value), (e.mde, t.mde), (e.eq_low, t.eq_low), (e.tost_p(0.35), t.tost_p(0.35))):
            assert got == pytest.approx(want, rel=1e-10)


@pytest.mark.filterwarnings("ignore::statsmodels.tools.sm_exceptions.InvalidTestWarning")
def test_the_weighted_estimate_is_dersimonian_laird_with_the_hksj_interval():
    """Within variances σ̂²·L (σ̂² the lines' pooled residual variance): statsmodels'
    DerSimonian–Laird random effects, its "random effect wls" row the HKSJ interval."""
    from statsmodels.stats.meta_analysis import combine_effects

    rng = np.random.default_rng(1)
    for n in (4, 8, 15):
        d = rng.normal(0.2, 1.5, n)
        lev = rng.uniform(0.7, 30.0, n)
        rss, rdf = rng.chisquare(1, n) * 0.05, np.full(n, 2.0)
        sigma2 = rss.sum() / rdf.sum()
        e = estimate(_fits(d, lev, rss, rdf))
        fit = combine_effects(d, sigma2 * lev, method_re="dl", use_t=True)
        hksj = fit.summary_frame().loc["random effect wls"]
        assert fit.tau2 > 0 and e.sigma2 == pytest.approx(sigma2) and e.tau2 == pytest.approx(fit.tau2, rel=1e-10)
        assert e.mean == pytest.approx(hksj["eff"], rel=1e-10)
        assert (e.t_low, e.t_high) == pytest.approx((hksj["ci_low"], hksj["ci_upp"]), rel=1e-8)
        w = 1 / (e.tau2 + sigma2 * lev)
        want = (w ** 2 * sigma2 * (lev - 2 / 3)).sum() / (w ** 2 * (e.tau2 + sigma2 * lev)).sum()
        assert e.extrapolation == pytest.approx(want, rel=1e-10)


def test_a_pair_read_off_a_long_lever_weighs_little():
    """One pair among 16 extrapolated far (L = 200): the plain mean moves by its noise, the
    weighted estimate hardly."""
    d = np.full(16, 0.3) + np.tile([0.05, -0.05], 8)
    d[0] = 0.3 + 14.4
    lev = np.full(16, 2 / 3)
    lev[0] = 200.0
    assert np.mean(d) == pytest.approx(1.2, abs=0.01)
    e = estimate(_fits(d, lev, np.full(16, 0.04)))
    assert abs(e.mean - 0.3) < 0.05 and e.extrapolation > 0


def test_the_estimate_holds_its_size_at_unequal_leverages():
    """Type-I error of the weighted test by simulation: pairs with the pilot's kinds of
    leverage (overlapping, touching, far)."""
    rng = np.random.default_rng(2)
    hits, trials = 0, 2000
    for _ in range(trials):
        lev = rng.choice([0.67, 1.7, 4.0, 12.0], 10)
        d = rng.normal(0, 0.3, 10) + rng.normal(0, 0.2 * np.sqrt(lev))
        rss = 0.2 ** 2 * rng.chisquare(2, 10)
        hits += estimate(_fits(d, lev, rss)).p_value <= 0.05
    assert 0.035 <= hits / trials <= 0.065


def test_fewer_than_two_pairs_have_no_interval_and_count_in_holms_family():
    est = estimate(_fits([0.4], [1.0]))
    assert est.n == 1 and math.isnan(est.t_low) and math.isnan(est.p_value)
    assert paired.holm_counted([0.01, math.nan, 0.02]) == pytest.approx([0.03, math.nan, 0.04], nan_ok=True)
    rows = [r for r in _rows([1.0, 1.2, 0.8], [0.0, 0.0, 0.0]) if r["seed"] == 0]
    pairs = paired.estimate_pairs(rows, [(X, "late")], ["acc", "trace_fisher"], DESIGN)
    out = paired.differences(pairs, [(X, "late")], [("acc", "acc")], "acc", DESIGN, n_boot=0)
    assert out[0]["verdict"] == "no interval: 1 pair(s)" and out[0]["holm_m"] == 1 and not out[0]["decided"]


# ---- the pairs: leverage, residuals, curvature, NaN, short forks, the limit --------------------------
def _rows(effects, gaps, n=3, noise=0.0, seed=0, curve=0.0):
    """Per seed a reference r on KL 0.010 → 0.008 and a recipe x shifted up by ``gap``; accuracy
    linear in KL (plus ``curve`` × the squared KL offset, points per (1e-3 nats)²)."""
    rng = np.random.default_rng(seed)
    rows = []
    for s, (e, gap) in enumerate(zip(effects, gaps)):
        for fork, shift, extra in (("r", 0.0, 0.0), ("x", gap, e)):
            for i, kl in enumerate(np.linspace(0.010, 0.008, n) + shift):
                u = 1000 * (kl - 0.009)
                acc = 0.80 - 0.5 * u / 100 + curve * u * u / 100 + extra / 100 + noise * rng.standard_normal() / 100
                rows.append({"model": f"s{s}-{fork}@{i}", "run": f"hmm-s{s}-late-{fork}", "step": 100 + 20 * i,
                             "seed": s, "point": "late", "fork": fork, "kl": kl, "acc": acc,
                             "trace_fisher": 10.0 + 100 * kl})
    return rows


def test_each_pairs_leverage_and_residuals_are_least_squares():
    rows = _rows([0.5, 0.2], [3e-4, 1.5e-3], n=4, noise=0.3)
    pairs = paired.estimate_pairs(rows, [(X, "late")], ["acc"], DESIGN)
    for q in pairs:
        lev, rss = 0.0, 0.0
        for fork in ("x", "r"):
            mine = [r for r in rows if r["seed"] == q["seed"] and r["fork"] == fork]
            X1 = np.column_stack([np.ones(4), [r["kl"] for r in mine]])
            y = np.array([r["acc"] for r in mine])
            x0 = np.array([1.0, q["target"]])
            lev += float(x0 @ np.linalg.inv(X1.T @ X1) @ x0)  # the hat value at the target
            rss += float(((y - X1 @ np.linalg.lstsq(X1, y, rcond=None)[0]) ** 2).sum())
        assert q["leverage"] == pytest.approx(lev, rel=1e-8) and q["rss_acc"] == pytest.approx(rss, rel=1e-8)
        assert q["leverage_mean"] == pytest.approx(0.5) and q["rss_df"] == 4
    fit = line([1.0, 2.0, 4.0], [1.0, 3.0, 2.0])
    assert (fit.slope, fit.mean, fit.at(3.0)) == pytest.approx(np.polyfit([1, 2, 4], [1, 3, 2], 1)[0:1].tolist()
                                                                 + [2.0, np.polyval(np.polyfit([1, 2, 4], [1, 3, 2], 1), 3.0)])
    f = fits_of(pairs, "acc", 100.0)
    assert f.d.tolist() == pytest.approx([100 * q["d_acc"] for q in pairs])


def test_the_curvature_test_is_the_quadratic_terms_t_test():
    """``curvature_p`` against statsmodels' OLS on 1, x, x² (its t test of x²); nan with fewer
    than 4 distinct KLs; a curved fork rejects linearity, a straight one does not."""
    import statsmodels.api as sm

    rng = np.random.default_rng(4)
    x = np.linspace(0.008, 0.010, 5)
    y = 3.0 - 200 * x + 4e5 * (x - 0.009) ** 2 + rng.normal(0, 0.01, 5)
    fit = sm.OLS(y, np.column_stack([np.ones(5), x, x * x])).fit()
    assert curvature_p(x, y) == pytest.approx(float(fit.pvalues[2]), rel=1e-6)
    assert math.isnan(curvature_p(x[:3], y[:3]))
    curved = paired.estimate_pairs(_rows([0.0] * 4, [0.0] * 4, n=5, noise=0.02, curve=3.0), [(X, "late")],
                                   ["acc", "trace_fisher"], DESIGN)
    straight = paired.estimate_pairs(_rows([0.0] * 4, [0.0] * 4, n=5, noise=0.02), [(X, "late")],
                                     ["acc", "trace_fisher"], DESIGN)
    c = paired.differences(curved, [(X, "late")], [("acc", "acc")], "acc", DESIGN, n_boot=0)[0]
    s = paired.differences(straight, [(X, "late")], [("acc", "acc")], "acc", DESIGN, n_boot=0)[0]
    assert c["curvature_tested"] == s["curvature_tested"] == 8
    assert c["curvature_rejected"] == 8 and c["curvature_p"] < 1e-6 and s["curvature_p"] > 0.01


def test_a_nan_in_a_used_estimate_names_run_checkpoint_and_column():
    rows = _rows([1.0, 1.2], [0.0, 0.0])
    rows[4]["acc"] = float("nan")
    with pytest.raises(UserError, match=r"run hmm-s0-late-x, checkpoint step 120: acc is NaN"):
        paired.estimate_pairs(rows, [(X, "late")], ["acc"], DESIGN)


def test_a_short_fork_is_named_and_one_without_a_line_is_not_used():
    rows = [r for r in _rows([1.0, 1.2, 0.9], [0.0, 0.0, 0.0]) if not (r["seed"] == 1 and r["model"].endswith("x@2"))]
    rows = [r for r in rows if not (r["seed"] == 2 and r["fork"] == "r" and not r["model"].endswith("@0"))]
    pairs = paired.estimate_pairs(rows, [(X, "late")], ["acc", "trace_fisher"], DESIGN)
    assert pairs[1]["short"] == "x has 2 of 3 checkpoints" and pairs[1]["used"]
    assert not pairs[2]["used"] and not pairs[2]["readable"] and "r has 1 distinct measured KL(s)" in pairs[2]["reason"]
    section = Section("")
    pairs_table(section, pairs, "acc")
    assert "x @ late, seed 1: x has 2 of 3 checkpoints" in section.notes[-1]


def test_the_limit_is_in_nats_the_same_for_every_fork_and_shown_at_zero_and_none():
    """Ranges 2e-3 wide: a gap of 1.8e-3 puts each fork 0.9e-3 outside (under the 1e-3 limit), a
    gap of 2.4e-3 1.2e-3 outside (beyond): that pair is named and left out of the estimate,
    but counted at no limit; at limit 0 only the overlapping pairs are."""
    gaps = [0.0, 0.0, 3.8e-3, 4.4e-3, 0.0]
    pairs = paired.estimate_pairs(_rows([1.0, 1.1, 0.9, 1.2, 1.0], gaps), [(X, "late")], ["acc", "trace_fisher"],
                                  DESIGN)
    assert [q["used"] for q in pairs] == [True, True, True, False, True]
    assert [q["inside"] for q in pairs] == [True, True, False, False, True]
    assert "estimated 1.20e-03 nats outside its measured KL range (limit 1.0e-03 nats)" in pairs[3]["reason"]
    row = paired.differences(pairs, [(X, "late")], [("acc", "acc")], "acc", DESIGN, n_boot=0)[0]
    assert (row["n_used"], row["inside_n"], row["all_n"], row["n_beyond_limit"]) == (4, 3, 5, 1)
    assert row["max_outside"] == pytest.approx(0.9e-3) and row["limit"] == 1e-3


# ---- verdicts: the claim's margin, the power as made, decided after Holm ------------------------------
def test_verdicts_read_each_claims_margin_and_power_is_the_verdicts():
    """Two comparisons with margins 1 and 0.35 on the same differences: equivalent at ±1, not
    at ±0.35; the power of a "no effect" is TOST's at 0, of a detection the test's at δ, both at
    Holm's first step of the family; decided = survives Holm."""
    wide, narrow = Comparison("wide", "x", "r", +1, "", margin=1.0), Comparison("narrow", "x", "r", +1, "", margin=0.35)
    rows = _rows([0.4, -0.5, 0.6, 0.0, -0.45, 0.3], [0.0] * 6)
    tests = [(wide, "late"), (narrow, "late")]
    design = Design(trace_margin=0.05, limit=1e-3, claims=("wide @ late", "narrow @ late"))
    pairs = paired.estimate_pairs(rows, tests, ["acc", "trace_fisher"], design)
    out = {r["comparison"]: r for r in paired.differences(pairs, tests, [("acc", "acc")], "acc", design, n_boot=0)
           if r["quantity"] == "acc"}
    w, n = out["wide"], out["narrow"]
    assert w["verdict"] == EQUIVALENT and n["verdict"] == INCONCLUSIVE and w["holm_m"] == 2
    assert w["decided"] == (w["tost_holm_p"] <= 0.05) and not n["decided"]
    assert w["power"] == pytest.approx(tost_power(1.0, w["se"], w["df"], 0.025))
    assert n["power"] == pytest.approx(t_test_power(0.35 / n["se"], n["df"], 1 - 0.025))
    assert w["secondary_margin"] == 0.35 and w["secondary_verdict"] == n["verdict"]
    shifted = _rows([3.0, 3.2, 2.8, 3.1], [0.0] * 4, noise=0.0)
    pairs = paired.estimate_pairs(shifted, [(wide, "late")], ["acc", "trace_fisher"], Design(0.05, 1e-3))
    det = paired.differences(pairs, [(wide, "late")], [("acc", "acc")], "acc", Design(0.05, 1e-3), n_boot=0)[0]
    assert det["verdict"] == DETECTED and det["decided"]
    assert det["power"] == pytest.approx(t_test_power(1.0 / det["se"], det["df"], 0.95))


def test_tost_power_at_zero_is_what_simulation_gives():
    """``tost_power`` (the standard error taken as known) against TOST on simulated paired
    differences at a true 0: within the Monte Carlo error and the estimated spread's effect."""
    rng = np.random.default_rng(5)
    n, sd, margin = 12, 0.6, 0.5
    hits = 0
    for _ in range(4000):
        hits += paired_difference(rng.normal(0, sd, n), n_boot=0).tost_p(margin) <= 0.05
    assert hits / 4000 == pytest.approx(tost_power(margin, sd / math.sqrt(n), n - 1, 0.05), abs=0.04)


def test_a_test_key_reads_and_writes_its_text():
    key = Key("sam05-half", "scratch")
    assert str(key) == "sam05-half @ scratch" and Key.parse("sam05-half @ scratch") == key
    with pytest.raises(ValueError, match="comparison @ point"):
        Key.parse("sam05-half")


# ---- flatness by assigned arm ---------------------------------------------------------------------------
def _arm_pairs(per_lambda, seeds, noise, rng, point="late", trace_per_lambda=-0.13):
    """Pairs as ``estimate_pairs`` writes them: per seed and arm the accuracy difference (a
    fraction) = ``per_lambda`` × λ/1e-4 + noise (points/100), the trace ``trace_per_lambda``
    × λ/1e-4 relative to AdamW's."""
    out = []
    for seed in seeds:
        ref = 90 + 5 * rng.standard_normal()
        for c in FLAT:
            lam = LAMBDAS[c.name] / LAMBDA_UNIT
            x = trace_per_lambda * lam + 0.02 * rng.standard_normal()
            y = per_lambda * lam + noise * rng.standard_normal()
            out.append({"comparison": c.name, "point": point, "seed": seed, "used": True, "readable": True,
                        "recipe_trace_fisher": ref * (1 + x), "reference_trace_fisher": ref, "d_acc": y / 100})
    return out


def test_the_trend_is_the_per_seed_slope_through_adamws_arm_with_a_t_test():
    rng = np.random.default_rng(6)
    pairs = _arm_pairs(0.5, range(8), 0.3, rng)
    pts = dose_points(pairs, FLAT, "late", "acc", LAMBDAS)
    got = trend(pts, 1.0, DESIGN)
    lam = np.array([LAMBDAS[c.name] / LAMBDA_UNIT for c in FLAT])
    per_seed = []
    for s in range(8):
        y = np.array([100 * q["d_acc"] for q in pairs if q["seed"] == s])
        per_seed.append(float((lam * y).sum() / (lam * lam).sum()))
    want = paired_difference(per_seed, n_boot=0)
    assert (got["slope"], got["low"], got["high"], got["n_seeds"]) == pytest.approx(
        (want.mean, want.t_low, want.t_high, 8))
    assert got["margin"] == pytest.approx(1.0 / 3.0)  # δ at the strongest arm (λ = 3e-4)
    assert got["verdict"] == DETECTED


def test_fieller_is_the_set_the_brute_force_search_finds():
    """Fieller's interval for mean(a)/mean(b): every β on a fine grid with (ā − βb̄)² ≤
    t² Var(ā − βb̄) lies inside it, none outside; unbounded where b̄ is within its noise."""
    from scipy.stats import t as student_t

    rng = np.random.default_rng(7)
    a = rng.normal(2.0, 1.0, 10)
    b = rng.normal(-0.8, 0.3, 10) + 0.2 * (a - 2.0)
    ratio, low, high = fieller(a, b)
    n = a.size
    t2 = student_t.ppf(0.975, n - 1) ** 2
    grid = np.linspace(ratio - 20, ratio + 20, 40001)
    va, vb, c = np.var(a, ddof=1) / n, np.var(b, ddof=1) / n, np.cov(a, b, ddof=1)[0, 1] / n
    inside = (a.mean() - grid * b.mean()) ** 2 <= t2 * (va - 2 * grid * c + grid * grid * vb)
    assert ratio == pytest.approx(a.mean() / b.mean())
    assert grid[inside].min() == pytest.approx(low, abs=2e-3) and grid[inside].max() == pytest.approx(high, abs=2e-3)
    weak = fieller(a, rng.normal(0.05, 1.0, 10))
    assert weak[1] == -math.inf and weak[2] == math.inf


def test_dose_response_by_arm_recovers_the_trend_the_wald_ratio_and_drops_no_pair():
    rng = np.random.default_rng(8)
    late = _arm_pairs(0.5, range(10), 0.2, rng)
    scratch = _arm_pairs(0.0, range(10), 0.2, rng, point="scratch")
    # a pair whose arm barely moved the trace is kept (no floor on a post-treatment variable)
    late[0]["recipe_trace_fisher"] = late[0]["reference_trace_fisher"] * 1.001
    out, changes, pts = dose_response(late + scratch, FLAT, ["late", "scratch"], "acc", DESIGN, LAMBDAS, 1.0)
    assert len(pts) == 60 and {r["point"] for r in out} == {"late", "scratch"}
    late_row = next(r for r in out if r["point"] == "late")
    assert late_row["slope"] == pytest.approx(0.5, abs=0.1) and late_row["verdict"] == DETECTED
    # the Wald ratio: accuracy per unit of relative trace change = 0.5 / −0.13
    assert late_row["wald"] == pytest.approx(0.5 / -0.13, rel=0.25) and late_row["wald_low"] < late_row["wald_high"]
    assert late_row["wald_interval"] == ""
    assert wald([p for p in pts if p["point"] == "late"])["wald_seeds"] == 10
    arm = {(c["fork"], c["point"]): c for c in changes}
    for fork in ("flat", "sharp"):
        mine = [p["x"] for p in pts if p["fork"] == fork and p["point"] == "late"]
        assert arm[(fork, "late")]["trace_change"] == pytest.approx(np.mean(mine))
        assert arm[(fork, "late")]["trace_low"] < np.mean(mine) < arm[(fork, "late")]["trace_high"]
    assert arm[("flat", "late")]["trace_change"] < 0 < arm[("sharp", "late")]["trace_change"]
    assert {r["holm_p"] >= r["p_value"] for r in out} == {True}
