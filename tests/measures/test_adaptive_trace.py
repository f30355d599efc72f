"""The guards against a trace lowered by rescaling alone (issue 58, item 3): the adaptive
trace ``tr(T F T)``, ``T = diag(|θ|)`` (``measures.curvature.adaptive``) and the weight norms
(``measures/builtin/rescaling.py``).

The adaptive trace is checked against the full Fisher matrix of a model small enough to form
it (float64, every context's Jacobian by ``torch.autograd.functional.jacobian``, independent
of the estimator's machinery); it draws the Fisher trace's contexts and labels; and under
exact function-preserving rescalings of a transformer (queries × a, keys / a; values × a,
the output projection / a; a pre-LN LayerNorm × a, the layer it feeds / a) the plain
trace moves while the adaptive trace stays to float64 rounding.
"""

from __future__ import annotations

import copy
import json

import pytest
import torch
from torch.func import functional_call
from torch.nn.attention import SDPBackend, sdpa_kernel

from sameloss.cli import main
from sameloss.errors import UserError
from sameloss.experiments.engine import plan as planner
from sameloss.languages import make_language
from sameloss.measures.builtin.rescaling import weight_norms
from sameloss.measures.curvature import FisherContexts, sample_contexts, trace_fisher
from sameloss.measures.curvature.adaptive import adaptive_trace
from sameloss.measures.curvature.memory import StorageTracker, peak_bytes, stand_in_batch
from sameloss.measures.run import measure_model
from sameloss.measures.spec import MEASURES, MeasureSpec
from sameloss.models import LSTMConfig, LSTMMLM, TransformerConfig, TransformerMLM, transformer_config
from sameloss.training.runio import load_checkpoint


@pytest.fixture(scope="module")
def language():
    return make_language("pcfg", "tiny")  # variable lengths: padding is exercised


def micro(language, n_layers=1, **kw):
    torch.manual_seed(0)
    cfg = TransformerConfig(vocab_size=language.vocab_size, max_len=language.max_len, d_model=4, n_heads=2,
                            n_layers=n_layers, d_inter=8, pad_id=language.pad_id, init_std=0.5, **kw)
    model = TransformerMLM(cfg).double().eval()
    with torch.no_grad():  # biases and LayerNorms off their initial 0 and 1: every entry of T generic
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return model


@pytest.fixture(scope="module")
def model(language):
    return micro(language)


@pytest.fixture(scope="module")
def contexts(language):
    return sample_contexts(language, 24, seed=3)


def block_of(name: str) -> str:
    """The blocks of the one-layer model, written out by hand."""
    if name.split(".")[0] in ("tok_emb", "pos_emb", "emb_norm"):
        return "embedding"
    return "layer0" if name.startswith("blocks.0.") else "head"


def enumerated_fisher(model, contexts):
    """``(F, θ, names, sizes)``: the Fisher matrix ``mean_i Σ_y f_y J_y J_yᵀ`` over the
    contexts, every label enumerated, from the full Jacobian of the log-probabilities at the
    masked positions."""
    named = dict(model.named_parameters())
    names = list(named)
    shapes, sizes = [named[n].shape for n in names], [named[n].numel() for n in names]

    def log_probs(flat):
        values = {n: x.view(s) for n, x, s in zip(names, flat.split(sizes), shapes)}
        return torch.log_softmax(functional_call(model, values, (contexts.inputs,))[contexts.masked], dim=-1)

    theta = torch.cat([named[n].detach().reshape(-1) for n in names])
    with sdpa_kernel(SDPBackend.MATH):
        J = torch.autograd.functional.jacobian(log_probs, theta)  # [n, V, P]
        f = log_probs(theta).exp()
    F = torch.einsum("nvp,nv,nvq->pq", J, f, J) / J.shape[0]
    return F, theta, names, sizes


def test_the_adaptive_trace_is_tr_TFT_of_the_enumerated_fisher(model, language, contexts):
    F, theta, names, sizes = enumerated_fisher(model, contexts)
    T = torch.diag(theta.abs())
    TFT = T @ F @ T
    exact = float(TFT.trace())
    # the matrix is the one the paper's estimator averages: its trace is trace_fisher's
    plain = trace_fisher(model, language, FisherContexts(batch=contexts), n_labels=None)
    assert plain.estimate == pytest.approx(float(F.trace()), rel=1e-10)
    assert abs(exact - plain.estimate) > 0.2 * plain.estimate  # a different quantity here
    owner = [block_of(n) for n, s in zip(names, sizes) for _ in range(s)]
    per_block = {b: float(sum(TFT[i, i] for i, o in enumerate(owner) if o == b)) for b in ("embedding", "layer0",
                                                                                         "head")}
    for engine, hooks in (("func", True), ("func", False), ("autograd", False)):
        r = adaptive_trace(model, language, FisherContexts(batch=contexts, engine=engine, hooks=hooks),
                           n_labels=None, by_block=True)
        assert r.measure == "adaptive_trace" and r.n_params == theta.numel()
        assert r.settings["engine"] == engine and r.settings["hooks"] == hooks
        assert r.estimate == pytest.approx(exact, rel=1e-10), engine
        assert list(r.extra["blocks"]) == list(per_block)
        for b, value in r.extra["blocks"].items():
            assert value["estimate"] == pytest.approx(per_block[b], rel=1e-10), (engine, hooks, b)
    # chunks of one context and blocks of five contexts: the same value
    small = adaptive_trace(model, language, FisherContexts(batch=contexts, max_chunk_bytes=1, block_size=5),
                           n_labels=None)
    assert small.estimate == pytest.approx(exact, rel=1e-12)
    # a selection: T and F restricted to it
    chosen = torch.tensor([("attn" in n or "norm" in n) for n, s in zip(names, sizes) for _ in range(s)])
    sub = adaptive_trace(model, language, FisherContexts(params=r"attn|norm", batch=contexts), n_labels=None)
    assert sub.estimate == pytest.approx(float(TFT.diagonal()[chosen].sum()), rel=1e-10)
    assert sub.n_params == int(chosen.sum())
    # labels drawn from the model: unbiased for the same matrix
    sampled = adaptive_trace(model, language, FisherContexts(batch=contexts), n_labels=50)
    assert abs(sampled.estimate - exact) < 4 * sampled.stderr


@pytest.mark.parametrize("kw", [{}, {"norm": "pre"}, {"mlm_head_transform": False}],
                         ids=["post", "pre", "no-transform"])
@pytest.mark.parametrize("params", [None, r"tok_emb", r"pos_emb|head\.bias", r"norm", r"qkv\.bias|mlp\.down",
                                    r"^head\.bias$"])
def test_the_batched_path_is_the_per_example_one_on_every_parameter_kind(language, kw, params):
    """The hooked batched passes (``_ScaledHookedBlock``: every parameter kind's closed form)
    against per-example autograd and ``vmap``, on two layers and any selection (the output
    bias alone differentiates no module)."""
    model = micro(language, n_layers=2, **kw)
    ctx = sample_contexts(language, 6, seed=1)
    values = {}
    for engine, hooks in (("func", True), ("func", False), ("autograd", False)):
        r = adaptive_trace(model, language, FisherContexts(params=params, batch=ctx, engine=engine, hooks=hooks),
                           n_labels=None, by_block=True)
        assert r.settings["hooks"] == hooks
        values[engine, hooks] = [r.estimate, *(b["estimate"] for b in r.extra["blocks"].values())]
    assert values["func", True] == pytest.approx(values["autograd", False], rel=1e-10)
    assert values["func", False] == pytest.approx(values["autograd", False], rel=1e-10)
    assert values["func", True][0] > 0


def test_it_draws_the_fisher_traces_contexts_and_labels(model, language):
    """With ``T = I`` the estimator is the Fisher trace, draw for draw (trace_fisher's own
    path here is the hooked one); with ``T = |θ|`` it takes the same gradients."""
    c = FisherContexts(n_contexts=20, seed=4)
    fisher = trace_fisher(model, language, c, n_labels=3, repeats=2)
    ones = adaptive_trace(model, language, c, n_labels=3, repeats=2, scale=torch.ones_like)
    assert fisher.settings["hooks"]
    assert ones.estimate == pytest.approx(fisher.estimate, rel=1e-12)
    assert ones.extra["repeat_estimates"] == pytest.approx(fisher.extra["repeat_estimates"], rel=1e-12)
    adaptive = adaptive_trace(model, language, c, n_labels=3, repeats=2)
    assert adaptive.extra["n_gradients"] == ones.extra["n_gradients"] == fisher.extra["n_gradients"]
    assert adaptive.n_samples == 40 and adaptive.extra["repeat_std"] > 0
    assert adaptive_trace(model, language, c, n_labels=3, repeats=2).estimate == adaptive.estimate  # seeded
    with pytest.raises(UserError, match="n_labels must be >= 1"):
        adaptive_trace(model, language, c, n_labels=0)


def rescaled(model, kind: str, a: torch.Tensor):
    """A copy of the one-layer ``model`` with a diagonal rescaling by ``a`` (one factor per
    channel, ``d_model`` of them) that leaves its function unchanged."""
    other = copy.deepcopy(model)
    d = model.config.d_model
    block = other.blocks[0]
    with torch.no_grad():
        qkv = block.attn.qkv
        if kind == "queries-keys":  # every head's scores q·k: q_j × a_j, k_j / a_j
            qkv.weight[:d] *= a[:, None]
            qkv.bias[:d] *= a
            qkv.weight[d:2 * d] /= a[:, None]
            qkv.bias[d:2 * d] /= a
        elif kind == "values-output":  # out(Σ p v): v_j × a_j, out's column j / a_j
            qkv.weight[2 * d:] *= a[:, None]
            qkv.bias[2 * d:] *= a
            block.attn.out.weight /= a[None, :]
        else:  # pre-LN: W(γ ⊙ x̂ + β) with γ, β × a and W's columns / a
            for norm, linear in ((block.attn_norm, qkv), (block.mlp_norm, block.mlp.up)):
                norm.weight *= a
                norm.bias *= a
                linear.weight /= a[None, :]
    return other


@pytest.mark.parametrize("kind, norm, rescaled_params", [("queries-keys", "post", r"attn\.qkv"),
                                                         ("values-output", "post", r"attn\.(qkv|out)"),
                                                         ("norm-linear", "pre", r"norm|qkv|mlp\.up")])
def test_a_function_preserving_rescaling_moves_the_trace_but_not_the_adaptive_trace(language, contexts, kind, norm,
                                                                                    rescaled_params):
    model = micro(language, norm=norm)
    a = torch.tensor([0.25, 0.5, 2.0, 4.0], dtype=torch.float64)  # some channels up, some down
    other = rescaled(model, kind, a)
    with sdpa_kernel(SDPBackend.MATH), torch.no_grad():
        before, after = model(contexts.inputs), other(contexts.inputs)
    assert float((after - before).abs().max()) < 1e-12 * float(before.abs().max())  # the same function
    assert sum(float((p - q).abs().max()) for p, q in zip(model.state_dict().values(),
                                                          other.state_dict().values())) > 0.5  # not a no-op
    for params in (None, rescaled_params):  # all parameters, and the rescaled ones
        given = FisherContexts(params=params, batch=contexts)
        plain = [trace_fisher(m, language, given, n_labels=None).estimate for m in (model, other)]
        adaptive = [adaptive_trace(m, language, given, n_labels=None, by_block=True) for m in (model, other)]
        assert adaptive[1].estimate == pytest.approx(adaptive[0].estimate, rel=1e-10), (kind, params)
        for block, value in adaptive[0].extra["blocks"].items():
            assert adaptive[1].extra["blocks"][block]["estimate"] == pytest.approx(value["estimate"], rel=1e-10)
        if params is None:
            assert abs(plain[1] / plain[0] - 1) > 0.05, kind  # the trace moved: 1.10x, 1.34x, 1.50x
        else:
            assert abs(plain[1] / plain[0] - 1) > 0.5, kind  # on the rescaled weights: 1.61x, 2.12x, 2.39x
    # and at the study's setting: sampled contexts, labels drawn from the (same) model
    sampled = FisherContexts(n_contexts=32, seed=1)
    drawn = [adaptive_trace(m, language, sampled, n_labels=4, repeats=2) for m in (model, other)]
    assert drawn[1].estimate == pytest.approx(drawn[0].estimate, rel=1e-10)
    assert drawn[1].extra["n_gradients"] == drawn[0].extra["n_gradients"]


def test_an_lstm_is_measured_by_torch_func_and_autograd_alike(language, contexts):
    torch.manual_seed(0)
    lstm = LSTMMLM(LSTMConfig(vocab_size=language.vocab_size, max_len=language.max_len, d_model=4, d_hidden=3,
                              n_layers=1, pad_id=language.pad_id)).double().eval()
    ctx = sample_contexts(language, 4, seed=2)
    func = adaptive_trace(lstm, language, FisherContexts(batch=ctx), n_labels=None)
    loop = adaptive_trace(lstm, language, FisherContexts(batch=ctx, engine="autograd"), n_labels=None)
    assert func.settings["engine"] == "func" and func.estimate > 0
    assert loop.estimate == pytest.approx(func.estimate, rel=1e-10)


def test_weight_norms_are_sums_over_the_parameters(language):
    model = micro(language, norm="pre")  # a final LayerNorm in the head
    named = dict(model.named_parameters())  # the tied decoder once
    squares = {n: float(p.detach().square().sum()) for n, p in named.items()}
    row = weight_norms(model, by_block=True)
    assert row["weight_norm_sq"] == pytest.approx(sum(squares.values()), rel=1e-14)
    layer_norms = [n for n in named if n.rsplit(".", 1)[0].endswith(("attn_norm", "mlp_norm", "final_norm",
                                                                     "head.norm"))]
    assert len(layer_norms) == 8
    assert row["weight_norm_sq_layernorm"] == pytest.approx(sum(squares[n] for n in layer_norms), rel=1e-14)
    for block in ("embedding", "layer0", "head"):
        assert row[f"weight_norm_sq_{block}"] == pytest.approx(sum(s for n, s in squares.items()
                                                                   if block_of(n) == block), rel=1e-14)
    assert set(weight_norms(model)) == {"weight_norm_sq", "weight_norm_sq_layernorm"}
    sub = weight_norms(model, r"^blocks\.")
    assert sub["weight_norm_sq"] == pytest.approx(sum(s for n, s in squares.items() if n.startswith("blocks.")))
    # a function-preserving rescaling shows in the norms (what moved the trace)
    a = torch.full((model.config.d_model,), 2.0, dtype=torch.float64)
    scaled = sum(squares[n] for n in layer_norms if n.startswith("blocks.0."))  # attn_norm, mlp_norm
    assert weight_norms(rescaled(model, "norm-linear", a))["weight_norm_sq_layernorm"] == \
        pytest.approx(row["weight_norm_sq_layernorm"] + 3 * scaled, rel=1e-14)


def test_the_meta_estimate_is_the_peak_of_a_real_run():
    config = transformer_config("micro", 27, 8, dropout=0.0, attn_dropout=0.0)
    torch.manual_seed(0)
    model = TransformerMLM(config).eval()
    batch = stand_in_batch(config, 48)
    batch.inputs.random_(0, 24)
    for hooks in (True, False):  # every label of the vocabulary: the estimate's worst case
        with StorageTracker("cpu") as real:
            adaptive_trace(model, None, FisherContexts(batch=batch, block_size=48, hooks=hooks), n_labels=None)
        estimate = peak_bytes("adaptive_trace", config, {"n_labels": None, "block_size": 48, "hooks": hooks})
        assert estimate.parts["working"] == pytest.approx(real.peak, rel=0.05), (hooks, estimate, real.peak)
    # vmap: per-example gradients of every parameter, in chunks of about max_chunk_bytes
    small = peak_bytes("adaptive_trace", config, {"n_labels": None, "block_size": 48, "max_chunk_bytes": 2**18,
                                                  "hooks": False})
    assert small.bytes < estimate.bytes / 4


def test_sameloss_measure_and_the_spec_ask_for_both(checkpoint, capsys):
    assert main(["measure", str(checkpoint), "--trace", "fisher", "--adaptive-trace", "--weight-norms",
                 "--trace-by", "block", "--contexts", "12", "--labels", "3", "--json", "--no-progress"]) == 0
    row, = json.loads(capsys.readouterr().out)
    model, language, cfg, _ = load_checkpoint(checkpoint)
    assert row["weight_norm_sq"] == pytest.approx(sum(float(p.detach().double().square().sum())
                                                      for p in model.parameters()), rel=1e-12)
    for prefix in ("adaptive_trace", "weight_norm_sq"):
        blocks = {b: row[f"{prefix}_{b}"] for b in ("embedding", "layer0", "head")}
        assert sum(blocks.values()) == pytest.approx(row[prefix], rel=1e-9), prefix
    assert row["adaptive_trace"] > 0 and row["adaptive_trace_se"] > 0 and row["trace_fisher"] > 0
    # from Python: the spec's extra, the columns it declares, the same draws as the Fisher trace
    spec = MeasureSpec(traces=("fisher",), n_contexts=12, n_labels=3, repeats=2,
                       extra={"adaptive_trace": {}, "weight_norms": {}})
    got = measure_model(model, language, cfg, spec)
    mine = [c for m in ("weight_norms", "adaptive_trace") for c in MEASURES[m].columns(spec)]
    assert [c for c in got if c.startswith(("adaptive", "weight"))] == mine
    direct = adaptive_trace(model, language, FisherContexts(n_contexts=12), n_labels=3, repeats=2)
    assert got["adaptive_trace"] == direct.estimate
    # alone, and split by block without a --trace
    MeasureSpec(extra={"weight_norms": {}}, trace_by="block")
    with pytest.raises(UserError, match="adaptive_trace takes no settings of its own"):
        MeasureSpec(extra={"adaptive_trace": {"n_labels": 3}})
    with pytest.raises(UserError, match="weight_norms: its settings must be a dict"):
        MeasureSpec(extra={"weight_norms": True})
    # planned: FLOPs in the trace stage, the peak from the meta run
    shape = planner.model_shape(cfg, {})
    flops = planner.measure_flops(MeasureSpec(extra={"adaptive_trace": {}}, n_contexts=12, n_labels=3, repeats=2),
                                  shape)
    assert flops["trace"] == 24 * shape.sentence_flops * (1 + 2 * 3)
    peaks = planner.measure_peaks(cfg, shape, spec)
    assert peaks["adaptive trace"] == peak_bytes("adaptive_trace", planner._meta_config(cfg, shape),
                                                 {"n_labels": 3}).bytes
