"""The one training step: ``train_step(stack, step)`` trains every member of a stack — a run
alone is a stack of one — on batch ``step`` of its stream, with one of two back-ends.

In order, as a run has always stepped: each member's batch (its seed's batch ``step``, drawn
once per seed, or ahead by workers: ``drawn``); ``update_half``: the second half of it; each
objective's ``before_update`` (SAM: the ascent on the first halves, the update on the
second); the update pass — the MLM loss plus every objective's term (``training.objectives``)
and its backward pass —; clipping (or the log step's norms); each objective's
``before_optimizer`` (SAM: back to the weights); each member's optimiser and schedule — its
own, torch's (``optim``). Nothing waits for the device: ``StepOut`` stays there until a log
line reads it (``training.window``).

``Members`` (``strategy = "loop"``, the default off a GPU) computes member by member, each on
its own module (every objective's ``loss``, its backward pass, ``clip_grad_norm_``, SAM's own
arithmetic): the computation of each run alone, so its numbers are the run's bit for bit;
global-RNG dropout draws from the member's own RNG state; under ``torchrun`` the one member's
DDP wrapper, shard and ``no_sync`` (``local``). ``Vmapped`` (``strategy = "vmap"``, the default
on a GPU) computes every member at once: the weights stacked along a members axis
(``torch.func.stack_module_state``), each objective's batched form (``losses``) under
``torch.func.vmap`` and ``functional_call`` over a weightless template of the model (the
models stay written once, every kind and shape batches), norms, clipping and SAM's move over
the members axis; attention on SDPA's math backend (the fused CPU kernel has no batching
rule), dropout keyed (``training.keyed``); a member's numbers are its run's within float32
rounding. Its members' parameters are views of the stacked weights: their optimisers step the
stack in place, and a member's module holds its weights for its log line and checkpoint
without a copy (``release`` gives them their own storage again).
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass

import torch
from torch import nn
from torch.func import stack_module_state, vmap
from torch.nn.attention import SDPBackend, sdpa_kernel

from . import distributed as dist
from . import keyed
from .data import global_batch
from .objectives.base import autocast, swapped


@dataclass
class StepOut:
    """What a step leaves for the members' log windows: ``logged`` — by window key, ``[S]``
    on the device (``loss``: the summed cross-entropy; each objective's logged value) —, the
    prediction targets of the global batch each update used and the non-pad tokens this
    process saw (host counts), and the gradient norms before clipping (the log steps')."""

    logged: dict[str, torch.Tensor]
    n_targets: list[int]
    tokens: list[int]
    grad_norm: torch.Tensor | None = None


def batches(stack, step: int, drawn: dict | None = None) -> list:
    """Each member's batch ``step`` (one draw per seed; ``drawn``: ``{seed: batch}`` drawn ahead)."""
    full = dict(drawn or {})
    for m in stack.members:
        c = m.cfg
        if c.seed not in full:
            full[c.seed] = global_batch(stack.language, c.seed, step, c.batch_size, m.rate, c.mask_replace)
    return [full[m.cfg.seed] for m in stack.members]


def train_step(stack, step: int, norms: bool = False, drawn: dict | None = None) -> StepOut:
    """One update of every member of ``stack`` (module docstring); ``norms``: keep the
    gradient norms (a log step; clipping computes them anyway)."""
    full = batches(stack, step, drawn)
    stack.zero_grad()
    used = [b.halves()[1] for b in full] if stack.members[0].cfg.update_half else full
    for cls, objectives in stack.objectives:
        used = cls.before_update(objectives, stack, full, step) or used
    logged = stack.forward_backward(used, step, keyed.PASS_UPDATE)
    # a non-finite loss is noticed by the log window (``Windows.diverged``) before the next
    # log line, evaluation or checkpoint: testing it here would wait for the device
    grad_norm = stack.clip(norms)
    for cls, objectives in stack.objectives:
        cls.before_optimizer(objectives, stack)
    stack.optimizer_step()
    pad = stack.language.pad_id
    tokens = [int((b.shard(m.rank, m.world_size).inputs != pad).sum()) for m, b in zip(stack.members, used)]
    return StepOut(logged, [b.n_targets for b in used], tokens, grad_norm)


class Stack:
    """The members that step now and their objectives, grouped by class (``objectives``:
    ``(class, [each member's instance])`` in order, MLM first)."""

    exact = True

    def __init__(self, members: list):
        self.members = members
        first = members[0]
        self.device, self.language = first.device, first.language
        self.objectives = [(type(o), [m.objectives[k] for m in members]) for k, o in enumerate(first.objectives)]

    def member_parameters(self) -> list[list[torch.Tensor]]:
        """Each member's parameters, in its module's order."""
        return [[p for p in m.model.parameters() if p.requires_grad] for m in self.members]

    def step_optimizers(self) -> None:
        for m in self.members:
            m.optimizer.step()
            m.schedule.step()

    def release(self) -> None:
        """The members' modules on their own again (``Vmapped``: their own storage)."""


class Members(Stack):
    """Member by member, each the computation of its run alone (module docstring)."""

    def zero_grad(self) -> None:
        for m in self.members:
            m.optimizer.zero_grad(set_to_none=True)

    def forward_backward(self, batches: list, step: int, pass_: int, terms: bool = True, local: bool = False
                         ) -> dict[str, torch.Tensor]:
        """Each member's loss on its batch (``terms``: with every objective's term, else the
        MLM loss alone; ``local``: DDP's gradients kept in this process) and its backward
        pass; the logged values by window key, ``[S]``."""
        logged: dict[str, list] = {}
        losses = []
        for m, batch in zip(self.members, batches):
            with m.own_rng(), dist.no_sync(m.train_model) if local else contextlib.nullcontext():
                loss, values = self._loss(m, batch, step, pass_, terms)
            losses.append(loss)
            for key, value in values.items():
                logged.setdefault(key, []).append(value)
        # one backward pass for the members (no member's loss depends on another's weights:
        # each member's gradient is its run alone's, bit for bit, and the engine runs once)
        (losses[0] if len(losses) == 1 else torch.stack(losses).sum()).backward()
        return {key: torch.stack(values) for key, values in logged.items()}

    @staticmethod
    def _loss(m, batch, step: int, pass_: int, terms: bool) -> tuple[torch.Tensor, dict]:
        mlm, *others = m.objectives
        with m.autocast:
            loss, summed = mlm.loss(m, batch, step, pass_)
        logged = {mlm.window_key(): summed}
        for o in others if terms else ():
            if o.term:
                with autocast(m, o):
                    term, value = o.loss(m, batch, step)
                loss = loss + term
                if value is not None:
                    logged[o.window_key()] = value
        return loss, logged

    def clip(self, norms: bool) -> torch.Tensor | None:
        """Each member's ``clip_grad_norm_`` (its ``optim.grad_clip``); its gradient norm
        before clipping, ``[S]``, when ``norms``."""
        out = []
        for m in self.members:
            params, limit = list(m.model.parameters()), m.cfg.optim.grad_clip
            if limit is not None:
                out.append(torch.nn.utils.clip_grad_norm_(params, limit))
            elif norms:
                out.append(torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None]))
        return torch.stack(out) if norms else None

    def optimizer_step(self) -> None:
        self.step_optimizers()


def template_of(model: nn.Module) -> nn.Module:
    """A weightless copy of ``model`` (on the meta device) that ``functional_call`` runs with
    stacked weights; an LSTM runs unrolled (``vmap`` cannot take packed sequences)."""
    template = copy.deepcopy(model).to("meta")
    if hasattr(template, "_unrolled"):  # (models.lstm's own switch, as ``unrolled()`` sets it)
        template._unrolled = True
    template.train()
    return template


class Vmapped(Stack):
    """Every member at once under ``vmap`` (module docstring): ``params[name] [S, ...]``, the
    stacked weights (leaves that take the gradients); the members' parameters, views of them."""

    exact = False

    def __init__(self, members: list):
        super().__init__(members)
        self.template = template_of(members[0].model)
        self.keyed = any(m.cfg.dropout_draws == "keyed" for m in members)
        if self.keyed:  # a member without dropout: masks of ones
            keyed.install(self.template, None)
        self.params, _ = stack_module_state([m.model for m in members])
        self._views = []
        for i, m in enumerate(members):
            for name, p in m.model.named_parameters():
                p.data = self.params[name].detach()[i]
                self._views.append((p, name, i))
        self._draws: tuple[int, tuple] | None = None

    def release(self) -> None:
        for p, _, _ in self._views:
            p.grad = None
            p.data = p.data.clone()

    def zero_grad(self) -> None:
        for p in self.params.values():
            p.grad = None
        for p, _, _ in self._views:
            p.grad = None

    def draws(self, step: int) -> tuple:
        """The members' keyed draws of ``step`` (``keyed.stacked``; zeros when none is keyed)."""
        if self._draws is None or self._draws[0] != step:
            S, sites = len(self.members), getattr(self.template, "keyed_sites", 0)
            if self.keyed:
                rates = [m.cfg.model.dropout for m in self.members]
                got = (*keyed.stacked([m.cfg.seed for m in self.members], step, rates, sites, self.device),
                       all(r == 0 for r in rates))
            else:
                z = torch.zeros(S, device=self.device)
                got = (z.long()[:, None, None].expand(S, keyed.N_PASSES, 1), z.long(), z.double(), True)
            self._draws = (step, got)
        return self._draws[1]

    def vmapped(self, fn, step: int, pass_: int, *args):
        """``fn(params, *args)`` of every member at once (``vmap`` over the stacked weights and
        ``args``' leading axis), inside its keyed dropout draws of ``pass_``."""
        keys, thresholds, scales, off = self.draws(step)

        def one(params, k, t, s, *a):
            with keyed.draws(keyed.Draws(k[pass_], t, s, off)) if self.keyed else contextlib.nullcontext():
                return fn(params, *a)

        with sdpa_kernel(SDPBackend.MATH):
            return vmap(one)(self.params, keys, thresholds, scales, *args)

    def call(self, i: int, fn):
        """``fn(run)`` of member ``i`` on its own module with its slice of the stacked weights
        swapped in (gradients flow to the stack): an objective's loss, member by member."""
        m = self.members[i]
        return swapped(m.model, {n: p[i] for n, p in self.params.items()}, lambda model: fn(m))

    def forward_backward(self, batches: list, step: int, pass_: int, terms: bool = True, local: bool = False
                         ) -> dict[str, torch.Tensor]:
        """``Members.forward_backward``, every member at once (``local``: no DDP here)."""
        (mlm, mlm_objectives), *others = self.objectives
        first = self.members[0]
        with first.autocast:
            loss, summed = mlm.losses(mlm_objectives, self, batches, step, pass_)
        logged = {mlm.window_key(): summed}
        for cls, objectives in others if terms else ():
            if cls.term:
                with autocast(first, cls):
                    term, value = cls.losses(objectives, self, batches, step)
                loss = loss + term
                if value is not None:
                    logged[cls.window_key()] = value
        loss.sum().backward()  # no member's loss depends on another's weights: each slice is its own
        return logged

    @torch.no_grad()
    def clip(self, norms: bool) -> torch.Tensor | None:
        """Each member's gradient norm over the members axis, clipped to its own limit (none:
        multiplied by exactly 1)."""
        limits = [m.cfg.optim.grad_clip for m in self.members]
        if not norms and all(c is None for c in limits):
            return None
        grads = [p.grad for p in self.params.values() if p.grad is not None]
        per = torch.stack([torch.linalg.vector_norm(g.flatten(1), dim=1) for g in grads], dim=1)
        total = torch.linalg.vector_norm(per, dim=1)
        if any(c is not None for c in limits):
            limit = torch.tensor([float("inf") if c is None else c for c in limits], device=total.device)
            coef = torch.clamp(limit / (total + 1e-6), max=1.0)
            for g in grads:
                g.mul_(coef.view(-1, *([1] * (g.dim() - 1))))
        return total

    def optimizer_step(self) -> None:
        """Each member's optimiser on its views, the gradients views of the stack's."""
        for p, name, i in self._views:
            grad = self.params[name].grad
            p.grad = None if grad is None else grad[i]
        self.step_optimizers()


def make(members: list, strategy: str) -> Stack:
    """The stack of ``members`` under ``strategy`` (``loop``: ``Members``; ``vmap``: ``Vmapped``)."""
    return Members(members) if strategy == "loop" else Vmapped(members)
