"""Rank correlations, bootstrap intervals and the verdict of a claim (numpy; Student's t
from ``scipy.stats``).

* ``rankdata(x)``: ranks 1..n, ties get the average of the ranks they span (scipy's);
* ``spearman_rho(x, y)``: Pearson correlation of the (average) ranks (scipy's ``spearmanr``);
* ``kendall_tau(x, y)``: Kendall's tau-b ``(C - D) / sqrt((n0 - n1)(n0 - n2))`` with
  ``n0 = n(n-1)/2`` pairs, ``n1``/``n2`` the pairs tied in x / in y (pairs tied in both
  count in neither C nor D); equals tau-a when there are no ties (ours: exact ±1, see there);
* ``bootstrap_ci(stat, *arrays)``: percentile interval of a statistic of paired samples,
  rows resampled with replacement (``scipy.stats.bootstrap``'s resamples; those where the
  statistic is undefined, e.g. all x tied, are dropped and counted);
* ``diff_interval``: a difference of two means with its normal 95% interval;
* ``verdict``: does a measured effect agree in direction with a claim, and does its
  interval exclude zero.

Power (the ``isoloss`` study): ``t_cdf`` / ``t_quantile`` (``scipy.stats.t``),
``paired_difference`` (mean of paired differences with t and bootstrap intervals, p value and
``minimum_detectable_effect`` at 80 % power; ``degenerate`` when the differences have no
spread), ``power_verdict`` (detected in the paper's direction / against it / no effect
beyond ±δ — the interval inside an equivalence margin — / inconclusive / degenerate),
``interval_power`` (the same verdict and the MDE of any estimate with a 95 % interval,
e.g. a bootstrap slope), ``holm`` (Holm's step-down adjusted p values of a family), ``ols_slope`` (a least-squares slope with
its t interval), ``combined_t_test`` (t tests against 0 and Fisher's combination), ``fixed_effects_ols`` and ``cluster_bootstrap_ols`` (within-group slopes,
whole groups resampled). Pooling one comparison across languages is ``pooling.py``'s.

``nan`` is returned where a statistic is undefined (fewer than 2 points, or a constant
variable), never an exception.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats
from scipy.stats import t as student_t

Z95 = 1.959963984540054  # two-sided 95% normal quantile


def rankdata(x: Sequence[float]) -> np.ndarray:
    """Ranks starting at 1; tied values share the mean of their ranks (``scipy.stats.rankdata``).

    Args:
        x: the values, a 1-d sequence.

    Returns:
        float ranks, one per value.
    """
    return stats.rankdata(np.asarray(x, dtype=float), method="average").astype(float)


def spearman_rho(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's rank correlation (``scipy.stats.spearmanr``: Pearson's of the average ranks).

    Args:
        x: the first sample, 1-d.
        y: the second, paired with ``x`` (the same length).

    Returns:
        rho, or ``nan`` for fewer than 2 points or a constant sample.
    """
    x, y = _pair(x, y)
    if x.size < 2 or _constant(x) or _constant(y):  # scipy would warn and return nan
        return float("nan")
    return float(stats.spearmanr(x, y).statistic)


def kendall_tau(x: Sequence[float], y: Sequence[float]) -> float:
    """Kendall's tau-b, vectorised over the pairs (O(n²); the experiments compare tens of models).

    Ours, not ``scipy.stats.kendalltau``: scipy divides by the two square roots one after the
    other, so a perfect ordering comes out as ``-0.9999999999999999`` where this one is ``-1``
    exactly; the smoke results are pinned bit for bit (``test_smoke_digests.py``) and a trend
    claim reads an exact ±1. The two agree to 1e-12 otherwise (``test_stats.py``).

    Args:
        x: the first sample, 1-d.
        y: the second, paired with ``x`` (the same length).

    Returns:
        tau-b, or ``nan`` for fewer than 2 points or a constant sample.
    """
    x, y = _pair(x, y)
    n = x.size
    if n < 2:
        return float("nan")
    i, j = np.triu_indices(n, k=1)
    sx = np.sign(x[i] - x[j])
    sy = np.sign(y[i] - y[j])
    s = float((sx * sy).sum())  # concordant - discordant
    n0 = n * (n - 1) / 2
    n1 = float((sx == 0).sum())
    n2 = float((sy == 0).sum())
    den = math.sqrt((n0 - n1) * (n0 - n2))
    if den == 0.0:
        return float("nan")
    return s / den


def _constant(a: np.ndarray) -> bool:
    return bool(np.all(a == a[0]))


def _pair(x, y) -> tuple[np.ndarray, np.ndarray]:
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"x and y must be 1-d of the same length, got {x.shape} and {y.shape}")
    return x, y


@dataclass(frozen=True)
class Interval:
    """A point estimate with a (by default 95%) interval."""

    estimate: float
    low: float
    high: float
    level: float = 0.95
    n: int = 0  # points the estimate is computed from
    n_boot: int = 0  # bootstrap resamples used (0: not a bootstrap interval)
    n_undefined: int = 0  # resamples where the statistic was undefined (dropped)

    def excludes_zero(self) -> bool:
        return bool(self.low > 0 or self.high < 0)

    def __str__(self) -> str:
        return f"{self.estimate:.3g} [{self.low:.3g}, {self.high:.3g}]"


def bootstrap_ci(stat: Callable[..., float], *arrays: Sequence[float], n_boot: int = 2000, level: float = 0.95,
                 seed: int = 0) -> Interval:
    """Percentile bootstrap interval of ``stat(*arrays)``; the arrays are paired (rows are
    resampled together).

    The resamples are ``scipy.stats.bootstrap``'s (``paired=True``; its ``n_boot × n`` index
    draw from ``default_rng(seed)`` is the one a loop of ``n_boot`` draws of ``n`` makes, so
    the intervals equal the ones this function computed by hand before). The percentiles are
    taken here, from its ``bootstrap_distribution``: scipy's own interval is ``nan`` once one
    resample is undefined (e.g. Kendall's tau of a resample whose x are all tied), where the
    undefined resamples are dropped here and counted (``Interval.n_undefined``).

    Args:
        stat: the statistic, ``stat(*columns) -> float``; one taking ``axis=`` (e.g.
            ``np.mean``) is evaluated on all resamples at once.
        *arrays: paired 1-d samples of one length.
        n_boot: resamples.
        level: the interval's coverage.
        seed: of the resampling.

    Returns:
        the estimate on the data with the interval; ``(nan, nan)`` with fewer than 2 rows or
        when every resample is undefined.
    """
    import warnings

    cols = [np.asarray(a, dtype=float) for a in arrays]
    n = cols[0].size
    if any(c.shape != (n,) for c in cols):
        raise ValueError("bootstrap_ci: the arrays must be 1-d of the same length")
    estimate = float(stat(*cols)) if n else float("nan")
    if n < 2 or n_boot == 0:
        return Interval(estimate, float("nan"), float("nan"), level, n, 0 if n < 2 else n_boot, n_boot)
    with warnings.catch_warnings():  # scipy's warning that its own (unused) interval is nan
        warnings.simplefilter("ignore")
        values = stats.bootstrap(cols, stat, n_resamples=n_boot, paired=True, method="percentile",
                                 confidence_level=level, rng=np.random.default_rng(seed)).bootstrap_distribution
    values = np.asarray(values, dtype=float)
    good = values[np.isfinite(values)]
    if good.size == 0:
        return Interval(estimate, float("nan"), float("nan"), level, n, n_boot, n_boot)
    alpha = (1 - level) / 2
    low, high = np.quantile(good, [alpha, 1 - alpha])
    return Interval(estimate, float(low), float(high), level, n, n_boot, int(n_boot - good.size))


def diff_interval(mean_a: float, err_a: float, mean_b: float, err_b: float) -> Interval:
    """``b - a`` with the normal 95% interval ``± 1.96 sqrt(err_a² + err_b²)``; the errors
    are standard errors of the two means (independent errors assumed, which is
    conservative when the two share evaluation data)."""
    d = mean_b - mean_a
    ea = 0.0 if err_a is None or not math.isfinite(err_a) else err_a
    eb = 0.0 if err_b is None or not math.isfinite(err_b) else err_b
    half = Z95 * math.sqrt(ea * ea + eb * eb)
    return Interval(d, d - half, d + half, 0.95, 2)


def std_to_se(std: float | None, n: int) -> float:
    """Standard error of a mean of ``n`` values whose sample std is ``std``."""
    if std is None or not math.isfinite(std) or n < 1:
        return float("nan")
    return std / math.sqrt(n)


# ---- claims -------------------------------------------------------------------------------
AGREES = "agrees"
AGREES_WEAKLY = "agrees in direction, but the interval includes 0"
DISAGREES_WEAKLY = "disagrees in direction, but the interval includes 0"
DISAGREES = "disagrees"
UNDEFINED = "cannot be judged"


def verdict(interval: Interval, expected_sign: int) -> str:
    """Compare a measured effect with the claimed sign (+1: the effect should be positive,
    -1: negative). ``agrees`` / ``disagrees`` when the interval excludes 0 on that side,
    the weak forms when only the point estimate has a side, ``cannot be judged`` when the
    estimate is undefined or exactly 0."""
    if expected_sign not in (1, -1):
        raise ValueError("expected_sign must be +1 or -1")
    est = interval.estimate
    if est is None or not math.isfinite(est) or est == 0:
        return UNDEFINED
    same = (est > 0) == (expected_sign > 0)
    lo, hi = interval.low, interval.high
    decided = math.isfinite(lo) and math.isfinite(hi) and (lo > 0 or hi < 0)
    if same:
        return AGREES if decided else AGREES_WEAKLY
    return DISAGREES if decided else DISAGREES_WEAKLY


# ---- power: Student's t, paired differences, minimum detectable effects ----------------------
def t_cdf(t: float, df: float) -> float:
    """``P(T <= t)`` for Student's t with ``df`` degrees of freedom (``scipy.stats.t``)."""
    if df <= 0:
        raise ValueError("df must be positive")
    return float(student_t.cdf(t, df))


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t (``scipy.stats.t``)."""
    if not 0.0 < p < 1.0:
        raise ValueError("p must lie in (0, 1)")
    return float(student_t.ppf(p, df))


def t_power(effect: float, sd: float, n: int, level: float = 0.95) -> float:
    """The power of a two-sided one-sample (paired) t test at ``level`` against a true mean
    ``effect`` with spread ``sd`` over ``n`` pairs, exactly (noncentral t): ``t_test_power``
    with ``df = n − 1`` and ``λ = effect · √n / sd``."""
    return t_test_power(effect * math.sqrt(n) / sd, n - 1, level)


def t_test_power(noncentrality: float, df: float, level: float = 0.95) -> float:
    """``P(T′ > c) + P(T′ < −c)`` for ``T′`` noncentral t with ``df`` degrees of freedom and
    noncentrality ``λ``, ``c = t_{(1+level)/2, df}``: the power of a two-sided t test.
    ``scipy.stats.nct``; where it returns nan (large λ at one degree of freedom: the main
    job's), integrated over ``S = √(χ²_df / df)`` as ``E[Φ(λ − cS) + Φ(−λ − cS)]`` (``T′ = (Z + λ)/S``)."""
    from scipy.integrate import quad
    from scipy.stats import chi, nct, norm

    c = t_quantile(0.5 + level / 2, df)
    lam = abs(noncentrality)
    power = float(nct.sf(c, df, lam) + nct.cdf(-c, df, lam))
    if math.isfinite(power):
        return power
    scale = 1.0 / math.sqrt(df)

    def integrand(s: float) -> float:
        return float((norm.cdf(lam - c * s) + norm.cdf(-lam - c * s)) * chi.pdf(s, df, scale=scale))

    # S concentrates near 1; the integrand is smooth: split at 1 for quad's accuracy
    return float(sum(quad(integrand, a, b, limit=200, epsabs=1e-12)[0] for a, b in ((0, 1), (1, math.inf))))


def tost_power(margin: float, se: float, df: float, alpha: float = 0.05) -> float:
    """The power of TOST at level ``alpha`` per side against ``|effect| ≥ margin`` when the
    true effect is 0, for an estimate with standard error ``se`` on ``df`` degrees of
    freedom: ``P(|T| < margin/se − t_{1−α, df})`` = ``2 F_t(margin/se − t_{1−α}) − 1`` (the
    standard error taken as known; 0 where ``margin/se`` does not clear the quantile). What a
    "no effect beyond ±δ" verdict could be expected to show at this n."""
    if not (math.isfinite(se) and se > 0 and df > 0 and math.isfinite(margin) and margin > 0):
        return float("nan")
    room = margin / se - t_quantile(1 - alpha, df)
    return max(0.0, 2.0 * float(student_t.cdf(room, df)) - 1.0)


def minimum_detectable_effect(sd: float, n: int, level: float = 0.95, power: float = 0.8) -> float:
    """The smallest true mean difference a two-sided paired t test at ``level`` detects with
    probability ``power``, from the noncentral t: ``MDE = λ* · sd / √n`` where ``λ*`` solves
    ``P(|T′_{n−1, λ*}| > t_{(1+level)/2, n−1}) = power`` (``noncentral_mde``). The
    normal-shift approximation ``(t_{1−α/2} + t_power) · sd / √n`` is 14 % optimistic at n = 2."""
    if n < 2 or not math.isfinite(sd) or sd <= 0:
        return float("nan")
    return noncentral_mde(sd / math.sqrt(n), n - 1, level, power)


def noncentral_mde(se: float, df: float, level: float = 0.95, power: float = 0.8) -> float:
    """``λ* · se``: the effect that a two-sided t test at ``level`` on ``df`` degrees of
    freedom, of an estimate with standard error ``se``, detects with probability ``power``
    (``λ*`` solves ``t_test_power(λ*, df, level) = power``; it depends on ``df`` alone, so it
    is solved once per ``df``)."""
    if not (math.isfinite(se) and se > 0 and df > 0):
        return float("nan")
    return _noncentrality_for_power(float(df), level, power) * se


@functools.lru_cache(maxsize=1024)
def _noncentrality_for_power(df: float, level: float, power: float) -> float:
    from scipy.optimize import brentq

    high = t_quantile(0.5 + level / 2, df) + 4.0
    while t_test_power(high, df, level) < power:
        high *= 2
    return brentq(lambda lam: t_test_power(lam, df, level) - power, 0.0, high, xtol=1e-10)


@dataclass(frozen=True)
class PairedDifference:
    """Mean of paired differences (e.g. recipe − reference, one per seed) with its t and
    percentile-bootstrap intervals at ``level``, the ``1 − 2α`` t interval of an
    equivalence test (``eq_low``, ``eq_high``: 90 % for α = 0.05 per side, TOST), the
    two-sided t-test p value and the minimum detectable effect at ``power`` (noncentral t).
    ``degenerate``: the differences have no spread (all equal to rounding), so the t
    intervals, p value and MDE are undefined (``nan``)."""

    n: int
    mean: float
    sd: float
    t_low: float
    t_high: float
    boot_low: float
    boot_high: float
    p_value: float
    mde: float
    level: float = 0.95
    power: float = 0.8
    degenerate: bool = False
    eq_low: float = float("nan")
    eq_high: float = float("nan")
    df: int = 0  # the degrees of freedom of ``sd``: n − 1

    @property
    def se(self) -> float:
        return self.sd / math.sqrt(self.n) if self.n >= 1 and math.isfinite(self.sd) else float("nan")

    def tost_p(self, margin: float) -> float:
        """The p value of the two one-sided tests (TOST) of ``|effect| ≥ margin``: the larger
        of ``P(T ≥ (mean + δ)/se)`` and ``P(T ≤ (mean − δ)/se)`` on ``n − 1`` degrees of
        freedom; below α exactly when the ``1 − 2α`` t interval lies inside ``(−δ, δ)``."""
        if self.degenerate or self.n < 2 or not (math.isfinite(margin) and margin > 0) or not self.se > 0:
            return float("nan")
        df = self.df or self.n - 1
        return float(max(student_t.sf((self.mean + margin) / self.se, df),
                         student_t.cdf((self.mean - margin) / self.se, df)))


# differences whose standard deviation is below this fraction of their size are all equal
# up to rounding (e.g. the same accuracy difference on every seed): no spread to test against
DEGENERATE_SPREAD = 1e-9
# each side of an equivalence test (TOST) at this level: the 90 % interval inside ±δ
EQUIVALENCE_ALPHA = 0.05


def paired_difference(diffs: Sequence[float], level: float = 0.95, power: float = 0.8, n_boot: int = 2000,
                      seed: int = 0) -> PairedDifference:
    """The paired t test of ``diffs`` (t and bootstrap intervals, p, the noncentral-t MDE)."""
    d = np.asarray(diffs, dtype=float)
    n = d.size
    mean = float(d.mean()) if n else float("nan")
    nan = float("nan")
    if n < 2:
        return PairedDifference(n, mean, nan, nan, nan, nan, nan, nan, nan, level, power)
    sd, df = float(d.std(ddof=1)), n - 1
    boot = bootstrap_ci(np.mean, d, n_boot=n_boot, level=level, seed=seed)
    if sd <= DEGENERATE_SPREAD * float(np.abs(d).max()):
        return PairedDifference(n, mean, sd, nan, nan, boot.low, boot.high, nan, nan, level, power, True, df=df)
    se = sd / math.sqrt(n)
    half = t_quantile(0.5 + level / 2, df) * se
    eq_half = t_quantile(1 - EQUIVALENCE_ALPHA, df) * se
    p = 2.0 * float(student_t.sf(abs(mean) / se, df))
    mde = minimum_detectable_effect(sd, n, level, power)
    return PairedDifference(n, mean, sd, mean - half, mean + half, boot.low, boot.high, p, mde, level, power, False,
                            mean - eq_half, mean + eq_half, df)


DETECTED = "detected in the paper's direction"
DETECTED_AGAINST = "detected against it"
EQUIVALENT = "no effect beyond ±δ (TOST, 90% interval)"
INCONCLUSIVE = "inconclusive"
DEGENERATE = "degenerate: the differences have no spread, nothing to test"
VERDICTS = (DETECTED, DETECTED_AGAINST, EQUIVALENT, INCONCLUSIVE, DEGENERATE)


def _detection(low: float, high: float, expected_sign: int, margin: float, eq_low: float, eq_high: float) -> str:
    """A detection when the two-sided interval ``(low, high)`` excludes 0; a shown null
    (``no effect beyond ±δ``, δ = ``margin``) when the equivalence interval
    ``(eq_low, eq_high)`` — the ``1 − 2α`` one of TOST — lies inside ``(−δ, δ)``; else
    ``inconclusive``: an interval that holds 0 is not a null by itself (it may also hold
    effects larger than δ)."""
    if expected_sign not in (1, -1):
        raise ValueError("expected_sign must be +1 or -1")
    if not (math.isfinite(low) and math.isfinite(high)):
        return INCONCLUSIVE
    if low > 0 or high < 0:
        return DETECTED if (low > 0) == (expected_sign > 0) else DETECTED_AGAINST
    if math.isfinite(margin) and margin > 0 and -margin < eq_low and eq_high < margin:
        return EQUIVALENT
    return INCONCLUSIVE


def power_verdict(diff: PairedDifference, expected_sign: int, margin: float) -> str:
    """``detected in the paper's direction`` / ``detected against it`` when the two-sided t
    interval at ``diff.level`` excludes 0 on that side; ``no effect beyond ±δ`` when the
    TOST at α = ``EQUIVALENCE_ALPHA`` per side rejects both ``effect ≤ −δ`` and
    ``effect ≥ δ`` (its 90 % t interval inside ``±margin``; δ fixed in the preset, never the
    comparison's own MDE); else ``inconclusive``; ``degenerate`` when the differences have
    no spread (an interval of zero width detects nothing and shows nothing)."""
    if diff.degenerate:
        if expected_sign not in (1, -1):
            raise ValueError("expected_sign must be +1 or -1")
        return DEGENERATE
    return _detection(diff.t_low, diff.t_high, expected_sign, margin, diff.eq_low, diff.eq_high)


def interval_power(interval: Interval, df: int, expected_sign: int, level: float = 0.95,
                   power: float = 0.8, margin: float = math.nan) -> tuple[str, float]:
    """The verdict of an estimate with a two-sided ``level`` interval (e.g. a bootstrap
    interval of a slope) and its minimum detectable effect at ``power`` on ``df`` degrees
    of freedom (``noncentral_mde``), the standard error read off the interval's width as
    ``(high − low) / (2 t_{(1+level)/2})``. Equivalence within ``margin`` (fixed before the
    data; ``nan``: no equivalence verdict) reads the ``1 − 2α`` interval of that standard
    error around the estimate."""
    q = t_quantile(0.5 + level / 2, df)
    se = (interval.high - interval.low) / (2 * q)
    mde = noncentral_mde(se, df, level, power)
    eq_half = t_quantile(1 - EQUIVALENCE_ALPHA, df) * se
    return _detection(interval.low, interval.high, expected_sign, margin, interval.estimate - eq_half,
                      interval.estimate + eq_half), mde


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p values (Holm 1979), in the order given: with the m
    finite p values sorted, ``p̃_(i) = max_{j ≤ i} min(1, (m − j + 1) p_(j))``; a
    hypothesis is rejected at family-wise level α exactly when ``p̃ ≤ α``. ``nan`` (an
    undefined test) stays ``nan`` and is not counted in m. (Not in scipy, which has only
    Benjamini–Hochberg; statsmodels' ``multipletests`` is not worth the dependency.)"""
    p = np.asarray(pvalues, dtype=float)
    out = np.full(p.shape, np.nan)
    finite = np.flatnonzero(np.isfinite(p))
    order = finite[np.argsort(p[finite], kind="mergesort")]
    m = order.size
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p[i]))
        out[i] = running
    return out.tolist()


def ols_slope(x: Sequence[float], y: Sequence[float], level: float = 0.95) -> Interval:
    """Least-squares slope of ``y`` on ``x`` with its t interval (``n − 2`` degrees of
    freedom, residual variance; ``scipy.stats.linregress``). ``nan`` with fewer than 3
    points or a constant ``x``."""
    from scipy.stats import linregress

    x, y = _pair(x, y)
    n = x.size
    if n < 3 or np.ptp(x) == 0:
        return Interval(float("nan"), float("nan"), float("nan"), level, n)
    fit = linregress(x, y)
    half = t_quantile(0.5 + level / 2, n - 2) * float(fit.stderr)
    return Interval(float(fit.slope), float(fit.slope) - half, float(fit.slope) + half, level, n)


def combined_t_test(t_values: Sequence[float], df: int) -> tuple[list[float], float]:
    """Two-sided p values of t statistics (``df`` degrees of freedom each) against 0, and
    Fisher's combination of them: ``−2 Σ log p ~ χ²(2k)`` under the null, its p value."""
    from scipy.stats import chi2

    pvalues = [float(2 * student_t.sf(abs(t), df)) for t in t_values]
    statistic = -2 * sum(math.log(max(p, 1e-300)) for p in pvalues)
    return pvalues, float(chi2.sf(statistic, 2 * len(pvalues)))


# ---- within-group regression ------------------------------------------------------------
def covariate_adjusted_mean(diffs: Sequence[float], covariate: Sequence[float], level: float = 0.95) -> Interval:
    """The mean of ``diffs`` at ``covariate = 0``: the intercept of the least-squares line of
    ``diffs`` on ``covariate`` with its t interval (``n − 2`` degrees of freedom) — a paired
    difference corrected for a per-pair nuisance such as the pair's ΔKL. ``nan`` with fewer
    than 3 points or a constant covariate."""
    d = np.asarray(diffs, dtype=float)
    c = np.asarray(covariate, dtype=float)
    n = d.size
    nan = float("nan")
    if n < 3 or np.ptp(c) == 0:
        return Interval(nan, nan, nan, level, n)
    X = np.column_stack([np.ones(n), c])
    beta, *_ = np.linalg.lstsq(X, d, rcond=None)
    resid = d - X @ beta
    se = math.sqrt(float(resid @ resid) / (n - 2) * float(np.linalg.inv(X.T @ X)[0, 0]))
    half = t_quantile(0.5 + level / 2, n - 2) * se
    return Interval(float(beta[0]), float(beta[0]) - half, float(beta[0]) + half, level, n)


def fixed_effects_ols(y: Sequence[float], X, groups: Sequence) -> np.ndarray:
    """Least-squares slopes of ``y`` on the columns of ``X`` with one intercept per group
    (the within estimator: ``y`` and ``X`` demeaned within each group). ``nan`` slopes when
    the demeaned ``X`` is rank-deficient."""
    y = np.asarray(y, dtype=float)
    X = np.asarray(X, dtype=float).reshape(y.size, -1)
    g = np.asarray(groups)
    yd, Xd = y.copy(), X.copy()
    for level in np.unique(g):
        m = g == level
        yd[m] -= yd[m].mean()
        Xd[m] -= Xd[m].mean(axis=0)
    if np.linalg.matrix_rank(Xd) < X.shape[1]:
        return np.full(X.shape[1], np.nan)
    return np.linalg.lstsq(Xd, yd, rcond=None)[0]


def cluster_bootstrap_ols(y: Sequence[float], X, groups: Sequence, n_boot: int = 2000, level: float = 0.95,
                          seed: int = 0) -> list[Interval]:
    """``fixed_effects_ols`` slopes with percentile intervals from resampling whole groups
    (clusters) with replacement; a group drawn twice counts as two groups. Resamples with a
    rank-deficient design are dropped and counted."""
    y = np.asarray(y, dtype=float)
    X = np.asarray(X, dtype=float).reshape(y.size, -1)
    g = np.asarray(groups)
    levels = np.unique(g)
    est = fixed_effects_ols(y, X, g)
    if levels.size < 2:
        return [Interval(float(e), float("nan"), float("nan"), level, levels.size) for e in est]
    rows = [np.nonzero(g == lv)[0] for lv in levels]
    rng = np.random.default_rng(seed)
    draws = np.empty((n_boot, X.shape[1]))
    for b in range(n_boot):
        pick = rng.integers(0, levels.size, size=levels.size)
        idx = np.concatenate([rows[i] for i in pick])
        labels = np.concatenate([np.full(rows[i].size, k) for k, i in enumerate(pick)])
        draws[b] = fixed_effects_ols(y[idx], X[idx], labels)
    good = draws[np.isfinite(draws).all(axis=1)]
    alpha = (1 - level) / 2
    out = []
    for j, e in enumerate(est):
        if good.shape[0] == 0:
            out.append(Interval(float(e), float("nan"), float("nan"), level, levels.size, n_boot, n_boot))
            continue
        lo, hi = np.quantile(good[:, j], [alpha, 1 - alpha])
        out.append(Interval(float(e), float(lo), float(hi), level, levels.size, n_boot, n_boot - good.shape[0]))
    return out
