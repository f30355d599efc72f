"""A flatness that a rescaling cannot fake: the adaptive trace ``tr(T F T)``, ``T = diag(|θ|)``.

The paper's trace (``trace_fisher``) can be lowered without changing the function: where a
diagonal rescaling ``θ → Aθ`` leaves the model as it is (queries × c and keys / c; values
× c and the output projection's weight / c; in a pre-LN block a LayerNorm's gain and bias
× c and the next layer's weight / c), the gradient becomes ``A⁻¹∇``, and the trace moves
by the squares of ``A``'s entries. The adaptive sharpness of Kwon et al. (2021, ASAM) and
Andriushchenko et al. (2023) measures the loss in a neighbourhood scaled by ``|θ|``; its
average case, ``E_{δ∼N(0, σ²I)} L(θ + |θ| ⊙ δ) − L(θ)``, is ``σ²/2 · tr(T H T)`` to second
order (the first-order term has mean zero). Near a minimum ``H ≈ F`` (the Bartlett
identity, the paper's Lemma 3.2), and this module estimates, in the form of the paper's
estimator (App. B.1),

    ``adaptive_trace = tr(T F T) = E_{t, x₋ₜ} E_{y ∼ f_θ(x₋ₜ)} ‖ |θ| ⊙ ∇_θ log f_θ(x₋ₜ)_y ‖²``

with the contexts and the labels ``trace_fisher`` draws for the same ``FisherContexts``,
seed, ``n_labels`` and ``repeats`` (the same streams, the same label draws), so the two
are comparable checkpoint by checkpoint.

Why it is invariant. If ``f(Aθ) = f(θ)`` for every ``θ`` (``A`` diagonal, entries
nonzero), then ``∇f(Aθ) = A⁻¹∇f(θ)`` and ``|Aθ| ⊙ ∇f(Aθ) = |θ| ⊙ ∇f(θ)`` entry by entry:
every squared norm, hence every context's value and the estimate, is unchanged (to
rounding; ``tests/measures/test_adaptive_trace.py`` rescales a transformer both ways).

How. ``|θ| ⊙ ∇_θ g(θ)`` is the gradient in ``δ`` of ``g(θ + |θ| ⊙ δ)`` at ``δ = 0``:
``ScaledSelection`` is the model as that function of ``δ``, and the per-example
estimator of ``trace_fisher``'s ``vmap`` path (``label_gradients.fisher_label_values``:
one forward, the labels' backward passes batched, contexts vectorised, chunks of about
``max_chunk_bytes``) runs on it unchanged. The ghost norms of linear layers do not carry
over (``‖S ⊙ Σ_t g_t a_tᵀ‖²`` has no Gram form): per-example gradients are formed, in
chunks; on the isoloss tiny model that costs about as much as the Fisher trace
(``bench/bench_measures.py``). The ``autograd`` engine (models ``torch.func`` cannot
transform) loops over contexts and scales each gradient.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from torch import nn

from ...errors import UserError
from ...languages.base import Language
from ...training.data import step_generator
from .base import (STREAM_DRAWS, Blocks, CurvatureResult, SelectedParameters, grads_or_zeros, measuring,
                   parameter_blocks, resolve_engine, sample_contexts, select_parameters)
from .estimators import _mean_and_stderr_table
from .fisher import FisherContexts, _context_values, _extra, _VmapBlock


class ScaledSelection:
    """The selected parameters ``θ₀`` as the point ``δ = 0`` of ``θ = θ₀ + s ⊙ δ`` (``s =
    scale(θ₀)``, per parameter; ``|θ₀|`` by default): ``values`` are the zeros ``δ``,
    ``call`` runs the model at ``θ₀ + s ⊙ δ``, so a gradient in ``values`` is ``s ⊙ ∇_θ``.
    It offers what ``fisher_label_values`` and the estimator's blocks read of a
    ``SelectedParameters`` (names, sizes, dtype, device, ``call``); ``tensors`` are the live
    parameters and ``scales`` the ``s`` (for the autograd engine)."""

    def __init__(self, sel: SelectedParameters, scale: Callable[[torch.Tensor], torch.Tensor] = torch.abs):
        self.base = sel
        self.names, self.sizes, self.shapes, self.n_params = sel.names, sel.sizes, sel.shapes, sel.n_params
        self.tensors, self.dtype, self.device, self.pattern = sel.tensors, sel.dtype, sel.device, sel.pattern
        self.live = False
        self.scales = {n: scale(v.detach()) for n, v in sel.values.items()}
        self.values = {n: torch.zeros_like(v) for n, v in sel.values.items()}

    def call(self, model: nn.Module, values: dict[str, torch.Tensor], tokens: torch.Tensor) -> torch.Tensor:
        """``model(tokens)`` at ``θ₀ + s ⊙ δ`` (``values``: the ``δ``)."""
        theta = {n: self.base.values[n] + self.scales[n] * d for n, d in values.items()}
        return self.base.call(model, theta, tokens)


def _scaled_values_autograd(model: nn.Module, sel: ScaledSelection, tokens: torch.Tensor, positions: torch.Tensor,
                            labels: torch.Tensor, weights: torch.Tensor, linears: dict | None = None,
                            blocks: Blocks | None = None) -> torch.Tensor:
    """Per-context ``Σ_j w_j ‖s ⊙ ∇_θ log f_θ(x)_{y_j}‖²`` per block, with plain autograd: a
    loop over contexts, one backward per distinct label (``fisher._fisher_values_autograd``
    with each gradient scaled)."""
    blocks = blocks or Blocks.whole(sel.sizes)
    scales = torch.cat([sel.scales[n].reshape(-1) for n in sel.names])
    out = torch.zeros(tokens.shape[0], len(blocks.names), dtype=torch.float64, device=tokens.device)
    for i, (row_labels, row_weights) in enumerate(zip(labels.tolist(), weights.tolist())):
        logp = torch.log_softmax(model(tokens[i:i + 1])[0, positions[i]], dim=-1)
        for y, w in zip(row_labels, row_weights):
            if w == 0:
                continue
            grads = grads_or_zeros(torch.autograd.grad(logp[y], sel.tensors, retain_graph=True, allow_unused=True),
                                   sel.tensors)
            out[i] += w * blocks.sums((scales * torch.cat([g.reshape(-1) for g in grads])).square()[None])[0]
    return out


class _ScaledBlock(_VmapBlock):
    """``fisher._VmapBlock`` on a ``ScaledSelection``: the same label draws (a no-grad
    forward per block of contexts, the seeded host generator), per-example gradients in
    ``δ`` (no ghost norms), by ``torch.func`` or the autograd loop."""

    def __init__(self, model, sel: ScaledSelection, blocks: Blocks, one: torch.Tensor, engine: str, max_bytes: int):
        super().__init__(model, sel, blocks, one, "func", False, max_bytes)
        if engine == "autograd":
            self.fn = _scaled_values_autograd


def adaptive_trace(model: nn.Module, language: Language, contexts: FisherContexts = FisherContexts(), *,
                   n_labels: int | None = 50, repeats: int = 1, by_block: bool = False,
                   scale: Callable[[torch.Tensor], torch.Tensor] = torch.abs) -> CurvatureResult:
    """The adaptive trace ``tr(T F T) = E_{t,x₋ₜ} E_{y∼f} ‖ |θ| ⊙ ∇_θ log f_θ(x₋ₜ)_y ‖²``
    (``T = diag(|θ|)``; the module docstring): ``trace_fisher``'s estimator on the rescaled
    gradients, with its contexts and labels.

    Args:
        model: the MLM (in eval mode for the measure).
        language: where the contexts come from.
        contexts: the contexts, parameters (``params``: ``T`` covers the selection only),
            engine (``func`` or ``autograd``) and chunks, as for ``trace_fisher``; its
            ``ghost_norms`` and ``hooks`` do not apply (per-example gradients are formed).
        n_labels: labels drawn per context from the model (``None``: the exact expectation
            over the vocabulary).
        repeats: independent sets of contexts and labels; each set's estimate and their std
            in ``extra`` as for ``trace_fisher``.
        by_block: also each block's share (embedding, layer<i>, head) in ``extra["blocks"]``.
        scale: ``T``'s diagonal from the weights, per parameter tensor (``torch.abs``;
            ``torch.ones_like`` gives ``trace_fisher``'s value with the same draws).

    Returns:
        the estimate with its standard error (over contexts), the settings and the seconds.
    """
    if n_labels is not None and n_labels < 1:
        raise UserError(f"n_labels must be >= 1 or None (exact), got {n_labels}")
    if repeats < 1:
        raise UserError(f"repeats must be >= 1, got {repeats}")
    start = time.perf_counter()
    engine = resolve_engine(model, contexts.engine)
    sel = ScaledSelection(select_parameters(model, contexts.params), scale)
    if contexts.batch is not None and not bool((contexts.batch.masked.sum(dim=1) == 1).all()):
        raise UserError("contexts must have exactly one masked position per sentence")
    blocks = parameter_blocks(sel) if by_block else Blocks.whole(sel.sizes)
    per_repeat: list[torch.Tensor] = []
    n_grads = 0
    with measuring(model):
        for r in range(repeats):
            ctx = contexts.batch if contexts.batch is not None else \
                sample_contexts(language, contexts.n_contexts, contexts.seed, r)
            gen = step_generator(contexts.seed, r, stream=STREAM_DRAWS)
            step = _ScaledBlock(model, sel, blocks, ctx.inputs[:1].to(sel.device), engine, contexts.max_chunk_bytes)
            values, grads = _context_values(step, ctx, sel, contexts.block_size, n_labels, gen)
            per_repeat.append(values)
            n_grads += grads
    everything = torch.cat(per_repeat)
    (estimate, stderr), *per_block = _mean_and_stderr_table(torch.cat([everything.sum(dim=1, keepdim=True),
                                                                       everything], dim=1))
    extra = _extra(n_grads, blocks if by_block else None, per_block, per_repeat)
    settings = {"n_contexts": int(per_repeat[0].shape[0]), "n_labels": n_labels, "repeats": repeats,
                "seed": contexts.seed, "engine": engine, "contexts_given": contexts.batch is not None,
                "scale": getattr(scale, "__name__", repr(scale))}
    return CurvatureResult("adaptive_trace", estimate, stderr, sel.n_params, contexts.params,
                           int(everything.shape[0]), time.perf_counter() - start, settings, extra)
