"""Experiment trackers: a live view of a run's metrics in TensorBoard or W&B.

``metrics.jsonl`` stays the source of truth: a tracker mirrors what the loop appends to it
(``record_scalars`` names each value) and, from ``sameloss reproduce``, every row measured
on one of the run's checkpoints at that checkpoint's step (``row_scalars``).

``--tracker`` is an argument of ``pretrain`` and ``reproduce``, not a config key: tracking
never changes the trajectory, so a run trained with a tracker and resumed or reused
without one (or with another) is the same run.

* ``tensorboard`` (``torch.utils.tensorboard``; ``pip install 'sameloss[track]'``): event
  files in ``<run folder>/tb/``, so ``tensorboard --logdir runs`` (or an experiment's
  folder) shows every run under its folder's name. A resumed run purges the events past
  the checkpoint it resumes from (TensorBoard's ``purge_step``), as ``metrics.jsonl`` is
  truncated.
* ``wandb``: one W&B run per sameloss run, named like it, with an id fixed by the run
  folder (a resumed run continues its W&B run), its files under ``<run folder>/wandb/``;
  offline unless ``WANDB_MODE`` says otherwise (``wandb sync`` uploads). Never required:
  without the package it is one line asking for it.

What each keeps (issue 39):

* the resolved config: TensorBoard text (``config``, the run's TOML) and its hparams
  (flattened keys, with the run's metrics declared, for the HParams dashboard); W&B's run
  config;
* W&B steps: ``wandb.log`` drops a row logged at a step below the run's last, and a
  measured row (a checkpoint's trace, probes, ...) arrives after training has logged later
  steps, as does a resumed run's first window; so every row is logged without W&B's own
  step, each against a step metric of its own (``define_metric``): ``train/*`` and
  ``eval/*`` against ``step``, ``measure/*`` against ``measure/step``;
* W&B groups the runs of one experiment (``group``: the experiment folder's name, found
  from the run folder's place: ``experiment_of``);
* a reused run (``reproduce`` finds it finished): its ``metrics.jsonl`` and config are
  written to a tracker that does not hold them yet (``mirror_run``), else one line says
  they are there from the call that trained it.
"""

from __future__ import annotations

import argparse
import hashlib
import math
import os
from pathlib import Path

from ..errors import UserError

TRACKERS = ("none", "tensorboard", "wandb")
TENSORBOARD_DIR = "tb"

# a metrics.jsonl record's keys that are not ``train/<key>`` to a tracker (the training window's
# values: the loss, lr, gradient norm, speeds, epoch and each objective's logged mean)
_TRAIN = {"train_loss": "train/loss", "step": None, "eval": None}
# the exact held-out evaluation (a corpus: cross-entropy, train loss and their gap; no KL)
_EVAL = ("loss", "kl", "log_kl", "entropy", "train_loss", "gap")
# a measured row's fields that are not measurements
_NOT_MEASURED = {"step", "parameters", "measure_seconds", "n_tokens"}


def _number(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def record_scalars(record: dict) -> dict[str, float]:
    """The values of a ``metrics.jsonl`` record, named as the trackers show them."""
    out = {}
    for key, value in record.items():
        value, name = _number(value), _TRAIN.get(key, f"train/{key}")
        if value is not None and name is not None:
            out[name] = value
    evaluation = record.get("eval") or {}
    for key in _EVAL:
        value = _number(evaluation.get(key))
        if value is not None:
            out[f"eval/{key}"] = value
    return out


def row_scalars(row: dict) -> dict[str, float]:
    """The measurements of a measured row (``measures.run.measure_checkpoint``) as
    ``measure/<column>`` (trace, its standard error, probe accuracies, loss, KL, ...)."""
    out = {}
    for key, value in row.items():
        value = _number(value)
        if value is not None and key not in _NOT_MEASURED:
            out[f"measure/{key}"] = value
    return out


STEP_METRIC = "step"  # W&B: the step metric of train/* and eval/*
MEASURE_STEP = "measure/step"  # W&B: the step metric of measure/* (a checkpoint's step)
# the metrics the HParams dashboard shows beside each run's config
HPARAM_METRICS = ("eval/kl", "eval/loss", "train/loss")


def flat_config(config: dict, prefix: str = "") -> dict[str, object]:
    """A nested config as ``{"optim.lr": 0.001, ...}``: numbers, booleans and strings (a
    list or None as its text), as TensorBoard's hparams take them."""
    out: dict[str, object] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flat_config(value, f"{name}."))
        elif isinstance(value, (bool, int, float, str)):
            out[name] = value
        else:
            out[name] = str(value)
    return out


def config_text(config: dict) -> str:
    """The resolved config as TOML, for TensorBoard's text dashboard (a code block)."""
    from .. import config as configlib

    return "```toml\n" + configlib.dict_to_toml(config) + "```"


class Tracker:
    """No tracker (``none``): every call does nothing."""

    def log(self, scalars: dict[str, float], step: int) -> None:
        pass

    def log_measured(self, scalars: dict[str, float], step: int) -> None:
        """A measured row of the checkpoint at ``step`` (it may come after later steps)."""
        self.log(scalars, step)

    def close(self) -> None:
        pass


class TensorBoardTracker(Tracker):
    def __init__(self, run_dir: Path, purge_step: int | None = None, config: dict | None = None,
                 config_step: int = 0):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise UserError("--tracker tensorboard needs the tensorboard package: pip install 'sameloss[track]' "
                            "(or pip install tensorboard)") from None
        self.writer = SummaryWriter(str(Path(run_dir) / TENSORBOARD_DIR), purge_step=purge_step)
        if config is not None:
            self.write_config(config, config_step)

    def write_config(self, config: dict, step: int = 0) -> None:
        """The resolved config as text (``config``) and as hparams, in the run's own event
        files (not a sub-run, as ``SummaryWriter.add_hparams`` would make)."""
        from torch.utils.tensorboard.summary import hparams

        self.writer.add_text("config", config_text(config), step)
        experiment, start, end = hparams(flat_config(config), {name: math.nan for name in HPARAM_METRICS})
        for summary in (experiment, start, end):
            self.writer.file_writer.add_summary(summary, step)

    def log(self, scalars: dict[str, float], step: int) -> None:
        for name, value in scalars.items():
            self.writer.add_scalar(name, value, step)

    def close(self) -> None:
        self.writer.close()


def wandb_id(run_dir: Path) -> str:
    """The W&B run id of a run folder: the same folder, the same W&B run."""
    return "sameloss-" + hashlib.sha1(str(Path(run_dir).resolve()).encode()).hexdigest()[:12]


class WandbTracker(Tracker):
    def __init__(self, run_dir: Path, name: str, config: dict | None = None):
        try:
            import wandb
        except ImportError:
            raise UserError("--tracker wandb needs the wandb package (pip install wandb); or use "
                            "--tracker tensorboard") from None
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", "sameloss"), name=name, id=wandb_id(run_dir),
                              dir=str(run_dir), resume="allow", mode=os.environ.get("WANDB_MODE", "offline"),
                              group=experiment_of(run_dir), config=config or {}, allow_val_change=True)
        # every row against a step metric of its own: W&B's step must only grow, and a measured
        # row (or a resumed run's first window) comes after later steps were logged
        self.run.define_metric(STEP_METRIC)
        self.run.define_metric("train/*", step_metric=STEP_METRIC)
        self.run.define_metric("eval/*", step_metric=STEP_METRIC)
        self.run.define_metric(MEASURE_STEP)
        self.run.define_metric("measure/*", step_metric=MEASURE_STEP)

    def log(self, scalars: dict[str, float], step: int) -> None:
        self.run.log({**scalars, STEP_METRIC: step})

    def log_measured(self, scalars: dict[str, float], step: int) -> None:
        self.run.log({**scalars, MEASURE_STEP: step})

    def close(self) -> None:
        self.run.finish()


def experiment_of(run_dir: str | Path) -> str | None:
    """The name of the outermost experiment folder (``reproduce``'s, marked) holding the run
    folder ``run_dir`` — its W&B group; None for a run of its own (``pretrain``)."""
    from ..files import EXPERIMENT_MARKER

    found = None
    for folder in Path(run_dir).absolute().parents:
        if (folder / EXPERIMENT_MARKER).is_file():
            found = folder.name
    return found


def add_tracker_argument(parser: argparse.ArgumentParser) -> None:
    """``--tracker`` (the same flag on ``pretrain`` and ``reproduce``)."""
    parser.add_argument("--tracker", choices=TRACKERS, default="none",
                        help="mirror each run's metrics.jsonl (train loss, lr, gradient norm, steps/s, exact KL, "
                             "log-KL, entropy; reproduce: also every measured row at its checkpoint's step) to "
                             "an experiment tracker: tensorboard (event files in the run folder's tb/; needs pip "
                             "install 'sameloss[track]') or wandb (offline unless WANDB_MODE is set; needs wandb). "
                             "Not a config key: it never changes the run (default none)")


def check_tracker(kind: str) -> None:
    """``UserError`` now (before anything trains) when ``kind`` is unknown or its package
    is missing."""
    if kind not in TRACKERS:
        raise UserError(f"unknown tracker {kind!r}; choose from {', '.join(TRACKERS)}")
    package = {"tensorboard": "tensorboard", "wandb": "wandb"}.get(kind)
    if package is None:
        return
    import importlib.util

    if importlib.util.find_spec(package) is None:
        hint = "pip install 'sameloss[track]'" if kind == "tensorboard" else "pip install wandb"
        raise UserError(f"--tracker {kind} needs the {package} package ({hint})")


def open_tracker(kind: str, run_dir: str | Path, name: str, *, purge_step: int | None = None,
                 config: dict | None = None) -> Tracker:
    """The tracker ``kind`` of the run in ``run_dir`` (``purge_step``: a resumed run's
    first step, whose earlier events from that step on are dropped; ``config``: the run's
    resolved config, written to it — TensorBoard at ``purge_step``, or 0)."""
    check_tracker(kind)
    if kind == "tensorboard":
        return TensorBoardTracker(Path(run_dir), purge_step, config, purge_step or 0)
    if kind == "wandb":
        return WandbTracker(Path(run_dir), name, config)
    return Tracker()


def log_measured(kind: str, run_dir: str | Path, name: str, row: dict) -> None:
    """One measured row of a run's checkpoint, at its step, in the run's tracker."""
    scalars = row_scalars(row)
    if kind == "none" or not scalars or not isinstance(row.get("step"), int):
        return
    tracker = open_tracker(kind, run_dir, name)
    try:
        tracker.log_measured(scalars, row["step"])
    finally:
        tracker.close()


def tracked(kind: str, run_dir: str | Path) -> bool:
    """Whether the run in ``run_dir`` already holds output of tracker ``kind`` (its
    ``tb/`` or ``wandb/`` folder, written when it was trained or mirrored)."""
    folder = {"tensorboard": TENSORBOARD_DIR, "wandb": "wandb"}.get(kind)
    return folder is not None and (Path(run_dir) / folder).is_dir()


def mirror_run(kind: str, run_dir: str | Path, name: str, records: list[dict], config: dict | None) -> bool:
    """Write a finished run's ``metrics.jsonl`` ``records`` and ``config`` to tracker
    ``kind`` when the run does not hold that tracker's output yet (a run trained without
    it, now reused); returns whether it wrote (False: it was there already)."""
    if kind == "none" or tracked(kind, run_dir):
        return False
    tracker = open_tracker(kind, run_dir, name, config=config)
    try:
        for record in records:
            scalars = record_scalars(record)
            if scalars and isinstance(record.get("step"), int):
                tracker.log(scalars, record["step"])
    finally:
        tracker.close()
    return True
