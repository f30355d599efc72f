"""The measures of one fixed batch's loss: the trace of its Hessian (Hutchinson or
Hutch++, optionally per block) and its top eigenvalue (thin wrappers: the ``LossHessian``
operator of a ``FixedBatch`` and an estimator over it), SAM's one-step sharpness, and
Lemma 3.2's gap ``tr H − tr F`` (Hutchinson over ``Difference(LossHessian,
LossGaussNewton)``, batch after batch)."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import nn

from ...errors import UserError
from ...languages.base import Language
from ...training.data import MaskedBatch, step_generator
from .._compat import FIXED_BATCH, old_keywords
from ...models.derivatives import grads_or_zeros, measuring, select_parameters
from ...models.hessian_products import batch_loss
from .base import STREAM_DRAWS, CurvatureResult, block_table, loss_batch, parameter_blocks
from .estimators import (TRACE_ESTIMATORS, check_probes, lanczos_top_eigenvalue, mean_and_stderr,
                         probe_vectors)
from .operators import Difference, LossGaussNewton, LossHessian


@dataclass(frozen=True)
class FixedBatch:
    """The fixed batch whose loss's Hessian ``trace_hutchinson`` and ``top_eigenvalue``
    measure, and how its ``LossHessian`` takes products.

    Attributes:
        params: a regex: only the parameters whose name matches (default: all).
        batch: the fixed batch (default: ``loss_batch(language, n_sentences, mask_rate, seed)``).
        n_sentences: the batch's sentences when it is drawn here.
        mask_rate: its masking rate (``None``: one masked position per sentence).
        seed: of the batch and of the measure's own draws (probes, Lanczos' start vector).
        engine: ``auto``, ``func`` (torch.func) or ``autograd``.
        micro_batch: hold the Hessian's graph for at most this many sentences at a time
            (``LossHessian``): less memory, one more forward and backward per micro-batch and
            product chunk.
    """

    params: str | None = None
    batch: MaskedBatch | None = None
    n_sentences: int = 256
    mask_rate: float | None = 0.15
    seed: int = 0
    engine: str = "auto"
    micro_batch: int | None = None

    def resolve(self, language: Language) -> MaskedBatch:
        """The batch: the given one, else drawn from ``language``."""
        return self.batch if self.batch is not None else loss_batch(language, self.n_sentences, self.mask_rate,
                                                                    self.seed)

    def hessian(self, model: nn.Module, batch: MaskedBatch) -> LossHessian:
        """The Hessian operator of ``batch``'s loss on the selected parameters."""
        return LossHessian(model, batch, params=self.params, engine=self.engine, micro_batch=self.micro_batch)


@old_keywords("fixed", 2, FixedBatch, FIXED_BATCH)
def trace_hutchinson(model: nn.Module, language: Language, fixed: FixedBatch = FixedBatch(), *,
                     n_probes: int = 100, distribution: str = "rademacher", probe_chunk: int = 8,
                     estimator: str = "hutchinson", by_block: bool = False) -> CurvatureResult:
    """Hutchinson's estimate ``mean_v vᵀ∇²L v`` of the trace of the Hessian of the
    fixed-batch loss with the true tokens, as in the authors' released script:
    ``hutchinson_trace(LossHessian(model, batch, ...), n_probes, ...)``.

    Unbiased for that batch's Hessian at any θ (also away from saturation, where it
    differs from ``trace_fisher``). ``stderr`` is over probes only: it does not include
    the variation of the trace from batch to batch.

    Args:
        model: the MLM.
        language: where the batch comes from.
        fixed: the batch, the parameters, the engine and the micro-batch (``FixedBatch``).
        n_probes: Hessian-vector products.
        distribution: of the probe vectors: ``rademacher`` (variance ``2 Σ_{i≠j} H_ij²``,
            the smaller) or ``gaussian`` (``2‖H‖_F²``).
        probe_chunk: products vectorised together.
        estimator: ``hutchinson``, or ``hutchpp``: Hutch++ with the same ``n_probes``
            products (``hutchpp_trace``; measure ``trace_hutchpp``): a third sketch the top of
            the spectrum, which is then taken exactly — a smaller error for the same products
            where the spectrum decays, at the memory of ``2 n_probes / 3`` kept vectors.
        by_block: also the trace of each diagonal block of the Hessian — embedding, each
            layer, head — from the same products, in ``extra["blocks"]`` (they sum to the total).

    Returns:
        the estimate with its standard error, the settings and the seconds taken.
    """
    if estimator not in TRACE_ESTIMATORS:
        raise UserError(f"unknown trace estimator {estimator!r}; choose from {', '.join(TRACE_ESTIMATORS)}")
    check_probes(n_probes, distribution, least=3 if estimator == "hutchpp" else 1)
    start = time.perf_counter()
    batch = fixed.resolve(language)
    gen = step_generator(fixed.seed, 0, stream=STREAM_DRAWS)
    with measuring(model):
        H = fixed.hessian(model, batch)
        blocks = parameter_blocks(H.selection) if by_block else None
        r = TRACE_ESTIMATORS[estimator](H, n_probes, distribution=distribution, generator=gen, chunk=probe_chunk,
                                        blocks=blocks)
    settings = {"n_probes": n_probes, "distribution": distribution, "n_sentences": int(batch.inputs.shape[0]),
                "n_targets": batch.n_targets, "mask_rate": fixed.mask_rate, "seed": fixed.seed, "engine": H.engine,
                "batch_given": fixed.batch is not None, "estimator": estimator, "micro_batch": fixed.micro_batch}
    extra = {"loss": float(H.loss)}
    if blocks is not None:
        extra["blocks"] = block_table(blocks, r.blocks)
    return CurvatureResult(f"trace_{estimator}", r.estimate, r.stderr, H.dim, fixed.params, n_probes,
                           time.perf_counter() - start, settings, extra)


@old_keywords("fixed", 2, FixedBatch, FIXED_BATCH)
def top_eigenvalue(model: nn.Module, language: Language, fixed: FixedBatch = FixedBatch(), *,
                   max_iter: int = 100, tol: float = 1e-6, basis_size: int = 20,
                   basis_device: str | None = None) -> CurvatureResult:
    """Largest (algebraic) eigenvalue of the Hessian of the fixed-batch loss (``fixed``:
    ``FixedBatch``), by thick-restart Lanczos on Hessian-vector products
    (``lanczos_top_eigenvalue(LossHessian(...))``; ``n_samples`` = products used).

    Memory: a basis of ``basis_size + 1`` vectors in the model's dtype, on the model's
    device (``basis_device="cpu"``: in host memory) — not the whole Krylov basis;
    ``fixed.micro_batch`` as in ``trace_hutchinson``.

    ``extra``: ``converged``, the final Ritz ``residual`` (``‖Hx − λx‖`` of the unit
    Ritz vector; a float32 model's products limit it to about 1e-6 of λ), the
    ``smallest_ritz_value`` (an upper bound on the smallest eigenvalue: negative values
    mean the batch loss is not locally convex there) and the ``restarts`` made.
    """
    start = time.perf_counter()
    batch = fixed.resolve(language)
    gen = step_generator(fixed.seed, 1, stream=STREAM_DRAWS)
    with measuring(model):
        H = fixed.hessian(model, batch)
        out = lanczos_top_eigenvalue(H, max_iter=max_iter, tol=tol, generator=gen, basis_size=basis_size,
                                     basis_device=basis_device)
    settings = {"max_iter": max_iter, "tol": tol, "n_sentences": int(batch.inputs.shape[0]),
                "mask_rate": fixed.mask_rate, "seed": fixed.seed, "engine": H.engine, "basis_size": basis_size,
                "micro_batch": fixed.micro_batch}
    extra = {"converged": out.converged, "residual": out.residual, "smallest_ritz_value": out.smallest_ritz_value,
             "restarts": out.restarts, "loss": float(H.loss)}
    return CurvatureResult("top_eigenvalue", out.eigenvalue, None, H.dim, fixed.params, out.iterations,
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
        eps = sel.unflat((rho * g.double() / norm).to(sel.dtype))  # a zero gradient is caught below
        del g
        with torch.no_grad():
            shifted = {n: sel.values[n] + eps[n] for n in sel.names}
            perturbed = batch_loss(sel.call(model, shifted, batch.inputs), batch)
    # the one read-back
    loss_value, perturbed_value, norm_value, sharpness = torch.stack(
        [loss.detach().double(), perturbed.double(), norm, perturbed.double() - loss.detach().double()]).tolist()
    if norm_value == 0:
        raise UserError("the loss gradient is zero: SAM's ascent direction is undefined")
    settings = {"rho": rho, "n_sentences": int(batch.inputs.shape[0]), "mask_rate": mask_rate, "seed": seed}
    extra = {"loss": loss_value, "perturbed_loss": perturbed_value, "grad_norm": norm_value,
             "first_order": rho * norm_value}
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
    names = ("trace_hessian", "trace_gap", "trace_hessian_model", "trace_gap_model")
    # per-batch values stay on the device and are read back once, at the end
    per_batch: dict[str, list[torch.Tensor]] = {k: [] for k in names}
    dim = 0
    for b in range(n_batches):
        batch = loss_batch(language, n_sentences, None, seed=seed * 1009 + b)
        gen = step_generator(seed, 100 + b, stream=STREAM_DRAWS)
        # the model's own conditionals at the masked positions (dropout off), and one draw each
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                on_device = batch.to(next(model.parameters()).device)  # masked positions by index: no sync
                probs = torch.softmax(on_device.at_masked(model(on_device.inputs)).double(), -1).cpu()
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
            v = probe_vectors(n_probes, D.dim, "rademacher", gen, D.dtype, D.device)
            hv, gv = D.parts(v)
            per_batch["trace_hessian" + suffix].append((v * hv).sum(1).double().mean())
            per_batch["trace_gap" + suffix].append((v * (hv - gv)).sum(1).double().mean())
    seconds = time.perf_counter() - start
    settings = {"n_batches": n_batches, "n_sentences": n_sentences, "n_probes": n_probes, "seed": seed}
    table = torch.stack([torch.stack(per_batch[k]) for k in names]).cpu()  # the one read
    out = {}
    for name, row in zip(names, table):
        values = row.tolist()
        estimate, stderr = mean_and_stderr(row)
        out[name] = CurvatureResult(name, estimate, stderr, dim, params, n_batches * n_probes, seconds, settings,
                                    {"batches": values})
    return out
