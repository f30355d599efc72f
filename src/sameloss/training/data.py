"""The training stream: fresh sentences every step, a pure function of (seed, step).

The paper trains in the population setting (every batch is new data). Drawing batch
``step`` from a generator seeded by ``(seed, step)`` makes a run reproducible, lets
``--resume`` continue without replaying anything, and lets every DDP process build
the same global batch and keep its own slice — so a multi-process run sees exactly
the data of a single-process run.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..languages.base import Language, sample_mask


@dataclass(frozen=True)
class MaskedBatch:
    inputs: torch.Tensor  # [n, T] ids, masked positions replaced by mask_id
    targets: torch.Tensor  # [n, T] the original ids
    masked: torch.Tensor  # [n, T] bool, the prediction targets
    # flat indices (into [n * T]) of the masked positions, in ``masked.nonzero()`` order;
    # ``to`` computes them where the batch was made (the host) and carries them along, so
    # that picking the targets on the device (``at_masked``) needs no read-back of a
    # data-dependent size, as ``x[masked]`` does
    index: torch.Tensor | None = None

    @property
    def n_targets(self) -> int:
        return int(self.masked.sum())

    def rows(self, lo: int, hi: int) -> MaskedBatch:
        return MaskedBatch(self.inputs[lo:hi], self.targets[lo:hi], self.masked[lo:hi])

    def shard(self, rank: int, world_size: int) -> MaskedBatch:
        """This process's contiguous slice under DDP."""
        return self.rows(*shard_bounds(self.inputs.shape[0], rank, world_size))

    def halves(self) -> tuple[MaskedBatch, MaskedBatch]:
        """First and second half of the sentences (SAM's ascent and update batches)."""
        mid = self.inputs.shape[0] // 2
        return self.rows(0, mid), self.rows(mid, self.inputs.shape[0])

    def to(self, device) -> MaskedBatch:
        index = self.index
        if index is None and self.masked.device.type == "cpu":
            index = self.masked.reshape(-1).nonzero().squeeze(1)
        return MaskedBatch(self.inputs.to(device), self.targets.to(device), self.masked.to(device),
                           None if index is None else index.to(device))

    def at_masked(self, values: torch.Tensor) -> torch.Tensor:
        """``values[masked]`` for ``values`` of shape ``[n, T, ...]`` (e.g. logits), in
        the same order; by ``index`` when the batch carries it (no device sync)."""
        if self.index is None:
            return values[self.masked]
        return values.reshape(-1, *values.shape[2:]).index_select(0, self.index)


def step_generator(seed: int, step: int, stream: int = 0) -> torch.Generator:
    """A generator for one step, independent across steps, seeds and streams."""
    # Knuth's multiplicative hash spreads nearby (seed, step) pairs apart.
    mixed = (seed * 0x9E3779B1 + step * 0x85EBCA77 + stream * 0xC2B2AE3D) % (2**63 - 1)
    return torch.Generator().manual_seed(mixed)


MASK_REPLACEMENTS = ("mask", "bert")


def mask_batch(language: Language, tokens: torch.Tensor, lengths: torch.Tensor, rate: float | None,
               generator: torch.Generator, replace: str = "mask") -> MaskedBatch:
    """Hide positions (rate, at least one per sentence; ``rate=None``: exactly one; only
    where ``language.maskable`` allows, if the language has it) and replace every hidden
    token by the mask token (``replace="mask"``), so the exact conditionals apply; or, for
    training only, BERT's 80/10/10 (``"bert"``: 80 % the mask token, 10 % a uniformly
    random word, 10 % the token itself)."""
    maskable = language.maskable(tokens) if hasattr(language, "maskable") else None
    masked = sample_mask(lengths, tokens.shape[1], rate, generator, maskable)
    if replace == "mask":
        return MaskedBatch(tokens.masked_fill(masked, language.mask_id), tokens, masked)
    if replace != "bert":
        raise ValueError(f"unknown mask replacement {replace!r}; choose from {', '.join(MASK_REPLACEMENTS)}")
    u = torch.rand(tokens.shape, generator=generator, device=tokens.device)
    random_words = torch.randint(language.n_words, tokens.shape, generator=generator, device=tokens.device)
    inputs = torch.where(masked & (u < 0.8), language.mask_id, tokens)
    inputs = torch.where(masked & (u >= 0.8) & (u < 0.9), random_words, inputs)
    return MaskedBatch(inputs, tokens, masked)


def global_batch(language: Language, seed: int, step: int, batch_size: int, rate: float | None,
                 replace: str = "mask") -> MaskedBatch:
    """The whole batch of step ``step`` (every process builds the same one)."""
    gen = step_generator(seed, step)
    # a language may draw its training sentences from a stored pool (the causal one's language.pool)
    batch = getattr(language, "sample_train", language.sample)(batch_size, gen)
    return mask_batch(language, batch.tokens, batch.lengths, rate, gen, replace)


def shard_bounds(n: int, rank: int, world_size: int) -> tuple[int, int]:
    per, extra = divmod(n, world_size)
    lo = rank * per + min(rank, extra)
    return lo, lo + per + (1 if rank < extra else 0)
