"""The matrix-free estimators against dense matrices whose answers are known exactly
(float64): thick-restart Lanczos against ``torch.linalg.eigvalsh``, Hutch++ and
Hutchinson against the trace, and their per-block parts against the diagonal blocks."""

from __future__ import annotations

import math

import pytest
import torch

from sameloss.errors import UserError
from sameloss.measures.curvature import MatrixOperator
from sameloss.models.derivatives import Blocks
from sameloss.measures.curvature.base import block_name
from sameloss.measures.curvature.estimators import (hutchinson_trace, hutchpp_trace, lanczos_top_eigenvalue,
                                                    sketched_diagonal)


def with_spectrum(eigenvalues, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    n = len(eigenvalues)
    Q, _ = torch.linalg.qr(torch.randn(n, n, generator=g, dtype=torch.float64))
    return Q @ torch.diag(torch.as_tensor(eigenvalues, dtype=torch.float64)) @ Q.T


def linspace(a, b, n):
    return torch.linspace(a, b, n, dtype=torch.float64).tolist()


class Counting(MatrixOperator):
    """A dense operator that counts its products and remembers the largest batch."""

    def __init__(self, matrix):
        super().__init__(matrix)
        self.products = 0

    def _matmat(self, vectors):
        self.products += vectors.shape[0]
        return super()._matmat(vectors)


# dense test spectra (dim 300): a clear gap, a small relative gap, a cluster at the top,
# and a top eigenvalue smaller in magnitude than the bottom one (Lanczos finds the
# largest algebraically)
SPECTRA = {
    "gap": [10.0] + linspace(0.0, 5.0, 299),
    "small-gap": [10.0, 9.9] + linspace(0.0, 9.0, 298),
    "cluster": [8.0] * 6 + [7.9] * 4 + linspace(-1.0, 7.0, 290),
    "negative": [3.0] + linspace(-40.0, 2.5, 299),
    "decaying": [1.0 / (i + 1) ** 1.5 for i in range(300)],
}


@pytest.mark.parametrize("name", list(SPECTRA))
@pytest.mark.parametrize("basis_size", [8, 20])
def test_thick_restart_lanczos_matches_eigvalsh(name, basis_size):
    M = with_spectrum(SPECTRA[name], seed=len(name))
    exact = float(torch.linalg.eigvalsh(M)[-1])
    A = Counting(M)
    r = lanczos_top_eigenvalue(A, max_iter=300, tol=1e-10, generator=torch.Generator().manual_seed(0),
                               basis_size=basis_size)
    assert r.converged, (name, r)
    assert abs(r.eigenvalue - exact) <= 1e-8 * abs(exact), (name, r.eigenvalue, exact)
    assert r.smallest_ritz_value >= float(torch.linalg.eigvalsh(M)[0]) - 1e-8
    assert r.iterations == A.products <= 300
    assert r.basis_size == basis_size + 1  # the memory bound: at most this many vectors
    # a first cycle of basis_size products, then basis_size − keep per restart (keep = half)
    assert r.restarts == max(0, math.ceil((r.iterations - basis_size) / (basis_size - basis_size // 2)))
    if basis_size == 8:
        assert r.restarts > 0  # the restarts are exercised
    # the converged Ritz value's residual bound holds: |θ − λ| ≤ residual (Weyl)
    assert abs(r.eigenvalue - exact) <= r.residual + 1e-12


def test_lanczos_variants_agree():
    M = with_spectrum(SPECTRA["small-gap"], seed=1)
    exact = float(torch.linalg.eigvalsh(M)[-1])
    gen = lambda: torch.Generator().manual_seed(3)  # noqa: E731
    full = lanczos_top_eigenvalue(MatrixOperator(M), max_iter=200, tol=1e-10, generator=gen(), basis_size=200)
    assert full.restarts == 0 and full.converged  # a basis as large as the budget: plain Lanczos
    restarted = lanczos_top_eigenvalue(MatrixOperator(M), max_iter=200, tol=1e-10, generator=gen(), basis_size=10)
    assert restarted.restarts > 0 and restarted.converged
    assert restarted.iterations <= 2 * full.iterations  # little of the convergence is lost
    host = lanczos_top_eigenvalue(MatrixOperator(M), max_iter=200, tol=1e-10, generator=gen(), basis_size=10,
                                  basis_device="cpu")
    assert host.eigenvalue == restarted.eigenvalue and host.iterations == restarted.iterations
    # a float32 basis (what a float32 model gets): the accuracy of float32 products
    single = lanczos_top_eigenvalue(MatrixOperator(M.float()), max_iter=200, tol=1e-5, generator=gen(),
                                    basis_size=10)
    assert abs(single.eigenvalue - exact) <= 1e-5 * exact
    with pytest.raises(UserError, match="at least 2 vectors"):
        lanczos_top_eigenvalue(MatrixOperator(M), basis_size=1)


# ---- Hutch++ -----------------------------------------------------------------------------------
def test_hutchpp_is_exact_when_the_sketch_spans_the_range():
    M = with_spectrum([5.0, 4.0, 3.0, 2.0, 1.0] + [0.0] * 95, seed=0)  # rank 5 ≤ k = 6
    r = hutchpp_trace(MatrixOperator(M), 18, generator=torch.Generator().manual_seed(1))
    assert r.estimate == pytest.approx(15.0, abs=1e-10) and r.stderr < 1e-10 and r.matvecs == 18
    with pytest.raises(UserError, match=">= 3"):
        hutchpp_trace(MatrixOperator(M), 2)


def test_hutchpp_is_unbiased_and_beats_hutchinson_at_equal_products():
    """A decaying spectrum (λ_i = 1/i², dim 300), 30 products each, 200 seeds: both
    average to the trace, Hutch++'s variance is far smaller, and its reported standard
    error is the spread it has."""
    M = with_spectrum([1.0 / (i + 1) ** 2 for i in range(300)], seed=5)
    A, trace = MatrixOperator(M), float(M.trace())
    runs = {f.__name__: [f(A, 30, generator=torch.Generator().manual_seed(s)) for s in range(200)]
            for f in (hutchinson_trace, hutchpp_trace)}
    var = {}
    for name, rs in runs.items():
        values = torch.tensor([r.estimate for r in rs], dtype=torch.float64)
        spread = float(values.std())
        assert abs(float(values.mean()) - trace) < 4 * spread / math.sqrt(200), name  # unbiased
        reported = float(torch.tensor([r.stderr for r in rs]).square().mean().sqrt())
        assert 0.6 < reported / spread < 1.6, (name, reported, spread)
        var[name] = spread ** 2
    assert var["hutchpp_trace"] < var["hutchinson_trace"] / 20, var


def test_hutchpp_and_hutchinson_on_a_dense_spd_matrix():
    g = torch.Generator().manual_seed(0)
    B = torch.randn(200, 200, generator=g, dtype=torch.float64)
    M = B @ B.T / 200 + 0.1 * torch.eye(200, dtype=torch.float64)
    for f in (hutchinson_trace, hutchpp_trace):
        for dist in ("rademacher", "gaussian"):
            r = f(MatrixOperator(M), 300, distribution=dist, generator=torch.Generator().manual_seed(2), chunk=64)
            assert abs(r.estimate - float(M.trace())) < 4 * r.stderr, (f.__name__, dist)
    # k = dim: Q spans everything and Hutch++ is exact
    r = hutchpp_trace(MatrixOperator(M), 600, generator=torch.Generator().manual_seed(2), chunk=100)
    assert r.estimate == pytest.approx(float(M.trace()), rel=1e-12)


# ---- per-block traces --------------------------------------------------------------------------
BLOCKS = Blocks(("a", "b", "c"), (12, 30, 8, 20, 30), (0, 1, 2, 0, 1))  # non-adjacent segments of a and b


def block_traces(M):
    bounds = torch.tensor((0, 12, 42, 50, 70, 100)).tolist()
    diag = M.diagonal()
    seg = [float(diag[bounds[i]:bounds[i + 1]].sum()) for i in range(5)]
    return {"a": seg[0] + seg[3], "b": seg[1] + seg[4], "c": seg[2]}


def test_blocks_sum_their_segments():
    x = torch.arange(200, dtype=torch.float64).reshape(2, 100)
    sums = BLOCKS.sums(x)
    assert sums.shape == (2, 3)
    assert sums[0].tolist() == [sum(range(12)) + sum(range(50, 70)), sum(range(12, 42)) + sum(range(70, 100)),
                                sum(range(42, 50))]
    assert Blocks.whole(100).sums(x)[:, 0].tolist() == x.sum(dim=1).tolist()


def test_rademacher_block_traces_of_a_diagonal_are_exact():
    D = torch.diag(torch.rand(100, generator=torch.Generator().manual_seed(4), dtype=torch.float64) * 6 - 2)
    r = hutchinson_trace(MatrixOperator(D), 5, generator=torch.Generator().manual_seed(0), blocks=BLOCKS)
    for name, exact in block_traces(D).items():
        assert r.blocks[name][0] == pytest.approx(exact, rel=1e-13), name
        assert r.blocks[name][1] < 1e-12
    assert r.estimate == pytest.approx(float(D.trace()), rel=1e-13)


@pytest.mark.parametrize("estimator", [hutchinson_trace, hutchpp_trace])
def test_block_traces_sum_to_the_total_and_estimate_the_blocks(estimator):
    M = with_spectrum([1.0 / (i + 1) for i in range(100)], seed=8)
    r = estimator(MatrixOperator(M), 150, generator=torch.Generator().manual_seed(1), chunk=50, blocks=BLOCKS)
    assert list(r.blocks) == ["a", "b", "c"]
    assert sum(v for v, _ in r.blocks.values()) == pytest.approx(r.estimate, rel=1e-12)
    for name, exact in block_traces(M).items():
        value, se = r.blocks[name]
        assert abs(value - exact) < 4 * se, (estimator.__name__, name, value, exact, se)
    plain = estimator(MatrixOperator(M), 150, generator=torch.Generator().manual_seed(1), chunk=50)
    assert plain.estimate == pytest.approx(r.estimate, rel=1e-12) and plain.blocks == {}


def test_hutchpp_block_traces_are_exact_when_the_sketch_spans_the_range():
    M = with_spectrum([3.0, -2.0, 1.0, 0.5] + [0.0] * 96, seed=9)  # rank 4, indefinite
    r = hutchpp_trace(MatrixOperator(M), 15, generator=torch.Generator().manual_seed(0), blocks=BLOCKS)
    for name, exact in block_traces(M).items():
        assert r.blocks[name][0] == pytest.approx(exact, abs=1e-10), name


def test_block_names_of_parameters():
    names = {"tok_emb.weight": "embedding", "pos_emb.weight": "embedding", "emb_norm.bias": "embedding",
             "blocks.0.attn.qkv.weight": "layer0", "blocks.11.mlp_norm.bias": "layer11", "final_norm.weight": "head",
             "head.dense.weight": "head", "head.bias": "head",
             "bert.embeddings.word_embeddings.weight": "embedding",
             "bert.encoder.layer.3.attention.self.query.weight": "layer3",
             "cls.predictions.transform.dense.weight": "head",
             "lstm.weight_ih_l1_reverse": "layer1", "lstm.bias_hh_l0": "layer0", "proj.weight": "head", "bias": "head"}
    for parameter, block in names.items():
        assert block_name(parameter) == block, parameter


def test_hutchpp_block_traces_are_unbiased_with_a_partial_sketch():
    """Where Q misses part of the range, the cross terms ``2 tr(P_b QQᵀA(I−QQᵀ))`` are
    not zero for a block (only their sum is): the blocks' means over seeds must still
    hit the diagonal blocks' traces."""
    M = with_spectrum([1.0 / (i + 1) for i in range(100)], seed=8)
    estimates = torch.tensor([[v for v, _ in hutchpp_trace(MatrixOperator(M), 30, blocks=BLOCKS,
                                                         generator=torch.Generator().manual_seed(s)).blocks.values()]
                              for s in range(100)], dtype=torch.float64)
    exact = torch.tensor(list(block_traces(M).values()), dtype=torch.float64)
    se = estimates.std(dim=0) / 10
    assert bool(((estimates.mean(dim=0) - exact).abs() < 4 * se).all()), (estimates.mean(dim=0), exact, se)


def test_the_sketched_part_of_the_diagonal():
    """What Hutch++ takes exactly, coordinate by coordinate: diag(PAP + PA(I−P) + (I−P)AP)
    for P = QQᵀ, against the dense matrices (a sketch that misses most of the range, so
    the cross terms are not zero coordinate-wise)."""
    M = with_spectrum([1.0 / (i + 1) for i in range(100)], seed=8)
    Q = torch.linalg.qr(torch.randn(100, 7, generator=torch.Generator().manual_seed(0), dtype=torch.float64)).Q
    P, I = Q @ Q.T, torch.eye(100, dtype=torch.float64)
    dense = (P @ M @ P + P @ M @ (I - P) + (I - P) @ M @ P).diagonal()
    d = sketched_diagonal(Q, M @ Q)
    assert torch.allclose(d, dense, atol=1e-14)
    assert float((P @ M @ (I - P)).diagonal().abs().max()) > 1e-3  # the cross terms matter per coordinate
    assert float(d.sum()) == pytest.approx(float((Q.T @ M @ Q).trace()), rel=1e-12)
