"""One comparison measured on k languages, pooled (``replication.py``).

The primary analysis, fixed before the data, is a **one-stage stratified fixed-effects
model over seed pairs** (``stratified``): every pair weighs by what its KL positions imply
(``1/(τ² + σ² L)``, the spreads pooled over the languages), each language is a stratum with
its own mean, and the common effect is the weighted mean over every pair with the scale
pooled from the residuals about the languages' own means — t on ``Σn − k`` degrees of
freedom. Its claim is about *these* languages (a weighted average
of their effects), not a population of languages that k found by search do not sample.
Beside it the language × treatment **interaction** F test (do the languages' effects differ,
on ``k − 1`` and ``Σn − k`` degrees of freedom). With one language it is that language's own
weighted estimate.

The secondary analysis is random-effects pooling of the languages' estimates
(``pool_inverse_variance``: DerSimonian–Laird τ², Cochran's Q, I²) with the
Hartung–Knapp–Sidik–Jonkman interval **truncated at max(1, q*)** (the Knapp–Hartung
modification: with few languages the untruncated HKSJ standard error can fall below the
plain random-effects one, and its TOST is then too liberal). A design plans the primary test
(``allocation.decide_power``)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats
from scipy.stats import t as student_t

from .inference import EQUIVALENCE_ALPHA, INCONCLUSIVE, _detection, noncentral_mde, t_quantile
from .weighted import Fits, tost_p


@dataclass(frozen=True)
class Stratified:
    """The one-stage stratified fixed-effects estimate (``stratified``)."""

    k: int  # languages (strata) with at least two pairs
    n: int  # pairs
    estimate: float
    se: float
    df: int  # Σn − k
    low: float  # 95 % t interval
    high: float
    eq_low: float  # the 90 % one (TOST)
    eq_high: float
    p_value: float
    means: tuple[float, ...]  # each language's own weighted mean
    interaction_f: float  # language × treatment: F on (k − 1, Σn − k)
    interaction_p: float

    def tost_p(self, margin: float) -> float:
        return tost_p(self.estimate, self.se, self.df, margin)

    def verdict(self, expected_sign: int, margin: float) -> str:
        """Detected (the 95 % interval excludes 0; which way), no effect beyond ±margin (TOST:
        the 90 % interval inside ±δ), else inconclusive."""
        if self.df < 1 or not (math.isfinite(self.se) and self.se > 0):
            return INCONCLUSIVE
        return _detection(self.low, self.high, expected_sign, margin, self.eq_low, self.eq_high)


def stratified(languages: Sequence[Fits], level: float = 0.95) -> Stratified:
    """Pool ``languages`` (each a language's pairs, ``weighted.Fits``; one with fewer than two
    pairs is left out) by the stratified fixed-effects model: every pair's variance ``τ² + σ² L``
    with the checkpoint noise ``σ²`` pooled over every line and the spread ``τ²`` over seeds
    pooled within the languages (DerSimonian–Laird's moment estimator about each language's own
    mean), the same for every language — so the weights do not chase each language's few-seed
    spread, which made the test too liberal —; the estimate ``Σ w y / Σ w`` over every pair, the
    scale ``Σ_l Σ_i w (y − μ̂_l)² / (Σn − k)``, ``se² = scale / Σ w``. Equal leverages: the
    pooled-variance t test of the languages' strata."""
    strata = [f for f in languages if f.n >= 2]
    nan = math.nan
    k, n = len(strata), sum(f.n for f in strata)
    if k == 0 or n - k < 1:
        return Stratified(k, n, nan, nan, 0, nan, nan, nan, nan, nan, (), nan, nan)
    rdf = sum(float(f.rdf.sum()) for f in strata)
    sigma2 = sum(float(f.rss.sum()) for f in strata) / rdf if rdf > 0 else 0.0
    tau2 = _pooled_tau2(strata, sigma2)
    ws = [1.0 / (tau2 + sigma2 * f.lev) if tau2 + sigma2 * float(f.lev.min()) > 0 else np.ones(f.n)
          for f in strata]
    w_sum = np.array([float(w.sum()) for w in ws])
    means = np.array([float((w * f.d).sum() / w.sum()) for f, w in zip(strata, ws)])
    estimate = float((w_sum * means).sum() / w_sum.sum())
    df = n - k
    scale = sum(float((w * (f.d - m) ** 2).sum()) for f, w, m in zip(strata, ws, means)) / df
    se = math.sqrt(scale / float(w_sum.sum()))
    if not se > 0:
        return Stratified(k, n, estimate, 0.0, df, nan, nan, nan, nan, nan, tuple(means.tolist()), nan, nan)
    half, eq = t_quantile(0.5 + level / 2, df) * se, t_quantile(1 - EQUIVALENCE_ALPHA, df) * se
    p = float(2 * student_t.sf(abs(estimate) / se, df))
    if k >= 2:
        f = float((w_sum * (means - estimate) ** 2).sum()) / (k - 1) / scale
        f_p = float(stats.f.sf(f, k - 1, df))
    else:
        f, f_p = nan, nan
    return Stratified(k, n, estimate, se, df, estimate - half, estimate + half, estimate - eq, estimate + eq, p,
                      tuple(means.tolist()), f, f_p)


def _pooled_tau2(strata: Sequence[Fits], sigma2: float) -> float:
    """The spread over seeds pooled within the strata: DerSimonian–Laird's moment estimator
    with each pair's residual about its own stratum's mean (``Σn − k`` degrees of freedom);
    without checkpoint noise, the pooled within-stratum variance."""
    if not sigma2 > 0:
        return sum(float(((f.d - f.d.mean()) ** 2).sum()) for f in strata) / (sum(f.n for f in strata) - len(strata))
    q = c = 0.0
    for f in strata:
        w = 1.0 / (sigma2 * f.lev)
        m = float((w * f.d).sum() / w.sum())
        q += float((w * (f.d - m) ** 2).sum())
        c += float(w.sum() - (w ** 2).sum() / w.sum())
    df = sum(f.n for f in strata) - len(strata)
    return max(0.0, (q - df) / c) if c > 0 else 0.0


@dataclass(frozen=True)
class Pooled:
    """Inverse-variance pooling of k independent estimates (``pool_inverse_variance``)."""

    k: int
    fixed: float  # Σ w m / Σ w, w = 1 / se²
    fixed_se: float
    fixed_low: float  # normal interval
    fixed_high: float
    q: float  # Cochran's Q = Σ w (m − fixed)²
    q_p: float  # P(χ²_{k−1} ≥ Q)
    i2: float  # max(0, (Q − (k − 1)) / Q): the share of the spread beyond chance
    tau2: float  # DerSimonian–Laird between-estimate variance
    random: float  # the random-effects estimate (weights w* = 1 / (se² + τ²))
    random_se: float  # HKSJ truncated: √(max(1, q*) / Σ w*)
    random_low: float  # random ± t_{k−1} · random_se
    random_high: float
    random_p: float  # two-sided, t on k − 1 degrees of freedom
    hksj_q: float = math.nan  # q* = Σ w* (m − random)² / (k − 1): the untruncated HKSJ scale


def pooled_verdict(pooled: Pooled, expected_sign: int, margin: float, level: float = 0.95,
                   power: float = 0.8) -> tuple[str, float]:
    """The verdict of a random-effects pooled estimate (``pool_inverse_variance``) as
    ``power_verdict`` gives one study's — detected (its truncated HKSJ interval at ``level``
    excludes 0; which way), no effect beyond ±``margin`` (TOST: its ``1 − 2α`` interval
    inside ±δ), else inconclusive — and its MDE at ``power`` (noncentral t on k − 1)."""
    if pooled.k < 2 or not (math.isfinite(pooled.random_se) and pooled.random_se > 0):
        return INCONCLUSIVE, math.nan
    df = pooled.k - 1
    eq_half = t_quantile(1 - EQUIVALENCE_ALPHA, df) * pooled.random_se
    verdict = _detection(pooled.random_low, pooled.random_high, expected_sign, margin, pooled.random - eq_half,
                         pooled.random + eq_half)
    return verdict, noncentral_mde(pooled.random_se, df, level, power)


def pool_inverse_variance(means: Sequence[float], ses: Sequence[float], level: float = 0.95) -> Pooled:
    """Fixed-effect (inverse-variance, normal interval) and random-effects pooling of k
    independent estimates (here: one comparison measured on k languages) with Cochran's Q,
    I² and the DerSimonian–Laird τ²; the random-effects interval is Hartung–Knapp–Sidik–
    Jonkman's truncated at max(1, q*) (a t interval on k − 1 degrees of freedom around the
    weighted residual variance, never narrower than the plain random-effects one).
    ``ses``: each estimate's own standard error. Written out (a few lines of textbook algebra)
    and tested against statsmodels' ``combine_effects`` (its HKSJ row, untruncated: ``hksj_q``),
    which is a test dependency only."""
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
    nan = math.nan
    if df > 0:
        hksj_q = float(np.sum(wr * (m - random) ** 2)) / df
        random_se = math.sqrt(max(1.0, hksj_q) / float(np.sum(wr)))
        half = t_quantile(0.5 + level / 2, df) * random_se
        random_p = float(2 * student_t.sf(abs(random) / random_se, df)) if random_se > 0 else nan
    else:
        hksj_q, random_se, half, random_p = nan, nan, nan, nan
    return Pooled(k, fixed, fixed_se, fixed - z * fixed_se, fixed + z * fixed_se, q, q_p, i2, tau2, random,
                  random_se, random - half, random + half, random_p, hksj_q)
