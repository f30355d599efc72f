"""Sharpness-aware minimisation (Foret et al., 2021), as the paper uses it (App. A.5).

Each step splits the batch in two halves: the *ascent* half gives the gradient ``g``
that picks the worst-case nearby point ``θ + ε`` with ``ε = ρ g / ‖g‖`` (adaptive SAM:
``ε = ρ T² g / ‖T g‖`` with ``T = |θ|``), and the *update* half's gradient at that point
is what the optimiser (AdamW or SGD, torch's) applies at ``θ``, once the weights are back
there. The optimiser applies its decoupled weight decay once, in its own step.

Under DDP the ascent pass runs inside ``no_sync()`` (``Stack.forward_backward``'s
``local``): each process perturbs with its own half-batch gradient and only the update
gradients are averaged. Under CUDA the loop uses bf16 autocast, which needs no gradient
scaler, so nothing is ever unscaled twice.

Per member: ``ρ`` (``sam.rho``); shared: ``adaptive``. A ``members`` stack ascends each
member as a run alone does (``ascend``: its norm reduced parameter by parameter, the same
bits); a ``vmap`` stack every member at once (``ascend_stacked``: each member's own norm
over the members axis). Checkpoints keep the optimiser state of a SAM run in the form
SAM runs have always saved (``saved_optimizer``: ``{"base", "rho", "adaptive"}``).
"""

from __future__ import annotations

import torch

from .. import keyed
from .base import Objective, register


@torch.no_grad()
def ascend(params: list[torch.Tensor], rho: float, adaptive: bool = False) -> list[torch.Tensor | None]:
    """Move one model's ``params`` to ``θ + ε`` using the gradients in ``.grad``; returns
    each parameter's ``ε`` (``None``: no gradient), for ``descend``."""
    scaled = [(p.abs() * p.grad if adaptive else p.grad) if p.grad is not None else None for p in params]
    norm = torch.norm(torch.stack([s.norm() for s in scaled if s is not None]))
    scale = rho / (norm + 1e-12)
    out = []
    for p, s in zip(params, scaled):
        if s is None:
            out.append(None)
            continue
        eps = (p.abs() * s if adaptive else s) * scale
        p.add_(eps)
        out.append(eps)
    return out


@torch.no_grad()
def ascend_stacked(params: dict[str, torch.Tensor], rho: torch.Tensor, adaptive: bool) -> dict[str, torch.Tensor]:
    """``ascend`` for stacked weights ``params[name] [S, ...]``, each member with its own
    ``‖g_i‖`` and ``ρ_i`` (``rho [S]``); returns the ``ε`` of each stacked parameter."""
    scaled = {n: (p.abs() * p.grad if adaptive else p.grad) for n, p in params.items() if p.grad is not None}
    per = torch.stack([torch.linalg.vector_norm(t.flatten(1), dim=1) for t in scaled.values()], dim=1)
    scale = torch.reciprocal(torch.linalg.vector_norm(per, dim=1) + 1e-12) * rho  # as ``ascend``'s rho / (norm + 1e-12)
    out = {}
    for n, s in scaled.items():
        p = params[n]
        eps = (p.abs() * s if adaptive else s) * scale.view(-1, *([1] * (s.dim() - 1)))
        p.add_(eps)
        out[n] = eps
    return out


@torch.no_grad()
def descend(params, eps) -> None:
    """Back to ``θ``: ``params`` and ``eps`` as ``ascend`` (lists) or ``ascend_stacked`` (dicts) left them."""
    pairs = zip(params, eps) if isinstance(eps, list) else ((params[n], e) for n, e in eps.items())
    for p, e in pairs:
        if e is not None:
            p.sub_(e)


def base_state(saved: dict) -> dict:
    """The optimiser's own state in a checkpoint's (a SAM run's unwrapped)."""
    return saved["base"] if "base" in saved and "rho" in saved else saved


@register
class SAM(Objective):
    """SAM as an objective of the step (module docstring): no term of its own; the ascent
    before the update and the return before the optimiser."""

    name, order, term, per_member = "sam", 10, False, ("rho",)

    @classmethod
    def on(cls, cfg) -> bool:
        return cfg.sam.rho > 0

    @classmethod
    def before_update(cls, objectives: list, stack, batches: list, step: int) -> list:
        """The ascent: each member's gradient on its first half-batch (this process's own
        under DDP), its move to ``θ + ε``; the update runs on the second halves."""
        halves = [b.halves() for b in batches]
        stack.forward_backward([h[0] for h in halves], step, keyed.PASS_ASCENT, terms=False, local=True)
        adaptive = objectives[0].settings.adaptive
        if stack.exact:
            for o, params in zip(objectives, stack.member_parameters()):
                o.eps = ascend(params, o.settings.rho, adaptive)
        else:
            rho = torch.tensor([o.settings.rho for o in objectives], device=stack.device)
            objectives[0].eps = ascend_stacked(stack.params, rho, adaptive)
        stack.zero_grad()
        return [h[1] for h in halves]

    def saved_optimizer(self, state: dict, cfg) -> dict:
        """A SAM run's checkpoint holds the optimiser's own state wrapped, as it always has."""
        return {"base": state, "rho": cfg.sam.rho, "adaptive": cfg.sam.adaptive}

    @classmethod
    def before_optimizer(cls, objectives: list, stack) -> None:
        if stack.exact:
            for o, params in zip(objectives, stack.member_parameters()):
                descend(params, o.eps)
        else:
            descend(stack.params, objectives[0].eps)
        for o in objectives:
            o.eps = None
