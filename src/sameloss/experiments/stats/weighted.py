"""One comparison's estimate at the target KL from its pairs, each weighted by what its KL
positions imply.

A pair's difference ``d = ŷ_recipe(t) − ŷ_reference(t)`` reads each fork's least-squares line
through its ``m`` checkpoints at the target ``t`` — a line per fork, the one line model,
fixed before the data (no pre-test picks another). With checkpoint noise ``σ²`` about the
line its variance is ``τ² + σ² L``: ``τ²`` the spread of the true differences over seeds and
``L = Σ_forks 1/m + (t − x̄)²/Sxx`` the lines' leverage at the target — known from the KLs
alone, before any outcome. A pair whose target lies far from its forks' checkpoints (ranges
that do not meet) is read off a long lever and gets a small weight; one inside both ranges
a large one. ``L₀ = Σ 1/m`` is the leverage at the forks' own mean KL: ``L − L₀`` is the
extrapolation, and the report gives its share of the estimate's variance.

* ``σ²`` from the lines' residuals (``m − 2`` degrees of freedom per fork, pooled over the
  comparison's pairs: independent of the lines' estimates under normal noise, so of ``d``);
* ``τ²`` by DerSimonian–Laird, the weights ``w = 1/(τ² + σ² L)``, the weighted mean and the
  Hartung–Knapp–Sidik–Jonkman interval: ``se² = Σw(d − μ̂)² / ((n − 1) Σw)``, t on ``n − 1``
  degrees of freedom. Equal leverages give equal weights and then exactly the paired t test;
``weighted_pairs`` gives the weights and differences alone: the stratified pooling across
languages (``pooling.stratified``) reads every language's with one pooled scale.
``bench/isoloss_power.py`` simulates type-I error and power of this code.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
from scipy.special import stdtr

from .inference import DEGENERATE_SPREAD, EQUIVALENCE_ALPHA, bootstrap_ci, noncentral_mde, t_quantile

# Student's t quantiles and tails: one per degrees of freedom, cached (the simulation bench calls
# the estimator ~10⁵ times; scipy.stats.t's per-call overhead is most of its time)
_quantile = functools.lru_cache(maxsize=4096)(t_quantile)


def _sf(x: float, df: float) -> float:
    """``P(T > x)`` on ``df`` degrees of freedom (``scipy.special.stdtr``: ``scipy.stats.t.sf``)."""
    return float(stdtr(df, -x))


@dataclass(frozen=True)
class Line:
    """One fork's least-squares line of a quantity on KL through its checkpoints."""

    m: int  # checkpoints
    kl_mean: float
    sxx: float  # Σ (x − x̄)²
    mean: float  # ȳ
    slope: float
    rss: float  # residual sum of squares (m − 2 degrees of freedom)

    def at(self, target: float) -> float:
        return self.mean + self.slope * (target - self.kl_mean)

    def leverage(self, target: float) -> float:
        """The variance of ``at(target)`` in units of the checkpoint noise: 1/m + (t − x̄)²/Sxx."""
        return 1 / self.m + ((target - self.kl_mean) ** 2 / self.sxx if self.sxx > 0 else 0.0)


def line(kls, values) -> Line:
    """``Line`` through the points; a flat line at the mean where the KLs do not vary."""
    x = np.asarray(kls, dtype=float)
    y = np.asarray(values, dtype=float)
    xm, ym = float(x.mean()), float(y.mean())
    sxx = float(((x - xm) ** 2).sum())
    slope = float(((x - xm) * (y - ym)).sum() / sxx) if sxx > 0 else 0.0
    rss = float(((y - ym - slope * (x - xm)) ** 2).sum())
    return Line(x.size, xm, sxx, ym, slope, rss)


def curvature_p(kls, values) -> float:
    """The two-sided p value of the quadratic term of ``values`` on ``kls`` (least squares on
    ``1, x, x²``, x centred and scaled; t on ``m − 3`` degrees of freedom): is the fork's
    quantity linear in KL along its stretch? ``nan`` with fewer than 4 distinct KLs (no
    residual degree of freedom to test with) or no residual spread."""
    x = np.asarray(kls, dtype=float)
    y = np.asarray(values, dtype=float)
    if np.unique(x).size < 4:
        return math.nan
    span = float(x.max() - x.min())
    z = (x - x.mean()) / span
    design = np.stack([np.ones_like(z), z, z * z], axis=1)
    coef, *_ = np.linalg.lstsq(design, y, rcond=None)
    resid = y - design @ coef
    df = x.size - 3
    s2 = float(resid @ resid) / df
    cov = s2 * np.linalg.inv(design.T @ design)
    if not cov[2, 2] > 0:
        return math.nan
    return 2 * _sf(abs(float(coef[2])) / math.sqrt(float(cov[2, 2])), df)


@dataclass(frozen=True)
class Fits:
    """What the estimator reads of one comparison's pairs and one quantity, one entry per
    pair (``fits_of`` builds it from ``paired.estimate_pairs``' rows)."""

    d: np.ndarray  # the difference at the target, each fork on its own line
    lev: np.ndarray  # L: the lines' leverage at the target (both forks)
    lev0: np.ndarray  # L₀ = 1/m_recipe + 1/m_reference
    rss: np.ndarray  # both lines' residual sums of squares
    rdf: np.ndarray  # their residual degrees of freedom

    @property
    def n(self) -> int:
        return int(self.d.size)


def fits_of(pairs: list[dict], key: str, scale: float) -> Fits:
    """``Fits`` of the quantity ``key`` (× ``scale``) over ``pairs`` (``estimate_pairs``' rows)."""
    def col(name, s=1.0):
        return np.array([s * float(p[name]) for p in pairs], dtype=float)

    return Fits(col(f"d_{key}", scale), col("leverage"), col("leverage_mean"), col(f"rss_{key}", scale ** 2),
                col("rss_df"))


@dataclass(frozen=True)
class Estimate:
    """A comparison's weighted estimate: what ``inference.power_verdict`` reads of a paired
    difference (``t_low``/``t_high``, ``eq_low``/``eq_high``, ``degenerate``), and ``sd`` —
    the paired SD whose plain mean over ``n`` pairs would have this standard error (what a
    plan of seeds reads)."""

    n: int
    mean: float
    se: float
    df: float  # n − 1
    t_low: float
    t_high: float
    eq_low: float
    eq_high: float
    p_value: float
    mde: float
    degenerate: bool = False
    tau2: float = math.nan
    sigma2: float = math.nan  # the checkpoint noise about a fork's line
    extrapolation: float = math.nan  # the share of the estimate's variance that is extrapolation
    boot_low: float = math.nan
    boot_high: float = math.nan

    @property
    def sd(self) -> float:
        return self.se * math.sqrt(self.n) if self.n >= 1 else math.nan

    def tost_p(self, margin: float) -> float:
        """The TOST p value of ``|effect| ≥ margin`` on ``df`` degrees of freedom."""
        return tost_p(self.mean, self.se, self.df, margin) if not self.degenerate and self.n >= 2 else math.nan


def tost_p(mean: float, se: float, df: float, margin: float) -> float:
    """The p value of the two one-sided tests of ``|effect| ≥ margin`` for an estimate with
    standard error ``se`` on ``df`` degrees of freedom (nan where undefined)."""
    if not (math.isfinite(margin) and margin > 0 and math.isfinite(se) and se > 0 and df > 0):
        return math.nan
    return max(_sf((mean + margin) / se, df), _sf((margin - mean) / se, df))


@dataclass(frozen=True)
class Weighted:
    """One comparison's pairs weighted (``weighted_pairs``): the differences ``y``, their
    within-pair variances ``σ² L`` and weights ``1/(τ² + σ² L)``, ``τ²`` and ``σ²``."""

    y: np.ndarray
    within: np.ndarray
    w: np.ndarray
    tau2: float
    sigma2: float


def weighted_pairs(f: Fits) -> Weighted:
    """The weights of ``f``'s pairs (module docstring): ``σ²`` pooled from the lines'
    residuals, ``τ²`` by DerSimonian–Laird."""
    n = f.n
    sigma2 = float(f.rss.sum() / f.rdf.sum()) if f.rdf.sum() > 0 else math.nan
    within = sigma2 * f.lev if math.isfinite(sigma2) and sigma2 > 0 else np.zeros(n)
    tau2 = _tau2(f.d, within)
    w = 1.0 / (tau2 + within) if (tau2 + within).min() > 0 else np.ones(n)
    return Weighted(f.d, within, w, tau2, sigma2)


def estimate(f: Fits, level: float = 0.95, power: float = 0.8, n_boot: int = 0, seed: int = 0) -> Estimate:
    """The comparison's estimate from ``f`` (module docstring): weights ``1/(τ² + σ² L)``,
    the HKSJ interval. ``n_boot``: a percentile bootstrap of the weighted mean over pairs
    beside the interval (never read by a verdict)."""
    n = f.n
    nan = math.nan
    if n < 2:
        return Estimate(n, float(f.d.mean()) if n else nan, nan, 0, nan, nan, nan, nan, nan, nan)
    spread = float(np.std(f.d, ddof=1))
    if spread <= DEGENERATE_SPREAD * float(np.abs(f.d).max()):
        return Estimate(n, float(f.d.mean()), 0.0, n - 1, nan, nan, nan, nan, nan, nan, True)
    wp = weighted_pairs(f)
    y, w = wp.y, wp.w
    mean = float((w * y).sum() / w.sum())
    scale = float((w * (y - mean) ** 2).sum()) / (n - 1)
    se, df = math.sqrt(scale / float(w.sum())), float(n - 1)
    if not se > 0:  # no spread to test against
        return Estimate(n, mean, 0.0, df, nan, nan, nan, nan, nan, nan, True, sigma2=wp.sigma2)
    half, eq_half = _quantile(0.5 + level / 2, df) * se, _quantile(1 - EQUIVALENCE_ALPHA, df) * se
    p = 2.0 * _sf(abs(mean) / se, df)
    mde = noncentral_mde(se, df, level, power)
    boot = bootstrap_ci(lambda a, b: float((a * b).sum() / b.sum()), y, w, n_boot=n_boot, seed=seed) \
        if n_boot else None
    return Estimate(n, mean, se, df, mean - half, mean + half, mean - eq_half, mean + eq_half, p, mde, False,
                    wp.tau2, wp.sigma2, _extrapolation(wp, f), boot.low if boot else nan, boot.high if boot else nan)


def _tau2(y: np.ndarray, within: np.ndarray) -> float:
    """DerSimonian–Laird's between-pair variance of ``y`` with within variances ``within``;
    with no within variance (no checkpoint noise to weigh), the plain variance of ``y``."""
    if within.min() <= 0:
        return float(np.var(y, ddof=1))
    w = 1.0 / within
    mean = float((w * y).sum() / w.sum())
    q = float((w * (y - mean) ** 2).sum())
    c = float(w.sum() - (w ** 2).sum() / w.sum())
    return max(0.0, (q - (y.size - 1)) / c) if c > 0 else 0.0


def _extrapolation(wp: Weighted, f: Fits) -> float:
    """The share of the estimate's model variance ``Σw²(τ² + σ²L)/(Σw)²`` that comes from
    reading the lines away from the forks' mean KL: ``σ²(L − L₀)`` per pair."""
    if not math.isfinite(wp.sigma2):
        return math.nan  # no residual degrees of freedom: the checkpoint noise is unknown
    if wp.sigma2 <= 0:
        return 0.0
    w = wp.w
    total = float((w ** 2 * (wp.tau2 + wp.within)).sum() / w.sum() ** 2)
    part = float((w ** 2 * wp.sigma2 * (f.lev - f.lev0)).sum() / w.sum() ** 2)
    return part / total if total > 0 else math.nan
