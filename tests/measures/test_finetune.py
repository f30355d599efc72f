"""Fine-tuning: a copy of the encoder is trained (the original is untouched), the run is
reproducible, and a short run on an easy task beats the majority class."""

from __future__ import annotations

import json

import pytest
import torch

from sameloss.errors import UserError
from sameloss.languages import PCFG
from sameloss.measures.finetune import Classifier, FinetuneSettings, finetune, lr_factor
from sameloss.measures.tasks import make_task_data
from sameloss.models import build_model
from sameloss.training import load_checkpoint






@pytest.fixture(scope="module")
def loaded(checkpoint):
    model, language, _, _ = load_checkpoint(checkpoint)
    data = make_task_data(language, "task-5", n_train=500, n_validation=200, n_test=500, seed=0)
    return model, language, data


def test_short_finetune_beats_the_majority_and_leaves_the_model_alone(loaded):
    model, language, data = loaded
    before = {k: v.clone() for k, v in model.state_dict().items()}
    r = finetune(model, data, FinetuneSettings(pooling="concat", epochs=3, lr=1e-3, warmup_steps=10), seeds=(0, 1))
    # ≈ 0.45 after 3 epochs (the probe of the same model: ≈ 0.9; majority ≈ 0.2)
    assert r.mean > r.majority_rate + 0.1, r
    assert r.measure == "finetune" and len(r.accuracies) == 2 and r.std >= 0
    assert r.per_seed[0]["steps"] == 3 * 16 and 1 <= r.per_seed[0]["selected_epoch"] <= 3
    assert [h["epoch"] for h in r.per_seed[0]["history"]] == [1, 2, 3]
    assert r.settings["dropout"] == 0.1 and r.settings["pooling"] == "concat"
    json.loads(r.to_json())
    assert not model.training
    for k, v in model.state_dict().items():
        assert torch.equal(before[k], v), k


def test_finetune_is_reproducible_and_leaves_the_global_rng(loaded):
    model, language, _ = loaded
    small = make_task_data(language, "task-5", n_train=64, n_validation=32, n_test=64, seed=1)
    state = torch.get_rng_state()
    a = finetune(model, small, FinetuneSettings(epochs=1, warmup_steps=5, select="last"), seeds=(3,))
    assert torch.equal(state, torch.get_rng_state())
    b = finetune(model, small, FinetuneSettings(epochs=1, warmup_steps=5, select="last"), seeds=(3,))
    assert a.per_seed[0]["history"] == b.per_seed[0]["history"] and a.accuracies == b.accuracies


@pytest.mark.parametrize("kind", ["transformer", "lstm"])
def test_mean_pooling_ignores_pads(kind):
    pcfg = PCFG.preset("tiny")
    torch.manual_seed(0)
    enc = build_model(kind, "micro", pcfg.vocab_size, pcfg.max_len).eval()
    clf = Classifier(enc, 5, pcfg.pad_id, pcfg.max_len, "mean", generator=torch.Generator().manual_seed(0))
    tokens = pcfg.sample(20, torch.Generator().manual_seed(0)).tokens
    real = tokens != pcfg.pad_id
    with torch.no_grad():
        pooled = clf.pooled(tokens)
        h = enc.features(tokens)
    expect = torch.stack([h[i][real[i]].mean(dim=0) for i in range(20)])
    torch.testing.assert_close(pooled, expect)
    assert clf(tokens).shape == (20, 5)


def test_schedule_and_arguments():
    # linear warm-up to 1, then linear decay reaching 0 at the end
    assert lr_factor(0, 4, 10, "linear") == pytest.approx(0.25)
    assert lr_factor(3, 4, 10, "linear") == pytest.approx(1.0)
    assert lr_factor(4, 4, 10, "linear") == pytest.approx(1.0)
    assert lr_factor(9, 4, 10, "linear") == pytest.approx(1 / 6)
    assert lr_factor(9, 4, 10, "constant") == pytest.approx(1.0)
    assert lr_factor(0, 0, 10, "constant") == 1.0
    pcfg = PCFG.preset("tiny")
    data = make_task_data(pcfg, "A", n_train=8, n_validation=4, n_test=4)
    model = build_model("transformer", "micro", pcfg.vocab_size, pcfg.max_len)
    with pytest.raises(UserError, match="pooling"):
        FinetuneSettings(pooling="max")
    with pytest.raises(UserError, match="schedule"):
        FinetuneSettings(schedule="cosine")
