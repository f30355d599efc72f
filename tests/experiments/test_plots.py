"""The package's plotting style (issue 27; before it issue 10, item 13): one test per kind
of figure, each reading the figure back — its artists and its saved ``<stem>.data.csv`` —
and checking the rules of ``experiments/plots.py`` (``helpers/figures.py``): no bars, axes
and error bars inside a quantity's range, the KL on a log axis, every error bar labelled,
the saved numbers equal to the drawn ones; and the kind's own promises (colour by size,
marker by recipe, the MDE marked, the optimum marked, ...)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from helpers.figures import (check_artists, check_data, check_figure, check_journal_files, drawn_points,
                             legend_texts)

from sameloss.errors import UserError
from sameloss.experiments.reports.plots import (DPI, TAG, TRACE_FISHER, WIDTHS, XY, Band, Encoding, Fit, Forest,
    Panel, Ref, XAxis, curves_plot, dots_plot, drawing, error_labels, forest_plot, interval_text, is_sameloss_data,
    is_sameloss_figure, log_limits, majority_ref, parse_formats, save_figure, scatter_plot, series_plot)
from sameloss.experiments.reports.document import Figure


def _steps_rows(kls, probe=0.05, probe_std=0.12):
    return [{"step": 1000 + 250 * i, "kl": v, "kl_std": 0.01, "trace_fisher": 20 - i, "trace_fisher_se": 0.5,
             "probe_B": probe + 0.01 * i, "probe_B_std": probe_std, "B_majority": 0.3} for i, v in enumerate(kls)]


STEPS = {"AdamW": _steps_rows([0.31, 0.2, 0.14, 0.12, 0.11]), "SGD": _steps_rows([0.9, 0.7, 0.5, 0.45, 0.4])}
STEPS_PANELS = [Panel("kl", "exact KL to the true conditionals (nats)", refs=(Ref(0.15, "same-loss tolerance"),)),
                Panel("trace_fisher", TRACE_FISHER),
                Panel("probe_B", "probe accuracy, task B", refs=majority_ref(STEPS["AdamW"], "B"))]


def _saved(fig, tmp_path, stem="fig", formats=("png",)):
    saved = save_figure(fig, tmp_path, stem, formats)
    return saved, check_figure(fig, tmp_path / saved.data)


# ---- log axes ------------------------------------------------------------------------------
@pytest.mark.parametrize("lo, hi", [
    (1.30, 1.47),     # within a decade
    (0.88, 1.47),     # straddles 1
    (1.21, 1.26),     # a few percent
    (0.0031, 0.48),   # two decades
    (0.011, 0.29),    # the sizes figure's case: the top KL point above the last labelled tick
    (903, 106_000),   # parameter counts
])
def test_log_axis_ticks_bracket_the_data(lo, hi):
    low, high, ticks = log_limits(lo, hi)
    assert len(ticks) >= 3
    assert ticks[0] <= lo and ticks[-1] >= hi  # a labelled tick at or beyond each end of the data
    assert low < ticks[0] and ticks[-1] < high
    assert math.log10(hi / lo) >= 0.5 * math.log10(ticks[-1] / ticks[0]) or lo == hi  # the data fill the axis
    span = math.log10(high / low)
    assert min(math.log10(b / a) for a, b in zip(ticks, ticks[1:])) >= span / 7 * (1 - 1e-9)  # labels apart


# ---- series -------------------------------------------------------------------------------
def test_series_figure_keeps_the_rules(tmp_path):
    fig = series_plot(STEPS, "step", STEPS_PANELS, "pcfg: past convergence",
                      x_axis=XAxis(refs=(Ref(1500, "AdamW: KL ≤ 0.15 from step 1500", axis="x"),)),
                      errors=error_labels())
    saved, rows = _saved(fig, tmp_path)
    kl, trace, probe = fig.axes
    assert kl.get_yscale() == "log"
    # a probe's std (12 %) above its mean (5 %): the bar stops at 0 and ends in a triangle there
    cuts = [line for line in probe.get_lines() if line.get_gid() == "cut"]
    assert cuts and all(float(y) == 0.0 and line.get_marker() == "v" for line in cuts for y in line.get_ydata())
    assert all(r["cut"] == "y_low" for r in rows if r["kind"] == "point" and r["panel"] == "2")
    assert probe.get_ylim()[0] == 0.0 and probe.get_ylim()[1] <= 100
    # steps are integers on their axis
    kl.figure.canvas.draw()
    assert all(float(t).is_integer() for t in kl.get_xticks())
    # the caption's words for the bars come from the legend
    assert "probe accuracy, task B: ± std over probe seeds" in legend_texts(fig)
    assert "probe accuracy, task B: ± std over probe seeds" in saved.bars
    assert "cut at the end" in saved.bars
    # reference lines: the tolerance (horizontal, KL panel), the saturation step (every panel)
    assert {(r["kind"], r["panel"]) for r in rows if r["series"] == "AdamW: KL ≤ 0.15 from step 1500"} == \
        {("ref-x", "0"), ("ref-x", "1"), ("ref-x", "2")}
    assert [r["y"] for r in rows if r["kind"] == "ref-y" and r["panel"] == "0"] == ["0.15"]


def test_a_band_shades_a_window_of_steps_and_is_saved(tmp_path):
    """isoloss's curves: the matching window shaded (a polygon across the panel, never a bar),
    inside the axis limits even beyond the data, named in the legend, in the data file."""
    window = Band(2500, 3000, "matching window")
    fig = series_plot(STEPS, "step", [Panel("kl", "exact KL (nats)", bands=(window,)), Panel("trace_fisher", TRACE_FISHER)],
                      "t")
    _, rows = _saved(fig, tmp_path)  # check_figure: no rectangle patch, the rules hold
    kl, trace = fig.axes
    shaded = [c for c in kl.collections if c.get_gid() == "band"]
    assert len(shaded) == 1 and not [c for c in trace.collections if c.get_gid() == "band"]
    xs = shaded[0].get_paths()[0].vertices[:, 0]
    assert (xs.min(), xs.max()) == (2500, 3000)
    assert kl.get_xlim()[1] >= 3000 > max(r["step"] for rs in STEPS.values() for r in rs)  # the limits include it
    assert "matching window" in legend_texts(fig)
    assert [(r["kind"], r["panel"], float(r["x_low"]), float(r["x_high"])) for r in rows if r["kind"].startswith("band")] \
        == [("band-x", "0", 2500.0, 3000.0)]


def test_a_long_series_carries_a_few_markers_each_line_its_own(tmp_path):
    """Issue 62: a fork's stretch evaluated every few steps drew a marker on every point, and
    the lines' markers hid each other; a long line now carries about six, spread along it and
    shifted per series (so coinciding lines still show each), and a series may be a plain line
    (the base: no marker, its own width)."""
    rows = [{"step": 1000 + 20 * i, "kl": 0.005 - 1e-6 * i} for i in range(40)]
    series = {"base": [{"step": 500, "kl": 0.02}, {"step": 1000, "kl": 0.01}], "a": rows, "b": rows}
    fig = series_plot(series, "step", [Panel("kl", "exact KL (nats)")], "curves",
                      styles={"base": {"color": "0.15", "marker": "", "style": "-", "width": 1.8}})
    lines = dict(zip(series, [line for line in fig.axes[0].get_lines() if line.get_gid() == "point"]))  # in order
    marks = {name: lines[name].get_markevery() for name in ("a", "b")}
    assert all(m is not None and 4 <= len(m) <= 6 for m in marks.values()) and marks["a"] != marks["b"]
    assert lines["base"].get_marker() in ("", "None", None) and lines["base"].get_linewidth() == 1.8
    assert lines["base"].get_linestyle() == "-"


def test_a_series_drawn_in_some_panels_says_which():
    own = _steps_rows([0.3, 0.2])
    embedded = [{"step": r["step"], "trace_fisher": 10.0, "trace_fisher_se": 0.2} for r in own]
    fig = series_plot({"model": own, "embedded": embedded}, "step", STEPS_PANELS, "t")
    assert "model" in legend_texts(fig) and "embedded (panel b)" in legend_texts(fig)
    check_artists(fig)


def test_legends_cover_no_panel():
    fig = series_plot(STEPS, "step", STEPS_PANELS, "t", errors=error_labels())
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    assert fig.legends
    for legend in fig.legends:
        for ax in fig.axes:
            assert not legend.get_window_extent(renderer).overlaps(ax.get_window_extent(renderer))


# ---- scatter --------------------------------------------------------------------------------
def _models():
    """Figure 1's models: two sizes, three recipes, a run with several checkpoints."""
    out = []
    for i, kl in enumerate([0.4, 0.2, 0.12, 0.1]):
        out.append({"run": "adamw", "group": "adamw", "step": 1000 + 500 * i, "parameters": 106_000, "kl": kl,
                    "kl_std": 0.01, "trace_fisher": 30 - 4 * i, "trace_fisher_se": 1, "probe_B": 0.4 + 0.02 * i,
                    "probe_B_std": 0.03})
    out.append({"run": "sgd", "group": "sgd", "step": 2500, "parameters": 106_000, "kl": 0.3, "kl_std": 0.02,
                "trace_fisher": 15, "trace_fisher_se": 1, "probe_B": 0.97, "probe_B_std": 0.06})
    out.append({"run": "d16", "group": "size", "step": 2500, "parameters": 4_000, "kl": 0.13, "kl_std": 0.01,
                "trace_fisher": 40, "trace_fisher_se": 2, "probe_B": 0.35, "probe_B_std": 0.02})
    out.append({"run": "adv", "group": "adversarial", "step": 2500, "parameters": 106_000, "kl": 0.11,
                "kl_std": 0.01, "trace_fisher": 45, "trace_fisher_se": 2, "probe_B": 0.3, "probe_B_std": 0.02})
    return out


RECIPE = {"adamw": "AdamW", "size": "AdamW", "sgd": "SGD", "adversarial": "adversarial"}


def test_scatter_figure_keeps_the_rules(tmp_path):
    models = _models()
    fig = scatter_plot(models, [XY("kl", "exact KL (nats; loss = 3.196 + KL)", "probe_B", "probe accuracy, task B",
                                   refs=(Ref(0.15, "same-loss tolerance", axis="x"),)),
                                XY("trace_fisher", TRACE_FISHER, "probe_B", "probe accuracy, task B", fit="ols")],
                       "every model",
                       encoding=Encoding(colour_by="parameters", marker_by=lambda r: RECIPE[r["group"]],
                                         hollow=lambda r: r["kl"] > 0.15, hollow_label="KL > 0.15 nats",
                                         join_by=lambda r: r["run"]),
                       errors=error_labels())
    _, rows = _saved(fig, tmp_path)
    ax = fig.axes[0]
    assert ax.get_xscale() == "log"  # the exact KL, not the loss
    points = [line for line in ax.get_lines() if line.get_gid() == "point"]
    # colour by model size: one colour per size, the same for every recipe of that size
    colour = {}
    for line in points:
        for x in line.get_xdata():
            size = next(m["parameters"] for m in models if m["kl"] == x)
            colour.setdefault(size, set()).add(tuple(line.get_color()))
    assert all(len(c) == 1 for c in colour.values()) and len({c.pop() for c in colour.values()}) == 2
    # marker by recipe; hollow outside the tolerance
    marker = {RECIPE[m["group"]]: line.get_marker() for line in points for m in models if m["kl"] in line.get_xdata()}
    assert len(set(marker.values())) == 3
    for line in points:
        outside = all(x > 0.15 for x in line.get_xdata())
        assert (line.get_markerfacecolor() == "white") == outside
    texts = legend_texts(fig)
    assert {"4000 parameters", "106k parameters", "AdamW", "SGD", "adversarial", "hollow: KL > 0.15 nats"} <= set(texts)
    # a probe at 97 ± 6 %: the axis stops at 100 and the bar's top is cut there
    assert ax.get_ylim()[1] <= 100
    sgd = next(r for r in rows if r["kind"] == "point" and r["panel"] == "0" and r["x"] == "0.3")
    assert float(sgd["y_high"]) == 100.0 and "y_high" in sgd["cut"].split()
    # the fitted line is least squares over the panel's points
    (fit,) = [r for r in rows if r["kind"] == "fit"]
    slope, intercept = np.polyfit([m["trace_fisher"] for m in models], [100 * m["probe_B"] for m in models], 1)
    x0, x1 = float(fit["x_low"]), float(fit["x_high"])
    assert float(fit["y_low"]) == pytest.approx(intercept + slope * x0)
    assert float(fit["y_high"]) == pytest.approx(intercept + slope * x1)
    assert any(t.startswith("least squares: slope") for t in texts)


def test_scatter_with_a_given_fit_and_no_size():
    rows = [{"trace_fisher": t, "probe_B": a} for t, a in ((10, 0.5), (20, 0.45), (30, 0.41))]
    fig = scatter_plot(rows, [XY("trace_fisher", TRACE_FISHER, "probe_B", "probe accuracy",
                                 fit=Fit(-0.5, 55.0, "within-seed slope −0.5 [−0.7, −0.3]"))], "t",
                       encoding=Encoding(colour_by=None))
    assert "within-seed slope −0.5 [−0.7, −0.3]" in legend_texts(fig)
    (fit,) = [line for line in fig.axes[0].get_lines() if line.get_gid() == "fit"]
    x, y = fit.get_xdata(), fit.get_ydata()
    assert np.allclose(y, 55.0 - 0.5 * np.asarray(x))
    check_artists(fig)


# ---- dots -----------------------------------------------------------------------------------
def _algorithms():
    rows = [{"algorithm": name, "kl": kl, "kl_std": 0.01, "trace_fisher": tr, "trace_fisher_se": 0.4,
             "probe_B": acc, "probe_B_std": std, "B_majority": 0.5}
            for name, kl, tr, acc, std in (("AdamW", 0.09, 8.0, 0.975, 0.006),
                                           ("adversarial (λ=0.05, task B)", 0.1, 19.3, 0.931, 0.01),
                                           ("−dropout−WD+SAM (ρ=0.05)", 0.08, 12.0, 0.99, 0.02))]
    rows.append({"algorithm": "look-up table", "kl": 0.0, "probe_B": 0.92, "probe_B_std": 0.004, "B_majority": 0.5})
    return rows


def test_dots_figure_keeps_the_rules(tmp_path):
    """The algorithms figure: once bars from 87.5 % with an axis past 100 %, an invisible bar
    for the look-up table's KL of 0 and "n/a" beside it."""
    rows = _algorithms()
    fig = dots_plot(rows, "algorithm", [Panel("kl", "exact KL to the true conditionals (nats)"),
                                        Panel("trace_fisher", TRACE_FISHER),
                                        Panel("probe_B", "probe accuracy, task B", refs=majority_ref(rows, "B"))],
                    "algorithms", errors=error_labels(), missing={"trace_fisher": "no parameters: no trace"})
    _, data = _saved(fig, tmp_path)
    kl, trace, probe = fig.axes
    assert kl.get_xscale() == "log"
    assert [t.get_text() for t in kl.get_yticklabels()] == [r["algorithm"] for r in rows]
    # the look-up table's KL of 0 is named at the log axis's start; its missing trace is said
    assert any(t.get_text() == "◀ 0" for t in kl.texts)
    assert any(t.get_text() == "no parameters: no trace" for t in trace.texts)
    assert {(r["kind"], r["y"]) for r in data if r["kind"] in ("offaxis", "text")} == \
        {("offaxis", "look-up table"), ("text", "look-up table")}
    # the recipe's axis labels are wider than these narrow panels: broken into lines (check_figure:
    # no two overlap), the data file keeps each whole
    assert "\n" in kl.get_xlabel() and " ".join(kl.get_xlabel().split()) == "exact KL to the true conditionals (nats)"
    assert [r["x_label"] for r in data if r["kind"] == "axes"][0] == "exact KL to the true conditionals (nats)"
    # accuracies: an axis inside 0–100 % (99 ± 2 % is cut at 100), the majority class marked
    assert 0 <= probe.get_xlim()[0] and probe.get_xlim()[1] <= 100
    assert any(line.get_gid() == "cut" and line.get_marker() == ">" for line in probe.get_lines())
    assert [r["x"] for r in data if r["kind"] == "ref-x" and r["panel"] == "2"] == ["50.0"]


# ---- forest -----------------------------------------------------------------------------------
def test_forest_figure_marks_zero_and_the_mde(tmp_path):
    rows = [{"contrast": "SAM − noreg", "d": -0.2, "d_low": -0.38, "d_high": -0.01, "d_mde": 0.26},
            {"contrast": "long − short", "d": 0.27, "d_low": 0.05, "d_high": 0.49, "d_mde": 0.31},
            {"contrast": "no MDE", "d": 1.0, "d_low": 0.5, "d_high": 1.5}]
    fig = forest_plot(rows, "contrast", [Forest("d", "paired difference (points)", "95 % t interval over 22 seeds")],
                      "isoloss")
    _, data = _saved(fig, tmp_path)
    ax = fig.axes[0]
    points = [r for r in data if r["kind"] == "point"]
    assert [(float(r["x"]), float(r["x_low"]), float(r["x_high"])) for r in points] == \
        [(r["d"], r["d_low"], r["d_high"]) for r in rows]
    mde = sorted((r["y"], float(r["x"])) for r in data if r["kind"] == "mde")
    assert mde == [("SAM − noreg", -0.26), ("SAM − noreg", 0.26), ("long − short", -0.31), ("long − short", 0.31)]
    assert any(line.get_gid() == "mde" for line in ax.get_lines())
    assert [r["x"] for r in data if r["kind"] == "ref-x"] == ["0.0"]
    texts = legend_texts(fig)
    assert "± MDE: the smallest effect detected with 80 % power" in texts
    assert "paired difference: 95 % t interval over 22 seeds" in texts


def test_forest_panel_draws_its_own_reference_lines(tmp_path):
    rows = [{"c": "a", "d": 0.1, "d_low": -0.2, "d_high": 0.4, "d_mde": 0.5}]
    margin = tuple(Ref(v, "±δ (equivalence margin)", style="--") for v in (-0.35, 0.35))
    fig = forest_plot(rows, "c", [Forest("d", "difference (points)", refs=margin), Forest("d", "again")], "t")
    _, data = _saved(fig, tmp_path)
    refs = sorted((r["panel"], float(r["x"])) for r in data if r["kind"] == "ref-x")
    assert refs == [("0", -0.35), ("0", 0.0), ("0", 0.35), ("1", 0.0)]  # vertical, in its panel only
    assert "±δ (equivalence margin) (panel a)" in legend_texts(fig)  # drawn in panel (a) only: it says so


# ---- training curves ----------------------------------------------------------------------------
def _records(kls, corpus=False):
    out = []
    for i, kl in enumerate(kls):
        step = 100 * (i + 1)
        ev = ({"loss": 5 - kl, "loss_std": 0.1, "kl": None, "kl_std": None} if corpus else
              {"loss": 1.15 + kl, "loss_std": 0.01, "kl": kl, "kl_std": kl / 10, "entropy": 1.15})
        out.append({"step": step, "lr": 1e-3 * min(1, step / 200), "train_loss": 1.2 + kl, "eval": ev})
    return out


def test_curves_figure_keeps_the_rules(tmp_path):
    runs = {"pcfg-adamw": _records([0.5, 0.2, 0.1]), "pcfg-sgd": _records([0.9, 0.6, 0.4]),
            "corpus-adamw": _records([0.3, 0.2, 0.1], corpus=True)}
    fig = curves_plot(runs, "curves", subsets={"pcfg-adamw": 5, "pcfg-sgd": 5})
    _, data = _saved(fig, tmp_path)
    train, kl, heldout, lr = fig.axes
    assert [" ".join(ax.get_ylabel().split()) for ax in fig.axes] == [  # a label taller than its panel: 2 lines
        "train loss (nats)", "exact KL to the true conditionals (nats)", "held-out cross-entropy (nats)", "learning rate"]
    assert kl.get_yscale() == "log"
    # the optimum, the entropy, dashed on the train loss
    assert [(r["kind"], float(r["y"])) for r in data if r["panel"] == "0" and r["kind"].startswith("ref")] == \
        [("ref-y", 1.15)]
    texts = legend_texts(fig)
    # the optimum says which panel it is drawn in (issue 39: it sat under another panel)
    assert {"pcfg-adamw", "pcfg-sgd", "corpus-adamw", "optimum: entropy 1.1500 nats (panel a)"} <= set(texts)
    assert "exact KL to the true conditionals: ± std over 5 held-out subsets" in texts
    # the KL panel holds the exact runs' evaluations, the held-out panel the corpus run's
    assert drawn_points(kl) == sorted((100.0 * (i + 1), v) for v_list in ([0.5, 0.2, 0.1], [0.9, 0.6, 0.4])
                                      for i, v in enumerate(v_list))
    assert {r["series"] for r in data if r["kind"] == "point" and r["panel"] == "2"} == {"corpus-adamw"}


# ---- writing --------------------------------------------------------------------------------------
def test_save_figure_writes_each_format_tagged_with_its_data(tmp_path):
    from PIL import Image

    fig = series_plot(STEPS, "step", STEPS_PANELS, "t")
    saved = save_figure(fig, tmp_path, "steps-pcfg", ("png", "pdf", "svg"))
    assert saved.files == ("steps-pcfg.png", "steps-pcfg.pdf", "steps-pcfg.svg")
    with Image.open(tmp_path / "steps-pcfg.png") as im:
        assert round(im.info["dpi"][0]) == DPI == 200
    assert (tmp_path / "steps-pcfg.pdf").read_bytes().startswith(b"%PDF")
    assert b"<svg" in (tmp_path / "steps-pcfg.svg").read_bytes()
    for name in saved.files:
        assert is_sameloss_figure(tmp_path / name) and TAG.encode() in (tmp_path / name).read_bytes()
    assert saved.data == "steps-pcfg.data.csv" and is_sameloss_data(tmp_path / saved.data)
    check_data(tmp_path / saved.data)
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]
    (tmp_path / "mine.png").write_bytes(b"\x89PNG not sameloss's")
    assert not is_sameloss_figure(tmp_path / "mine.png") and not is_sameloss_data(tmp_path / "mine.png")


def test_formats_are_parsed_or_refused():
    assert parse_formats("png") == ("png",)
    assert parse_formats("PDF, png,pdf") == ("pdf", "png")
    for bad in ("gif", "png,jpg", ","):
        with pytest.raises(ValueError, match="unknown figure format"):
            parse_formats(bad)


def test_a_report_figure_has_a_caption_in_parts():
    fig = Figure("steps-pcfg.png", shows="pcfg: KL, trace and accuracy against step", bars="KL: ± std over 5 subsets",
                 sample="10 checkpoints of 2 runs (seed 0)", claim="the trace falls after convergence (Fig. 4)",
                 data="steps-pcfg.data.csv", other=("steps-pcfg.pdf",))
    text = fig.markdown(3)
    assert text.startswith("![pcfg](steps-pcfg.png)  \n**Figure 3.** pcfg: KL, trace and accuracy against step. ")
    assert "Error bars: KL: ± std over 5 subsets. 10 checkpoints of 2 runs (seed 0). Tests: the trace falls" in text
    assert "plotted numbers: [steps-pcfg.data.csv](steps-pcfg.data.csv); [PDF](steps-pcfg.pdf)" in text
    assert "No error bars." in Figure("f.png", "s", "", "n", "c").caption()


def test_study_figure_writes_the_formats_it_was_given(tmp_path):
    from sameloss.experiments.engine.core import Study, StudySettings

    study = Study(tmp_path / "exp", StudySettings(progress=False, figure_formats=("svg", "png")))
    figure = study.figure(series_plot(STEPS, "step", STEPS_PANELS, "t", errors=error_labels()), "steps-x",
                          shows="s", sample="n", claim="c")
    assert (figure.file, figure.other, figure.data) == ("steps-x.svg", ("steps-x.png",), "steps-x.data.csv")
    assert "exact KL to the true conditionals: ± std over 5 held-out subsets" in figure.bars
    assert {p.name for p in (tmp_path / "exp").iterdir()} >= {"steps-x.svg", "steps-x.png", "steps-x.data.csv"}


def test_a_full_disk_while_saving_is_one_line(tmp_path, monkeypatch):
    import errno

    from sameloss import files

    def full(path, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(files, "atomic_write_bytes", full)
    with pytest.raises(UserError, match=r"cannot write .*steps\.png: No space left on device"):
        save_figure(series_plot(STEPS, "step", STEPS_PANELS, "t"), tmp_path, "steps")
    assert not list(tmp_path.iterdir())


def test_the_curvature_options_quantities_are_named_and_bounded():
    """Hutch++ (measure --trace hutchpp) has its own words for its bars, and a block's trace
    of the Fisher (--trace-by block) is kept >= 0 on its axis like the whole trace."""
    from sameloss.experiments.reports.plots import describe_error, quantity
    from sameloss.measures.run import MeasureSpec

    errors = error_labels(MeasureSpec(traces=("hutchpp",), n_probes=30))
    assert describe_error("trace_hutchpp", errors) == "± SE of Hutch++ (30 Hessian products)"
    assert describe_error("trace_hutchpp_layer0", errors) == "± SE of Hutch++ (30 Hessian products)"
    assert quantity("trace_fisher_layer0").lo == 0.0 and quantity("trace_hutchpp").lo == -math.inf


# ---- journal-grade files (issue 39) ----------------------------------------------------------------
def _every_kind() -> dict:
    models = _models()
    rows = _algorithms()
    forest = [{"c": "−dropout−WD vs AdamW · late · 16 pairs", "d": -0.2, "d_low": -0.38, "d_high": -0.01,
               "d_mde": 0.26, "d_n": 16},
              {"c": "SAM ρ 0.05 vs −dropout−WD on SAM's update half-batch · scratch · 16 pairs", "d": 0.0,
               "d_low": 0.0, "d_high": 0.0, "d_mde": 0.3, "d_n": 16}]
    return {
        "series": lambda: series_plot(STEPS, "step", STEPS_PANELS, "pcfg (micro): past convergence",
                                      errors=error_labels()),
        "scatter": lambda: scatter_plot(
            models, [XY("kl", "exact KL (nats; loss = 3.196 + KL)", "probe_B", "probe accuracy, task B"),
                     XY("trace_fisher", TRACE_FISHER, "probe_B", "probe accuracy, task B", fit="ols")],
            "every model", encoding=Encoding(marker_by=lambda r: RECIPE[r["group"]], join_by=lambda r: r["run"]),
            errors=error_labels()),
        "dots": lambda: dots_plot(rows, "algorithm", [Panel("kl", "exact KL to the true conditionals (nats)"),
                                                      Panel("trace_fisher", TRACE_FISHER),
                                                      Panel("probe_B", "probe accuracy, task B",
                                                            refs=majority_ref(rows, "B"))],
                                  "algorithms", errors=error_labels(), missing={"trace_fisher": "no parameters"}),
        "forest": lambda: forest_plot(forest, "c", [Forest("d", "primary accuracy, recipe − reference (points)",
                                                           "95 % t interval over 16 seeds"),
                                                    Forest("d", TRACE_FISHER + ", recipe − reference")],
                                      "Paired differences at one KL, recipe − reference"),
        "curves": lambda: curves_plot({"pcfg-adamw": _records([0.5, 0.2, 0.1]), "pcfg-sgd": _records([0.9, 0.6, 0.4])},
                                      "training curves", subsets={"pcfg-adamw": 5, "pcfg-sgd": 5}),
    }


@pytest.mark.parametrize("width", ["column", "page"])
def test_every_kind_is_journal_ready_at_each_width(tmp_path, width):
    """Every kind, at a paper's column and text width: the PDF embeds TrueType fonts only and is
    exactly that wide, the SVG's words are <text> elements, no text is under 7 pt or outside
    the figure (check_figure), the PNG is the width at 200 dpi, and the caveat is on it."""
    from PIL import Image

    for kind, draw in _every_kind().items():
        with drawing(width=width, caveat="smoke scale: the numbers mean nothing"):
            fig = draw()
        saved = save_figure(fig, tmp_path, kind, ("pdf", "svg", "png"))
        check_figure(fig, tmp_path / saved.data)
        check_journal_files(tmp_path, kind, WIDTHS[width], must_say=("Caveat: smoke scale",))
        with Image.open(tmp_path / f"{kind}.png") as im:
            assert abs(im.size[0] - WIDTHS[width] * DPI) <= 1, (kind, im.size)
    with pytest.raises(ValueError, match="unknown figure width"):
        with drawing(width="a4"):
            pass


@pytest.mark.parametrize("width", ["column", "page"])
def test_a_forest_note_stays_inside_its_panel(width):
    """A zero-spread row at the middle of a wide, symmetric axis (a smoke study): its note is
    too wide for either side of the point, so it goes under it, inside the panel, not over the
    row labels."""
    rows = [{"c": "AdamW, 20 steps before the decay vs AdamW, decayed at once · late · 3 pairs", "d": 0.0,
             "d_low": 0.0, "d_high": 0.0, "d_mde": 0.0, "d_n": 3},
            {"c": "AdamW, 2× wider and one more block vs AdamW · scratch · 3 pairs", "d": 7.4, "d_low": -32.4,
             "d_high": 47.2, "d_mde": 52.3, "d_n": 3}]
    with drawing(width=width):
        fig = forest_plot(rows, "c", [Forest("d", "primary accuracy (points)"), Forest("d", TRACE_FISHER)],
                          "Paired differences")
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        box = ax.get_window_extent(renderer)
        notes = [t for t in ax.texts if t.get_gid() == "note"]
        assert [t.get_text() for t in notes] == ["zero spread: all pairs equal"]
        ext = notes[0].get_window_extent(renderer)
        assert box.x0 <= ext.x0 and ext.x1 <= box.x1, (width, ext, box)


def test_the_forest_says_why_a_row_has_no_interval_and_draws_the_mde_as_a_band():
    fig = _every_kind()["forest"]()
    ax = fig.axes[0]
    notes = [t.get_text() for t in ax.texts if t.get_gid() == "note"]
    assert notes == ["zero spread: all pairs equal"]
    bands = [line for line in ax.get_lines() if line.get_gid() == "mde"]
    assert bands and all(line.get_linewidth() >= 4 and line.get_marker() in ("None", None, "") for line in bands)
    # no tick that reads as a bar's cap: only the error bars themselves end in caps
    assert not any(line.get_marker() == "|" for line in ax.get_lines() if line.get_gid() in ("point", "mde"))
    # the row names are the labels given, broken to fit the left third of the figure
    assert " ".join(ax.get_yticklabels()[1].get_text().split()) == \
        "SAM ρ 0.05 vs −dropout−WD on SAM's update half-batch · scratch · 16 pairs"


def test_coincident_scatter_points_are_set_side_by_side():
    rows = [{"trace_fisher": 1.0, "probe_B": 0.5, "r": "a"}, {"trace_fisher": 1.0, "probe_B": 0.5, "r": "b"},
            {"trace_fisher": 2.0, "probe_B": 0.6, "r": "a"}]
    fig = scatter_plot(rows, [XY("trace_fisher", TRACE_FISHER, "probe_B", "probe accuracy")], "t",
                       encoding=Encoding(colour_by=None, marker_by=lambda r: r["r"]))
    offsets = sorted(line.get_transform().transform((1.0, 50.0))[0] for line in fig.axes[0].get_lines()
                     if line.get_gid() == "point" and 1.0 in line.get_xdata())
    assert len(offsets) == 2 and offsets[1] - offsets[0] > 3  # pixels apart, not one on the other
    assert "points at one place are set side by side (the data file keeps their values)" in legend_texts(fig)


def test_interval_ends_are_rounded_to_the_interval_s_precision():
    assert interval_text(-0.442, -1.5, -3.69e-29) == "−0.4 [−1.5, 0.0]"  # no rounding noise
    assert interval_text(0.0266, -7.45e-30, 0.0775) == "0.027 [0.000, 0.077]"
    assert interval_text(0.33, 0.02, 0.64) == "0.33 [0.02, 0.64]"


def test_legend_glyphs_are_drawn_as_the_panels_draw():
    """Horizontal bars (a dots plot) get a horizontal glyph, the cut mark the triangle drawn."""
    from sameloss.experiments.reports.plots import layout  # noqa: F401

    fig = _every_kind()["dots"]()
    legend = fig.legends[-1]
    glyphs = {text.get_text().split(":")[0]: handle for text, handle in zip(legend.get_texts(), legend.legend_handles)}
    assert glyphs["probe accuracy, task B"].get_marker() == "_"
    (cut,) = [h for t, h in glyphs.items() if t.startswith("bar cut")]
    drawn = {line.get_marker() for ax in fig.axes for line in ax.get_lines() if line.get_gid() == "cut"}
    assert cut.get_marker() in drawn


def test_a_rerun_removes_the_figures_it_wrote_in_formats_no_longer_asked_for(tmp_path):
    from sameloss.experiments.engine.core import Study, StudySettings
    from sameloss.experiments.engine.folder import listed_outputs

    with Study(tmp_path / "exp", StudySettings(progress=False, figure_formats=("pdf", "svg"))) as study:
        study.figure(series_plot(STEPS, "step", STEPS_PANELS, "t"), "steps-x", shows="s", sample="n", claim="c")
    (tmp_path / "exp" / "notes.pdf").write_bytes(b"%PDF a user's")
    assert {"steps-x.pdf", "steps-x.svg"} <= listed_outputs(tmp_path / "exp")
    with Study(tmp_path / "exp", StudySettings(progress=False, figure_formats=("png",))) as study:
        study.figure(series_plot(STEPS, "step", STEPS_PANELS, "t"), "steps-x", shows="s", sample="n", claim="c")
    names = {p.name for p in (tmp_path / "exp").iterdir()}
    assert "steps-x.png" in names and not {"steps-x.pdf", "steps-x.svg"} & names
    assert "notes.pdf" in names  # a user's file stays
    listed = listed_outputs(tmp_path / "exp")
    assert "steps-x.png" in listed and not {"steps-x.pdf", "steps-x.svg"} & listed
