"""Figures of the experiments (matplotlib, written as PNG; no display needed)."""

from __future__ import annotations

import math
from pathlib import Path

MARKERS = "osD^v<>pPX*h"


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _v(row: dict, key: str) -> float:
    try:
        v = float(row.get(key))
    except (TypeError, ValueError):
        return float("nan")
    return v


def _err(row: dict, key: str, scale: float = 1.0) -> float:
    for suffix in ("_se", "_std"):
        v = _v(row, key + suffix)
        if math.isfinite(v):
            return v * scale
    return 0.0


def lines_panel(ax, series: dict[str, list[dict]], x: str, y: str, ylabel: str, scale: float = 1.0,
                logy: bool = False, logx: bool = False) -> None:
    for i, (name, rows) in enumerate(series.items()):
        rows = [r for r in rows if math.isfinite(_v(r, y))]
        if not rows:
            continue
        xs = [_v(r, x) for r in rows]
        ys = [_v(r, y) * scale for r in rows]
        es = [_err(r, y, scale) for r in rows]
        ax.errorbar(xs, ys, yerr=es, marker=MARKERS[i % len(MARKERS)], capsize=3, label=name)
    ax.set_xlabel(x)
    ax.set_ylabel(ylabel)
    if logy:
        ax.set_yscale("log")
    if logx:
        ax.set_xscale("log")
    ax.grid(alpha=0.3)


def series_figure(path: Path, series: dict[str, list[dict]], x: str, panels: list[tuple[str, str, float, bool]],
                  title: str, logx: bool = False) -> Path:
    """One row of panels, each ``(key, label, scale, logy)`` against ``x``; one line per series."""
    plt = _plt()
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.6))
    axes = list(axes) if len(panels) > 1 else [axes]
    for ax, (key, label, scale, logy) in zip(axes, panels):
        lines_panel(ax, series, x, key, label, scale, logy, logx)
    for ax in axes:
        handles, _ = ax.get_legend_handles_labels()
        if handles and (ax is axes[0] or len(handles) > 1):
            ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def scatter_figure(path: Path, groups: dict[str, list[dict]], panels: list[tuple[str, str, str, str]],
                   title: str, highlight=None) -> Path:
    """Panels ``(x_key, x_label, y_key, y_label)``; one marker per group. Keys may end in
    ``%`` to be shown ×100. ``highlight(row) -> bool``: filled markers for True, hollow
    for False."""
    plt = _plt()
    fig, axes = plt.subplots(1, len(panels), figsize=(4.4 * len(panels), 3.9))
    axes = list(axes) if len(panels) > 1 else [axes]
    for ax, (xk, xl, yk, yl) in zip(axes, panels):
        for i, (name, rows) in enumerate(groups.items()):
            pts = []
            for r in rows:
                x, xe = _scaled(r, xk)
                y, ye = _scaled(r, yk)
                if math.isfinite(x) and math.isfinite(y):
                    pts.append((x, y, xe, ye, highlight(r) if highlight else True))
            if not pts:
                continue
            color = f"C{i % 10}"
            labelled = False
            for filled in (True, False):
                sel = [p for p in pts if p[4] == filled]
                if not sel:
                    continue
                ax.errorbar([p[0] for p in sel], [p[1] for p in sel], xerr=[p[2] for p in sel],
                            yerr=[p[3] for p in sel], fmt=MARKERS[i % len(MARKERS)], color=color, capsize=2,
                            markerfacecolor=color if filled else "none", label=None if labelled else name)
                labelled = True
        ax.set_xlabel(xl)
        ax.set_ylabel(yl)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _scaled(row: dict, key: str) -> tuple[float, float]:
    scale = 1.0
    if key.endswith("%"):
        key, scale = key[:-1], 100.0
    return _v(row, key) * scale, _err(row, key, scale)


def bars_figure(path: Path, rows: list[dict], label: str, panels: list[tuple[str, str, float]], title: str) -> Path:
    """Horizontal bars per row (``row[label]``), one panel per ``(key, xlabel, scale)``."""
    plt = _plt()
    fig, axes = plt.subplots(1, len(panels), figsize=(3.8 * len(panels), 0.45 * len(rows) + 1.6), sharey=True)
    axes = list(axes) if len(panels) > 1 else [axes]
    names = [str(r[label]) for r in rows]
    for ax, (key, xlabel, scale) in zip(axes, panels):
        vals = [_v(r, key) * scale for r in rows]
        errs = [_err(r, key, scale) for r in rows]
        ys = list(range(len(rows)))
        ax.barh(ys, [v if math.isfinite(v) else 0 for v in vals], xerr=errs, color="C0", alpha=0.7, capsize=3)
        for y, v in zip(ys, vals):
            if not math.isfinite(v):
                ax.text(0, y, " n/a", va="center", fontsize=8)
        ax.set_yticks(ys, names)
        ax.set_xlabel(xlabel)
        finite = [v for v in vals if math.isfinite(v)]
        if finite and key.startswith(("probe", "lookup")):
            lo = min(finite) - 5 * max(errs + [0.1])
            ax.set_xlim(left=max(0.0, lo))
        ax.grid(alpha=0.3, axis="x")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
