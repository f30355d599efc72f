"""Task splits and the linear probe: synthetic features with known answers, then a real
(tiny) checkpoint end to end."""

from __future__ import annotations

import json

import pytest
import torch

from sameloss.errors import UserError
from sameloss.languages import HMM, PCFG, Batch
from sameloss.measures.heads import HeadTraining
from sameloss.measures.probe import (
    ProbeSettings,
    extract_features,
    gaussian_projection,
    linear_probe,
    probe_features,
    standardize,
    train_head,
)
from sameloss.measures.tasks import SPLITS, Split, TaskData, make_task_data, split_seed
from sameloss.models import build_model
from sameloss.training import load_checkpoint




# ---- task data ------------------------------------------------------------------------------
def test_task_splits_are_deterministic_sized_and_in_range():
    hmm = HMM.preset("tiny")
    a = make_task_data(hmm, "task-5", n_train=60, n_validation=20, n_test=40, seed=3)
    b = make_task_data(hmm, "task-5", n_train=60, n_validation=20, n_test=40, seed=3)
    c = make_task_data(hmm, "task-5", n_train=60, n_validation=20, n_test=40, seed=4)
    assert a.sizes() == {"train": 60, "validation": 20, "test": 40}
    for s in SPLITS:
        assert torch.equal(getattr(a, s).tokens, getattr(b, s).tokens)
        assert torch.equal(getattr(a, s).labels, getattr(b, s).labels)
        assert not torch.equal(getattr(a, s).tokens, getattr(c, s).tokens)
        split = getattr(a, s)
        assert split.tokens.shape == (len(split), hmm.max_len)
        assert split.labels.min() >= 0 and split.labels.max() < a.n_classes
        # the labels are the task's own
        assert torch.equal(split.labels, hmm.tasks["task-5"].label(Batch(split.tokens, split.lengths)))
    # the three splits come from different generators (and differ)
    seeds = {split_seed(3, s) for s in SPLITS} | {split_seed(4, s) for s in SPLITS}
    assert len(seeds) == 6
    assert not torch.equal(a.train.tokens[:20], a.validation.tokens)
    assert a.kept_fraction == 1.0


def test_left_out_sentences_are_dropped_and_padded_to_max_len():
    pcfg = PCFG.preset("tiny")
    data = make_task_data(pcfg, "B", n_train=80, n_validation=10, n_test=30, seed=0)
    assert data.sizes() == {"train": 80, "validation": 10, "test": 30}
    assert 0 < data.kept_fraction < 1  # task B leaves some sentences out
    for s in SPLITS:
        split = getattr(data, s)
        assert (split.labels >= 0).all() and (split.labels < data.n_classes).all()
        assert split.tokens.shape[1] == pcfg.max_len
        assert torch.equal(split.lengths, pcfg.lengths_of(split.tokens))


def test_unknown_task_lists_the_tasks():
    with pytest.raises(UserError, match="task-5, task-5-sampled, task-8"):
        make_task_data(HMM.preset("tiny"), "task-3")


# ---- the head on synthetic features -----------------------------------------------------------
def synthetic(n_classes=4, dim=20, sizes=(600, 200, 600), linear=True, seed=0) -> tuple[dict, TaskData]:
    gen = torch.Generator().manual_seed(seed)
    W = torch.randn(n_classes, dim, generator=gen)
    feats, splits = {}, {}
    for name, n in zip(SPLITS, sizes):
        x = torch.randn(4 * n, dim, generator=gen) * 3 + 1  # not standardised: the probe does it
        scores = (x - 1) @ W.T
        top2 = scores.topk(2, dim=1).values
        x = x[top2[:, 0] - top2[:, 1] > 2.0][:n]  # a margin: separable by a head of moderate norm
        assert x.shape[0] == n
        y = ((x - 1) @ W.T).argmax(dim=1) if linear else torch.randint(0, n_classes, (n,), generator=gen)
        feats[name] = x
        splits[name] = Split(torch.zeros(n, 2, dtype=torch.long), torch.full((n,), 2), y)
    return feats, TaskData("synthetic", "linear" if linear else "random", n_classes, seed=seed,
                           kept_fraction=1.0, **splits)


@pytest.mark.parametrize("method", ["adamw", "lbfgs"])
def test_linear_labels_are_learned(method):
    feats, data = synthetic()
    r = probe_features(feats, data, ProbeSettings.of(method, seeds=(0, 1), epochs=40, lr=1e-2, batch_size=64))
    assert r.mean > 0.95, r
    assert len(r.accuracies) == 2 and r.n_train == 600 and r.n_test == 600
    if method == "adamw":
        assert all(1 <= s["best_epoch"] <= 40 for s in r.per_seed)
    else:
        assert r.std < 1e-9  # convex, from zero: the seed does not matter without a projection


@pytest.mark.parametrize("method", ["adamw", "lbfgs"])
def test_random_labels_stay_at_chance(method):
    feats, data = synthetic(linear=False, sizes=(400, 200, 1000))
    r = probe_features(feats, data, ProbeSettings.of(method, seeds=(0,), epochs=20, lr=1e-2))
    assert abs(r.mean - 0.25) < 0.08, r


def test_lbfgs_and_adamw_agree_on_an_easy_problem():
    feats, data = synthetic(n_classes=3, dim=10, seed=1)
    x_tr, x_va, x_te = standardize(feats["train"], feats["validation"], feats["test"])
    a = train_head((x_tr, data.train.labels), (x_va, data.validation.labels), 3,
                   HeadTraining("adamw", epochs=60, lr=1e-2, batch_size=64))
    b = train_head((x_tr, data.train.labels), (x_va, data.validation.labels), 3, HeadTraining("lbfgs", l2=1e-3))
    pa, pb = a.logits(x_te).argmax(1), b.logits(x_te).argmax(1)
    assert (pa == pb).double().mean() > 0.95
    assert abs(a.accuracy(x_te, data.test.labels) - b.accuracy(x_te, data.test.labels)) < 0.03
    assert b.iterations is not None and b.iterations > 0


def test_projection_dims_and_seeds():
    R = gaussian_projection(768, 512, seed=0)
    assert R.shape == (768, 512)
    assert torch.equal(R, gaussian_projection(768, 512, seed=0))
    assert not torch.equal(R, gaussian_projection(768, 512, seed=1))
    assert abs(float(R.pow(2).sum(0).mean()) - 1.0) < 0.05  # columns of unit norm on average
    feats, data = synthetic()
    r = probe_features(feats, data, ProbeSettings.of("lbfgs", seeds=(0, 1), projection_dim=64))
    assert r.settings["projection_dim"] == 64 and r.settings["feature_dim"] == 20
    assert r.mean > 0.95  # a projection to more dimensions than D loses nothing
    # the projection depends on the seed, so the heads differ
    assert r.per_seed[0]["train_loss"] != r.per_seed[1]["train_loss"]


def test_result_serialises_and_rejects_bad_settings():
    feats, data = synthetic(sizes=(100, 50, 100))
    r = probe_features(feats, data, ProbeSettings.of("lbfgs", seeds=(0,)))
    back = json.loads(r.to_json())
    assert back["measure"] == "linear_probe" and back["accuracies"] == r.accuracies
    assert 0 <= back["majority_rate"] <= 1 and back["std"] == 0.0
    with pytest.raises(UserError, match="method"):
        ProbeSettings.of("sgd")
    with pytest.raises(UserError, match="projection_dim"):
        ProbeSettings.of(projection_dim=0)


# ---- features of real models --------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["transformer", "lstm"])
def test_features_concatenate_positions_and_zero_pads(kind):
    pcfg = PCFG.preset("tiny")
    torch.manual_seed(0)
    model = build_model(kind, "micro", pcfg.vocab_size, pcfg.max_len)
    model.train()
    tokens = pcfg.sample(40, torch.Generator().manual_seed(0)).tokens
    assert (tokens == pcfg.pad_id).any()
    f = extract_features(model, tokens, pcfg.pad_id, batch_size=16)
    assert model.training  # mode restored
    assert f.shape == (40, pcfg.max_len * model.d_features) and not f.requires_grad
    model.eval()
    with torch.no_grad():
        h = model.features(tokens)
    f = f.view(40, pcfg.max_len, -1)
    real = tokens != pcfg.pad_id
    torch.testing.assert_close(f[real], h[real])
    assert (f[~real] == 0).all()




def test_probe_of_a_tiny_checkpoint(checkpoint):
    model, language, _, _ = load_checkpoint(checkpoint)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    data = make_task_data(language, "task-5", n_train=300, n_validation=100, n_test=300, seed=0)
    results = [linear_probe(model, data, ProbeSettings.of("lbfgs", seeds=(0,))),
               linear_probe(model, data, ProbeSettings.of("adamw", seeds=(0, 1), epochs=5, projection_dim=512))]
    for r in results:
        assert r.measure == "linear_probe" and r.task == "task-5" and r.language == "hmm"
        assert all(0.0 <= a <= 1.0 for a in r.accuracies)
        assert (r.n_train, r.n_validation, r.n_test, r.n_classes) == (300, 100, 300, language.n_states)
        assert r.settings["feature_dim"] == language.max_len * model.d_features
        json.loads(r.to_json())
    assert results[1].settings["projection_dim"] == 512 and len(results[1].accuracies) == 2
    # the probe does not train the encoder
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
