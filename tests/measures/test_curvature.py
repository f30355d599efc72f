"""Curvature measures against exact Hessians of models small enough to form them (float64).

The transformer here has a few hundred parameters, so the full Hessian of a fixed-batch
loss, and the full Jacobian of every context's log-probabilities, are computed directly
(``torch.func.hessian`` / ``jacrev``, independently of the module's own machinery) and
each estimator is checked against the exact value of the quantity it estimates.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, jacrev
from torch.nn.attention import SDPBackend, sdpa_kernel

from sameloss.errors import UserError
from sameloss.languages import make_language
from sameloss.languages.base import Batch, Language
from sameloss.measures.curvature import (
    Difference,
    FisherContexts,
    FixedBatch,
    LossGaussNewton,
    LossHessian,
    MatrixOperator,
    hutchinson_trace,
    lanczos_top_eigenvalue,
    loss_batch,
    map_in_chunks,
    sam_sharpness,
    sample_contexts,
    select_parameters,
    top_eigenvalue,
    trace_fisher,
    trace_hutchinson,
)
from sameloss.models import LSTMConfig, LSTMMLM, TransformerConfig, TransformerMLM


# ---- fixtures -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def language():
    return make_language("pcfg", "tiny")  # 24 words, variable lengths (padding is exercised)


@pytest.fixture(scope="module")
def model(language):
    torch.manual_seed(0)
    cfg = TransformerConfig(vocab_size=language.vocab_size, max_len=language.max_len, d_model=4, n_heads=1,
                            n_layers=1, d_inter=8, pad_id=language.pad_id, dropout=0.1, attn_dropout=0.1,
                            init_std=0.5)
    m = TransformerMLM(cfg).double()
    m.eval()
    return m


@pytest.fixture(scope="module")
def batch(language):
    return loss_batch(language, n_sentences=32, mask_rate=0.15, seed=1)


def flat_loss(model, batch, names=None):
    """``(f, θ₀)``: the fixed-batch loss as a function of the flattened parameters
    ``names`` (default: all), written independently of the module under test."""
    named = dict(model.named_parameters())
    names = list(named) if names is None else names
    shapes = [named[n].shape for n in names]
    sizes = [named[n].numel() for n in names]
    fixed = {n: p.detach() for n, p in named.items() if n not in names}

    def f(flat):
        values = {n: x.view(s) for n, x, s in zip(names, flat.split(sizes), shapes)}
        out = functional_call(model, {**fixed, **values}, (batch.inputs,))
        return F.cross_entropy(out[batch.masked], batch.targets[batch.masked])

    return f, torch.cat([named[n].detach().reshape(-1) for n in names])


def exact_hessian_of(f, theta):
    """The Hessian by reverse-over-reverse autograd. Not ``torch.func.hessian``: on torch
    2.13 it returns a wrong, asymmetric Hessian for LayerNorm gains (the rows and columns
    of ``F.layer_norm``'s weight; checked against finite differences)."""
    return torch.autograd.functional.hessian(f, theta, vectorize=True)


@pytest.fixture(scope="module")
def exact_hessian(model, batch):
    f, theta = flat_loss(model, batch)
    with sdpa_kernel(SDPBackend.MATH):
        H = exact_hessian_of(f, theta)
    assert float((H - H.T).abs().max()) < 1e-10
    return H


# ---- Hutchinson -------------------------------------------------------------------------------
def test_hutchinson_matches_the_exact_trace(model, language, batch, exact_hessian):
    H = exact_hessian
    trace = float(H.trace())
    off = H - torch.diag(H.diagonal())
    results = {}
    for dist, per_probe_var in (("rademacher", 2 * float(off.square().sum())),
                                ("gaussian", 2 * float(H.square().sum()))):
        r = trace_hutchinson(model, language, FixedBatch(batch=batch), n_probes=300, distribution=dist, probe_chunk=100)
        assert r.n_params == H.shape[0]
        assert abs(r.estimate - trace) < 4 * r.stderr, (dist, r.estimate, trace, r.stderr)
        # the reported standard error is the theoretical one, sqrt(Var(vᵀHv) / n)
        assert 0.7 < r.stderr / math.sqrt(per_probe_var / 300) < 1.4, dist
        results[dist] = r
    few = trace_hutchinson(model, language, FixedBatch(batch=batch), n_probes=20, probe_chunk=100)
    assert results["rademacher"].stderr < 0.5 * few.stderr  # 15× the probes: SE / 3.9 in expectation


def test_hutchinson_engines_agree(model, language, batch):
    a = trace_hutchinson(model, language, FixedBatch(batch=batch, engine="func"), n_probes=6)
    b = trace_hutchinson(model, language, FixedBatch(batch=batch, engine="autograd"), n_probes=6)
    assert a.estimate == pytest.approx(b.estimate, rel=1e-10)
    assert a.settings["engine"] == "func" and b.settings["engine"] == "autograd"


# ---- the paper's (Fisher) estimator ---------------------------------------------------------
def exact_fisher_trace(model, contexts):
    """Mean over contexts of Σ_y f_y ‖∇_θ log f_θ(x)_y‖², every label enumerated, with
    plain autograd (one backward per context and label)."""
    params = list(model.parameters())
    values = []
    with sdpa_kernel(SDPBackend.MATH):
        for i in range(contexts.inputs.shape[0]):
            pos = int(contexts.masked[i].nonzero())
            logp = torch.log_softmax(model(contexts.inputs[i:i + 1])[0, pos], -1)
            total = 0.0
            for y in range(logp.shape[0]):
                grads = torch.autograd.grad(logp[y], params, retain_graph=True, allow_unused=True)
                total += float(logp[y].detach().exp()) * sum(float(g.square().sum()) for g in grads if g is not None)
            values.append(total)
    return sum(values) / len(values)


@pytest.fixture(scope="module")
def contexts(language):
    return sample_contexts(language, 24, seed=3)


@pytest.fixture(scope="module")
def fisher_target(model, contexts):
    return exact_fisher_trace(model, contexts)


def test_fisher_estimator_matches_its_exact_target(model, language, contexts, fisher_target):
    exact = trace_fisher(model, language, FisherContexts(batch=contexts), n_labels=None)
    assert exact.estimate == pytest.approx(fisher_target, rel=1e-10)
    sampled = trace_fisher(model, language, FisherContexts(batch=contexts), n_labels=50)
    assert abs(sampled.estimate - fisher_target) < 4 * sampled.stderr
    assert sampled.n_samples == 24 and sampled.n_params == exact.n_params
    # merging repeated labels changes nothing, and far fewer gradients are needed
    assert sampled.extra["n_gradients"] < 24 * 50


def test_fisher_engines_ghost_norms_and_chunking_agree(model, language, contexts):
    a = trace_fisher(model, language, FisherContexts(batch=contexts, engine="func", max_chunk_bytes=1), n_labels=7)
    b = trace_fisher(model, language, FisherContexts(batch=contexts, engine="func"), n_labels=7)
    c = trace_fisher(model, language, FisherContexts(batch=contexts, engine="autograd", block_size=5), n_labels=7)
    d = trace_fisher(model, language, FisherContexts(batch=contexts, engine="func", ghost_norms=False), n_labels=7)
    assert b.settings["ghost_norms"] and not d.settings["ghost_norms"]
    assert a.estimate == pytest.approx(b.estimate, rel=1e-12)
    assert c.estimate == pytest.approx(b.estimate, rel=1e-10)
    assert d.estimate == pytest.approx(b.estimate, rel=1e-10)
    # a selection of linear layers only (weights without their biases, and biases alone)
    for regex in (r"mlp\.up\.weight|attn\.qkv", r"\.bias$", r"head"):
        g = trace_fisher(model, language, FisherContexts(params=regex, batch=contexts), n_labels=None)
        m = trace_fisher(model, language, FisherContexts(params=regex, batch=contexts, ghost_norms=False),
                         n_labels=None)
        assert g.estimate == pytest.approx(m.estimate, rel=1e-10), regex
        assert g.n_params == m.n_params


def test_fisher_repeats_and_sampled_contexts(model, language):
    r = trace_fisher(model, language, FisherContexts(n_contexts=16, seed=5), n_labels=4, repeats=3)
    assert len(r.extra["repeat_estimates"]) == 3
    assert r.n_samples == 48 and r.settings["n_contexts"] == 16
    reps = torch.tensor(r.extra["repeat_estimates"], dtype=torch.float64)
    assert r.extra["repeat_std"] == pytest.approx(float(reps.std()))
    assert r.estimate == pytest.approx(float(reps.mean()))  # equal-sized repeats
    again = trace_fisher(model, language, FisherContexts(n_contexts=16, seed=5), n_labels=4, repeats=3)
    assert again.estimate == r.estimate  # a pure function of the seed
    with pytest.raises(UserError, match="exactly one masked position"):
        trace_fisher(model, language, FisherContexts(batch=loss_batch(language, 64, 1.0, seed=0)))


# ---- top eigenvalue and SAM -----------------------------------------------------------------
def test_lanczos_finds_the_top_eigenvalue(model, language, batch, exact_hessian):
    eig = torch.linalg.eigvalsh(exact_hessian)
    r = top_eigenvalue(model, language, FixedBatch(batch=batch), max_iter=exact_hessian.shape[0], tol=1e-10)
    assert r.extra["converged"]
    assert r.estimate == pytest.approx(float(eig[-1]), rel=1e-6)
    assert r.extra["smallest_ritz_value"] >= float(eig[0]) - 1e-8
    assert r.n_samples < exact_hessian.shape[0]


def test_sam_sharpness_matches_a_direct_computation(model, language, batch):
    f, theta = flat_loss(model, batch)
    theta = theta.clone().requires_grad_(True)
    with sdpa_kernel(SDPBackend.MATH):
        (g,) = torch.autograd.grad(f(theta), theta)
        with torch.no_grad():
            eps = 0.05 * g / g.norm()
            direct = float(f(theta + eps) - f(theta))
    r = sam_sharpness(model, language, batch=batch, rho=0.05)
    assert r.estimate == pytest.approx(direct, rel=1e-10)
    assert r.extra["grad_norm"] == pytest.approx(float(g.norm()), rel=1e-12)


# ---- parameter selection, modes, serialisation ---------------------------------------------
def test_params_regex_selects_a_subset(model, language, batch, exact_hessian):
    everything = select_parameters(model, None)
    assert everything.n_params == model.num_parameters()  # the tied embedding once
    names = [n for n, _ in model.named_parameters()]
    chosen = [n for n in names if n.startswith("head.") or n == "tok_emb.weight"]
    sizes = {n: p.numel() for n, p in model.named_parameters()}
    index, start = [], 0
    for n in names:
        if n in chosen:
            index.extend(range(start, start + sizes[n]))
        start += sizes[n]
    index = torch.tensor(index)
    block = exact_hessian[index][:, index]
    selected = FixedBatch(params=r"^head\.|tok_emb", batch=batch)
    r = top_eigenvalue(model, language, selected, max_iter=len(index), tol=1e-10)
    assert r.n_params == len(index) == sum(sizes[n] for n in chosen)
    assert r.params == r"^head\.|tok_emb"
    assert r.estimate == pytest.approx(float(torch.linalg.eigvalsh(block)[-1]), rel=1e-6)
    h = trace_hutchinson(model, language, selected, n_probes=100, probe_chunk=100)
    assert h.n_params == len(index)
    assert abs(h.estimate - float(block.trace())) < 4 * h.stderr
    f = trace_fisher(model, language, FisherContexts(params=r"blocks\.0\.mlp", n_contexts=4), n_labels=2)
    assert f.n_params == sum(sizes[n] for n in names if "blocks.0.mlp" in n)
    with pytest.raises(UserError, match="matches no parameter"):
        sam_sharpness(model, language, batch=batch, params="nothing-like-this")
    with pytest.raises(UserError, match="invalid parameter regex"):
        sam_sharpness(model, language, batch=batch, params="(")


def test_dropout_is_off_while_measuring_and_the_mode_is_restored(model, language, batch):
    model.train()
    try:
        a = sam_sharpness(model, language, batch=batch)
        b = sam_sharpness(model, language, batch=batch)
        h1 = trace_hutchinson(model, language, FixedBatch(batch=batch), n_probes=3)
        h2 = trace_hutchinson(model, language, FixedBatch(batch=batch), n_probes=3)
        assert model.training
    finally:
        model.eval()
    assert a.estimate == b.estimate and h1.estimate == h2.estimate
    assert a.estimate == sam_sharpness(model, language, batch=batch).estimate


def test_results_serialise_to_json(model, language, batch):
    for r in (trace_hutchinson(model, language, FixedBatch(batch=batch), n_probes=2),
              trace_fisher(model, language, FisherContexts(n_contexts=3), n_labels=2, repeats=2),
              top_eigenvalue(model, language, FixedBatch(batch=batch), max_iter=3),
              sam_sharpness(model, language, batch=batch)):
        text = json.dumps(r.to_dict(), allow_nan=False)
        back = json.loads(text)
        assert back["measure"] == r.measure and back["n_params"] == r.n_params
        assert back["seconds"] >= 0 and isinstance(back["settings"], dict)


@pytest.fixture(scope="module")
def lstm(language):
    torch.manual_seed(0)
    m = LSTMMLM(LSTMConfig(vocab_size=language.vocab_size, max_len=language.max_len, d_model=4, d_hidden=3,
                           n_layers=2, pad_id=language.pad_id)).double()
    m.eval()  # for the exact references below (the measures switch dropout off themselves)
    return m


def test_unrolled_lstm_equals_the_packed_kernel(lstm, language, batch):
    lengths = (batch.inputs != language.pad_id).sum(dim=1)
    assert lengths.unique().numel() > 2  # padding of several lengths is exercised
    with torch.no_grad():
        packed = lstm.features(batch.inputs)
        with lstm.unrolled():
            unrolled = lstm.features(batch.inputs)
        after = lstm.features(batch.inputs)
    assert float((unrolled - packed).abs().max()) < 1e-12
    assert float(packed.abs().max()) > 1e-3
    assert torch.equal(after, packed) and not lstm._unrolled  # the mode is left again


def test_lstm_models_are_measured_unrolled_with_torch_func(lstm, language, batch):
    f = trace_fisher(lstm, language, FisherContexts(n_contexts=4), n_labels=3)
    h = trace_hutchinson(lstm, language, FixedBatch(n_sentences=8), n_probes=2)
    e = top_eigenvalue(lstm, language, FixedBatch(n_sentences=8), max_iter=4)
    assert f.settings["engine"] == h.settings["engine"] == e.settings["engine"] == "func"
    assert math.isfinite(f.estimate) and f.estimate > 0 and math.isfinite(h.estimate)
    # the vectorised Fisher path against the exact enumeration on the packed kernel
    ctx = sample_contexts(language, 3, seed=2)
    exact = trace_fisher(lstm, language, FisherContexts(batch=ctx), n_labels=None)
    assert exact.estimate == pytest.approx(exact_fisher_trace(lstm, ctx), rel=1e-10)
    # Hessian-vector products of the unrolled LSTM against double backward through the packed kernel
    H = LossHessian(lstm, batch)
    v = torch.randn(3, H.dim, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    params = list(lstm.parameters())
    loss = F.cross_entropy(lstm(batch.inputs)[batch.masked], batch.targets[batch.masked])
    grads = torch.autograd.grad(loss, params, create_graph=True)
    for row, hv in zip(v, H.matmat(v)):
        parts = H.selection.unflat(row)
        ref = torch.autograd.grad(grads, params, [parts[n] for n in H.selection.names], retain_graph=True)
        assert float((hv - torch.cat([r.reshape(-1) for r in ref])).abs().max()) < 1e-10


# ---- operators and the estimators over them -------------------------------------------------
def random_spd(dim: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    B = torch.randn(dim, dim, generator=g, dtype=torch.float64)
    return B @ B.T / dim + 0.1 * torch.eye(dim, dtype=torch.float64)


def with_spectrum(eigenvalues: list[float], seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    Q, _ = torch.linalg.qr(torch.randn(len(eigenvalues), len(eigenvalues), generator=g, dtype=torch.float64))
    return Q @ torch.diag(torch.tensor(eigenvalues, dtype=torch.float64)) @ Q.T


def test_hutchinson_trace_of_a_dense_spd_matrix():
    M = random_spd(40, seed=0)
    A = MatrixOperator(M)
    off = M - torch.diag(M.diagonal())
    for dist, per_probe_var in (("rademacher", 2 * float(off.square().sum())),
                                ("gaussian", 2 * float(M.square().sum()))):
        r = hutchinson_trace(A, 3000, distribution=dist, generator=torch.Generator().manual_seed(1), chunk=500)
        mean, se = r.estimate, r.stderr
        assert abs(mean - float(M.trace())) < 4 * se, dist
        assert 0.8 < se / math.sqrt(per_probe_var / 3000) < 1.25, dist
    # the probes come from the generator: the same seed, the same estimate
    again = [hutchinson_trace(A, 7, generator=torch.Generator().manual_seed(5)) for _ in range(2)]
    assert again[0] == again[1]
    assert hutchinson_trace(A, 1).stderr is None  # one probe: no standard error
    with pytest.raises(UserError, match="probe distribution"):
        hutchinson_trace(A, 4, distribution="uniform")


def test_rademacher_probes_give_the_trace_of_a_diagonal_exactly():
    g = torch.Generator().manual_seed(2)
    D = torch.diag(torch.rand(30, generator=g, dtype=torch.float64) * 10 - 3)
    trace = float(D.trace())
    r = hutchinson_trace(MatrixOperator(D), 6, generator=g)
    assert r.estimate == pytest.approx(trace, rel=1e-13) and r.stderr < 1e-12 * abs(trace)  # vᵀDv = tr D, v ∈ {±1}ⁿ
    gaussian_se = hutchinson_trace(MatrixOperator(D), 6, distribution="gaussian", generator=g).stderr
    assert gaussian_se > 0.1  # Gaussian probes are not exact on it


def test_lanczos_top_eigenvalue_of_a_dense_spd_matrix():
    M = random_spd(60, seed=3)
    eig = torch.linalg.eigvalsh(M)
    r = lanczos_top_eigenvalue(MatrixOperator(M), max_iter=60, tol=1e-12, generator=torch.Generator().manual_seed(0))
    assert r.converged and r.iterations <= 60
    assert r.eigenvalue == pytest.approx(float(eig[-1]), rel=1e-10)
    assert r.smallest_ritz_value >= float(eig[0]) - 1e-10
    # three distinct eigenvalues: the Krylov space is invariant after three products and
    # the Ritz values are exact; "top" is the largest algebraically, not in magnitude
    S = with_spectrum([-10.0] * 5 + [1.0] * 10 + [2.0] * 5, seed=4)
    r = lanczos_top_eigenvalue(MatrixOperator(S), max_iter=20, tol=1e-14, generator=torch.Generator().manual_seed(0))
    assert r.converged and r.iterations == 3
    assert r.eigenvalue == pytest.approx(2.0, abs=1e-12)
    assert r.smallest_ritz_value == pytest.approx(-10.0, abs=1e-12)


def test_matrix_operator_products():
    M = torch.randn(5, 5, generator=torch.Generator().manual_seed(0), dtype=torch.float64)  # not symmetric
    A = MatrixOperator(M)
    X = torch.randn(5, 3, dtype=torch.float64)
    assert A.shape == (5, 5) and A.dtype == torch.float64
    assert torch.allclose(A @ X, M @ X) and torch.allclose(A @ X[:, 0], M @ X[:, 0])
    assert torch.allclose(A.matmat(X.T), (M @ X).T) and torch.allclose(A.matvec(X[:, 1]), M @ X[:, 1])
    with pytest.raises(ValueError, match="rows"):
        A.matmat(X)


def test_loss_hessian_is_the_exact_hessian(model, batch, exact_hessian):
    P = exact_hessian.shape[0]
    eye = torch.eye(P, dtype=torch.float64)
    f, theta = flat_loss(model, batch)
    with sdpa_kernel(SDPBackend.MATH):  # in eval mode
        loss, g = float(f(theta)), torch.autograd.functional.jacobian(f, theta)
    model.train()  # the operator measures with dropout off, and restores the mode
    try:
        for engine in ("func", "autograd"):
            H = LossHessian(model, batch, engine=engine)
            assert model.training and H.engine == engine
            assert H.dim == P and H.dtype == torch.float64 and H.shape == (P, P)
            assert torch.allclose(H.matmat(eye), exact_hessian, rtol=1e-9, atol=1e-10), engine
            v = torch.randn(P, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
            assert torch.allclose(H @ v, exact_hessian @ v, rtol=1e-9, atol=1e-10)
            assert float(H.loss) == pytest.approx(loss, rel=1e-12)
            assert torch.allclose(H.gradient, g, rtol=1e-10, atol=1e-12)
    finally:
        model.eval()
    # a parameter selection is the matching block of the Hessian
    names = [n for n, _ in model.named_parameters()]
    sizes = {n: p.numel() for n, p in model.named_parameters()}
    starts = dict(zip(names, [sum(sizes[m] for m in names[:i]) for i in range(len(names))]))
    index = torch.cat([torch.arange(starts[n], starts[n] + sizes[n]) for n in names if n.startswith("head.")])
    H = LossHessian(model, batch, params=r"^head\.")
    assert H.dim == len(index) == H.selection.n_params
    assert torch.allclose(H.matmat(torch.eye(H.dim, dtype=torch.float64)), exact_hessian[index][:, index],
                          rtol=1e-9, atol=1e-10)


def test_map_in_chunks_respects_the_budget_and_the_result():
    x = torch.arange(10.0)
    y = torch.arange(10.0) * 3
    seen = []

    def fn(a, b):
        seen.append(a.shape[0])
        return a * b

    whole = x * y
    assert torch.equal(map_in_chunks(fn, x, y, row_bytes=10, max_bytes=35), whole)
    assert seen == [3, 3, 3, 1]
    seen.clear()
    assert torch.equal(map_in_chunks(fn, x, y, row_bytes=10, max_bytes=1), whole)  # at least one row
    assert seen == [1] * 10


# ---- Lemma 3.2: the Bartlett identity at a well-specified global minimiser --------------------
class PairLanguage(Language):
    """Two-word sentences from a known joint ``P(x₁, x₂)`` over three words."""

    name = "pair"
    n_words = 3
    max_len = 2
    words = ["a", "b", "c"]

    def __init__(self, joint: torch.Tensor):
        self.joint = joint

    def sample(self, n, generator=None):
        idx = torch.multinomial(self.joint.flatten(), n, replacement=True, generator=generator)
        return Batch(torch.stack([idx // 3, idx % 3], dim=1), torch.full((n,), 2))

    def conditionals(self, tokens, masked, query=None):
        query = masked if query is None else query
        rows = []
        for i, t in query.nonzero().tolist():
            other = tokens[i, 1 - t]
            if masked[i, 1 - t]:
                rows.append(self.joint.sum(dim=1 - t))
            else:
                row = self.joint[:, other] if t == 0 else self.joint[other]
                rows.append(row / row.sum())
        return torch.stack(rows)


class TableMLM(nn.Module):
    """Logits at position t are ``table[t, token at the other position]``: a full table,
    so any conditional is representable (a well-specified model). Special tokens get a
    fixed −10⁴ (probability exactly 0 in float64)."""

    def __init__(self, vocab: int, n_words: int):
        super().__init__()
        self.table = nn.Parameter(torch.zeros(2, vocab, vocab, dtype=torch.float64))
        offset = torch.zeros(vocab, dtype=torch.float64)
        offset[n_words:] = -1e4
        self.register_buffer("offset", offset)

    def forward(self, tokens):
        vocab = self.table.shape[1]
        other = (tokens.flip(1)[..., None] == torch.arange(vocab)).to(self.table.dtype)  # [n, 2, V]
        return torch.einsum("ntv,tvw->ntw", other, self.table) + self.offset


@pytest.fixture(scope="module")
def pair():
    joint = torch.tensor([[0.20, 0.05, 0.10], [0.05, 0.25, 0.05], [0.10, 0.05, 0.15]], dtype=torch.float64)
    lang = PairLanguage(joint)
    model = TableMLM(lang.vocab_size, 3)
    with torch.no_grad():  # the global minimiser: log of the true conditionals
        model.table[0, :3, :3] = (joint / joint.sum(0, keepdim=True)).log().T  # P(x1 | x2 = row)
        model.table[1, :3, :3] = (joint / joint.sum(1, keepdim=True)).log()  # P(x2 | x1 = row)
    return lang, model


def expected_loss_and_gradients(model, lang, theta):
    """The exact MLM loss (one uniform mask, all sentences enumerated) as a function of
    the flat table, and the per-outcome gradients with their probabilities."""
    shape = model.table.shape
    tokens, weights = [], []
    for a in range(3):
        for b in range(3):
            for t in range(2):
                x = torch.tensor([a, b])
                inp = x.clone()
                inp[t] = lang.mask_id
                tokens.append((inp, t, int(x[t])))
                weights.append(float(lang.joint[a, b]) / 2)
    weights = torch.tensor(weights, dtype=torch.float64)

    def losses(flat):
        out = []
        for inp, t, y in tokens:
            logits = functional_call(model, {"table": flat.view(shape)}, (inp[None],))[0, t]
            out.append(-torch.log_softmax(logits, -1)[y])
        return torch.stack(out)

    def loss(flat):
        return (weights * losses(flat)).sum()

    return loss, jacrev(losses)(theta), weights


def test_bartlett_identity_holds_at_the_minimiser_and_only_there(pair):
    lang, model = pair
    theta_star = model.table.detach().reshape(-1).clone()
    for theta, at_minimum in ((theta_star, True), (theta_star + 0.3 * torch.randn(theta_star.shape,
                              generator=torch.Generator().manual_seed(0), dtype=torch.float64), False)):
        loss, G, w = expected_loss_and_gradients(model, lang, theta)
        H = exact_hessian_of(loss, theta)
        mean = w @ G
        cov = G.T @ (w[:, None] * G) - torch.outer(mean, mean)
        if at_minimum:
            assert float(mean.abs().max()) < 1e-12  # a stationary point
            assert float((cov - H).abs().max()) < 1e-10
        else:
            assert float((cov - H).abs().max()) > 1e-2


def test_fisher_estimator_agrees_with_hutchinson_at_the_minimiser(pair):
    lang, model = pair
    theta = model.table.detach().reshape(-1).clone()
    loss, _, _ = expected_loss_and_gradients(model, lang, theta)
    exact_trace = float(exact_hessian_of(loss, theta).trace())
    fisher = trace_fisher(model, lang, FisherContexts(n_contexts=4000, seed=0), n_labels=50)
    assert fisher.n_params == theta.numel()
    assert abs(fisher.estimate - exact_trace) < 4 * fisher.stderr
    # Hutchinson on the expected-loss Hessian, through a batch of true tokens (single mask)
    hutch = trace_hutchinson(model, lang, FixedBatch(n_sentences=4000, mask_rate=None), n_probes=400, probe_chunk=100)
    combined = math.hypot(fisher.stderr, hutch.stderr)
    assert abs(fisher.estimate - hutch.estimate) < 4 * combined
    assert abs(hutch.estimate - exact_trace) < 4 * combined


# ---- Gauss–Newton: the Fisher part of the Hessian (Lemma 3.2) -----------------------------------
def brute_gauss_newton(model, batch):
    """``(1/M) Σ_i J_iᵀ (diag f_i − f_i f_iᵀ) J_i`` from the full Jacobian of the logits."""
    sel = select_parameters(model, None)

    def logits(flat):
        return functional_call(model, {**sel.fixed, **sel.unflat(flat)}, (batch.inputs,))[batch.masked]

    theta = sel.flat(sel.values)
    with sdpa_kernel(SDPBackend.MATH):
        J = torch.autograd.functional.jacobian(logits, theta)  # [M, V, P]
        f = torch.softmax(logits(theta), dim=-1)
    return torch.einsum("mvp,mvw,mwq->pq", J, torch.diag_embed(f) - f[:, :, None] * f[:, None, :], J) / J.shape[0]


def test_gauss_newton_equals_the_brute_force_matrix(model, batch):
    G = LossGaussNewton(model, batch)
    dense = G.matmat(torch.eye(G.dim, dtype=torch.float64))
    ref = brute_gauss_newton(model, batch)
    assert float((dense - ref).abs().max()) < 1e-10
    assert float(ref.abs().max()) > 1e-3


def test_model_sampled_labels_make_the_hessian_the_gauss_newton_matrix(model, language):
    """Bartlett's identity on one context: Σ_y f_y ∇²(−log f_y) = G exactly, so the
    residual ``Difference(H, G)`` averages to zero over labels drawn from the model."""
    from sameloss.training.data import MaskedBatch

    one = loss_batch(language, n_sentences=1, mask_rate=None, seed=3)
    G = LossGaussNewton(model, one)
    eye = torch.eye(G.dim, dtype=torch.float64)
    with torch.no_grad():
        f = torch.softmax(model(one.inputs)[one.masked].double(), dim=-1)[0]
    mixed = torch.zeros(G.dim, G.dim, dtype=torch.float64)
    for y in range(f.numel()):
        targets = one.targets.clone()
        targets[one.masked] = y
        labelled = MaskedBatch(one.inputs, targets, one.masked)
        mixed += f[y] * Difference(LossHessian(model, labelled), LossGaussNewton(model, labelled)).matmat(eye)
    assert float(mixed.abs().max()) < 1e-10
    # ... while with the true token alone the residual is not zero
    R = Difference(LossHessian(model, one), G).matmat(eye)
    assert float(R.abs().max()) > 1e-4


# ---- per-block traces (--trace-by block) -------------------------------------------------------
def block_indices(model):
    """Flat indices of each block (embedding, layer0, head) of the tiny model's
    parameters, in ``named_parameters`` order — written out by hand."""
    out, start = {}, 0
    for name, p in model.named_parameters():
        block = "embedding" if name.split(".")[0] in ("tok_emb", "pos_emb", "emb_norm") else \
            "layer0" if name.startswith("blocks.0.") else "head"
        out.setdefault(block, []).extend(range(start, start + p.numel()))
        start += p.numel()
    return {k: torch.tensor(v) for k, v in out.items()}


def test_block_traces_of_the_hessian(model, language, batch, exact_hessian):
    blocks = block_indices(model)
    exact = {k: float(exact_hessian.diagonal()[idx].sum()) for k, idx in blocks.items()}
    r = trace_hutchinson(model, language, FixedBatch(batch=batch), n_probes=300, probe_chunk=100, by_block=True)
    assert list(r.extra["blocks"]) == ["embedding", "layer0", "head"]
    assert sum(b["estimate"] for b in r.extra["blocks"].values()) == pytest.approx(r.estimate, rel=1e-10)
    assert sum(b["n_params"] for b in r.extra["blocks"].values()) == r.n_params
    for k, value in r.extra["blocks"].items():
        assert value["n_params"] == len(blocks[k])
        assert abs(value["estimate"] - exact[k]) < 4 * value["stderr"], (k, value, exact[k])
    # Hutch++ with a sketch as large as the space (3 × dim products) takes everything
    # exactly: each block equals the trace of the Hessian's diagonal block
    dim = exact_hessian.shape[0]
    pp = trace_hutchinson(model, language, FixedBatch(batch=batch), n_probes=3 * dim, probe_chunk=dim, by_block=True,
                          estimator="hutchpp")
    assert pp.measure == "trace_hutchpp"
    assert pp.estimate == pytest.approx(float(exact_hessian.trace()), rel=1e-9)
    for k, value in pp.extra["blocks"].items():
        assert value["estimate"] == pytest.approx(exact[k], rel=1e-8, abs=1e-10), k


def test_block_traces_of_the_fisher_are_exact(model, language, contexts):
    """The paper's estimator per block, every label enumerated, against a brute-force
    sum of squared per-block gradient norms; the blocks sum to the total."""
    named = dict(model.named_parameters())
    block = {n: ("embedding" if n.split(".")[0] in ("tok_emb", "pos_emb", "emb_norm") else
                 "layer0" if n.startswith("blocks.0.") else "head") for n in named}
    totals = dict.fromkeys(("embedding", "layer0", "head"), 0.0)
    with sdpa_kernel(SDPBackend.MATH):
        for i in range(contexts.inputs.shape[0]):
            pos = int(contexts.masked[i].nonzero())
            logp = torch.log_softmax(model(contexts.inputs[i:i + 1])[0, pos], -1)
            for y in range(logp.shape[0]):
                grads = torch.autograd.grad(logp[y], list(named.values()), retain_graph=True, allow_unused=True)
                for n, g in zip(named, grads):
                    if g is not None:
                        totals[block[n]] += float(logp[y].detach().exp()) * float(g.square().sum())
    exact = {k: v / contexts.inputs.shape[0] for k, v in totals.items()}
    for engine, ghost in (("func", True), ("func", False), ("autograd", False)):
        r = trace_fisher(model, language, FisherContexts(batch=contexts, engine=engine, ghost_norms=ghost),
                         n_labels=None, by_block=True)
        assert list(r.extra["blocks"]) == ["embedding", "layer0", "head"]
        for k, value in r.extra["blocks"].items():
            assert value["estimate"] == pytest.approx(exact[k], rel=1e-10), (engine, ghost, k)
        assert r.estimate == pytest.approx(sum(exact.values()), rel=1e-10)
    plain = trace_fisher(model, language, FisherContexts(batch=contexts, seed=1), n_labels=7)
    split = trace_fisher(model, language, FisherContexts(batch=contexts, seed=1), n_labels=7, by_block=True)
    assert split.estimate == pytest.approx(plain.estimate, rel=1e-12) and "blocks" not in plain.extra


def test_a_micro_batched_hessian_is_the_same_operator(model, batch, exact_hessian):
    P = exact_hessian.shape[0]
    eye = torch.eye(P, dtype=torch.float64)
    whole = LossHessian(model, batch)
    assert whole._pieces is None
    for engine in ("func", "autograd"):
        H = LossHessian(model, batch, engine=engine, micro_batch=5)  # 32 sentences: 7 micro-batches
        assert len(H._pieces) == 7
        assert torch.allclose(H.matmat(eye), exact_hessian, rtol=1e-9, atol=1e-10), engine
        assert float(H.loss) == pytest.approx(float(whole.loss), rel=1e-12)
        assert torch.allclose(H.gradient, whole.gradient, rtol=1e-10, atol=1e-12)
    r = trace_hutchinson(model, None, FixedBatch(batch=batch, micro_batch=8), n_probes=6)
    at_once = trace_hutchinson(model, None, FixedBatch(batch=batch), n_probes=6)
    assert r.estimate == pytest.approx(at_once.estimate, rel=1e-10)
    assert r.settings["micro_batch"] == 8


# ---- Lemma 3.2's gap --------------------------------------------------------------------------
def test_hessian_gap_matches_the_exact_traces_batch_by_batch(model, language):
    """Lemma 3.2's measure: per batch, Hutchinson's tr H and tr (H − G) are within 4 probe
    standard errors (computed from the exact matrices) of the exact traces, with the true
    tokens and with tokens drawn from the model; the estimate pools the batches."""
    from sameloss.measures.curvature import trace_hessian_gap
    from sameloss.measures.curvature.base import STREAM_DRAWS
    from sameloss.training.data import MaskedBatch, step_generator

    seed, n_probes = 3, 400
    out = trace_hessian_gap(model, language, n_batches=2, n_sentences=6, n_probes=n_probes, seed=seed)
    for b in range(2):
        batch = loss_batch(language, 6, None, seed=seed * 1009 + b)
        with torch.no_grad():  # the model's draws, as the measure makes them (documented stream)
            probs = torch.softmax(model(batch.inputs)[batch.masked].double(), -1)
        targets = batch.targets.clone()
        targets[batch.masked] = torch.multinomial(probs, 1, generator=step_generator(seed, 100 + b,
                                                                                     stream=STREAM_DRAWS))[:, 0]
        for suffix, bt in (("", batch), ("_model", MaskedBatch(batch.inputs, targets, batch.masked))):
            f, theta = flat_loss(model, bt)
            with sdpa_kernel(SDPBackend.MATH):
                H = exact_hessian_of(f, theta)
            D = H - brute_gauss_newton(model, bt)
            for name, A in ((f"trace_hessian{suffix}", H), (f"trace_gap{suffix}", D)):
                off = A - torch.diag(A.diagonal())
                se = math.sqrt(2 * float(off.square().sum()) / n_probes)
                got = out[name].extra["batches"][b]
                assert abs(got - float(A.trace())) < 4 * se, (name, b, got, float(A.trace()), se)
    for r in out.values():
        values = torch.tensor(r.extra["batches"], dtype=torch.float64)
        assert r.estimate == pytest.approx(float(values.mean()), rel=1e-12)
        assert r.stderr == pytest.approx(float(values.std()) / math.sqrt(2), rel=1e-12)
        assert r.n_params == sum(p.numel() for p in model.parameters())
    with pytest.raises(UserError, match="at least 2 batches"):
        trace_hessian_gap(model, language, n_batches=1)
