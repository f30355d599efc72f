"""Rank correlations, bootstrap intervals, verdicts and claim sentences (hand-computed cases)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sameloss.experiments.stats import inference as stats
from sameloss.experiments.reports.claims import POINTS, Shown, difference_claim, quantity_se, trend_claim
from sameloss.experiments.stats.inference import (AGREES, AGREES_WEAKLY, DISAGREES, DISAGREES_WEAKLY, UNDEFINED,
    Interval, bootstrap_ci, diff_interval, kendall_tau, rankdata, spearman_rho, verdict)


def test_rankdata_averages_ties():
    assert rankdata([10, 30, 20]).tolist() == [1, 3, 2]
    assert rankdata([1, 2, 2, 3]).tolist() == [1, 2.5, 2.5, 4]
    assert rankdata([5, 5, 5]).tolist() == [2, 2, 2]


def test_kendall_and_spearman_without_ties():
    # one discordant pair (2,3) of 6: tau = (5 - 1) / 6; sum d^2 = 2: rho = 1 - 6*2 / (4*15)
    x, y = [1, 2, 3, 4], [1, 3, 2, 4]
    assert kendall_tau(x, y) == pytest.approx(4 / 6)
    assert spearman_rho(x, y) == pytest.approx(0.8)
    assert kendall_tau(x, x[::-1]) == pytest.approx(-1)
    assert spearman_rho(x, [-v for v in x]) == pytest.approx(-1)


def test_kendall_tau_b_and_spearman_with_ties():
    # x ties one pair: S = 5 concordant, n0 = 6, n1 = 1, n2 = 0 -> 5 / sqrt(5 * 6)
    x, y = [1, 2, 2, 3], [1, 2, 3, 4]
    assert kendall_tau(x, y) == pytest.approx(5 / math.sqrt(30))
    # Pearson of ranks [1, 2.5, 2.5, 4] and [1, 2, 3, 4]: 4.5 / sqrt(4.5 * 5)
    assert spearman_rho(x, y) == pytest.approx(4.5 / math.sqrt(22.5))


def test_undefined_correlations_are_nan():
    assert math.isnan(kendall_tau([1], [2]))
    assert math.isnan(kendall_tau([1, 1, 1], [1, 2, 3]))
    assert math.isnan(spearman_rho([2, 2], [1, 5]))
    with pytest.raises(ValueError):
        kendall_tau([1, 2], [1, 2, 3])


def test_against_scipy_when_available():
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(0)
    for _ in range(20):
        x = rng.integers(0, 5, size=12).astype(float)  # many ties
        y = x + rng.integers(-2, 3, size=12)
        assert kendall_tau(x, y) == pytest.approx(stats.kendalltau(x, y).statistic, abs=1e-12)
        assert spearman_rho(x, y) == pytest.approx(stats.spearmanr(x, y).statistic, abs=1e-12)


def test_bootstrap_interval_is_reproducible_and_sane():
    rng = np.random.default_rng(1)
    x = np.arange(30, dtype=float)
    y = -x + rng.normal(0, 3, size=30)
    a = bootstrap_ci(kendall_tau, x, y, n_boot=500, seed=3)
    b = bootstrap_ci(kendall_tau, x, y, n_boot=500, seed=3)
    assert a == b
    assert a.low <= a.estimate <= a.high < 0
    assert a.n == 30 and a.n_boot == 500
    # a perfectly monotone sample: every resample with two distinct x has tau -1
    c = bootstrap_ci(kendall_tau, [1, 2, 3, 4, 5], [5, 4, 3, 2, 1], n_boot=200)
    assert (c.estimate, c.low, c.high) == (-1, -1, -1)
    assert c.n_undefined >= 0


def test_bootstrap_of_a_mean_matches_the_normal_interval_roughly():
    rng = np.random.default_rng(2)
    v = rng.normal(10, 2, size=400)
    iv = bootstrap_ci(np.mean, v, n_boot=2000, seed=0)
    half = 1.96 * v.std(ddof=1) / math.sqrt(v.size)
    assert iv.low == pytest.approx(v.mean() - half, abs=0.1 * half)
    assert iv.high == pytest.approx(v.mean() + half, abs=0.1 * half)


def test_diff_interval():
    iv = diff_interval(1.0, 0.3, 2.0, 0.4)  # b - a = 1, se 0.5
    assert iv.estimate == pytest.approx(1.0)
    assert iv.low == pytest.approx(1 - 1.96 * 0.5, abs=1e-3)
    assert iv.high == pytest.approx(1 + 1.96 * 0.5, abs=1e-3)


@pytest.mark.parametrize("est,lo,hi,sign,expected", [
    (1.0, 0.5, 1.5, +1, AGREES),
    (1.0, -0.5, 2.5, +1, AGREES_WEAKLY),
    (-1.0, -1.5, -0.5, +1, DISAGREES),
    (-1.0, -2.0, 0.5, +1, DISAGREES_WEAKLY),
    (-1.0, -1.5, -0.5, -1, AGREES),
    (0.0, -1.0, 1.0, -1, UNDEFINED),
    (float("nan"), float("nan"), float("nan"), +1, UNDEFINED),
])
def test_verdict(est, lo, hi, sign, expected):
    assert verdict(Interval(est, lo, hi), sign) == expected


def _row(acc, std, trace=None, se=None, kl=0.01):
    row = {"probe_B": acc, "probe_B_std": std, "kl": kl}
    if trace is not None:
        row.update(trace_fisher=trace, trace_fisher_se=se)
    return row


def test_difference_claim_is_computed_from_the_data():
    a, b = _row(0.50, 0.01), _row(0.60, 0.01)  # +10 points, se 0.01/sqrt(5) each
    claim = difference_claim("accuracy rises", "probe B", "probe_B", (a, "first"), (b, "last"), +1, POINTS, n_seeds=5)
    assert claim.verdict == AGREES
    assert "difference 10 pts" in claim.measured
    half = 1.96 * math.sqrt(2) * 1 / math.sqrt(5)
    assert f"[{10 - half:.3g}, {10 + half:.3g}]" in claim.measured
    # the same data against the opposite claim, and a noisy version
    assert difference_claim("falls", "probe B", "probe_B", (a, "a"), (b, "b"), -1, Shown(scale=100),
                            n_seeds=5).verdict == DISAGREES
    noisy = difference_claim("rises", "probe B", "probe_B", (_row(0.50, 0.2), "a"), (_row(0.52, 0.2), "b"), +1,
                             Shown(scale=100), n_seeds=5)
    assert noisy.verdict == AGREES_WEAKLY
    # the trace uses its own standard error
    t = difference_claim("falls", "trace", "trace_fisher", (_row(0.5, 0.0, 20.0, 1.0), "a"),
                         (_row(0.5, 0.0, 15.0, 1.0), "b"), -1)
    assert t.verdict == AGREES and "difference -5" in t.measured
    assert quantity_se(_row(0.5, 0.0, 20.0, 1.0), "trace_fisher") == 1.0


def test_trend_claim():
    claim, iv = trend_claim("falls", "trace vs step", [1, 2, 3, 4, 5, 6], [9, 8, 7, 6, 5, 4], -1, n_boot=300)
    assert iv.estimate == -1 and claim.verdict == AGREES
    claim, iv = trend_claim("falls", "trace vs step", [1, 2, 3, 4, 5, 6], [4, 5, 6, 7, 8, 9], -1, n_boot=300)
    assert claim.verdict == DISAGREES


# ---- power ---------------------------------------------------------------------------------
# Student's t quantiles from a printed table (e.g. Fisher & Yates; 3 decimals)
T_TABLE = {1: (12.706, 1.376), 2: (4.303, 1.061), 4: (2.776, 0.941), 5: (2.571, 0.920), 7: (2.365, 0.896),
           10: (2.228, 0.879), 11: (2.201, 0.876), 15: (2.131, 0.866), 30: (2.042, 0.854), 120: (1.980, 0.845)}


@pytest.mark.parametrize("df", sorted(T_TABLE))
def test_t_quantiles_match_the_table(df):
    q975, q80 = T_TABLE[df]
    assert stats.t_quantile(0.975, df) == pytest.approx(q975, abs=6e-4)
    assert stats.t_quantile(0.8, df) == pytest.approx(q80, abs=6e-4)
    assert stats.t_quantile(0.025, df) == pytest.approx(-q975, abs=6e-4)


def test_t_cdf_closed_forms():
    # df 1 is the Cauchy distribution, df 2 has F(t) = 1/2 + t / (2 sqrt(2 + t²))
    for t in (-3.0, -0.4, 0.0, 0.7, 5.0):
        assert stats.t_cdf(t, 1) == pytest.approx(0.5 + math.atan(t) / math.pi, abs=1e-13)
        assert stats.t_cdf(t, 2) == pytest.approx(0.5 + t / (2 * math.sqrt(2 + t * t)), abs=1e-13)
    assert stats.t_quantile(stats.t_cdf(1.234, 9), 9) == pytest.approx(1.234, abs=1e-10)


def test_paired_difference_known_values():
    d = stats.paired_difference([1.0, 2.0, 3.0, 4.0, 5.0], n_boot=500)
    se = math.sqrt(2.5) / math.sqrt(5)
    assert (d.n, d.mean, d.sd) == (5, 3.0, pytest.approx(math.sqrt(2.5)))
    assert d.t_low == pytest.approx(3.0 - 2.776 * se, abs=1e-3) and d.t_high == pytest.approx(3.0 + 2.776 * se, abs=1e-3)
    # the noncentral-t MDE: λ* = 3.7354 solves P(|T'(4, λ)| > 2.776) = 0.8 (statsmodels' TTestPower agrees below)
    assert d.mde == pytest.approx(stats.noncentral_mde(se, 4), rel=1e-12)
    assert stats.t_test_power(d.mde / se, 4) == pytest.approx(0.8, abs=1e-9)
    # t = 3 / se = 4.243 on 4 df: two-sided p = 0.0132
    assert d.p_value == pytest.approx(0.0132, abs=2e-4)
    assert 1.0 <= d.boot_low < 3.0 < d.boot_high <= 5.0
    assert stats.power_verdict(d, +1, 1.0) == stats.DETECTED
    assert stats.power_verdict(d, -1, 1.0) == stats.DETECTED_AGAINST
    null = stats.paired_difference([-1.0, 1.0, -0.5, 0.5], n_boot=200)
    # its 90 % interval (±1.07) lies inside ±1.1 (TOST rejects both sides at 5 %) but not inside ±1.0
    assert null.eq_high == pytest.approx(stats.t_quantile(0.95, 3) * null.se)
    assert stats.power_verdict(null, +1, 1.1) == stats.EQUIVALENT and null.tost_p(1.1) < 0.05
    assert stats.power_verdict(null, +1, 1.0) == stats.INCONCLUSIVE and null.tost_p(1.0) > 0.05
    assert math.isnan(stats.paired_difference([1.0]).mde)


@pytest.mark.parametrize("n", [2, 3, 10])
def test_minimum_detectable_effect_has_the_stated_power(n):
    # simulate: a true effect equal to the MDE is detected (two-sided) in 80% of experiments,
    # also at n = 2 (the main job), where the normal-shift approximation is 14 % optimistic
    rng = np.random.default_rng(n)
    sd = 1.0
    mde = stats.minimum_detectable_effect(sd, n)
    q = stats.t_quantile(0.975, n - 1)
    x = rng.normal(mde, sd, size=(40000, n))
    t = x.mean(axis=1) / (x.std(axis=1, ddof=1) / math.sqrt(n))
    assert (np.abs(t) > q).mean() == pytest.approx(0.8, abs=0.01)
    normal_shift = (q + stats.t_quantile(0.8, n - 1)) * sd / math.sqrt(n)
    if n == 2:
        assert mde / normal_shift == pytest.approx(1.16, abs=0.01)


def test_the_mde_and_power_agree_with_statsmodels():
    from statsmodels.stats import power  # a test dependency (pyproject's test extra)

    for n in (2, 3, 5, 16, 40):
        # statsmodels solves the standardised effect d = MDE / sd of a one-sample t test
        d = power.TTestPower().solve_power(nobs=n, alpha=0.05, power=0.8, alternative="two-sided")
        assert stats.minimum_detectable_effect(1.0, n) == pytest.approx(d, rel=1e-4)
        assert stats.t_power(0.7, 1.3, n) == pytest.approx(
            power.TTestPower().power(0.7 / 1.3, n, 0.05, alternative="two-sided"), abs=1e-6)
    # the numerical integral (used where scipy's nct gives nan) equals nct where both work
    from scipy.integrate import quad
    from scipy.stats import chi, norm
    c, df, lam = stats.t_quantile(0.975, 3), 3, 2.5
    direct = quad(lambda s: (norm.cdf(lam - c * s) + norm.cdf(-lam - c * s)) * chi.pdf(s, df, scale=df ** -0.5),
                  0, np.inf)[0]
    assert stats.t_test_power(lam, df) == pytest.approx(direct, abs=1e-7)


def test_fixed_effects_ols_equals_dummy_variable_least_squares():
    rng = np.random.default_rng(1)
    groups = np.repeat(np.arange(5), 6)
    X = rng.normal(size=(30, 2))
    y = 3.0 * groups + 2.0 * X[:, 0] - 1.5 * X[:, 1] + rng.normal(scale=0.1, size=30)
    dummies = (groups[:, None] == np.arange(5)[None]).astype(float)
    brute = np.linalg.lstsq(np.hstack([X, dummies]), y, rcond=None)[0][:2]
    assert np.allclose(stats.fixed_effects_ols(y, X, groups), brute, atol=1e-12)
    ivs = stats.cluster_bootstrap_ols(y, X, groups, n_boot=300)
    assert ivs[0].low < 2.0 < ivs[0].high and ivs[1].low < -1.5 < ivs[1].high
    assert ivs[0].high - ivs[0].low < 0.2
    # a column that is constant within every group has no within-group slope
    assert np.isnan(stats.fixed_effects_ols(y, np.c_[X[:, 0], groups], groups)).all()


def test_covariate_adjusted_mean_is_scipys_intercept_with_its_t_interval():
    from scipy import stats as sps

    rng = np.random.default_rng(3)
    c = rng.normal(size=15)
    d = 0.4 - 1.3 * c + rng.normal(scale=0.5, size=15)
    got = stats.covariate_adjusted_mean(d, c)
    fit = sps.linregress(c, d)
    half = sps.t.ppf(0.975, 13) * fit.intercept_stderr
    assert got.estimate == pytest.approx(fit.intercept, rel=1e-12)
    assert (got.low, got.high) == pytest.approx((fit.intercept - half, fit.intercept + half), rel=1e-6)
    # a covariate that is 0 everywhere but one pair leaves the other pairs' mean
    assert stats.covariate_adjusted_mean([1.0, 2.0, 3.0, 10.0], [0, 0, 0, 1]).estimate == pytest.approx(2.0)
    assert math.isnan(stats.covariate_adjusted_mean([1.0, 2.0, 3.0], [0.5, 0.5, 0.5]).estimate)


def test_ols_slope_and_interval_match_scipy():
    from scipy.stats import linregress, t

    rng = np.random.default_rng(0)
    x = np.linspace(0, 3, 7)
    y = 2.0 - 1.5 * x + rng.normal(0, 0.3, x.size)
    iv = stats.ols_slope(list(x), list(y))
    ref = linregress(x, y)
    half = t.ppf(0.975, x.size - 2) * ref.stderr
    assert iv.estimate == pytest.approx(ref.slope, rel=1e-12)
    assert (iv.low, iv.high) == pytest.approx((ref.slope - half, ref.slope + half), rel=1e-10)
    assert np.isnan(stats.ols_slope([0.0, 1.0], [1.0, 2.0]).estimate)  # two points: no interval
    assert np.isnan(stats.ols_slope([1.0, 1.0, 1.0], [1.0, 2.0, 3.0]).estimate)  # constant x


def test_differences_without_spread_are_degenerate_not_detected():
    # all seeds give the same difference (to rounding): a zero-width interval detects nothing
    d = stats.paired_difference([-1.0416666666666587, -1.0416666666666725, -1.0416666666666667], n_boot=200)
    assert d.degenerate and math.isnan(d.t_low) and math.isnan(d.mde) and math.isnan(d.p_value)
    assert d.mean == pytest.approx(-1.0416666666666667)
    assert stats.power_verdict(d, +1, 1.0) == stats.power_verdict(d, -1, 1.0) == stats.DEGENERATE
    zero = stats.paired_difference([0.0, 0.0, 0.0], n_boot=200)
    assert zero.degenerate and stats.power_verdict(zero, +1, 1.0) == stats.DEGENERATE
    # a real spread, however small against the mean, is tested
    small = stats.paired_difference([1.0, 1.0 + 1e-6, 1.0 - 1e-6], n_boot=200)
    assert not small.degenerate and stats.power_verdict(small, +1, 1.0) == stats.DETECTED


def test_interval_power_reads_the_standard_error_off_the_interval():
    from scipy.stats import t

    df = 9
    se = 0.5
    half = t.ppf(0.975, df) * se
    verdict, mde = stats.interval_power(stats.Interval(2.0, 2.0 - half, 2.0 + half), df, +1)
    assert verdict == stats.DETECTED
    assert mde == pytest.approx(stats.noncentral_mde(se, df), rel=1e-12)
    assert stats.interval_power(stats.Interval(2.0, 2.0 - half, 2.0 + half), df, -1)[0] == stats.DETECTED_AGAINST
    # no margin (a slope's default): never a shown null, however narrow the interval
    assert stats.interval_power(stats.Interval(0.1, -0.5, 0.7), df, -1)[0] == stats.INCONCLUSIVE
    # with a margin fixed in advance the 90 % interval of the same standard error decides
    se2 = 1.2 / (2 * t.ppf(0.975, df))
    eq = t.ppf(0.95, df) * se2
    assert stats.interval_power(stats.Interval(0.1, -0.5, 0.7), df, -1, margin=0.1 + eq + 1e-9)[0] == stats.EQUIVALENT
    assert stats.interval_power(stats.Interval(0.1, -0.5, 0.7), df, -1, margin=0.1 + eq - 1e-9)[0] == \
        stats.INCONCLUSIVE


def test_combined_t_test_is_fishers_method():
    from scipy.stats import combine_pvalues, t

    z = [0.3, -1.2, 2.5, 0.0]
    pvalues, pooled = stats.combined_t_test(z, 7)
    assert pvalues == pytest.approx([2 * t.sf(abs(v), 7) for v in z], rel=1e-12)
    assert pooled == pytest.approx(combine_pvalues(pvalues, method="fisher").pvalue, rel=1e-10)


def test_equivalence_is_tost_at_five_percent_per_side():
    """"No effect beyond ±δ" exactly when both one-sided tests at α = 0.05 reject (TOST): the
    90 % interval inside (−δ, δ) — not the 95 % one; an interval that holds 0 but reaches past
    δ is inconclusive, however close its mean is to 0."""
    from scipy.stats import ttest_1samp

    x = [0.1, -0.1, 0.05, -0.05, 0.02, -0.02, 0.09]
    tight = stats.paired_difference(x, n_boot=100)
    assert tight.t_low < tight.eq_low < tight.eq_high < tight.t_high
    assert stats.power_verdict(tight, +1, tight.eq_high * 1.001) == stats.EQUIVALENT
    assert stats.power_verdict(tight, +1, tight.eq_high * 0.999) == stats.INCONCLUSIVE
    # between the two intervals: equivalent by TOST although the 95 % interval reaches past δ
    margin = (tight.eq_high + tight.t_high) / 2
    assert tight.t_high > margin and stats.power_verdict(tight, +1, margin) == stats.EQUIVALENT
    # TOST's p is the larger one-sided p, as scipy computes them
    lower = ttest_1samp(np.array(x) + margin, 0.0, alternative="greater").pvalue
    upper = ttest_1samp(np.array(x) - margin, 0.0, alternative="less").pvalue
    assert tight.tost_p(margin) == pytest.approx(max(lower, upper), rel=1e-10) and tight.tost_p(margin) < 0.05
    wide = stats.paired_difference([1.0, -1.0, 0.9, -0.9], n_boot=100)
    assert wide.mean == 0.0 and stats.power_verdict(wide, +1, 0.5) == stats.INCONCLUSIVE
    # a margin of nan or 0 never shows a null
    assert stats.power_verdict(tight, +1, float("nan")) == stats.INCONCLUSIVE
    assert stats.power_verdict(tight, +1, 0.0) == stats.INCONCLUSIVE


def _holm_rejects(pvalues, alpha):
    """Holm's procedure by its definition: step through the sorted p values, reject
    p_(i) while p_(i) <= alpha / (m - i), stop at the first that is not."""
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    rejected = set()
    for rank, i in enumerate(order):
        if pvalues[i] > alpha / (m - rank):
            break
        rejected.add(i)
    return rejected


def test_holm_adjusted_p_values_reject_exactly_what_holms_procedure_rejects():
    rng = np.random.default_rng(0)
    for _ in range(200):
        m = int(rng.integers(1, 9))
        p = list(rng.uniform(0, 0.1, size=m) ** rng.uniform(0.5, 2))
        adjusted = stats.holm(p)
        assert all(a >= q for a, q in zip(adjusted, p)) and all(a <= 1 for a in adjusted)
        for alpha in (0.001, 0.01, 0.02, 0.05, 0.1):
            assert {i for i, a in enumerate(adjusted) if a <= alpha} == _holm_rejects(p, alpha)
    # known values: m = 3, sorted 0.01, 0.02, 0.04 -> 0.03, 0.04, 0.04 (monotone), order kept
    assert stats.holm([0.04, 0.01, 0.02]) == pytest.approx([0.04, 0.03, 0.04])
    assert stats.holm([0.5, 0.6]) == pytest.approx([1.0, 1.0])
    nan_kept = stats.holm([0.01, float("nan"), 0.03])
    assert nan_kept[0] == pytest.approx(0.02) and math.isnan(nan_kept[1]) and nan_kept[2] == pytest.approx(0.03)


# ---- the hand-written versions scipy replaced (issue 50): kept here as the reference that
# the library calls give the same numbers -------------------------------------------------
def _old_rankdata(x):
    a = np.asarray(x, dtype=float)
    order = np.argsort(a, kind="mergesort")
    ranks = np.empty(a.size)
    s = a[order]
    i = 0
    while i < a.size:
        j = i
        while j + 1 < a.size and s[j + 1] == s[i]:
            j += 1
        ranks[order[i:j + 1]] = 0.5 * (i + j) + 1.0
        i = j + 1
    return ranks


def _old_spearman(x, y):
    a, b = _old_rankdata(x), _old_rankdata(y)
    a, b = a - a.mean(), b - b.mean()
    den = math.sqrt(float((a * a).sum()) * float((b * b).sum()))
    return float("nan") if den == 0 else float((a * b).sum() / den)


def _old_kendall(x, y):
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    n = x.size
    if n < 2:
        return float("nan")
    i, j = np.triu_indices(n, k=1)
    sx, sy = np.sign(x[i] - x[j]), np.sign(y[i] - y[j])
    n0 = n * (n - 1) / 2
    den = math.sqrt((n0 - float((sx == 0).sum())) * (n0 - float((sy == 0).sum())))
    return float("nan") if den == 0 else float((sx * sy).sum()) / den


def _old_bootstrap(stat, *arrays, n_boot=2000, level=0.95, seed=0):
    cols = [np.asarray(a, dtype=float) for a in arrays]
    n = cols[0].size
    rng = np.random.default_rng(seed)
    values = np.empty(n_boot)
    for b in range(n_boot):
        idx = rng.integers(0, n, size=n)
        values[b] = stat(*(c[idx] for c in cols))
    good = values[np.isfinite(values)]
    low, high = np.quantile(good, [(1 - level) / 2, 1 - (1 - level) / 2])
    return float(low), float(high), int(n_boot - good.size)


def test_scipy_rank_statistics_equal_the_hand_written_ones():
    rng = np.random.default_rng(5)
    for n in (2, 3, 7, 12, 40):
        for _ in range(10):
            x = rng.integers(0, 4, size=n).astype(float)  # ties, sometimes all of them
            y = x + rng.normal(0, 1, size=n).round(1)
            assert rankdata(x).tolist() == _old_rankdata(x).tolist()
            for new, old in ((spearman_rho, _old_spearman), (kendall_tau, _old_kendall)):
                a, b = new(x, y), old(x, y)
                assert (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, abs=1e-14), (new, x, y)


@pytest.mark.parametrize("n", [2, 3, 5, 16, 33])
def test_scipy_bootstrap_gives_the_hand_written_intervals(n):
    rng = np.random.default_rng(n)
    d = rng.normal(0.5, 1, size=n)
    iv = bootstrap_ci(np.mean, d, n_boot=700, seed=11)  # the vectorised path (np.mean takes axis=)
    assert (iv.low, iv.high, iv.n_undefined) == _old_bootstrap(np.mean, d, n_boot=700, seed=11)
    x = rng.integers(0, 3, size=n).astype(float)  # undefined resamples (all x tied) dropped and counted
    y = x + rng.normal(0, 1, size=n)
    iv = bootstrap_ci(kendall_tau, x, y, n_boot=300, seed=2)
    low, high, undefined = _old_bootstrap(_old_kendall, x, y, n_boot=300, seed=2)
    assert iv.n_undefined == undefined
    assert (iv.low, iv.high) == pytest.approx((low, high), abs=1e-14)
