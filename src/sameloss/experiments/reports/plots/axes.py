"""Axis limits and tick labels: log axes whose labelled ticks bracket the data, linear
axes inside a quantity's range, and numbers written as short as they can be and still
exact (an interval's ends rounded to its own precision, so rounding noise such as
``-3.69e-29`` reads 0)."""

from __future__ import annotations

import math

from .quantities import Quantity

def _thinned(candidates: list[float], lo: float, hi: float, span: float, keep: tuple[float, ...] = ()) -> list[float]:
    """Ticks in [lo, hi] at least span/7 (log) apart; ``keep`` first, then the roundest."""
    kept: list[float] = []
    for t in [*keep, *candidates]:
        if lo <= t <= hi and all(abs(math.log10(t / k)) >= span / 7 for k in kept):
            kept.append(t)
    return sorted(kept)


def _log_levels(lo: float, hi: float):
    """Candidate tick sets, coarse to fine: decades, 1-2-5, 1..9 per decade, then evenly
    spaced round numbers (a range well inside a decade)."""
    from matplotlib.ticker import MaxNLocator

    decades = range(math.floor(math.log10(lo)) - 1, math.ceil(math.log10(hi)) + 2)
    for mantissas in ((1,), (1, 2, 5), (1, 2, 5, 3, 4, 6, 7, 8, 9)):
        yield [m * 10.0 ** k for m in mantissas for k in decades]
    for nbins in (4, 6, 8):
        yield [float(t) for t in MaxNLocator(nbins=nbins, steps=[1, 2, 2.5, 5, 10]).tick_values(lo, hi) if t > 0]


def log_limits(lo: float, hi: float) -> tuple[float, float, list[float]]:
    """Limits and labelled ticks of a log axis over data in ``[lo, hi]`` (0 < lo <= hi): the
    coarsest round ticks that bracket the data (a labelled tick at or beyond each end), at
    least three, with the data filling at least half of the axis; limits a little outside
    the bracketing ticks."""
    if lo == hi:
        lo, hi = lo / 1.2, hi * 1.2
    data_span = math.log10(hi / lo)
    for candidates in _log_levels(lo, hi):
        below = [t for t in candidates if t <= lo * (1 + 1e-12)]
        above = [t for t in candidates if t >= hi * (1 - 1e-12)]
        if not below or not above:
            continue
        a, b = max(below), min(above)
        span = math.log10(b / a)
        if span <= 0 or data_span / span < 0.5:
            continue
        # the roundest numbers first (the candidates' own order), the bracketing ends kept
        ticks = _thinned([t for t in candidates if a <= t <= b], a, b, span, keep=(a, b))
        if len(ticks) >= 3:
            pad = 10 ** (0.03 * span)
            return a / pad, b * pad, ticks
    pad = 10 ** (0.06 * data_span)
    return lo / pad, hi * pad, [lo, hi]


def _number(t: float) -> str:
    """A tick label: a plain number, as short as it can be and still exact."""
    if t == 0:
        return "0"
    for div, suffix in ((1e6, "M"), (1e4, "k")):
        if abs(t) >= div:
            return _number(t / (div if suffix == "M" else 1e3)) + suffix
    if abs(t) < 1e-3:
        text = next(f"{t:.{d}e}" for d in range(7) if _exact(f"{t:.{d}e}", t))
        mantissa, exponent = text.split("e")
        return f"{mantissa}e{int(exponent)}"
    return next((f"{t:.{d}f}" for d in range(10) if _exact(f"{t:.{d}f}", t)), f"{t:g}")


def _exact(text: str, t: float) -> bool:
    return abs(float(text) - t) <= 1e-9 * abs(t)


def _set_log_axis(ax, which: str, lo: float, hi: float) -> tuple[float, float]:
    from matplotlib.ticker import FixedFormatter, FixedLocator, NullFormatter

    lo, hi, ticks = log_limits(lo, hi)
    axis = ax.yaxis if which == "y" else ax.xaxis
    (ax.set_yscale if which == "y" else ax.set_xscale)("log")
    (ax.set_ylim if which == "y" else ax.set_xlim)(lo, hi)
    axis.set_major_locator(FixedLocator(ticks))
    axis.set_major_formatter(FixedFormatter([_number(t) for t in ticks]))
    axis.set_minor_formatter(NullFormatter())
    return lo, hi


def _linear_limits(values: list[float], q: Quantity) -> tuple[float, float]:
    """A little room around the values, inside the quantity's range. A constant (one value,
    e.g. a learning rate held fixed) gets an axis from 0 when the quantity cannot be
    negative — not a window of ±6 % whose ticks read 0.00094…0.00106 — else ±50 %."""
    lo, hi = min(values), max(values)
    if hi - lo <= 1e-9 * max(abs(lo), abs(hi)):
        if hi == 0:
            return max(-0.5, q.lo), min(0.5, q.hi)
        if q.lo == 0 and lo > 0:
            return 0.0, min(hi * 1.25, q.hi)
        pad = 0.5 * abs(hi)
        return max(lo - pad, q.lo), min(hi + pad, q.hi)
    pad = (hi - lo) * 0.06
    return max(lo - pad, q.lo), min(hi + pad, q.hi)


def interval_text(estimate: float, low: float, high: float) -> str:
    """``estimate [low, high]`` rounded to the interval's own precision (two significant
    digits of its width): ends that differ from 0 by rounding noise read 0."""
    width = abs(high - low) if math.isfinite(high - low) else 0.0
    values = (estimate, low, high)
    if width > 0:
        decimals = max(0, 1 - math.floor(math.log10(width)))
        if decimals > 8 or abs(max(values, key=abs)) >= 1e5:
            return " ".join((_sig(estimate), f"[{_sig(low)}, {_sig(high)}]"))
        texts = [_signed(f"{v:.{decimals}f}") for v in values]
        return f"{texts[0]} [{texts[1]}, {texts[2]}]"
    return f"{_sig(estimate)} [{_sig(low)}, {_sig(high)}]"


def _sig(v: float) -> str:
    return _signed(f"{v:.3g}") if math.isfinite(v) else "n/a"


def _signed(text: str) -> str:
    """A number's text with a true minus sign, and no "-0"."""
    if text.lstrip("-").strip("0.") == "":
        text = text.lstrip("-")
    return text.replace("-", "−")
