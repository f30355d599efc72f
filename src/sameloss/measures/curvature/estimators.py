"""Matrix-free estimators over any ``LinearOperator`` (``operators.py``): Hutchinson's
trace and the top eigenvalue by Lanczos. They see the operator only through
``matmat``/``matvec``, ``dim``, ``dtype`` and ``device``."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ...errors import UserError
from .operators import LinearOperator

DISTRIBUTIONS = ("rademacher", "gaussian")


def mean_and_stderr(values: torch.Tensor) -> tuple[float, float | None]:
    """Mean of i.i.d. samples and its standard error (``None`` for one sample)."""
    values = values.double()
    n = values.numel()
    mean = float(values.mean())
    if n < 2:
        return mean, None
    return mean, float(values.std() / math.sqrt(n))


def check_probes(num_matvecs: int, distribution: str) -> None:
    if distribution not in DISTRIBUTIONS:
        raise UserError(f"probe distribution must be 'rademacher' or 'gaussian', got {distribution!r}")
    if num_matvecs < 1:
        raise UserError(f"the number of probes must be >= 1, got {num_matvecs}")


def probe_vectors(n: int, dim: int, distribution: str, generator: torch.Generator | None,
                  dtype: torch.dtype) -> torch.Tensor:
    """``[n, dim]`` i.i.d. probes with ``E vvᵀ = I``: ±1 entries, or standard normal ones
    (drawn in float64 whatever ``dtype``)."""
    if distribution == "rademacher":
        return (torch.randint(0, 2, (n, dim), generator=generator) * 2 - 1).to(dtype)
    return torch.randn(n, dim, generator=generator, dtype=torch.float64).to(dtype)


def hutchinson_trace(A: LinearOperator, num_matvecs: int, *, distribution: str = "rademacher",
                     generator: torch.Generator | None = None, chunk: int = 8) -> tuple[float, float | None]:
    """Hutchinson's estimate of ``tr A``: the mean of ``vᵀAv`` over ``num_matvecs``
    probes, and its standard error (``None`` for one probe).

    Unbiased for any square ``A``. Per-probe variance: ``2 Σ_{i≠j} A_ij²`` for
    ``"rademacher"`` probes (so exact for a diagonal ``A``), ``2‖A‖_F²`` for
    ``"gaussian"`` ones (symmetric ``A``). Probes are drawn from ``generator`` (``None``:
    torch's global one), ``chunk`` at a time, each chunk one ``A.matmat``.
    """
    check_probes(num_matvecs, distribution)
    quad = []
    for p0 in range(0, num_matvecs, chunk):
        v = probe_vectors(min(chunk, num_matvecs - p0), A.dim, distribution, generator, A.dtype).to(A.device)
        quad.append((v * A.matmat(v)).sum(dim=1).double().cpu())
    return mean_and_stderr(torch.cat(quad))


@dataclass
class LanczosResult:
    """eigenvalue: the top Ritz value; iterations: products used; converged: whether the
    stopping test was met within the budget; residual: ``‖Ax − θx‖`` of the unit top
    Ritz vector; smallest_ritz_value: an upper bound on the smallest eigenvalue."""

    eigenvalue: float
    iterations: int
    converged: bool
    residual: float
    smallest_ritz_value: float


def lanczos_top_eigenvalue(A: LinearOperator, *, max_iter: int = 100, tol: float = 1e-6,
                           generator: torch.Generator | None = None) -> LanczosResult:
    """Largest (algebraic) eigenvalue of a symmetric operator by Lanczos with full
    reorthogonalisation (the basis is kept, ``max_iter × dim`` float64 entries), from a
    Gaussian start vector drawn from ``generator``.

    Stops when the top Ritz pair's residual ``‖Ax − θx‖ = β_j |s_j|`` falls below
    ``tol · |θ|``, or when the Krylov space is invariant (β ≈ 0: the Ritz values are
    then exact eigenvalues of the operator), or after ``min(max_iter, dim)`` products.
    The products are taken in ``A.dtype``, the recurrence in float64.
    """
    if max_iter < 1:
        raise UserError(f"max_iter must be >= 1, got {max_iter}")
    q = torch.randn(A.dim, generator=generator, dtype=torch.float64).to(A.device)
    q /= q.norm()
    basis = [q]
    alphas: list[float] = []
    betas: list[float] = []
    top, smallest, residual, converged = float("nan"), float("nan"), float("inf"), False
    for _ in range(min(max_iter, A.dim)):
        w = A.matvec(basis[-1].to(A.dtype)).double()
        alpha = float(basis[-1] @ w)
        alphas.append(alpha)
        Q = torch.stack(basis)
        for _pass in range(2):  # twice is enough (Kahan–Parlett)
            w = w - Q.T @ (Q @ w)
        beta = float(w.norm())
        T = torch.diag(torch.tensor(alphas, dtype=torch.float64))
        if betas:
            off = torch.tensor(betas, dtype=torch.float64)
            T += torch.diag(off, 1) + torch.diag(off, -1)
        theta, S = torch.linalg.eigh(T)
        top, smallest = float(theta[-1]), float(theta[0])
        residual = beta * abs(float(S[-1, -1]))
        if residual <= tol * max(abs(top), 1e-30) or beta <= 1e-12 * max(abs(top), 1e-30):
            converged = True
            break
        betas.append(beta)
        basis.append(w / beta)
    return LanczosResult(top, len(alphas), converged, residual, smallest)
