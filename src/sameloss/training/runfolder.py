"""What to do with a run folder: the one place that decides between reusing a finished run,
resuming or extending one, training a new one, replacing one, and refusing — for
``sameloss pretrain`` (``--resume``, ``--fresh`` or neither) and for a ``Study`` (which
reuses what it can) alike — and the one definition of a config change a run can be resumed
across (when the CLI, the loop and the Study each decided, the Study's test of
"resumable" disagreed with the loop's on ``steps``).

``plan(run_dir, cfg, mode)`` only reads; ``loop.pretrain`` carries a plan out under the
run's lock (``files.folder_lock``), so the decision and the writing cannot be split by a
second process.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .. import config as configlib
from .. import files
from ..errors import UserError
from . import checkpoint as ckpt
from . import runio
from .config import PretrainConfig

# Config keys that may differ when a run is resumed: they do not change the trajectory
# (``steps`` only while the schedule does not depend on it: see ``trajectory_changes``).
RESUMABLE_CHANGES = frozenset({"steps", "checkpoints", "checkpoints_log", "save_every", "log_every", "device",
                               "eval.every", "eval.at_checkpoints"})
MODES = ("new", "resume", "fresh", "auto")


def config_differences(saved: dict, wanted: dict) -> list[str]:
    """Dotted keys whose values differ (``saved`` as ``runio.read_config_dict`` returns it:
    a key missing from the TOML already holds its default)."""
    a, b = configlib.flatten(saved), configlib.flatten(wanted)
    return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))


def trajectory_changes(saved: dict, wanted: dict) -> list[str]:
    """The differing keys that would change the run's trajectory, each as ``config key 'K'
    was A and is now B``; empty when a run saved with ``saved`` can be resumed with ``wanted``. ``steps``
    counts as a change of trajectory when the schedule's warm-up, decay or final stretch is set from it."""
    a, b = configlib.flatten(saved), configlib.flatten(wanted)
    schedule_uses_steps = (b.get("optim.warmup_fraction") is not None or (b.get("optim.decay_steps") or 0) > 0
                           or (b.get("optim.final_steps") or 0) > 0)
    return [f"config key {key!r} was {a.get(key)!r} and is now {b.get(key)!r}" for key in config_differences(saved, wanted)
            if key not in RESUMABLE_CHANGES or (key == "steps" and schedule_uses_steps)]


@dataclass(frozen=True)
class Plan:
    """``action``: ``reuse`` (nothing to train), ``resume`` (from the newest checkpoint that
    loads, to ``cfg.steps``), ``train`` (a new run) or ``replace`` (delete the run folder, a
    sameloss run, and train anew). ``status`` is what a Study reports (reused, extended,
    resumed, trained); ``message`` says it in a line."""

    action: str
    status: str
    message: str
    evaluation: dict | None = None  # reuse: the finished run's final evaluation (its summary's)


@dataclass(frozen=True)
class Found:
    """What a run folder holds, each file read once: its complete checkpoints (oldest
    first), its saved config (as ``runio.read_config_dict``) and ``summary.json``
    (``None``: absent; a damaged one is a ``UserError`` naming it)."""

    checkpoints: list[Path]
    config: dict
    summary: dict | None

    @classmethod
    def read(cls, run_dir: Path) -> Found:
        """The folder's files; without a complete checkpoint, none of the others is read (a
        run killed before its first is replaced whatever they hold)."""
        checkpoints = ckpt.complete_checkpoints(run_dir)
        if not checkpoints:
            return cls([], {}, None)
        return cls(checkpoints, runio.read_config_dict(run_dir / "config.toml"), runio.read_summary(run_dir))

    @property
    def newest(self) -> int:
        return int(self.checkpoints[-1].name[len(ckpt.PREFIX):])

    @property
    def finished(self) -> bool:
        """A run that ended: its summary's step is the newest complete checkpoint's."""
        step = None if self.summary is None else self.summary.get("step")
        return isinstance(step, int) and step == self.newest


def plan(run_dir: str | Path, cfg: PretrainConfig, mode: str, fresh_hint: str = "pass --fresh to replace it") -> Plan:
    """What to do with ``run_dir`` for a run of ``cfg``; ``UserError`` (one line) to refuse.

    ``mode``: ``new`` (an existing run is refused), ``resume`` (continue the run in the
    folder: refused when nothing is there or the config changed its trajectory), ``fresh``
    (replace a run folder — never a folder sameloss did not write) or ``auto`` (a Study:
    reuse a finished run with this config, extend or resume one whose config differs only
    in resumable keys, restart one killed before its first checkpoint, refuse the rest).
    ``fresh_hint`` ends a refusal that ``--fresh`` would lift. The cases, in order:"""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
    run_dir = Path(run_dir)
    name = run_dir.name
    # 1. nothing there: a new run (nothing to resume)
    if run_dir.is_symlink() or (run_dir.exists() and not run_dir.is_dir()):
        raise UserError(f"{run_dir} exists and is not a run folder; choose another name=")
    if not run_dir.exists() or files.is_empty_dir(run_dir):
        if mode == "resume":
            raise UserError(f"nothing to resume in {run_dir}: no complete checkpoint")
        return Plan("train", "trained", f"run {name}: training {cfg.steps} steps")
    # 2. a folder sameloss did not write: never touched
    if not files.is_run_dir(run_dir):
        if mode == "auto":
            raise UserError(f"{run_dir} is not a sameloss run folder (no {files.RUN_MARKER} marker); reproduce "
                            "never writes into or deletes it: move it away or pass another --out")
        raise UserError(f"{run_dir} is not a sameloss run folder (no {files.RUN_MARKER} marker and no config.toml "
                        f"written by sameloss pretrain); sameloss never writes into or deletes it: remove it "
                        "yourself or choose another name=")
    # 3. a run: --fresh replaces it, a new run is refused
    if mode == "fresh":
        return Plan("replace", "trained", f"run {name}: replacing it, training {cfg.steps} steps")
    if mode == "new":
        raise UserError(f"{run_dir} already holds a run; pass --resume to continue it, --fresh to replace it, or "
                        "name=... for a new run")
    # 4. resume or auto: killed before its first checkpoint, there is nothing to keep
    found = Found.read(run_dir)
    if not found.checkpoints:
        if mode == "resume":
            raise UserError(f"nothing to resume in {run_dir}: no complete checkpoint")
        return Plan("replace", "trained", f"run {name}: training {cfg.steps} steps (the earlier start left no "
                                          "checkpoint)")
    # 5. past the steps asked for, or another trajectory: refused
    wanted = configlib.to_dict(cfg)
    if found.newest > cfg.steps:
        raise UserError(f"cannot resume: {run_dir} is at step {found.newest}, past steps={cfg.steps}; {fresh_hint}")
    blocking = trajectory_changes(found.config, wanted)
    if blocking:
        more = f" (and {len(blocking) - 1} more)" if len(blocking) > 1 else ""
        if found.finished:
            raise UserError(f"{run_dir} holds a finished run with another config: {blocking[0]}{more}; {fresh_hint}")
        raise UserError(f"cannot resume the run in {run_dir}: {blocking[0]}{more}; {fresh_hint}")
    # 6. finished at these steps: reused; finished earlier: extended; else resumed
    if found.finished and found.newest == cfg.steps:
        return Plan("reuse", "reused", f"{run_dir} is complete (step {found.newest} of {cfg.steps}); nothing to do",
                    found.summary.get("eval") or {})
    if found.finished:
        changed = config_differences(found.config, wanted)
        return Plan("resume", "extended", f"run {name}: continuing to {cfg.steps} steps ({', '.join(changed)} "
                                          "changed)")
    return Plan("resume", "resumed", f"run {name}: resuming an interrupted run")
