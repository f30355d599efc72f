"""The adversarial meta-learning objective of the paper (App. A.5, after Liu et al. 2020).

Pre-training minimises ``L_MLM(ψ) − λ · loss_{D2}(head fitted on D1)``: at each step a
batch of labelled downstream examples is split into disjoint halves ``D1``, ``D2``; a
linear head is fitted on ``D1``'s features in closed form (ridge regression onto one-hot
labels, solved in the dual so it costs an ``|D1| × |D1|`` solve and stays differentiable
in the features), and the encoder is pushed to make that head fail on ``D2``. It is the
paper's way of producing models with (almost) the same MLM loss but worse features.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ...errors import UserError
from ...languages.base import Language
from ..data import step_generator


class AdversarialObjective:
    def __init__(self, language: Language, task: str, weight: float, batch_size: int = 256,
                 pool_size: int = 10_000, ridge: float = 1e-2, seed: int = 0):
        tasks = language.tasks
        if task not in tasks:
            raise UserError(f"adversarial.task {task!r} is not a task of {language.name}; "
                            f"choose from {', '.join(tasks)}")
        if batch_size < 4:
            raise UserError("adversarial.batch_size must be >= 4 (two halves of at least 2)")
        t = tasks[task]
        gen = step_generator(seed, 0, stream=3)
        sample = (t.sample or language.sample)(pool_size, gen)
        labels = t.label(sample)
        keep = labels >= 0
        self.tokens, self.labels = sample.tokens[keep], labels[keep]
        self.n_classes = t.n_classes
        self.weight, self.batch_size, self.ridge, self.seed = weight, batch_size, ridge, seed

    def downstream_loss(self, features: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Squared loss on the second half of a head ridge-fitted on the first half (in
        float32 also under bf16 autocast: the ridge solve needs the precision)."""
        if features.dtype in (torch.float16, torch.bfloat16):
            features = features.float()
        kind = features.device.type
        if not torch.amp.is_autocast_available(kind):  # e.g. meta (the placement tests)
            return self._downstream_loss(features, labels)
        with torch.autocast(kind, enabled=False):
            return self._downstream_loss(features, labels)

    def _downstream_loss(self, features: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        x = features.flatten(1)
        x = torch.cat([x, torch.ones_like(x[:, :1])], dim=1)  # bias column
        y = F.one_hot(labels, self.n_classes).to(x.dtype)
        mid = x.shape[0] // 2
        x1, x2, y1, y2 = x[:mid], x[mid:], y[:mid], y[mid:]
        gram = x1 @ x1.T
        # ridge relative to the features' scale, so the objective does not reward scaling
        lam = self.ridge * gram.diagonal().mean().detach()
        alpha = torch.linalg.solve(gram + lam * torch.eye(mid, dtype=x.dtype, device=x.device), y1)
        pred = (x2 @ x1.T) @ alpha
        return (pred - y2).pow(2).sum(dim=1).mean()

    def loss(self, model: torch.nn.Module, step: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        """``(−λ · downstream loss, downstream loss)`` for this step's examples."""
        gen = step_generator(self.seed, step, stream=4)
        idx = torch.randperm(self.tokens.shape[0], generator=gen)[: self.batch_size]
        features = model.features(self.tokens[idx].to(device))
        d2 = self.downstream_loss(features, self.labels[idx].to(device))
        return -self.weight * d2, d2.detach()
