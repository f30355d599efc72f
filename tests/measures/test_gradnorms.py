"""Per-example squared gradient norms from hooks (``models.gradnorms``): the same numbers as
the ``vmap`` path and as per-example autograd, on every parameter kind of the transformer
(post- and pre-LN, with and without the head transform, any selection, by block); the
fallback to ``vmap`` where the hooks have no rule (the LSTM, a subclass, an extra
parameter); never a silent wrong number (a module run twice); differentiable again."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch import nn

from sameloss.languages import make_language
from sameloss.measures.curvature import FisherContexts, sample_contexts, trace_fisher
from sameloss.models.derivatives import composite_layer_norms, measuring, select_parameters
from sameloss.models.label_gradients import fisher_label_values, ghost_linears
from sameloss.models import LSTMConfig, LSTMMLM, TransformerConfig, TransformerMLM, gradnorms


@pytest.fixture(scope="module")
def language():
    return make_language("pcfg", "tiny")  # variable lengths: padding is exercised


def micro(language, **kw):
    torch.manual_seed(0)
    cfg = TransformerConfig(vocab_size=language.vocab_size, max_len=language.max_len, d_model=4, n_heads=1,
                            n_layers=2, d_inter=8, pad_id=language.pad_id, init_std=0.5, **kw)
    return TransformerMLM(cfg).double().eval()


def per_example_autograd(model, tokens, positions, labels, names):
    """``‖∇ log f_y‖²`` per (context, label) over ``names`` by one backward each."""
    named = dict(model.named_parameters())
    params = [named[n] for n in names]
    out = torch.zeros(labels.shape, dtype=torch.float64)
    with measuring(model):
        for i in range(tokens.shape[0]):
            logp = torch.log_softmax(model(tokens[i:i + 1])[0, positions[i]], -1)
            for j, y in enumerate(labels[i].tolist()):
                grads = torch.autograd.grad(logp[y], params, retain_graph=True, allow_unused=True)
                out[i, j] = sum(float(g.square().sum()) for g in grads if g is not None)
    return out


@pytest.mark.parametrize("kw", [{}, {"norm": "pre"}, {"mlm_head_transform": False}],
                         ids=["post", "pre", "no-transform"])
@pytest.mark.parametrize("params", [None, r"tok_emb", r"pos_emb|head\.bias", r"norm", r"qkv\.bias|mlp\.down"])
def test_hook_norms_are_per_example_autograd_norms(language, kw, params):
    model = micro(language, **kw)
    ctx = sample_contexts(language, 6, seed=1)
    positions = ctx.masked.long().argmax(dim=1)
    labels = torch.randint(0, language.vocab_size, (6, 3), generator=torch.Generator().manual_seed(2))
    labels[:, 2] = ctx.inputs[:, 0]  # a label that is also an input token: the tied table's cross term
    names = gradnorms.parameter_names(model, params)
    with measuring(model):
        squares, log_probs = gradnorms.fisher_squares(model, ctx.inputs, positions, labels, params)
        expected_logp = torch.log_softmax(model(ctx.inputs)[torch.arange(6), positions], -1).gather(1, labels)
    assert torch.allclose(squares, per_example_autograd(model, ctx.inputs, positions, labels, names), rtol=1e-10,
                          atol=0)
    assert torch.allclose(log_probs, expected_logp, rtol=1e-12, atol=0)


def test_the_trace_by_hooks_is_the_vmap_trace_by_block_and_selection(language):
    model = micro(language)
    ctx = sample_contexts(language, 20, seed=3)
    for kw, on in (({"n_labels": 7}, {}), ({"n_labels": None}, {}), ({"n_labels": 5, "by_block": True}, {}),
                   ({"n_labels": 5}, {"params": r"blocks\.1|head"}), ({"n_labels": 3}, {"max_chunk_bytes": 1})):
        new = trace_fisher(model, language, FisherContexts(batch=ctx, **on), **kw)
        old = trace_fisher(model, language, FisherContexts(batch=ctx, hooks=False, **on), **kw)
        assert new.settings["hooks"] and not old.settings["hooks"]
        assert new.estimate == pytest.approx(old.estimate, rel=1e-10), (kw, on)
        assert new.stderr == pytest.approx(old.stderr, rel=1e-8), (kw, on)
        assert new.extra["n_gradients"] == old.extra["n_gradients"]  # the same labels drawn
        for block, value in old.extra.get("blocks", {}).items():
            assert new.extra["blocks"][block]["estimate"] == pytest.approx(value["estimate"], rel=1e-10)


def test_float32_tiny_model_within_1e_6_relative_with_the_same_labels(language):
    torch.manual_seed(1)
    cfg = TransformerConfig(vocab_size=language.vocab_size, max_len=language.max_len, d_model=64, n_heads=4,
                            n_layers=2, d_inter=256, pad_id=language.pad_id)
    model = TransformerMLM(cfg)
    contexts = FisherContexts(n_contexts=300, seed=4, block_size=128)
    for kw, on in (({"repeats": 2}, contexts), ({"by_block": True}, contexts), ({}, replace(contexts, params="emb"))):
        new = trace_fisher(model, language, on, n_labels=4, **kw)
        old = trace_fisher(model, language, replace(on, hooks=False), n_labels=4, **kw)
        assert new.settings["hooks"] and new.extra["n_gradients"] == old.extra["n_gradients"]
        assert new.estimate == pytest.approx(old.estimate, rel=1e-6), (kw, on)
        for block, value in old.extra.get("blocks", {}).items():
            assert new.extra["blocks"][block]["estimate"] == pytest.approx(value["estimate"], rel=1e-6)


def test_models_without_rules_fall_back_to_vmap(language):
    torch.manual_seed(0)
    lstm = LSTMMLM(LSTMConfig(vocab_size=language.vocab_size, max_len=language.max_len, d_model=4, d_hidden=3,
                              n_layers=1, pad_id=language.pad_id)).double().eval()
    ctx = sample_contexts(language, 5, seed=2)
    assert not gradnorms.covers(lstm, gradnorms.parameter_names(lstm, None))
    r = trace_fisher(lstm, language, FisherContexts(batch=ctx), n_labels=3)
    assert not r.settings["hooks"] and r.settings["engine"] == "func"
    autograd = trace_fisher(lstm, language, FisherContexts(batch=ctx, engine="autograd"), n_labels=3)
    assert r.estimate == pytest.approx(autograd.estimate, rel=1e-10)
    with pytest.raises(gradnorms.NotCovered):
        gradnorms.fisher_squares(lstm, ctx.inputs, ctx.masked.long().argmax(1), torch.zeros(5, 1, dtype=torch.long))

    class Scaled(TransformerMLM):  # a subclass may compute something else: no rules
        def forward(self, tokens):
            return 2 * super().forward(tokens)

    model = micro(language)
    scaled = Scaled(model.config).double().eval()
    scaled.load_state_dict(model.state_dict())
    assert not gradnorms.covers(scaled, gradnorms.parameter_names(scaled, None))
    r = trace_fisher(scaled, language, FisherContexts(batch=ctx), n_labels=3)
    assert not r.settings["hooks"]
    # a parameter without a rule: the whole selection falls back; a selection without it does not
    extra = micro(language)
    extra.blocks[0].mlp.register_parameter("gain", nn.Parameter(torch.ones(1, dtype=torch.float64)))
    assert not trace_fisher(extra, language, FisherContexts(batch=ctx), n_labels=3).settings["hooks"]
    assert trace_fisher(extra, language, FisherContexts(params="attn", batch=ctx), n_labels=3).settings["hooks"]


def test_a_module_run_twice_is_an_error_not_a_wrong_number(language):
    model = micro(language)
    ctx = sample_contexts(language, 3, seed=2)
    again = model.blocks[0].mlp.up
    handle = model.blocks[0].mlp.register_forward_hook(lambda mod, args, out: out + 0 * again(args[0]).sum())
    try:
        with pytest.raises(RuntimeError, match="ran twice"):
            gradnorms.fisher_squares(model, ctx.inputs, ctx.masked.long().argmax(1),
                                     torch.zeros(3, 1, dtype=torch.long))
    finally:
        handle.remove()


def test_the_hook_norms_differentiate_as_the_vmap_ones(language):
    """``create_graph=True``: the gradient (double backward) of a weighted sum of squared
    norms and log-probabilities equals the ``vmap`` path's (``training.objectives.flatness``'s)."""
    model = micro(language)
    ctx = sample_contexts(language, 5, seed=4)
    positions = ctx.masked.long().argmax(dim=1)
    labels = torch.randint(0, language.vocab_size, (5, 2), generator=torch.Generator().manual_seed(5))
    weights = torch.rand(5, 2, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    params = list(model.parameters())
    with measuring(model), composite_layer_norms(model):
        sel = select_parameters(model, "blocks|head", live=True)
        sq, lp = fisher_label_values(model, sel, ctx.inputs, positions, labels,
                                     ghost_linears(model, sel, ctx.inputs[:1]), _whole(sel))
        old = torch.autograd.grad((weights * sq[..., 0]).sum() + lp.sum(), params)
        sq2, lp2 = gradnorms.fisher_squares(model, ctx.inputs, positions, labels, "blocks|head", create_graph=True)
        new = torch.autograd.grad((weights * sq2).sum() + lp2.sum(), params)
    assert torch.allclose(sq2, sq[..., 0], rtol=1e-10, atol=0)
    scale = max(float(g.abs().max()) for g in old)
    for a, b in zip(new, old):
        assert torch.allclose(a, b, rtol=1e-8, atol=1e-12 * scale)
    assert max(float(g.abs().max()) for g in new) > 1e-3


def _whole(sel):
    from sameloss.models.derivatives import Blocks

    return Blocks.whole(sel.sizes)


def test_every_single_parameter_gives_the_vmap_value(language):
    """Issue 63 (item 8): ``params=r"head\\.bias"`` (a selection with no module to
    differentiate by: the output bias's norm is the cotangent's) crashed in
    ``gradnorms`` (``grad()`` with no inputs) where ``hooks=False`` returned its value.
    Every parameter alone, of every model variant, gives the value of the unhooked path."""
    import re

    ctx = sample_contexts(language, 6, seed=4)
    for kw in ({}, {"norm": "pre"}, {"mlm_head_transform": False}):
        model = micro(language, **kw)
        for name in gradnorms.parameter_names(model, None):
            on = {"batch": ctx, "params": f"^{re.escape(name)}$"}
            new = trace_fisher(model, language, FisherContexts(**on), n_labels=3)
            old = trace_fisher(model, language, FisherContexts(hooks=False, **on), n_labels=3)
            assert new.settings["hooks"] and new.estimate == pytest.approx(old.estimate, rel=1e-10), (kw, name)
