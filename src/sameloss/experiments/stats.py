"""Rank correlations, bootstrap intervals and the verdict of a claim — plain numpy.

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

``nan`` is returned where a statistic is undefined (fewer than 2 points, or a constant
variable), never an exception.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

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
