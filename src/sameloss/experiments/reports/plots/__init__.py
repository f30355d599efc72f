"""The package's one plotting style: every figure of ``sameloss reproduce`` and ``sameloss plot``.

One module per kind of figure; each ``*_plot`` returns a matplotlib Figure (drawn
off-screen) and ``save_figure`` writes it:

* ``series_plot(series, x, panels, title, x_axis=XAxis(label, log=, refs=))``
  (``series.py``) — quantities against a step, a size or the KL, one line per series (the
  paper's Figs. 2–5); a panel may shade a stretch of its x axis (``Band``), for all series
  or for one (a strip of its colour);
* ``scatter_plot(rows, panels, title, encoding=Encoding(colour_by=, marker_by=, hollow=,
  join_by=))`` (``scatter.py``) — one quantity against another, one marker per model:
  colour = model size, marker = recipe, hollow = outside a tolerance, a run's checkpoints
  joined in step order, an optional fitted line per panel (``XY(fit="ols")`` or
  ``XY(fit=Fit(...))``) (Fig. 1); markers at one place set side by side;
* ``dots_plot(rows, label, panels, title)`` (``dots.py``) — one dot with its interval per
  model and quantity (Tables 1–2 as a figure);
* ``forest_plot(rows, label, panels, title)`` (``forest.py``) — paired differences with
  their 95 % intervals, the line of no difference and a band at ± each row's minimum
  detectable effect (MDE);
* ``curves_plot(runs, title)`` (``curves.py``) — training curves (train loss, exact KL or
  held-out cross-entropy, learning rate against step) of runs from their ``metrics.jsonl``.

The rest: ``style.py`` (fonts, widths, ``drawing(width=, caveat=)``), ``quantities.py``
(what a row's key means on an axis), ``axes.py`` (limits, ticks, numbers), ``panel.py``
(one panel: points, references, bands, fits; the data record), ``layout.py`` (panels in
rows that fit the width, the title and caveat, legends below), ``save.py`` (the files).

A panel names a quantity by its key in a measured row (``measures/rows.py``): the key
decides the scale (accuracies are shown in %), the range the axis may span, the unit, and
which column holds the error bar. Recipes pass ``errors=error_labels(spec)`` so that the
legend says what each bar is with the measure's own counts.

Rules every figure keeps (``tests/experiments/test_plots.py`` checks each on the drawn
artists and on the saved data):

1. every error bar says what it is: for each panel that draws bars, a legend entry
   "<quantity>: ± std over 5 probe seeds" (the report's caption repeats it), its glyph
   running as the bars run; a bar cut at the end of its quantity's range ends in a
   triangle (▼▲◀▶, the legend shows the ones drawn) instead of a cap;
2. no bar charts: a value is a dot, its interval a line;
3. axes stay inside a quantity's range: accuracies 0–100 %, losses, KL, traces of positive
   semi-definite matrices, counts and MSEs >= 0;
4. the exact KL is on a log axis; the optimum is named: a dashed line at the entropy where
   a loss is plotted, "loss = entropy + KL" where the KL is;
5. every figure names its estimator (the trace's on its axis: ``TRACE_FISHER``; a fitted
   slope's interval in its legend), its error bars and its reference (a difference says
   "recipe − reference"; a demeaned quantity "− seed mean");
6. scatter plots colour by model size and mark by recipe (as the paper's Figs. 1, 3, 5);
   a series keeps its colour, marker and dashes in every panel; panels are lettered
   (a), (b), … and a series or reference line drawn in some panels only says which;
7. log axes have labelled ticks that bracket the data; step axes have integer ticks;
8. the legends sit below the panels (they cover no point);
9. journal-ready: TrueType fonts in PDF, ``<text>`` in SVG, the figure exactly
   ``--figure-width`` wide (``column`` 3.25 in, ``page`` 6.75 in) with no text under 7 pt;
   a figure of a smoke run, or of a study whose headroom gate failed, says so under its
   title (``drawing(caveat=...)`` or a plot's ``caveat=``).
"""

from ..document import FORMATS, parse_formats  # (there: the CLI reads them without importing torch)
from .axes import interval_text, log_limits
from .curves import curves_plot
from .dots import dots_plot
from .forest import Forest, forest_plot
from .panel import Band, Fit, Ref
from .quantities import Quantity, describe_error, error_labels, quantity, with_unit
from .save import (DATA_COLUMNS, SavedFigure, data_path, figure_bytes, figure_data, is_sameloss_data,
    is_sameloss_figure, majority_ref, remove_stale, save_figure, write_file)
from .scatter import XY, Encoding, scatter_plot
from .series import Panel, XAxis, series_plot
from .style import DPI, MIN_FONT, TAG, TRACE_FISHER, TRACE_HUTCHINSON, TRACE_HUTCHPP, WIDTHS, current, drawing

__all__ = ["Band", "DATA_COLUMNS", "DPI", "Encoding", "FORMATS", "Fit", "Forest", "MIN_FONT", "Panel", "Quantity",
           "Ref", "SavedFigure", "TAG", "TRACE_FISHER", "TRACE_HUTCHINSON", "TRACE_HUTCHPP", "WIDTHS", "XAxis", "XY",
           "current", "curves_plot", "data_path", "describe_error", "dots_plot", "drawing", "error_labels",
           "figure_bytes", "figure_data", "forest_plot", "interval_text", "is_sameloss_data", "is_sameloss_figure",
           "log_limits", "majority_ref", "parse_formats", "quantity", "remove_stale", "save_figure", "scatter_plot",
           "series_plot", "with_unit", "write_file"]
