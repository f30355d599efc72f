"""One member of a training call: a run's objects, built by the one set-up (``build``), and
what it writes — its log line (``log``), its checkpoint (``save``) and its summary.

A run trained alone and every member of an ensemble are built here, in the order a run has
always been built (its RNG draws then match): its seed, the model, torch's optimiser and
schedule (``optim``), the objectives its config turns on (each checks its settings), the
evaluator; then, by the folder's plan (``runfolder.plan``), the newest checkpoint that loads
(``--resume``: weights, optimiser, schedule, RNG state, the open log window) or a fork's start
(``init_from``); keyed dropout; the run folder; the tracker. What a member writes is a run's,
whatever trains it (``config.toml``, ``metrics.jsonl``, checkpoints, ``summary.json``). Under
``torchrun`` rank 0 alone writes and evaluates.
"""

from __future__ import annotations

import contextlib
import copy
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .. import config as configlib
from .. import files, storage
from ..errors import UserError
from . import checkpoint as ckpt
from . import distributed as dist
from . import keyed, runio
from .config import PretrainConfig
from .evaluate import make_evaluator
from .fork import init_from_checkpoint
from .objectives.base import build as build_objectives
from .objectives.sam import base_state
from .optim import build_optimizer
from .tracking import Tracker, open_tracker, record_scalars


@dataclass
class Shared:
    """What the members of one call share: the language, the device, the evaluators (one per
    evaluation setting), the tracker kind, this process's rank and the world size."""

    language: object
    device: torch.device
    tracker: str = "none"
    rank: int = 0
    world_size: int = 1
    evaluators: dict = field(default_factory=dict)

    def evaluator(self, cfg: PretrainConfig):
        rate = None if cfg.masking == "single" else cfg.mask_rate
        key = (repr(cfg.eval), rate)
        if key not in self.evaluators:
            self.evaluators[key] = make_evaluator(self.language, cfg.eval.n_sentences, rate, cfg.eval.seed,
                                                  cfg.eval.n_subsets)
        return self.evaluators[key]


@dataclass(eq=False)
class Member:
    """One run of a training call (module docstring). ``model`` is the module whose weights
    are saved; ``train_model`` the one the MLM loss runs through (DDP's wrapper under
    ``torchrun``); ``rng`` / ``cuda_rng``: the run's RNG state, advanced by its own
    global-RNG dropout draws (``own_rng``); ``window``: its log window when it joins a stack
    (a resumed run's, from its checkpoint)."""

    index: int
    cfg: PretrainConfig
    run_dir: Path
    shared: Shared
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    schedule: torch.optim.lr_scheduler.LRScheduler
    objectives: list
    start: int = 1
    resumed: bool = False
    created: bool = False
    window: dict = field(default_factory=dict)
    tracker: Tracker = field(default_factory=Tracker)  # rank 0's; a no-op elsewhere
    last_eval: dict = field(default_factory=dict)
    last_train_loss: float = float("nan")  # shown on the progress bar

    def __post_init__(self):
        cfg, shared = self.cfg, self.shared
        self.language, self.device, self.rank, self.world_size = (shared.language, shared.device, shared.rank,
                                                                  shared.world_size)
        self.ddp = None  # DDP's wrapper of ``model`` under torchrun
        self.evaluator = shared.evaluator(cfg) if self.rank == 0 else None
        self.rate = None if cfg.masking == "single" else cfg.mask_rate
        self.keep = set(cfg.checkpoint_steps())
        self.evaluate_at = set(cfg.evaluation_steps())
        self.autocast = runio.autocast(cfg.precision, self.device)
        # finite data (a corpus): epochs are logged, as sequences drawn / training sequences
        self.n_train = self.language.n_sequences("train") if hasattr(self.language, "n_sequences") else None
        self.global_dropout = cfg.model.dropout > 0 and cfg.dropout_draws != "keyed"
        self.rng, self.cuda_rng = None, None

    @property
    def train_model(self) -> torch.nn.Module:
        return self.model if self.ddp is None else self.ddp

    def take_rng(self) -> None:
        """The run's RNG state is the global RNG's now (after its set-up)."""
        self.rng = torch.get_rng_state()
        self.cuda_rng = torch.cuda.get_rng_state() if self.device.type == "cuda" else None

    @contextlib.contextmanager
    def own_rng(self):
        """The global RNG set to the run's state while its global-RNG dropout draws, and the
        state it leaves taken back (nothing to swap without such dropout; the training call
        restores the caller's state at its end)."""
        if not self.global_dropout:
            yield
            return
        torch.set_rng_state(self.rng)
        if self.cuda_rng is not None:
            torch.cuda.set_rng_state(self.cuda_rng)
        try:
            yield
        finally:
            self.rng = torch.get_rng_state()
            if self.cuda_rng is not None:
                self.cuda_rng = torch.cuda.get_rng_state()

    def draws(self, step: int, pass_: int):
        """The context of a forward pass's keyed dropout masks (``training.keyed``); nothing
        to open under ``dropout_draws = global``."""
        cfg = self.cfg
        if cfg.dropout_draws != "keyed":
            return contextlib.nullcontext()
        return keyed.draws(keyed.one_model(cfg.seed, step, pass_, cfg.model.dropout, self.model.keyed_sites,
                                           self.device))

    # ---- what it writes ---------------------------------------------------------------------
    def log(self, step: int, record: dict | None, evaluates: bool, bar) -> None:
        """Rank 0: evaluate when ``evaluates`` (every ``eval.every``, the last step, the kept
        checkpoints under ``eval.at_checkpoints``) and append the record (``record``: the
        closed log window's, or ``None``) to ``metrics.jsonl``; the progress bar shows the latest."""
        if self.rank != 0:
            return
        if record is not None and self.n_train:
            record["epoch"] = step * self.cfg.batch_size / self.n_train
        if evaluates:
            self.last_eval = self.evaluator.evaluate(self.model, self.device)
            record = (record or {"step": step}) | {"eval": self.last_eval}
        if record is None:
            return
        runio.append_metrics(self.run_dir, record)
        self.tracker.log(record_scalars(record), step)
        self.last_train_loss = record.get("train_loss", self.last_train_loss)
        postfix = {"loss": f"{self.last_train_loss:.4f}"}
        if self.last_eval.get("kl") is not None:
            postfix["KL"] = f"{self.last_eval['kl']:.4f}"
        elif self.last_eval.get("gap") is not None:
            postfix["gap"] = f"{self.last_eval['gap']:.4f}"
        if "tokens_per_s" in record:
            postfix["tok/s"] = f"{record['tokens_per_s']:.0f}"
        bar.set_postfix(postfix, refresh=False)

    def save(self, step: int, window: dict) -> None:
        """Rank 0: a checkpoint at ``step`` (weights, optimiser, schedule, the run's RNG state,
        its open log ``window``); rolling ones not in ``keep`` pruned."""
        optimizer = self.optimizer.state_dict()
        for o in self.objectives:
            optimizer = o.saved_optimizer(optimizer, self.cfg)
        state = {"step": step, "optimizer": optimizer, "schedule": self.schedule.state_dict(), "rng": self.rng,
                 "cuda_rng": self.cuda_rng, "window": window}
        meta = {"config": configlib.to_dict(self.cfg), "eval": self.last_eval if step in self.keep else None}
        ckpt.save(self.run_dir, step, _own_storage(self.model), state, meta)
        ckpt.prune(self.run_dir, self.keep)

    def finish(self, step: int) -> None:
        """Rank 0: ``summary.json`` of the finished run."""
        if self.rank == 0:
            runio.write_summary(self.run_dir, step, self.last_eval, self.model)

    def remove_if_empty(self) -> None:
        """A new run that ended before its first checkpoint holds nothing to resume from:
        what this call created is removed, so the corrected command can run again."""
        if self.created and not ckpt.complete_checkpoints(self.run_dir):
            shutil.rmtree(self.run_dir, ignore_errors=True)


def _own_storage(model: torch.nn.Module) -> torch.nn.Module:
    """``model``, or a copy whose weights own their storage where they are views of a ``vmap``
    stack's (safetensors writes no tensor that covers part of its storage)."""
    if all(p.untyped_storage().nbytes() == p.numel() * p.element_size() for p in model.parameters()):
        return model
    return copy.deepcopy(model)


# ---- the one set-up ----------------------------------------------------------------------------
def build(index: int, cfg: PretrainConfig, run_dir: Path, plan, shared: Shared) -> Member | dict:
    """A ``Member`` for ``cfg``'s run in ``run_dir`` (module docstring), or the final
    evaluation of a run that had finished but for its summary; ``plan``: the folder's
    (``runfolder.plan``, not ``reuse``); ``UserError`` for a run that cannot start."""
    language, device, rank = shared.language, shared.device, shared.rank
    runio.check_pretrain(cfg, language, device)  # a model or held-out set that cannot fit: one line, now
    torch.manual_seed(cfg.seed)  # the run's RNG stream: the initial weights, then dropout
    model = runio.init_model(cfg, language, device)
    optimizer, schedule = build_optimizer(cfg, model)
    built = build_objectives(cfg, language, rank, shared.world_size)
    for o in built:
        o.check(model)  # (a flatness regex that matches nothing: one line, before the run folder)
    m = Member(index, cfg, run_dir, shared, model, optimizer, schedule, built)
    if plan.action == "resume":
        if rank == 0:  # the run's lock is held: a checkpoint half-saved by a killed call is nobody's
            ckpt.remove_cut_saves(run_dir)
        # (runfolder.plan refused a run past cfg.steps: its newest checkpoint, and so any it restores, is not)
        m.model, m.optimizer, m.schedule, state = restore(cfg, language, device, run_dir, rank)
        if state["step"] == cfg.steps:  # finished, but summary.json was never written
            final = ckpt.read_meta(ckpt.checkpoint_dir(run_dir, state["step"])).get("eval") or {}
            if rank == 0:
                runio.write_summary(run_dir, state["step"], final, m.model)
            return final
        torch.set_rng_state(state["rng"])
        if device.type == "cuda" and state.get("cuda_rng") is not None:
            torch.cuda.set_rng_state(state["cuda_rng"])
        m.start, m.resumed, m.window = state["step"] + 1, True, state.get("window") or {}
        if rank == 0:
            runio.truncate_metrics(run_dir / "metrics.jsonl", state["step"])
    elif cfg.init_from:  # a fork (training.fork): the checkpoint's weights, moments and step
        m.start = init_from_checkpoint(cfg, model, optimizer, schedule)
    if cfg.dropout_draws == "keyed":  # keyed masks (training.keyed): the model's dropout sites swapped
        if shared.world_size > 1:
            raise UserError("dropout_draws = keyed does not support DDP yet; run it in one process")
        keyed.install(m.model, cfg.model.dropout)
    if not m.resumed and rank == 0:
        m.created = create_run_dir(cfg, run_dir, plan.action == "replace")
    try:
        if shared.world_size > 1:
            m.ddp = dist.wrap(m.model, device)
        if rank == 0:  # a resumed run's tracker drops what the killed call logged past the checkpoint
            m.tracker = open_tracker(shared.tracker, run_dir, cfg.name, purge_step=m.start if m.resumed else None,
                                     config=configlib.to_dict(cfg))
    except BaseException:
        m.remove_if_empty()
        raise
    m.take_rng()
    return m


def create_run_dir(cfg: PretrainConfig, run_dir: Path, fresh: bool) -> bool:
    """Make the run folder with its marker and resolved config (``fresh``: replacing a
    run folder); whether this call created it."""
    if fresh and run_dir.exists():
        runio.remove_run(run_dir)
    created = not run_dir.exists()
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        files.mark(run_dir, files.RUN_MARKER, f"sameloss run {cfg.name}")
        files.atomic_write_text(run_dir / "config.toml",
                                f"{files.RUN_CONFIG_HEADER} {cfg.name}\n" + configlib.to_toml(cfg))
    except OSError as exc:
        if created:
            shutil.rmtree(run_dir, ignore_errors=True)
        raise storage.write_error(run_dir, exc) from None
    return created


def restore(cfg: PretrainConfig, language, device: torch.device, run_dir: Path, rank: int):
    """Model, optimiser and schedule restored from the newest checkpoint that loads, and
    its training state; every damaged newer one is named in a warning (rank 0)."""
    found = ckpt.step_dirs(run_dir)
    if not found:
        raise UserError(f"nothing to resume in {run_dir}: no complete checkpoint")
    problems = []
    for path in reversed(found):
        with torch.random.fork_rng(devices=[]):  # the weights are overwritten: no draw counts
            model = runio.init_model(cfg, language, device)
        optimizer, schedule = build_optimizer(cfg, model)
        try:
            state = _load(path, model, optimizer, schedule)
        except ckpt.CorruptCheckpoint as exc:
            problems.append(str(exc))
            continue
        if rank == 0:
            for problem in problems:
                print(f"sameloss: warning: {problem}; resuming from {path} instead", file=sys.stderr, flush=True)
        return model, optimizer, schedule, state
    raise UserError(f"nothing to resume in {run_dir}: no valid checkpoint ({problems[0]})")


def _load(path: Path, model, optimizer, schedule) -> dict:
    """Checkpoint ``path`` into the objects; its training state (``CorruptCheckpoint``)."""
    if not (path / "meta.json").exists():
        raise ckpt.CorruptCheckpoint(path / "meta.json", "missing (not a complete checkpoint)")
    ckpt.read_meta(path)
    state = ckpt.load_state(path)
    ckpt.load_weights(path, model)
    try:
        optimizer.load_state_dict(base_state(state["optimizer"]))
        schedule.load_state_dict(state["schedule"])
        rng = state["rng"]
        if not (isinstance(rng, torch.Tensor) and rng.dtype == torch.uint8
                and rng.shape == torch.get_rng_state().shape):
            raise ValueError("its RNG state is not a CPU generator state")
    except Exception as exc:
        raise ckpt.CorruptCheckpoint(path / "state.pt", f"does not fit this run ({exc})") from None
    return state


def diverged_message(step: int, value: float, run_dir: Path) -> str:
    """The line of a run whose loss became ``value`` at ``step``, naming its last good checkpoint."""
    good = ckpt.complete_checkpoints(run_dir)
    where = f"; the last good checkpoint is {good[-1]}" if good else ""
    return f"the training loss became {value} at step {int(step)}{where}"

