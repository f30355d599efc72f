"""The measures of one fixed batch's loss: Hutchinson's trace and the top eigenvalue of
its Hessian (thin wrappers: a ``LossHessian`` operator and an estimator over it), SAM's
one-step sharpness, and Lemma 3.2's gap ``tr H − tr F`` (Hutchinson over
``Difference(LossHessian, LossGaussNewton)``, batch after batch)."""

from __future__ import annotations

import time

import torch
from torch import nn

from ...errors import UserError
from ...languages.base import Language
from ...training.data import MaskedBatch, step_generator
from .base import (STREAM_DRAWS, CurvatureResult, batch_loss, grads_or_zeros, loss_batch, measuring,
                   select_parameters)
from .estimators import check_probes, hutchinson_trace, lanczos_top_eigenvalue, mean_and_stderr, probe_vectors
from .operators import Difference, LossGaussNewton, LossHessian


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


def trace_hessian_gap(model: nn.Module, language: Language, *, n_batches: int = 8, n_sentences: int = 128,
                      n_probes: int = 8, params: str | None = None, seed: int = 0,
                      engine: str = "auto") -> dict[str, CurvatureResult]:
    """Lemma 3.2's gap between the Hessian and the Fisher, over ``n_batches`` independent
    batches of ``n_sentences`` sentences with one masked position each (``loss_batch``,
    seeds ``seed·1009 + b``), each with its own ``n_probes`` Rademacher probes:

    ``trace_hessian``  Hutchinson's trace of the Hessian of the loss of the true tokens;
    ``trace_gap``      Hutchinson's trace of ``Difference(LossHessian, LossGaussNewton)``
                       on the same probes: ``tr H − tr F`` (the Gauss–Newton matrix of
                       softmax cross-entropy is the Fisher), without the probe noise the
                       two share;
    ``…_model``        the same with each target replaced by a draw from the model's own
                       conditional (the well-specified case: the gap is 0 in expectation).

    Each result's ``estimate`` is the mean over batches of the batch's probe mean and its
    ``stderr`` the standard error over batches (so it includes the batch-to-batch
    variation of the trace); ``extra["batches"]`` holds the per-batch values.
    """
    if n_batches < 2:
        raise UserError(f"the gap's standard error needs at least 2 batches, got {n_batches}")
    check_probes(n_probes, "rademacher")
    start = time.perf_counter()
    per_batch: dict[str, list[float]] = {k: [] for k in ("trace_hessian", "trace_gap", "trace_hessian_model",
                                                         "trace_gap_model")}
    dim = 0
    for b in range(n_batches):
        batch = loss_batch(language, n_sentences, None, seed=seed * 1009 + b)
        gen = step_generator(seed, 100 + b, stream=STREAM_DRAWS)
        # the model's own conditionals at the masked positions (dropout off), and one draw each
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                device = next(model.parameters()).device
                probs = torch.softmax(model(batch.inputs.to(device))[batch.masked.to(device)].double(), -1).cpu()
        finally:
            model.train(was_training)
        drawn = torch.multinomial(probs, 1, generator=gen)[:, 0]
        targets = batch.targets.clone()
        targets[batch.masked] = drawn
        model_batch = MaskedBatch(batch.inputs, targets, batch.masked)
        for suffix, bt in (("", batch), ("_model", model_batch)):
            D = Difference(LossHessian(model, bt, params=params, engine=engine),
                           LossGaussNewton(model, bt, params=params))
            dim = D.dim
            v = probe_vectors(n_probes, D.dim, "rademacher", gen, D.dtype).to(D.device)
            hv, gv = D.parts(v)
            per_batch["trace_hessian" + suffix].append(float((v * hv).sum(1).double().mean()))
            per_batch["trace_gap" + suffix].append(float((v * (hv - gv)).sum(1).double().mean()))
    seconds = time.perf_counter() - start
    settings = {"n_batches": n_batches, "n_sentences": n_sentences, "n_probes": n_probes, "seed": seed}
    out = {}
    for name, values in per_batch.items():
        estimate, stderr = mean_and_stderr(torch.tensor(values, dtype=torch.float64))
        out[name] = CurvatureResult(name, estimate, stderr, dim, params, n_batches * n_probes, seconds, settings,
                                    {"batches": values})
    return out
