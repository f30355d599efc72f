"""One step of an ensemble (``training.ensemble``) and the members' log windows.

``step_members`` is the one-model loop's ``_step`` (``loop.py``) for every member of a
stack at once, in the same order of operations: the members' batches (each its seed's batch
``step``, drawn once per seed: forks of one seed share it), SAM's ascent on the first halves,
the update forward on the halves or whole batches, the adversarial objective and the flatness
penalty, one backward pass, clipping, the optimiser and each member's schedule. The arithmetic
is ``stacked.py``'s.

``StackedWindow`` is ``loop.LogWindow`` with a members axis: the sums since each member's last
log line stay on the device, added without a read-back (a step never waits on the device), in
float64 in step order as ``LogWindow`` sums them — so a member's ``metrics.jsonl`` holds the
numbers its one-model window would. ``take(i)`` hands member ``i``'s window to the one-model
``_log`` / ``_save`` as a ``LogWindow``; ``put`` takes it back.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.nn.utils.stateless import _reparametrize_module

from . import keyed, stacked
from .data import global_batch, step_generator
from .loop import LogWindow
from .sam import SAM


@dataclass
class StepOut:
    """What a step leaves for the members' logs (``loop.StepResult`` per member, stacked)."""

    summed: torch.Tensor  # [S] summed cross-entropy, detached, on the device
    n_targets: list[int]
    tokens: list[int]
    downstream: torch.Tensor | None = None
    grad_norm: torch.Tensor | None = None
    flatness: torch.Tensor | None = None


def _base(optimizer):
    return optimizer.base if isinstance(optimizer, SAM) else optimizer


def _draws(runs, step: int, n_sites: int, device) -> stacked.DropoutDraws | None:
    if not any(r.cfg.dropout_draws == "keyed" for r in runs):
        return None
    rates = [r.cfg.model.dropout for r in runs]
    keys, thresholds, scales = keyed.stacked([r.cfg.seed for r in runs], step, rates, n_sites, device)
    return stacked.DropoutDraws(keys, thresholds, scales, off=all(r == 0 for r in rates))


def _adversarial_batches(runs, step: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Each member's labelled batch of ``step`` (its objective's ``loss``: the same draw)."""
    drawn: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    for r in runs:
        a = r.adversary
        if r.cfg.seed not in drawn:
            gen = step_generator(a.seed, step, stream=4)
            idx = torch.randperm(a.tokens.shape[0], generator=gen)[: a.batch_size]
            drawn[r.cfg.seed] = (a.tokens[idx], a.labels[idx])
    tokens = [drawn[r.cfg.seed][0] for r in runs]
    if len({t.shape for t in tokens}) > 1:
        raise ValueError("the members' adversarial pools are too small for one batch size")
    return torch.stack(tokens).to(device), torch.stack([drawn[r.cfg.seed][1] for r in runs]).to(device)


def _flatness(st: stacked.Stack, runs, used, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(Σ_i λ_i · penalty_i, estimates [S])``: each member's penalty on its own module with
    its stacked weights swapped in (differentiable into the stack)."""
    penalties, estimates = [], []
    for i, r in enumerate(runs):
        with _reparametrize_module(r.model, st.member(i, detach=False)):
            penalty, estimate = r.flatness.loss(r.model, used[i], step)
        penalties.append(penalty)
        estimates.append(estimate)
    return torch.stack(penalties).sum(), torch.stack(estimates)


def step_members(st: stacked.Stack, template, runs: list, step: int, want_norm: bool) -> StepOut:
    """One update of every member (module docstring); ``want_norm``: keep the gradient norms
    (a log step; clipping computes them anyway)."""
    first = runs[0]
    cfg, language, device = first.cfg, first.language, first.device
    full = {}
    for r in runs:  # one draw per seed: forks of one seed train on the same batches
        if r.cfg.seed not in full:
            full[r.cfg.seed] = global_batch(language, r.cfg.seed, step, cfg.batch_size, first.rate, cfg.mask_replace)
    batches = [full[r.cfg.seed] for r in runs]
    draws = _draws(runs, step, getattr(template, "keyed_sites", 0), device)
    st.zero_grad()
    if cfg.sam.rho > 0:
        halves = [b.halves() for b in batches]
        ascent = stacked.batches([h[0] for h in halves], language.pad_id, device)
        with first.autocast:
            loss, _ = stacked.mlm_losses(template, st, ascent, draws, keyed.PASS_ASCENT)
        loss.sum().backward()
        rho = torch.tensor([r.cfg.sam.rho for r in runs], device=device)
        stacked.ascend(st, rho, cfg.sam.adaptive)
        st.zero_grad()
        used = [h[1] for h in halves]
    elif cfg.update_half:
        used = [b.halves()[1] for b in batches]
    else:
        used = batches
    update = stacked.batches(used, language.pad_id, device)
    out = StepOut(torch.empty(0), update.n_targets, [int((u.inputs != language.pad_id).sum()) for u in used])
    with first.autocast:
        loss, out.summed = stacked.mlm_losses(template, st, update, draws, keyed.PASS_UPDATE)
        if first.adversary is not None:
            tokens, labels = _adversarial_batches(runs, step, device)
            weights = torch.tensor([r.adversary.weight for r in runs], device=device)
            adv, out.downstream = stacked.adversarial_losses(template, st, first.adversary, tokens, labels, weights,
                                                             draws)
            loss = loss + adv
    total = loss.sum()
    if first.flatness is not None:  # outside autocast: the penalty computes in float32
        penalty, out.flatness = _flatness(st, runs, used, step)
        total = total + penalty
    total.backward()
    clips = [r.cfg.optim.grad_clip for r in runs]
    if any(c is not None for c in clips):
        limits = torch.tensor([float("inf") if c is None else c for c in clips], device=device)
        out.grad_norm = stacked.clip(st, limits)
    elif want_norm:
        out.grad_norm = stacked.grad_norms(st).detach()
    if cfg.sam.rho > 0:
        stacked.descend(st)
    groups = [_base(r.optimizer).param_groups[0] for r in runs]
    lrs, decays = [g["lr"] for g in groups], [g["weight_decay"] for g in groups]
    if cfg.optim.name == "adamw":
        stacked.adamw_step(st, lrs, decays, tuple(cfg.optim.betas), cfg.optim.eps)
    else:
        stacked.sgd_step(st, lrs, decays, cfg.optim.momentum)
    for r in runs:
        r.schedule.step()
    return out


# ---- the log windows -------------------------------------------------------------------------
class StackedWindow:
    """``loop.LogWindow`` of S members (module docstring): device sums ``loss``, ``tokens``,
    ``downstream``, ``flatness`` ``[S]``, ``diverged [S, 2]`` (step and loss of the first
    non-finite loss, NaN while none), the last gradient norms; host counts and start times."""

    def __init__(self, n: int, device):
        f64 = dict(dtype=torch.float64, device=device)
        self.loss, self.downstream, self.flatness = (torch.zeros(n, **f64) for _ in range(3))
        self.diverged = torch.full((n, 2), float("nan"), **f64)
        self.grad_norm: torch.Tensor | None = None
        self.tokens, self.targets, self.steps = [0] * n, [0] * n, [0] * n
        self.started = [0.0] * n
        self.has_norm = [False] * n

    @classmethod
    def of(cls, windows: list[LogWindow], device) -> StackedWindow:
        out = cls(len(windows), device)
        for i, w in enumerate(windows):
            out.put(i, w)
        return out

    def put(self, i: int, w: LogWindow) -> None:
        """Member ``i``'s window set to ``w``'s sums."""
        self.loss[i] = float(w.loss)
        self.downstream[i] = float(w.downstream)
        self.flatness[i] = float(w.flatness)
        self.diverged[i] = w.diverged.to(self.diverged) if w.diverged is not None else float("nan")
        self.tokens[i], self.targets[i], self.steps[i], self.started[i] = int(w.tokens), w.targets, w.steps, w.started
        self.has_norm[i] = w.grad_norm is not None
        if w.grad_norm is not None:
            if self.grad_norm is None:
                self.grad_norm = torch.full_like(self.loss, float("nan"))
            self.grad_norm[i] = w.grad_norm.to(self.grad_norm)

    def take(self, i: int) -> LogWindow:
        """Member ``i``'s window as a ``LogWindow`` (host values; the sums exact in float64)."""
        div = self.diverged[i].cpu()
        w = LogWindow(self.tokens[i], float(self.loss[i]), self.targets[i], float(self.downstream[i]),
                      self.steps[i], self.started[i], None if div[0].isnan() else div,
                      flatness=float(self.flatness[i]))
        if self.has_norm[i] and self.grad_norm is not None:
            w.grad_norm = self.grad_norm[i].detach().cpu()
        return w

    def add(self, out: StepOut, step: int) -> None:
        summed = out.summed.detach().double()
        self.loss += summed
        for i, (k, n) in enumerate(zip(out.tokens, out.n_targets)):
            self.tokens[i] += k
            self.targets[i] += n
            self.steps[i] += 1
        if out.downstream is not None:
            self.downstream += out.downstream.detach().double()
        if out.flatness is not None:
            self.flatness += out.flatness.detach().double()
        if out.grad_norm is not None:
            self.grad_norm = out.grad_norm.detach()
            self.has_norm = [True] * len(self.has_norm)
        first = torch.isnan(self.diverged[:, 0]) & ~torch.isfinite(summed)
        here = torch.stack([torch.full_like(summed, step), summed], dim=1)
        self.diverged = torch.where(first[:, None], here, self.diverged)

    def diverged_members(self) -> list[tuple[int, torch.Tensor]]:
        """``(i, [step, loss])`` of every member whose loss was not finite (one read)."""
        div = self.diverged.cpu()
        return [(i, div[i]) for i in range(div.shape[0]) if not torch.isnan(div[i, 0])]
