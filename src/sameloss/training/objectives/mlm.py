"""The masked-language-model loss: every run's objective, and the first term of its step.

One member: the cross-entropy summed over this process's targets, divided by the global
batch's number of targets and multiplied by the world size (DDP averages the gradients
over the processes: the update equals the single-process one), and the plain sum for the
log window. A ``vmap`` stack: every member's on its own batch at once — its masked positions
gathered by a padded index with a validity mask, since members differ in their number of
targets (``Batches``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.func import functional_call

from .. import keyed
from .base import Objective, register


def mlm_loss(model, batch, n_targets_global: int, world_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Cross-entropy summed over this process's targets / global target count, times the
    world size (DDP averages gradients over processes), and the plain sum for logging."""
    logits = model(batch.inputs)
    summed = F.cross_entropy(batch.at_masked(logits).float(), batch.at_masked(batch.targets), reduction="sum")
    return summed * (world_size / n_targets_global), summed.detach()


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

    @classmethod
    def of(cls, members_batches: list, pad_id: int, device: torch.device) -> Batches:
        """One ``MaskedBatch`` per member (host tensors), stacked for the device."""
        T = max(b.inputs.shape[1] for b in members_batches)
        inputs = torch.stack([F.pad(b.inputs, (0, T - b.inputs.shape[1]), value=pad_id) for b in members_batches])
        picks = [F.pad(b.masked, (0, T - b.masked.shape[1])).reshape(-1).nonzero().squeeze(1) for b in members_batches]
        M = max(max(len(p) for p in picks), 1)
        index = torch.zeros(len(picks), M, dtype=torch.int64)
        valid = torch.zeros(len(picks), M, dtype=torch.bool)
        targets = torch.zeros(len(picks), M, dtype=torch.int64)
        for i, (p, b) in enumerate(zip(picks, members_batches)):
            index[i, :len(p)] = p
            valid[i, :len(p)] = True
            targets[i, :len(p)] = F.pad(b.targets, (0, T - b.targets.shape[1]), value=pad_id).reshape(-1)[p]
        inv = torch.tensor([1.0 / b.n_targets if b.n_targets else 0.0 for b in members_batches], dtype=torch.float32)
        return cls(*(t.to(device) for t in (inputs, index, targets, valid, inv)))


@register
class MLM(Objective):
    """The MLM loss (module docstring). It has no settings: every run trains on it; its
    logged value is the summed cross-entropy (the log window's ``train_loss``)."""

    name, order, window = "mlm", 0, "loss"

    @classmethod
    def on(cls, cfg) -> bool:
        return True

    @classmethod
    def settings_of(cls, cfg):
        return None

    @classmethod
    def cost(cls, cfg, vocab: int) -> float:
        return 0.0  # the step itself (the planner's three forwards a sentence)

    def loss(self, run, batch, step: int, pass_: int = keyed.PASS_UPDATE):
        """This process's shard of ``batch`` through the module the run trains (DDP's wrapper
        under ``torchrun``), with its dropout draws of ``pass_``."""
        with run.draws(step, pass_):
            return mlm_loss(run.train_model, batch.shard(run.rank, run.world_size).to(run.device), batch.n_targets,
                            run.world_size)

    @classmethod
    def losses(cls, objectives: list, stack, batches: list, step: int, pass_: int = keyed.PASS_UPDATE):
        b = Batches.of(batches, stack.language.pad_id, stack.device)

        def one(params, inputs, index, targets, valid, inv_n):  # one member (vmap: every member at once)
            logits = functional_call(stack.template, params, (inputs,))
            picked = logits.reshape(-1, logits.shape[-1]).index_select(0, index)
            ce = F.cross_entropy(picked.float(), targets, reduction="none")
            summed = torch.where(valid, ce, torch.zeros_like(ce)).sum()
            return summed * inv_n, summed.detach()

        return stack.vmapped(one, step, pass_, b.inputs, b.index, b.targets, b.valid, b.inv_n)
