"""The machinery shared by the recipes: ``RunSpec`` (a run, turned into a ``PretrainConfig``
here and only here) and ``Study`` (one experiment folder: train a run or reuse / resume it,
measure a checkpoint or a reference representation (look-up table, random-init encoder,
oracle) or reuse the cached row, embed a checkpoint, run seed studies in worker processes).
A recipe never trains or measures by hand: what it trains is ``RunSpec``s (forks
included, ``init_from``), what it measures is a ``measures.run.MeasureSpec``.

An experiment lives in one folder, ``<out>/<experiment>-<scale>[-seed<N>]/``:

* ``runs/<run>/`` — every pre-training run (``config.toml``, ``metrics.jsonl``,
  ``checkpoints/``, ``summary.json`` once finished);
* ``embedded/<run>-step<N>/`` — checkpoints embedded into a larger shape (App. B.4);
* ``measurements.json`` — every measured row, keyed by what was measured (a checkpoint and
  its ``meta.json``, or a reference and its language / model settings) and the measure
  settings, written (atomically) after each measurement;
* ``seeds/seed<N>/`` — a recipe's per-seed studies (``Study.map_seeds``), each laid out
  as this one;
* ``results.csv``, ``report.md``, ``*.png`` — written by ``report.py``.

Re-running reuses: a run with ``summary.json`` and the same config is not trained again; a
run with checkpoints but no ``summary.json`` (interrupted) is resumed; a row in
``measurements.json`` with the same key is not measured again. ``fresh=True`` deletes the
experiment folder first — only when everything in it is sameloss's (``folder.py``: the
folder is marked, and nothing is ever deleted without sameloss's marker). A ``Study``
holds the folder's lock (``files.folder_lock``) from its creation to ``close()`` (it is a
context manager), so two processes never write one experiment.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import multiprocessing
import shutil
import sys
import time
import weakref
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import config as configlib
from .. import files
from ..errors import UserError
from ..files import atomic_write_json
from . import folder as experiment_folder
from ..training.checkpoint import checkpoint_dir, complete_checkpoints
from ..training.config import PretrainConfig
from ..training.loop import RESUMABLE_CHANGES, pretrain
from ..training.runio import read_config_dict, read_summary

MEASUREMENTS = experiment_folder.MEASUREMENTS


Setting = tuple[str, Any]  # a dotted config key and its value, e.g. ("optim.lr", 0.05)


@dataclass(frozen=True)
class RunSpec:
    """One pre-training run of a recipe.

    name: folder name (unique in the experiment); settings: ``(dotted config key, value)``
    pairs, the scale's first and the variant's after (a key that ``PretrainConfig`` lacks
    is refused here); measure_steps: the checkpoints to measure (empty: the last one);
    label: a short human name; group: what it is compared with (e.g. ``"adamw"``).
    """

    name: str
    settings: tuple[Setting, ...]
    label: str = ""
    group: str = ""
    measure_steps: tuple[int, ...] = ()

    def __post_init__(self):
        for key, _ in self.settings:
            if key not in _CONFIG_KEYS:
                raise ValueError(f"run {self.name}: {key!r} is not a config key")

    @property
    def overrides(self) -> tuple[str, ...]:
        """The settings as ``key=value`` config overrides (as ``sameloss pretrain`` takes them)."""
        return tuple(f"{key}={_override_value(value)}" for key, value in self.settings)

    def config(self) -> PretrainConfig:
        return configlib.load(PretrainConfig, None, [*self.overrides, f"name={self.name}"])


def _config_keys(cls, prefix: str = "") -> set[str]:
    keys = set()
    for f in dataclasses.fields(cls):
        keys.add(prefix + f.name)
        if dataclasses.is_dataclass(f.default_factory):  # a section, e.g. optim
            keys |= _config_keys(f.default_factory, prefix + f.name + ".")
    return keys


_CONFIG_KEYS = _config_keys(PretrainConfig)


def _override_value(value) -> str:
    if isinstance(value, (tuple, list)):
        return "[" + ",".join(str(v) for v in value) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


@dataclass
class RunInfo:
    spec: RunSpec
    config: PretrainConfig
    path: Path
    status: str  # trained | resumed | extended | reused
    seconds: float
    summary: dict = field(default_factory=dict)


def config_differences(saved: dict, wanted: dict) -> list[str]:
    """Dotted keys whose values differ (``saved`` as ``runio.read_config_dict`` returns it:
    a key missing from the TOML already holds its default)."""
    a, b = configlib.flatten(saved), configlib.flatten(wanted)
    return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))


def _fingerprint(obj) -> str:
    text = json.dumps(obj, sort_keys=True, default=str)
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def spec_fingerprint(spec) -> str:
    d = dataclasses.asdict(spec)
    d.pop("device", None)
    return _fingerprint(d)


def recipe(name: str):
    """The module of recipe ``name`` (``sameloss.registry``): how one recipe composes others
    (``figure1``) without importing them."""
    from .. import registry

    return registry.recipe(name)


def experiment_dir_name(experiment: str, scale: str, seed: int) -> str:
    return f"{experiment}-{scale}" + (f"-seed{seed}" if seed else "")


@dataclass
class Measured:
    """One measured checkpoint of a run: its folder and its model row (``model_row``)."""

    checkpoint: Path
    row: dict


def model_row(row: dict, experiment: str, language: str, spec: RunSpec) -> dict:
    """A measured row with the fields every recipe adds (``model`` is the unique id)."""
    out = {"model": f"{spec.name}@{row['step']}", "experiment": experiment, "language": language,
           "group": spec.group, "label": spec.label, "run": spec.name}
    out.update({k: v for k, v in row.items() if k != "run"})
    return out


class Study:
    """One experiment folder: trains runs, measures their checkpoints and caches the rows,
    writes every file under ``root`` (see the module docstring). ``seed`` is the seed of
    the recipe's runs and measures (the folder of another seed is another study)."""

    def __init__(self, root: str | Path, *, seed: int = 0, fresh: bool = False, progress: bool = True,
                 device: str = "auto", log=None):
        self._bar = None
        self.root = Path(root)
        self.seed = seed
        # the folder's lock, held until close() (or, for a Study nobody closes — a seed
        # sub-study in a worker process — until it is garbage-collected)
        self._held = contextlib.ExitStack()
        self._held.enter_context(files.folder_lock(self.root, "experiment"))
        weakref.finalize(self, self._held.close)
        try:
            legacy = experiment_folder.check_usable(self.root, fresh)
            with files.storage_errors(self.root):
                if fresh and self.root.exists():
                    with contextlib.ExitStack() as runs:  # none of them is being written by another process
                        for run in experiment_folder.run_folders(self.root):
                            runs.enter_context(files.folder_lock(run, "run"))
                        shutil.rmtree(self.root)  # checked: it holds nothing but sameloss's outputs
                new = not self.root.exists() or files.is_empty_dir(self.root)
                self.root.mkdir(parents=True, exist_ok=True)
                if new or legacy:  # a folder of an earlier version: its report's files are listed as ours
                    experiment_folder.mark(self.root, experiment_folder.legacy_outputs(self.root) if legacy else set())
        except BaseException:
            self.close()
            raise
        self.runs_dir = self.root / "runs"
        self.progress = progress
        self.device = device
        self._log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
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

    def log(self, msg: str) -> None:
        if self._bar is not None:
            self._bar.write(msg, file=sys.stderr)
        else:
            self._log(msg)

    def bar(self, items: list, desc: str):
        """A progress bar over the checkpoints being measured (a plain list when off). It
        counts only the checkpoints measured now: one whose row comes from the cache
        leaves the total instead (its "rate" — thousands per second — means nothing)."""
        from ..progress import progress_bar

        if not self.progress or len(items) < 2:
            return items
        bar = progress_bar(total=len(items), desc=desc, unit="checkpoint", leave=False)
        self._bar = bar

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
                self._bar = None
        return gen()

    # ---- training ---------------------------------------------------------------------
    def train(self, spec: RunSpec) -> RunInfo:
        if spec.name in self.runs:
            known = self.runs[spec.name]
            if known.spec.settings != spec.settings:
                raise RuntimeError(f"two recipes define run {spec.name!r} differently:\n{known.spec.overrides}\n"
                                   f"{spec.overrides}")
            return known
        cfg = spec.config()
        if self.device != "auto" and cfg.device != self.device:
            cfg = dataclasses.replace(cfg, device=self.device)
        run_dir = self.runs_dir / spec.name
        if (run_dir.exists() or run_dir.is_symlink()) and not files.is_empty_dir(run_dir) \
                and not files.is_run_dir(run_dir):
            raise UserError(f"{run_dir} is not a sameloss run folder (no {files.RUN_MARKER} marker); reproduce "
                            "never writes into or deletes it: move it away or pass another --out")
        start = time.perf_counter()
        summary_path = run_dir / "summary.json"
        wanted = configlib.to_dict(cfg)
        if summary_path.exists():
            diff = config_differences(read_config_dict(run_dir / "config.toml"), wanted)
            if not diff:
                status = "reused"
            elif set(diff) <= RESUMABLE_CHANGES:
                self.log(f"run {spec.name}: continuing to {cfg.steps} steps ({', '.join(diff)} changed)")
                self._pretrain(cfg, run_dir, resume=True)
                status = "extended"
            else:
                raise UserError(f"{run_dir} holds a finished run with another config ({', '.join(diff[:3])} "
                                "differ); pass --fresh to redo the experiment or remove that folder")
        elif complete_checkpoints(run_dir):
            self.log(f"run {spec.name}: resuming an interrupted run")
            self._pretrain(cfg, run_dir, resume=True)
            status = "resumed"
        else:
            if run_dir.exists() and not files.is_empty_dir(run_dir):
                shutil.rmtree(run_dir)  # a run started but no complete checkpoint: nothing to keep
            self.log(f"run {spec.name}: training {cfg.steps} steps")
            self._pretrain(cfg, run_dir, resume=False)
            status = "trained"
        seconds = time.perf_counter() - start
        self.timings["train"] += seconds
        summary = read_summary(run_dir) or {}
        info = RunInfo(spec, cfg, run_dir, status, seconds, summary)
        self.runs[spec.name] = info
        return info

    def _pretrain(self, cfg: PretrainConfig, run_dir: Path, resume: bool) -> None:
        try:
            pretrain(cfg, run_dir, resume=resume, progress=self.progress)
        except UserError as exc:
            if resume and "cannot resume" in str(exc):
                raise UserError(f"{exc}; pass --fresh to redo the experiment") from None
            raise

    def checkpoints(self, info: RunInfo, steps: tuple[int, ...] = ()) -> list[Path]:
        """The checkpoints at ``steps`` of a trained run (empty: the last one)."""
        steps = steps or (info.config.steps,)
        out = []
        for step in steps:
            path = checkpoint_dir(info.path, step)
            if not (path / "meta.json").exists():
                raise UserError(f"run {info.spec.name} has no checkpoint at step {step} (was it trained with "
                                "another checkpoint list?); pass --fresh to redo it")
            out.append(path)
        return out

    def train_and_measure(self, spec: RunSpec, mspec, experiment: str, language: str
                          ) -> tuple[RunInfo, list[Measured]]:
        """Train (or reuse) one run and measure its ``spec.measure_steps`` checkpoints
        (empty: the last one), each as a ``model_row``."""
        info = self.train(spec)
        measured = []
        for ck in self.bar(self.checkpoints(info, spec.measure_steps), f"measuring {spec.name}"):
            self.log(f"measure {self.rel(ck)}")
            measured.append(Measured(ck, model_row(self.measure(ck, mspec), experiment, language, spec)))
        return info, measured

    # ---- measuring --------------------------------------------------------------------
    # Every measured row goes through ``_memo``: one key (kind | what | extra | the spec's
    # fingerprint), looked up in ``measurements.json`` and stored there (atomically) when new.
    def _memo(self, kind: str, name: str, spec, extra: str, compute) -> dict:
        key = f"{kind}|{name}|{extra}|{spec_fingerprint(spec)}"
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
        with files.storage_errors(self.cache_path):
            atomic_write_json(self.cache_path, self.cache, indent=1, default=_json_default)
        return dict(row)

    def _state(self, spec) -> dict:
        """What the measures of one spec share across checkpoints (evaluators, task data)."""
        return self._measure_state.setdefault(spec_fingerprint(spec), {})

    def measure(self, checkpoint: Path, spec) -> dict:
        """``measures.run.measure_checkpoint`` of one checkpoint (loaded once for all the
        measures of ``spec``), cached; a retrained checkpoint (another ``meta.json``) is
        measured again."""
        from ..measures.run import measure_checkpoint

        checkpoint = Path(checkpoint)
        rel = self.rel(checkpoint)
        # (a damaged meta.json is reported by measure_checkpoint, naming the file)
        meta = (checkpoint / "meta.json").read_bytes().decode("utf-8", errors="replace")

        def compute():
            row = measure_checkpoint(checkpoint, dataclasses.replace(spec, device=self._device_name()),
                                     self._state(spec))
            row["checkpoint"] = rel
            return row
        return self._memo("checkpoint", rel, spec, _fingerprint(meta), compute)

    def reference(self, kind: str, cfg: PretrainConfig, spec) -> dict:
        """A row measured on no checkpoint of ``cfg``'s language, cached: ``lookup-table``
        (``measures.run.measure_lookup_table``: the loss on the run's held-out set, a probe
        per task of ``spec.lookup``) or a reference representation's few-shot probes
        (``measures.run.measure_reference``: ``random-init``, ``lookup``, ``oracle``)."""
        from ..measures.run import measure_lookup_table, measure_reference
        from ..training.runio import build_language

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

    def lookup(self, run: RunInfo, spec) -> dict:
        """The look-up table of a run's language (``reference("lookup-table", ...)``)."""
        return self.reference("lookup-table", run.config, spec)

    def map_seeds(self, work, seeds: list[int], workers: int, *args) -> list:
        """``work(study, seed, *args)`` for each seed, each in its own study folder
        ``seeds/seed<N>/`` (the seed is the study's seed), in ``workers`` processes (one:
        here). The seed studies' runs, timings and counts are added to this one; returns
        ``work``'s results in the order of ``seeds``. ``work`` and ``args`` must pickle."""
        calls = [(work, self.root / "seeds", seed, self.progress and workers <= 1, self.device, args)
                 for seed in seeds]
        if workers <= 1:
            done = [_seed_study(*c) for c in calls]
        else:
            import torch

            from .. import threads

            ctx = multiprocessing.get_context("spawn")
            n = torch.get_num_threads()  # this process's count (threads.configure_threads): the workers' too
            with threads.for_children(n), ProcessPoolExecutor(max_workers=workers, mp_context=ctx,
                                                              initializer=threads.init_worker,
                                                              initargs=(n,)) as pool:
                futures = [pool.submit(_seed_study, *c) for c in calls]
                done = []
                for seed, fut in zip(seeds, futures):
                    done.append(fut.result())
                    self.log(f"seed {seed} done")
        for _, runs, timings, counts in done:
            self.runs.update(runs)
            for k in self.timings:
                self.timings[k] += timings[k]
            for k in self.counts:
                self.counts[k] += counts[k]
        return [result for result, *_ in done]

    def embed(self, checkpoint: Path, into: str) -> Path:
        """The checkpoint embedded function-preservingly into the transformer shape named
        ``into`` (``models.embed``, App. B.4); reused when already written. ``UserError``
        when that shape cannot hold the model (the message says why)."""
        from ..training.embed_io import embed_checkpoint
        from ..training.checkpoint import read_meta

        checkpoint = Path(checkpoint)
        step = read_meta(checkpoint)["step"]
        run = checkpoint.parent.parent.name
        out = self.root / "embedded" / f"{run}-step{step}-into-{into}"
        target = checkpoint_dir(out, step)
        if (target / "meta.json").exists() and \
                (target / "meta.json").stat().st_mtime >= (checkpoint / "meta.json").stat().st_mtime:
            return target
        if (out.exists() or out.is_symlink()) and not files.is_empty_dir(out) and not files.is_embedded_dir(out):
            raise UserError(f"{out} was not written by sameloss embed (no {files.EMBEDDED_MARKER} marker); reproduce "
                            "never writes into or deletes it: move it away or pass another --out")
        return embed_checkpoint(checkpoint, out, into=into, force=True)

    # ---- helpers ----------------------------------------------------------------------
    def rel(self, path: Path) -> str:
        try:
            return str(Path(path).resolve().relative_to(self.root.resolve()))
        except ValueError:
            return str(path)

    def _device_name(self) -> str:
        from ..training.runio import resolve_device
        return str(resolve_device(self.device))


def _seed_study(work, root: Path, seed: int, progress: bool, device: str, args: tuple):
    """One seed's study (``Study.map_seeds``; a worker process's entry point)."""
    with Study(root / f"seed{seed}", seed=seed, progress=progress, device=device) as study:  # its folder's lock
        result = work(study, seed, *args)
    return result, study.runs, study.timings, study.counts


def _json_default(obj):
    if isinstance(obj, Path):
        return str(obj)
    if dataclasses.is_dataclass(obj):
        return dataclasses.asdict(obj)
    return str(obj)
