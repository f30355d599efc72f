"""The measures of one fixed batch's loss: Hutchinson's trace and the top eigenvalue of
its Hessian (thin wrappers: a ``LossHessian`` operator and an estimator over it), and
SAM's one-step sharpness."""

from __future__ import annotations

import time

import torch
from torch import nn

from ...errors import UserError
from ...languages.base import Language
from ...training.data import MaskedBatch, step_generator
from .base import (STREAM_DRAWS, CurvatureResult, batch_loss, grads_or_zeros, loss_batch, measuring,
                   select_parameters)
from .estimators import check_probes, hutchinson_trace, lanczos_top_eigenvalue
from .operators import LossHessian


def trace_hutchinson(model: nn.Module, language: Language, *, n_probes: int = 100,
                     distribution: str = "rademacher", params: str | None = None,
                     batch: MaskedBatch | None = None, n_sentences: int = 256,
                     mask_rate: float | None = 0.15, seed: int = 0, probe_chunk: int = 8,
                     engine: str = "auto") -> CurvatureResult:
    """Hutchinson's estimate ``mean_v vᵀ∇²L v`` of the trace of the Hessian of the
    fixed-batch loss (true tokens; ``loss_batch(language, n_sentences, mask_rate, seed)``
    unless ``batch`` is given), as in the authors' released script:
    ``hutchinson_trace(LossHessian(model, batch, ...), n_probes, ...)``.

    Unbiased for that batch's Hessian at any θ (also away from saturation, where it
    differs from ``trace_fisher``). ``stderr`` is over probes only: it does not include
    the variation of the trace from batch to batch. ``distribution``: ``"rademacher"``
    (variance ``2 Σ_{i≠j} H_ij²``, the smaller) or ``"gaussian"`` (``2‖H‖_F²``).
    ``probe_chunk`` products are vectorised together.
    """
    check_probes(n_probes, distribution)
    start = time.perf_counter()
    batch_given = batch is not None
    if batch is None:
        batch = loss_batch(language, n_sentences, mask_rate, seed)
    gen = step_generator(seed, 0, stream=STREAM_DRAWS)
    with measuring(model):
        H = LossHessian(model, batch, params=params, engine=engine)
        estimate, stderr = hutchinson_trace(H, n_probes, distribution=distribution, generator=gen,
                                            chunk=probe_chunk)
    settings = {"n_probes": n_probes, "distribution": distribution, "n_sentences": int(batch.inputs.shape[0]),
                "n_targets": int(batch.masked.sum()), "mask_rate": mask_rate, "seed": seed, "engine": H.engine,
                "batch_given": batch_given}
    return CurvatureResult("trace_hutchinson", estimate, stderr, H.dim, params, n_probes,
                           time.perf_counter() - start, settings, {"loss": float(H.loss)})


def top_eigenvalue(model: nn.Module, language: Language, *, params: str | None = None,
                   batch: MaskedBatch | None = None, n_sentences: int = 256,
                   mask_rate: float | None = 0.15, seed: int = 0, max_iter: int = 100,
                   tol: float = 1e-6, engine: str = "auto") -> CurvatureResult:
    """Largest (algebraic) eigenvalue of the Hessian of the fixed-batch loss, by Lanczos
    on Hessian-vector products (``lanczos_top_eigenvalue(LossHessian(...))``;
    ``n_samples`` = iterations used).

    ``extra``: ``converged``, the final Ritz ``residual`` (``‖Hx − λx‖`` of the unit
    Ritz vector; a float32 model's products limit it to about 1e-6 of λ) and the
    ``smallest_ritz_value`` (an upper bound on the smallest eigenvalue: negative values
    mean the batch loss is not locally convex there).
    """
    start = time.perf_counter()
    if batch is None:
        batch = loss_batch(language, n_sentences, mask_rate, seed)
    gen = step_generator(seed, 1, stream=STREAM_DRAWS)
    with measuring(model):
        H = LossHessian(model, batch, params=params, engine=engine)
        out = lanczos_top_eigenvalue(H, max_iter=max_iter, tol=tol, generator=gen)
    settings = {"max_iter": max_iter, "tol": tol, "n_sentences": int(batch.inputs.shape[0]),
                "mask_rate": mask_rate, "seed": seed, "engine": H.engine}
    extra = {"converged": out.converged, "residual": out.residual, "smallest_ritz_value": out.smallest_ritz_value,
             "loss": float(H.loss)}
    return CurvatureResult("top_eigenvalue", out.eigenvalue, None, H.dim, params, out.iterations,
                           time.perf_counter() - start, settings, extra)


def sam_sharpness(model: nn.Module, language: Language, *, rho: float = 0.05, params: str | None = None,
                  batch: MaskedBatch | None = None, n_sentences: int = 256,
                  mask_rate: float | None = 0.15, seed: int = 0) -> CurvatureResult:
    """SAM's sharpness ``max_{‖ε‖≤ρ} L(θ+ε) − L(θ)`` in its one-step form (Foret et al.):
    ``ε = ρ g/‖g‖`` with ``g`` the gradient of the fixed-batch loss over the selected
    parameters, ``L`` evaluated on the same batch.

    ``extra``: both losses, ``‖g‖`` and the first-order prediction ``ρ‖g‖`` (the
    sharpness minus it is ≈ ½ρ² ĝᵀ∇²L ĝ, the curvature along the gradient).
    """
    if rho <= 0:
        raise UserError(f"rho must be positive, got {rho}")
    start = time.perf_counter()
    sel = select_parameters(model, params)
    if batch is None:
        batch = loss_batch(language, n_sentences, mask_rate, seed)
    batch = batch.to(sel.device)
    with measuring(model):
        loss = batch_loss(model(batch.inputs), batch)
        g = sel.flat(grads_or_zeros(torch.autograd.grad(loss, sel.tensors, allow_unused=True), sel.tensors))
        norm = g.double().norm()
        if norm == 0:
            raise UserError("the loss gradient is zero: SAM's ascent direction is undefined")
        eps = sel.unflat((rho * g.double() / norm).to(sel.dtype))
        with torch.no_grad():
            shifted = {n: sel.values[n] + eps[n] for n in sel.names}
            perturbed = batch_loss(sel.call(model, shifted, batch.inputs), batch)
    sharpness = float(perturbed.double() - loss.detach().double())
    settings = {"rho": rho, "n_sentences": int(batch.inputs.shape[0]), "mask_rate": mask_rate, "seed": seed}
    extra = {"loss": float(loss.detach()), "perturbed_loss": float(perturbed), "grad_norm": float(norm),
             "first_order": float(rho * norm)}
    return CurvatureResult("sam_sharpness", sharpness, None, sel.n_params, params, int(batch.inputs.shape[0]),
                           time.perf_counter() - start, settings, extra)
