"""The look-up-table baseline: its features are the language's true conditionals, and a
probe on them recovers the HMM's hidden state far above the majority rate."""

from __future__ import annotations

import json

import pytest
import torch

from sameloss.languages import HMM, PCFG, Dyck
from sameloss.measures.lookup import lookup_features, lookup_table_probe
from sameloss.measures.probe import ProbeSettings
from sameloss.measures.tasks import make_task_data




@pytest.mark.parametrize("language", [HMM.preset("tiny"), PCFG.preset("tiny")], ids=["hmm", "pcfg"])
def test_features_are_the_true_single_mask_conditionals(language):
    tokens = language.sample(50, torch.Generator().manual_seed(0)).tokens
    f = lookup_features(language, tokens, batch_size=16)  # several batches
    n, T = tokens.shape
    W = language.n_words
    assert f.shape == (n, T * W) and f.dtype == torch.float32
    f = f.view(n, T, W)
    real = tokens != language.pad_id
    # one position masked at a time, position by position, straight from the language
    for t in range(T):
        rows = real[:, t]
        if not rows.any():
            continue
        masked = torch.zeros_like(real)
        masked[:, t] = True
        expect = language.conditionals(tokens[rows], masked[rows])
        torch.testing.assert_close(f[rows, t], expect.float(), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(f[real].sum(dim=1), torch.ones(int(real.sum())), atol=1e-5, rtol=0)
    assert (f[~real] == 0).all()


def test_lookup_table_recovers_the_hidden_state():
    hmm = HMM.preset("tiny")
    data = make_task_data(hmm, "task-5", n_train=500, n_validation=200, n_test=500, seed=0)
    r = lookup_table_probe(hmm, data, ProbeSettings.of("lbfgs", seeds=(0,)))
    # the conditionals at the neighbouring positions carry the state: ≈ 0.89 vs ≈ 0.20
    assert r.mean > r.majority_rate + 0.4, r
    assert r.measure == "lookup_table" and r.settings["feature_dim"] == hmm.max_len * hmm.n_words
    assert r.settings["nan_positions"] == 0
    json.loads(r.to_json())
    fast = lookup_table_probe(hmm, data, ProbeSettings.of("adamw", seeds=(0, 1), epochs=10, lr=1e-2))
    assert len(fast.accuracies) == 2 and fast.mean > fast.majority_rate + 0.3, fast


def test_undefined_conditionals_are_zeroed_and_counted():
    dyck = Dyck.preset("tiny")
    # uniform bracket strings (the task's inputs) are mostly not sentences of the language
    data = make_task_data(dyck, "mismatch", n_train=100, n_validation=20, n_test=50, seed=0)
    f, nans = lookup_features(dyck, data.train.tokens, return_nan_count=True)
    assert nans > 0 and torch.isfinite(f).all()
    r = lookup_table_probe(dyck, data, ProbeSettings.of("lbfgs", seeds=(0,)))
    assert r.settings["nan_positions"] >= nans


def test_language_must_match_the_data():
    data = make_task_data(HMM.preset("tiny"), "task-5", n_train=10, n_validation=5, n_test=5)
    with pytest.raises(ValueError, match="language"):
        lookup_table_probe(Dyck.preset("tiny"), data)
