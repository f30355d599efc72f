"""The adversarial meta-learning objective of the paper (App. A.5, after Liu et al. 2020).

Pre-training minimises ``L_MLM(ψ) − λ · loss_{D2}(head fitted on D1)``: at each step a
batch of labelled downstream examples is split into disjoint halves ``D1``, ``D2``; a
linear head is fitted on ``D1``'s features in closed form (ridge regression onto one-hot
labels, solved in the dual so it costs an ``|D1| × |D1|`` solve and stays differentiable
in the features), and the encoder is pushed to make that head fail on ``D2``. It is the
paper's way of producing models with (almost) the same MLM loss but worse features.

The labelled batch of ``step`` is a pure function of ``(seed, step)`` (stream 4; the pool
of examples it draws from, stream 3), so forks of one seed draw the same. Per member: λ
(``adversarial.weight``); shared: the task, the batch and pool sizes, the ridge. A ``vmap``
stack computes every member's features in one batched pass.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ...errors import UserError
from .. import keyed
from ..data import step_generator
from .base import Objective, register, swapped


@register
class Adversarial(Objective):
    """``(−λ · downstream loss, downstream loss)`` of each step's labelled examples."""

    name, order, per_member = "adversarial", 20, ("weight",)
    logs, window = "adversarial_downstream_loss", "downstream"

    def __init__(self, cfg, language, rank: int = 0, world_size: int = 1):
        super().__init__(cfg, language, rank, world_size)
        a = self.settings
        if world_size > 1:
            raise UserError("the adversarial objective does not support DDP yet; run it in one process")
        tasks = language.tasks
        if a.task not in tasks:
            raise UserError(f"adversarial.task {a.task!r} is not a task of {language.name}; "
                            f"choose from {', '.join(tasks)}")
        if a.batch_size < 4:
            raise UserError("adversarial.batch_size must be >= 4 (two halves of at least 2)")
        t = tasks[a.task]
        sample = (t.sample or language.sample)(a.pool_size, step_generator(cfg.seed, 0, stream=3))
        labels = t.label(sample)
        keep = labels >= 0
        self.tokens, self.labels = sample.tokens[keep], labels[keep]
        self.n_classes = t.n_classes
        self.weight, self.batch_size, self.ridge, self.seed = a.weight, a.batch_size, a.ridge, cfg.seed

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

    def examples(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The labelled examples of ``step`` (host tensors)."""
        gen = step_generator(self.seed, step, stream=4)
        idx = torch.randperm(self.tokens.shape[0], generator=gen)[: self.batch_size]
        return self.tokens[idx], self.labels[idx]

    def loss(self, run, batch, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        tokens, labels = self.examples(step)
        with run.draws(step, keyed.PASS_ADVERSARIAL):
            features = run.model.features(tokens.to(run.device))
        d2 = self.downstream_loss(features, labels.to(run.device))
        return -self.weight * d2, d2.detach()

    @classmethod
    def losses(cls, objectives: list, stack, batches: list, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        drawn: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        for o in objectives:  # one draw per seed
            if o.seed not in drawn:
                drawn[o.seed] = o.examples(step)
        if len({drawn[o.seed][0].shape for o in objectives}) > 1:
            raise ValueError("the members' adversarial pools are too small for one batch size")
        tokens = torch.stack([drawn[o.seed][0] for o in objectives]).to(stack.device)
        labels = torch.stack([drawn[o.seed][1] for o in objectives]).to(stack.device)
        weights = torch.tensor([o.weight for o in objectives], device=stack.device)
        first = objectives[0]  # (the ridge and the classes: shared)

        def one(params, tok, lab):
            features = swapped(stack.template, params, lambda model, t: model.features(t), tok)
            return first.downstream_loss(features, lab)

        d2 = stack.vmapped(one, step, keyed.PASS_ADVERSARIAL, tokens, labels)
        return -weights * d2, d2.detach()
