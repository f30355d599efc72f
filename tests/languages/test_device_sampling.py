"""Sampling that runs on the generator's device.

No GPU here: the test makes ``meta`` the default device while sampling with a CPU
generator. A tensor the sampler makes without naming its device would then land on the
meta device and fail against the CPU ones (or come out on meta) — so equal CPU numbers
show that every tensor follows the generator, as a CUDA generator would be followed."""

from __future__ import annotations

import hashlib

import pytest
import torch

from sameloss.languages import make_language
from sameloss.training.data import global_batch, mask_batch


@pytest.mark.parametrize("name,size", [("hmm", "tiny"), ("pcfg", "tiny"), ("pcfg", "micro")])
def test_sampling_and_masking_follow_the_generator(name, size):
    language = make_language(name, size)
    plain = language.sample(300, torch.Generator().manual_seed(7))
    masked = mask_batch(language, plain.tokens, plain.lengths, 0.15, torch.Generator().manual_seed(8), "bert")
    with torch.device("meta"):
        again = language.sample(300, torch.Generator().manual_seed(7))
        masked_again = mask_batch(language, again.tokens, again.lengths, 0.15, torch.Generator().manual_seed(8),
                                  "bert")
    for a, b in ((plain.tokens, again.tokens), (plain.lengths, again.lengths), (plain.latent, again.latent),
                 (masked.inputs, masked_again.inputs), (masked.masked, masked_again.masked)):
        assert b.device.type == "cpu" and torch.equal(a, b)


# sha256 (first 16 hex digits) of the first training batch of seed 0, BERT masking, drawn by
# the code before the sampling followed the generator's device
GOLDEN = {"pcfg": "dea62c6646eb91e2", "hmm": "45ccb832b6480f1f"}


@pytest.mark.parametrize("name", list(GOLDEN))
def test_the_training_stream_is_unchanged(name):
    """The device-following sampler and the masking without data-dependent assignment
    draw exactly the stream they drew before, on the CPU."""
    language = make_language(name, "tiny")
    batch = global_batch(language, seed=0, step=1, batch_size=64, rate=0.15, replace="bert")
    digest = hashlib.sha256(b"".join(t.numpy().tobytes() for t in (batch.inputs, batch.targets, batch.masked)))
    assert digest.hexdigest()[:16] == GOLDEN[name]
