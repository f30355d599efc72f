"""LSTMMLM: shapes, tying, parameter count, padding, dropout, dtypes, gradients."""

from __future__ import annotations

import pytest
import torch
from models.model_test_utils import MAX_LEN, PAD, VOCAB, assert_every_parameter_gets_a_gradient, padded_batch

from sameloss.errors import UserError
from sameloss.models import LSTMMLM, build_model, lstm_config


def make(size="micro", **overrides) -> LSTMMLM:
    torch.manual_seed(0)
    return build_model("lstm", size, VOCAB, MAX_LEN, **overrides)


def expected_parameters(V, d, h, layers, tied=True) -> int:
    """Hand count: embedding; per direction and layer 4 gates × (input + recurrent
    weights + two biases), the input of layers above the first being 2h wide;
    projection 2h → d; output bias (tied) or a full decoder."""
    lstm = 2 * 4 * h * (d + h + 2) + (layers - 1) * 2 * 4 * h * (2 * h + h + 2)
    out = V if tied else d * V + V
    return V * d + lstm + (2 * h * d + d) + out


def test_shapes(batch):
    model = make().eval()
    assert model(batch).shape == (*batch.shape, VOCAB)
    assert model.features(batch).shape == (*batch.shape, 2 * model.config.d_hidden)
    assert model.d_features == 2 * model.config.d_hidden


def test_tied_and_untied(batch):
    tied = make()
    assert tied.output_weight is tied.tok_emb.weight
    assert not hasattr(tied, "decoder")
    untied = make(tie_weights=False)
    assert untied.output_weight is untied.decoder.weight
    assert untied.output_weight is not untied.tok_emb.weight
    assert untied(batch).shape == (*batch.shape, VOCAB)


@pytest.mark.parametrize(("size", "tied"), [("micro", True), ("tiny", False), ("h128-l4", True)])
def test_parameter_count_formula(size, tied):
    cfg = lstm_config(size, VOCAB, MAX_LEN, tie_weights=tied)
    model = LSTMMLM(cfg)
    want = expected_parameters(VOCAB, cfg.d_model, cfg.d_hidden, cfg.n_layers, tied)
    assert model.num_parameters() == want
    assert model.num_parameters(embeddings=False) == want - VOCAB * cfg.d_model


def test_padding_never_reaches_real_tokens():
    model = make("micro", n_layers=2).double().eval()
    tokens = padded_batch(5, 8, seed=1)
    real = tokens != PAD
    base = model(tokens)

    with torch.no_grad():
        model.tok_emb.weight[PAD] += 10.0
    moved = model(tokens)
    with torch.no_grad():
        model.tok_emb.weight[PAD] -= 10.0
    # the pad column of the logits moves with the (tied) pad embedding; nothing else does
    torch.testing.assert_close(moved[real][:, :PAD], base[real][:, :PAD], rtol=0, atol=1e-12)

    longer = torch.cat([tokens, torch.full((5, MAX_LEN - 8), PAD)], dim=1)
    torch.testing.assert_close(model(longer)[:, :8][real], base[real], rtol=0, atol=1e-12)

    for i in range(5):
        n_i = int(real[i].sum())
        torch.testing.assert_close(model(tokens[i : i + 1, :n_i])[0], base[i, :n_i], rtol=0, atol=1e-12)

    assert (model.features(tokens)[~real] == 0).all()


def test_dropout_only_in_training(batch):
    model = make(n_layers=2, dropout=0.3)
    model.eval()
    torch.testing.assert_close(model(batch), model(batch), rtol=0, atol=0)
    model.train()
    torch.manual_seed(1)
    assert (model(batch) - model(batch)).abs().max() > 1e-4


def test_float64(batch):
    model = make().eval()
    single = model(batch)
    double = model.double()(batch)
    assert double.dtype == torch.float64
    torch.testing.assert_close(double.float(), single, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("tied", [True, False])
def test_every_parameter_gets_a_gradient(tied):
    model = make(n_layers=2, tie_weights=tied)
    assert_every_parameter_gets_a_gradient(model, padded_batch(8, MAX_LEN, seed=2))


def test_config_errors():
    with pytest.raises(UserError, match="unknown lstm size 'h100-l4'"):
        lstm_config("h100-l4", VOCAB, MAX_LEN)
    with pytest.raises(UserError, match="d_hidden"):
        lstm_config("micro", VOCAB, MAX_LEN, d_hidden=0)
    with pytest.raises(UserError, match="unknown lstm setting"):
        lstm_config("micro", VOCAB, MAX_LEN, n_heads=2)
