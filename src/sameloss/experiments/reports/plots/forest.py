"""Forest plots: paired differences (recipe − reference), one row per comparison, the
estimate a dot and its interval a line, a solid line at 0 (no difference) and, behind each
row, a light band over ± its minimum detectable effect (80 % power) — a band, not a tick,
so it never reads as an error bar's cap. A row whose pairs all agree (zero spread) or
that has no interval says so beside its dot."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Sequence

from . import layout
from .dots import row_labels, rows_height
from .panel import Ref, _AxisSettings, _Panel, _Points
from .quantities import _float
from .style import styled

MDE_COLOR = "0.83"


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
    n: str | None = None  # the column of the row's number of pairs (default ``<key>_n``; may be absent)


def _note(est: float, low: float, high: float, n: float) -> str | None:
    """What a row without a visible interval is: too few pairs for one, or pairs whose
    differences are all equal (a spread of 0: no interval to draw, not a certainty)."""
    if not math.isfinite(est):
        return None
    zero = math.isfinite(low) and math.isfinite(high) and high - low <= 1e-12 * max(1.0, abs(est))
    if math.isfinite(low) and math.isfinite(high) and not zero:
        return None
    if math.isfinite(n) and n < 2:
        return f"no interval: {n:g} pair"
    if zero or math.isfinite(n):
        return "zero spread: all pairs equal"
    return "no interval"


@styled
def forest_plot(rows: list[dict], label: str, panels: Sequence[Forest], title: str, *,
                caveat: str | None = None):
    """Paired differences, one row per ``row[label]`` (top to bottom): the estimate as a dot,
    its interval as a line, a solid line at 0 (no difference) and a light band at ± the
    row's MDE (80 % power): an interval inside the band is "no effect as large as the MDE",
    an interval clear of 0 a detected effect. ``caveat``: printed under the title (e.g. a
    study whose headroom gate failed: no verdict)."""
    names = [str(r[label]) for r in rows]
    ticks = row_labels(names)
    fig, axes = layout.new_figure(len(panels), title, panel_height=rows_height(ticks), min_panel_width=2.1,
                                  caveat=caveat)
    built = []
    letters = layout.letters(len(panels))
    any_mde = False
    for k, (ax, f) in enumerate(zip(axes, panels)):
        pnl = _Panel(ax, k, None, None, f.label, "", _AxisSettings(categories=names, ticks=ticks, x_error=f.interval))
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
        shown = [(i, m) for i, m in enumerate(mdes) if math.isfinite(m) and m > 0 and math.isfinite(est[i])]
        any_mde |= bool(shown)
        pnl.span["x"] = [v for _, m in shown for v in (-m, m)]
        counts = [_float(r.get(f.n or f"{f.key}_n")) for r in rows]
        pnl.texts = [(est[i], float(i), note) for i in range(n) if (note := _note(est[i], low[i], high[i], counts[i]))]
        built.append((pnl, shown))
        if not layout.first_in_row(fig, k):
            ax.tick_params(labelleft=False)
    for (pnl, shown), letter in zip(built, letters):
        pnl.finish(fig._sameloss, letter)
        for i, m in shown:  # behind everything: a light band over ± the MDE at the row
            (band,) = pnl.ax.plot([-m, m], [i, i], color=MDE_COLOR, linewidth=5, solid_capstyle="butt", zorder=0.6)
            band.set_gid("mde")
            for v in (-m, m):
                fig._sameloss.rows.append({"panel": pnl.index, "kind": "mde", "series": "MDE", "x": v,
                                           "y": names[i], "note": "± the minimum detectable effect (80 % power)"})
    panels_ = [p for p, _ in built]
    keys = [(layout.entry_marker("C0", "o"), "estimate (recipe − reference)")]
    if any_mde:
        keys.append((layout.entry_range(MDE_COLOR), "± MDE: the smallest effect detected with 80 % power"))
    layout.finish(fig, [(None, keys + layout.ref_entries(panels_)), ("error bars", layout.bar_entries(fig))])
    return fig


__all__ = ["Forest", "forest_plot"]
