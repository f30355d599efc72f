"""Readable figures (issue 10, item 13): log axes labelled over the data, error bars
inside a quantity's range, losses in nats, a legend that covers no point and lists only
styles in use. Each test inspects the matplotlib Figure the recipes save."""

from __future__ import annotations

import math

import pytest
from matplotlib.collections import LineCollection

from sameloss.experiments.plots import bars_plot, scatter_plot, series_plot


def _kl_rows(values, err=0.08):
    return [{"step": 8 + 4 * i, "kl": v, "kl_std": err, "trace_fisher": 20 + i, "trace_fisher_se": 1.0,
             "probe_B": 0.05 + 0.01 * i, "probe_B_std": 0.12} for i, v in enumerate(values)]


# the smoke run's steps figure: AdamW's KL above 1 nat, SGD's below
STEPS_SERIES = {"AdamW": _kl_rows([1.47, 1.43, 1.39, 1.35, 1.30]), "SGD": _kl_rows([0.99, 0.97, 0.93, 0.97, 0.88])}
STEPS_PANELS = [("kl", "KL to the true conditionals (nats)", 1.0, True),
                ("trace_fisher", "trace of Hessian (Fisher)", 1.0, False),
                ("probe_B", "probe accuracy task B (%)", 100.0, False)]


def _labelled_ticks(ax, which: str) -> list[float]:
    """Positions of the ticks, major or minor, that show a non-empty label inside the limits."""
    ax.figure.canvas.draw()
    axis = ax.yaxis if which == "y" else ax.xaxis
    lo, hi = sorted(ax.get_ylim() if which == "y" else ax.get_xlim())
    out = []
    for minor in (False, True):
        for loc, label in zip(axis.get_ticklocs(minor=minor), axis.get_ticklabels(minor=minor)):
            if label.get_text().strip() and lo <= loc <= hi:
                out.append(float(loc))
    return sorted(out)


def _error_bar_segments(ax):
    return [seg for c in ax.collections if isinstance(c, LineCollection) for seg in c.get_segments()]


def _data_y(ax):
    return [y for line in ax.get_lines() for y in line.get_ydata() if math.isfinite(y)]


@pytest.mark.parametrize("values", [
    [1.47, 1.43, 1.39, 1.35, 1.30, 0.99, 0.97, 0.93, 0.88],  # straddles 1: under a decade
    [1.21, 1.22, 1.24, 1.26],                                 # a few percent: no 1-2-5 number inside
    [0.0031, 0.02, 0.11, 0.48],                               # two decades
])
def test_log_kl_axis_is_labelled_over_the_data(values):
    fig = series_plot({"runs": _kl_rows(values, err=0.01 * min(values))}, "step", STEPS_PANELS[:1], "t")
    ax = fig.axes[0]
    assert ax.get_yscale() == "log"
    lo, hi = ax.get_ylim()
    drawn = _data_y(ax) + [y for seg in _error_bar_segments(ax) for _, y in seg]
    assert lo <= min(drawn) and max(drawn) <= hi
    ticks = _labelled_ticks(ax, "y")
    assert len(ticks) >= 3
    # no point is far (in log distance, relative to the axis's span) from a labelled tick
    span = math.log10(hi / lo)
    for v in values:
        assert min(abs(math.log10(v / t)) for t in ticks) <= 0.35 * span, (v, ticks)


def test_steps_figure_labels_the_kl_points_above_one_nat():
    """The reported case: AdamW's KL (1.3-1.5) sat above the top labelled tick (1)."""
    ax = series_plot(STEPS_SERIES, "step", STEPS_PANELS, "t").axes[0]
    ticks = _labelled_ticks(ax, "y")
    assert any(t > 1.25 for t in ticks) and any(t < 1.0 for t in ticks)
    assert all(ax.get_yaxis().get_major_formatter()(t, i) for i, t in enumerate(ticks))


def test_log_x_axis_of_parameter_counts_is_labelled():
    rows = [{"parameters": 900, "kl": 1.4, "kl_std": 0.1}, {"parameters": 2950, "kl": 1.3, "kl_std": 0.1}]
    ax = series_plot({"own": rows}, "parameters", [("kl", "KL (nats)", 1.0, True)], "t", logx=True).axes[0]
    ticks = _labelled_ticks(ax, "x")
    assert len(ticks) >= 2 and ticks[0] <= 1000 and ticks[-1] >= 2500
    # labels do not collide: neighbours at least a tenth of the span apart (log)
    lo, hi = ax.get_xlim()
    assert min(math.log10(b / a) for a, b in zip(ticks, ticks[1:])) >= math.log10(hi / lo) / 10


def test_probe_error_bars_stay_within_0_and_100_percent():
    series_fig = series_plot(STEPS_SERIES, "step", STEPS_PANELS, "t")
    ax = series_fig.axes[2]  # probe 5-9 % ± 12 %
    ends = [y for seg in _error_bar_segments(ax) for _, y in seg]
    assert ends and min(ends) == pytest.approx(0.0) and max(ends) <= 100
    near_top = [{"loss": 2.0, "loss_std": 0.1, "probe_B": 0.97, "probe_B_std": 0.06, "kl": 0.1}]
    scatter_fig = scatter_plot({"g": near_top + [dict(near_top[0], probe_B=0.02)]},
                               [("loss", "pre-training loss", "probe_B%", "probe accuracy (%)")], "t")
    ends = [y for seg in _error_bar_segments(scatter_fig.axes[0]) for _, y in seg]
    assert min(ends) == pytest.approx(0.0) and max(ends) == pytest.approx(100.0)
    bars = bars_plot([{"algorithm": "look-up table", "probe_B": 0.015, "probe_B_std": 0.02, "kl": 0.02,
                       "kl_std": 0.05}], "algorithm", [("probe_B", "probe (%)", 100.0), ("kl", "KL (nats)", 1.0)], "t")
    for ax in bars.axes:
        xs = [x for seg in _error_bar_segments(ax) for x, _ in seg]
        assert xs and min(xs) == pytest.approx(0.0)


def test_loss_and_kl_axes_say_nats():
    fig = scatter_plot({"g": [{"loss": 2.0, "probe_B": 0.9, "trace_fisher": 20.0, "kl": 0.1}]},
                       [("loss", "pre-training loss", "probe_B%", "probe accuracy (%)"),
                        ("loss", "pre-training loss", "trace_fisher", "trace of Hessian")], "t")
    assert [ax.get_xlabel() for ax in fig.axes] == ["pre-training loss (nats)"] * 2
    assert fig.axes[1].get_ylabel() == "trace of Hessian"
    bars = bars_plot([{"a": "x", "kl": 0.1}], "a", [("kl", "KL", 1.0)], "t")
    assert bars.axes[0].get_xlabel() == "KL (nats)"
    series = series_plot(STEPS_SERIES, "step", STEPS_PANELS, "t")
    assert series.axes[0].get_ylabel() == "KL to the true conditionals (nats)"  # not "(nats) (nats)"


def _legends(fig):
    return list(fig.legends) + [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]


def _assert_legend_covers_no_axes(fig):
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    legends = _legends(fig)
    assert legends
    for legend in legends:
        box = legend.get_window_extent(renderer)
        for ax in fig.axes:
            assert not box.overlaps(ax.get_window_extent(renderer)), "legend drawn over a panel"


def test_legends_cover_no_panel():
    _assert_legend_covers_no_axes(series_plot(STEPS_SERIES, "step", STEPS_PANELS, "t"))
    groups = {"AdamW": [{"loss": 2.5, "probe_B": 0.09, "kl": 0.1}], "SGD": [{"loss": 2.0, "probe_B": 0.1, "kl": 0.2}]}
    _assert_legend_covers_no_axes(scatter_plot(groups, [("loss", "loss", "probe_B%", "probe (%)")], "t"))


def _legend_labels(fig) -> list[str]:
    return [t.get_text() for legend in _legends(fig) for t in legend.get_texts()]


def test_scatter_legend_lists_only_styles_in_use():
    panels = [("loss", "pre-training loss", "probe_B%", "probe accuracy (%)")]
    groups = {"AdamW": [{"loss": 2.5, "probe_B": 0.09, "kl": 0.1}, {"loss": 2.4, "probe_B": 0.1, "kl": 0.12}],
              "SGD": [{"loss": 2.0, "probe_B": 0.1, "kl": 0.2}],
              "never measured": [{"loss": None, "probe_B": 0.1, "kl": 0.1}]}
    labels = ("KL ≤ 0.15 nats", "KL > 0.15 nats")
    mixed = scatter_plot(groups, panels, "t", highlight=lambda r: r["kl"] <= 0.15, highlight_labels=labels)
    assert _legend_labels(mixed) == ["AdamW", "SGD", "filled: KL ≤ 0.15 nats", "hollow: KL > 0.15 nats"]
    all_filled = scatter_plot(groups, panels, "t", highlight=lambda r: True, highlight_labels=labels)
    assert _legend_labels(all_filled) == ["AdamW", "SGD", "filled: KL ≤ 0.15 nats"]
    all_hollow = scatter_plot(groups, panels, "t", highlight=lambda r: False, highlight_labels=labels)
    assert _legend_labels(all_hollow) == ["AdamW", "SGD", "hollow: KL > 0.15 nats"]
    # the hollow markers drawn are the ones the legend shows
    faces = {line.get_markerfacecolor() for line in all_hollow.axes[0].get_lines()
             if line.get_marker() not in ("None", "|", "_")}  # (not the error-bar caps)
    assert faces == {"none"}


def test_series_legend_skips_series_without_points():
    series = dict(STEPS_SERIES, empty=[{"step": 1, "kl": None}])
    fig = series_plot(series, "step", STEPS_PANELS, "t")
    assert _legend_labels(fig) == ["AdamW", "SGD"]
