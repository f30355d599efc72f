"""Scatter plots: one quantity against another, one marker per model (the paper's Fig. 1):
colour = model size, marker = recipe, hollow = outside a tolerance, a run's checkpoints
joined in step order, an optional fitted line per panel. Markers at one place are set
side by side (their values stay in the data file), so none hides another."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

from . import layout
from .axes import _number, interval_text
from .panel import Fit, Ref, _AxisSettings, _ends, _Panel, _Points
from .quantities import _error, _value
from .style import MARKERS, PALETTE, styled

PANEL_HEIGHT = 2.2  # inches

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


@dataclass(frozen=True)
class Encoding:
    """How a scatter plot draws its rows: colour by ``row[colour_by]`` (model size; one
    legend entry per size, named by ``colour_label(size)``, default "<n> parameters"),
    marker by ``marker_by(row)`` (the recipe), hollow where ``hollow(row)``
    (``hollow_label`` says what hollow means); rows with the same ``join_by(row)``
    (checkpoints of one run) are joined in step order, an arrow at the last.
    ``colour_markers`` (without ``colour_by``): each ``marker_by`` group its own colour too
    (``style.PALETTE``), so recipes differ in both."""

    colour_by: str | None = "parameters"
    colour_label: Callable[[float], str] | None = None
    marker_by: Callable[[dict], str] | None = None
    hollow: Callable[[dict], bool] | None = None
    hollow_label: str = ""
    join_by: Callable[[dict], str] | None = None
    colour_markers: bool = False


def _size_colours(values: list[float]) -> dict[float, object]:
    """Model sizes → colours of a sequential map (small = light, large = dark), as the
    paper colours by size."""
    from matplotlib import colormaps

    sizes = sorted(set(values))
    cmap = colormaps["viridis"]
    if len(sizes) == 1:
        return {sizes[0]: cmap(0.35)}
    return {v: cmap(0.85 - 0.75 * i / (len(sizes) - 1)) for i, v in enumerate(sizes)}


@styled
def scatter_plot(rows: list[dict], panels: Sequence[XY], title: str, *, encoding: Encoding = Encoding(),
                 errors: dict[str, str] | None = None, caveat: str | None = None):
    """Panels of ``y`` against ``x``, one marker per row, drawn as ``encoding`` says (default:
    coloured by model size, one marker, all filled). ``caveat``: printed under the title."""
    colour_by, colour_label, marker_by = encoding.colour_by, encoding.colour_label, encoding.marker_by
    hollow, hollow_label, join_by = encoding.hollow, encoding.hollow_label, encoding.join_by
    fig, axes = layout.new_figure(len(panels), title, panel_height=PANEL_HEIGHT, caveat=caveat)
    sizes = [_value(r, colour_by) for r in rows] if colour_by else []
    colours = _size_colours([s for s in sizes if math.isfinite(s)]) if colour_by else {}
    recipes = list(dict.fromkeys(marker_by(r) for r in rows)) if marker_by else []
    markers = {name: MARKERS[i % len(MARKERS)] for i, name in enumerate(recipes)}

    own = {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(recipes)} if encoding.colour_markers else {}

    def style(r):
        c = colours.get(_value(r, colour_by), "C0") if colour_by else own.get(marker_by(r), "C0") if own else "C0"
        return c, markers.get(marker_by(r), "o") if marker_by else "o", not (hollow and hollow(r))

    built, used_hollow = [], False
    letters = layout.letters(len(panels))
    for ax, xy in zip(axes, panels):
        xlog = xy.x in ("kl", "log_kl") if xy.xlog is None else xy.xlog
        ylog = xy.y in ("kl", "log_kl") if xy.ylog is None else xy.ylog
        pnl = _Panel(ax, len(built), xy.x, xy.y, xy.xlabel, xy.ylabel,
                     _AxisSettings(xlog=xlog, ylog=ylog, errors=errors, dodge=True))
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
    size_entries = [(layout.entry_marker(c, "o"), _size_text(v, colour_label)) for v, c in colours.items()]
    recipe_entries = [(layout.entry_marker("0.4" if colour_by else own.get(n, "C0"), markers[n]), n) for n in recipes]
    keys = []
    if used_hollow and hollow_label:
        keys.append((layout.entry_marker("0.4", "o", filled=False), f"hollow: {hollow_label}"))
    if join_by and any(len(v) > 1 for v in _runs(rows, join_by).values()):
        keys.append((layout.entry_line("0.5", "-"), "line: one run's checkpoints, arrow at the last"))
    layout.finish(fig, [(f"colour: model size ({colour_by})" if colour_by else None, size_entries),
                        ("marker: recipe" if marker_by else None, recipe_entries),
                        (None, keys + layout.dodge_entries(fig) + layout.ref_entries(built)),
                        ("error bars", layout.bar_entries(fig))])
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
        ax.plot(xs, ys, color=color, linewidth=0.6, alpha=0.6, zorder=1.5)
        ax.annotate("", xy=(xs[-1], ys[-1]), xytext=(xs[-2], ys[-2]),
                    arrowprops={"arrowstyle": "-|>", "color": color, "lw": 0.6, "alpha": 0.8,
                                "shrinkA": 0, "shrinkB": 4})


def _ols_fit(pnl: _Panel) -> Fit | None:
    from ...stats.inference import ols_slope

    xs = [x for p in pnl.points for x in p.xs]
    ys = [y for p in pnl.points for y in p.ys]
    iv = ols_slope(xs, ys)
    if not math.isfinite(iv.estimate):
        return None
    intercept = sum(ys) / len(ys) - iv.estimate * sum(xs) / len(xs)
    return Fit(iv.estimate, intercept, f"least squares: slope {interval_text(iv.estimate, iv.low, iv.high)} "
                                       f"(95 % t, {len(xs)} points)")


__all__ = ["XY", "Encoding", "scatter_plot"]
