"""S runs of one model shape trained as one computation: ``train_ensemble(cfgs, run_dirs)``.

A study's models are small and many (a tiny seed is 19 runs, a decisive study 16–48 seeds):
trained one at a time, each step of each run is a few hundred small kernel launches that
leave a GPU idle. Here the members' weights and optimiser state are stacked along a members
axis, updated by one set of tensor operations (``stacked.py``), while each member stays its
own run in every respect a reader of its folder can see. Two strategies compute the losses:

* ``vmap`` (the default on a GPU) — every member's forward and backward pass as one batched
  computation (``vmap`` over the stack; why ``torch.func``: ``stacked.py``). A member with
  dropout needs ``dropout_draws = "keyed"`` (``training.keyed``): the global RNG's stream
  cannot be drawn batched. Each member's trajectory equals its one-model run's within float32
  rounding (batched matmuls sum in another order);
* ``loop`` (the default elsewhere) — member by member, the one-model loop's own code
  (``mlm_loss``, the adversarial objective, the flatness penalty) on the member's module with
  its slice of the stack swapped in, global-RNG dropout drawn from the member's own RNG state;
  only the update is stacked. Every number is the one-model run's, bit for bit on the CPU —
  so an ensemble of runs a recipe declares reproduces its pinned results — and its cost is
  one model's per member (on the CPU a batched pass gains nothing: ``bench/bench_ensemble.py``).

Every member keeps:

* **its own numbers** — its own data stream (batch ``step`` of its seed, ``data.global_batch``;
  forks of one seed draw it once), dropout masks, gradient-norm clipping, SAM perturbation
  with its own norm, adversarial batch and flatness penalty, and its own learning-rate
  schedule, weight decay, dropout, ρ, λ (``tests/training/test_ensemble.py``, per kind and
  strategy);
* **its own run folder**, written by the one-model loop's own functions (``loop._log``,
  ``loop._save``, ``runfolder.plan``, ``runio``): ``config.toml``, ``metrics.jsonl``,
  checkpoints (weights, torch's optimiser and schedule state, the RNG state its one-model
  run would hold, the open log window) and ``summary.json``, so ``--resume``, reuse,
  ``measure``, plots, reports and the HF export read a member as any run — and a member can
  be resumed alone, or a run trained alone resumed inside an ensemble;
* **its own fate** — a member whose loss becomes NaN or infinite leaves the ensemble with the
  error its one-model run would raise (``Failure``); the others go on. A member that cannot be
  set up (a refused resume, a damaged fork start) fails alone too.

Members with different step counts: **grouped by time, not masked**. The ensemble steps a
global counter from the earliest member's first step to the latest member's last; a member
joins the stack at its first step (a fork continues from its checkpoint's step, a resumed
member from its newest checkpoint) and leaves after its last (or on failure). The stack then
only ever holds members that step now: no compute is spent on masked members, at the price of
re-stacking (one copy of weights and optimiser state, at most twice per member). The engine
(``experiments/ensembles.py``) puts members that start together into one ensemble.

What members share (``ensemble_key``): the language, the model's kind and shape, the batch
(size, masking), precision and device, the optimiser's kind and constants (betas, eps,
momentum), the objective's structure (SAM on or off and adaptive, ``update_half``, the
adversarial task and batch, the flatness estimator) — everything but ``PER_MEMBER``.
``batchable`` says why a config cannot join a ``vmap`` ensemble (dropout from the global RNG).

Resuming is bit for bit: a killed ensemble restarted with the same members continues from
each member's newest checkpoint to the same weights as the uninterrupted one (under ``vmap``,
the batched kernels then see the same stack; under ``loop``, always). The global RNG is left
as it was. DDP is not supported (one process trains the ensemble).
"""

from __future__ import annotations

import contextlib
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from .. import config as configlib
from .. import files
from ..errors import UserError
from ..progress import progress_bar
from . import checkpoint as ckpt
from . import keyed, loop, runfolder, runio, stacked
from .objectives.adversarial import AdversarialObjective
from .config import PretrainConfig
from .evaluate import make_evaluator
from .objectives.flatness import FlatnessPenalty
from .fork import init_from_checkpoint
from .optim import build_optimizer
from .objectives.sam import SAM
from .tracking import open_tracker
from .ensemble_step import Member, StackedWindow, step_members

# device types on which a vmap ensemble's batches are drawn ahead by worker processes (ensemble_data)
DRAW_AHEAD = ("cuda",)
# config keys whose values may differ between members of one ensemble (besides ``eval.*``)
PER_MEMBER = frozenset({
    "name", "seed", "steps", "checkpoints", "checkpoints_log", "save_every", "log_every", "init_from",
    "init_optimizer", "init_step", "model.dropout", "optim.lr", "optim.weight_decay", "optim.warmup_steps",
    "optim.warmup_fraction", "optim.decay_steps", "optim.final_lr_factor", "optim.final_steps", "optim.grad_clip",
    "sam.rho", "adversarial.weight", "flatness.weight"})


@dataclass(frozen=True)
class Failure:
    """A member that did not finish: the one line its one-model run would have raised."""

    message: str


STRATEGIES = ("vmap", "loop")


def default_strategy(device) -> str:
    """``vmap`` on a GPU (one batched forward pass: the point of an ensemble there); ``loop``
    elsewhere (on the CPU a batched pass is no faster, ``bench/bench_ensemble.py``, and the
    member-by-member pass is the one-model run's own computation)."""
    return "vmap" if torch.device(device).type == "cuda" else "loop"


def batchable(cfg: PretrainConfig, strategy: str = "vmap") -> str | None:
    """Why ``cfg``'s run cannot be an ensemble member under ``strategy`` (``None``: it can).
    The loop strategy takes every run; ``vmap`` one whose dropout, if any, is keyed."""
    if strategy == "vmap" and cfg.model.dropout > 0 and cfg.dropout_draws != "keyed":
        return (f"{cfg.name}: dropout {cfg.model.dropout:g} drawn from the global RNG cannot be reproduced batched "
                "(dropout_draws = keyed can)")
    return None


def ensemble_key(cfg: PretrainConfig) -> tuple:
    """What the members of one ensemble share (module docstring): equal keys, one ensemble."""
    flat = configlib.flatten(configlib.to_dict(cfg))
    device = str(runio.resolve_device(cfg.device))
    # (dropout_draws: a member without dropout draws nothing; one with dropout is keyed: batchable)
    shared = sorted((k, repr(v)) for k, v in flat.items()
                    if k not in PER_MEMBER and not k.startswith("eval.") and k not in ("device", "dropout_draws"))
    return (device, *shared, ("sam", cfg.sam.rho > 0), ("adversarial", cfg.adversarial.weight > 0),
            ("flatness", cfg.flatness.weight != 0))


def groups(cfgs: list[PretrainConfig], cap: int, strategy: str = "vmap") -> list[list[int]]:
    """Indices of ``cfgs`` in ensembles of at most ``cap`` members with equal keys, in the
    order of first appearance; a config that is not ``batchable`` alone."""
    out: list[list[int]] = []
    open_: dict[tuple, list[int]] = {}
    for i, cfg in enumerate(cfgs):
        if batchable(cfg, strategy) is not None or cap <= 1:
            out.append([i])
            continue
        key = ensemble_key(cfg)
        if key not in open_ or len(open_[key]) >= cap:
            open_[key] = []
            out.append(open_[key])
        open_[key].append(i)
    return out


# ---- members ---------------------------------------------------------------------------------
def _evaluator(cfg: PretrainConfig, language, shared: dict):
    rate = None if cfg.masking == "single" else cfg.mask_rate
    key = (repr(cfg.eval), rate)
    if key not in shared:
        shared[key] = make_evaluator(language, cfg.eval.n_sentences, rate, cfg.eval.seed, cfg.eval.n_subsets)
    return shared[key]


@dataclass
class _Shared:
    """What the members of one call share: the language, the device, evaluators by their
    settings, the tracker kind."""

    language: object
    device: torch.device
    evaluators: dict
    tracker: str


def _prepare(index: int, cfg: PretrainConfig, run_dir: Path, plan: runfolder.Plan, shared: _Shared) -> Member | dict:
    """What ``loop._pretrain`` builds for one run, in its order (the RNG states then match):
    a ``Member``, or the final evaluation of a run that had finished but for its summary."""
    language, device = shared.language, shared.device
    runio.check_pretrain(cfg, language, device)
    torch.manual_seed(cfg.seed)
    model = runio.init_model(cfg, language, device)
    optimizer, schedule = build_optimizer(cfg, model)
    adversary = flatness = None
    if cfg.adversarial.weight > 0:
        a = cfg.adversarial
        adversary = AdversarialObjective(language, a.task, a.weight, a.batch_size, a.pool_size, a.ridge, cfg.seed)
    if cfg.flatness.weight != 0:
        flatness = FlatnessPenalty(cfg.flatness, language.vocab_size, cfg.seed)
        flatness.check(model)
    evaluator = _evaluator(cfg, language, shared.evaluators)
    resume, start, window = plan.action == "resume", 1, loop.LogWindow()
    if resume:
        ckpt.remove_cut_saves(run_dir)
        model, optimizer, schedule, state = loop._restore(cfg, language, device, run_dir, 0)
        if state["step"] == cfg.steps:
            meta = ckpt.read_meta(ckpt.checkpoint_dir(run_dir, state["step"]))
            runio.write_summary(run_dir, state["step"], meta.get("eval") or {}, model)
            return meta.get("eval") or {}
        torch.set_rng_state(state["rng"])
        if device.type == "cuda" and state.get("cuda_rng") is not None:
            torch.cuda.set_rng_state(state["cuda_rng"])
        start, window = state["step"] + 1, loop.LogWindow.restore(state.get("window") or {})
        runio.truncate_metrics(run_dir / "metrics.jsonl", state["step"])
    elif cfg.init_from:
        start = init_from_checkpoint(cfg, model, optimizer, schedule)
    if cfg.dropout_draws == "keyed":
        keyed.install(model, cfg.model.dropout)
    created = False if resume else loop._create_run_dir(cfg, run_dir, plan.action == "replace")
    run = loop.Run(cfg, run_dir, language, model, model, optimizer, schedule, evaluator, adversary, device, 0, 1,
                   window, flatness=flatness)
    stacked_base = optimizer.base if isinstance(optimizer, SAM) else optimizer
    stacked_base._opt_called = True  # its steps are the stack's: no "schedule before optimiser" warning
    run.tracker = open_tracker(shared.tracker, run_dir, cfg.name, purge_step=start if resume else None,
                               config=configlib.to_dict(cfg))
    cuda_rng = torch.cuda.get_rng_state() if device.type == "cuda" else None
    return Member(index, run, start, torch.get_rng_state(), cuda_rng, created, resume)


# ---- the ensemble ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Hooks:
    """How a caller follows an ensemble: the tracker its members log to (``training.tracking``),
    ``on_plan(i, plan)`` told each member's plan (a study logs and records it), and the end of
    the line of a run folder refused (``runfolder.plan``'s ``fresh_hint``)."""

    tracker: str = "none"
    on_plan: object = None
    fresh_hint: str = "pass --fresh to replace it"


def train_ensemble(cfgs: list[PretrainConfig], run_dirs: list[str | Path], mode: str = "auto", progress: bool = True,
                   strategy: str | None = None, stop_after: int | None = None, hooks: Hooks = Hooks()
                   ) -> list[dict | Failure]:
    """Train ``cfgs`` (one ``ensemble_key``) into ``run_dirs`` as one ensemble; returns, per
    member, its final evaluation (as ``pretrain``) or its ``Failure``. ``mode``: what to do
    with each run folder (``runfolder.plan``'s ``new``, ``resume``, ``fresh``, ``auto``; a
    member whose folder is refused fails alone); ``strategy``: ``vmap`` or ``loop``
    (``None``: ``default_strategy`` of the device); ``stop_after``: end after that step's
    checkpoints (as if killed: tests of resuming). Every member's folder lock is held for
    the whole call."""
    if len(cfgs) != len(run_dirs) or not cfgs:
        raise ValueError("one run folder per config, and at least one")
    strategy = strategy or default_strategy(runio.resolve_device(cfgs[0].device))
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}, not {strategy!r}")
    for cfg in cfgs:
        reason = batchable(cfg, strategy)
        if reason is not None:
            raise UserError(reason)
    if len({ensemble_key(c) for c in cfgs}) > 1:
        raise UserError("these runs cannot train as one ensemble: they differ in "
                        + ", ".join(_differences(cfgs)))
    run_dirs = [Path(d) for d in run_dirs]
    results: list[dict | Failure | None] = [None] * len(cfgs)
    saved_rng = torch.get_rng_state()
    with contextlib.ExitStack() as held:
        for d in run_dirs:
            held.enter_context(files.folder_lock(d, "run"))
        plans = []
        for i, (d, c) in enumerate(zip(run_dirs, cfgs)):
            try:
                plans.append(runfolder.plan(d, c, mode, fresh_hint=hooks.fresh_hint))
            except UserError as exc:
                plans.append(None)
                results[i] = Failure(str(exc).splitlines()[0])
                continue
            if hooks.on_plan is not None:
                hooks.on_plan(i, plans[-1])
        members = _members(cfgs, run_dirs, plans, results, hooks.tracker)
        try:
            if members:
                _Loop(members, results, progress, stop_after, strategy).run()
        finally:
            for m in members:
                m.run.tracker.close()
                if results[m.index] is None or isinstance(results[m.index], Failure):
                    _remove_if_empty(m)
            torch.set_rng_state(saved_rng)
    return [r if r is not None else {} for r in results]


def _differences(cfgs: list[PretrainConfig]) -> list[str]:
    flats = [configlib.flatten(configlib.to_dict(c)) for c in cfgs]
    keys = sorted({k for f in flats for k in f
                   if k not in PER_MEMBER and not k.startswith("eval.") and k != "dropout_draws"})
    return [k for k in keys if len({repr(f.get(k)) for f in flats}) > 1] or ["SAM, adversarial or flatness on/off"]


def _members(cfgs, run_dirs, plans, results, tracker: str) -> list[Member]:
    shared = _Shared(runio.build_language(cfgs[0]), runio.resolve_device(cfgs[0].device), {}, tracker)
    members = []
    for i, (cfg, run_dir, plan) in enumerate(zip(cfgs, run_dirs, plans)):
        if plan is None:  # refused (its Failure is in results)
            continue
        if plan.action == "reuse":
            results[i] = plan.evaluation
            continue
        try:
            got = _prepare(i, cfg, run_dir, plan, shared)
        except UserError as exc:
            results[i] = Failure(str(exc).splitlines()[0])
            continue
        if isinstance(got, dict):
            results[i] = got
        else:
            members.append(got)
    return members


def _remove_if_empty(m: Member) -> None:
    """A new run that ended before its first checkpoint holds nothing to resume from."""
    if m.created and not ckpt.complete_checkpoints(m.run.run_dir):
        shutil.rmtree(m.run.run_dir, ignore_errors=True)


class _Loop:
    """The steps of one ensemble (``train_ensemble``): members join and leave the stack
    (module docstring), each step is ``_step`` on the stack, then each member's log,
    evaluation and checkpoint as its one-model loop does them."""

    def __init__(self, members: list[Member], results: list, progress: bool, stop_after: int | None,
                 strategy: str = "vmap"):
        self.members, self.results, self.stop_after, self.strategy = members, results, stop_after, strategy
        first = members[0].run
        self.device, self.language = first.device, first.language
        self.template = None
        if strategy == "vmap":
            self.template = stacked.template_of(first.model)
            if any(m.cfg.dropout_draws == "keyed" for m in members):  # a member without dropout: masks of ones
                keyed.install(self.template, None)
        self.active: list[Member] = []
        self.st: stacked.Stack | None = None
        self.window: StackedWindow | None = None
        self.ahead = None  # the members' batches drawn ahead (ensemble_data; vmap on CUDA)
        self.first = min(m.start for m in members)
        self.last = max(m.cfg.steps for m in members)
        self.bar = progress_bar(total=self.last, initial=self.first - 1, desc=f"ensemble of {len(members)}",
                                unit="step", disable=not progress)

    def run(self) -> None:
        try:
            for step in range(self.first, self.last + 1):
                joining = [m for m in self.members if m.start == step]
                if joining:
                    self._restack(self.active + joining, step)
                if self.active:
                    self._one(step)
                self.bar.update(1)
                if self.stop_after is not None and step >= self.stop_after:
                    break
        finally:
            self.bar.close()
            if self.ahead is not None:
                self.ahead.close()

    # ---- membership --------------------------------------------------------------------
    def _restack(self, members: list[Member], step: int) -> None:
        """The stack (and log window) rebuilt for ``members``, who train from ``step`` on: the
        current members written home first."""
        self._home()
        self.active = members
        if self.ahead is not None:
            self.ahead.close()
            self.ahead = None
        if not members:
            self.st = self.window = None
            return
        cfg = members[0].cfg
        self.st = stacked.stack([m.run.model for m in members], [m.run.optimizer for m in members], cfg.optim.name,
                                cfg.optim.momentum)
        self.window = StackedWindow.of([m.run.window for m in members], self.device)
        if self.strategy == "vmap" and self.device.type in DRAW_AHEAD:
            from .ensemble_data import Ahead

            self.ahead = Ahead(self.language, [m.cfg.seed for m in members], step, max(m.cfg.steps for m in members),
                               (cfg.batch_size, members[0].run.rate, cfg.mask_replace))

    def _home(self) -> None:
        if self.st is None:
            return
        for i, m in enumerate(self.active):
            stacked.unstack(self.st, i, m.run.model, m.run.optimizer, m.cfg.optim.momentum)
            m.run.window = self.window.take(i)

    # ---- one step ----------------------------------------------------------------------
    def _one(self, step: int) -> None:
        active = self.active
        logs = [step % m.cfg.log_every == 0 or step == m.cfg.steps for m in active]
        drawn = self.ahead.get(step) if self.ahead is not None else None
        result = step_members(self.st, self.template, active, step, any(logs), self.strategy, drawn)
        self.window.add(result, step)
        evaluates = [step in m.run.evaluate_at for m in active]
        saves = [step in m.run.keep or step % m.cfg.save_every == 0 or step == self.stop_after for m in active]
        if not any(a or b or c for a, b, c in zip(logs, evaluates, saves)):
            return
        failed = self._diverged(step)
        done = []
        for i, m in enumerate(active):
            if i in failed:
                continue
            if logs[i] or evaluates[i] or saves[i]:
                self._log_save(i, m, step, logs[i], evaluates[i], saves[i])
            if step == m.cfg.steps:
                runio.write_summary(m.run.run_dir, step, m.run.last_eval, m.run.model)
                self.results[m.index] = m.run.last_eval
                done.append(i)
        if failed or done:
            self._restack([m for i, m in enumerate(active) if i not in failed and i not in done], step + 1)

    def _diverged(self, step: int) -> dict[int, str]:
        """Members whose loss was not finite since their last check: marked failed with the
        one-model run's error (``LogWindow.check``)."""
        failed = {}
        for i, div in self.window.diverged_members():
            m = self.active[i]
            try:
                loop.LogWindow(diverged=div).check(m.run.run_dir)
            except loop.TrainingDiverged as exc:
                failed[i] = str(exc)
                self.results[m.index] = Failure(f"{m.cfg.name}: {exc}")
        return failed

    def _log_save(self, i: int, m: Member, step: int, logs: bool, evaluates: bool, saves: bool) -> None:
        """Member ``i``'s log line, evaluation and checkpoint, by the one-model loop's own
        functions on its home model (its weights, and for a checkpoint its optimiser state,
        written there first; the RNG state its run would save)."""
        run = m.run
        stacked.unstack(self.st, i, run.model, run.optimizer, m.cfg.optim.momentum, state=saves)
        run.window = self.window.take(i)
        loop._log(run, step, self.bar, logs, evaluates)
        if saves:
            before = torch.get_rng_state()
            torch.set_rng_state(m.rng)
            if m.cuda_rng is not None:
                torch.cuda.set_rng_state(m.cuda_rng)
            try:
                loop._save(run, step)
            finally:
                torch.set_rng_state(before)
        self.window.put(i, run.window)

