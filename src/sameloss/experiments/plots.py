"""The package's one plotting style: every figure of ``sameloss reproduce`` and ``sameloss plot``.

Five kinds of figure; each ``*_plot`` returns a matplotlib Figure (drawn off-screen) and
``save_figure`` writes it:

* ``series_plot(series, x, panels, title)`` — quantities against a step, a size or the KL
  (a panel may shade a stretch of its x axis: ``Band``, e.g. a window of steps),
  one line per series (the paper's Figs. 2–5);
* ``scatter_plot(rows, panels, title, colour_by=, marker_by=, hollow=, join_by=)`` — one
  quantity against another, one marker per model: colour = model size, marker = recipe,
  hollow = outside a tolerance, a run's checkpoints joined in step order, an optional
  fitted line per panel (``XY(fit="ols")`` or ``XY(fit=Fit(...))``) (Fig. 1);
* ``dots_plot(rows, label, panels, title)`` — one dot with its interval per model and
  quantity (Tables 1–2 as a figure);
* ``forest_plot(rows, label, panels, title)`` — paired differences with their 95 %
  intervals, the line of no difference and each row's minimum detectable effect (MDE);
* ``curves_plot(runs, title)`` — training curves (train loss, exact KL or held-out
  cross-entropy, learning rate against step) of runs from their ``metrics.jsonl``.

A panel names a quantity by its key in a measured row (``measures/rows.py``): the key
decides the scale (accuracies are shown in %), the range the axis may span, the unit, and
which column holds the error bar. Recipes pass ``errors=error_labels(spec)`` so that the
legend says what each bar is with the measure's own counts.

Rules every figure keeps (``tests/experiments/test_plots.py`` checks each on the drawn
artists and on the saved data):

1. every error bar says what it is: for each panel that draws bars, a legend entry
   "<quantity>: ± std over 5 probe seeds" (the report's caption repeats it); a bar cut at
   the end of its quantity's range ends in a triangle (▼▲◀▶) instead of a cap, so a spread
   larger than the room left (std above the mean accuracy) stays visible;
2. no bar charts: a value is a dot, its interval a line (a zoomed axis then exaggerates
   nothing, and a quantity without a meaningful zero is never drawn as a length);
3. axes stay inside a quantity's range: accuracies 0–100 %, losses, KL, traces of positive
   semi-definite matrices, counts and MSEs >= 0;
4. the exact KL is on a log axis; the optimum is named: a dashed line at the entropy where
   a loss is plotted, "loss = entropy + KL" where the KL is;
5. the trace estimator is named on its axis (``TRACE_FISHER``);
6. scatter plots colour by model size and mark by recipe (as the paper's Figs. 1, 3, 5);
   a series keeps its colour and marker in every panel; panels are lettered (a), (b), …
   and a series drawn in some panels only says which in the legend;
7. log axes have labelled ticks that bracket the data; step axes have integer ticks;
8. the legends sit below the panels (they cover no point), one block each for colours,
   markers, reference lines and error bars.

``save_figure(fig, folder, stem, formats)`` writes ``<stem>.png`` (200 dpi; or PDF / SVG,
vector) atomically, tagged as written by sameloss (``is_sameloss_figure``), and
``<stem>.data.csv`` beside it: exactly the plotted numbers — one row per panel (its
quantities, scales and limits), per point (value and the drawn ends of its bars), per
reference line and per fitted line — to replot in another style or check a figure.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from ..measures import rows as schema
from .report import FORMATS, parse_formats  # (there: the CLI reads them without importing torch)

DPI = 200  # PNG; PDF and SVG are vector
TAG = "sameloss-figure"  # in every written image's metadata: ``is_sameloss_figure``
MARKERS = "osDPXph*d"  # no triangles: they mark a cut error bar
TRACE_FISHER = "tr(H), Fisher estimator (App. B.1)"  # the paper's estimator, named on its axis
TRACE_HUTCHINSON = "tr(H), Hutchinson (true tokens)"
TRACE_HUTCHPP = "tr(H), Hutch++ (true tokens)"
LEGEND_FONT = 9  # points; legends, like the axes, stay legible when a 3-panel figure is set at text width
STYLE = {"font.size": 9.5, "axes.titlesize": 10, "axes.labelsize": 10, "xtick.labelsize": 9, "ytick.labelsize": 9,
         "legend.fontsize": LEGEND_FONT, "legend.title_fontsize": LEGEND_FONT, "figure.titlesize": 11,
         "axes.grid": True, "grid.alpha": 0.3, "axes.spines.top": False, "axes.spines.right": False}
PANEL_WIDTH, PANEL_HEIGHT = 3.5, 3.0  # inches
CUT_MARKERS = {"y_low": "v", "y_high": "^", "x_low": "<", "x_high": ">"}
DATA_COLUMNS = ("panel", "kind", "series", "x", "y", "x_low", "x_high", "y_low", "y_high", "cut", "x_quantity",
                "x_scale", "x_label", "y_quantity", "y_scale", "y_label", "note")


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


# ---- quantities ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Quantity:
    """How a row's key is shown: ``scale`` (100 for accuracies in %), the range ``[lo, hi]``
    it can take (as shown), its unit."""

    scale: float = 1.0
    lo: float = -math.inf
    hi: float = math.inf
    unit: str = ""


# quantities that cannot be negative (besides accuracies and nats): traces of positive
# semi-definite matrices (the Fisher, its embedded view), absolute gaps, counts, MSEs, rates
NONNEGATIVE = frozenset({"trace", "trace_fisher", "trace_embedded", "trace_abs_gap", "trace_per_kl", "target_variance",
                         "lr", "parameters", "step", "tokens_per_s", "epochs"})
# (a block's trace of the Fisher, ``trace_fisher_<block>`` of ``measure --trace-by block``, is
# that of a diagonal block of a PSD matrix)
NONNEGATIVE_PREFIXES = ("down_mse", "trace_fisher_")


def quantity(key: str | None) -> Quantity:
    if key is None:
        return Quantity()
    if schema.is_accuracy(key) or key.startswith("down_acc"):
        return Quantity(100.0, 0.0, 100.0, "%")
    if key in schema.NATS_KEYS or key.startswith("heldout_loss"):
        return Quantity(1.0, 0.0, math.inf, "nats")
    if key in NONNEGATIVE or key.startswith(NONNEGATIVE_PREFIXES):
        return Quantity(1.0, 0.0, math.inf)
    return Quantity()


def _value(row: dict, key: str | None) -> float:
    if key is None:
        return math.nan
    try:
        v = float(row.get(key))
    except (TypeError, ValueError):
        return math.nan
    return v * quantity(key).scale


def _error(row: dict, key: str) -> float | None:
    """The row's error of ``key`` (as shown), or None."""
    try:
        e = float(row.get(schema.error_column(key)))
    except (TypeError, ValueError):
        return None
    return e * quantity(key).scale if math.isfinite(e) and e > 0 else None


def with_unit(label: str, key: str | None) -> str:
    """``label`` with the unit of ``key`` appended unless it already says it."""
    unit = quantity(key).unit
    if not unit or unit in label:
        return label
    return f"{label} ({unit})"


def _stem(label: str) -> str:
    """An axis label without its trailing parenthesis (unit, notes)."""
    return re.sub(r"\s*\([^()]*\)\s*$", "", label) or label


# ---- what the error bars are -----------------------------------------------------------------
def error_labels(spec=None) -> dict[str, str]:
    """What the error column of each measured quantity is, in words, with the counts of
    ``spec`` (a ``measures.run.MeasureSpec``; without one, without counts): the legend and
    the caption of every figure say it. Keys are quantity keys or their prefixes."""
    from ..training.config import EvalConfig

    subsets = EvalConfig().n_subsets  # measures use the run's eval.n_subsets, 5 unless changed
    out = {"loss": f"± std over {subsets} held-out subsets", "kl": f"± std over {subsets} held-out subsets",
           "trace": "± SE of the trace estimator", "probe": "± std over probe seeds",
           "finetune": "± std over fine-tuning seeds", "lookup": "± std over probe seeds"}
    if spec is not None:
        n = len(spec.seeds)
        fisher = (f"± SE of the Fisher estimator ({spec.n_contexts * spec.repeats} contexts × {spec.n_labels} "
                  "sampled labels)")
        out.update({"trace_fisher": fisher, "trace_embedded": fisher,
                    "trace_hutchinson": f"± SE over {spec.n_probes} Hutchinson probes",
                    "trace_hutchpp": f"± SE of Hutch++ ({spec.n_probes} Hessian products)",
                    "probe": f"± std over {n} probe seeds", "finetune": f"± std over {n} fine-tuning seeds",
                    "lookup": f"± std over {n} probe seeds"})
    return out


def describe_error(key: str, errors: dict[str, str] | None = None) -> str:
    """The words for the error bar of ``key``: ``errors[key]``, else the longest key of
    ``errors`` that ``key`` starts with, else what ``measures/rows.py`` says it is."""
    errors = errors or {}
    if key in errors:
        return errors[key]
    prefixes = [k for k in errors if key.startswith(k)]
    if prefixes:
        return errors[max(prefixes, key=len)]
    if key == "trace" or key.startswith("trace_"):
        return "± SE of the trace estimator"
    if schema.is_accuracy(key):
        return "± std over seeds"
    if key in schema.NATS_KEYS:
        return "± std over held-out subsets"
    return f"± the row's {schema.error_column(key)}"


# ---- log axes ----------------------------------------------------------------------------------
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
    lo, hi = min(values), max(values)
    pad = (hi - lo) * 0.06 if hi > lo else (abs(hi) * 0.06 or 0.5)
    return max(lo - pad, q.lo), min(hi + pad, q.hi)


# ---- one panel -------------------------------------------------------------------------------
@dataclass
class _Points:
    """Points of one series in one panel, in shown units; ``*_low`` / ``*_high`` the ends
    of their bars (None: no bar on that side)."""

    series: str
    xs: list[float]
    ys: list[float]
    x_low: list[float | None]
    x_high: list[float | None]
    y_low: list[float | None]
    y_high: list[float | None]
    color: object
    marker: str
    filled: bool = True
    line: bool = False
    size: float = 5.0


@dataclass(frozen=True)
class Ref:
    """A reference line: ``axis`` "y" = horizontal at ``value`` (shown units), "x" = vertical."""

    value: float
    label: str
    axis: str = "y"
    color: object = "0.35"
    style: str = "--"
    # the axis limits include it: True always, None (default) unless that would stretch the
    # axis by more than half its span (then a line beyond the axis is named so in the legend)
    in_extent: bool | None = None


@dataclass(frozen=True)
class Fit:
    """A straight line ``y = intercept + slope·x`` (shown units) drawn over a panel's x range,
    labelled in the legend (e.g. a within-seed regression with its interval)."""

    slope: float
    intercept: float
    label: str


@dataclass(frozen=True)
class Band:
    """A shaded stretch of one axis between ``low`` and ``high`` (shown units; ``axis`` "x":
    a range of x, e.g. a window of steps), named in the legend. The axis limits include it.
    Drawn as a filled polygon spanning the panel, never as a bar."""

    low: float
    high: float
    label: str
    axis: str = "x"
    color: object = "C2"
    alpha: float = 0.15


def _span(values: list[float], log: bool) -> float:
    if log:
        values = [v for v in values if v > 0]
        return math.log10(max(values) / min(values)) if values else 0.0
    return max(values) - min(values)


def _ends(values: list[float], errors: list[float | None]) -> tuple[list, list]:
    low = [v - e if e is not None and math.isfinite(v) else None for v, e in zip(values, errors)]
    high = [v + e if e is not None and math.isfinite(v) else None for v, e in zip(values, errors)]
    return low, high


class _Panel:
    """One axes: points, reference lines and fits collected first, then ``finish`` sets the
    limits from everything drawn (inside the quantities' ranges), cuts bars at those
    ranges, draws, and records every number for the data file."""

    def __init__(self, ax, index: int, x: str | None, y: str | None, xlabel: str, ylabel: str, *,
                 xlog: bool = False, ylog: bool = False, integer_x: bool = False, categories: list[str] | None = None,
                 errors: dict[str, str] | None = None, x_error: str | None = None, y_error: str | None = None):
        self.ax, self.index, self.x, self.y = ax, index, x, y
        self.xq, self.yq = quantity(x), quantity(y)
        self.xlabel, self.ylabel = with_unit(xlabel, x), (with_unit(ylabel, y) if categories is None else ylabel)
        self.xlog, self.ylog, self.integer_x, self.categories = xlog, ylog, integer_x, categories
        self.x_error = x_error or (describe_error(x, errors) if x else None)
        self.y_error = y_error or (describe_error(y, errors) if y else None)
        self.points: list[_Points] = []
        self.refs: list[Ref] = []
        self.fits: list[Fit] = []
        self.bands: list[Band] = []
        self.texts: list[tuple[int, str]] = []  # (category, text) written at the axis's start
        # (series, x, y, colour) of values <= 0 on a log x axis: named at its start
        self.offaxis: list[tuple[str, float, float, object]] = []
        self.drew_x_bars = self.drew_y_bars = False
        self.beyond: set[str] = set()  # reference lines beyond the axis's limits (not drawn)
        self.span: dict[str, list[float]] = {"x": [], "y": []}  # values the limits must include besides the data

    def add(self, p: _Points) -> None:
        if self.xlog:  # a value <= 0 cannot be drawn on a log axis: named at the axis's start instead
            keep = [i for i, x in enumerate(p.xs) if not (math.isfinite(x) and x <= 0)]
            self.offaxis += [(p.series, p.xs[i], p.ys[i], p.color) for i in range(len(p.xs)) if i not in keep]
            for name in ("xs", "ys", "x_low", "x_high", "y_low", "y_high"):
                setattr(p, name, [getattr(p, name)[i] for i in keep])
        ok = [i for i, (x, y) in enumerate(zip(p.xs, p.ys)) if math.isfinite(x) and math.isfinite(y)]
        for name in ("xs", "ys", "x_low", "x_high", "y_low", "y_high"):
            setattr(p, name, [getattr(p, name)[i] for i in ok])
        if p.xs:
            self.points.append(p)

    def ref(self, r: Ref) -> None:
        if math.isfinite(r.value):
            self.refs.append(r)

    def band(self, b: Band) -> None:
        if math.isfinite(b.low) and math.isfinite(b.high):
            self.bands.append(b)

    # -- limits and drawing --
    def _cut(self) -> None:
        """Bar ends beyond the quantity's range stop at it (and are marked as cut)."""
        self.cuts: dict[tuple[int, int], list[str]] = {}
        for s, p in enumerate(self.points):
            for i in range(len(p.xs)):
                for axis, q in (("x", self.xq), ("y", self.yq)):
                    lo, hi = getattr(p, f"{axis}_low"), getattr(p, f"{axis}_high")
                    if lo[i] is not None and lo[i] < q.lo:
                        lo[i] = q.lo
                        self.cuts.setdefault((s, i), []).append(f"{axis}_low")
                    if hi[i] is not None and hi[i] > q.hi:
                        hi[i] = q.hi
                        self.cuts.setdefault((s, i), []).append(f"{axis}_high")

    def _extent(self, axis: str) -> list[float]:
        out = []
        for p in self.points:
            out += getattr(p, f"{axis}s")
            out += [v for v in getattr(p, f"{axis}_low") + getattr(p, f"{axis}_high") if v is not None]
        out = [v for v in out + self.span[axis] if math.isfinite(v)]
        log = self.xlog if axis == "x" else self.ylog
        out += [v for b in self.bands if b.axis == axis for v in (b.low, b.high) if not (log and v <= 0)]
        for r in self.refs:
            if r.axis != axis or r.in_extent is False or (log and r.value <= 0):
                continue
            if r.in_extent or not out or _span([*out, r.value], log) <= 1.5 * _span(out, log):
                out.append(r.value)
        return out

    def _limits(self, axis: str) -> tuple[float, float] | None:
        ax, q = self.ax, (self.xq if axis == "x" else self.yq)
        log = self.xlog if axis == "x" else self.ylog
        if axis == "y" and self.categories is not None:
            n = len(self.categories)
            ax.set_ylim(n - 0.5, -0.5)  # the first row on top
            ax.set_yticks(range(n), self.categories)
            return None
        extent = self._extent(axis)
        if log:
            positive = [v for v in extent if v > 0]
            if not positive:
                return None
            lo, hi = _set_log_axis(ax, axis, min(positive), max(positive))
            # a bar reaching 0 or below ends at the axis's start (cut)
            for s, p in enumerate(self.points):
                low = getattr(p, f"{axis}_low")
                for i, v in enumerate(low):
                    if v is not None and v < lo:
                        low[i] = lo
                        cuts = self.cuts.setdefault((s, i), [])
                        if f"{axis}_low" not in cuts:
                            cuts.append(f"{axis}_low")
            return lo, hi
        if not extent:
            return None
        lo, hi = _linear_limits(extent, q)
        (ax.set_xlim if axis == "x" else ax.set_ylim)(lo, hi)
        if axis == "x" and self.integer_x:
            from matplotlib.ticker import MaxNLocator
            ax.xaxis.set_major_locator(MaxNLocator(integer=True, nbins=6, steps=[1, 2, 4, 5, 10]))
        return lo, hi

    def finish(self, rec: "_Record", letter: str | None) -> None:
        ax = self.ax
        self._cut()
        xlim = self._limits("x")
        self._limits("y")
        if xlim is None and self.offaxis:
            xlim = (1.0, 10.0)
            _set_log_axis(ax, "x", 1.0, 10.0)
        for p in self.points:
            if p.line:
                ax.plot(p.xs, p.ys, color=p.color, linewidth=1.1, zorder=2)
            face = p.color if p.filled else "white"
            (line,) = ax.plot(p.xs, p.ys, linestyle="none", marker=p.marker, markersize=p.size, color=p.color,
                              markerfacecolor=face, markeredgewidth=1.0, zorder=3, clip_on=False)
            line.set_gid("point")
        for s, p in enumerate(self.points):
            self._bars(s, p)
        for r in self.refs:
            lo, hi = sorted(ax.get_ylim() if r.axis == "y" else ax.get_xlim())
            if not lo <= r.value <= hi:
                self.beyond.add(r.label)
                continue
            draw = ax.axhline if r.axis == "y" else ax.axvline
            draw(r.value, color=r.color, linestyle=r.style, linewidth=1.0, zorder=1).set_gid("ref")
        for b in self.bands:  # a polygon across the panel (the other axis in axes coordinates)
            if b.axis == "x":
                band = ax.fill_between([b.low, b.high], 0, 1, transform=ax.get_xaxis_transform(), color=b.color,
                                       alpha=b.alpha, linewidth=0, zorder=0.5)
            else:
                band = ax.fill_betweenx([b.low, b.high], 0, 1, transform=ax.get_yaxis_transform(), color=b.color,
                                        alpha=b.alpha, linewidth=0, zorder=0.5)
            band.set_gid("band")
        for f in self.fits:
            lo, hi = ax.get_xlim()
            xs = [lo * (hi / lo) ** (k / 50) for k in range(51)] if self.xlog else [lo, hi]
            (line,) = ax.plot(xs, [f.intercept + f.slope * x for x in xs], color="0.2", linewidth=1.0,
                              linestyle="-", zorder=1.5, scalex=False, scaley=False)
            line.set_gid("fit")
        for series, x, y, color in self.offaxis:
            left = ax.get_xlim()[0]
            ax.annotate(f"◀ {_number(x)}", (left, y), xytext=(2, 0), textcoords="offset points", va="center",
                        fontsize=8, color=color, annotation_clip=False)
        ax.set_xlabel(self.xlabel)
        ax.set_ylabel(self.ylabel if self.categories is None else "")
        if self.categories is not None:
            ax.grid(False, axis="y")
        if letter:
            ax.set_title(f"({letter})", loc="left", fontweight="bold")
        self._record(rec)

    def _bars(self, s: int, p: _Points) -> None:
        ax = self.ax
        idx = [i for i in range(len(p.xs)) if any(v is not None for v in
                                                    (p.x_low[i], p.x_high[i], p.y_low[i], p.y_high[i]))]
        if not idx:
            return

        def side(values, ends):
            return [abs(ends[i] - values[i]) if ends[i] is not None else 0.0 for i in idx]

        xs, ys = [p.xs[i] for i in idx], [p.ys[i] for i in idx]
        has_x = any(p.x_low[i] is not None or p.x_high[i] is not None for i in idx)
        has_y = any(p.y_low[i] is not None or p.y_high[i] is not None for i in idx)
        xerr = [side(p.xs, p.x_low), side(p.xs, p.x_high)] if has_x else None
        yerr = [side(p.ys, p.y_low), side(p.ys, p.y_high)] if has_y else None
        # thin and a little transparent: crossing bars of neighbours stay readable, markers show through
        container = ax.errorbar(xs, ys, xerr=xerr, yerr=yerr, fmt="none", ecolor=p.color, elinewidth=0.8,
                                capsize=1.8, capthick=0.8, alpha=0.75, zorder=4, clip_on=False)
        for artist in container.lines[2]:
            artist.set_gid("errorbar")
        self.drew_x_bars |= has_x
        self.drew_y_bars |= has_y
        for i in idx:
            for cut in self.cuts.get((s, i), []):
                at = (getattr(p, cut)[i], p.ys[i]) if cut.startswith("x") else (p.xs[i], getattr(p, cut)[i])
                (mark,) = ax.plot(*at, marker=CUT_MARKERS[cut], markersize=4.5, color=p.color, linestyle="none",
                                  zorder=5, clip_on=False)
                mark.set_gid("cut")

    def _record(self, rec: "_Record") -> None:
        ax = self.ax
        xlim, ylim = ax.get_xlim(), ax.get_ylim()
        rec.rows.append({"panel": self.index, "kind": "axes", "x_low": xlim[0], "x_high": xlim[1],
                         "y_low": min(ylim), "y_high": max(ylim), "x_quantity": self.x or "",
                         "x_scale": ax.get_xscale(), "x_label": self.xlabel,
                         "y_quantity": self.y or ("category" if self.categories else ""),
                         "y_scale": "category" if self.categories else ax.get_yscale(), "y_label": self.ylabel})
        for s, p in enumerate(self.points):
            for i in range(len(p.xs)):
                y = self.categories[int(p.ys[i])] if self.categories is not None else p.ys[i]
                rec.rows.append({"panel": self.index, "kind": "point", "series": p.series, "x": p.xs[i], "y": y,
                                 "x_low": p.x_low[i], "x_high": p.x_high[i], "y_low": p.y_low[i],
                                 "y_high": p.y_high[i], "cut": " ".join(self.cuts.get((s, i), []))})
        for series, x, y, _ in self.offaxis:
            y = self.categories[int(y)] if self.categories is not None else y
            rec.rows.append({"panel": self.index, "kind": "offaxis", "series": series, "x": x, "y": y,
                             "note": "at or below 0: not drawable on the log axis, named at its start"})
        for r in self.refs:
            rec.rows.append({"panel": self.index, "kind": f"ref-{r.axis}", "series": r.label, r.axis: r.value,
                             "note": "beyond the axis: not drawn" if r.label in self.beyond else ""})
        for b in self.bands:
            rec.rows.append({"panel": self.index, "kind": f"band-{b.axis}", "series": b.label,
                             f"{b.axis}_low": b.low, f"{b.axis}_high": b.high})
        for f in self.fits:
            lo, hi = ax.get_xlim()
            rec.rows.append({"panel": self.index, "kind": "fit", "series": f.label, "x_low": lo, "x_high": hi,
                             "y_low": f.intercept + f.slope * lo, "y_high": f.intercept + f.slope * hi,
                             "note": f"slope {f.slope!r}, intercept {f.intercept!r}"})
        if self.drew_x_bars:
            rec.bars.setdefault(_stem(self.xlabel), self.x_error)
        if self.drew_y_bars:
            rec.bars.setdefault(_stem(self.ylabel), self.y_error)
        rec.cut |= bool(self.cuts)


@dataclass
class _Record:
    """What a figure plots (for ``<stem>.data.csv``) and what its bars are."""

    rows: list[dict] = field(default_factory=list)
    bars: dict[str, str] = field(default_factory=dict)  # quantity → what its bars are
    cut: bool = False

    def bars_text(self) -> str:
        text = "; ".join(f"{q}: {what}" for q, what in self.bars.items())
        if text and self.cut:
            text += " (a triangle instead of a cap: the bar is cut at the end of the quantity's range)"
        return text


def _styled(plot):
    """Draw under the package's style (``STYLE``: fonts, grid, spines)."""
    import functools

    @functools.wraps(plot)
    def wrapper(*args, **kwargs):
        with _plt().rc_context(STYLE):
            return plot(*args, **kwargs)
    return wrapper


def _figure(n_panels: int, title: str, height: float = PANEL_HEIGHT, width: float = PANEL_WIDTH):
    fig, axes = _plt().subplots(1, n_panels, figsize=(width * n_panels, height), squeeze=False)
    fig.suptitle(title)
    fig._sameloss = _Record()
    return fig, list(axes[0])


def _letters(n: int) -> list[str | None]:
    return [chr(ord("a") + i) for i in range(n)] if n > 1 else [None]


# ---- legends -----------------------------------------------------------------------------------
def _entry_marker(color, marker, filled=True, line=False):
    from matplotlib.lines import Line2D
    return Line2D([], [], color=color, marker=marker, markersize=5, linestyle="-" if line else "none",
                  markerfacecolor=color if filled else "white", linewidth=1.1)


def _entry_line(color, style):
    from matplotlib.lines import Line2D
    return Line2D([], [], color=color, linestyle=style, linewidth=1.0)


def _entry_bar():
    from matplotlib.lines import Line2D
    return Line2D([], [], color="0.25", marker="|", markersize=9, markeredgewidth=1.1, linestyle="none")


def _ref_entries(panels: list[_Panel]) -> list[tuple]:
    seen: dict[str, tuple] = {}
    drawn = {r.label for p in panels for r in p.refs if r.label not in p.beyond}
    for p in panels:
        for r in p.refs:
            label = r.label if r.label in drawn else f"{r.label}: beyond the axes"
            seen.setdefault(r.label, (_entry_line(r.color, r.style), label))
        for f in p.fits:
            seen.setdefault(f.label, (_entry_line("0.2", "-"), f.label))
    return list(seen.values())


def _band_entries(panels: list[_Panel]) -> list[tuple]:
    from matplotlib.patches import Patch

    seen: dict[str, tuple] = {}
    for p in panels:
        for b in p.bands:
            seen.setdefault(b.label, (Patch(color=b.color, alpha=b.alpha, linewidth=0), b.label))
    return list(seen.values())


def _bar_entries(fig) -> list[tuple]:
    rec: _Record = fig._sameloss
    out = [(_entry_bar(), f"{q}: {what}") for q, what in rec.bars.items()]
    if rec.cut:
        out.append((_entry_marker("0.25", "v"), "bar cut at the end of the quantity's range"))
    return out


def _fit_labels(fig) -> None:
    """Axis labels stay legible at a panel's size: the x labels of side-by-side panels never
    run into each other (a label wider than its panel, where it would meet its neighbour's,
    is broken into lines that fit the panel: the dot and forest plots, whose row names take
    the figure's left), and a y label taller than its panel (into the title) is broken into
    lines that fit its height."""
    gap = 0.08 * fig.dpi  # pixels: 0.08 in between two labels, at least
    for _ in range(3):  # the layout changes once labels take two lines
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        xs = [(ax, ax.xaxis.label, ax.xaxis.label.get_window_extent(renderer)) for ax in fig.axes]
        too_long = []  # (label, its length, the room it has), lengths in pixels
        crowded = set()
        for (ax_a, a, box_a), (ax_b, b, box_b) in zip(xs, xs[1:]):
            if a.get_text() and b.get_text() and box_a.x1 + gap > box_b.x0:
                crowded |= {ax_a, ax_b}
        for ax, label, box in xs:
            room = ax.get_window_extent(renderer).width
            if ax in crowded and box.width > room:
                too_long.append((label, box.width, room))
        for ax in fig.axes:
            label, room = ax.yaxis.label, ax.get_window_extent(renderer).height
            box = label.get_window_extent(renderer)
            if label.get_text() and box.height > room:
                too_long.append((label, box.height, room))
        if not too_long:
            return
        for label, length, room in too_long:
            label.set_text(_balanced_lines(label.get_text(), length, room))
        fig.tight_layout()


def _balanced_lines(text: str, length: float, room: float) -> str:
    """``text`` (drawn ``length`` long, its longest line) in the fewest lines of about equal
    length that fit ``room``."""
    import textwrap

    per_char = length / max(len(line) for line in text.split("\n"))
    text = " ".join(text.split())
    n = max(2, math.ceil(per_char * len(text) / room))
    for width in range(math.ceil(len(text) / n), len(text) + 1):
        lines = textwrap.wrap(text, width, break_on_hyphens=False)  # joined by a space again: whole words
        if len(lines) <= n:
            return "\n".join(lines)
    return text


def _legends_below(fig, blocks: list[tuple[str | None, list[tuple]]]) -> None:
    """Legends below the panels (outside every axes: they cover no point): one per block,
    side by side while they fit the figure's width, the next row below; each block's
    columns fit the width."""
    fig.tight_layout()
    _fit_labels(fig)
    blocks = [(title, entries) for title, entries in blocks if entries]
    if not blocks:
        return
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    inverse = fig.transFigure.inverted()
    top = min(ax.get_tightbbox(renderer).transformed(inverse).y0 for ax in fig.axes) - 0.01
    width_chars = fig.get_figwidth() / (0.0081 * LEGEND_FONT)  # characters of legend text across the figure
    legends = []
    for title, entries in blocks:
        longest = max(len(label) for _, label in entries) + 5
        ncol = max(1, min(len(entries), int(width_chars // longest), 4))
        legend = fig.legend([h for h, _ in entries], [label for _, label in entries], loc="upper left",
                            bbox_to_anchor=(0.0, top), ncol=ncol, title=title, frameon=False, fontsize=LEGEND_FONT,
                            title_fontsize=LEGEND_FONT, handletextpad=0.5, columnspacing=1.5, alignment="left")
        box = legend.get_window_extent(renderer).transformed(inverse)
        legends.append((legend, box.width, box.height))
    gap = 0.02
    rows: list[list[tuple]] = [[]]
    for item in legends:
        if rows[-1] and sum(w for _, w, _ in rows[-1]) + gap * len(rows[-1]) + item[1] > 1.0:
            rows.append([])
        rows[-1].append(item)
    y = top
    for row in rows:
        x = 0.5 - (sum(w for _, w, _ in row) + gap * (len(row) - 1)) / 2
        for legend, w, _ in row:
            legend.set_bbox_to_anchor((x, y), transform=fig.transFigure)
            x += w + gap
        y -= max(h for _, _, h in row) + 0.005


# ---- the kinds of figure -------------------------------------------------------------------------
@dataclass(frozen=True)
class Panel:
    """A panel of a series or dots plot: the quantity ``key`` (of the rows), its axis
    ``label``, a log axis (default: for the KL), reference lines."""

    key: str
    label: str
    log: bool | None = None
    refs: tuple[Ref, ...] = ()
    bands: tuple[Band, ...] = ()  # shaded stretches (series plots)

    @property
    def is_log(self) -> bool:
        return self.key in ("kl", "log_kl") if self.log is None else self.log


def _series_style(i: int, name: str, styles: dict[str, dict]) -> dict:
    return {"color": f"C{i % 10}", "marker": MARKERS[i % len(MARKERS)], "filled": True, **styles.get(name, {})}


@_styled
def series_plot(series: dict[str, list[dict]], x: str, panels: Sequence[Panel], title: str, *,
                xlabel: str | None = None, logx: bool = False, x_refs: Sequence[Ref] = (),
                errors: dict[str, str] | None = None, styles: dict[str, dict] | None = None):
    """One row of panels, ``panels[i].key`` against ``x``, one line per series (a name and
    its rows, in ``x`` order). ``x_refs``: vertical reference lines in every panel (e.g.
    where the loss saturates). ``styles[name]``: ``color``, ``marker``, ``filled`` of a series
    (default: the n-th colour and marker)."""
    fig, axes = _figure(len(panels), title)
    styles = styles or {}
    drawn_in: dict[str, list[str | None]] = {}
    built = []
    letters = _letters(len(panels))
    for ax, panel, letter in zip(axes, panels, letters):
        pnl = _Panel(ax, len(built), x, panel.key, xlabel or x, panel.label, xlog=logx, ylog=panel.is_log,
                     integer_x=x == "step", errors=errors)
        for i, (name, rows) in enumerate(series.items()):
            style = _series_style(i, name, styles)
            rows = [r for r in rows if math.isfinite(_value(r, panel.key)) and math.isfinite(_value(r, x))]
            if not rows:
                continue
            ys = [_value(r, panel.key) for r in rows]
            low, high = _ends(ys, [_error(r, panel.key) for r in rows])
            xs = [_value(r, x) for r in rows]
            pnl.add(_Points(name, xs, ys, [None] * len(xs), [None] * len(xs), low, high, style["color"],
                            style["marker"], style["filled"], line=True))
            drawn_in.setdefault(name, []).append(letter)
        for r in (*panel.refs, *x_refs):
            pnl.ref(r)
        for b in panel.bands:
            pnl.band(b)
        built.append(pnl)
    for pnl, letter in zip(built, letters):
        pnl.finish(fig._sameloss, letter)
    entries = []
    for i, name in enumerate(series):
        if name not in drawn_in:
            continue
        style = _series_style(i, name, styles)
        where = drawn_in[name]
        label = name if len(where) == len(panels) else f"{name} (panel {', '.join(where)})"
        entries.append((_entry_marker(style["color"], style["marker"], style["filled"], line=True), label))
    _legends_below(fig, [(None, entries), (None, _ref_entries(built) + _band_entries(built)),
                         ("error bars", _bar_entries(fig))])
    return fig


@dataclass(frozen=True)
class XY:
    """A scatter panel: ``y`` against ``x`` (row keys), their axis labels, log axes (default:
    for the KL), reference lines, and an optional fitted line: ``"ols"`` (least squares over
    the panel's points, its slope and 95 % t interval in the legend) or a ``Fit``."""

    x: str
    xlabel: str
    y: str
    ylabel: str
    xlog: bool | None = None
    ylog: bool | None = None
    refs: tuple[Ref, ...] = ()
    fit: Fit | str | None = None


def _size_colours(values: list[float]) -> dict[float, object]:
    """Model sizes → colours of a sequential map (small = light, large = dark), as the
    paper colours by size."""
    from matplotlib import colormaps

    sizes = sorted(set(values))
    cmap = colormaps["viridis"]
    if len(sizes) == 1:
        return {sizes[0]: cmap(0.35)}
    return {v: cmap(0.85 - 0.75 * i / (len(sizes) - 1)) for i, v in enumerate(sizes)}


@_styled
def scatter_plot(rows: list[dict], panels: Sequence[XY], title: str, *, colour_by: str | None = "parameters",
                 colour_label: Callable[[float], str] | None = None, marker_by: Callable[[dict], str] | None = None,
                 hollow: Callable[[dict], bool] | None = None, hollow_label: str = "",
                 join_by: Callable[[dict], str] | None = None, errors: dict[str, str] | None = None):
    """Panels of ``y`` against ``x``, one marker per row: colour by ``row[colour_by]`` (model
    size; one legend entry per size), marker by ``marker_by(row)`` (the recipe), hollow where
    ``hollow(row)`` (``hollow_label`` says what hollow means); rows with the same
    ``join_by(row)`` (checkpoints of one run) are joined in step order, an arrow at the last."""
    fig, axes = _figure(len(panels), title, height=PANEL_HEIGHT + 0.2)
    sizes = [_value(r, colour_by) for r in rows] if colour_by else []
    colours = _size_colours([s for s in sizes if math.isfinite(s)]) if colour_by else {}
    recipes = list(dict.fromkeys(marker_by(r) for r in rows)) if marker_by else []
    markers = {name: MARKERS[i % len(MARKERS)] for i, name in enumerate(recipes)}

    def style(r):
        c = colours.get(_value(r, colour_by), "C0") if colour_by else "C0"
        return c, markers.get(marker_by(r), "o") if marker_by else "o", not (hollow and hollow(r))

    built, used_hollow = [], False
    letters = _letters(len(panels))
    for ax, xy in zip(axes, panels):
        xlog = xy.x in ("kl", "log_kl") if xy.xlog is None else xy.xlog
        ylog = xy.y in ("kl", "log_kl") if xy.ylog is None else xy.ylog
        pnl = _Panel(ax, len(built), xy.x, xy.y, xy.xlabel, xy.ylabel, xlog=xlog, ylog=ylog, errors=errors)
        groups: dict[tuple, list[dict]] = {}
        for r in rows:
            if math.isfinite(_value(r, xy.x)) and math.isfinite(_value(r, xy.y)):
                groups.setdefault(style(r), []).append(r)
        for (color, marker, filled), members in groups.items():
            used_hollow |= not filled
            xs, ys = [_value(r, xy.x) for r in members], [_value(r, xy.y) for r in members]
            xl, xh = _ends(xs, [_error(r, xy.x) for r in members])
            yl, yh = _ends(ys, [_error(r, xy.y) for r in members])
            series = marker_by(members[0]) if marker_by else "models"
            if colour_by:
                series += f", {_size_text(_value(members[0], colour_by), colour_label)}"
            pnl.add(_Points(series, xs, ys, xl, xh, yl, yh, color, marker, filled))
        if join_by:
            _join(ax, rows, join_by, xy, style)
        for r in xy.refs:
            pnl.ref(r)
        fit = _ols_fit(pnl) if xy.fit == "ols" else xy.fit
        if fit is not None:
            pnl.fits.append(fit)
        built.append(pnl)
    for pnl, letter in zip(built, letters):
        pnl.finish(fig._sameloss, letter)
    size_entries = [(_entry_marker(c, "o"), _size_text(v, colour_label)) for v, c in colours.items()]
    recipe_entries = [(_entry_marker("0.4", markers[n]), n) for n in recipes]
    keys = []
    if used_hollow and hollow_label:
        keys.append((_entry_marker("0.4", "o", filled=False), f"hollow: {hollow_label}"))
    if join_by and any(len(v) > 1 for v in _runs(rows, join_by).values()):
        keys.append((_entry_line("0.5", "-"), "line: one run's checkpoints, arrow at the last"))
    _legends_below(fig, [(f"colour: model size ({colour_by})" if colour_by else None, size_entries),
                         ("marker: recipe" if marker_by else None, recipe_entries),
                         (None, keys + _ref_entries(built)), ("error bars", _bar_entries(fig))])
    return fig


def _size_text(v: float, colour_label: Callable[[float], str] | None) -> str:
    if colour_label:
        return colour_label(v)
    return f"{_number(v)} parameters" if math.isfinite(v) else "size unknown"


def _runs(rows: list[dict], join_by) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for r in rows:
        out.setdefault(join_by(r), []).append(r)
    return out


def _join(ax, rows, join_by, xy: XY, style) -> None:
    """A thin line through one run's checkpoints in step order, an arrow onto the last."""
    for members in _runs(rows, join_by).values():
        pts = sorted((r for r in members if math.isfinite(_value(r, xy.x)) and math.isfinite(_value(r, xy.y))),
                     key=lambda r: _value(r, "step"))
        if len(pts) < 2:
            continue
        color = style(pts[0])[0]
        xs, ys = [_value(r, xy.x) for r in pts], [_value(r, xy.y) for r in pts]
        ax.plot(xs, ys, color=color, linewidth=0.7, alpha=0.6, zorder=1.5)
        ax.annotate("", xy=(xs[-1], ys[-1]), xytext=(xs[-2], ys[-2]),
                    arrowprops={"arrowstyle": "-|>", "color": color, "lw": 0.7, "alpha": 0.8,
                                "shrinkA": 0, "shrinkB": 4})


def _ols_fit(pnl: _Panel) -> Fit | None:
    from .stats import ols_slope

    xs = [x for p in pnl.points for x in p.xs]
    ys = [y for p in pnl.points for y in p.ys]
    iv = ols_slope(xs, ys)
    if not math.isfinite(iv.estimate):
        return None
    intercept = sum(ys) / len(ys) - iv.estimate * sum(xs) / len(xs)
    return Fit(iv.estimate, intercept, f"least squares: slope {iv.estimate:.3g} [{iv.low:.3g}, {iv.high:.3g}] "
                                       f"(95 % t, {len(xs)} points)")


@_styled
def dots_plot(rows: list[dict], label: str, panels: Sequence[Panel], title: str, *,
              errors: dict[str, str] | None = None, missing: dict[str, str] | None = None):
    """One row per ``row[label]`` (top to bottom), one panel per quantity: a dot with its
    interval (never a bar). ``missing[key]`` is written where a row has no value of ``key``
    (e.g. "no parameters: no trace"); a value at or below 0 on a log axis is named at the
    axis's start."""
    names = [str(r[label]) for r in rows]
    fig, axes = _figure(len(panels), title, height=0.32 * len(rows) + 1.3, width=3.0)
    missing = missing or {}
    built = []
    letters = _letters(len(panels))
    for k, (ax, panel) in enumerate(zip(axes, panels)):
        pnl = _Panel(ax, k, panel.key, None, panel.label, "", xlog=panel.is_log, categories=names, errors=errors)
        xs = [_value(r, panel.key) for r in rows]
        low, high = _ends(xs, [_error(r, panel.key) for r in rows])
        n = len(rows)
        pnl.add(_Points(_stem(panel.label), xs, [float(i) for i in range(n)], low, high, [None] * n, [None] * n,
                        "C0", "o"))
        pnl.texts = [(i, missing.get(panel.key, "not measured")) for i, v in enumerate(xs) if not math.isfinite(v)]
        for r in panel.refs:  # on the value axis (x here)
            pnl.ref(dataclasses.replace(r, axis="x"))
        built.append(pnl)
        if k:
            ax.tick_params(labelleft=False)
    for pnl, letter in zip(built, letters):
        pnl.finish(fig._sameloss, letter)
        for i, text in pnl.texts:
            ax = pnl.ax
            ax.annotate(text, (ax.get_xlim()[0], i), xytext=(3, 0), textcoords="offset points", va="center",
                        fontsize=8, color="0.3", annotation_clip=False)
            fig._sameloss.rows.append({"panel": pnl.index, "kind": "text", "y": names[i], "note": text})
    _legends_below(fig, [(None, _ref_entries(built)), ("error bars", _bar_entries(fig))])
    return fig


@dataclass(frozen=True)
class Forest:
    """A forest-plot panel: the paired difference ``key`` of each row with its interval
    (``low``, ``high``; default ``<key>_low`` / ``<key>_high``) and, where given, its
    minimum detectable effect ``mde`` (default ``<key>_mde``), marked at ± MDE; ``interval``
    says what the interval is ("95 % t interval over 22 seeds")."""

    key: str
    label: str
    interval: str = "95 % interval"
    low: str | None = None
    high: str | None = None
    mde: str | None = None
    refs: tuple[Ref, ...] = ()  # more vertical lines, e.g. an equivalence margin ±δ


@_styled
def forest_plot(rows: list[dict], label: str, panels: Sequence[Forest], title: str):
    """Paired differences, one row per ``row[label]`` (top to bottom): the estimate as a dot,
    its interval as a line, a solid line at 0 (no difference) and grey ticks at ± the row's
    MDE (80 % power): an interval between the ticks is "no effect larger than the MDE", an
    interval clear of 0 a detected effect."""
    names = [str(r[label]) for r in rows]
    fig, axes = _figure(len(panels), title, height=0.32 * len(rows) + 1.3, width=3.4)
    built = []
    letters = _letters(len(panels))
    any_mde = False
    for k, (ax, f) in enumerate(zip(axes, panels)):
        pnl = _Panel(ax, k, None, None, f.label, "", categories=names, x_error=f.interval)
        pnl.x = f"difference of {f.key}"
        est = [_float(r.get(f.key)) for r in rows]
        low = [_float(r.get(f.low or f"{f.key}_low")) for r in rows]
        high = [_float(r.get(f.high or f"{f.key}_high")) for r in rows]
        n = len(rows)
        pnl.add(_Points("difference", est, [float(i) for i in range(n)],
                        [v if math.isfinite(v) else None for v in low], [v if math.isfinite(v) else None for v in high],
                        [None] * n, [None] * n, "C0", "o"))
        pnl.ref(Ref(0.0, "0: no difference", axis="x", color="0.2", style="-"))
        for r in f.refs:
            pnl.ref(dataclasses.replace(r, axis="x"))
        mdes = [_float(r.get(f.mde or f"{f.key}_mde")) for r in rows]
        for i, m in enumerate(mdes):
            if math.isfinite(m) and m > 0 and math.isfinite(est[i]):
                any_mde = True
                pnl.points.append(_Points("MDE", [-m, m], [float(i), float(i)], [None, None], [None, None],
                                          [None, None], [None, None], "0.45", "|", size=9))
        built.append(pnl)
        if k:
            ax.tick_params(labelleft=False)
    for pnl, letter in zip(built, letters):
        pnl.finish(fig._sameloss, letter)
        for line in pnl.ax.get_lines():
            if line.get_gid() == "point" and line.get_marker() == "|":
                line.set_gid("mde")
    for row in fig._sameloss.rows:
        if row.get("series") == "MDE":
            row["kind"] = "mde"
    keys = [(_entry_marker("C0", "o"), "estimate")]
    if any_mde:
        keys.append((_entry_marker("0.45", "|"), "± MDE (80 % power)"))
    _legends_below(fig, [(None, keys + _ref_entries(built)), ("error bars", _bar_entries(fig))])
    return fig


def _float(v) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


@_styled
def curves_plot(runs: dict[str, list[dict]], title: str, *, subsets: dict[str, int] | None = None):
    """Training curves of runs (a name and its ``metrics.jsonl`` records): train loss (the
    optimum, the entropy of the true conditionals, dashed), the exact KL on a log axis
    (a corpus run: the held-out cross-entropy) ± std over the held-out subsets, and the
    learning rate, against step; one line per run. ``subsets[name]``: the run's
    ``eval.n_subsets``."""
    train = {n: [r for r in recs if _finite(r.get("train_loss"))] for n, recs in runs.items()}
    evals = {n: [dict(r["eval"], step=r["step"]) for r in recs if isinstance(r.get("eval"), dict)]
             for n, recs in runs.items()}
    exact = {n: [e for e in ev if _finite(e.get("kl"))] for n, ev in evals.items()}
    corpus = {n: [e for e in ev if not _finite(e.get("kl")) and _finite(e.get("loss"))] for n, ev in evals.items()}
    panels: list[tuple[str, str, dict]] = [("train_loss", "train loss (nats)", train)]
    if any(exact.values()):
        panels.append(("kl", "exact KL to the true conditionals (nats)", exact))
    if any(corpus.values()):
        panels.append(("loss", "held-out cross-entropy (nats)", corpus))
    panels.append(("lr", "learning rate", {n: [r for r in recs if _finite(r.get("lr"))] for n, recs in runs.items()}))
    counts = set((subsets or {}).values())
    n_subsets = f"{counts.pop()} " if len(counts) == 1 else ""
    errors = {"kl": f"± std over {n_subsets}held-out subsets", "loss": f"± std over {n_subsets}held-out subsets"}
    fig, axes = _figure(len(panels), title)
    letters = _letters(len(panels))
    built, drawn_in = [], {}
    steps = [float(r["step"]) for recs in runs.values() for r in recs]
    for ax, (key, ylabel, data), letter in zip(axes, panels, letters):
        pnl = _Panel(ax, len(built), "step", key, "step", ylabel, ylog=key == "kl", integer_x=True, errors=errors)
        for i, name in enumerate(runs):
            recs = data.get(name) or []
            if not recs:
                continue
            xs = [float(r["step"]) for r in recs]
            ys = [_value(r, key) for r in recs]
            low, high = _ends(ys, [_error(r, key) for r in recs])
            marker = MARKERS[i % len(MARKERS)] if key in ("kl", "loss") else "None"
            pnl.add(_Points(name, xs, ys, [None] * len(xs), [None] * len(xs), low, high, f"C{i % 10}",
                            marker, line=True, size=4.0))
            drawn_in.setdefault(name, []).append(letter)
        pnl.span["x"] = [min(steps), max(steps)] if steps else []  # one step range in every panel
        if key == "train_loss":
            for value, label in _optima(exact):  # the optimum is always shown where a loss is
                pnl.ref(Ref(value, label, in_extent=True))
        built.append(pnl)
    for pnl, letter in zip(built, letters):
        pnl.finish(fig._sameloss, letter)
    entries = [(_entry_marker(f"C{i % 10}", MARKERS[i % len(MARKERS)], line=True), name)
               for i, name in enumerate(runs) if name in drawn_in]
    _legends_below(fig, [("run", entries), (None, _ref_entries(built)), ("error bars", _bar_entries(fig))])
    return fig


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _optima(exact: dict[str, list[dict]]) -> list[tuple[float, str]]:
    """The optimum of each language among the runs (the entropy of its true conditionals at
    the run's masking, as its evaluation logs it): one dashed line per distinct value."""
    found: dict[float, list[str]] = {}
    for name, evs in exact.items():
        ent = [e["entropy"] for e in evs if _finite(e.get("entropy"))]
        if ent:
            found.setdefault(round(ent[-1], 9), []).append(name)
    if len(found) == 1:
        (value,) = found
        return [(value, f"optimum: entropy {value:.4f} nats")]
    return [(v, f"optimum of {', '.join(names)}: entropy {v:.4f} nats") for v, names in found.items()]


# ---- writing ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SavedFigure:
    """The files ``save_figure`` wrote (names in the folder) and what the figure's bars are."""

    files: tuple[str, ...]  # one per format, the first is the one a report embeds
    data: str  # the CSV of the plotted numbers
    bars: str  # "<quantity> ± …; …" ("" when the figure draws no error bar)


def figure_bytes(fig, fmt: str) -> bytes:
    """The figure as a PNG (200 dpi), PDF or SVG, tagged as written by sameloss."""
    from .. import __version__

    tag = f"{TAG} (sameloss {__version__})"
    metadata = {"png": {"Software": tag}, "pdf": {"Creator": tag}, "svg": {"Creator": tag}}[fmt]
    buffer = io.BytesIO()
    fig.savefig(buffer, format=fmt, dpi=DPI, bbox_inches="tight", metadata=metadata)
    return buffer.getvalue()


def figure_data(fig) -> str:
    """The plotted numbers of a figure drawn here, as CSV text (``DATA_COLUMNS``)."""
    out = io.StringIO(newline="")
    writer = csv.DictWriter(out, fieldnames=DATA_COLUMNS)
    writer.writeheader()
    for row in fig._sameloss.rows:
        writer.writerow({k: _csv(row.get(k)) for k in DATA_COLUMNS})
    return out.getvalue()


def _csv(v):
    if v is None:
        return ""
    if isinstance(v, float):  # numpy's floats too (repr: the shortest exact text)
        return repr(float(v))
    return v


def data_path(path: str | Path) -> Path:
    """The data file beside a figure: ``<stem>.data.csv``."""
    path = Path(path)
    return path.with_name(f"{path.stem}.data.csv")


def is_sameloss_figure(path: str | Path) -> bool:
    """Whether ``path`` is an image that sameloss wrote (its metadata holds ``TAG``)."""
    try:
        with open(path, "rb") as f:
            return TAG.encode() in f.read()
    except OSError:
        return False


def is_sameloss_data(path: str | Path) -> bool:
    """Whether ``path`` is a figure's data file that sameloss wrote (its header)."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.readline().strip() == ",".join(DATA_COLUMNS)
    except (OSError, UnicodeDecodeError):
        return False


def save_figure(fig, folder: str | Path, stem: str, formats: Sequence[str] = ("png",)) -> SavedFigure:
    """Write ``fig`` as ``folder/<stem>.<format>`` for each format and ``<stem>.data.csv``,
    each atomically (a full disk or a read-only folder: one ``UserError`` line, nothing
    half-written), and close it."""
    folder = Path(folder)
    try:
        blobs = [(f"{stem}.{fmt}", figure_bytes(fig, fmt)) for fmt in formats]
        data = figure_data(fig)
        bars = fig._sameloss.bars_text()
    finally:
        _plt().close(fig)
    for name, blob in blobs:
        write_file(folder / name, blob)
    data_name = f"{stem}.data.csv"
    write_file(folder / data_name, data.encode())
    return SavedFigure(tuple(name for name, _ in blobs), data_name, bars)


def write_file(path: Path, data: bytes) -> None:
    """The one writer of figure files: atomic, a full disk or a read-only folder one
    ``UserError`` line naming ``path``; in an experiment folder, noted in its marker first
    (``folder.record_output``: ``--fresh`` then knows the file is sameloss's, also when a
    kill comes between the two)."""
    from .. import files
    from .folder import record_output

    path = Path(path)
    with files.storage_errors(path):
        record_output(path)
        files.atomic_write_bytes(path, data)


def majority_ref(rows: list[dict], task: str) -> tuple[Ref, ...]:
    """A dotted line at the majority-class rate of ``task`` (``<task>_majority`` of the
    rows): the accuracy of a constant guess, the floor a probe must beat."""
    rates = [_float(r.get(f"{task}_majority")) for r in rows]
    rates = [v for v in rates if math.isfinite(v)]
    if not rates:
        return ()
    return (Ref(100 * rates[0], "majority class (a constant guess)", color="0.55", style=":", in_extent=True),)


__all__ = ["Band", "DPI", "FORMATS", "Fit", "Forest", "Panel", "Quantity", "Ref", "SavedFigure", "TRACE_FISHER",
           "TRACE_HUTCHINSON", "TRACE_HUTCHPP", "XY", "curves_plot", "data_path", "describe_error", "dots_plot",
           "error_labels", "figure_bytes", "figure_data", "forest_plot", "is_sameloss_data", "is_sameloss_figure", "log_limits",
           "majority_ref", "parse_formats", "quantity", "save_figure", "scatter_plot", "series_plot", "with_unit",
           "write_file"]
