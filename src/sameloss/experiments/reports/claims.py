"""Claim sentences: what the paper says, what this run measured, and whether the direction
agrees — all computed from result rows.

``difference_claim`` compares one quantity between two models (``b - a`` with its normal
95% interval from the two standard errors); ``trend_claim`` is a rank correlation
(Kendall's tau) between two quantities over several models, with a bootstrap interval;
``zero_claim`` checks a quantity a theorem says is 0 (it agrees when its interval holds 0).
The verdict is ``stats.verdict``: "agrees" / "disagrees" when the interval excludes 0,
the weak forms when only the point estimate has a side.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ...measures.rows import error_column, spread_of
from .document import Claim
from ..stats.inference import AGREES, DISAGREES, Interval, bootstrap_ci, diff_interval, kendall_tau, std_to_se, verdict


def fmt(v: float | None, spec: str = ".3g") -> str:
    if v is None or not math.isfinite(v):
        return "n/a"
    return format(v, spec)




def quantity_se(row: dict, key: str, n_seeds: int | None = None, n_subsets: int = 5) -> float:
    """Standard error of the mean of ``key`` in a measured row (its ``error_column``): a
    trace's own standard error; for a probe, the std over seeds / √seeds; for the loss
    and KL, the std over the held-out subsets / √subsets."""
    err = _f(row.get(error_column(key)))
    spread = spread_of(key)
    if spread is None:
        return err
    return std_to_se(err, (n_seeds or 1) if spread == "seeds" else n_subsets)


def _f(v) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return float("nan")


@dataclass(frozen=True)
class Shown:
    """How a claim writes a quantity: times ``scale``, formatted by ``spec``, followed by
    ``unit``."""

    scale: float = 1.0
    unit: str = ""
    spec: str = ".3g"


POINTS = Shown(scale=100, unit=" pts")  # an accuracy (a fraction of 1) in percentage points


def difference_claim(paper: str, what: str, key: str, a: tuple[dict, str], b: tuple[dict, str], expected_sign: int,
                     shown: Shown = Shown(), n_seeds: int | None = None) -> Claim:
    """``b[key] - a[key]`` (``a`` and ``b``: a row and the name the claim gives it; written
    as ``shown`` says) with its 95% interval; the paper expects its sign to be
    ``expected_sign``. ``n_seeds``: a probe's seeds (``quantity_se``)."""
    (row_a, a_name), (row_b, b_name) = a, b
    scale, unit, spec = shown.scale, shown.unit, shown.spec
    va, vb = _f(row_a.get(key)), _f(row_b.get(key))
    ea, eb = quantity_se(row_a, key, n_seeds), quantity_se(row_b, key, n_seeds)
    iv = diff_interval(va * scale, ea * scale, vb * scale, eb * scale)
    kl = ""
    if row_a.get("kl") is not None and row_b.get("kl") is not None:
        kl = f" (KL to the true conditionals {fmt(_f(row_a['kl']))} and {fmt(_f(row_b['kl']))} nats)"
    measured = (f"{what}: {a_name} {fmt(va * scale, spec)}{unit}, {b_name} {fmt(vb * scale, spec)}{unit}{kl}; "
                f"difference {fmt(iv.estimate, spec)}{unit}, 95% interval [{fmt(iv.low, spec)}, {fmt(iv.high, spec)}]"
                f"{unit} (± 1.96 × the combined standard error).")
    return Claim(paper, measured, verdict(iv, expected_sign))


def trend_claim(paper: str, what: str, x: list[float], y: list[float], expected_sign: int, seed: int = 0,
                n_boot: int = 2000) -> tuple[Claim, Interval]:
    """Kendall's tau of ``(x, y)`` with a 95% bootstrap interval over the points."""
    iv = bootstrap_ci(kendall_tau, x, y, n_boot=n_boot, seed=seed)
    measured = (f"{what}: Kendall τ = {fmt(iv.estimate)} over {iv.n} points, 95% bootstrap interval "
                f"[{fmt(iv.low)}, {fmt(iv.high)}].")
    return Claim(paper, measured, verdict(iv, expected_sign)), iv


def zero_claim(paper: str, what: str, value: float, se: float) -> Claim:
    """A quantity the theory says is 0: agrees when its 95% interval contains 0."""
    iv = diff_interval(0.0, 0.0, value, se)
    inside = iv.low <= 0 <= iv.high
    measured = (f"{what}: {fmt(value)} ± {fmt(se, '.2g')} (SE), 95% interval [{fmt(iv.low)}, {fmt(iv.high)}]"
                f"{' contains' if inside else ' excludes'} 0.")
    return Claim(paper + " [an equality: \"agrees\" = the interval contains 0]", measured,
                 AGREES if inside else DISAGREES)
