"""Matrix-free estimators over any ``LinearOperator`` (``operators.py``): the trace by
Hutchinson's estimator and by Hutch++, per block of coordinates if asked, and the top
eigenvalue by thick-restart Lanczos in bounded memory. They see the operator only
through ``matmat``/``matvec``, ``dim``, ``dtype`` and ``device``.

Device-correct: probes, products and per-probe values stay on the operator's device and
are read back once, at the end (``_mean_and_stderr_table``). Lanczos alone reads its
recurrence coefficients after each product: its stopping test and the small projected
eigenproblem need them on the host (one read per Hessian-vector product, which costs far
more than the read).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ...errors import UserError
from ...models.hessian_products import probe_vectors
from ...models.derivatives import Blocks
from .operators import LinearOperator

DISTRIBUTIONS = ("rademacher", "gaussian")


@dataclass(frozen=True)
class TraceEstimate:
    """``estimate`` ± ``stderr`` (``None`` from a single sample) of ``tr A``, and with
    ``blocks`` asked for, ``{name: (estimate, stderr)}`` of each diagonal block's trace
    from the same products (they sum to ``estimate``). ``matvecs``: products used."""

    estimate: float
    stderr: float | None
    matvecs: int
    blocks: dict[str, tuple[float, float | None]] = field(default_factory=dict)


def _mean_and_stderr_table(samples: torch.Tensor, offset: torch.Tensor | None = None
                           ) -> list[tuple[float, float | None]]:
    """Per column of ``samples [n, m]`` (on any device): ``(mean + offset, std/√n)``,
    read back in one go. ``std`` is the sample standard deviation (``None`` for n < 2)."""
    n = samples.shape[0]
    mean = samples.mean(dim=0)
    if offset is not None:
        mean = mean + offset
    std = samples.std(dim=0) if n > 1 else torch.zeros_like(mean)
    means, stds = torch.stack([mean, std]).tolist()  # the one read-back
    return [(m, s / math.sqrt(n) if n > 1 else None) for m, s in zip(means, stds)]


def _estimate(samples: torch.Tensor, blocks: Blocks | None, matvecs: int,
              offset: torch.Tensor | None = None) -> TraceEstimate:
    """A ``TraceEstimate`` from per-sample, per-block values ``[n, n_blocks]`` (and a
    deterministic per-block ``offset``): the total is their sum over blocks."""
    total = samples.sum(dim=1, keepdim=True)
    whole = None if offset is None else offset.sum()[None]
    if blocks is None:
        (estimate, stderr), = _mean_and_stderr_table(total, whole)
        return TraceEstimate(estimate, stderr, matvecs)
    table = _mean_and_stderr_table(torch.cat([total, samples], dim=1),
                                   None if offset is None else torch.cat([whole, offset]))
    return TraceEstimate(*table[0], matvecs, dict(zip(blocks.names, table[1:])))


def mean_and_stderr(values: torch.Tensor) -> tuple[float, float | None]:
    """Mean of i.i.d. samples and its standard error (``None`` for one sample)."""
    (mean, stderr), = _mean_and_stderr_table(values.double().reshape(-1, 1))
    return mean, stderr


def check_probes(num_matvecs: int, distribution: str, least: int = 1) -> None:
    if distribution not in DISTRIBUTIONS:
        raise UserError(f"probe distribution must be 'rademacher' or 'gaussian', got {distribution!r}")
    if num_matvecs < least:
        raise UserError(f"the number of probes must be >= {least}, got {num_matvecs}")


# ---- Hutchinson ------------------------------------------------------------------------------
def hutchinson_trace(A: LinearOperator, num_matvecs: int, *, distribution: str = "rademacher",
                     generator: torch.Generator | None = None, chunk: int = 8,
                     blocks: Blocks | None = None) -> TraceEstimate:
    """Hutchinson's estimate of ``tr A``: the mean of ``vᵀAv`` over ``num_matvecs``
    probes, and its standard error.

    Unbiased for any square ``A``. Per-probe variance: ``2 Σ_{i≠j} A_ij²`` for
    ``"rademacher"`` probes (so exact for a diagonal ``A``), ``2‖A‖_F²`` for
    ``"gaussian"`` ones (symmetric ``A``). Probes are drawn from ``generator`` (``None``:
    torch's global one), ``chunk`` at a time, each chunk one ``A.matmat``.

    ``blocks``: also each diagonal block's trace, ``Σ_{i∈b} v_i (Av)_i`` (unbiased for
    ``tr A_bb``, and exact for a diagonal ``A`` with Rademacher probes), from the same
    probes: the blocks sum to the total.
    """
    check_probes(num_matvecs, distribution)
    parts = blocks or Blocks.whole(A.dim)
    values = []
    for p0 in range(0, num_matvecs, chunk):
        v = probe_vectors(min(chunk, num_matvecs - p0), A.dim, distribution, generator, A.dtype, A.device)
        values.append(parts.sums(v * A.matmat(v)))
    return _estimate(torch.cat(values), blocks, num_matvecs)


# ---- Hutch++ ---------------------------------------------------------------------------------
def hutchpp_trace(A: LinearOperator, num_matvecs: int, *, distribution: str = "rademacher",
                  generator: torch.Generator | None = None, chunk: int = 8,
                  blocks: Blocks | None = None) -> TraceEstimate:
    """Hutch++ (Meyer, Musco, Musco & Woodruff, SOSA 2021, Algorithm 1) for a symmetric
    ``A``: ``k = num_matvecs // 3`` products ``Y = A S`` with random ``S`` give an
    orthonormal basis ``Q`` of their span (QR); ``tr(QᵀAQ)`` is computed exactly with
    ``k`` more products, and Hutchinson's estimator with the remaining
    ``num_matvecs − 2k`` probes, projected off ``Q``, estimates the rest,
    ``tr((I−QQᵀ) A (I−QQᵀ))``. Unbiased; where ``A``'s spectrum decays (a Hessian's
    does: a few large eigenvalues, many small), the top part is taken exactly and the
    variance is that of the small remainder — for the same error, far fewer products
    than plain Hutchinson (``bench/bench_trace_estimators.py``). Needs 3 products or more.

    ``stderr`` is over the remainder's probes given ``Q``: the exact part has no
    variance, and the estimate's mean is ``tr A`` for every ``Q``, so it is the
    standard error of the estimate. Memory: ``Q`` and ``AQ`` (``2k`` vectors) besides
    the products.

    ``blocks``: each diagonal block's trace from the same products. ``tr(P_b A)`` (``P_b``
    the block's coordinates) splits as ``tr(P_b QQᵀAQQᵀ) + 2 tr(P_b QQᵀA(I−QQᵀ)) +
    tr(P_b (I−QQᵀ)A(I−QQᵀ))``: the first two are the block's coordinates of
    ``diag(Q C Qᵀ) + 2 diag(Q Rᵀ)`` (``C = QᵀAQ``, ``R = (I−QQᵀ)AQ``), exact, and the last
    is estimated as ``Σ_{i∈b} g_i [(I−QQᵀ)A(I−QQᵀ)g]_i``. Summed over the blocks the
    middle term vanishes (``QᵀR = 0``) and this is Hutch++ itself.
    """
    check_probes(num_matvecs, distribution, least=3)
    k = num_matvecs // 3
    parts = blocks or Blocks.whole(A.dim)
    sketch = torch.cat([A.matmat(probe_vectors(min(chunk, k - i), A.dim, distribution, generator, A.dtype, A.device))
                        for i in range(0, k, chunk)])  # [k, dim]
    Q = torch.linalg.qr(sketch.T).Q  # [dim, k], orthonormal columns
    del sketch
    AQ = torch.cat([A.matmat(Q[:, i:i + chunk].T.contiguous()) for i in range(0, k, chunk)]).T  # [dim, k]
    exact = parts.sums(sketched_diagonal(Q, AQ)[None])[0]  # [n_blocks]
    del AQ
    values = []
    n_rest = num_matvecs - 2 * k
    for p0 in range(0, n_rest, chunk):
        g = probe_vectors(min(chunk, n_rest - p0), A.dim, distribution, generator, A.dtype, A.device)
        projected = g - (g @ Q) @ Q.T
        w = A.matmat(projected)
        values.append(parts.sums(g * (w - (w @ Q) @ Q.T)))
    return _estimate(torch.cat(values), blocks, num_matvecs, offset=exact)


def sketched_diagonal(Q: torch.Tensor, AQ: torch.Tensor) -> torch.Tensor:
    """``[dim]``: the diagonal of ``PAP + PA(I−P) + (I−P)AP`` (``P = QQᵀ``, ``Q [dim, k]``
    orthonormal, ``AQ = A Q``, ``A`` symmetric) — the part of ``diag(A)`` that Hutch++
    takes exactly. It sums to ``tr(QᵀAQ)`` (the cross terms' traces vanish), but not block
    by block. Per coordinate ``i``: ``Σ_j Q_ij [(QC)_ij + 2 R_ij]`` with ``C = QᵀAQ`` and
    ``R = AQ − QC = (I−P)AQ``, taken over chunks of coordinates (no ``[dim, k]``
    temporaries)."""
    C = Q.T @ AQ
    C = (C + C.T) / 2  # symmetric A: QᵀAQ is, up to rounding
    rows = max(1, RESTART_CHUNK_BYTES // max(1, Q.shape[1] * Q.dtype.itemsize))
    return torch.cat([(Q[r:r + rows] * (2 * AQ[r:r + rows] - Q[r:r + rows] @ C)).sum(dim=1)
                      for r in range(0, Q.shape[0], rows)])


TRACE_ESTIMATORS = {"hutchinson": hutchinson_trace, "hutchpp": hutchpp_trace}


# ---- top eigenvalue --------------------------------------------------------------------------
@dataclass
class LanczosResult:
    """eigenvalue: the top Ritz value; iterations: products used; converged: whether the
    stopping test was met within the budget; residual: ``‖Ax − θx‖`` of the unit top
    Ritz vector; smallest_ritz_value: an upper bound on the smallest eigenvalue;
    restarts: thick restarts made; basis_size: vectors the basis held at most."""

    eigenvalue: float
    iterations: int
    converged: bool
    residual: float
    smallest_ritz_value: float
    restarts: int = 0
    basis_size: int = 0


# Extra memory of a restart's recombination of the basis (per chunk of columns), bytes.
RESTART_CHUNK_BYTES = 1 << 26


def _reorthogonalised(basis: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``w`` orthogonalised against the rows of ``basis`` by classical Gram–Schmidt, twice
    ("twice is enough"): the vector, its coefficients on the basis (both passes summed) and
    its norm."""
    h = basis @ w
    w = w - basis.T @ h
    h2 = basis @ w
    w = w - basis.T @ h2
    return w, h + h2, w.norm()


def lanczos_top_eigenvalue(A: LinearOperator, *, max_iter: int = 100, tol: float = 1e-6,
                           generator: torch.Generator | None = None, basis_size: int = 20,
                           keep: int | None = None, basis_dtype: torch.dtype | None = None,
                           basis_device: torch.device | str | None = None) -> LanczosResult:
    """Largest (algebraic) eigenvalue of a symmetric operator by thick-restart Lanczos
    (Wu & Simon 2000; in the Krylov–Schur form of Stewart 2002) with full
    reorthogonalisation against a basis of at most ``basis_size + 1`` vectors.

    Bounded memory: the basis is ``(basis_size + 1) × dim`` entries of ``basis_dtype``
    (default ``A.dtype``: a float32 model's products carry no more precision than that)
    on ``basis_device`` (default ``A.device``; ``"cpu"`` keeps it in host memory and
    moves one vector each way per product). When it is full, the ``keep`` (default
    ``basis_size // 2``) largest Ritz vectors and the last Lanczos vector start the next
    cycle — the top eigenvector's approximation is kept, so little of the convergence is
    lost (``bench/bench_lanczos.py``: the accuracy against ``eigvalsh``). With
    ``basis_size >= max_iter`` no restart happens: plain Lanczos with full
    reorthogonalisation. (Before this, the whole float64 basis of ``max_iter`` vectors
    was kept and re-stacked every product: ~69 GB for t3-768 at 100 products.)

    The projected matrix ``QᵀAQ`` is assembled from the Gram–Schmidt coefficients
    (classical, twice — "twice is enough", Kahan–Parlett) in float64 on the host. Stops
    when the top Ritz pair's residual ``‖Ax − θx‖ = β_j |s_j|`` falls below
    ``tol · |θ|``, when the Krylov space is invariant (β ≈ 0: the Ritz values are then
    exact eigenvalues of the operator), or after ``min(max_iter, dim)`` products. The start
    vector is Gaussian, drawn from ``generator``.
    """
    if max_iter < 1:
        raise UserError(f"max_iter must be >= 1, got {max_iter}")
    if basis_size < 2:
        raise UserError(f"the Lanczos basis needs at least 2 vectors, got basis_size={basis_size}")
    m = min(basis_size, A.dim)
    keep = max(1, min(m - 1, m // 2 if keep is None else keep))
    dtype = basis_dtype or A.dtype
    where = torch.device(basis_device) if basis_device is not None else A.device
    budget = min(max_iter, A.dim)
    Q = torch.empty(m + 1, A.dim, dtype=dtype, device=where)
    q = torch.randn(A.dim, generator=generator, dtype=torch.float64)
    Q[0] = (q / q.norm()).to(dtype)
    del q
    T = torch.zeros(m + 1, m + 1, dtype=torch.float64)  # the projected matrix (host)
    top, smallest, residual, converged = float("nan"), float("nan"), float("inf"), False
    products, restarts, k = 0, 0, 0
    while True:
        for j in range(k, m):
            w = A.matvec(Q[j].to(A.device, A.dtype)).to(where, dtype)
            w, h, beta = _reorthogonalised(Q[: j + 1], w)
            *coefficients, b = torch.cat([h.double(), beta.double()[None]]).tolist()  # one read
            products += 1
            T[: j + 1, j] = T[j, : j + 1] = torch.tensor(coefficients, dtype=torch.float64)
            theta, S = torch.linalg.eigh(T[: j + 1, : j + 1])
            top, smallest = float(theta[-1]), float(theta[0])
            residual = b * abs(float(S[j, -1]))
            scale = max(abs(top), 1e-30)
            if residual <= tol * scale or b <= 1e-12 * scale:
                converged = True
                break
            if products >= budget:
                break
            T[j + 1, j] = T[j, j + 1] = b
            Q[j + 1] = w / beta
        if converged or products >= budget:
            break
        # thick restart: the `keep` top Ritz vectors and the last Lanczos vector
        theta, S = torch.linalg.eigh(T[:m, :m])
        chosen = S[:, m - keep:]  # [m, keep], ascending Ritz values
        coupling = T[m, m - 1] * chosen[m - 1]  # A y_i = θ_i y_i + coupling_i q_m
        mix = chosen.T.to(where, dtype)
        cols = max(1, RESTART_CHUNK_BYTES // max(1, keep * dtype.itemsize))
        for c0 in range(0, A.dim, cols):  # Q[:keep] = Sᵀ Q[:m], a chunk of columns at a time
            Q[:keep, c0:c0 + cols] = mix @ Q[:m, c0:c0 + cols]
        Q[keep] = Q[m]
        T.zero_()
        T[:keep, :keep] = torch.diag(theta[m - keep:])
        T[:keep, keep] = T[keep, :keep] = coupling
        k = keep
        restarts += 1
    return LanczosResult(top, products, converged, residual, smallest, restarts, m + 1)
