"""The look every figure shares: fonts a journal takes, the widths a paper sets figures at,
and the settings a figure is drawn under (its width, a caveat it must show).

* Fonts: TrueType in PDF and PostScript (``pdf.fonttype`` 42: venues reject Type 3 fonts),
  real ``<text>`` elements in SVG (``svg.fonttype`` "none": editable); every text at
  ``MIN_FONT`` points or more at the figure's own width, so it prints at that size when
  the figure is set at the paper's column or text width unscaled.
* Widths: ``WIDTHS`` — ``column`` (3.25 in, one column of a two-column paper) and
  ``page`` (6.75 in, the text width; the default). A figure is drawn at that width and
  saved at it (no ``bbox_inches="tight"``, which would change it): its panels wrap into
  rows that fit, its labels and legends break into lines that fit.
* ``drawing(width=, caveat=)``: the settings of the figures drawn inside it (a
  ``contextvars`` value: ``reproduce`` sets the width from ``--figure-width`` and, for a
  smoke run, the caveat that its numbers mean nothing; a recipe adds its own, e.g. a
  study whose headroom gate failed). The caveat is printed on the figure, under its title.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from dataclasses import dataclass

from ..document import FIGURE_WIDTHS as WIDTHS  # inches: one column / the text width of a paper (the CLI reads it)

DPI = 200  # PNG; PDF and SVG are vector
TAG = "sameloss-figure"  # in every written image's metadata: ``is_sameloss_figure``
MARKERS = "osDPXph*d"  # no triangles: they mark a cut error bar
# series colours: matplotlib's tab10, then the dark shade of each of tab20b's five hues and the
# middle shade of each — 20 colours that stay apart, so a figure of up to 20 series never gives
# two the same colour (tab10's C0..C9 wrap after ten: the base and a fork shared one)
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf", "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#6b6ecf", "#b5cf6b", "#e7ba52",
           "#d6616b", "#ce6dbd")
LINESTYLES = ("-", "--", ":", "-.")  # lines that coincide stay distinguishable
TRACE_FISHER = "tr(H), Fisher estimator (App. B.1)"  # the paper's estimator, named on its axis
TRACE_HUTCHINSON = "tr(H), Hutchinson (true tokens)"
TRACE_HUTCHPP = "tr(H), Hutch++ (true tokens)"

DEFAULT_WIDTH = "page"
MIN_FONT = 7.0  # points, at the figure's width: the smallest any text is drawn
LEGEND_FONT = 7.0
NOTE_FONT = 7.0  # texts written in a panel (a missing value, a zero spread)
STYLE = {"font.size": 7.5, "axes.titlesize": 8, "axes.labelsize": 7.5, "xtick.labelsize": 7, "ytick.labelsize": 7,
         "legend.fontsize": LEGEND_FONT, "legend.title_fontsize": LEGEND_FONT, "figure.titlesize": 8.5,
         "pdf.fonttype": 42, "ps.fonttype": 42, "svg.fonttype": "none",
         # no hinting: a text's width is the same at every resolution (hinted at 100 dpi it is 5 %
         # narrower than in the 200-dpi PNG, so a text measured to fit would run off the figure)
         "text.hinting": "none",
         "axes.linewidth": 0.6, "xtick.major.width": 0.6, "ytick.major.width": 0.6, "xtick.major.size": 2.5,
         "ytick.major.size": 2.5, "xtick.minor.size": 1.5, "ytick.minor.size": 1.5, "lines.linewidth": 1.0,
         "axes.grid": True, "grid.alpha": 0.3, "grid.linewidth": 0.5, "axes.spines.top": False,
         "axes.spines.right": False, "axes.titlepad": 3.0, "axes.labelpad": 2.0}
CAVEAT_COLOR = "#b2182b"  # a caveat is written in red under the title


@dataclass(frozen=True)
class Drawing:
    """The settings of the figures being drawn: their ``width`` (a key of ``WIDTHS``) and
    the ``caveat`` each must show (None: none)."""

    width: str = DEFAULT_WIDTH
    caveat: str | None = None

    @property
    def inches(self) -> float:
        return WIDTHS[self.width]


_DRAWING: contextvars.ContextVar[Drawing] = contextvars.ContextVar("sameloss_figures", default=Drawing())


def current() -> Drawing:
    return _DRAWING.get()


@contextlib.contextmanager
def drawing(width: str | None = None, caveat: str | None = None):
    """Draw the figures inside at ``width`` (``column`` or ``page``), each showing
    ``caveat`` (added to any caveat already in force)."""
    now = _DRAWING.get()
    if width is not None and width not in WIDTHS:
        raise ValueError(f"unknown figure width {width!r}; choose from {', '.join(WIDTHS)}")
    caveats = [c for c in (now.caveat, caveat) if c]
    token = _DRAWING.set(Drawing(width or now.width, "; ".join(dict.fromkeys(caveats)) or None))
    try:
        yield
    finally:
        _DRAWING.reset(token)


def plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as pyplot
    return pyplot


def styled(plot):
    """Draw under the package's style (``STYLE``: fonts, grid, spines)."""

    @functools.wraps(plot)
    def wrapper(*args, **kwargs):
        with plt().rc_context(STYLE):
            return plot(*args, **kwargs)
    return wrapper


__all__ = ["DEFAULT_WIDTH", "DPI", "Drawing", "LINESTYLES", "MARKERS", "MIN_FONT", "STYLE", "TAG", "TRACE_FISHER",
           "TRACE_HUTCHINSON", "TRACE_HUTCHPP", "WIDTHS", "current", "drawing", "styled"]
