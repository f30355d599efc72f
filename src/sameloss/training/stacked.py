"""The arithmetic of an ensemble step (``training.ensemble``): S members' weights and
optimiser state as tensors with a leading members axis, their losses in one ``vmap``-ped
forward pass, and the update of every member in one set of tensor operations.

Why ``torch.func`` (``functional_call`` + ``vmap`` over stacked parameters) rather than
modules whose weights carry a members axis: the models stay written once (``models/``),
every kind and every shape (the embedded larger transformer, the LSTM unrolled) batches
without a second implementation to keep equal, and the per-member batched matmuls are what
``vmap`` turns ``nn.Linear`` into anyway. Two places need care: attention runs on SDPA's math
backend inside ``vmap`` (the fused CPU kernel has no batching rule and falls back to a loop
over members), and dropout must not draw from the global RNG (``training.keyed``).

What a step computes, per member ``i`` (each the one-model loop's ``_step``, elementwise over
the members axis): the loss ``Σ CE / n_targets_i`` on its own batch (its masked positions
gathered by a padded index with a validity mask: members differ in their number of
targets), minus ``λ_i`` × the adversarial downstream loss of its own labelled batch, plus the
flatness penalty (one member at a time, ``FlatnessPenalty`` on the member's own module with
its stacked weights swapped in: the estimator's machinery is per model); the backward pass
of the members' summed losses (no member's loss depends on another's weights, so each slice
of the gradient is that member's own); SAM's ascent with each member's own ``‖g_i‖`` and
``ρ_i``; gradient-norm clipping per member; AdamW or SGD with per-member learning rate and
weight decay. AdamW reproduces torch's single-tensor arithmetic operation for operation (on
the CPU the same bits, given the same gradients); SGD uses torch's own scalar operations
when every member has the same learning rate and decay, else the same arithmetic as tensors.
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, stack_module_state, vmap
from torch.nn.attention import SDPBackend, sdpa_kernel

from . import keyed
from .objectives.sam import SAM


def _per(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``values [S]`` shaped to broadcast over ``like [S, ...]``."""
    return values.view(-1, *([1] * (like.dim() - 1)))


class _Features(nn.Module):
    """``model.features`` as a module's forward (what ``functional_call`` calls)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.model.features(tokens)


def template_of(model: nn.Module) -> nn.Module:
    """A weightless copy of ``model`` (on the meta device) that ``functional_call`` runs with
    stacked weights; an LSTM runs unrolled (``vmap`` cannot take packed sequences)."""
    template = copy.deepcopy(model).to("meta")
    if hasattr(template, "_unrolled"):
        template._unrolled = True
    template.train()
    return template


@dataclass
class Stack:
    """The members' weights ``params[name] [S, ...]`` (leaves that take gradients) and
    optimiser state: AdamW's moments ``exp_avg`` / ``exp_avg_sq`` and step counts, or SGD's
    momentum buffers (``has_buffer [S]``: whether a member's buffer holds a step yet)."""

    optim: str
    params: dict[str, torch.Tensor]
    decayed: set[str]
    exp_avg: dict[str, torch.Tensor] = field(default_factory=dict)
    exp_avg_sq: dict[str, torch.Tensor] = field(default_factory=dict)
    steps: list[int] = field(default_factory=list)
    buffer: dict[str, torch.Tensor] = field(default_factory=dict)
    has_buffer: torch.Tensor | None = None
    eps: dict[str, torch.Tensor] = field(default_factory=dict)  # SAM's perturbation while ascended

    @property
    def size(self) -> int:
        return next(iter(self.params.values())).shape[0]

    def member(self, i: int, detach: bool = True) -> dict[str, torch.Tensor]:
        return {n: (p[i].detach() if detach else p[i]) for n, p in self.params.items()}

    def zero_grad(self) -> None:
        for p in self.params.values():
            p.grad = None


def _base(optimizer):
    return optimizer.base if isinstance(optimizer, SAM) else optimizer


def stack(models: list[nn.Module], optimizers: list, optim: str, momentum: float = 0.0) -> Stack:
    """The members' weights and their optimisers' state (torch's, as loaded or fresh) stacked."""
    params, _ = stack_module_state(models)
    params = {n: p.detach().clone().requires_grad_(True) for n, p in params.items()}
    named = [dict(m.named_parameters()) for m in models]
    decayed = {n for n, p in named[0].items() if p.dim() >= 2}
    out = Stack(optim, params, decayed)
    states = [_base(o).state for o in optimizers]
    if optim == "adamw":
        steps = []
        for names, state in zip(named, states):
            counts = {float(state[p]["step"]) for p in names.values() if p in state}
            if len(counts) > 1:
                raise ValueError(f"a member's parameters were stepped unevenly ({sorted(counts)})")
            steps.append(int(counts.pop()) if counts else 0)
        out.steps = steps
        for key, into in (("exp_avg", out.exp_avg), ("exp_avg_sq", out.exp_avg_sq)):
            for n in params:
                into[n] = torch.stack([s[names[n]][key] if names[n] in s else torch.zeros_like(names[n])
                                       for names, s in zip(named, states)]).detach().clone()
    elif momentum != 0:
        has = [all(s.get(p, {}).get("momentum_buffer") is not None for p in names.values())
               for names, s in zip(named, states)]
        out.has_buffer = torch.tensor(has, device=next(iter(params.values())).device)
        for n in params:
            out.buffer[n] = torch.stack([s[names[n]]["momentum_buffer"] if h else torch.zeros_like(names[n])
                                         for names, s, h in zip(named, states, has)]).detach().clone()
    return out


@torch.no_grad()
def unstack(st: Stack, i: int, model: nn.Module, optimizer, momentum: float = 0.0, state: bool = True) -> None:
    """Member ``i``'s weights (``state``: and optimiser state) written into its own model and
    (torch) optimiser, as a one-model run holds them (for a checkpoint, an evaluation, a leave)."""
    named = dict(model.named_parameters())
    for p_name, p in named.items():
        p.copy_(st.params[p_name][i])
    if state:
        _unstack_state(st, i, named, _base(optimizer).state, momentum)


def _unstack_state(st: Stack, i: int, named: dict, state: dict, momentum: float) -> None:
    for n, p in named.items():
        if st.optim == "adamw" and st.steps[i] > 0:
            state[p] = {"step": torch.tensor(float(st.steps[i])), "exp_avg": st.exp_avg[n][i].clone(),
                        "exp_avg_sq": st.exp_avg_sq[n][i].clone()}
        elif st.optim == "sgd" and momentum != 0 and bool(st.has_buffer[i]):
            state[p] = {"momentum_buffer": st.buffer[n][i].clone()}


# ---- the forward passes ----------------------------------------------------------------------
@dataclass
class Batches:
    """The members' batches of one forward pass, stacked: ``inputs [S, n, T]``, the flat
    index of each member's masked positions padded to the longest ``index [S, M]`` with
    ``valid [S, M]``, the targets there ``targets [S, M]``, and ``1 / n_targets`` per member."""

    inputs: torch.Tensor
    index: torch.Tensor
    targets: torch.Tensor
    valid: torch.Tensor
    inv_n: torch.Tensor
    n_targets: list[int]


def batches(members_batches: list, pad_id: int, device: torch.device) -> Batches:
    """Stack one ``MaskedBatch`` per member (host tensors) for the device."""
    T = max(b.inputs.shape[1] for b in members_batches)
    inputs = torch.stack([F.pad(b.inputs, (0, T - b.inputs.shape[1]), value=pad_id) for b in members_batches])
    picks = []
    for b in members_batches:
        masked = F.pad(b.masked, (0, T - b.masked.shape[1]))
        picks.append(masked.reshape(-1).nonzero().squeeze(1))
    M = max(max(len(p) for p in picks), 1)
    index = torch.zeros(len(picks), M, dtype=torch.int64)
    valid = torch.zeros(len(picks), M, dtype=torch.bool)
    targets = torch.zeros(len(picks), M, dtype=torch.int64)
    for i, (p, b) in enumerate(zip(picks, members_batches)):
        index[i, :len(p)] = p
        valid[i, :len(p)] = True
        targets[i, :len(p)] = F.pad(b.targets, (0, T - b.targets.shape[1]), value=pad_id).reshape(-1)[p]
    n = [b.n_targets for b in members_batches]
    inv = torch.tensor([1.0 / k if k else 0.0 for k in n], dtype=torch.float32)
    return Batches(inputs.to(device), index.to(device), targets.to(device), valid.to(device), inv.to(device), n)


@dataclass
class DropoutDraws:
    """The members' keyed draws of one step (``keyed.stacked``), or ``None`` when off."""

    keys: torch.Tensor
    thresholds: torch.Tensor
    scales: torch.Tensor
    off: bool


def _draws_ctx(draws: DropoutDraws | None, keys, threshold, scale, pass_: int):
    if draws is None:
        return contextlib.nullcontext()
    return keyed.draws(keyed.Draws(keys[pass_], threshold, scale, draws.off))


def _dummy_draws(size: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    z = torch.zeros(size, device=device)
    return z.long()[:, None, None].expand(size, keyed.N_PASSES, 1), z.long(), z.double()


def mlm_losses(template: nn.Module, st: Stack, b: Batches, draws: DropoutDraws | None, pass_: int
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(loss [S], summed [S])``: each member's mean cross-entropy over its targets (the
    one-model ``mlm_loss``) and its detached sum."""
    extra = (draws.keys, draws.thresholds, draws.scales) if draws is not None else _dummy_draws(st.size, b.inputs.device)

    def one(params, batch, drawn):  # one member (vmap: every member at once)
        inputs, index, targets, valid, inv_n = batch
        with _draws_ctx(draws, *drawn, pass_):
            logits = functional_call(template, params, (inputs,))
        picked = logits.reshape(-1, logits.shape[-1]).index_select(0, index)
        ce = F.cross_entropy(picked.float(), targets, reduction="none")
        summed = torch.where(valid, ce, torch.zeros_like(ce)).sum()
        return summed * inv_n, summed.detach()

    with sdpa_kernel(SDPBackend.MATH):
        return vmap(one)(st.params, (b.inputs, b.index, b.targets, b.valid, b.inv_n), tuple(extra))


def adversarial_losses(template: nn.Module, st: Stack, adversary, tokens: torch.Tensor, labels: torch.Tensor,
                       weights: torch.Tensor, draws: DropoutDraws | None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(−λ_i · downstream loss [S], downstream loss [S])`` on each member's labelled batch
    (``tokens [S, B, T]``, ``labels [S, B]``; ``adversary``: one member's objective, for its
    ridge and number of classes, which the members share)."""
    features_of = _Features(template)
    extra = (draws.keys, draws.thresholds, draws.scales) if draws is not None else _dummy_draws(st.size, tokens.device)

    def one(params, tok, lab, keys, threshold, scale):
        with _draws_ctx(draws, keys, threshold, scale, keyed.PASS_ADVERSARIAL):
            features = functional_call(features_of, {f"model.{n}": p for n, p in params.items()}, (tok,))
        return adversary.downstream_loss(features, lab)

    with sdpa_kernel(SDPBackend.MATH):
        d2 = vmap(one)(st.params, tokens, labels, *extra)
    return -weights * d2, d2.detach()


# ---- gradients and the update ----------------------------------------------------------------
@torch.no_grad()
def grad_norms(st: Stack, scaled: dict[str, torch.Tensor] | None = None, exact: bool = False) -> torch.Tensor:
    """``[S]``: each member's gradient norm over all its parameters (of ``scaled`` instead
    of the gradients, when given: SAM's adaptive scaling). ``exact``: member by member with
    torch's own ``get_total_norm`` (one model's reduction order: the same bits; S × P small
    reductions), else batched over the members axis (another order: float rounding)."""
    tensors = scaled if scaled is not None else {n: p.grad for n, p in st.params.items() if p.grad is not None}
    if exact:
        return torch.stack([torch.nn.utils.get_total_norm([t[i] for t in tensors.values()])
                            for i in range(st.size)])
    per = torch.stack([torch.linalg.vector_norm(t.flatten(1), dim=1) for t in tensors.values()], dim=1)
    return torch.linalg.vector_norm(per, dim=1)


@torch.no_grad()
def clip(st: Stack, max_norms: torch.Tensor, exact: bool = False) -> torch.Tensor:
    """``clip_grad_norm_`` per member (``max_norms [S]``; ``inf``: no clipping, the gradient
    multiplied by exactly 1); returns the norms before clipping."""
    norms = grad_norms(st, exact=exact)
    coef = torch.clamp(max_norms / (norms + 1e-6), max=1.0)
    for p in st.params.values():
        if p.grad is not None:
            p.grad.mul_(_per(coef, p.grad))
    return norms


@torch.no_grad()
def ascend(st: Stack, rho: torch.Tensor, adaptive: bool, exact: bool = False) -> torch.Tensor:
    """SAM's move to ``θ + ε`` per member (``ε_i = ρ_i g_i / ‖g_i‖``, adaptive as ``sam.SAM``);
    returns the norms ``‖g_i‖`` (``exact``: as ``sam.SAM`` reduces them, member by member)."""
    scaled = {n: (p.abs() * p.grad if adaptive else p.grad) for n, p in st.params.items() if p.grad is not None}
    if exact:
        norm = torch.stack([torch.norm(torch.stack([s[i].norm() for s in scaled.values()]))
                            for i in range(st.size)])
    else:
        norm = grad_norms(st, scaled)
    scale = torch.reciprocal(norm + 1e-12) * rho  # as ``SAM.ascend``'s ``rho / (norm + 1e-12)`` computes it
    st.eps = {}
    for n, s in scaled.items():
        p = st.params[n]
        eps = (p.abs() * s if adaptive else s) * _per(scale, s)
        p.add_(eps)
        st.eps[n] = eps
    return norm


@torch.no_grad()
def descend(st: Stack) -> None:
    """SAM's return to ``θ`` before the update."""
    for n, eps in st.eps.items():
        st.params[n].sub_(eps)
    st.eps = {}


def _column(values: list[float], like: torch.Tensor) -> torch.Tensor:
    return _per(torch.tensor(values, dtype=like.dtype, device=like.device), like)


@torch.no_grad()
def adamw_step(st: Stack, lrs: list[float], weight_decays: list[float], betas: tuple[float, float], eps: float
               ) -> None:
    """torch's AdamW (single-tensor, not capturable), per member: the same operations with
    each member's scalars as a column (module docstring); the step's per-member scalars
    computed on the host in float64 as torch does, then sent to the device at once."""
    beta1, beta2 = betas
    st.steps = [s + 1 for s in st.steps]
    bc1 = [1 - beta1 ** s for s in st.steps]
    bc2_sqrt = [(1 - beta2 ** s) ** 0.5 for s in st.steps]
    neg_step = [-(lr / c) for lr, c in zip(lrs, bc1)]
    decay = [1 - lr * wd for lr, wd in zip(lrs, weight_decays)]
    first = next(iter(st.params.values()))
    scalars = torch.tensor([decay, bc2_sqrt, neg_step], dtype=first.dtype, device=first.device)
    decays = any(wd != 0 for wd in weight_decays)
    for n, p in st.params.items():
        grad = p.grad
        if grad is None:
            continue
        if n in st.decayed and decays:
            p.mul_(_per(scalars[0], p))
        m, v = st.exp_avg[n], st.exp_avg_sq[n]
        m.lerp_(grad, 1 - beta1)
        v.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        denom = (v.sqrt() / _per(scalars[1], v)).add_(eps)
        p.add_((_per(scalars[2], m) * m) / denom)


@torch.no_grad()
def sgd_step(st: Stack, lrs: list[float], weight_decays: list[float], momentum: float, exact: bool = False) -> None:
    """torch's SGD (single-tensor; no dampening, no Nesterov), per member: a scalar shared by
    every member as torch applies it; per-member values as a column (``exact``: member by
    member with torch's scalar operations, S × P small operations, the same bits)."""
    same_lr, same_wd = len(set(lrs)) == 1, len(set(weight_decays)) == 1
    for n, p in st.params.items():
        grad = p.grad
        if grad is None:
            continue
        wds = weight_decays if n in st.decayed else [0.0] * len(lrs)
        if any(wd != 0 for wd in wds):
            if same_wd:
                grad = grad.add(p, alpha=wds[0])
            elif exact:
                grad = torch.stack([g.add(q, alpha=wd) for g, q, wd in zip(grad, p, wds)])
            else:
                grad = grad + p * _column(wds, p)
        if momentum != 0:
            buf = st.buffer[n]
            buf.copy_(torch.where(_per(st.has_buffer, buf), buf * momentum + grad, grad))
            grad = buf
        if same_lr:
            p.add_(grad, alpha=-lrs[0])
        elif exact:
            for q, g, lr in zip(p, grad, lrs):
                q.add_(g, alpha=-lr)
        else:
            p.add_(grad * _column([-lr for lr in lrs], p))
    if momentum != 0:
        st.has_buffer.fill_(True)
