"""Embedding a small transformer into a larger one (App. B.4): the function is preserved,
and what happens to the trace of Hessian."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch
import torch.nn.functional as F
from models.model_test_utils import MAX_LEN, PAD, VOCAB, padded_batch
from torch.func import functional_call, grad, jacrev, jvp, vmap
from torch.nn.attention import SDPBackend, sdpa_kernel

from sameloss import config as configlib
from sameloss.errors import UserError
from sameloss.models import build_model
from sameloss.models.embed import (
    embed,
    embedded_param_count,
    plan_embedding,
    target_plan,
)
from sameloss.models.transformer import TransformerConfig, TransformerMLM
from sameloss.training import PretrainConfig, load_checkpoint
from sameloss.training.embed_io import embed_checkpoint
from sameloss.training import checkpoint as ckpt
from sameloss.training.runio import build_language, init_model




def perturbed(cfg: TransformerConfig, dtype=torch.float64, seed: int = 0, scale: float = 0.3) -> TransformerMLM:
    """A model in eval mode whose parameters are all generic (LayerNorm gains not 1, biases
    not 0), so that no special structure hides a mistake."""
    torch.manual_seed(seed)
    model = TransformerMLM(cfg).to(dtype)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * scale)
    return model.eval()


def small_config(norm: str = "post", head: bool = True, **shape) -> TransformerConfig:
    fields = dict(d_model=16, n_heads=2, n_layers=2, d_inter=24)
    fields.update(shape)
    return TransformerConfig(vocab_size=VOCAB, max_len=MAX_LEN, pad_id=PAD, norm=norm,
                             mlm_head_transform=head, **fields)


# ----------------------------------------------------------------------------- the function


@pytest.mark.parametrize("norm", ["post", "pre"])
@pytest.mark.parametrize("head", [True, False])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float64, 1e-10)])
def test_embedded_model_computes_the_same_logits(norm, head, dtype, tol):
    tokens = padded_batch(6, 10, seed=1)
    small = perturbed(small_config(norm, head), dtype)
    logits, feats = small(tokens), small.features(tokens)
    for k in (2, 3):
        for extra in range(4):
            for d_inter in (None, 24 * k + 5):  # d_inter not a multiple: units copied unevenly
                big = embed(small, k, extra, d_inter=d_inter)
                assert not big.training
                c = big.config
                assert (c.d_model, c.n_heads, c.n_layers, c.d_head) == (16 * k, 2 * k, 2 + extra, small.config.d_head)
                assert c.d_inter == (d_inter or 24 * k)
                torch.testing.assert_close(big(tokens), logits, atol=tol, rtol=tol)
                # features are the k-fold replication (divided by k without the head transform)
                expected = feats.repeat(1, 1, k) / (1 if head else k)
                torch.testing.assert_close(big.features(tokens), expected, atol=tol, rtol=tol)


def test_width_is_exact_and_pre_ln_depth_is_exact_in_floating_point():
    """Pre-LN added blocks add exactly 0. Post-LN added blocks renormalise an already
    normalised vector: equal up to LayerNorm's epsilon (1e-12), far below 1e-10."""
    tokens = padded_batch(5, 9, seed=2)
    pre = perturbed(small_config("pre"))
    assert torch.equal(embed(pre, 1, 3)(tokens), pre(tokens))
    post = perturbed(small_config("post"))
    assert (embed(post, 1, 3)(tokens) - post(tokens)).abs().max() < 1e-11


def test_embedded_parameters_have_the_documented_form():
    small = perturbed(small_config("pre"))
    big = embed(small, 2, 1)
    W = small.blocks[0].attn.out.weight
    assert torch.equal(big.blocks[0].attn.out.weight, torch.cat([torch.cat([W, W], 1)] * 2, 0) / 2)
    wq, wk, wv = small.qkv_weights(0)
    bq, bk, bv = big.qkv_weights(0)
    for s, b in ((wq, bq), (wk, bk), (wv, bv)):
        assert torch.equal(b, s.repeat(2, 2) / 2)
    assert torch.equal(big.tok_emb.weight, torch.cat([small.tok_emb.weight] * 2, 1))
    assert torch.equal(big.head.norm.weight, torch.cat([small.head.norm.weight] * 2) / 2)
    assert torch.equal(big.head.bias, small.head.bias)
    added = big.blocks[2]
    assert all(torch.count_nonzero(p) == 0 for n, p in added.named_parameters() if "norm" not in n)
    assert big.num_parameters() == embedded_param_count(small.config, plan_embedding(small.config, 2, 1))
    # a model that is not wider nor deeper is the same model
    same = embed(small)
    for (n, p), (m, q) in zip(small.named_parameters(), same.named_parameters()):
        assert n == m and torch.equal(p, q), n


def test_embed_refuses_impossible_shapes():
    small = TransformerMLM(small_config())
    with pytest.raises(UserError, match="must have 4 heads"):
        embed(small, 2, n_heads=2)
    with pytest.raises(UserError, match="d_inter"):
        embed(small, 2, d_inter=10)
    with pytest.raises(UserError, match="width factor"):
        embed(small, 0)
    with pytest.raises(UserError, match="extra layers"):
        embed(small, 2, -1)
    with pytest.raises(UserError, match="only transformers"):
        embed(build_model("lstm", "micro", VOCAB, MAX_LEN))


# ----------------------------------------------------------------------------- MLP base case (B.4.1)


def mlp_forward(params: list[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    *weights, a = params
    h = x
    for W in weights:
        h = torch.relu(h @ W.T)
    return h @ a


def widen_mlp(params: list[torch.Tensor], k: int) -> list[torch.Tensor]:
    """App. B.4.1 for k copies: W̃_0 = [W; …; W]/√k, W̃_l = (J/k) ⊗ W, ã = [a; …; a]/√k,
    so that h̃_l = [h_l; …; h_l]/√k."""
    W0, *mid, a = params
    return [W0.repeat(k, 1) / math.sqrt(k), *(W.repeat(k, k) / k for W in mid), a.repeat(k) / math.sqrt(k)]


def flat_hessian_trace(loss, params: list[torch.Tensor]) -> torch.Tensor:
    sizes, shapes = [p.numel() for p in params], [p.shape for p in params]
    flat = torch.cat([p.reshape(-1) for p in params])

    def f(v):
        return loss([t.reshape(s) for t, s in zip(v.split(sizes), shapes)])

    return torch.func.hessian(f)(flat).diagonal().sum()


@pytest.mark.parametrize("k", [2, 3])
def test_mlp_widening_preserves_the_function_and_the_trace_of_hessian_exactly(k):
    g = torch.Generator().manual_seed(0)
    dims = [3, 4, 5, 4]
    params = [torch.randn(dims[i + 1], dims[i], generator=g, dtype=torch.float64) for i in range(3)]
    params.append(torch.randn(dims[-1], generator=g, dtype=torch.float64))
    x = torch.randn(7, dims[0], generator=g, dtype=torch.float64)
    y = torch.randn(7, generator=g, dtype=torch.float64)
    wide = widen_mlp(params, k)
    torch.testing.assert_close(mlp_forward(wide, x), mlp_forward(params, x), atol=1e-12, rtol=1e-12)

    def loss(ps):
        return 0.5 * ((mlp_forward(ps, x) - y) ** 2).mean()

    small_trace, wide_trace = flat_hessian_trace(loss, params), flat_hessian_trace(loss, wide)
    # ReLU: every diagonal second derivative of f is 0, so Tr H = mean ||∇f||², and the
    # gradient of each of the m copies of a weight scaled by α is g/(α m) with α²m = 1
    assert small_trace > 0
    torch.testing.assert_close(wide_trace, small_trace, atol=0, rtol=1e-12)


# ----------------------------------------------------------------------------- transformer Hessian

VOCAB_H, PAD_H, MASK_H = 7, 4, 5
TOKENS_H = torch.tensor([[0, 1, 2, 3, 1], [2, 0, 3, PAD_H, PAD_H], [1, 1, 0, 2, PAD_H]])
MASKED_H = torch.zeros_like(TOKENS_H, dtype=torch.bool)
MASKED_H[0, 1] = MASKED_H[0, 3] = MASKED_H[1, 0] = MASKED_H[2, 2] = MASKED_H[2, 3] = True
INPUTS_H = TOKENS_H.masked_fill(MASKED_H, MASK_H)


def _flat(model):
    names = [n for n, _ in model.named_parameters()]
    params = [p.detach() for _, p in model.named_parameters()]
    sizes, shapes = [p.numel() for p in params], [p.shape for p in params]

    def unflatten(v):
        return dict(zip(names, (t.reshape(s) for t, s in zip(v.split(sizes), shapes))))

    return names, sizes, torch.cat([p.reshape(-1) for p in params]), unflatten


def per_group(names, sizes, diag) -> dict[str, float]:
    return {n: d.sum().item() for n, d in zip(names, diag.split(sizes))}


def hessian_diagonal(model) -> dict[str, float]:
    """Exact diagonal of the Hessian of the MLM loss (mean cross-entropy over the masked
    positions of the fixed batch), summed per parameter tensor."""
    names, sizes, flat, unflatten = _flat(model)

    def loss(v):
        logits = functional_call(model, unflatten(v), (INPUTS_H,))
        return F.cross_entropy(logits[MASKED_H], TOKENS_H[MASKED_H])

    def diag_entries(rows):
        return vmap(lambda e: jvp(grad(loss), (flat,), (e,))[1])(rows)

    out = torch.empty_like(flat)
    eye = torch.eye(flat.numel(), dtype=flat.dtype)
    with sdpa_kernel(SDPBackend.MATH):  # forward-mode AD needs the composite attention
        for s in range(0, flat.numel(), 512):
            rows = eye[s:s + 512]
            out[s:s + 512] = (diag_entries(rows) * rows).sum(1)
    return per_group(names, sizes, out)


def gauss_newton_diagonal(model) -> dict[str, float]:
    """Diagonal of Jᵀ H_logits J (Gauss–Newton; at a minimiser of the MLM loss it is the
    Hessian, Lemma 3.2), summed per parameter tensor."""
    names, sizes, flat, unflatten = _flat(model)

    def logits(v):
        return functional_call(model, unflatten(v), (INPUTS_H,))[MASKED_H]

    J = jacrev(logits)(flat)  # [N, V, n]
    p = torch.softmax(logits(flat), -1)[..., None]
    diag = ((p * J**2).sum(1) - (p * J).sum(1) ** 2).mean(0)
    return per_group(names, sizes, diag)


def gauss_newton_factor(name: str, k: int, c: int) -> float:
    """How the embedding changes a parameter tensor's Gauss–Newton trace: a large entry is
    one of m copies of a small one times α, its gradient is g/(αm), the group's trace
    changes by 1/(α²m)."""
    if name == "head.bias":
        return 1.0  # not replicated
    if name.startswith("head.norm"):
        return float(k)  # α = 1/k, m = k
    if name.endswith("mlp.up.weight"):
        return k / c  # α = 1/k, m = k·c
    if name.endswith("mlp.down.weight"):
        return c / k  # α = 1/c, m = k·c
    if name.endswith(("qkv.weight", "out.weight", "dense.weight")):
        return 1.0  # α = 1/k, m = k²
    return 1.0 / k  # embeddings, biases, LayerNorms: α = 1, m = k


def tiny_hessian_pair(norm: str, k: int = 2):
    cfg = TransformerConfig(vocab_size=VOCAB_H, max_len=6, d_model=4, n_heads=2, n_layers=1, d_inter=8,
                            pad_id=PAD_H, norm=norm, dropout=0.0, attn_dropout=0.0)
    small = perturbed(cfg, scale=0.5)
    return small, embed(small, k)


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_gauss_newton_trace_changes_by_the_replication_factors(norm):
    small, big = tiny_hessian_pair(norm)
    gs, gb = gauss_newton_diagonal(small), gauss_newton_diagonal(big)
    assert gs.keys() == gb.keys()
    for name in gs:
        assert gb[name] == pytest.approx(gauss_newton_factor(name, 2, 2) * gs[name], rel=1e-9, abs=1e-13), name
    # the total is not preserved: the embeddings, biases and LayerNorms lose a factor k
    assert sum(gb.values()) < sum(gs.values())


def test_full_hessian_trace_of_the_embedding():
    """The trace of the full Hessian is not preserved (second-derivative terms see the
    copies of a weight separately). It is exactly preserved × a known factor for the
    parameters whose copies reach the loss only through a block-averaging linear map:
    pre-LN LayerNorms (their output feeds (J/k)⊗W), the head's LayerNorm (×k, its output
    feeds the tied decoder) and the output bias (×1)."""
    small, big = tiny_hessian_pair("pre")
    hs, hb = hessian_diagonal(small), hessian_diagonal(big)
    total_s, total_b = sum(hs.values()), sum(hb.values())
    assert math.isfinite(total_s) and math.isfinite(total_b)
    for name in hs:
        if "norm" in name and not name.startswith("head"):
            assert hb[name] == pytest.approx(hs[name] / 2, rel=1e-9), name
    for name in ("head.norm.weight", "head.norm.bias"):
        assert hb[name] == pytest.approx(2 * hs[name], rel=1e-9)
    assert hb["head.bias"] == pytest.approx(hs["head.bias"], rel=1e-9)
    print(f"Tr H small {total_s:.6g}, embedded (k=2) {total_b:.6g}, ratio {total_b / total_s:.6g}")


# ----------------------------------------------------------------------------- checkpoints


def _small_checkpoint(tmp_path, size: str, kind: str = "transformer", norm: str = "post"):
    cfg = configlib.load(PretrainConfig, None, [f"model.size={size}", f"model.kind={kind}", f"model.norm={norm}",
                                                "device=cpu"])
    language = build_language(cfg)
    model = init_model(cfg, language)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    meta = {"config": configlib.to_dict(cfg), "eval": {"loss": 1.5}}
    return ckpt.save(tmp_path / f"small-{size}-{kind}", 7, model, {"step": 7}, meta), model.eval(), language


def _tokens(language, n: int = 8) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, language.pad_id, (n, language.max_len), generator=g)
    lengths = torch.randint(1, language.max_len + 1, (n,), generator=g)
    lengths[0] = language.max_len
    return tokens.masked_fill(torch.arange(language.max_len)[None] >= lengths[:, None], language.pad_id)


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_embed_checkpoint_into_a_named_size_round_trips(tmp_path, norm):
    path, small, language = _small_checkpoint(tmp_path, "t3-64", norm=norm)
    out = embed_checkpoint(path, tmp_path / "big", into="t3-128")
    assert out == tmp_path / "big" / "checkpoints" / "step_0000007"
    assert {p.name for p in out.iterdir()} == {"model.safetensors", "state.pt", "meta.json"}
    meta = json.loads((out / "meta.json").read_text())
    assert meta["step"] == 7 and meta["config"]["model"]["size"] == "t3-128"
    assert meta["eval"] == {"loss": 1.5}
    assert meta["embedded_from"]["width_factor"] == 2 and meta["embedded_from"]["extra_layers"] == 3
    big, _, cfg, _ = load_checkpoint(out)
    assert (big.config.d_model, big.config.n_layers, big.config.norm) == (128, 4, norm)
    tokens = _tokens(language)
    torch.testing.assert_close(big(tokens), small(tokens), atol=1e-5, rtol=1e-5)
    assert (tmp_path / "big" / "config.toml").exists()
    # the same shape asked for by factor and depth is recognised as the named size
    again = embed_checkpoint(path, tmp_path / "again", width_factor=2, extra_layers=3)
    assert json.loads((again / "meta.json").read_text())["config"]["model"]["size"] == "t3-128"


def test_embed_checkpoint_custom_shape_is_written_as_shape_overrides(tmp_path):
    path, small, language = _small_checkpoint(tmp_path, "t3-64", norm="pre")
    out = embed_checkpoint(path, tmp_path / "big", width_factor=3, extra_layers=1)
    model = json.loads((out / "meta.json").read_text())["config"]["model"]
    assert model["size"] == "t3-64" and model["norm"] == "pre"
    assert (model["d_model"], model["n_heads"], model["n_layers"], model["d_inter"]) == (192, 3, 2, 768)
    big, _, _, _ = load_checkpoint(out)
    assert (big.config.d_model, big.config.n_layers) == (192, 2)
    tokens = _tokens(language)
    torch.testing.assert_close(big(tokens), small(tokens), atol=1e-5, rtol=1e-5)
    # the written config.toml is the same config
    toml = configlib.load(PretrainConfig, tmp_path / "big" / "config.toml")
    assert toml == configlib.from_dict(PretrainConfig, json.loads((out / "meta.json").read_text())["config"])


def test_embed_checkpoint_refuses_what_cannot_hold_the_small_model(tmp_path):
    path, _, _ = _small_checkpoint(tmp_path, "t3-128")
    with pytest.raises(UserError, match="d_model 192 is not a multiple of 128"):
        embed_checkpoint(path, tmp_path / "x", into="t3-192")
    with pytest.raises(UserError, match="unknown transformer size 'huge'"):
        embed_checkpoint(path, tmp_path / "x", into="huge")
    with pytest.raises(UserError, match="contradicts"):
        embed_checkpoint(path, tmp_path / "x", into="t3-256", width_factor=3)
    with pytest.raises(UserError, match="contradicts"):
        embed_checkpoint(path, tmp_path / "x", into="t3-256", extra_layers=5)
    with pytest.raises(UserError, match="not a checkpoint"):
        embed_checkpoint(tmp_path, tmp_path / "x", width_factor=2)
    lstm, _, _ = _small_checkpoint(tmp_path, "micro", kind="lstm")
    with pytest.raises(UserError, match="only transformers"):
        embed_checkpoint(lstm, tmp_path / "x", width_factor=2)
    assert not (tmp_path / "x").exists()

    def shape(**fields):
        base = dict(vocab_size=27, max_len=8, pad_id=24, d_model=64, n_heads=1, n_layers=1, d_inter=256)
        return TransformerConfig(**{**base, **fields})

    with pytest.raises(UserError, match="needs 4 heads"):
        target_plan(shape(n_heads=2, d_model=64), "t3-128", None, 0)  # 2 heads of 32 cannot become 2 of 64
    with pytest.raises(UserError, match="fewer layers"):
        target_plan(shape(n_layers=5), "t3-128", None, 0)
    with pytest.raises(UserError, match="MLP is narrower"):
        target_plan(shape(d_inter=1024), "t3-128", None, 0)
    plan, name = target_plan(shape(), "bert-base", None, 0)  # an alias: 64 -> 768 is 12x
    assert (plan.width_factor, plan.extra_layers, plan.n_heads, name) == (12, 11, 12, "t3-768")
    assert dataclasses.asdict(plan)["d_inter"] == 3072


# ----------------------------------------------------------------------------- optimiser state


@pytest.mark.parametrize("norm", ["post", "pre"])
@pytest.mark.parametrize("k,extra,d_inter", [(2, 1, None), (3, 0, 24 * 3 + 5), (1, 2, None)])
def test_embedded_gradient_is_the_large_models_gradient(norm, k, extra, d_inter):
    """``embed_gradient`` maps the small model's loss gradient to exactly the large model's
    gradient at the embedded point (float64), so moments of gradients map with it."""
    from sameloss.models.embed import embed_gradient, embed_map, embed_second_moment

    tokens = padded_batch(6, 10, seed=3)
    targets = torch.randint(0, VOCAB, tokens.shape, generator=torch.Generator().manual_seed(4))
    small = perturbed(small_config(norm, True))
    rng = torch.get_rng_state()
    m = embed_map(small, k, extra, d_inter=d_inter)
    assert torch.equal(torch.get_rng_state(), rng)  # no global RNG draw
    big = embed(small, k, extra, d_inter=d_inter)

    def grads(model):
        model.zero_grad()
        F.cross_entropy(model(tokens).flatten(0, 1), targets.flatten()).backward()
        return {n: p.grad.clone() for n, p in model.named_parameters()}

    g_small, g_big = grads(small), grads(big)
    shapes = {n: p.shape for n, p in big.named_parameters()}
    mapped = embed_gradient(m, g_small, shapes)
    assert mapped.keys() == g_big.keys()
    scale = max(float(g.abs().max()) for g in g_big.values())
    copied = 0
    for n in g_big:
        has = (m.source[n] >= 0).reshape(g_big[n].shape)
        # entries with a source get their share of its gradient; the others (added blocks,
        # the post-LN LayerNorm whose affine part moved past them) are new: moments 0
        torch.testing.assert_close(mapped[n][has], g_big[n][has], atol=1e-10 * scale, rtol=1e-9, msg=n)
        assert (mapped[n][~has] == 0).all(), n
        copied += int(has.sum())
    assert copied >= sum(p.numel() for p in small.parameters()) * k  # every small entry has copies
    # squared gradients map to the squares of the mapped gradients
    sq = embed_second_moment(m, {n: g ** 2 for n, g in g_small.items()}, shapes)
    for n in g_big:
        torch.testing.assert_close(sq[n], mapped[n] ** 2, atol=1e-18, rtol=1e-9, msg=n)
    # the added blocks' entries have no source (post-LN: but the LayerNorm moved to the last)
    moved = f"blocks.{1 + extra}.mlp_norm." if norm == "post" else None
    for n, src in m.source.items():
        if n.startswith(tuple(f"blocks.{i}." for i in range(2, 2 + extra))):
            assert (src >= 0).all() if moved and n.startswith(moved) else (src < 0).all(), n


def test_embed_checkpoint_with_the_embedded_optimiser_continues_the_small_runs_moments(tmp_path):
    """``optimizer="embedded"``: the large checkpoint holds the small run's Adam moments
    mapped as gradients map (``exp_avg``) and as squared gradients (``exp_avg_sq``), its
    step count and RNG state; a fork from it starts at the small model's exact KL."""
    from sameloss.models.embed import embed_gradient, embed_map, embed_second_moment
    from sameloss.training import pretrain
    from sameloss.training.evaluate import make_evaluator

    over = ["steps=6", "batch_size=32", "model.size=micro", "eval.every=0", "eval.n_sentences=64",
            "optim.warmup_steps=2", "device=cpu", "language.name=hmm", "language.size=micro"]
    cfg = configlib.load(PretrainConfig, None, over)
    pretrain(cfg, tmp_path / "small", progress=False)
    small_ck = ckpt.checkpoint_dir(tmp_path / "small", 6)
    out = embed_checkpoint(small_ck, tmp_path / "big", width_factor=2, extra_layers=1, optimizer="embedded")
    small, language, _, _ = load_checkpoint(small_ck)
    big, _, big_cfg, _ = load_checkpoint(out)
    s_state, b_state = ckpt.load_state(small_ck), ckpt.load_state(out)
    assert torch.equal(s_state["rng"], b_state["rng"])
    small_names = [n for n, _ in small.named_parameters()]
    big_names = [n for n, _ in big.named_parameters()]
    # AdamW's state dict is keyed by position in the parameter groups (matrices first)
    def by_name(model, names, opt_state):
        order = [n for n, p in model.named_parameters() if p.dim() >= 2] + \
                [n for n, p in model.named_parameters() if p.dim() < 2]
        return {order[i]: st for i, st in opt_state["state"].items()}
    s_mom, b_mom = by_name(small, small_names, s_state["optimizer"]), by_name(big, big_names, b_state["optimizer"])
    m = embed_map(small, 2, 1)
    shapes = {n: p.shape for n, p in big.named_parameters()}
    want_m = embed_gradient(m, {n: s_mom[n]["exp_avg"] for n in small_names}, shapes)
    want_v = embed_second_moment(m, {n: s_mom[n]["exp_avg_sq"] for n in small_names}, shapes)
    for n in big_names:
        torch.testing.assert_close(b_mom[n]["exp_avg"], want_m[n].float(), msg=n)
        torch.testing.assert_close(b_mom[n]["exp_avg_sq"], want_v[n].float(), msg=n)
        assert float(b_mom[n]["step"]) == 6.0
    assert any(float(b_mom[n]["exp_avg"].abs().sum()) > 0 for n in big_names)
    # the same function: the same exact KL
    ev = make_evaluator(language, 64, 0.15, 1_000_003, 2)
    assert abs(ev.evaluate(big, "cpu")["kl"] - ev.evaluate(small, "cpu")["kl"]) < 1e-6
    # a fork continues from it with the loaded moments (the step count goes on)
    fork = configlib.load(PretrainConfig, None, [*over, "steps=8", f'init_from="{out}"',
                                                 *(f"model.{k}={v}" for k, v in
                                                   (("d_model", big.config.d_model), ("n_heads", big.config.n_heads),
                                                    ("n_layers", big.config.n_layers),
                                                    ("d_inter", big.config.d_inter)))])
    pretrain(fork, tmp_path / "fork", progress=False)
    end = ckpt.load_state(ckpt.checkpoint_dir(tmp_path / "fork", 8))
    assert float(next(iter(end["optimizer"]["state"].values()))["step"]) == 8.0
    with pytest.raises(UserError, match="optimizer must be"):
        embed_checkpoint(small_ck, tmp_path / "x", width_factor=2, optimizer="adam")
