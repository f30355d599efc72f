"""TransformerMLM: shapes, tying, parameter count, padding, dropout, dtypes, gradients."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from models.model_test_utils import MAX_LEN, PAD, VOCAB, assert_every_parameter_gets_a_gradient, padded_batch

from sameloss.errors import UserError
from sameloss.models import TransformerConfig, TransformerMLM, build_model, transformer_config

NORMS = ["post", "pre"]


def make(size="micro", **overrides) -> TransformerMLM:
    torch.manual_seed(0)
    return build_model("transformer", size, VOCAB, MAX_LEN, **overrides)


def expected_parameters(V, L, d, layers, d_inter, norm="post", head_transform=True) -> int:
    """Hand count: embeddings, per block (QKV, O, MLP up/down, two LayerNorms), the
    extra LayerNorm (embedding for post-LN, final for pre-LN), head transform, bias."""
    block = (3 * d * d + 3 * d) + (d * d + d) + (d * d_inter + d_inter) + (d_inter * d + d) + 4 * d
    head = (d * d + d + 2 * d) if head_transform else 0
    return V * d + L * d + 2 * d + layers * block + head + V


@pytest.mark.parametrize("norm", NORMS)
def test_shapes(norm, batch):
    model = make(norm=norm).eval()
    assert model(batch).shape == (*batch.shape, VOCAB)
    assert model.features(batch).shape == (*batch.shape, model.config.d_model)
    assert model.d_features == model.config.d_model
    full = padded_batch(3, MAX_LEN)
    assert model(full).shape == (3, MAX_LEN, VOCAB)
    with pytest.raises(ValueError, match="max_len"):
        model(padded_batch(2, MAX_LEN + 1))


def test_output_weight_is_the_embedding(batch):
    model = make()
    assert model.output_weight is model.tok_emb.weight
    # exactly one [V, d] matrix among the parameters
    big = [n for n, p in model.named_parameters() if p.shape[0] == VOCAB and p.dim() == 2]
    assert big == ["tok_emb.weight"]
    # a word absent from the input still gets an embedding gradient through the decoder
    absent = 3
    tokens = batch.clone()
    tokens[tokens == absent] = 0
    model(tokens)[..., absent].sum().backward()
    assert model.tok_emb.weight.grad[absent].abs().sum() > 0


@pytest.mark.parametrize(
    ("size", "norm", "head"),
    [("micro", "post", True), ("tiny", "pre", True), ("t3-128", "post", False), ("t3-64", "pre", False)],
)
def test_parameter_count_formula(size, norm, head):
    cfg = transformer_config(size, VOCAB, MAX_LEN, norm=norm, mlm_head_transform=head)
    model = TransformerMLM(cfg)
    want = expected_parameters(VOCAB, MAX_LEN, cfg.d_model, cfg.n_layers, cfg.d_inter, norm, head)
    assert model.num_parameters() == want
    assert model.num_parameters(embeddings=False) == want - (VOCAB + MAX_LEN) * cfg.d_model


def test_parameter_names_are_explicit():
    names = set(dict(make().named_parameters()))
    for name in [
        "tok_emb.weight",
        "pos_emb.weight",
        "emb_norm.weight",
        "blocks.0.attn.qkv.weight",
        "blocks.0.attn.out.weight",
        "blocks.0.attn_norm.weight",
        "blocks.0.mlp.up.weight",
        "blocks.0.mlp.down.weight",
        "blocks.0.mlp_norm.weight",
        "head.dense.weight",
        "head.norm.weight",
        "head.bias",
    ]:
        assert name in names
    pre = set(dict(make(norm="pre").named_parameters()))
    assert "final_norm.weight" in pre and "emb_norm.weight" not in pre


def test_qkv_views_write_through():
    model = make()
    q, k, v = model.qkv_weights(0)
    d = model.config.d_model
    assert q.shape == k.shape == v.shape == (d, d)
    with torch.no_grad():
        k.fill_(7.0)
    assert (model.blocks[0].attn.qkv.weight[d : 2 * d] == 7.0).all()


@pytest.mark.parametrize("norm", NORMS)
def test_padding_never_reaches_real_tokens(norm):
    model = make("micro", norm=norm).double().eval()
    tokens = padded_batch(5, 8, seed=1)
    real = tokens != PAD
    base = model.features(tokens)

    # 1. whatever sits at pad positions (the pad embedding) does not matter
    with torch.no_grad():
        model.tok_emb.weight[PAD] += 10.0
    moved = model.features(tokens)
    with torch.no_grad():
        model.tok_emb.weight[PAD] -= 10.0
    torch.testing.assert_close(moved[real], base[real], rtol=0, atol=1e-12)

    # 2. extra trailing padding does not matter
    longer = torch.cat([tokens, torch.full((5, MAX_LEN - 8), PAD)], dim=1)
    torch.testing.assert_close(model.features(longer)[:, :8][real], base[real], rtol=0, atol=1e-12)

    # 3. a sentence alone gives what it gives inside a batch of longer ones
    for i in range(5):
        n_i = int(real[i].sum())
        alone = model(tokens[i : i + 1, :n_i])[0]
        torch.testing.assert_close(alone, model(tokens)[i, :n_i], rtol=0, atol=1e-12)


def test_all_pad_row_is_finite():
    model = make().eval()
    tokens = torch.full((2, 6), PAD)
    tokens[0, :3] = 1
    assert torch.isfinite(model(tokens)).all()


@pytest.mark.parametrize("norm", NORMS)
def test_dropout_only_in_training(norm, batch):
    model = make(norm=norm, dropout=0.3, attn_dropout=0.3)
    model.eval()
    torch.testing.assert_close(model(batch), model(batch), rtol=0, atol=0)
    model.train()
    torch.manual_seed(1)
    a = model(batch)
    b = model(batch)
    assert (a - b).abs().max() > 1e-4


@pytest.mark.parametrize("norm", NORMS)
def test_float64(norm, batch):
    model = make(norm=norm).eval()
    single = model(batch)
    model.double()
    double = model(batch)
    assert double.dtype == torch.float64
    torch.testing.assert_close(double.float(), single, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("norm", NORMS)
def test_every_parameter_gets_a_gradient(norm):
    model = make(norm=norm)
    assert_every_parameter_gets_a_gradient(model, padded_batch(8, MAX_LEN, seed=2))


@pytest.mark.parametrize("norm", NORMS)
def test_learns_a_fixed_batch(norm):
    """Both layouts train: a few AdamW steps on one batch lower the MLM loss."""
    model = make("micro", norm=norm, dropout=0.0, attn_dropout=0.0)
    tokens = padded_batch(16, 8, seed=3, min_len=8)
    targets = tokens.clone()
    inputs = tokens.clone()
    inputs[:, 2] = PAD + 1
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(60):
        loss = F.cross_entropy(model(inputs)[:, 2], targets[:, 2])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]


def test_config_errors():
    with pytest.raises(UserError, match="multiple of n_heads"):
        transformer_config({"d_model": 10, "n_heads": 3, "n_layers": 1, "d_inter": 8}, VOCAB, MAX_LEN)
    with pytest.raises(UserError, match="norm"):
        transformer_config("micro", VOCAB, MAX_LEN, norm="sandwich")
    with pytest.raises(UserError, match="pad_id"):
        TransformerConfig(VOCAB, MAX_LEN, 16, 2, 1, 32, pad_id=VOCAB)
    with pytest.raises(UserError, match="dropout"):
        transformer_config("micro", VOCAB, MAX_LEN, dropout=1.5)
