"""One panel of a figure: its points, reference lines, fits and shaded stretches, collected
first; ``finish`` then sets the limits from everything drawn (inside the quantities'
ranges), cuts bars at those ranges, draws, and records every number for the data file
(``Record``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .axes import _linear_limits, _number, _set_log_axis
from .quantities import describe_error, quantity, with_unit
from .style import NOTE_FONT

CUT_MARKERS = {"y_low": "v", "y_high": "^", "x_low": "<", "x_high": ">"}
LANE = 0.025  # of a panel's height: one series' strip (``Band.series``) along its bottom
DODGE = 3.2  # points: coincident markers are set this far apart, side by side


@dataclass
class _Points:
    """Points of one series in one panel, in shown units; ``*_low`` / ``*_high`` the ends
    of their bars (None: no bar on that side). ``line``: joined in order (``style``: its
    dash pattern; ``markevery``: which points carry the marker, None = all)."""

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
    size: float = 4.0
    style: str = "-"
    markevery: object = None
    width: float = 1.0  # of its line (an earlier series drawn wider shows around a later one on top of it)
    dodge: list[float] = field(default_factory=list)  # points of horizontal offset per point (``finish``)


def marks_along(n: int, index: int, count: int, per_line: int = 6) -> list[int] | None:
    """Which of a line's ``n`` points carry its marker: all of a short line, else about
    ``per_line`` spread along it, the ``index``-th of ``count`` lines' shifted so that lines
    which coincide still show every line's marker (one marker a point hides the others)."""
    if n <= per_line * 2:
        return None
    step = n / per_line
    shift = step * index / max(1, count)
    return sorted({min(n - 1, int(shift + k * step)) for k in range(per_line)})


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
    Drawn as a filled polygon spanning the panel, never as a bar — or, with ``series``, as a
    thin strip of that series' colour along the panel's bottom, one lane per series (a
    stretch that belongs to one line: each fork's own window, not their union)."""

    low: float
    high: float
    label: str
    axis: str = "x"
    color: object = "C2"
    alpha: float = 0.15
    series: str | None = None


@dataclass
class Record:
    """What a figure plots (for ``<stem>.data.csv``), what its bars are, and what its legend
    must explain (the bars' directions, the cut markers drawn, dodged points)."""

    rows: list[dict] = field(default_factory=list)
    bars: dict[str, str] = field(default_factory=dict)  # quantity → what its bars are
    bar_axes: dict[str, set] = field(default_factory=dict)  # quantity → {"x", "y"}: how its bars run
    cut_markers: set = field(default_factory=set)
    dodged: bool = False

    @property
    def cut(self) -> bool:
        return bool(self.cut_markers)

    def bars_text(self) -> str:
        text = "; ".join(f"{q}: {what}" for q, what in self.bars.items())
        if text and self.cut:
            text += " (a triangle instead of a cap: the bar is cut at the end of the quantity's range)"
        return text


def _span(values: list[float], log: bool) -> float:
    if log:
        values = [v for v in values if v > 0]
        return math.log10(max(values) / min(values)) if values else 0.0
    return max(values) - min(values)


def _ends(values: list[float], errors: list[float | None]) -> tuple[list, list]:
    low = [v - e if e is not None and math.isfinite(v) else None for v, e in zip(values, errors)]
    high = [v + e if e is not None and math.isfinite(v) else None for v, e in zip(values, errors)]
    return low, high


_FIELDS = ("xs", "ys", "x_low", "x_high", "y_low", "y_high")


@dataclass(frozen=True)
class _AxisSettings:
    """How a panel's axes are drawn: log axes, integer ticks on x (steps), ``categories``
    as the rows of a categorical y axis (dots and forest plots; ``ticks``: as the ticks show
    them, broken into lines, where the data file keeps ``categories``), what its error bars
    are (``errors``: quantity → words, ``describe_error``; ``x_error`` / ``y_error``: the
    words themselves), and whether coincident markers are set side by side (scatter plots)."""

    xlog: bool = False
    ylog: bool = False
    integer_x: bool = False
    categories: list[str] | None = None
    ticks: list[str] | None = None
    errors: dict[str, str] | None = None
    x_error: str | None = None
    y_error: str | None = None
    dodge: bool = False


class _Panel:
    """One axes: points, reference lines and fits collected first, then ``finish`` sets the
    limits from everything drawn (inside the quantities' ranges), cuts bars at those
    ranges, draws, and records every number for the data file."""

    def __init__(self, ax, index: int, x: str | None, y: str | None, xlabel: str, ylabel: str,
                 settings: _AxisSettings = _AxisSettings()):
        self.ax, self.index, self.x, self.y = ax, index, x, y
        self.axes = settings
        self.xq, self.yq = quantity(x), quantity(y)
        self.xlabel = with_unit(xlabel, x)
        self.ylabel = with_unit(ylabel, y) if settings.categories is None else ylabel
        self.letter: str | None = None
        self.points: list[_Points] = []
        self.refs: list[Ref] = []
        self.fits: list[Fit] = []
        self.bands: list[Band] = []
        self.texts: list[tuple[float, float, str]] = []  # (x, y, text) written beside a point (x: None = the axis's start)
        # (series, x, y, colour) of values <= 0 on a log x axis: named at its start
        self.offaxis: list[tuple[str, float, float, object]] = []
        self.drew_x_bars = self.drew_y_bars = False
        self.beyond: set[str] = set()  # reference lines beyond the axis's limits (not drawn)
        self.span: dict[str, list[float]] = {"x": [], "y": []}  # values the limits must include besides the data
        self.lanes: dict[str, object] = {}  # series → colour of its strip (``Band.series``)

    def _log(self, axis: str) -> bool:
        return self.axes.xlog if axis == "x" else self.axes.ylog

    def _error(self, axis: str) -> str | None:
        """What the bars along ``axis`` are: the words given, else the quantity's (``describe_error``)."""
        given, key = (self.axes.x_error, self.x) if axis == "x" else (self.axes.y_error, self.y)
        return given or (describe_error(key, self.axes.errors) if key else None)

    def add(self, p: _Points) -> None:
        if self.axes.xlog:  # a value <= 0 cannot be drawn on a log axis: named at the axis's start instead
            keep = [i for i, x in enumerate(p.xs) if not (math.isfinite(x) and x <= 0)]
            self.offaxis += [(p.series, p.xs[i], p.ys[i], p.color) for i in range(len(p.xs)) if i not in keep]
            for name in _FIELDS:
                setattr(p, name, [getattr(p, name)[i] for i in keep])
        ok = [i for i, (x, y) in enumerate(zip(p.xs, p.ys)) if math.isfinite(x) and math.isfinite(y)]
        for name in _FIELDS:
            setattr(p, name, [getattr(p, name)[i] for i in ok])
        if p.xs:
            self.points.append(p)

    def ref(self, r: Ref) -> None:
        if math.isfinite(r.value):
            self.refs.append(r)

    def band(self, b: Band, color: object = None) -> None:
        if math.isfinite(b.low) and math.isfinite(b.high):
            if b.series is not None:
                self.lanes.setdefault(b.series, color if color is not None else b.color)
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
        log = self._log(axis)
        out += [v for b in self.bands if b.axis == axis for v in (b.low, b.high) if not (log and v <= 0)]
        for r in self.refs:
            if r.axis != axis or r.in_extent is False or (log and r.value <= 0):
                continue
            if r.in_extent or not out or _span([*out, r.value], log) <= 1.5 * _span(out, log):
                out.append(r.value)
        return out

    def _limits(self, axis: str) -> tuple[float, float] | None:
        ax, q = self.ax, (self.xq if axis == "x" else self.yq)
        log = self._log(axis)
        if axis == "y" and self.axes.categories is not None:
            n = len(self.axes.categories)
            ax.set_ylim(n - 0.5, -0.5)  # the first row on top
            ax.set_yticks(range(n), self.axes.ticks or self.axes.categories)
            return None
        extent = self._extent(axis)
        if log:
            positive = [v for v in extent if v > 0]
            if not positive:
                return None
            lo, hi = _set_log_axis(ax, axis, min(positive), max(positive))
            if axis == "y" and self.lanes:  # room under the data for the series' strips
                share = LANE * len(self.lanes) + 0.01
                lo = lo / (hi / lo) ** (share / (1 - share))
                ax.set_ylim(lo, hi)
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
        if axis == "y" and self.lanes:  # room under the data for the series' strips
            share = LANE * len(self.lanes) + 0.01
            lo = max(lo - (hi - lo) * share / (1 - share), q.lo)  # (never past the quantity's range)
        (ax.set_xlim if axis == "x" else ax.set_ylim)(lo, hi)
        if axis == "x" and self.axes.integer_x:
            from matplotlib.ticker import MaxNLocator
            ax.xaxis.set_major_locator(MaxNLocator(integer=True, nbins=5, steps=[1, 2, 2.5, 5, 10]))
        return lo, hi

    def _dodge(self) -> None:
        """Markers that would cover each other (closer than a marker's width in both
        directions, lines not joining them) are set side by side, ``DODGE`` points apart;
        the data file keeps their true values."""
        if not self.axes.dodge:
            return
        fig = self.ax.figure
        to_px = self.ax.transData.transform
        px_per_pt = fig.dpi / 72
        spots = []  # (display x, display y, series index, point index)
        for s, p in enumerate(self.points):
            p.dodge = [0.0] * len(p.xs)
            if p.line:
                continue
            for i, xy in enumerate(zip(p.xs, p.ys)):
                dx, dy = to_px(xy)
                spots.append((dx, dy, s, i))
        spots.sort()
        used = [False] * len(spots)
        for a, (x0, y0, _, _) in enumerate(spots):
            if used[a]:
                continue
            group = [b for b in range(a, len(spots)) if not used[b] and abs(spots[b][0] - x0) < 2.5 * px_per_pt
                     and abs(spots[b][1] - y0) < 2.5 * px_per_pt]
            for b in group:
                used[b] = True
            if len(group) > 1:
                self.dodged = True
                for k, b in enumerate(group):
                    _, _, s, i = spots[b]
                    self.points[s].dodge[i] = (k - (len(group) - 1) / 2) * DODGE

    dodged = False

    def finish(self, rec: Record, letter: str | None) -> None:
        from matplotlib.transforms import offset_copy

        ax = self.ax
        self.letter = letter
        self._cut()
        xlim = self._limits("x")
        self._limits("y")
        if xlim is None and self.offaxis:
            xlim = (1.0, 10.0)
            _set_log_axis(ax, "x", 1.0, 10.0)
        self._dodge()
        for p in self.points:
            face = p.color if p.filled else "white"
            if p.line:  # one line carries the markers (every point, or ``markevery``'s) and its dashes
                (line,) = ax.plot(p.xs, p.ys, color=p.color, linewidth=p.width, linestyle=p.style, marker=p.marker,
                                  markersize=p.size, markerfacecolor=face, markeredgewidth=0.8,
                                  markevery=p.markevery, zorder=3, clip_on=False)
                line.set_gid("point")
                continue
            offsets = sorted(set(p.dodge)) if p.dodge else [0.0]
            for off in offsets:
                idx = [i for i in range(len(p.xs)) if (p.dodge[i] if p.dodge else 0.0) == off]
                transform = offset_copy(ax.transData, fig=ax.figure, x=off, y=0, units="points") if off else ax.transData
                (line,) = ax.plot([p.xs[i] for i in idx], [p.ys[i] for i in idx], linestyle="none", marker=p.marker,
                                  markersize=p.size, color=p.color, markerfacecolor=face, markeredgewidth=0.8,
                                  zorder=3, clip_on=False, transform=transform)
                line.set_gid("point")
        for s, p in enumerate(self.points):
            self._bars(s, p, rec)
        for r in self.refs:
            lo, hi = sorted(ax.get_ylim() if r.axis == "y" else ax.get_xlim())
            if not lo <= r.value <= hi:
                self.beyond.add(r.label)
                continue
            draw = ax.axhline if r.axis == "y" else ax.axvline
            draw(r.value, color=r.color, linestyle=r.style, linewidth=0.9, zorder=1).set_gid("ref")
        lanes = list(self.lanes)
        for b in self.bands:  # a polygon across the panel (the other axis in axes coordinates)
            lo, hi = (0.0, 1.0) if b.series is None else (LANE * lanes.index(b.series) + 0.004,
                                                           LANE * (lanes.index(b.series) + 1) - 0.004)
            color = self.lanes.get(b.series, b.color) if b.series is not None else b.color
            alpha = b.alpha if b.series is None else 0.85
            if b.axis == "x":
                band = ax.fill_between([b.low, b.high], lo, hi, transform=ax.get_xaxis_transform(), color=color,
                                       alpha=alpha, linewidth=0, zorder=0.5)
            else:
                band = ax.fill_betweenx([b.low, b.high], lo, hi, transform=ax.get_yaxis_transform(), color=color,
                                        alpha=alpha, linewidth=0, zorder=0.5)
            band.set_gid("band")
        for f in self.fits:
            lo, hi = ax.get_xlim()
            xs = [lo * (hi / lo) ** (k / 50) for k in range(51)] if self.axes.xlog else [lo, hi]
            (line,) = ax.plot(xs, [f.intercept + f.slope * x for x in xs], color="0.2", linewidth=0.9,
                              linestyle="-", zorder=1.5, scalex=False, scaley=False)
            line.set_gid("fit")
        for series, x, y, color in self.offaxis:
            left = ax.get_xlim()[0]
            ax.annotate(f"◀ {_number(x)}", (left, y), xytext=(2, 0), textcoords="offset points", va="center",
                        fontsize=NOTE_FONT, color=color, annotation_clip=False)
        for x, y, text in self.texts:  # beside its point, on the side with more room
            lo, hi = ax.get_xlim()
            at = lo if x is None else x
            right = x is None or (math.log(at / lo) / math.log(hi / lo) if self.axes.xlog and at > 0
                                  else (at - lo) / (hi - lo)) < 0.5
            ax.annotate(text, (at, y), xytext=(4 if right else -4, 0), textcoords="offset points", va="center",
                        ha="left" if right else "right", fontsize=NOTE_FONT, color="0.3",
                        annotation_clip=False).set_gid("note")
        ax.set_xlabel(self.xlabel)
        ax.set_ylabel(self.ylabel if self.axes.categories is None else "")
        if self.axes.categories is not None:
            ax.grid(False, axis="y")
        if letter:
            ax.set_title(f"({letter})", loc="left", fontweight="bold")
        rec.dodged |= self.dodged
        self._record(rec)

    def _bars(self, s: int, p: _Points, rec: Record) -> None:
        from matplotlib.transforms import offset_copy

        ax = self.ax
        idx = [i for i in range(len(p.xs)) if any(v is not None for v in
                                                    (p.x_low[i], p.x_high[i], p.y_low[i], p.y_high[i]))]
        if not idx:
            return

        def side(values, ends, among):
            return [abs(ends[i] - values[i]) if ends[i] is not None else 0.0 for i in among]

        dodge = p.dodge or [0.0] * len(p.xs)
        for off in sorted({dodge[i] for i in idx}):
            among = [i for i in idx if dodge[i] == off]
            xs, ys = [p.xs[i] for i in among], [p.ys[i] for i in among]
            has_x = any(p.x_low[i] is not None or p.x_high[i] is not None for i in among)
            has_y = any(p.y_low[i] is not None or p.y_high[i] is not None for i in among)
            xerr = [side(p.xs, p.x_low, among), side(p.xs, p.x_high, among)] if has_x else None
            yerr = [side(p.ys, p.y_low, among), side(p.ys, p.y_high, among)] if has_y else None
            transform = offset_copy(ax.transData, fig=ax.figure, x=off, y=0, units="points") if off else ax.transData
            # thin and a little transparent: crossing bars of neighbours stay readable, markers show through
            container = ax.errorbar(xs, ys, xerr=xerr, yerr=yerr, fmt="none", ecolor=p.color, elinewidth=0.7,
                                    capsize=1.5, capthick=0.7, alpha=0.75, zorder=4, clip_on=False, transform=transform)
            for artist in container.lines[2]:
                artist.set_gid("errorbar")
            self.drew_x_bars |= has_x
            self.drew_y_bars |= has_y
            for i in among:
                for cut in self.cuts.get((s, i), []):
                    at = (getattr(p, cut)[i], p.ys[i]) if cut.startswith("x") else (p.xs[i], getattr(p, cut)[i])
                    (mark,) = ax.plot(*at, marker=CUT_MARKERS[cut], markersize=3.5, color=p.color, linestyle="none",
                                      zorder=5, clip_on=False, transform=transform)
                    mark.set_gid("cut")
                    rec.cut_markers.add(CUT_MARKERS[cut])

    def _record(self, rec: Record) -> None:
        ax = self.ax
        xlim, ylim = ax.get_xlim(), ax.get_ylim()
        rec.rows.append({"panel": self.index, "kind": "axes", "x_low": xlim[0], "x_high": xlim[1],
                         "y_low": min(ylim), "y_high": max(ylim), "x_quantity": self.x or "",
                         "x_scale": ax.get_xscale(), "x_label": self.xlabel,
                         "y_quantity": self.y or ("category" if self.axes.categories else ""),
                         "y_scale": "category" if self.axes.categories else ax.get_yscale(), "y_label": self.ylabel})
        for s, p in enumerate(self.points):
            for i in range(len(p.xs)):
                y = self.axes.categories[int(p.ys[i])] if self.axes.categories is not None else p.ys[i]
                rec.rows.append({"panel": self.index, "kind": "point", "series": p.series, "x": p.xs[i], "y": y,
                                 "x_low": p.x_low[i], "x_high": p.x_high[i], "y_low": p.y_low[i],
                                 "y_high": p.y_high[i], "cut": " ".join(self.cuts.get((s, i), [])),
                                 "note": f"drawn {p.dodge[i]:+g} pt aside (another point at the same place)"
                                 if p.dodge and p.dodge[i] else ""})
        for series, x, y, _ in self.offaxis:
            y = self.axes.categories[int(y)] if self.axes.categories is not None else y
            rec.rows.append({"panel": self.index, "kind": "offaxis", "series": series, "x": x, "y": y,
                             "note": "at or below 0: not drawable on the log axis, named at its start"})
        for x, y, text in self.texts:
            y = self.axes.categories[int(y)] if self.axes.categories is not None else y
            rec.rows.append({"panel": self.index, "kind": "text", "x": x, "y": y, "note": text})
        for r in self.refs:
            rec.rows.append({"panel": self.index, "kind": f"ref-{r.axis}", "series": r.label, r.axis: r.value,
                             "note": "beyond the axis: not drawn" if r.label in self.beyond else ""})
        for b in self.bands:
            rec.rows.append({"panel": self.index, "kind": f"band-{b.axis}", "series": b.series or b.label,
                             f"{b.axis}_low": b.low, f"{b.axis}_high": b.high,
                             "note": b.label if b.series is not None else ""})
        for f in self.fits:
            lo, hi = ax.get_xlim()
            rec.rows.append({"panel": self.index, "kind": "fit", "series": f.label, "x_low": lo, "x_high": hi,
                             "y_low": f.intercept + f.slope * lo, "y_high": f.intercept + f.slope * hi,
                             "note": f"slope {f.slope!r}, intercept {f.intercept!r}"})
        from .quantities import _stem
        if self.drew_x_bars:
            rec.bars.setdefault(_stem(self.xlabel), self._error("x"))
            rec.bar_axes.setdefault(_stem(self.xlabel), set()).add("x")
        if self.drew_y_bars:
            rec.bars.setdefault(_stem(self.ylabel), self._error("y"))
            rec.bar_axes.setdefault(_stem(self.ylabel), set()).add("y")


__all__ = ["Band", "CUT_MARKERS", "Fit", "Record", "Ref"]
