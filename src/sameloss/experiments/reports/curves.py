"""``sameloss plot RUN...``: training curves of any runs, from their ``metrics.jsonl``.

Train loss (with the optimum, the entropy of the true conditionals), the exact KL on a
log axis ± std over the held-out subsets (a corpus run: the held-out cross-entropy), and
the learning rate, against step — one line per run, labelled by its folder's name
(``plots.curves_plot``). The figure is written like every sameloss figure
(atomic, tagged, ``<stem>.data.csv`` beside it; ``files.write_output``); an existing file
at ``--out`` is replaced only when sameloss wrote it (and the command says so), or with
``--force``; a symbolic link never. Into an
experiment folder, the files are listed in its marker (``folder.record_output``) and the
folder is locked while they are written, as a run folder is.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Callable, Sequence

from ...errors import UserError
from .document import FORMATS

# runio and plots import torch: imported where used, so that building the CLI's parser (which
# reads DEFAULT_OUT) does not import torch before OMP_NUM_THREADS is checked (threads.py)

DEFAULT_OUT = "training-curves"
OTHER_IMAGES = ("jpg", "jpeg", "gif", "tif", "tiff", "bmp", "webp", "eps", "ps")  # refused, not appended to


def read_runs(paths: Sequence[str | Path]) -> tuple[dict[str, list[dict]], dict[str, int]]:
    """Each run's records (by its folder's name; the path where two names collide) and its
    ``eval.n_subsets``; a missing folder, a folder without ``metrics.jsonl`` or a damaged
    one is a ``UserError`` naming it."""
    from ...training.runio import METRICS, read_config_dict, read_metrics

    runs: dict[str, list[dict]] = {}
    subsets: dict[str, int] = {}
    for path in paths:
        folder = Path(path)
        if not folder.is_dir():
            raise UserError(f"no such run folder: {folder}")
        if not (folder / METRICS).is_file():
            hint = f"; its runs are in {folder / 'runs'}/*" if (folder / "runs").is_dir() else ""
            raise UserError(f"{folder} has no {METRICS}: not a run folder of sameloss pretrain{hint}")
        records = read_metrics(folder)
        if not records:
            raise UserError(f"{folder / METRICS} holds no record yet (the run logs every log_every steps)")
        name = folder.resolve().name
        if name in runs:
            name = str(folder)
        runs[name] = records
        if (folder / "config.toml").is_file():
            n = read_config_dict(folder / "config.toml").get("eval", {}).get("n_subsets")
            if isinstance(n, int):
                subsets[name] = n
    return runs, subsets


def targets(out: str | Path | None, formats: tuple[str, ...] | None) -> tuple[list[Path], Path]:
    """The image files (one per format) and the data file that ``--out`` / ``--format`` name:
    ``--out FILE.pdf`` alone means PDF; otherwise the formats' suffixes are appended to
    ``--out`` (``--format``, default png)."""
    out = Path(out if out is not None else DEFAULT_OUT)
    suffix = out.suffix.lower().lstrip(".")
    if suffix in FORMATS:
        if formats is not None and suffix not in formats:
            raise UserError(f"--out {out} ends in .{suffix} but --format asks for {','.join(formats)}")
        formats = formats or (suffix,)
        out = out.with_suffix("")
    elif suffix in OTHER_IMAGES:
        raise UserError(f"--out {out}: sameloss writes {', '.join('.' + f for f in FORMATS)} (not .{suffix})")
    formats = formats or ("png",)
    images = [out.with_name(f"{out.name}.{fmt}") for fmt in formats]
    return images, out.with_name(f"{out.name}.data.csv")


def _check_target(path: Path, ours: Callable[[Path], bool], force: bool = False) -> bool:
    """Whether ``path`` will be replaced (True) or is new (False); ``UserError`` when it
    cannot or must not be written (``files.check_output``: sameloss's own file — listed
    in ``.sameloss-outputs``, or tagged by an earlier version — or ``force``)."""
    from ... import files

    folder = path.parent
    if not folder.is_dir():
        raise UserError(f"cannot write {path}: no folder {folder}")
    return files.check_output(path, force, ours=ours)


def plot_runs(paths: Sequence[str | Path], out: str | Path | None = None, formats: tuple[str, ...] | None = None,
              log: Callable[[str], None] = print, force: bool = False, width: str = "page") -> list[Path]:
    """Draw the training curves of the runs at ``paths`` (``width``: ``column`` or ``page``)
    and write them; returns the files written (the images, then the data file). Every target
    is checked before anything is drawn or written; ``force`` replaces files sameloss did not
    write (never a link)."""
    from ... import files, storage
    from ..engine.folder import record_output
    from .plots import curves_plot, drawing, figure_bytes, figure_data, is_sameloss_data, is_sameloss_figure

    runs, subsets = read_runs(paths)
    images, data = targets(out, formats)
    with _lock(data.parent):
        ours = {p: is_sameloss_figure for p in images}
        ours[data] = is_sameloss_data
        replaced = {p: _check_target(p, ours[p], force) for p in ours}
        title = f"training curves: {', '.join(runs)}" if len(runs) <= 3 else f"training curves of {len(runs)} runs"
        with drawing(width=width):
            fig = curves_plot(runs, title, subsets=subsets)
        try:
            blobs = [(p, figure_bytes(fig, p.suffix[1:])) for p in images] + [(data, figure_data(fig).encode())]
        finally:
            import matplotlib.pyplot as plt
            plt.close(fig)
        for path, blob in blobs:
            with storage.storage_errors(path):
                record_output(path)  # in an experiment folder also listed in its marker: --fresh may delete it
            files.write_output(path, blob, force, ours=ours[path])
            log(f"{'replaced' if replaced[path] else 'wrote'} {path}")
    return [p for p, _ in blobs]


def _lock(folder: Path):
    """The lock of ``folder`` when it is one that other sameloss processes write (an
    experiment folder, a run folder): two processes never write one folder, so a plot into
    a running experiment or run is refused, naming the process. Another folder is the
    user's: nothing to lock (and no lock file left beside it)."""
    from ... import files
    from ..engine.folder import is_marked

    if is_marked(folder):
        return files.folder_lock(folder, "experiment")
    if files.is_run_dir(folder):
        return files.folder_lock(folder, "run")
    return contextlib.nullcontext()


__all__ = ["DEFAULT_OUT", "plot_runs", "read_runs", "targets"]
