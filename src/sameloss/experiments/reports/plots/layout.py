"""A figure's frame: panels in rows that fit its width, the title and any caveat above
them, legends below (outside every axes: they cover no point), every label and legend
entry broken into lines that fit — and the legend's glyphs drawn as the panels draw them.

``new_figure`` makes the panels; ``finish(fig, blocks)`` lays them out with their legends
and sets the figure's height, so the saved figure is exactly ``style.WIDTHS[width]`` wide
and nothing in it is drawn below ``style.MIN_FONT`` points.
"""

from __future__ import annotations

import math
import textwrap
import warnings
from dataclasses import dataclass

from . import style
from .panel import Record, _Panel

PAD = 0.06  # inches around the figure's content
GAP = 0.08  # inches between blocks (title, panels, legends)
CHAR_WIDTH = 0.55  # of a font's size: the mean width of a character of legend text (DejaVu Sans)


@dataclass
class Frame:
    """How a figure is laid out: its title, the caveat it shows, its grid of panels."""

    title: str
    caveat: str | None
    rows: int
    cols: int
    panel_height: float  # inches


def new_figure(n_panels: int, title: str, *, panel_height: float, min_panel_width: float = 2.0,
               caveat: str | None = None):
    """A figure at the current width (``style.drawing``) with ``n_panels`` axes in rows of
    as many as fit ``min_panel_width`` inches each; returns it and its axes."""
    drawing = style.current()
    width = drawing.inches
    cols = max(1, min(n_panels, int(width // min_panel_width)))
    rows = math.ceil(n_panels / cols)
    fig, grid = style.plt().subplots(rows, cols, figsize=(width, rows * panel_height + 1.0), squeeze=False)
    axes = list(grid.flat)
    for ax in axes[n_panels:]:
        ax.remove()
    caveats = [c for c in (drawing.caveat, caveat) if c]
    fig._sameloss = Record()
    fig._sameloss_frame = Frame(title, "; ".join(dict.fromkeys(caveats)) or None, rows, cols, panel_height)
    return fig, axes[:n_panels]


def letters(n: int) -> list[str | None]:
    return [chr(ord("a") + i) for i in range(n)] if n > 1 else [None]


def first_in_row(fig, k: int) -> bool:
    """Whether panel ``k`` starts a row of its figure (it shows the row names of a dots or
    forest plot; the others in its row share them)."""
    return k % fig._sameloss_frame.cols == 0


def wrap(text: str, width_in: float, font: float) -> str:
    """``text`` broken into lines of about ``width_in`` inches at ``font`` points (whole words)."""
    chars = max(8, int(width_in * 72 / (CHAR_WIDTH * font)))
    return "\n".join(textwrap.fill(part, chars, break_on_hyphens=False) for part in text.split("\n"))


# ---- legend entries ------------------------------------------------------------------------------
def entry_marker(color, marker, filled=True, line=False, style_="-", width=1.0, size=4.0):
    from matplotlib.lines import Line2D
    return Line2D([], [], color=color, marker=marker, markersize=size, linestyle=style_ if line else "none",
                  markerfacecolor=color if filled else "white", markeredgewidth=0.8, linewidth=width)


def entry_line(color, style_, width=0.9):
    from matplotlib.lines import Line2D
    return Line2D([], [], color=color, linestyle=style_, linewidth=width)


def entry_range(color="0.82"):
    """A thick light segment: a range drawn behind a row (the forest plot's ± MDE)."""
    from matplotlib.lines import Line2D
    return Line2D([], [], color=color, linewidth=5, solid_capstyle="butt")


def _entry_bar(axes: set):
    """An error bar as the panels draw it: "|" for vertical bars, "—" for horizontal ones."""
    from matplotlib.lines import Line2D
    marker = "+" if axes == {"x", "y"} else "_" if axes == {"x"} else "|"
    return Line2D([], [], color="0.25", marker=marker, markersize=7, markeredgewidth=0.9, linestyle="none")


def _where(letters_in: list[str | None], n: int) -> str:
    """" (panel a, c)" when something is drawn in some panels only."""
    shown = [x for x in letters_in if x]
    return "" if len(set(letters_in)) >= n or not shown else f" (panel {', '.join(dict.fromkeys(shown))})"


def ref_entries(panels: list[_Panel]) -> list[tuple]:
    """A legend entry per reference line and fitted line, naming the panels it is in when
    not in all of them (a dashed optimum in panel a only says so)."""
    seen: dict[str, tuple] = {}
    where: dict[str, list] = {}
    drawn = {r.label for p in panels for r in p.refs if r.label not in p.beyond}
    for p in panels:
        for r in p.refs:
            if not r.label:  # one of a pair (−δ of ±δ): its twin's entry names both
                continue
            seen.setdefault(r.label, (entry_line(r.color, r.style), r.label if r.label in drawn
                                      else f"{r.label}: beyond the axes"))
            where.setdefault(r.label, []).append(p.letter)
        for f in p.fits:
            seen.setdefault(f.label, (entry_line("0.2", "-"), f.label))
            where.setdefault(f.label, []).append(p.letter)
    return [(handle, label + _where(where[key], len(panels))) for key, (handle, label) in seen.items()]


def band_entries(panels: list[_Panel]) -> list[tuple]:
    from matplotlib.patches import Patch

    seen: dict[str, tuple] = {}
    for p in panels:
        for b in p.bands:
            if b.series is None:
                seen.setdefault(b.label, (Patch(color=b.color, alpha=b.alpha, linewidth=0), b.label))
            else:
                seen.setdefault(b.label, (Patch(color="0.45", alpha=0.85, linewidth=0), b.label))
    return list(seen.values())


def bar_entries(fig) -> list[tuple]:
    """What each quantity's error bars are (glyph: the bars' direction), and the cut marks
    actually drawn."""
    from matplotlib.legend_handler import HandlerTuple  # noqa: F401 (tuples of handles: drawn side by side)

    rec: Record = fig._sameloss
    out = [(_entry_bar(rec.bar_axes.get(q, {"y"})), f"{q}: {what}") for q, what in rec.bars.items()]
    if rec.cut:
        marks = tuple(entry_marker("0.25", m) for m in sorted(rec.cut_markers))
        out.append((marks if len(marks) > 1 else marks[0], "bar cut at the end of the quantity's range"))
    return out


def dodge_entries(fig) -> list[tuple]:
    if not fig._sameloss.dodged:
        return []
    return [(entry_marker("0.4", "o", filled=False), "points at one place are set side by side "
             "(the data file keeps their values)")]


# ---- laying out ------------------------------------------------------------------------------------
def _height(artist, renderer, dpi) -> float:
    return artist.get_window_extent(renderer).height / dpi


def _fit_labels(fig, renderer) -> bool:
    """Axis labels fit their panels: an x label wider than its panel, or a y label taller,
    is broken into lines that fit. Returns whether any changed."""
    changed = False
    for ax in fig.axes:
        box = ax.get_window_extent(renderer)
        for label, room, along in ((ax.xaxis.label, box.width, "width"), (ax.yaxis.label, box.height, "height")):
            text = label.get_text()
            if not text:
                continue
            length = getattr(label.get_window_extent(renderer), along)
            if length > room:
                per_char = length / max(len(line) for line in text.split("\n"))
                joined = " ".join(text.split())
                n = max(2, math.ceil(per_char * len(joined) / room))
                for width in range(math.ceil(len(joined) / n), len(joined) + 1):
                    lines = textwrap.wrap(joined, width, break_on_hyphens=False)
                    if len(lines) <= n:
                        label.set_text("\n".join(lines))
                        changed = True
                        break
    return changed


def _legends(fig, blocks, width: float) -> list:
    """The legend blocks, each in as many columns as fit the width, labels wrapped to it."""
    font = style.LEGEND_FONT
    out = []
    for title, entries in blocks:
        handles = [h for h, _ in entries]
        longest = max(len(label) for _, label in entries) * CHAR_WIDTH * font / 72  # inches, on one line
        for ncol in range(min(len(entries), 4), 0, -1):
            room = (width - 2 * PAD) / ncol - 0.45  # inches per column's text (handle and spacing apart)
            if longest <= room:
                break
        labels = [wrap(label, room, font) for _, label in entries]  # (with one column: lines that fit)
        from matplotlib.legend_handler import HandlerTuple

        legend = fig.legend(handles, labels, loc="upper left", bbox_to_anchor=(0.0, 0.0), ncol=ncol,
                            title=title, frameon=False, fontsize=font, title_fontsize=font, handletextpad=0.5,
                            columnspacing=1.2, alignment="left", borderaxespad=0.0, borderpad=0.2,
                            handler_map={tuple: HandlerTuple(ndivide=None)})
        out.append(legend)
    return out


def finish(fig, blocks: list[tuple[str | None, list[tuple]]]) -> None:
    """Lay the figure out: the title and caveat on top, the panels, the legend blocks
    below (side by side while they fit), every text inside the figure's width; the
    figure's height follows from what it holds."""
    frame: Frame = fig._sameloss_frame
    width = fig.get_figwidth()
    dpi = fig.dpi
    title = fig.text(0.5, 1.0, wrap(frame.title, width - 2 * PAD, style.STYLE["figure.titlesize"]), ha="center",
                     va="top", fontsize=style.STYLE["figure.titlesize"])
    caveat = None
    if frame.caveat:
        caveat = fig.text(0.5, 1.0, wrap(f"Caveat: {frame.caveat}", width - 2 * PAD, 7.5), ha="center", va="top",
                          fontsize=7.5, color=style.CAVEAT_COLOR, fontweight="bold")
        caveat.set_gid("caveat")
    legends = _legends(fig, [(t, e) for t, e in blocks if e], width)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    for text in (title, caveat):  # measured, not estimated: bold text runs wider
        if text is not None:
            _fit_width(text, renderer, (width - 2 * PAD) * dpi)
    for _ in range(4):
        head = PAD + _height(title, renderer, dpi) + (GAP / 2 + _height(caveat, renderer, dpi) if caveat else 0.0)
        rows = _pack(legends, renderer, dpi, width)
        legend_h = sum(h for _, h in rows) + GAP * len(rows)
        height = head + GAP + frame.rows * frame.panel_height + legend_h + PAD
        fig.set_figheight(height)
        title.set_position((0.5, 1 - PAD / height))
        if caveat is not None:
            caveat.set_position((0.5, 1 - (PAD + _height(title, renderer, dpi) + GAP / 2) / height))
        rect = (PAD / width, (legend_h + PAD) / height, 1 - PAD / width, 1 - (head + GAP) / height)
        _tight(fig, rect)
        if not _fit_labels(fig, renderer):
            break
        _tight(fig, rect)
    _place(fig, rows, renderer, width)
    fig.canvas.draw()
    _fit_notes(fig, renderer)
    # the panels' own texts may reach below the rect (long tick labels): grow to hold them all
    low = min(ax.get_tightbbox(renderer).y0 for ax in fig.axes) / dpi
    bottom = min([low] + [lg.get_window_extent(renderer).y0 / dpi for lg in legends])
    if bottom < PAD / 2:
        grow = PAD - bottom
        _shift_down(fig, grow)
        fig.canvas.draw()


def _fit_notes(fig, renderer) -> None:
    """A note beside a point (a row with no interval, a missing value) stays inside its panel,
    measured at the panel's final size: beside the point on a side with room for it, else
    under the point, centred and held inside the panel (a note as wide as half a narrow panel
    would otherwise run into the row labels)."""
    dpi = fig.dpi
    pad = 4 * dpi / 72
    for ax in fig.axes:
        box = ax.get_window_extent(renderer)
        for note in [t for t in ax.texts if t.get_gid() == "note"]:
            ext = note.get_window_extent(renderer)
            if box.x0 <= ext.x0 and ext.x1 <= box.x1:
                continue
            at = ax.transData.transform(note.xy)[0]  # notes are placed in data coordinates
            w = ext.width
            if at + pad + w <= box.x1:
                note.set_horizontalalignment("left")
                note.xyann = (4, 0)
            elif at - pad - w >= box.x0:
                note.set_horizontalalignment("right")
                note.xyann = (-4, 0)
            else:
                centre = min(max(at, box.x0 + w / 2), box.x1 - w / 2)
                note.set_horizontalalignment("center")
                note.set_verticalalignment("top")
                note.xyann = ((centre - at) * 72 / dpi, -4)
                # under the point it may cross the 0 line or a reference: the line stops at the words
                note.set_bbox({"facecolor": "white", "edgecolor": "none", "pad": 0.5})
    fig.canvas.draw()


def _tight(fig, rect) -> None:
    """``tight_layout`` inside ``rect``; where it cannot fit every decoration it leaves the
    panels as they are, and says so as a matplotlib warning that is no user's business (the
    tests check that every text stays inside the figure)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        fig.tight_layout(rect=rect, pad=0.2, h_pad=0.6, w_pad=0.6)
    fig.canvas.draw()


def _fit_width(text, renderer, room: float) -> None:
    """Break ``text`` (a figure text) into shorter lines until it is at most ``room``
    pixels wide."""
    joined = " ".join(text.get_text().split())
    chars = max(len(line) for line in text.get_text().split("\n"))
    while text.get_window_extent(renderer).width > room and chars > 10:
        chars = int(chars * 0.92)
        text.set_text(textwrap.fill(joined, chars, break_on_hyphens=False))


def _pack(legends, renderer, dpi, width) -> list[tuple[list, float]]:
    """Legend blocks in rows that fit the width: [(legends, row height in inches)]."""
    rows: list[tuple[list, float]] = []
    current, used = [], 0.0
    for legend in legends:
        box = legend.get_window_extent(renderer)
        w, h = box.width / dpi, box.height / dpi
        if current and used + GAP + w > width - 2 * PAD:
            rows.append((current, max(x[2] for x in current)))
            current, used = [], 0.0
        current.append((legend, w, h))
        used += w + (GAP if used else 0.0)
    if current:
        rows.append((current, max(x[2] for x in current)))
    return [([x[0] for x in row], h) for row, h in rows]


def _place(fig, rows, renderer, width) -> None:
    """The legend rows under the panels, each row centred."""
    dpi = fig.dpi
    height = fig.get_figheight()
    top = min(ax.get_tightbbox(renderer).y0 for ax in fig.axes) / dpi - GAP
    for legends, h in rows:
        widths = [lg.get_window_extent(renderer).width / dpi for lg in legends]
        x = max(PAD, (width - sum(widths) - GAP * (len(widths) - 1)) / 2)
        for legend, w in zip(legends, widths):
            legend.set_bbox_to_anchor((x / width, top / height), transform=fig.transFigure)
            x += w + GAP
        top -= h + GAP


def _shift_down(fig, inches: float) -> None:
    """Make the figure ``inches`` taller at the bottom, everything keeping its place."""
    old = fig.get_figheight()
    new = old + inches
    fig.set_figheight(new)
    scale, lift = old / new, inches / new
    for ax in fig.axes:
        box = ax.get_position()
        ax.set_position([box.x0, box.y0 * scale + lift, box.width, box.height * scale])
    for text in fig.texts:
        x, y = text.get_position()
        text.set_position((x, y * scale + lift))
    for legend in fig.legends:
        anchor = legend.get_bbox_to_anchor().transformed(fig.transFigure.inverted())
        legend.set_bbox_to_anchor((anchor.x0, anchor.y0 * scale + lift), transform=fig.transFigure)


__all__ = ["Frame", "band_entries", "bar_entries", "dodge_entries", "entry_line", "entry_marker", "entry_range",
           "finish", "first_in_row", "letters", "new_figure", "ref_entries", "wrap"]
