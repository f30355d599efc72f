"""Curvature matrices as linear operators: known only through their products with
vectors, so that trace and eigenvalue estimators (``estimators.py``) work on any of
them — the loss Hessian of a model, or a dense matrix in a test — as in curvlinops.
``LinearOperator`` and ``LossHessian`` live in ``models.hessian_products`` (the flatness
penalty differentiates the Hessian's products too); the others are here.

Vectors are flat, of length ``dim``. ``matmat`` takes a batch of them *as rows*
(``[k, dim]``, batch first as ``torch.func.vmap``) and returns ``A v`` for each row;
``A @ x`` is the usual product (``x`` a vector, or a ``[dim, k]`` matrix of columns).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.func import vjp, vmap

from ...models.hessian_products import LinearOperator, LossHessian
from ...training.data import MaskedBatch
from ...models.derivatives import measuring, select_parameters

__all__ = ["Difference", "LinearOperator", "LossGaussNewton", "LossHessian", "MatrixOperator"]


class MatrixOperator(LinearOperator):
    """An explicit square matrix as an operator."""

    def __init__(self, matrix: torch.Tensor):
        if matrix.dim() != 2 or matrix.shape[0] != matrix.shape[1]:
            raise ValueError(f"need a square matrix, got shape {tuple(matrix.shape)}")
        self.matrix = matrix
        self.dim = matrix.shape[0]
        self.dtype, self.device = matrix.dtype, matrix.device

    def _matmat(self, vectors: torch.Tensor) -> torch.Tensor:
        return vectors @ self.matrix.T


class LossGaussNewton(LinearOperator):
    """The Gauss–Newton matrix ``G = (1/M) Σ_i J_iᵀ (diag f_i − f_i f_iᵀ) J_i`` of the same
    fixed-batch loss as ``LossHessian`` (``J_i`` the Jacobian of the logits at masked
    position ``i``, ``f_i`` their softmax, ``M`` the masked positions): the part of the
    Hessian that does not depend on the labels. For softmax cross-entropy it equals the
    Fisher with labels drawn from the model, so ``tr G`` is what ``trace_fisher`` estimates
    on this batch, and ``LossHessian − LossGaussNewton`` (``Difference``) is the residual
    ``(1/M) Σ_i Σ_y (f_iy − 1[y = target_i]) ∇²z_iy`` whose trace is Lemma 3.2's gap:
    zero in expectation when the targets follow the model (Bartlett identity).

    Products are forward-over-reverse: ``Jv`` by ``jvp`` (vmapped over rows), then
    ``Jᵀu`` by the pullback of one ``vjp``; ``engine`` only picks how (``func``: needs
    forward AD through the model, as every model here has on the math attention kernel)."""

    def __init__(self, model: nn.Module, batch: MaskedBatch, *, params: str | None = None):
        from torch.func import jvp

        sel = self.selection = select_parameters(model, params)
        self.dim, self.dtype, self.device = sel.n_params, sel.dtype, sel.device
        n_targets = batch.n_targets
        batch = batch.to(sel.device)
        self._model = model

        def logits_fn(values):
            z = batch.at_masked(sel.call(model, values, batch.inputs))
            return z.float() if z.dtype in (torch.float16, torch.bfloat16) else z

        with measuring(model):
            z, self._pullback = vjp(logits_fn, sel.values)
        self._f = torch.softmax(z.detach(), dim=-1)
        self._scale = 1.0 / n_targets
        self._logits_fn = logits_fn
        self._jvp = jvp

    def _matmat(self, vectors: torch.Tensor) -> torch.Tensor:
        sel, f = self.selection, self._f

        def one(v):
            _, jv = self._jvp(self._logits_fn, (sel.values,), (sel.unflat(v),))
            u = f * jv - f * (f * jv).sum(dim=-1, keepdim=True)
            return sel.flat(self._pullback(u * self._scale)[0])

        with measuring(self._model):
            return vmap(one)(vectors).detach()


class Difference(LinearOperator):
    """``A − B`` for two operators on the same space (e.g. ``LossHessian − LossGaussNewton``):
    a Hutchinson estimate of its trace uses the same probes for both, so what the two
    share (most of the probe variance of ``A``) cancels."""

    def __init__(self, a: LinearOperator, b: LinearOperator):
        if a.dim != b.dim:
            raise ValueError(f"operators of different sizes: {a.dim} and {b.dim}")
        self.a, self.b = a, b
        self.dim, self.dtype, self.device = a.dim, a.dtype, a.device

    def parts(self, vectors: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(A V, B V)``: both products, for an estimator that wants ``tr A`` from the same
        probes too (one product of each)."""
        return self.a.matmat(vectors), self.b.matmat(vectors)

    def _matmat(self, vectors: torch.Tensor) -> torch.Tensor:
        av, bv = self.parts(vectors)
        return av - bv
