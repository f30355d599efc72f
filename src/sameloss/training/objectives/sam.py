"""Sharpness-aware minimisation (Foret et al., 2021), as the paper uses it (App. A.5).

Each step splits the batch in two halves: the *ascent* half gives the gradient ``g``
that picks the worst-case nearby point ``θ + ε`` with ``ε = ρ g / ‖g‖`` (adaptive SAM:
``ε = ρ T² g / ‖T g‖`` with ``T = |θ|``), and the *update* half's gradient at that point
is what the base optimiser applies at ``θ``. The base optimiser (AdamW or SGD) applies
its decoupled weight decay once, in its own step.

Under DDP the ascent pass runs inside ``no_sync()``: each process perturbs with its own
half-batch gradient and only the update gradients are averaged. Under CUDA the loop uses
bf16 autocast, which needs no gradient scaler, so nothing is ever unscaled twice.
"""

from __future__ import annotations

import torch


class SAM:
    """Wraps a base optimiser; call ``ascend()`` after the ascent backward pass and
    ``step()`` after the update backward pass."""

    def __init__(self, params, base: torch.optim.Optimizer, rho: float = 0.05, adaptive: bool = False):
        if rho <= 0:
            raise ValueError(f"SAM radius rho must be positive, got {rho}")
        self.params = [p for p in params if p.requires_grad]
        self.base = base
        self.rho = rho
        self.adaptive = adaptive
        self._eps: list[torch.Tensor | None] = []

    @property
    def param_groups(self):
        return self.base.param_groups

    @torch.no_grad()
    def ascend(self) -> torch.Tensor:
        """Move to ``θ + ε`` using the gradients now in ``.grad``; returns ``‖g‖`` as a
        0-d tensor on the parameters' device (read it only when needed: reading it
        waits for the device)."""
        scaled = [(p.abs() * p.grad if self.adaptive else p.grad) if p.grad is not None else None
                  for p in self.params]
        norm = torch.norm(torch.stack([s.norm() for s in scaled if s is not None]))
        scale = self.rho / (norm + 1e-12)
        self._eps = []
        for p, s in zip(self.params, scaled):
            if s is None:
                self._eps.append(None)
                continue
            eps = (p.abs() * s if self.adaptive else s) * scale
            p.add_(eps)
            self._eps.append(eps)
        return norm

    @torch.no_grad()
    def step(self) -> None:
        """Return to ``θ`` and apply the base optimiser with the gradients at ``θ + ε``."""
        for p, eps in zip(self.params, self._eps):
            if eps is not None:
                p.sub_(eps)
        self._eps = []
        self.base.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.base.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict:
        return {"base": self.base.state_dict(), "rho": self.rho, "adaptive": self.adaptive}

    def load_state_dict(self, state: dict) -> None:
        self.base.load_state_dict(state["base"])
        self.rho, self.adaptive = state["rho"], state["adaptive"]
