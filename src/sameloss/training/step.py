"""The one training step: ``train_step(stack, step)`` trains every member of a stack
(``training.stack``: member by member, or every member at once under ``vmap``) on batch
``step`` of its stream — a run trained alone is a stack of one.

In order, as a run has always stepped: the members' batches (each its seed's batch
``step``, ``data.global_batch``, drawn once per seed: forks of one seed share it; or drawn
ahead by workers, ``drawn``); ``update_half``: the update on the second half of each batch;
each objective's ``before_update`` (SAM: the ascent on the first halves, the update on the
second); the update pass — the MLM loss plus every objective's term, its backward pass —;
gradient-norm clipping (or the log step's norms); each objective's ``before_optimizer``
(SAM: back to the weights); each member's optimiser and schedule.

Nothing in a step waits for the device: what it leaves for the log (``StepOut``) stays there
until a log line reads it (``training.window``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import keyed
from .data import global_batch


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
