"""The rules every sameloss figure keeps (``experiments/plots.py``), checked on what a
figure plots: its saved numbers (``<stem>.data.csv``) and its matplotlib artists.

* no bar charts: no bar container, no rectangle patch in any panel;
* every axis stays inside its quantity's range (accuracy 0–100 %, KL / losses / traces of
  PSD matrices / MSE >= 0), and so does every point and every drawn end of an error bar;
* the exact KL is on a log axis;
* every panel that draws error bars has a legend entry "<axis label>: <what the bars are>",
  and a bar cut at its range ends in a triangle that the legend explains;
* the saved numbers are the drawn ones (the points of each panel, its limits, its scales);
* the axis labels of side-by-side panels do not overlap, and no y label is taller than its
  panel;
* journal-ready (issue 39): every text drawn is at least ``MIN_FONT`` points and lies
  inside the figure (which is saved at exactly its width: nothing is cut).
"""

from __future__ import annotations

import csv
import math
import re
import xml.etree.ElementTree as ET
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.container import BarContainer
from matplotlib.patches import Rectangle

from sameloss.experiments.reports.plots import DATA_COLUMNS, MIN_FONT, quantity

KINDS = {"axes", "point", "ref-x", "ref-y", "fit", "text", "offaxis", "mde", "band-x", "band-y"}
NUMERIC_SCALES = {"linear", "log"}


def read_data(path: str | Path) -> list[dict]:
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        assert tuple(reader.fieldnames) == DATA_COLUMNS
        return list(reader)


def _f(text: str) -> float | None:
    return float(text) if text not in ("", None) else None


def _bounds(q: str) -> tuple[float, float]:
    if not q or q == "category" or q.startswith("difference of"):
        return -math.inf, math.inf
    b = quantity(q)
    return b.lo, b.hi


def check_data(path: str | Path) -> list[dict]:
    """The rules on a figure's data file; returns its rows."""
    rows = read_data(path)
    kinds = {r["kind"] for r in rows}
    assert kinds <= KINDS, kinds - KINDS  # never a bar
    axes = {r["panel"]: r for r in rows if r["kind"] == "axes"}
    assert axes, f"{path}: no panel"
    eps = 1e-9
    for panel, a in axes.items():
        for axis in ("x", "y"):
            q, scale = a[f"{axis}_quantity"], a[f"{axis}_scale"]
            if scale == "category":
                continue
            assert scale in NUMERIC_SCALES, scale
            if q in ("kl", "log_kl"):
                assert scale == "log", f"{path} panel {panel}: the exact KL on a {scale} axis"
            lo, hi = _bounds(q)
            lim_lo, lim_hi = float(a[f"{axis}_low"]), float(a[f"{axis}_high"])
            assert lim_lo >= lo - eps and lim_hi <= hi + eps, \
                f"{path} panel {panel}: the {axis} axis [{lim_lo}, {lim_hi}] runs past {q}'s range [{lo}, {hi}]"
            if scale == "log":
                assert lim_lo > 0
    for r in rows:
        if r["kind"] != "point":
            continue
        a = axes[r["panel"]]
        for axis in ("x", "y"):
            if a[f"{axis}_scale"] == "category":
                continue
            lo, hi = _bounds(a[f"{axis}_quantity"])
            lim_lo, lim_hi = float(a[f"{axis}_low"]), float(a[f"{axis}_high"])
            for k in (axis, f"{axis}_low", f"{axis}_high"):
                v = _f(r[k])
                if v is None:
                    continue
                assert lo - eps <= v <= hi + eps, f"{path}: {r['series']} {k} = {v} outside [{lo}, {hi}]"
                assert lim_lo - 1e-9 * abs(lim_lo) <= v <= lim_hi + 1e-9 * abs(lim_hi), \
                    f"{path}: {r['series']} {k} = {v} is drawn outside the axis [{lim_lo}, {lim_hi}]"
            for end in ("low", "high"):
                if f"{axis}_{end}" in r["cut"].split():  # a cut end sits at the range or at the log axis's start
                    v = float(r[f"{axis}_{end}"])
                    assert v in (lo, hi) or v == lim_lo, (r, v)
    return rows


def _stem(label: str) -> str:
    label = " ".join(label.split())  # a label broken into lines to fit its panel
    return re.sub(r"\s*\([^()]*\)\s*$", "", label) or label


def legend_texts(fig) -> list[str]:
    """The legends' entries, each on one line (a long one is broken into lines to fit the width)."""
    legends = list(fig.legends) + [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]
    return [" ".join(t.get_text().split()) for legend in legends for t in legend.get_texts()]


def _bar_directions(ax) -> set[str]:
    """"x" / "y" for the error bars an axes draws with a non-zero length."""
    out = set()
    for c in ax.collections:
        if c.get_gid() != "errorbar":
            continue
        for seg in c.get_segments():
            (x0, y0), (x1, y1) = seg[0], seg[-1]
            if x0 != x1:
                out.add("x")
            if y0 != y1:
                out.add("y")
    return out


def check_artists(fig) -> None:
    """The rules on the drawn figure."""
    texts = legend_texts(fig)
    canvas = fig.canvas if hasattr(fig.canvas, "get_renderer") else FigureCanvasAgg(fig)  # a saved figure is closed
    canvas.draw()
    renderer = canvas.get_renderer()
    rows: dict[float, list] = {}  # panels side by side: one row of the figure's grid
    for ax in fig.axes:
        rows.setdefault(round(ax.get_position().y1, 3), []).append(ax)
    for row in rows.values():
        row.sort(key=lambda ax: ax.get_position().x0)
        boxes = [ax.xaxis.label.get_window_extent(renderer) for ax in row if ax.get_xlabel()]
        for a, b in zip(boxes, boxes[1:]):  # legible: side-by-side panels' axis labels do not overlap
            assert a.x1 <= b.x0, "axis labels of neighbouring panels overlap"
    check_texts(fig, renderer)
    for ax in fig.axes:  # nor does a y label run past its panel (into the title)
        if ax.get_ylabel():
            assert ax.yaxis.label.get_window_extent(renderer).height <= ax.get_window_extent(renderer).height, \
                f"the y label {ax.get_ylabel()!r} is taller than its panel"
    for ax in fig.axes:
        assert not any(isinstance(c, BarContainer) for c in ax.containers), "a bar chart"
        assert not any(isinstance(p, Rectangle) for p in ax.patches), "a bar (rectangle) in a panel"
        for direction in _bar_directions(ax):
            label = ax.get_xlabel() if direction == "x" else ax.get_ylabel()
            stem = _stem(label)
            assert any(t.startswith(f"{stem}: ") and ("±" in t or "interval" in t) for t in texts), \
                f"error bars of {label!r} not labelled in the legend: {texts}"
        if any(line.get_gid() == "cut" for line in ax.get_lines()):
            assert "bar cut at the end of the quantity's range" in texts


def drawn_texts(fig) -> list:
    """Every text the figure draws: its own texts (title, caveat), legends, and per panel
    the title, axis labels, tick labels of ticks in view and annotations."""
    out = list(fig.texts)
    for legend in fig.legends:
        out += [*legend.get_texts(), legend.get_title()]
    for ax in fig.axes:
        out += [ax.title, ax._left_title, ax._right_title, ax.xaxis.label, ax.yaxis.label, *ax.texts]
        for axis, (lo, hi) in ((ax.xaxis, sorted(ax.get_xlim())), (ax.yaxis, sorted(ax.get_ylim()))):
            out += [t.label1 for t in axis.get_major_ticks() if lo <= t.get_loc() <= hi]
    return [t for t in out if t.get_visible() and t.get_text().strip()]


def check_texts(fig, renderer) -> None:
    """No text under ``MIN_FONT`` points, none outside the figure (measured as it is saved:
    the package's style, unhinted text)."""
    import matplotlib.pyplot as plt

    from sameloss.experiments.reports.plots.style import STYLE

    width, height = fig.bbox.width, fig.bbox.height
    with plt.rc_context(STYLE):
        fig.canvas.draw()
        _inside(fig, renderer, width, height)


def _inside(fig, renderer, width, height) -> None:
    for t in drawn_texts(fig):
        assert t.get_fontsize() >= MIN_FONT - 1e-9, f"{t.get_text()!r} at {t.get_fontsize()} pt"
        box = t.get_window_extent(renderer)
        assert box.x0 >= -1 and box.y0 >= -1 and box.x1 <= width + 1 and box.y1 <= height + 1, \
            f"{t.get_text()!r} runs outside the figure: {box} in {width} x {height}"


def drawn_points(ax) -> list[tuple[float, float]]:
    return sorted((float(x), float(y)) for line in ax.get_lines() if line.get_gid() == "point"
                  for x, y in zip(line.get_xdata(), line.get_ydata()))


def check_matches(fig, rows: list[dict]) -> None:
    """The data file holds exactly the drawn points and the drawn limits and scales."""
    axes = {int(r["panel"]): r for r in rows if r["kind"] == "axes"}
    assert sorted(axes) == list(range(len(fig.axes)))
    for i, ax in enumerate(fig.axes):
        a = axes[i]
        assert a["x_scale"] == ax.get_xscale()
        assert (float(a["x_low"]), float(a["x_high"])) == tuple(float(v) for v in ax.get_xlim())
        if a["y_scale"] != "category":
            assert a["y_scale"] == ax.get_yscale()
            assert (float(a["y_low"]), float(a["y_high"])) == tuple(sorted(float(v) for v in ax.get_ylim()))
            saved = sorted((float(r["x"]), float(r["y"])) for r in rows if r["kind"] == "point" and int(r["panel"]) == i)
            assert saved == drawn_points(ax)
        else:
            saved = sorted(float(r["x"]) for r in rows if r["kind"] == "point" and int(r["panel"]) == i)
            assert saved == sorted(x for x, _ in drawn_points(ax))


def check_figure(fig, data_path: str | Path) -> list[dict]:
    """Every rule, on the artists and on the saved data, and that the two agree."""
    rows = check_data(data_path)
    check_artists(fig)
    check_matches(fig, rows)
    return rows


def check_report_figures(root: Path) -> int:
    """Every figure a report embeds exists, has its data file beside it (which keeps the
    rules), and a caption that says what its error bars are when it draws any; returns the
    number of figures."""
    report = (root / "report.md").read_text()
    found = re.findall(r"!\[[^\]]*\]\(([^)]+)\)  \n\*\*Figure (\d+)\.\*\* (.*)", report)
    assert found, "no figure"
    assert [int(n) for _, n, _ in found] == list(range(1, len(found) + 1))  # numbered through the report
    for name, _, caption in found:
        assert (root / name).stat().st_size > 1000
        data = root / f"{Path(name).stem}.data.csv"
        assert f"plotted numbers: [{data.name}]({data.name})" in caption
        rows = check_data(data)
        has_bars = any(r[k] for r in rows if r["kind"] == "point" for k in ("x_low", "x_high", "y_low", "y_high"))
        assert ("Error bars: " in caption) == has_bars, caption
        assert "Tests: " in caption
    return len(found)


# ---- the files a journal gets (issue 39) ----------------------------------------------------------
JOURNAL_FONTS = {"Type0", "CIDFontType2", "TrueType"}  # TrueType outlines (``pdf.fonttype`` 42); never Type3


def pdf_fonts(path: str | Path) -> set[str]:
    """The subtypes of every font a PDF embeds (its font dictionaries are not compressed)."""
    return {m.decode() for m in re.findall(rb"/Type\s*/Font\s*/Subtype\s*/(\w+)", Path(path).read_bytes())}


def pdf_width(path: str | Path) -> float:
    """The width of a one-page PDF, in inches (its MediaBox)."""
    box = re.search(rb"/MediaBox\s*\[([^\]]*)\]", Path(path).read_bytes()).group(1).split()
    return (float(box[2]) - float(box[0])) / 72


def svg_texts(path: str | Path) -> list[str]:
    """The text of every ``<text>`` element of an SVG (real text, not glyph outlines)."""
    root = ET.parse(path).getroot()
    return [" ".join("".join(t.itertext()).split()) for t in root.iter("{http://www.w3.org/2000/svg}text")]


def check_journal_files(folder: Path, stem: str, width: float, must_say: tuple[str, ...] = ()) -> None:
    """``<stem>.pdf`` embeds only TrueType fonts and is ``width`` inches wide; ``<stem>.svg``
    holds its words as ``<text>`` elements, among them each of ``must_say``, and no glyph
    outlines."""
    fonts = pdf_fonts(folder / f"{stem}.pdf")
    assert fonts and fonts <= JOURNAL_FONTS, f"{stem}.pdf embeds {fonts}"
    assert pdf_width(folder / f"{stem}.pdf") == pytest_approx(width)
    texts = svg_texts(folder / f"{stem}.svg")
    assert len(texts) >= 5, texts
    joined = " ".join(texts)
    for words in must_say:
        assert words in joined, (words, joined[:300])
    assert b"<path id=\"DejaVuSans" not in (folder / f"{stem}.svg").read_bytes()  # no text drawn as outlines


def pytest_approx(value: float):
    import pytest

    return pytest.approx(value, abs=0.01)
