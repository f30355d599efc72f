"""Writing a figure: ``<stem>.png`` (200 dpi) or PDF / SVG (vector: TrueType fonts in the
PDF, real ``<text>`` in the SVG), at the width it was drawn at, atomically and tagged as
sameloss's (``is_sameloss_figure``), with ``<stem>.data.csv`` beside it — exactly the
plotted numbers, one row per panel (its quantities, scales and limits), per point (value
and the drawn ends of its bars), per reference line and per fitted line. A figure that
sameloss wrote earlier under the same stem in a format no longer asked for is removed
(a re-run with another ``--format`` leaves no stale file listed as the experiment's)."""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from ..document import FORMATS
from .panel import Ref
from .quantities import _float
from .style import DPI, STYLE, TAG, plt

DATA_COLUMNS = ("panel", "kind", "series", "x", "y", "x_low", "x_high", "y_low", "y_high", "cut", "x_quantity",
                "x_scale", "x_label", "y_quantity", "y_scale", "y_label", "note")

@dataclass(frozen=True)
class SavedFigure:
    """The files ``save_figure`` wrote (names in the folder) and what the figure's bars are."""

    files: tuple[str, ...]  # one per format, the first is the one a report embeds
    data: str  # the CSV of the plotted numbers
    bars: str  # "<quantity> ± …; …" ("" when the figure draws no error bar)
    removed: tuple[str, ...] = ()  # the same figure in formats no longer asked for, written earlier: removed


def figure_bytes(fig, fmt: str) -> bytes:
    """The figure as a PNG (200 dpi), PDF or SVG, tagged as written by sameloss, at exactly
    the size it was laid out at (``layout.finish``: its width is the paper's)."""
    from .... import __version__

    tag = f"{TAG} (sameloss {__version__})"
    metadata = {"png": {"Software": tag}, "pdf": {"Creator": tag}, "svg": {"Creator": tag}}[fmt]
    buffer = io.BytesIO()
    with plt().rc_context(STYLE):  # TrueType in PDF, <text> in SVG, unhinted text (as laid out)
        fig.savefig(buffer, format=fmt, dpi=DPI, metadata=metadata)
    return buffer.getvalue()


def figure_data(fig) -> str:
    """The plotted numbers of a figure drawn here, as CSV text (``DATA_COLUMNS``)."""
    out = io.StringIO(newline="")
    writer = csv.DictWriter(out, fieldnames=DATA_COLUMNS)
    writer.writeheader()
    for row in fig._sameloss.rows:
        writer.writerow({k: _csv(row.get(k)) for k in DATA_COLUMNS})
    return out.getvalue()


def _csv(v):
    if v is None:
        return ""
    if isinstance(v, float):  # numpy's floats too (repr: the shortest exact text)
        return repr(float(v))
    return v


def data_path(path: str | Path) -> Path:
    """The data file beside a figure: ``<stem>.data.csv``."""
    path = Path(path)
    return path.with_name(f"{path.stem}.data.csv")


def is_sameloss_figure(path: str | Path) -> bool:
    """Whether ``path`` is an image that sameloss wrote (its metadata holds ``TAG``)."""
    try:
        with open(path, "rb") as f:
            return TAG.encode() in f.read()
    except OSError:
        return False


def is_sameloss_data(path: str | Path) -> bool:
    """Whether ``path`` is a figure's data file that sameloss wrote (its header)."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.readline().strip() == ",".join(DATA_COLUMNS)
    except (OSError, UnicodeDecodeError):
        return False


def save_figure(fig, folder: str | Path, stem: str, formats: Sequence[str] = ("png",)) -> SavedFigure:
    """Write ``fig`` as ``folder/<stem>.<format>`` for each format and ``<stem>.data.csv``,
    each atomically (a full disk or a read-only folder: one ``UserError`` line, nothing
    half-written), and close it; remove ``<stem>.<other format>`` where sameloss wrote it
    (``remove_stale``)."""
    folder = Path(folder)
    try:
        blobs = [(f"{stem}.{fmt}", figure_bytes(fig, fmt)) for fmt in formats]
        data = figure_data(fig)
        bars = fig._sameloss.bars_text()
    finally:
        plt().close(fig)
    for name, blob in blobs:
        write_file(folder / name, blob)
    data_name = f"{stem}.data.csv"
    write_file(folder / data_name, data.encode())
    removed = remove_stale(folder, stem, formats)
    return SavedFigure(tuple(name for name, _ in blobs), data_name, bars, removed)


def remove_stale(folder: str | Path, stem: str, formats: Sequence[str]) -> tuple[str, ...]:
    """Remove ``folder/<stem>.<format>`` for each format not in ``formats`` when sameloss
    wrote it (its tag; a file of a user's, a link or a folder stays), and drop it from the
    experiment folder's marker; returns the names removed."""
    from ...engine import folder as experiment_folder
    from .... import storage

    removed = []
    for fmt in FORMATS:
        path = Path(folder) / f"{stem}.{fmt}"
        if fmt in formats or path.is_symlink() or not path.is_file() or not is_sameloss_figure(path):
            continue
        with storage.storage_errors(path):
            experiment_folder.forget_output(path)
            path.unlink()
        removed.append(path.name)
    return tuple(removed)


def write_file(path: Path, data: bytes) -> None:
    """The one writer of figure files: atomic, a full disk or a read-only folder one
    ``UserError`` line naming ``path``; in an experiment folder, noted in its marker first
    (``folder.record_output``: ``--fresh`` then knows the file is sameloss's, also when a
    kill comes between the two)."""
    from .... import files, storage
    from ...engine.folder import record_output

    path = Path(path)
    with storage.storage_errors(path):
        record_output(path)
        files.atomic_write_bytes(path, data)


def majority_ref(rows: list[dict], task: str) -> tuple[Ref, ...]:
    """A dotted line at the majority-class rate of ``task`` (``<task>_majority`` of the
    rows): the accuracy of a constant guess, the floor a probe must beat."""
    rates = [_float(r.get(f"{task}_majority")) for r in rows]
    rates = [v for v in rates if math.isfinite(v)]
    if not rates:
        return ()
    return (Ref(100 * rates[0], f"majority class: {100 * rates[0]:.1f} % (a constant guess)", color="0.55", style=":",
                in_extent=True),)



__all__ = ["DATA_COLUMNS", "SavedFigure", "data_path", "figure_bytes", "figure_data", "is_sameloss_data",
           "is_sameloss_figure", "majority_ref", "remove_stale", "save_figure", "write_file"]
