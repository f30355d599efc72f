"""Rank correlations, bootstrap intervals and the verdict of a claim (numpy; Student's t
from ``scipy.stats``).

* ``rankdata(x)``: ranks 1..n, ties get the average of the ranks they span;
* ``spearman_rho(x, y)``: Pearson correlation of the (average) ranks;
* ``kendall_tau(x, y)``: Kendall's tau-b ``(C - D) / sqrt((n0 - n1)(n0 - n2))`` with
  ``n0 = n(n-1)/2`` pairs, ``n1``/``n2`` the pairs tied in x / in y (pairs tied in both
  count in neither C nor D); equals tau-a when there are no ties;
* ``bootstrap_ci(stat, *arrays)``: percentile interval of a statistic of paired samples,
  rows resampled with replacement (resamples where the statistic is undefined, e.g. all
  x tied, are dropped and counted);
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
whole groups resampled).

``nan`` is returned where a statistic is undefined (fewer than 2 points, or a constant
variable), never an exception.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats
from scipy.stats import t as student_t

Z95 = 1.959963984540054  # two-sided 95% normal quantile


def rankdata(x: Sequence[float]) -> np.ndarray:
    """Ranks starting at 1; tied values share the mean of their ranks."""
    a = np.asarray(x, dtype=float)
    n = a.size
    order = np.argsort(a, kind="mergesort")
    ranks = np.empty(n, dtype=float)
    sorted_a = a[order]
    i = 0
    while i < n:
        j = i
        while j + 1 < n and sorted_a[j + 1] == sorted_a[i]:
            j += 1
        ranks[order[i:j + 1]] = 0.5 * (i + j) + 1.0
        i = j + 1
    return ranks


def _pearson(a: np.ndarray, b: np.ndarray) -> float:
    a = a - a.mean()
    b = b - b.mean()
    den = math.sqrt(float((a * a).sum()) * float((b * b).sum()))
    if den == 0.0:
        return float("nan")
    return float((a * b).sum() / den)


def spearman_rho(x: Sequence[float], y: Sequence[float]) -> float:
    x, y = _pair(x, y)
    if x.size < 2:
        return float("nan")
    return _pearson(rankdata(x), rankdata(y))


def kendall_tau(x: Sequence[float], y: Sequence[float]) -> float:
    """Kendall's tau-b (O(n²); the experiments compare tens of models)."""
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
    resampled together). Resamples whose statistic is ``nan`` are dropped; if all are,
    the interval is ``(nan, nan)``."""
    cols = [np.asarray(a, dtype=float) for a in arrays]
    n = cols[0].size
    if any(c.shape != (n,) for c in cols):
        raise ValueError("bootstrap_ci: the arrays must be 1-d of the same length")
    estimate = float(stat(*cols)) if n else float("nan")
    if n < 2:
        return Interval(estimate, float("nan"), float("nan"), level, n, 0, n_boot)
    rng = np.random.default_rng(seed)
    values = np.empty(n_boot)
    for b in range(n_boot):
        idx = rng.integers(0, n, size=n)
        values[b] = stat(*(c[idx] for c in cols))
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


def minimum_detectable_effect(sd: float, n: int, level: float = 0.95, power: float = 0.8) -> float:
    """The smallest true mean difference a two-sided paired t test at ``level`` detects with
    probability ``power`` (normal-shift approximation with t quantiles):
    ``(t_{1-α/2, n-1} + t_{power, n-1}) · sd / √n``."""
    if n < 2 or not math.isfinite(sd):
        return float("nan")
    df = n - 1
    return (t_quantile(0.5 + level / 2, df) + t_quantile(power, df)) * sd / math.sqrt(n)


@dataclass(frozen=True)
class PairedDifference:
    """Mean of paired differences (e.g. recipe − reference, one per seed) with its t and
    percentile-bootstrap intervals, the two-sided t-test p value and the minimum
    detectable effect at ``power``. ``degenerate``: the differences have no spread (all
    equal to rounding), so the t interval, p value and MDE are undefined (``nan``)."""

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


# differences whose standard deviation is below this fraction of their size are all equal
# up to rounding (e.g. the same accuracy difference on every seed): no spread to test against
DEGENERATE_SPREAD = 1e-9


def paired_difference(diffs: Sequence[float], level: float = 0.95, power: float = 0.8, n_boot: int = 2000,
                      seed: int = 0) -> PairedDifference:
    d = np.asarray(diffs, dtype=float)
    n = d.size
    mean = float(d.mean()) if n else float("nan")
    nan = float("nan")
    if n < 2:
        return PairedDifference(n, mean, nan, nan, nan, nan, nan, nan, nan, level, power)
    sd = float(d.std(ddof=1))
    boot = bootstrap_ci(np.mean, d, n_boot=n_boot, level=level, seed=seed)
    if sd <= DEGENERATE_SPREAD * float(np.abs(d).max()):
        return PairedDifference(n, mean, sd, nan, nan, boot.low, boot.high, nan, nan, level, power, True)
    se = sd / math.sqrt(n)
    half = t_quantile(0.5 + level / 2, n - 1) * se
    p = 2.0 * float(student_t.sf(abs(mean) / se, n - 1))
    return PairedDifference(n, mean, sd, mean - half, mean + half, boot.low, boot.high, p,
                            minimum_detectable_effect(sd, n, level, power), level, power)


DETECTED = "detected in the paper's direction"
DETECTED_AGAINST = "detected against it"
EQUIVALENT = "no effect beyond ±δ"
INCONCLUSIVE = "inconclusive"
DEGENERATE = "degenerate: the differences have no spread, nothing to test"
VERDICTS = (DETECTED, DETECTED_AGAINST, EQUIVALENT, INCONCLUSIVE, DEGENERATE)


def _detection(low: float, high: float, expected_sign: int, margin: float) -> str:
    """A detection when the interval excludes 0; a shown null (``no effect beyond ±δ``,
    δ = ``margin``) when it lies inside ``(−δ, δ)``; else ``inconclusive``: an interval
    that holds 0 is not a null by itself (it may also hold effects larger than δ)."""
    if expected_sign not in (1, -1):
        raise ValueError("expected_sign must be +1 or -1")
    if not (math.isfinite(low) and math.isfinite(high)):
        return INCONCLUSIVE
    if low > 0 or high < 0:
        return DETECTED if (low > 0) == (expected_sign > 0) else DETECTED_AGAINST
    if math.isfinite(margin) and margin > 0 and -margin < low and high < margin:
        return EQUIVALENT
    return INCONCLUSIVE


def power_verdict(diff: PairedDifference, expected_sign: int, margin: float) -> str:
    """``detected in the paper's direction`` / ``detected against it`` when the t interval
    excludes 0 on that side; ``no effect beyond ±δ`` when it lies inside ``±margin`` (an
    equivalence test at the same level: both one-sided tests of |effect| ≥ δ reject);
    else ``inconclusive``; ``degenerate`` when the differences have no spread (an
    interval of zero width detects nothing and shows nothing)."""
    if diff.degenerate:
        if expected_sign not in (1, -1):
            raise ValueError("expected_sign must be +1 or -1")
        return DEGENERATE
    return _detection(diff.t_low, diff.t_high, expected_sign, margin)


def interval_power(interval: Interval, df: int, expected_sign: int, level: float = 0.95,
                   power: float = 0.8, margin: float | None = None) -> tuple[str, float]:
    """The verdict of an estimate with a two-sided ``level`` interval (e.g. a bootstrap
    interval of a slope) and its minimum detectable effect at ``power``:
    ``(t_{1-α/2} + t_power) × se`` on ``df`` degrees of freedom, the standard error read
    off the interval's width as ``(high − low) / (2 t_{1-α/2})``. The equivalence margin
    δ is ``margin``, else the MDE itself."""
    q = t_quantile(0.5 + level / 2, df)
    se = (interval.high - interval.low) / (2 * q)
    mde = (q + t_quantile(power, df)) * se
    return _detection(interval.low, interval.high, expected_sign, mde if margin is None else margin), mde


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


@dataclass(frozen=True)
class Pooled:
    """Inverse-variance pooling of k independent estimates (``pool_inverse_variance``)."""

    k: int
    fixed: float  # Σ w m / Σ w, w = 1 / se²
    fixed_se: float
    fixed_low: float
    fixed_high: float
    q: float  # Cochran's Q = Σ w (m − fixed)²
    q_p: float  # P(χ²_{k−1} ≥ Q)
    i2: float  # max(0, (Q − (k − 1)) / Q): the share of the spread beyond chance
    tau2: float  # DerSimonian–Laird between-estimate variance
    random: float  # the random-effects estimate (weights 1 / (se² + τ²))
    random_low: float
    random_high: float


def pool_inverse_variance(means: Sequence[float], ses: Sequence[float], level: float = 0.95) -> Pooled:
    """Fixed-effect (inverse-variance) and DerSimonian–Laird random-effects pooling with
    Cochran's Q and I² — the standard meta-analytic summary of one effect measured in k
    independent studies (here: languages). Normal intervals: with few seeds per study they
    are narrower than t intervals would be (say so where reported). Written out rather than
    taken from statsmodels (not a dependency) — a few lines of textbook algebra, tested
    against hand-computed values."""
    m = np.asarray(means, dtype=float)
    se = np.asarray(ses, dtype=float)
    if m.shape != se.shape or m.ndim != 1 or len(m) < 1:
        raise ValueError("one standard error per estimate, at least one estimate")
    if not np.all(np.isfinite(m)) or not np.all(np.isfinite(se)) or np.any(se <= 0):
        raise ValueError("estimates must be finite and standard errors positive")
    z = float(stats.norm.ppf(0.5 + level / 2))
    w = 1.0 / se**2
    fixed = float(np.sum(w * m) / np.sum(w))
    fixed_se = float(1.0 / math.sqrt(np.sum(w)))
    k = len(m)
    q = float(np.sum(w * (m - fixed) ** 2))
    df = k - 1
    q_p = float(stats.chi2.sf(q, df)) if df > 0 else math.nan
    i2 = max(0.0, (q - df) / q) if q > 0 and df > 0 else 0.0
    c = float(np.sum(w) - np.sum(w**2) / np.sum(w))
    tau2 = max(0.0, (q - df) / c) if df > 0 and c > 0 else 0.0
    wr = 1.0 / (se**2 + tau2)
    random = float(np.sum(wr * m) / np.sum(wr))
    random_se = float(1.0 / math.sqrt(np.sum(wr)))
    return Pooled(k, fixed, fixed_se, fixed - z * fixed_se, fixed + z * fixed_se, q, q_p, i2, tau2, random,
                  random - z * random_se, random + z * random_se)
