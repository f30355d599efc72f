"""The training loop: ``pretrain(cfg, run_dir)`` behind ``sameloss pretrain`` trains a run alone,
the training call (``train``) of one member; an ensemble (``training.ensemble``) is the same
call with S members.

``train`` builds each run's member (``member.build``, the one set-up), then steps a global
counter from the earliest member's first step to the latest member's last (``Trainer``): a
member joins the stack at its first step (a fork's continues from its checkpoint, a resumed
run's from its newest checkpoint) and leaves after its last or when its loss is no longer
finite, so the stack only holds members that step now (no compute for a masked member, at
the price of rebuilding the stack at most twice per member); each step is
``step.train_step``; at a member's log step its window's means (``training.window``) and, every
``eval.every`` steps, the exact held-out loss (``evaluate.make_evaluator``) go to
``metrics.jsonl`` and its tracker (``tracking``); its checkpoints let ``resume=True`` continue a
killed run to bit-identical weights on the CPU; ``summary.json`` ends it.

A run alone raises its errors (``TrainingDiverged``: its loss became NaN or infinite) and
leaves the global RNG as its run left it; an ensemble member that fails leaves with the line
its run alone would raise (``Failure``), the others go on, and the caller's global RNG is
restored. Under ``torchrun`` the one run trains data-parallel (DDP): each process takes a slice
of the same global batch and the loss is normalised by the global number of targets, so the
update equals the single-process one; rank 0 writes.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

import torch

from .. import files
from ..errors import UserError
from ..progress import progress_bar
from . import distributed as dist
from . import runfolder, runio
from .config import PretrainConfig
from .member import Member, Shared, build, diverged_message
from .step import make, train_step
from .tracking import check_tracker
from .window import Windows

# device types on which a vmap stack's batches are drawn ahead by worker processes (ensemble_data)
DRAW_AHEAD = ("cuda",)


class TrainingDiverged(UserError):
    """The loss became NaN or infinite."""


@dataclass(frozen=True)
class Failure:
    """A member that did not finish: the one line its run alone would have raised."""

    message: str


def pretrain(cfg: PretrainConfig, run_dir: str | Path, resume: bool = False, progress: bool = True,
             stop_after: int | None = None, fresh: bool = False, plan: runfolder.Plan | None = None,
             tracker: str = "none") -> dict:
    """Pre-train the MLM of ``cfg`` into the run folder ``run_dir``.

    Args:
        cfg: every setting of the run (``config.load(PretrainConfig, file, overrides)``).
        run_dir: the run's folder (``runs/NAME``): config.toml, metrics.jsonl, checkpoints.
        resume: continue from the newest checkpoint that loads.
        progress: show a progress bar.
        stop_after: end the call early, as if killed right after that step's checkpoint
            (used to test resuming).
        fresh: replace an earlier run in ``run_dir`` (only a folder sameloss made as a run).
        plan: what to do with the folder, if the caller decided it under the run's lock.
        tracker: ``none``, ``tensorboard`` or ``wandb`` (``tracking``; not part of the
            config: it never changes the trajectory).

    Returns:
        the final exact evaluation: ``loss``, ``entropy``, ``kl`` (with ``kl_std``) and
        ``n_tokens`` on a synthetic language; held-out and training cross-entropy on a corpus.

    What to do with the folder is ``runfolder.plan``'s decision — ``plan`` if the caller
    made it under this run's lock, else made here from ``resume`` / ``fresh``: ``resume``
    continues from the newest checkpoint that loads (damaged newer ones are skipped with a
    warning on stderr), and a finished run is left untouched and its final evaluation
    returned; ``fresh`` replaces a run folder — only one that ``files.is_run_dir``
    recognises, and only once everything else is built; neither refuses an existing run.
    A new run's folder is created after the language, model and evaluator are built, and
    removed again if this call fails before its first checkpoint.

    The run folder's lock (``files.folder_lock``, rank 0 only under DDP) is held for the
    whole call: a second process on the same run gets one line naming the holder."""
    if resume and fresh:
        raise ValueError("resume and fresh contradict each other")
    run_dir = Path(run_dir)
    check_tracker(tracker)  # an unknown tracker or a missing package: one line, before anything is built
    rank, _ = dist.setup()
    with files.folder_lock(run_dir, "run") if rank == 0 else contextlib.nullcontext():
        plan = plan or runfolder.plan(run_dir, cfg, "resume" if resume else "fresh" if fresh else "new")
        if plan.action == "reuse":
            return plan.evaluation
        return train([cfg], [run_dir], [plan], Options(progress, stop_after, tracker=tracker, alone=True))[0]


@dataclass(frozen=True)
class Options:
    """How a training call runs: ``progress`` bar; ``stop_after``: end after that step's
    checkpoints, as if killed (tests of resuming); ``strategy``: the stack's back-end
    (``loop`` or ``vmap``, ``training.step``); ``tracker``: the members' tracker kind;
    ``alone``: a run trained alone (its errors raised, the global RNG left as its run's)."""

    progress: bool = True
    stop_after: int | None = None
    strategy: str = "loop"
    tracker: str = "none"
    alone: bool = False


def train(cfgs: list[PretrainConfig], run_dirs: list[Path], plans: list, options: Options,
          results: list | None = None) -> list:
    """Train the runs of ``cfgs`` into ``run_dirs`` by their folders' ``plans`` (``None``: a
    refused folder, whose ``Failure`` is in ``results`` already; none is ``reuse``); per run,
    its final evaluation (a stopped one: its latest) or its ``Failure``."""
    results = [None] * len(cfgs) if results is None else results
    rank, world_size = dist.setup()
    if world_size > 1 and len(cfgs) > 1:
        raise UserError("an ensemble trains in one process; under torchrun train one run")
    device = dist.process_device(runio.resolve_device(cfgs[0].device), world_size)
    saved_rng = torch.get_rng_state()
    members: list[Member] = []
    try:
        shared = Shared(runio.build_language(cfgs[0]), device, options.tracker, rank, world_size)
        for i, (cfg, run_dir, plan) in enumerate(zip(cfgs, run_dirs, plans)):
            if plan is None:
                continue
            try:
                got = build(i, cfg, Path(run_dir), plan, shared)
            except UserError as exc:
                if options.alone:
                    raise
                results[i] = Failure(str(exc).splitlines()[0])
                continue
            if isinstance(got, dict):  # finished but for its summary
                results[i] = got
            else:
                members.append(got)
        if members:
            Trainer(members, results, options).run()
    finally:
        for m in members:
            m.tracker.close()
            if results[m.index] is None or isinstance(results[m.index], Failure):
                m.remove_if_empty()
        if options.alone and members:  # a run alone owns the global RNG: left as its run left it
            torch.set_rng_state(members[0].rng)
            if members[0].cuda_rng is not None:
                torch.cuda.set_rng_state(members[0].cuda_rng)
        else:
            torch.set_rng_state(saved_rng)
    for m in members:
        if results[m.index] is None:  # stopped early (``stop_after``)
            results[m.index] = m.last_eval
    return [r if r is not None else {} for r in results]


class Trainer:
    """The steps of one training call (module docstring): members join and leave the stack,
    each step is ``train_step`` on it, then each member's log line, evaluation and checkpoint."""

    def __init__(self, members: list[Member], results: list, options: Options):
        self.members, self.results, self.options = members, results, options
        first = members[0]
        self.device, self.language, self.rank, self.world_size = first.device, first.language, first.rank, \
            first.world_size
        self.active: list[Member] = []
        self.stack = None
        self.windows: Windows | None = None
        self.ahead = None  # the members' batches drawn ahead (ensemble_data; vmap on CUDA)
        self.first = min(m.start for m in members)
        self.last = max(m.cfg.steps for m in members)
        desc = first.cfg.name if len(members) == 1 else f"ensemble of {len(members)}"
        self.bar = progress_bar(total=self.last, initial=self.first - 1, desc=desc, unit="step",
                                disable=not options.progress or self.rank != 0)

    def run(self) -> None:
        stop = self.options.stop_after
        try:
            for m in self.members:
                m.train_model.train()
            for step in range(self.first, self.last + 1):
                joining = [m for m in self.members if m.start == step]
                if joining:
                    self._restack(self.active + joining, step)
                if self.active:
                    self._one(step)
                self.bar.update(1)
                if stop is not None and step >= stop:
                    break
        finally:
            self.bar.close()
            self._restack([], self.last + 1)

    # ---- membership --------------------------------------------------------------------
    def _restack(self, members: list[Member], step: int) -> None:
        """The stack and log windows rebuilt for ``members`` (those already active, then the
        joining), who train from ``step`` on."""
        kept = [i for i, a in enumerate(self.active) if any(a is m for m in members)]
        joining = [m for m in members if not any(a is m for a in self.active)]
        windows = None
        if members:
            windows = (self.windows.regroup(kept, [m.window for m in joining]) if self.windows is not None
                       else Windows.of([m.window for m in joining], self.device))
        if self.stack is not None:
            self.stack.release()
        if self.ahead is not None:
            self.ahead.close()
        self.active, self.stack, self.windows, self.ahead = members, None, None, None
        if not members:
            return
        self.stack, self.windows = make(members, self.options.strategy), windows
        if self.options.strategy == "vmap" and self.device.type in DRAW_AHEAD:
            from .ensemble_data import Ahead

            cfg = members[0].cfg
            self.ahead = Ahead(self.language, [m.cfg.seed for m in members], step, max(m.cfg.steps for m in members),
                               (cfg.batch_size, members[0].rate, cfg.mask_replace))

    # ---- one step ----------------------------------------------------------------------
    def _one(self, step: int) -> None:
        active, stop = self.active, self.options.stop_after
        logs = [step % m.cfg.log_every == 0 or step == m.cfg.steps for m in active]
        drawn = self.ahead.get(step) if self.ahead is not None else None
        self.windows.add(train_step(self.stack, step, any(logs), drawn), step, self.world_size)
        evaluates = [m.rank == 0 and step in m.evaluate_at for m in active]
        saves = [step in m.keep or step % m.cfg.save_every == 0 or step == stop for m in active]
        if not any(a or b or c for a, b, c in zip(logs, evaluates, saves)):
            return
        failed = self._diverged()  # the one read of the device between log lines
        done = []
        for i, m in enumerate(active):
            if i in failed:
                continue
            if logs[i] or evaluates[i] or saves[i]:
                self._log_save(i, m, step, logs[i], evaluates[i], saves[i])
            if step == m.cfg.steps:
                m.finish(step)
                self.results[m.index] = m.last_eval
                done.append(i)
        if failed or done:
            self._restack([m for i, m in enumerate(active) if i not in failed and i not in done], step + 1)

    def _diverged(self) -> set[int]:
        """Members whose loss was not finite since their last check: a run alone raises the
        error, a member of an ensemble fails with its line."""
        failed = set()
        for i, step, value in self.windows.diverged_members():
            m = self.active[i]
            message = diverged_message(step, value, m.run_dir)
            if self.options.alone:
                raise TrainingDiverged(message)
            failed.add(i)
            self.results[m.index] = Failure(f"{m.cfg.name}: {message}")
        return failed

    def _log_save(self, i: int, m: Member, step: int, logs: bool, evaluates: bool, saves: bool) -> None:
        """Member ``i``'s log line (closing its window), evaluation and checkpoint."""
        record = None
        if logs:
            record = self.windows.record(i, step, m.schedule.get_last_lr()[0], [o for o in m.objectives if o.logs])
        m.log(step, record, evaluates, self.bar)
        if saves:
            if m.rank == 0:
                m.save(step, self.windows.state(i))
            dist.barrier()
