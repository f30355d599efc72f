"""One comparison measured on k languages, pooled (``replication.py``): fixed-effect
(inverse-variance) and random-effects pooling with Cochran's Q, I² and the DerSimonian–Laird
τ², the random-effects interval Hartung–Knapp–Sidik–Jonkman's (``pool_inverse_variance``);
the verdict of the pooled estimate as ``stats.power_verdict`` gives one study's
(``pooled_verdict``); and the MDE a study of L languages × m seeds plans for it
(``pooled_mde``)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats
from scipy.stats import t as student_t

from .inference import (EQUIVALENCE_ALPHA, INCONCLUSIVE, _detection, minimum_detectable_effect, noncentral_mde,
    t_quantile)

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
    random_se: float  # Hartung–Knapp–Sidik–Jonkman: √(Σ w* (m − random)² / ((k − 1) Σ w*))
    random_low: float  # random ± t_{k−1} · random_se (HKSJ)
    random_high: float
    random_p: float  # two-sided, t on k − 1 degrees of freedom


def pooled_verdict(pooled: Pooled, expected_sign: int, margin: float, level: float = 0.95,
                   power: float = 0.8) -> tuple[str, float]:
    """The verdict of a random-effects pooled estimate (``pool_inverse_variance``) as
    ``power_verdict`` gives one study's — detected (its HKSJ interval at ``level`` excludes 0;
    which way), no effect beyond ±``margin`` (TOST: its ``1 − 2α`` HKSJ interval inside
    ±δ), else inconclusive — and its MDE at ``power`` (noncentral t on k − 1 degrees of
    freedom, the HKSJ standard error): the claim about languages, not about one draw."""
    if pooled.k < 2 or not (math.isfinite(pooled.random_se) and pooled.random_se > 0):
        return INCONCLUSIVE, math.nan
    df = pooled.k - 1
    eq_half = t_quantile(1 - EQUIVALENCE_ALPHA, df) * pooled.random_se
    verdict = _detection(pooled.random_low, pooled.random_high, expected_sign, margin, pooled.random - eq_half,
                         pooled.random + eq_half)
    return verdict, noncentral_mde(pooled.random_se, df, level, power)


def pooled_mde(sd: float, tau: float, languages: int, seeds: int, level: float = 0.95, power: float = 0.8) -> float:
    """The MDE a study of ``languages`` languages × ``seeds`` seeds each plans for its pooled
    random-effects test: with one within-language paired SD ``sd`` and a spread ``tau`` of the
    true effects between languages, every language's estimate has variance ``tau² + sd²/seeds``
    and equal weight, and the HKSJ test is then the one-sample t test of the ``languages``
    estimates (k − 1 degrees of freedom) — ``minimum_detectable_effect`` of that SD over
    ``languages``. More languages buy more than more seeds: seeds shrink only the ``sd²/seeds``
    part, and the t quantile on k − 1 degrees of freedom is large for few languages."""
    if seeds < 1 or tau < 0:
        return math.nan
    return minimum_detectable_effect(math.sqrt(tau**2 + sd**2 / seeds), languages, level, power)


def pool_inverse_variance(means: Sequence[float], ses: Sequence[float], level: float = 0.95) -> Pooled:
    """Fixed-effect (inverse-variance, normal interval) and random-effects pooling of k
    independent estimates (here: one comparison measured on k languages) with Cochran's Q,
    I² and the DerSimonian–Laird τ²; the random-effects interval is Hartung–Knapp–Sidik–
    Jonkman's (a t interval on k − 1 degrees of freedom around the weighted residual
    variance), not the normal one, which is anti-conservative with few studies.
    ``ses``: each estimate's own standard error (a language's sd/√n). Written out (a few
    lines of textbook algebra) and tested against statsmodels' ``combine_effects``
    (``"random effect wls"``: the HKSJ row), which is a test dependency only."""
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
        random_se = math.sqrt(float(np.sum(wr * (m - random) ** 2)) / (df * float(np.sum(wr))))
        half = t_quantile(0.5 + level / 2, df) * random_se
        random_p = float(2 * student_t.sf(abs(random) / random_se, df)) if random_se > 0 else nan
    else:
        random_se, half, random_p = nan, nan, nan
    return Pooled(k, fixed, fixed_se, fixed - z * fixed_se, fixed + z * fixed_se, q, q_p, i2, tau2, random,
                  random_se, random - half, random + half, random_p)
