"""Dots plots: one dot with its interval per model and quantity (Tables 1–2 as a figure;
never a bar), one row per model, one panel per quantity."""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

from . import layout
from .panel import _AxisSettings, _ends, _Panel, _Points
from .quantities import _error, _stem, _value
from .series import Panel
from .style import LEGEND_FONT, current, styled

ROW_HEIGHT = 0.2  # inches per row


def row_labels(names: list[str], font: float = 7.0) -> list[str]:
    """Row names broken into lines of at most a third of the figure's width."""
    return [layout.wrap(name, 0.33 * current().inches, font) for name in names]


def rows_height(labels: list[str]) -> float:
    """The height a panel of these rows needs: each row as tall as its lines."""
    lines = sum(label.count("\n") + 1 for label in labels)
    return ROW_HEIGHT * max(len(labels), 0.75 * lines) + 0.75


@styled
def dots_plot(rows: list[dict], label: str, panels: Sequence[Panel], title: str, *,
              errors: dict[str, str] | None = None, missing: dict[str, str] | None = None,
              caveat: str | None = None):
    """One row per ``row[label]`` (top to bottom), one panel per quantity: a dot with its
    interval (never a bar). ``missing[key]`` is written where a row has no value of ``key``
    (e.g. "no parameters: no trace"); a value at or below 0 on a log axis is named at the
    axis's start. ``caveat``: printed under the title."""
    names = [str(r[label]) for r in rows]
    ticks = row_labels(names)
    fig, axes = layout.new_figure(len(panels), title, panel_height=rows_height(ticks), min_panel_width=2.1,
                                  caveat=caveat)
    missing = missing or {}
    built = []
    letters = layout.letters(len(panels))
    for k, (ax, panel) in enumerate(zip(axes, panels)):
        pnl = _Panel(ax, k, panel.key, None, panel.label, "",
                     _AxisSettings(xlog=panel.is_log, categories=names, ticks=ticks, errors=errors))
        xs = [_value(r, panel.key) for r in rows]
        low, high = _ends(xs, [_error(r, panel.key) for r in rows])
        n = len(rows)
        pnl.add(_Points(_stem(panel.label), xs, [float(i) for i in range(n)], low, high, [None] * n, [None] * n,
                        "C0", "o"))
        pnl.texts = [(None, float(i), missing.get(panel.key, "not measured")) for i, v in enumerate(xs)
                     if not math.isfinite(v)]
        for r in panel.refs:  # on the value axis (x here)
            pnl.ref(dataclasses.replace(r, axis="x"))
        built.append(pnl)
        if not layout.first_in_row(fig, k):
            ax.tick_params(labelleft=False)
    for pnl, letter in zip(built, letters):
        pnl.finish(fig._sameloss, letter)
    layout.finish(fig, [(None, layout.ref_entries(built)), ("error bars", layout.bar_entries(fig))])
    return fig


__all__ = ["LEGEND_FONT", "dots_plot"]
