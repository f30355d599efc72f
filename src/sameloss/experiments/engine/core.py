"""The machinery under the engine: ``RunSpec`` (a run, turned into a ``PretrainConfig``
here and only here) and ``Study`` (one experiment folder: train a run or reuse / resume it,
measure a checkpoint or a reference representation (look-up table, random-init encoder,
oracle) or reuse the cached row, embed a checkpoint; record a run, absorb what a unit ran
elsewhere). Handing a study's units to a launcher — ``launch.py``: in this process, in local
worker processes or on Slurm — and walking them in a worker is ``dispatch.py`` (which imports
this module, never the other way round).
A recipe never trains or measures by hand, nor calls a ``Study``: it declares its runs,
forks and measures (``declare.py``) and the engine does them on a ``Study``.

An experiment lives in one folder, ``<out>/<experiment>-<scale>[-seed<N>]/``:

* ``runs/<run>/`` — every pre-training run (``config.toml``, ``metrics.jsonl``,
  ``checkpoints/``, ``summary.json`` once finished);
* ``embedded/<run>-step<N>/`` — checkpoints embedded into a larger shape (App. B.4);
* ``measurements.json`` — every measured row, keyed by what was measured (a checkpoint and
  its ``meta.json``, or a reference and its language / model settings) and the measure
  settings, written (atomically, merged with what other workers wrote meanwhile:
  ``files.update_lock``) after each measurement;
* ``seeds/seed<N>/`` — a recipe's per-seed studies (``declare.seed_unit``), each laid out
  as this one, except the references that do not depend on the seed
  (``SEED_FREE_REFERENCES``: the look-up table, the look-up and oracle representations),
  measured once into the experiment's ``measurements.json`` for all its units;
* ``measured.csv``, ``costs.csv`` — the study's tidy tables: every tagged measure's row with
  its tags (seed, fork point, fork, step, role, ...) and every unit's CPU seconds per part
  (``orchestrate.write_tables``), what the report queried (``engine.Records``);
* ``results.csv``, ``report.md`` — written by ``reports/document.py``; figures (``<stem>.png``, or
  ``.pdf`` / ``.svg``) and ``<stem>.data.csv`` beside each — by ``Study.figure``;
* ``submitit/`` — the launchers' files (pickled units, worker logs), ``launch.py``.

Re-running reuses: a run with ``summary.json`` and the same config is not trained again; a
run with checkpoints but no ``summary.json`` (interrupted) is resumed; a row in
``measurements.json`` with the same key is not measured again. ``fresh=True`` deletes the
experiment folder first — only when everything in it is sameloss's (``folder.py``: the
folder is marked, and nothing is ever deleted without sameloss's marker). A ``Study``
holds the folder's lock (``files.folder_lock``) from its creation to ``close()`` (it is a
context manager), so two ``reproduce`` calls never write one experiment; the study of a
unit (``dispatch.execute``) or of a shard (``reproduce --seeds``) is opened with
``lock=False`` and its process locks the unit's own folder instead (``runs/<run>`` or
``seeds/seed<N>``), so units run in several processes at once and two never run one unit.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import shutil
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ... import config as configlib
from ... import files, storage
from ...errors import UserError
from ...files import atomic_write_json
from ...progress import say, stream
from . import folder as experiment_folder
from . import layout
from ...training.checkpoint import checkpoint_dir
from ...training.config import PretrainConfig
from .declare import Embedded, Unit
from .runspec import RunInfo, RunSpec, _fingerprint, spec_fingerprint
from ...training import runfolder
from ...training.loop import pretrain
from ...training.runio import read_metrics, read_summary
from ...training.tracking import check_tracker, log_measured, mirror_run

MEASUREMENTS = experiment_folder.MEASUREMENTS
FRESH_HINT = "pass --fresh to redo the experiment"  # how a refused run folder is redone (``runfolder.plan``)


@dataclass
class UnitResult:
    """What a unit returned, and the runs, timings and counts of the study it ran in."""

    value: Any
    runs: dict[str, RunInfo] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class StudySettings:
    """How a study trains and measures: plain data, the same in the experiment's process and
    (``for_unit``) in every worker that walks one of its units."""

    progress: bool = True
    device: str = "auto"
    tracker: str = "none"  # where runs' metrics and measured rows are mirrored (training.tracking)
    figure_formats: tuple[str, ...] = ("png",)  # of the figures (``figure``); a report embeds the first
    ensemble: int | None = None  # ``--ensemble N``: units walked together, runs trained N at once (ensembles.py)
    # ``--dropout-draws keyed``: every run's dropout masks keyed (training.keyed), what lets
    # runs with dropout train batched on a GPU: set on the runs of the units it runs
    # (``dispatch.run_units``); other runs, in another experiment folder
    dropout_draws: str = "global"

    def for_unit(self) -> StudySettings:
        """A unit's study's: the experiment's progress, device and tracker (its figures,
        ensembles and dropout draws are the experiment's)."""
        return StudySettings(progress=self.progress, device=self.device, tracker=self.tracker)


# references that do not depend on the run's seed (the language's look-up table, its true
# conditionals and posteriors): a unit's study measures them once per experiment (``shared``)
SEED_FREE_REFERENCES = frozenset({"lookup-table", "lookup", "oracle"})


def _read_rows(path: Path) -> dict:
    """The rows of a ``measurements.json`` ({} when absent or unreadable)."""
    if not path.exists():
        return {}
    try:
        cache = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return {}
    return cache if isinstance(cache, dict) else {}


class Study:
    """One experiment folder: trains runs, measures their checkpoints and caches the rows,
    writes every file under ``root`` (see the module docstring). It has no seed: a run's
    seed is its own setting and a measure's its spec's (the recipe's ``Setup.seed``, one
    channel). ``settings``: how it trains, measures and draws (``StudySettings``);
    ``launcher``: where units run (``launch.py``; default here)."""

    def __init__(self, root: str | Path, settings: StudySettings | None = None, *, fresh: bool = False,
                 lock: bool = True, shared: str | Path | None = None, launcher=None, log=None):
        self._bars: list = []  # progress bars shown, newest last: a log line is written above them
        self.settings = settings if settings is not None else StudySettings()
        # a unit's study: the experiment's folder, whose measurements.json holds the
        # references that do not depend on the seed, measured once for all its units
        self.shared = None if shared is None else Path(shared)
        self.root = Path(root)
        # the folder's lock, held until close() (or, for a Study nobody closes, until it is
        # garbage-collected); ``lock=False``: a unit's study (``dispatch.execute``) or a shard's
        # (``reproduce --seeds``), whose process holds the lock of the unit's folder instead
        self._held = contextlib.ExitStack()
        if lock:
            self._held.enter_context(files.folder_lock(self.root, "experiment"))
        weakref.finalize(self, self._held.close)
        try:
            legacy = experiment_folder.check_usable(self.root, fresh)
            with storage.storage_errors(self.root):
                if fresh and self.root.exists():
                    with contextlib.ExitStack() as units:  # none of them is being written by another process
                        for folder, what in experiment_folder.unit_folders(self.root):
                            units.enter_context(files.folder_lock(folder, what))
                        shutil.rmtree(self.root)  # checked: it holds nothing but sameloss's outputs
                new = not self.root.exists() or files.is_empty_dir(self.root)
                self.root.mkdir(parents=True, exist_ok=True)
                if new or legacy:  # a folder of an earlier version: its report's files are listed as ours
                    experiment_folder.mark(self.root, experiment_folder.legacy_outputs(self.root) if legacy else set())
        except BaseException:
            self.close()
            raise
        self.runs_dir = self.root / layout.RUNS
        check_tracker(self.settings.tracker)
        self._mirrored: set[Path] = set()  # reused runs whose tracker output this call wrote (``_mirror``)
        self._said_tracked = False
        if launcher is None:
            from .launch import InProcess
            launcher = InProcess()
        self.launcher = launcher
        self.done: dict[str, Any] = {}  # unit name -> what it returned, in this call (``absorb``)
        self._log = log or say  # stdout, or stderr while a terminal: an error stays one line
        self.cache_path = self.root / MEASUREMENTS
        self.cache: dict = {}
        if self.cache_path.exists():
            try:
                self.cache = json.loads(self.cache_path.read_text())
            except json.JSONDecodeError:
                self.log(f"note: {self.cache_path} is not valid JSON; measuring again")
                self.cache = {}
        self._earlier = set(self.cache)  # rows measured by an earlier call
        self._measure_state: dict[str, dict] = {}  # per measure spec: evaluators, task data
        self.runs: dict[str, RunInfo] = {}
        self.timings: dict[str, float] = {"train": 0.0, "measure": 0.0}
        self.counts: dict[str, int] = {"measured": 0, "cached": 0, "earlier": 0}

    def close(self) -> None:
        """Release the experiment folder's lock."""
        self._held.close()

    def __enter__(self) -> Study:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def figure(self, fig, stem: str, *, shows: str, sample: str, claim: str):
        """Write a figure of ``plots.py`` as ``<stem>.<format>`` (each of ``figure_formats``)
        and ``<stem>.data.csv`` (its plotted numbers) in the experiment folder; returns the
        report's ``Figure``, its caption's error bars taken from the figure's legend."""
        from ..reports.plots import save_figure
        from ..reports.document import Figure

        saved = save_figure(fig, self.root, stem, self.settings.figure_formats)
        return Figure(saved.files[0], shows=shows, bars=saved.bars, sample=sample, claim=claim, data=saved.data,
                      other=saved.files[1:])

    def log(self, msg: str) -> None:
        if self._bars:
            self._bars[-1].write(msg, file=stream())
        else:
            self._log(msg)

    @contextlib.contextmanager
    def showing(self, bar):
        """Log lines written above ``bar`` — a progress bar over this study's units, passed in
        by whoever shows it (``dispatch.run_units``; ``None``: none) — while the block runs."""
        if bar is not None:
            self._bars.append(bar)
        try:
            yield
        finally:
            if bar is not None:
                self._bars.remove(bar)

    def bar(self, items: list, desc: str):
        """A progress bar over the checkpoints being measured (a plain list when off). It
        counts only the checkpoints measured now: one whose row comes from the cache
        leaves the total instead (its "rate" — thousands per second — means nothing)."""
        from ...progress import progress_bar

        if not self.settings.progress or len(items) < 2:
            return items
        bar = progress_bar(total=len(items), desc=desc, unit="checkpoint", leave=False)
        self._bars.append(bar)

        def gen():
            try:
                for item in items:
                    measured = self.counts["measured"]
                    yield item
                    if self.counts["measured"] > measured:
                        bar.update(1)
                    else:
                        bar.total -= 1
            finally:
                bar.close()
                self._bars.remove(bar)
        return gen()

    # ---- training ---------------------------------------------------------------------
    def train(self, spec: RunSpec) -> RunInfo:
        if spec.name in self.runs:
            known = self.runs[spec.name]
            if known.spec.settings != spec.settings:
                raise RuntimeError(f"two recipes define run {spec.name!r} differently:\n{known.spec.overrides}\n"
                                   f"{spec.overrides}")
            return known
        cfg = self.run_config(spec)
        run_dir = layout.run_dir(self.root, spec.name)
        start = time.perf_counter()
        # runfolder.plan decides (reuse, extend, resume, train or refuse) under the run's lock,
        # and pretrain carries that decision out under the same lock
        with files.folder_lock(run_dir, "run"):
            plan = runfolder.plan(run_dir, cfg, "auto", fresh_hint=FRESH_HINT)
            if plan.action != "reuse":
                self.log(plan.message)
                pretrain(cfg, run_dir, progress=self.settings.progress, plan=plan, tracker=self.settings.tracker)
            return self.record(spec, cfg, plan.status, time.perf_counter() - start)

    def record(self, spec: RunSpec, cfg: PretrainConfig, status: str, seconds: float) -> RunInfo:
        """A run trained here (``train``) or with others as one ensemble (``ensembles.py``),
        resumed or reused, recorded in this study: its ``RunInfo`` (its summary read back),
        its wall seconds counted; a reused run's metrics mirrored to ``--tracker``."""
        run_dir = layout.run_dir(self.root, spec.name)
        if status == "reused" and self.settings.tracker != "none":
            self._mirror(cfg, run_dir)
        self.timings["train"] += seconds
        info = RunInfo(spec, cfg, run_dir, status, seconds, read_summary(run_dir) or {})
        self.runs[spec.name] = info
        return info

    def absorb(self, unit: str, result: UnitResult) -> None:
        """What unit ``unit`` returned, run in another study (a seed's) or another process: its
        value kept (``done``), and the runs, timings and counts of the study it ran in added."""
        self.done[unit] = result.value
        self.runs.update(result.runs)
        for k, v in result.timings.items():
            self.timings[k] += v
        for k, v in result.counts.items():
            self.counts[k] += v

    def reread(self) -> None:
        """The rows other processes measured meanwhile (the launchers' workers) read into the cache."""
        self.cache.update(self._read_cache())

    def run_config(self, spec: RunSpec) -> PretrainConfig:
        """``spec``'s config as this study trains it (its ``--device``)."""
        cfg = spec.config()
        if self.settings.device != "auto" and cfg.device != self.settings.device:
            cfg = dataclasses.replace(cfg, device=self.settings.device)
        return cfg

    def _mirror(self, cfg, run_dir: Path) -> None:
        """A reused run and ``--tracker``: its ``metrics.jsonl`` and config go to the tracker
        when the run holds no output of it yet (its measured rows follow, from the cache too:
        ``measure``); else one line (per study) says where they are."""
        if mirror_run(self.settings.tracker, run_dir, run_dir.name, read_metrics(run_dir), configlib.to_dict(cfg)):
            self._mirrored.add(run_dir)
        elif not self._said_tracked:
            self._said_tracked = True
            self.log(f"--tracker {self.settings.tracker}: reused runs (e.g. {run_dir.name}) already hold their metrics "
                     "from the call that trained them; they are not written twice")

    def checkpoint(self, info: RunInfo, step: int | None = None) -> Path:
        """The checkpoint at ``step`` of a trained run (``None``: its last)."""
        path = checkpoint_dir(info.path, step or info.config.steps)
        if not (path / "meta.json").exists():
            raise UserError(f"run {info.spec.name} has no checkpoint at step {step} (was it trained with "
                            "another checkpoint list?); pass --fresh to redo it")
        return path

    # ---- measuring --------------------------------------------------------------------
    # Every measured row goes through ``_memo``: one key (kind | what | extra | the spec's
    # fingerprint), looked up in ``measurements.json`` and stored there (atomically) when new.
    def _memo(self, kind: str, name: str, spec, extra: str, compute) -> dict:
        key = f"{kind}|{name}|{extra}|{spec_fingerprint(spec)}"
        if self.shared is not None and kind in SEED_FREE_REFERENCES:
            return self._shared_memo(key, compute)
        if key in self.cache:
            self.counts["cached"] += 1
            self.counts["earlier"] += key in self._earlier
            return dict(self.cache[key])
        start = time.perf_counter()
        row = compute()
        row["measure_seconds"] = time.perf_counter() - start
        self.timings["measure"] += row["measure_seconds"]
        self.counts["measured"] += 1
        self.cache[key] = row
        # other workers of the experiment may have added rows since this one read the file:
        # merged under the file's update lock, then written atomically
        with storage.storage_errors(self.cache_path), files.update_lock(self.cache_path):
            self.cache = {**self._read_cache(), **self.cache}
            atomic_write_json(self.cache_path, self.cache, indent=1, default=_json_default)
        return dict(row)

    def _shared_memo(self, key: str, compute) -> dict:
        """A seed-independent reference row in the experiment's ``measurements.json``
        (``shared``): the first unit to ask measures it while the others wait on the
        references' lock (not the file's own, which the write takes), then read it."""
        path = self.shared / MEASUREMENTS
        with storage.storage_errors(path), files.update_lock(path.with_name(f"{MEASUREMENTS}.references")):
            cache = _read_rows(path)
            if key in cache:
                self.counts["cached"] += 1
                return dict(cache[key])
            start = time.perf_counter()
            row = compute()
            row["measure_seconds"] = time.perf_counter() - start
            self.timings["measure"] += row["measure_seconds"]
            self.counts["measured"] += 1
            with files.update_lock(path):
                atomic_write_json(path, {**_read_rows(path), key: row}, indent=1, default=_json_default)
        return dict(row)

    def _read_cache(self) -> dict:
        """The rows of ``measurements.json`` ({} when absent or unreadable)."""
        return _read_rows(self.cache_path)

    def _state(self, spec) -> dict:
        """What the measures of one spec share across checkpoints (evaluators, task data)."""
        return self._measure_state.setdefault(spec_fingerprint(spec), {})

    def measure(self, checkpoint: Path, spec) -> dict:
        """``measures.run.measure_checkpoint`` of one checkpoint (loaded once for all the
        measures of ``spec``), cached; a retrained checkpoint (another ``meta.json``) is
        measured again."""
        from ...measures.run import measure_checkpoint

        checkpoint = Path(checkpoint)
        rel = self.rel(checkpoint)
        # (a damaged meta.json is reported by measure_checkpoint, naming the file)
        meta = (checkpoint / "meta.json").read_bytes().decode("utf-8", errors="replace")

        run_dir = checkpoint.parent.parent
        fresh = []

        def compute():
            row = measure_checkpoint(checkpoint, dataclasses.replace(spec, device=self._device_name()),
                                     self._state(spec))
            row["checkpoint"] = rel
            if files.is_run_dir(run_dir):  # not an embedded checkpoint: the run's tracker gets the row
                log_measured(self.settings.tracker, run_dir, run_dir.name, row)
            fresh.append(True)
            return row
        row = self._memo("checkpoint", rel, spec, _fingerprint(meta), compute)
        if not fresh and run_dir in self._mirrored:  # a reused run's tracker gets its cached rows too
            log_measured(self.settings.tracker, run_dir, run_dir.name, row)
        return row

    def reference(self, kind: str, cfg: PretrainConfig, spec) -> dict:
        """A row measured on no checkpoint of ``cfg``'s language, cached: ``lookup-table``
        (``measures.run.measure_lookup_table``: the loss on the run's held-out set, a probe
        per task of ``spec.lookup``) or a reference representation's few-shot probes
        (``measures.run.measure_reference``: ``random-init``, ``lookup``, ``oracle``)."""
        from ...measures.run import measure_lookup_table, measure_reference
        from ...training.runio import build_language

        what = {"language": cfg.language, "masking": cfg.masking, "mask_rate": cfg.mask_rate, "eval": cfg.eval}
        if kind == "random-init":  # the model's shape and initial weights too
            what.update(model=cfg.model, seed=cfg.seed)
        measured = dataclasses.replace(spec, device=self._device_name())

        def compute():
            language = build_language(cfg)
            if kind == "lookup-table":
                return measure_lookup_table(language, cfg, measured, self._state(spec))
            return measure_reference(kind, language, cfg, measured, self._state(spec))
        return self._memo(kind, cfg.language.name, spec, _fingerprint(what), compute)

    def embed(self, checkpoint: Path, target: Embedded) -> Path:
        """The checkpoint embedded function-preservingly as ``target`` says (``models.embed``,
        App. B.4; with its optimiser moments mapped for a fork to continue, or fresh), in
        ``embedded/<target.folder(...)>``; reused when already written. ``UserError`` when
        that shape cannot hold the model (the message says why)."""
        from ...training.embed_io import embed_checkpoint
        from ...training.checkpoint import read_meta

        checkpoint = Path(checkpoint)
        step = read_meta(checkpoint)["step"]
        out = layout.embedded_dir(self.root, target.folder(checkpoint.parent.parent.name, step))
        done = checkpoint_dir(out, step)
        if (done / "meta.json").exists() and \
                (done / "meta.json").stat().st_mtime >= (checkpoint / "meta.json").stat().st_mtime:
            return done
        if (out.exists() or out.is_symlink()) and not files.is_empty_dir(out) and not files.is_embedded_dir(out):
            raise UserError(f"{out} was not written by sameloss embed (no {files.EMBEDDED_MARKER} marker); reproduce "
                            "never writes into or deletes it: move it away or pass another --out")
        return embed_checkpoint(checkpoint, out, into=target.into, width_factor=target.width_factor,
                                extra_layers=target.extra_layers, optimizer=target.optimizer, force=True)

    # ---- helpers ----------------------------------------------------------------------
    def rel(self, path: Path) -> str:
        try:
            return str(Path(path).resolve().relative_to(self.root.resolve()))
        except ValueError:
            return str(path)

    def _device_name(self) -> str:
        from ...training.runio import resolve_device
        return str(resolve_device(self.settings.device))


def _json_default(obj):
    if isinstance(obj, Path):
        return str(obj)
    if dataclasses.is_dataclass(obj):
        return dataclasses.asdict(obj)
    return str(obj)
