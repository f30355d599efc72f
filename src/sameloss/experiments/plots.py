"""Figures of the experiments (matplotlib, written as PNG; no display needed).

Each ``*_figure(path, ...)`` draws with the matching ``*_plot(...)`` (which returns the
matplotlib Figure, for tests) and writes the PNG. Conventions every figure follows:

- error bars never leave a quantity's range: accuracies stay in [0, 100] % (or [0, 1]),
  losses and KL are >= 0 (``_bounds``);
- losses and KL are labelled in nats (``_with_unit``);
- log axes get labelled ticks inside the data range, also when it spans less than a
  decade (``_readable_log_axis``);
- the legend sits below the panels, outside every axes, and lists only styles that some
  point uses.
"""

from __future__ import annotations

import math
from pathlib import Path

from ..measures import rows as schema

MARKERS = "osD^v<>pPX*h"


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _v(row: dict, key: str) -> float:
    try:
        v = float(row.get(key))
    except (TypeError, ValueError):
        return float("nan")
    return v


def _err(row: dict, key: str, scale: float = 1.0) -> float:
    v = _v(row, schema.error_column(key))
    return v * scale if math.isfinite(v) else 0.0


def _bounds(key: str, scale: float = 1.0) -> tuple[float, float]:
    """The range a quantity can take (as shown, i.e. times ``scale``)."""
    if schema.is_accuracy(key):
        return 0.0, 1.0 * scale
    if key in schema.NATS_KEYS:
        return 0.0, math.inf
    return -math.inf, math.inf


def _with_unit(label: str, key: str) -> str:
    return label if key not in schema.NATS_KEYS or "nats" in label else f"{label} (nats)"


def _clipped(values: list[float], errors: list[float], bounds: tuple[float, float]) -> list[list[float]]:
    """Asymmetric error bars ``[lower, upper]`` that stop at the quantity's bounds."""
    lo, hi = bounds
    lower = [max(0.0, min(e, v - lo)) for v, e in zip(values, errors)]
    upper = [max(0.0, min(e, hi - v)) for v, e in zip(values, errors)]
    return [lower, upper]


def _extent(values: list[float], bars: list[list[float]]) -> list[float]:
    """Every drawn end: values and error-bar ends."""
    return [v - lo for v, lo in zip(values, bars[0])] + [v + up for v, up in zip(values, bars[1])] + list(values)


def _log_ticks(lo: float, hi: float) -> list[float]:
    """Ticks in [lo, hi] (0 < lo < hi), at least three, spaced so that their labels do not
    collide, and none of the range's ends far from one: decades, else 1-2-5, else 1..9 per
    decade, else evenly spaced round numbers (a range well under a decade)."""
    span = math.log10(hi / lo)

    def thinned(candidates: list[float]) -> list[float]:
        # the roundest numbers come first and win over close neighbours
        kept: list[float] = []
        for t in candidates:
            if lo <= t <= hi and all(abs(math.log10(t / k)) >= span / 7 for k in kept):
                kept.append(t)
        return sorted(kept)

    def covers(ticks: list[float]) -> bool:
        return (len(ticks) >= 3 and math.log10(ticks[0] / lo) <= 0.3 * span
                and math.log10(hi / ticks[-1]) <= 0.3 * span)

    decades = range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)
    for mantissas in ((1,), (1, 2, 5), (1, 2, 5, 3, 4, 6, 7, 8, 9)):
        ticks = thinned([m * 10.0 ** k for m in mantissas for k in decades])
        if covers(ticks):
            return ticks
    from matplotlib.ticker import MaxNLocator
    return thinned([float(t) for t in MaxNLocator(nbins=5, steps=[1, 2, 2.5, 5, 10]).tick_values(lo, hi)])


def _tick_labels(ticks: list[float]) -> list[str]:
    """Plain numbers, each as short as it can be and still exact."""
    return [_number(t) for t in ticks]


def _number(t: float) -> str:
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


def _readable_log_axis(ax, which: str, extent: list[float]) -> None:
    """Log scale with limits padded around every positive drawn end and labelled ticks
    inside them (matplotlib's defaults label only decades, and a range within one decade
    then shows no number at all, or minor labels that stop below the data)."""
    from matplotlib.ticker import FixedLocator, FixedFormatter, NullFormatter

    axis = ax.yaxis if which == "y" else ax.xaxis
    (ax.set_yscale if which == "y" else ax.set_xscale)("log")
    positive = [e for e in extent if math.isfinite(e) and e > 0]
    if not positive:
        return
    lo, hi = min(positive), max(positive)
    if lo == hi:
        lo, hi = lo / 1.5, hi * 1.5
    pad = max((math.log10(hi) - math.log10(lo)) * 0.06, math.log10(1.05))
    lo, hi = lo / 10 ** pad, hi * 10 ** pad
    (ax.set_ylim if which == "y" else ax.set_xlim)(lo, hi)
    ticks = _log_ticks(lo, hi)
    axis.set_major_locator(FixedLocator(ticks))
    axis.set_major_formatter(FixedFormatter(_tick_labels(ticks)))
    axis.set_minor_formatter(NullFormatter())


def _legend_below(fig, handles: list, labels: list[str]) -> None:
    """One legend for the figure, below the panels (outside every axes: it covers no point)."""
    if not handles:
        return
    fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=min(len(labels), 4),
               fontsize=8, frameon=False)


def _save(fig, path: Path) -> Path:
    """The figure as a PNG, written atomically (a full disk: one ``UserError`` line, no
    half-written image) and noted in the experiment folder's marker."""
    import io

    from .. import files
    from .folder import record_output

    path = Path(path)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, bbox_inches="tight")  # "tight": the canvas grows to hold the legend
    _plt().close(fig)
    with files.storage_errors(path):
        record_output(path)
        files.atomic_write_bytes(path, buffer.getvalue())
    return path


def lines_panel(ax, series: dict[str, list[dict]], x: str, y: str, ylabel: str, scale: float = 1.0,
                logy: bool = False, logx: bool = False) -> None:
    xs_all, ys_all = [], []
    for i, (name, rows) in enumerate(series.items()):
        rows = [r for r in rows if math.isfinite(_v(r, y))]
        if not rows:
            continue
        xs = [_v(r, x) for r in rows]
        ys = [_v(r, y) * scale for r in rows]
        bars = _clipped(ys, [_err(r, y, scale) for r in rows], _bounds(y, scale))
        ax.errorbar(xs, ys, yerr=bars, marker=MARKERS[i % len(MARKERS)], color=f"C{i % 10}", capsize=3,
                    label=name)
        xs_all += xs
        ys_all += _extent(ys, bars)
    ax.set_xlabel(_with_unit(x, x))
    ax.set_ylabel(_with_unit(ylabel, y))
    if logy:
        _readable_log_axis(ax, "y", ys_all)
    if logx:
        _readable_log_axis(ax, "x", xs_all)
    ax.grid(alpha=0.3)


def series_plot(series: dict[str, list[dict]], x: str, panels: list[tuple[str, str, float, bool]],
                title: str, logx: bool = False):
    """One row of panels, each ``(key, label, scale, logy)`` against ``x``; one line per series."""
    plt = _plt()
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.6), squeeze=False)
    axes = list(axes[0])
    for ax, (key, label, scale, logy) in zip(axes, panels):
        lines_panel(ax, series, x, key, label, scale, logy, logx)
    # a series keeps its colour and marker in every panel: one entry per series drawn anywhere
    found: dict[str, object] = {}
    for ax in axes:
        for handle, name in zip(*ax.get_legend_handles_labels()):
            found.setdefault(name, handle)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    names = [n for n in series if n in found]
    _legend_below(fig, [found[n] for n in names], names)
    return fig


def series_figure(path: Path, series: dict[str, list[dict]], x: str, panels: list[tuple[str, str, float, bool]],
                  title: str, logx: bool = False) -> Path:
    """``series_plot`` written to ``path`` (PNG)."""
    return _save(series_plot(series, x, panels, title, logx), path)


def scatter_plot(groups: dict[str, list[dict]], panels: list[tuple[str, str, str, str]], title: str,
                 highlight=None, highlight_labels: tuple[str, str] | None = None):
    """Panels ``(x_key, x_label, y_key, y_label)``; one marker per group. Keys may end in
    ``%`` to be shown ×100. ``highlight(row) -> bool``: filled markers for True, hollow
    for False; ``highlight_labels`` = (what filled means, what hollow means) adds a legend
    entry for each of the two styles that some point uses."""
    from matplotlib.lines import Line2D

    plt = _plt()
    fig, axes = plt.subplots(1, len(panels), figsize=(4.4 * len(panels), 3.9), squeeze=False)
    axes = list(axes[0])
    group_handles: dict[str, object] = {}
    styles_used: set[bool] = set()
    for ax, (xk, xl, yk, yl) in zip(axes, panels):
        for i, (name, rows) in enumerate(groups.items()):
            pts = []
            for r in rows:
                x, xe = _scaled(r, xk)
                y, ye = _scaled(r, yk)
                if math.isfinite(x) and math.isfinite(y):
                    pts.append((x, y, xe, ye, bool(highlight(r)) if highlight else True))
            color, marker = f"C{i % 10}", MARKERS[i % len(MARKERS)]
            for filled in (True, False):
                sel = [p for p in pts if p[4] == filled]
                if not sel:
                    continue
                styles_used.add(filled)
                xs, ys = [p[0] for p in sel], [p[1] for p in sel]
                ax.errorbar(xs, ys, xerr=_clipped(xs, [p[2] for p in sel], _scaled_bounds(xk)),
                            yerr=_clipped(ys, [p[3] for p in sel], _scaled_bounds(yk)), fmt=marker, color=color,
                            capsize=2, markerfacecolor=color if filled else "none")
            if pts:
                group_handles.setdefault(name, Line2D([], [], marker=marker, color=color, linestyle="none"))
        ax.set_xlabel(_with_unit(xl, xk.rstrip("%")))
        ax.set_ylabel(_with_unit(yl, yk.rstrip("%")))
        ax.grid(alpha=0.3)
    handles = [group_handles[n] for n in groups if n in group_handles]
    labels = [n for n in groups if n in group_handles]
    if highlight is not None and highlight_labels is not None:
        for filled, text in zip((True, False), highlight_labels):
            if filled in styles_used:
                handles.append(Line2D([], [], marker="o", color="0.35", linestyle="none",
                                      markerfacecolor="0.35" if filled else "none"))
                labels.append(f"{'filled' if filled else 'hollow'}: {text}")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    _legend_below(fig, handles, labels)
    return fig


def scatter_figure(path: Path, groups: dict[str, list[dict]], panels: list[tuple[str, str, str, str]],
                   title: str, highlight=None, highlight_labels: tuple[str, str] | None = None) -> Path:
    """``scatter_plot`` written to ``path`` (PNG)."""
    return _save(scatter_plot(groups, panels, title, highlight, highlight_labels), path)


def _scaled(row: dict, key: str) -> tuple[float, float]:
    scale = 1.0
    if key.endswith("%"):
        key, scale = key[:-1], 100.0
    return _v(row, key) * scale, _err(row, key, scale)


def _scaled_bounds(key: str) -> tuple[float, float]:
    return _bounds(key[:-1], 100.0) if key.endswith("%") else _bounds(key)


def bars_plot(rows: list[dict], label: str, panels: list[tuple[str, str, float]], title: str):
    """Horizontal bars per row (``row[label]``), one panel per ``(key, xlabel, scale)``."""
    plt = _plt()
    fig, axes = plt.subplots(1, len(panels), figsize=(3.8 * len(panels), 0.45 * len(rows) + 1.6), sharey=True,
                             squeeze=False)
    axes = list(axes[0])
    names = [str(r[label]) for r in rows]
    for ax, (key, xlabel, scale) in zip(axes, panels):
        vals = [_v(r, key) * scale for r in rows]
        shown = [v if math.isfinite(v) else 0.0 for v in vals]
        bars = _clipped(shown, [_err(r, key, scale) if math.isfinite(v) else 0.0 for r, v in zip(rows, vals)],
                        _bounds(key, scale))
        ys = list(range(len(rows)))
        ax.barh(ys, shown, xerr=bars, color="C0", alpha=0.7, capsize=3)
        for y, v in zip(ys, vals):
            if not math.isfinite(v):
                ax.text(0, y, " n/a", va="center", fontsize=8)
        ax.set_yticks(ys, names)
        ax.set_xlabel(_with_unit(xlabel, key))
        finite = [v for v in vals if math.isfinite(v)]
        if finite and schema.is_accuracy(key):
            # zoom on the accuracies (they differ by a few points), never below 0
            lo = min(finite) - 5 * max(bars[0] + bars[1] + [0.1])
            ax.set_xlim(left=max(0.0, lo))
        ax.grid(alpha=0.3, axis="x")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def bars_figure(path: Path, rows: list[dict], label: str, panels: list[tuple[str, str, float]], title: str) -> Path:
    """``bars_plot`` written to ``path`` (PNG)."""
    return _save(bars_plot(rows, label, panels, title), path)
