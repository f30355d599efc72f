"""The estimate of a comparison at the target KL (``weighted``: leverage weights, HKSJ, the
common KL slope, Stein's weighted test) against brute force, statsmodels and simulation; the
pairs' leverage and residuals against least squares; nothing silent (NaN, n ≤ 1, a short
fork, Holm's count); and the dose-response of the flatness forks (``dose_response``)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sameloss.errors import UserError
from sameloss.experiments.stats import paired
from sameloss.experiments.stats.dose_response import DOSE_TRACE_CHANGE, dose_points, dose_response, pooled_slope
from sameloss.experiments.stats.paired import Comparison, Design
from sameloss.experiments.reports.document import Section
from sameloss.experiments.stats.inference import DETECTED, DETECTED_AGAINST, paired_difference
from sameloss.experiments.stats.weighted import COMMON, SEPARATE, Fits, estimate, fits_of, line

FLAT = [Comparison(name, name, "adamw", +1, "") for name in ("flat", "sharp", "flatter")]
DESIGN = Design(margin=0.35, trace_margin=0.05, limit=0.5, tolerance=3e-4)
X = Comparison("x", "x", "r", +1, "")


def _fits(d, lev, rss=None, rdf=None, pilot=None, touching=False, **kw) -> Fits:
    n = len(d)
    d = np.asarray(d, dtype=float)
    z = np.zeros(n)
    return Fits(d, np.asarray(lev, dtype=float), np.full(n, 2 / 3), z if rss is None else np.asarray(rss, float),
                np.full(n, 2.0) if rdf is None else np.asarray(rdf, float), kw.get("dmean", d), kw.get("dkl", z),
                kw.get("sxx_recipe", np.full(n, 1e-6)), kw.get("sxx_reference", np.full(n, 1e-6)),
                kw.get("slope_recipe", z), kw.get("slope_reference", z), np.full(n, touching),
                np.zeros(n, bool) if pilot is None else np.asarray(pilot, bool))


# ---- the weighted estimate -------------------------------------------------------------------------
def test_equal_leverages_give_the_paired_t_test_and_steins_exactly():
    rng = np.random.default_rng(0)
    d = rng.normal(0.3, 0.5, 9)
    rss = rng.chisquare(2, 9) * 0.04
    for lev in (np.full(9, 2 / 3), np.full(9, 4.0)):  # any common leverage: equal weights
        e, t = estimate(_fits(d, lev, rss)), paired_difference(d, n_boot=0)
        assert e.model == SEPARATE and e.n == t.n == 9 and e.df == t.df == 8
        for got, want in ((e.mean, t.mean), (e.sd, t.sd), (e.t_low, t.t_low), (e.t_high, t.t_high),
                          (e.p_value, t.p_value), (e.mde, t.mde), (e.eq_low, t.eq_low), (e.tost_p(0.35), t.tost_p(0.35))):
            assert got == pytest.approx(want, rel=1e-10)
    # the adaptive study's final test: Stein's, its scale from the pilot's pairs alone
    pilot = np.arange(9) < 4
    e = estimate(_fits(d, np.full(9, 1.3), rss, pilot=pilot), stein=True)
    t = paired_difference(d, n_boot=0, pilot=d[:4])
    assert (e.df, e.mean, e.t_low, e.t_high, e.p_value, e.mde) == pytest.approx(
        (t.df, t.mean, t.t_low, t.t_high, t.p_value, t.mde), rel=1e-10)


@pytest.mark.filterwarnings("ignore::statsmodels.tools.sm_exceptions.InvalidTestWarning")
def test_the_weighted_estimate_is_dersimonian_laird_with_the_hksj_interval():
    """Within variances σ̂²·L (σ̂² the lines' pooled residual variance): statsmodels'
    DerSimonian–Laird random effects, its "random effect wls" row the HKSJ interval."""
    from statsmodels.stats.meta_analysis import combine_effects

    rng = np.random.default_rng(1)
    for n in (4, 8, 15):
        # heterogeneous: statsmodels leaves a negative DerSimonian–Laird τ² untruncated (the
        # estimator truncates it at 0), so compare where τ² > 0
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
        # the share of the variance that is extrapolation: σ²(L − L₀) weighted, by hand
        w = 1 / (e.tau2 + sigma2 * lev)
        want = (w ** 2 * sigma2 * (lev - 2 / 3)).sum() / (w ** 2 * (e.tau2 + sigma2 * lev)).sum()
        assert e.extrapolation == pytest.approx(want, rel=1e-10)


def test_a_pair_read_off_a_long_lever_weighs_little():
    """One pair among 16 extrapolated far (L = 200): the plain mean moves by its noise, the
    weighted estimate hardly (the toy study of issue 46: 0.3 → 1.2)."""
    d = np.full(16, 0.3) + np.tile([0.05, -0.05], 8)
    d[0] = 0.3 + 14.4  # its line read 1e-3 nats outside a 1e-4-wide range
    lev = np.full(16, 2 / 3)
    lev[0] = 200.0
    rss = np.full(16, 0.04)
    assert np.mean(d) == pytest.approx(1.2, abs=0.01)
    e = estimate(_fits(d, lev, rss))
    assert abs(e.mean - 0.3) < 0.05 and e.extrapolation > 0


def test_the_estimate_holds_its_size_at_unequal_leverages():
    """Type-I error of the weighted test by simulation: pairs with the pilot's kinds of
    leverage (overlapping, touching, far), τ and σ of the pilot's order."""
    rng = np.random.default_rng(2)
    hits, trials = 0, 2000
    for _ in range(trials):
        lev = rng.choice([0.67, 1.7, 4.0, 12.0], 10)
        sigma = 0.2
        d = rng.normal(0, 0.3, 10) + rng.normal(0, sigma * np.sqrt(lev))
        rss = sigma ** 2 * rng.chisquare(2, 10)
        hits += estimate(_fits(d, lev, rss)).p_value <= 0.05
    assert 0.035 <= hits / trials <= 0.065


def test_the_common_kl_slope_only_where_the_ranges_touch_and_the_slopes_agree():
    rng = np.random.default_rng(3)
    n = 8
    dkl = rng.uniform(-4e-4, 4e-4, n)  # the forks' mean KLs apart
    beta = -400.0
    dmean = 0.5 + beta * dkl + rng.normal(0, 0.01, n)  # the effect at one KL is 0.5
    slopes = beta + rng.normal(0, 5, (2, n))
    kw = dict(dmean=dmean, dkl=dkl, slope_recipe=slopes[0], slope_reference=slopes[1])
    f = _fits(np.full(n, 0.5) + rng.normal(0, 0.2, n), np.full(n, 3.0), np.full(n, 1e-3), touching=True, **kw)
    e = estimate(f, slope_level=0.2)
    assert e.model == COMMON and e.slope_p >= 0.2 and e.mean == pytest.approx(0.5, abs=0.02)
    # Δȳ − β̂ Δx̄ with β̂ pooled over both forks (Sxx-weighted), by hand
    assert e.mean == pytest.approx(np.mean(dmean - np.mean(slopes) * dkl), rel=1e-9)
    assert estimate(_fits(f.d, f.lev, f.rss, touching=False, **kw)).model == SEPARATE  # ranges apart
    apart = dict(kw, slope_recipe=slopes[0] + 300.0)  # slopes that differ: the test rejects
    e = estimate(_fits(f.d, f.lev, f.rss, touching=True, **apart), slope_level=0.2)
    assert e.model == SEPARATE and e.slope_p < 0.2


def test_fewer_than_two_pairs_have_no_interval_and_count_in_holms_family():
    est = estimate(_fits([0.4], [1.0]))
    assert est.n == 1 and math.isnan(est.t_low) and math.isnan(est.p_value)
    assert paired.holm_counted([0.01, math.nan, 0.02]) == pytest.approx([0.03, math.nan, 0.04], nan_ok=True)
    rows = _rows([1.0, 1.2, 0.8], [0.0, 0.0, 0.0])
    rows = [r for r in rows if r["seed"] == 0]
    pairs = paired.estimate_pairs(rows, [(X, "late")], ["acc", "trace_fisher"], DESIGN)
    out = paired.differences(pairs, [(X, "late")], [("acc", "acc")], "acc", DESIGN, n_boot=0)
    assert out[0]["verdict"] == "no interval: 1 pair(s)" and out[0]["holm_m"] == 1


# ---- the pairs: leverage, residuals, NaN, short forks ------------------------------------------------
def _rows(effects, gaps, n=3, noise=0.0, seed=0):
    """Per seed a reference r on KL 0.010 → 0.008 and a recipe x shifted up by ``gap``."""
    rng = np.random.default_rng(seed)
    rows = []
    for s, (e, gap) in enumerate(zip(effects, gaps)):
        for fork, shift, extra in (("r", 0.0, 0.0), ("x", gap, e)):
            for i, kl in enumerate(np.linspace(0.010, 0.008, n) + shift):
                acc = 0.80 - 0.5 * 1000 * (kl - 0.009) / 100 + extra / 100 + noise * rng.standard_normal() / 100
                rows.append({"model": f"s{s}-{fork}@{i}", "run": f"hmm-s{s}-late-{fork}", "step": 100 + 20 * i,
                             "seed": s, "point": "late", "fork": fork, "kl": kl, "acc": acc,
                             "trace_fisher": 10.0 + 100 * kl})
    return rows


def test_each_pairs_leverage_and_residuals_are_least_squares():
    pairs = paired.estimate_pairs(_rows([0.5, 0.2], [3e-4, 1.5e-3], n=4, noise=0.3), [(X, "late")], ["acc"], DESIGN)
    rows = _rows([0.5, 0.2], [3e-4, 1.5e-3], n=4, noise=0.3)
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
    # fits_of reads a pair's lines back: the forks' means and the common-slope inputs
    f = fits_of(pairs, "acc", 100.0)
    mean_x = np.mean([r["acc"] for r in rows if r["seed"] == 0 and r["fork"] == "x"]) * 100
    mean_r = np.mean([r["acc"] for r in rows if r["seed"] == 0 and r["fork"] == "r"]) * 100
    assert f.dmean[0] == pytest.approx(mean_x - mean_r) and f.dkl[0] == pytest.approx(3e-4)


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
    assert not pairs[2]["used"] and "r has 1 distinct measured KL(s)" in pairs[2]["reason"]
    section = Section("")
    paired.pairs_table(section, pairs, "acc")
    assert "x @ late, seed 1: x has 2 of 3 checkpoints" in section.notes[-1]


def test_the_limit_is_relative_to_each_forks_range():
    # ranges 2e-3 wide: a gap of 1.9e-3 puts each fork 0.95e-3 (under 0.5 ranges) outside; 2.2e-3 beyond
    pairs = paired.estimate_pairs(_rows([1.0, 1.0], [3.9e-3, 4.2e-3]), [(X, "late")], ["acc"], DESIGN)
    assert pairs[0]["used"] and not pairs[1]["used"]
    assert "1.10e-03 nats outside its measured KL range (2.00e-03 wide; limit 0.5 × its range)" in pairs[1]["reason"]


# ---- the dose-response ------------------------------------------------------------------------------
def _dose_pairs(slope, seeds, noise, rng, point="late", changes=(-0.25, 0.27, -0.32)):
    """Pairs as ``estimate_pairs`` writes them: the accuracy difference (a fraction) =
    slope × relative trace change / 100 + noise (points / 100)."""
    out = []
    for seed in seeds:
        ref = 90 + 5 * rng.standard_normal()
        for c, change in zip(FLAT, changes):
            x = change + 0.03 * rng.standard_normal()
            y = slope * x + noise * rng.standard_normal()
            out.append({"comparison": c.name, "point": point, "seed": seed, "used": True,
                        "recipe_trace_fisher": ref * (1 + x), "reference_trace_fisher": ref, "d_acc": y / 100})
    return out


def test_the_pooled_slope_and_its_jackknife_against_brute_force():
    pts = [{"seed": s, "x": x, "y": y} for s, x, y in
           ((0, -0.2, 1.0), (0, 0.3, -0.5), (1, 0.25, -1.0), (2, -0.3, 0.4), (2, 0.02, 3.0))]
    fit = pooled_slope(pts)
    x, y, g = (np.array([p[k] for p in pts]) for k in ("x", "y", "seed"))
    assert fit["slope"] == pytest.approx((x * y).sum() / (x * x).sum(), rel=1e-12)
    loo = [(x * y)[g != s].sum() / (x * x)[g != s].sum() for s in (0, 1, 2)]
    assert fit["se"] == pytest.approx(math.sqrt(2 / 3 * sum((v - np.mean(loo)) ** 2 for v in loo)), rel=1e-12)
    assert fit["df"] == 2 and fit["n_pairs"] == 5


def test_the_dose_response_recovers_a_slope_names_what_it_leaves_out_and_splits_the_sides():
    rng = np.random.default_rng(1)
    covered = 0
    for _ in range(40):
        pairs = _dose_pairs(-4.0, range(8), 0.4, rng) + _dose_pairs(4.0, range(8), 0.4, rng, point="scratch")
        late, scratch = dose_response(None, pairs, FLAT, ["late", "scratch"], "acc", DESIGN)
        covered += late["t_low"] <= -4.0 <= late["t_high"]
        assert late["verdict"] == DETECTED and scratch["verdict"] == DETECTED_AGAINST
        assert late["holm_p"] >= late["p_value"]
    assert 33 <= covered <= 40  # 95 %: 38 of 40 expected
    # a seed whose one fork barely moved the trace, and a reference trace of 0: named, left out
    pairs = _dose_pairs(-2.0, range(3), 0.1, rng)
    pairs[0]["recipe_trace_fisher"] = pairs[0]["reference_trace_fisher"] * 1.02
    pairs[0]["d_acc"] = 5.0  # would dominate the slope if read
    pairs[4]["reference_trace_fisher"] = 0.0
    pts, left = dose_points(pairs, FLAT, "late", "acc", DESIGN.dose_floor)
    assert len(pts) == 7 and len(left) == 2
    assert "trace change +2.0%, under the floor ±5%" in left[0] and "reference's trace is 0" in left[1]
    section = Section("x")
    row, = dose_response(section, pairs, FLAT, ["late"], "acc", DESIGN)
    assert row["n_pairs"] == 7 and row["n_left_out"] == 2 and abs(row["slope"] + 2.0) < 1.0
    assert row["margin"] == pytest.approx(0.35 / DOSE_TRACE_CHANGE)
    flat = [p for p in pts if p["x"] < 0]
    assert row["flattening_slope"] == pytest.approx(sum(p["x"] * p["y"] for p in flat) / sum(p["x"] ** 2 for p in flat))
    assert row["flattening_pairs"] + row["sharpening_pairs"] == 7
    assert section.files["dose_response.csv"] == [row] and len(section.files["dose_points.csv"]) == 7
    assert "Dose-response" in section.tables[0].markdown() and "left out of the slope" in section.notes[0]
    assert len(section.claims) == 1 and "points per unit of relative trace change" in section.claims[0].measured
