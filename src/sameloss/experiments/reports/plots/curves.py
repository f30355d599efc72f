"""Training curves of runs from their ``metrics.jsonl`` (``sameloss plot``, and the
``steps`` recipe's own runs): train loss (with the optimum, the entropy, dashed), the exact
KL on a log axis (a corpus run: the held-out cross-entropy) and the learning rate, against
step; one line per run, each with its own colour, marker and dash pattern, its markers
spread along it (runs whose lines coincide stay distinguishable)."""

from __future__ import annotations

from . import layout
from .panel import Ref, _AxisSettings, _ends, _Panel, _Points, marks_along
from .quantities import _error, _finite, _value
from .style import LINESTYLES, MARKERS, styled

PANEL_HEIGHT = 2.0  # inches
MARKS_PER_LINE = 6


@styled
def curves_plot(runs: dict[str, list[dict]], title: str, *, subsets: dict[str, int] | None = None,
                caveat: str | None = None):
    """Training curves of runs (a name and its ``metrics.jsonl`` records): train loss (the
    optimum, the entropy of the true conditionals, dashed), the exact KL on a log axis
    (a corpus run: the held-out cross-entropy) ± std over the held-out subsets, and the
    learning rate, against step; one line per run. ``subsets[name]``: the run's
    ``eval.n_subsets``."""
    train = {n: [r for r in recs if _finite(r.get("train_loss"))] for n, recs in runs.items()}
    evals = {n: [dict(r["eval"], step=r["step"]) for r in recs if isinstance(r.get("eval"), dict)]
             for n, recs in runs.items()}
    exact = {n: [e for e in ev if _finite(e.get("kl"))] for n, ev in evals.items()}
    corpus = {n: [e for e in ev if not _finite(e.get("kl")) and _finite(e.get("loss"))] for n, ev in evals.items()}
    panels: list[tuple[str, str, dict]] = [("train_loss", "train loss (nats)", train)]
    if any(exact.values()):
        panels.append(("kl", "exact KL to the true conditionals (nats)", exact))
    if any(corpus.values()):
        panels.append(("loss", "held-out cross-entropy (nats)", corpus))
    panels.append(("lr", "learning rate", {n: [r for r in recs if _finite(r.get("lr"))] for n, recs in runs.items()}))
    counts = set((subsets or {}).values())
    n_subsets = f"{counts.pop()} " if len(counts) == 1 else ""
    errors = {"kl": f"± std over {n_subsets}held-out subsets", "loss": f"± std over {n_subsets}held-out subsets"}
    fig, axes = layout.new_figure(len(panels), title, panel_height=PANEL_HEIGHT, caveat=caveat)
    letters = layout.letters(len(panels))
    built, drawn_in = [], {}
    steps = [float(r["step"]) for recs in runs.values() for r in recs]
    for ax, (key, ylabel, data), letter in zip(axes, panels, letters):
        pnl = _Panel(ax, len(built), "step", key, "step", ylabel,
                     _AxisSettings(ylog=key == "kl", integer_x=True, errors=errors))
        for i, name in enumerate(runs):
            recs = data.get(name) or []
            if not recs:
                continue
            xs = [float(r["step"]) for r in recs]
            ys = [_value(r, key) for r in recs]
            low, high = _ends(ys, [_error(r, key) for r in recs])
            pnl.add(_Points(name, xs, ys, [None] * len(xs), [None] * len(xs), low, high, f"C{i % 10}",
                            MARKERS[i % len(MARKERS)], line=True, size=_size(i), style=_dashes(i),
                            markevery=marks_along(len(xs), i, len(runs), MARKS_PER_LINE), width=_width(i)))
            drawn_in.setdefault(name, []).append(letter)
        pnl.span["x"] = [min(steps), max(steps)] if steps else []  # one step range in every panel
        if key == "train_loss":
            for value, label in _optima(exact):  # the optimum is always shown where a loss is
                pnl.ref(Ref(value, label, in_extent=True))
        built.append(pnl)
    for pnl, letter in zip(built, letters):
        pnl.finish(fig._sameloss, letter)
    entries = [(layout.entry_marker(f"C{i % 10}", MARKERS[i % len(MARKERS)], line=True, style_=_dashes(i),
                                    width=_width(i), size=_size(i)), name)
               for i, name in enumerate(runs) if name in drawn_in]
    layout.finish(fig, [("run", entries), (None, layout.ref_entries(built)), ("error bars", layout.bar_entries(fig))])
    return fig


def _optima(exact: dict[str, list[dict]]) -> list[tuple[float, str]]:
    """The optimum of each language among the runs (the entropy of its true conditionals at
    the run's masking, as its evaluation logs it): one dashed line per distinct value."""
    found: dict[float, list[str]] = {}
    for name, evs in exact.items():
        ent = [e["entropy"] for e in evs if _finite(e.get("entropy"))]
        if ent:
            found.setdefault(round(ent[-1], 9), []).append(name)
    if len(found) == 1:
        (value,) = found
        return [(value, f"optimum: entropy {value:.4f} nats")]
    return [(v, f"optimum of {', '.join(names)}: entropy {v:.4f} nats") for v, names in found.items()]


def _dashes(i: int) -> str:
    return LINESTYLES[i % len(LINESTYLES)]


def _width(i: int) -> float:
    """Earlier runs' lines wider: two runs with the same values (a shared learning rate)
    show as a line with another inside it, not as one."""
    return max(0.7, 1.9 - 0.35 * i)


def _size(i: int) -> float:
    return max(2.8, 5.0 - 0.6 * i)


__all__ = ["curves_plot"]
