"""Keyed dropout draws (``dropout_draws = "keyed"``, ``training.keyed``): masks a pure
function of (seed, step, pass, site, position), the same batched as alone, with the rate
asked for; a keyed run resumes bit for bit; outside training a keyed model is the model."""

from __future__ import annotations

import pytest
import torch
from torch.func import vmap

from sameloss import config as configlib
from sameloss.errors import UserError
from sameloss.models import build_model
from sameloss.training import PretrainConfig, load_checkpoint, pretrain
from sameloss.training import keyed
from sameloss.training.checkpoint import complete_checkpoints


def small(**overrides) -> PretrainConfig:
    base = ["steps=12", "batch_size=32", "model.size=micro", "eval.every=6", "eval.n_sentences=64", "save_every=4",
            "log_every=3", "optim.warmup_steps=3", "device=cpu", "dropout_draws=keyed"]
    return configlib.load(PretrainConfig, None, base + [f"{k}={v}" for k, v in overrides.items()])


def mask(seed: int, step: int, site: int, rate: float, shape=(200, 50, 100), pass_=keyed.PASS_UPDATE):
    d = keyed.one_model(seed, step, pass_, rate, site + 1, torch.device("cpu"))
    with keyed.draws(d):
        return keyed.mask_scale(site, torch.Size(shape), torch.float32, torch.device("cpu"))


def test_masks_keep_the_rate_and_scale_and_differ_by_seed_step_pass_and_site():
    m = mask(0, 1, 0, 0.1)
    kept = (m > 0).double().mean().item()
    assert abs(kept - 0.9) < 5 * (0.9 * 0.1 / m.numel()) ** 0.5
    assert set(m.unique().tolist()) == {0.0, torch.tensor(1 / 0.9, dtype=torch.float32).item()}
    # another seed, step, pass or site: an independent mask (agreement of independent masks: 0.82)
    for other in (mask(1, 1, 0, 0.1), mask(0, 2, 0, 0.1), mask(0, 1, 1, 0.1), mask(0, 1, 0, 0.1, pass_=1)):
        agree = ((m > 0) == (other > 0)).double().mean().item()
        assert abs(agree - (0.9**2 + 0.1**2)) < 0.005
    # neighbouring positions are not correlated
    flat = (m > 0).double().flatten()
    assert abs(torch.corrcoef(torch.stack([flat[:-1], flat[1:]]))[0, 1].item()) < 0.01
    assert torch.equal(mask(0, 1, 0, 0.1), m)  # a pure function of its key
    # a site called twice in one pass draws two masks
    with keyed.draws(keyed.one_model(0, 1, 0, 0.1, 1, torch.device("cpu"))):
        first, second = (keyed.mask_scale(0, m.shape, torch.float32, torch.device("cpu")) for _ in range(2))
    assert torch.equal(first, m) and abs(((first > 0) == (second > 0)).double().mean().item() - 0.82) < 0.005
    assert keyed.threshold(0.0) == 0 and keyed.threshold(0.5) == 2**31


def test_the_masks_of_members_under_vmap_are_their_masks_alone():
    seeds, rates = [0, 3, 3], [0.1, 0.3, 0.0]
    keys, thresholds, scales = keyed.stacked(seeds, 7, rates, 2, torch.device("cpu"))
    x = torch.ones(3, 40, 30)

    def one(x, keys, threshold, scale):
        with keyed.draws(keyed.Draws(keys[keyed.PASS_ADVERSARIAL], threshold, scale)):
            return keyed.KeyedDropout(1).train()(x)

    batched = vmap(one)(x, keys, thresholds, scales)
    for i, (seed, rate) in enumerate(zip(seeds, rates)):
        alone = mask(seed, 7, 1, rate, (40, 30), pass_=keyed.PASS_ADVERSARIAL)
        assert torch.equal(batched[i], alone if alone is not None else torch.ones(40, 30))


def test_a_keyed_model_is_the_model_outside_training_and_draws_in_training():
    torch.manual_seed(0)
    model = build_model("transformer", "micro", 20, 8, dropout=0.1)
    tokens = torch.randint(0, 17, (4, 8))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    model.eval()
    plain = model(tokens)
    assert keyed.install(model, 0.1) == 3  # embeddings, the block's (called twice), the attention probabilities
    assert model.state_dict().keys() == before.keys()
    assert torch.equal(model(tokens), plain)
    model.train()
    with pytest.raises(RuntimeError, match="without draws"):
        model(tokens)
    with keyed.draws(keyed.one_model(0, 1, 0, 0.1, 3, torch.device("cpu"))):
        a = model(tokens)
    with keyed.draws(keyed.one_model(0, 1, 0, 0.1, 3, torch.device("cpu"))):
        assert torch.equal(model(tokens), a)
    with keyed.draws(keyed.one_model(0, 2, 0, 0.1, 3, torch.device("cpu"))):
        assert not torch.equal(model(tokens), a)
    with keyed.draws(keyed.one_model(0, 1, 0, 0.0, 3, torch.device("cpu"))):  # rate 0: the math attention, no mask
        assert torch.allclose(model(tokens), plain, atol=1e-5)


def test_a_keyed_run_resumes_bit_for_bit_and_its_dropout_acts(tmp_path):
    cfg = small(**{"model.dropout": 0.1})
    whole = pretrain(cfg, tmp_path / "whole", progress=False)
    pretrain(cfg, tmp_path / "cut", progress=False, stop_after=5)
    assert pretrain(cfg, tmp_path / "cut", progress=False, resume=True) == whole
    a, b = (load_checkpoint(complete_checkpoints(tmp_path / r)[-1]).model.state_dict() for r in ("whole", "cut"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    without = pretrain(small(name="nodrop", **{"model.dropout": 0.0}), tmp_path / "nodrop", progress=False)
    assert without["kl"] != whole["kl"]


def test_what_cannot_be_keyed_is_refused_before_the_run_folder(tmp_path):
    with pytest.raises(UserError, match="multi-layer LSTM"):
        pretrain(small(**{"model.kind": "lstm", "model.n_layers": 2, "model.dropout": 0.1}), tmp_path / "r",
                 progress=False)
    assert not (tmp_path / "r").exists()
