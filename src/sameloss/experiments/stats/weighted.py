"""One comparison's estimate at the target KL from its pairs, each weighted by what its KL
positions imply (issue 46).

A pair's difference ``d = ŷ_recipe(t) − ŷ_reference(t)`` reads each fork's least-squares line
through its ``m`` checkpoints at the target ``t``. With checkpoint noise ``σ²`` about the
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
* **a common KL slope** (the fork × KL model, ``common_slope``): where every pair's forks'
  ranges touch or nearly touch (the gap at most ``borrow_gap`` × the smaller range) and a
  test of equal slopes (recipe against reference, one difference per seed: t on n − 1
  degrees of freedom, robust to slopes that vary by seed) does not reject at
  ``slope_level``, each pair's difference of the forks' means is moved to one KL by the
  slope pooled over every fork of the comparison — ``d = Δȳ − β̂ Δx̄`` with leverage ``L₀``,
  the pooled slope's own error added once (``σ² (Σw Δx̄/Σw)² / ΣSxx``) and the degrees of
  freedom Welch–Satterthwaite's (that error is estimated on the lines' residual df);
* an adaptive study's final test (Stein's two-stage test, weighted): ``τ²`` and the scale
  ``Σw(d − μ̂)²/(k − 1)`` from the pilot's ``k`` pairs alone, the mean over all, t on
  ``k − 1``: the same argument as ``stats.paired_difference``'s, and exactly it with
  equal leverages.

``bench/isoloss_allocation.py`` simulates type-I error and power of this code at the pilot's
measured gaps and spreads.
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

SEPARATE = "a line per fork"
COMMON = "a common KL slope"


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


@dataclass(frozen=True)
class Fits:
    """What the estimator reads of one comparison's used pairs and one quantity, one entry per
    pair (``fits_of`` builds it from ``paired.estimate_pairs``' rows)."""

    d: np.ndarray  # the difference at the target, each fork on its own line
    lev: np.ndarray  # L: the lines' leverage at the target (both forks)
    lev0: np.ndarray  # L₀ = 1/m_recipe + 1/m_reference
    rss: np.ndarray  # both lines' residual sums of squares
    rdf: np.ndarray  # their residual degrees of freedom
    dmean: np.ndarray  # ȳ_recipe − ȳ_reference
    dkl: np.ndarray  # x̄_recipe − x̄_reference
    sxx_recipe: np.ndarray
    sxx_reference: np.ndarray
    slope_recipe: np.ndarray
    slope_reference: np.ndarray
    touching: np.ndarray  # the forks' ranges touch or nearly touch (``borrow_gap``)
    pilot: np.ndarray  # the pair's seed is an adaptive study's pilot seed

    @property
    def n(self) -> int:
        return int(self.d.size)


def fits_of(pairs: list[dict], key: str, scale: float, pilot: tuple[int, ...] = ()) -> Fits:
    """``Fits`` of the quantity ``key`` (× ``scale``) over ``pairs`` (``estimate_pairs``' rows)."""
    def col(name, s=1.0):
        return np.array([s * float(p[name]) for p in pairs], dtype=float)

    rec, ref = col(f"recipe_slope_{key}", scale), col(f"reference_slope_{key}", scale)
    mean_rec = col(f"recipe_{key}", scale) - rec * (col("target") - col("recipe_kl_mean"))
    mean_ref = col(f"reference_{key}", scale) - ref * (col("target") - col("reference_kl_mean"))
    return Fits(col(f"d_{key}", scale), col("leverage"), col("leverage_mean"), col(f"rss_{key}", scale ** 2),
                col("rss_df"), mean_rec - mean_ref, col("recipe_kl_mean") - col("reference_kl_mean"),
                col("recipe_sxx"), col("reference_sxx"), rec, ref,
                np.array([p["touching"] in (True, "True") for p in pairs], dtype=bool),  # a row, or pairs.csv's
                np.array([p["seed"] in pilot for p in pairs], dtype=bool))


@dataclass(frozen=True)
class Estimate:
    """A comparison's weighted estimate: what ``stats.power_verdict`` reads of a paired
    difference (``t_low``/``t_high``, ``eq_low``/``eq_high``, ``degenerate``), and ``sd`` —
    the paired SD whose plain mean over ``n`` pairs would have this standard error (what a
    plan of seeds reads)."""

    n: int
    mean: float
    se: float
    df: float  # n − 1 (k − 1 in Stein's test), Welch–Satterthwaite's with a common slope
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
    model: str = SEPARATE
    slope_p: float = math.nan  # the test of equal KL slopes (nan: not tested)
    boot_low: float = math.nan
    boot_high: float = math.nan
    pilot_pairs: int = 0  # Stein's test: the pilot's pairs its scale reads (0: the ordinary test)

    @property
    def sd(self) -> float:
        return self.se * math.sqrt(self.n) if self.n >= 1 else math.nan

    def tost_p(self, margin: float) -> float:
        """The TOST p value of ``|effect| ≥ margin`` on ``df`` degrees of freedom."""
        if self.degenerate or self.n < 2 or not (math.isfinite(margin) and margin > 0) or not self.se > 0:
            return math.nan
        return max(_sf((self.mean + margin) / self.se, self.df), _sf((margin - self.mean) / self.se, self.df))


def estimate(f: Fits, slope_level: float = 0.2, stein: bool = False, level: float = 0.95, power: float = 0.8,
             n_boot: int = 0, seed: int = 0) -> Estimate:
    """The comparison's estimate from ``f`` (module docstring): a common KL slope where every
    pair touches and the slopes test equal at ``slope_level``, else a line per fork; weights
    ``1/(τ² + σ² L)``, the HKSJ interval — Stein's weighted test from the pilot's pairs when
    ``stein`` and 2 ≤ pilot < n. ``n_boot``: a percentile bootstrap of the weighted mean
    over pairs beside the interval (never read by a verdict)."""
    n = f.n
    nan = math.nan
    if n < 2:
        return Estimate(n, float(f.d.mean()) if n else nan, nan, 0, nan, nan, nan, nan, nan, nan)
    sigma2 = float(f.rss.sum() / f.rdf.sum()) if f.rdf.sum() > 0 else nan
    slope_p = slope_equality(f) if bool(f.touching.all()) and n >= 3 else nan
    common = math.isfinite(slope_p) and slope_p >= slope_level and math.isfinite(sigma2)
    y, lev, extra = _moved(f, sigma2) if common else (f.d, f.lev, 0.0)
    spread = float(np.std(y, ddof=1))
    if spread <= DEGENERATE_SPREAD * float(np.abs(y).max()):
        return Estimate(n, float(y.mean()), 0.0, n - 1, nan, nan, nan, nan, nan, nan, True, sigma2=sigma2,
                        model=COMMON if common else SEPARATE, slope_p=slope_p)
    within = sigma2 * lev if math.isfinite(sigma2) and sigma2 > 0 else np.zeros(n)
    first = f.pilot if stein and 2 <= int(f.pilot.sum()) < n else np.ones(n, dtype=bool)
    tau2 = _tau2(y[first], within[first])
    w = 1.0 / (tau2 + within) if (tau2 + within).min() > 0 else np.ones(n)
    mean = float((w * y).sum() / w.sum())
    k = int(first.sum())
    mean_first = float((w[first] * y[first]).sum() / w[first].sum())
    scale = float((w[first] * (y[first] - mean_first) ** 2).sum()) / (k - 1)
    lever = float((w * f.dkl).sum() / w.sum())
    shared = extra * lever ** 2  # the pooled slope's error, common to every pair (0: a line per fork)
    se, df = _satterthwaite(scale / float(w.sum()), k - 1, shared, float(f.rdf.sum()))
    if not se > 0:  # the spread the test reads (Stein's: the pilot's pairs alone) is none: nothing to test
        return Estimate(n, mean, 0.0, df, nan, nan, nan, nan, nan, nan, True, sigma2=sigma2,
                        model=COMMON if common else SEPARATE, slope_p=slope_p)
    half, eq_half = _quantile(0.5 + level / 2, df) * se, _quantile(1 - EQUIVALENCE_ALPHA, df) * se
    p = 2.0 * _sf(abs(mean) / se, df)
    mde = ((_quantile(0.5 + level / 2, df) + _quantile(power, df)) * se if k < n  # Stein's bound
           else noncentral_mde(se, df, level, power))
    boot = bootstrap_ci(lambda a, b: float((a * b).sum() / b.sum()), y, w, n_boot=n_boot, seed=seed) \
        if n_boot else None
    return Estimate(n, mean, se, df, mean - half, mean + half, mean - eq_half, mean + eq_half, p, mde, False, tau2,
                    sigma2, _extrapolation(w, tau2, within, sigma2, f, common, shared),
                    COMMON if common else SEPARATE, slope_p, boot.low if boot else nan, boot.high if boot else nan,
                    k if k < n else 0)


def _satterthwaite(a: float, df_a: int, b: float, df_b: float) -> tuple[float, float]:
    """The standard error of a sum of two independent variance parts — ``a`` (the HKSJ scale,
    ``df_a`` degrees of freedom) and ``b`` (the pooled slope's, from σ̂² on ``df_b``) — and
    Welch–Satterthwaite's degrees of freedom: ``df_a`` when ``b`` is 0 (a line per fork: the
    HKSJ test on n − 1). Without it a common slope's test, half its variance well estimated,
    read t on n − 1 and held α at 0.03 (bench part 1, n = 6)."""
    if not b > 0:
        return math.sqrt(a), float(df_a)
    return math.sqrt(a + b), (a + b) ** 2 / (a ** 2 / df_a + b ** 2 / max(df_b, 1.0))


def slope_equality(f: Fits) -> float:
    """The two-sided p value of "the recipe's and the reference's KL slopes are equal": the
    one-sample t test of the per-pair slope differences (n − 1 degrees of freedom; each seed's
    own difference, so slopes that vary by seed are allowed for). 1 where every difference
    is 0, 0 where they are equal and not 0."""
    b = f.slope_recipe - f.slope_reference
    sd = float(np.std(b, ddof=1))
    if not sd > DEGENERATE_SPREAD * float(np.abs(b).max(initial=0.0)):
        return 1.0 if float(np.abs(b).max(initial=0.0)) == 0.0 else 0.0
    return 2 * _sf(abs(float(b.mean())) / (sd / math.sqrt(b.size)), b.size - 1)


def _moved(f: Fits, sigma2: float) -> tuple[np.ndarray, np.ndarray, float]:
    """The common-slope differences ``Δȳ − β̂ Δx̄``, their leverage ``L₀``, and the pooled
    slope's variance ``σ²/ΣSxx`` (the error every pair shares)."""
    sxx = float((f.sxx_recipe + f.sxx_reference).sum())
    beta = float((f.slope_recipe * f.sxx_recipe + f.slope_reference * f.sxx_reference).sum()) / sxx
    return f.dmean - beta * f.dkl, f.lev0, sigma2 / sxx


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


def _extrapolation(w, tau2, within, sigma2, f: Fits, common: bool, shared: float) -> float:
    """The share of the estimate's model variance ``Σw²(τ² + σ²L)/(Σw)²`` (+ the pooled
    slope's) that comes from reading the lines away from the forks' mean KL: ``σ²(L − L₀)``
    per pair, or with a common slope, the pooled slope's error."""
    if not math.isfinite(sigma2):
        return math.nan  # no residual degrees of freedom: the checkpoint noise is unknown
    if sigma2 <= 0:
        return 0.0
    total = float((w ** 2 * (tau2 + within)).sum() / w.sum() ** 2) + shared
    part = shared if common else float((w ** 2 * sigma2 * (f.lev - f.lev0)).sum() / w.sum() ** 2)
    return part / total if total > 0 else math.nan
