"""Helpers for the model tests (imported as ``models.model_test_utils``; ``tests`` is on
the path): a tiny vocabulary and random right-padded batches."""

from __future__ import annotations

import torch

N_WORDS = 20
VOCAB = N_WORDS + 3  # words, pad, mask, cls
PAD = N_WORDS
MAX_LEN = 12


def padded_batch(n: int, T: int, seed: int = 0, min_len: int = 1) -> torch.Tensor:
    """``[n, T]`` tokens: words and the odd mask token, right-padded to random lengths
    (the first sentence is full length, so padding never covers a whole batch)."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, N_WORDS, (n, T), generator=g)
    tokens[torch.rand(n, T, generator=g) < 0.15] = PAD + 1  # mask_id
    lengths = torch.randint(min_len, T + 1, (n,), generator=g)
    lengths[0] = T
    tokens[torch.arange(T)[None, :] >= lengths[:, None]] = PAD
    return tokens



def assert_every_parameter_gets_a_gradient(model: torch.nn.Module, tokens: torch.Tensor, n_targets: int = 20) -> None:
    """A cross-entropy backward pass reaches every parameter with a finite, non-zero gradient."""
    import torch.nn.functional as F

    targets = torch.randint(0, n_targets, (tokens.numel(),))
    F.cross_entropy(model(tokens).flatten(0, 1), targets).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, name
