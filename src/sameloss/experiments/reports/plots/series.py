"""Series plots: quantities against a step, a size or the KL, one line per series (the
paper's Figs. 2–5). A series keeps its colour, marker and dash pattern in every panel, so
lines that coincide stay distinguishable; a panel may shade a stretch of its x axis
(``Band``), or give each series its own stretch as a strip of its colour."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from . import layout
from .panel import Band, Ref, _AxisSettings, _ends, _Panel, _Points, marks_along
from .quantities import _error, _value
from .style import LINESTYLES, MARKERS, PALETTE, styled

PANEL_HEIGHT = 2.1  # inches


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


@dataclass(frozen=True)
class XAxis:
    """A series plot's x axis (the quantity ``x``): its ``label`` (default: ``x`` itself),
    a log axis, and vertical reference lines in every panel (e.g. where the loss
    saturates)."""

    label: str | None = None
    log: bool = False
    refs: tuple[Ref, ...] = ()


def series_style(i: int, name: str, styles: dict[str, dict]) -> dict:
    """The n-th series' colour, marker, dash pattern and line width (``styles[name]``
    overrides; a ``marker`` of "" draws the line alone)."""
    return {"color": PALETTE[i % len(PALETTE)], "marker": MARKERS[i % len(MARKERS)], "filled": True,
            "style": LINESTYLES[i % len(LINESTYLES)], "width": 1.0, **styles.get(name, {})}


@styled
def series_plot(series: dict[str, list[dict]], x: str, panels: Sequence[Panel], title: str, *,
                x_axis: XAxis = XAxis(), errors: dict[str, str] | None = None, styles: dict[str, dict] | None = None,
                caveat: str | None = None):
    """Panels of ``panels[i].key`` against ``x``, one line per series (a name and its rows,
    in ``x`` order). ``x_axis``: the x axis's label, log scale and vertical reference lines.
    ``styles[name]``: ``color``, ``marker``, ``filled``, ``style`` (dashes) of a series
    (default: the n-th of each). ``caveat``: printed under the title."""
    fig, axes = layout.new_figure(len(panels), title, panel_height=PANEL_HEIGHT, caveat=caveat)
    styles = styles or {}
    drawn_in: dict[str, list[str | None]] = {}
    built = []
    letters = layout.letters(len(panels))
    names = list(series)
    for ax, panel, letter in zip(axes, panels, letters):
        pnl = _Panel(ax, len(built), x, panel.key, x_axis.label or x, panel.label,
                     _AxisSettings(xlog=x_axis.log, ylog=panel.is_log, integer_x=x == "step", errors=errors))
        for i, (name, rows) in enumerate(series.items()):
            style = series_style(i, name, styles)
            rows = [r for r in rows if math.isfinite(_value(r, panel.key)) and math.isfinite(_value(r, x))]
            if not rows:
                continue
            ys = [_value(r, panel.key) for r in rows]
            low, high = _ends(ys, [_error(r, panel.key) for r in rows])
            xs = [_value(r, x) for r in rows]
            # a long line carries a few markers, spread and shifted per series: one on every point would
            # hide the lines under it (a fork's stretch evaluated every few steps)
            pnl.add(_Points(name, xs, ys, [None] * len(xs), [None] * len(xs), low, high, style["color"],
                            style["marker"], style["filled"], line=True, style=style["style"],
                            markevery=marks_along(len(xs), i, len(series)), width=style["width"]))
            drawn_in.setdefault(name, []).append(letter)
        for r in (*panel.refs, *x_axis.refs):
            pnl.ref(r)
        for b in panel.bands:
            color = series_style(names.index(b.series), b.series, styles)["color"] if b.series in names else None
            pnl.band(b, color=color)
        built.append(pnl)
    for pnl, letter in zip(built, letters):
        pnl.finish(fig._sameloss, letter)
    entries = []
    for i, name in enumerate(series):
        if name not in drawn_in:
            continue
        style = series_style(i, name, styles)
        where = drawn_in[name]
        label = name if len(where) == len(panels) else f"{name} (panel {', '.join(w for w in where if w)})"
        entries.append((layout.entry_marker(style["color"], style["marker"], style["filled"], line=True,
                                            style_=style["style"], width=style["width"]), label))
    layout.finish(fig, [(None, entries), (None, layout.ref_entries(built) + layout.band_entries(built)),
                        ("error bars", layout.bar_entries(fig))])
    return fig


__all__ = ["Panel", "XAxis", "series_plot", "series_style"]
