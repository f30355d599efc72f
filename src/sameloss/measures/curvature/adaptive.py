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

How, on the transformer MLM (``_ScaledHookedBlock``): the Fisher trace's hooked path
(``fisher._HookedBlock``: one batched forward with the layers' inputs recorded by
``models.gradnorms.RecordedForward``, one batched backward per label slot, the same label
draws), with each parameter's per-example gradient assembled from what the passes saw and
scaled before it is squared. A linear layer's gradient ``Σ_t g_t a_tᵀ`` is formed per
example by one batched matrix product (``‖S ⊙ Σ_t g_t a_tᵀ‖²`` has no Gram form, unlike the
plain trace's ghost norms), so its cost is about a backward pass's weight gradient per
label slot. The tied token table, the position table, LayerNorms and biases have closed
forms (``_scaled_squares``). Elsewhere (the LSTM; ``hooks=False``): ``|θ| ⊙ ∇_θ g(θ)`` is
the gradient in ``δ`` of ``g(θ + |θ| ⊙ δ)`` at ``δ = 0``; ``ScaledSelection`` is the model
as that function of ``δ``, and the ``vmap`` path's per-example estimator
(``label_gradients.fisher_label_values``, chunks of about ``max_chunk_bytes``, no ghost
norms) runs on it unchanged. The ``autograd`` engine (models ``torch.func`` cannot
transform) loops over contexts and scales each gradient.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from torch import nn

from ...errors import UserError
from ...languages.base import Language
from ...models import gradnorms
from ...training.data import step_generator
from ...models.derivatives import (Blocks, SelectedParameters, measuring, resolve_engine,
                                   select_parameters)
from .base import STREAM_DRAWS, CurvatureResult, parameter_blocks, sample_contexts
from . import fisher
from .estimators import _mean_and_stderr_table
from .fisher import FisherContexts, _context_values, _extra, _HookedBlock, _VmapBlock


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


class _ScaledBlock(_VmapBlock):
    """``fisher._VmapBlock`` on a ``ScaledSelection``: the same label draws (a no-grad
    forward per block of contexts, the seeded host generator), per-example gradients in
    ``δ`` (no ghost norms), by ``torch.func`` or the autograd loop."""

    def __init__(self, model, sel: ScaledSelection, blocks: Blocks, one: torch.Tensor, engine: str, max_bytes: int):
        super().__init__(model, sel, blocks, one, "func", False, max_bytes)
        if engine == "autograd":
            self.fn = fisher._fisher_values_autograd  # it scales each gradient by sel.scales


# bytes of per-example linear-layer gradients formed at a time: small enough to stay in the
# CPU's cache while they are squared and summed (the isoloss tiny model's MLP layer, 256
# contexts, one thread: 8 at a time, squared in place, 2.2 ms; all 256 at once 3.8 ms, with
# out-of-place squares 10.8 ms — one measurement on the shared 2-core machine, load ~10)
_CACHED_BYTES = 2**19


def _scaled_linear(g: torch.Tensor, a: torch.Tensor, s2: torch.Tensor) -> torch.Tensor:
    """``[n]``: ``Σ_oi s²_oi (Σ_t g_to a_ti)²`` for output gradients ``g [n, T, out]`` and
    inputs ``a [n, T, in]``: each example's gradient formed by a batched product, a few
    examples at a time (``_CACHED_BYTES``), squared in place and summed against ``s²``."""
    n, rows = g.shape[0], max(1, _CACHED_BYTES // (s2.numel() * g.element_size()))
    flat = s2.reshape(-1)
    out = [(g[i:i + rows].transpose(1, 2) @ a[i:i + rows]).square_().reshape(-1, flat.numel()) @ flat
           for i in range(0, n, rows)]
    return torch.cat(out)


def _scaled_squares(forward: gradnorms.RecordedForward, g: dict[str, torch.Tensor], c: torch.Tensor,
                    fixed: dict, squares: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``{name: [n]}``: each selected parameter's ``‖s ⊙ ∇ log f_y‖²`` for one label slot, from
    the output gradients ``g`` (by module, ``[n, T, width]``) of the cotangents ``c [n, V]``
    (``e_y − f``), with ``squares[name] = s²`` (the rules of ``models.gradnorms``, scaled)."""
    per = {}
    for name, (kind, m) in forward.rules.items():
        s2 = squares[name]
        if kind == "linear.weight":  # the per-example gradient Σ_t g_t a_tᵀ, formed
            per[name] = _scaled_linear(g[m], forward.inputs[m], s2)
        elif kind in ("linear.bias", "norm.bias"):
            per[name] = (g[m].sum(dim=1).square() * s2).sum(dim=-1)
        elif kind == "norm.weight":
            per[name] = ((g[m] * fixed[("xhat", m)]).sum(dim=1).square() * s2).sum(dim=-1)
        elif kind == "position":  # row t of the table gets g_t
            per[name] = (g["tok_emb"].square() * s2[:g["tok_emb"].shape[1]]).sum(dim=(1, 2))
        elif kind == "output_bias":
            per[name] = (c.square() * s2).sum(dim=-1)
        else:  # the tied token table E: embedding part A (rows by token), decoder part B = c hᵀ
            ge, h, tokens = g["tok_emb"], fixed["h"], forward.tokens
            weighted = ge * s2[tokens]  # g_t ⊙ s²[x_t]
            aa = ((weighted @ ge.transpose(1, 2)) * fixed["same"]).sum(dim=(1, 2))
            bb = ((c.square() @ s2) * h.square()).sum(dim=-1)
            ab = (c.gather(1, tokens) * (weighted @ h[:, :, None])[..., 0]).sum(dim=-1)
            per[name] = aa + bb + 2 * ab
    return per


class _ScaledHookedBlock(_HookedBlock):
    """``fisher._HookedBlock`` (the same label draws and chunks of contexts) with the squared
    norms of the scaled gradients (``_scaled_squares``) in place of the plain ones."""

    def __init__(self, model, sel: ScaledSelection, blocks: Blocks, one: torch.Tensor, max_bytes: int):
        super().__init__(model, sel.base, blocks, one, max_bytes)
        self.squares = {n: s.square() for n, s in sel.scales.items()}

    def _fixed(self, forward: gradnorms.RecordedForward, rows: torch.Tensor, positions: torch.Tensor) -> dict:
        """What every label slot shares: the LayerNorms' normalised inputs, the decoder's input
        at the predicted position, which positions hold the same token."""
        fixed: dict = {}
        modules = dict(self.model.named_modules())
        for kind, m in set(forward.rules.values()):
            if kind == "norm.weight":
                x, eps = forward.inputs[m], modules[m].eps
                centred = x - x.mean(dim=-1, keepdim=True)
                fixed[("xhat", m)] = centred * torch.rsqrt(centred.square().mean(dim=-1, keepdim=True) + eps)
            elif kind == "token":
                fixed["h"] = forward.decoder_in[rows, positions]  # [n, d]
                fixed["same"] = (forward.tokens[:, :, None] == forward.tokens[:, None, :]).to(forward.logits.dtype)
        return fixed

    def _values(self, forward: gradnorms.RecordedForward, positions, labels, weights) -> torch.Tensor:
        if labels.device.type == "meta" and fisher.META_LABEL_SLOTS[0] is not None:  # as _HookedBlock
            labels, weights = labels[:, :fisher.META_LABEL_SLOTS[0]], weights[:, :fisher.META_LABEL_SLOTS[0]]
        n, k = labels.shape
        rows = torch.arange(n, device=labels.device)
        z = forward.logits[rows, positions]  # [n, V]
        f = torch.softmax(z, dim=-1).detach()
        targets = {m: forward.outputs[m] for kind, m in forward.rules.values() if kind.startswith(("linear", "norm"))}
        if any(kind in ("token", "position") for kind, _ in forward.rules.values()):
            targets["tok_emb"] = forward.outputs["tok_emb"]
        fixed = self._fixed(forward, rows, positions)
        onehot = torch.nn.functional.one_hot(labels.T, z.shape[-1]).to(z.dtype)  # [k, n, V]
        out = torch.zeros(n, len(self.blocks.names), dtype=torch.float64, device=z.device)
        for j in range(k):
            c = onehot[j] - f
            grads = torch.autograd.grad(z, list(targets.values()), grad_outputs=c, retain_graph=j < k - 1,
                                        allow_unused=True) if targets else ()
            g = {m: x if x is not None else torch.zeros_like(targets[m]) for m, x in zip(targets, grads)}
            per = _scaled_squares(forward, g, c, fixed, self.squares)
            for name, b in zip(self.sel.names, self.blocks.of):
                out[:, b] += weights[:, j].double() * per[name].detach().double()
            del grads, g, per  # before the next slot's backward: one slot's gradients alive at a time
        return out


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
            engine (``func`` or ``autograd``), ``hooks`` (the batched path on the
            transformer MLM; else ``vmap``) and chunks, as for ``trace_fisher``; its
            ``ghost_norms`` does not apply (per-example gradients are formed).
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
    use_hooks = engine == "func" and contexts.hooks and gradnorms.covers(model, sel.names)
    per_repeat: list[torch.Tensor] = []
    n_grads = 0
    with measuring(model):
        for r in range(repeats):
            ctx = contexts.batch if contexts.batch is not None else \
                sample_contexts(language, contexts.n_contexts, contexts.seed, r)
            gen = step_generator(contexts.seed, r, stream=STREAM_DRAWS)
            one = ctx.inputs[:1].to(sel.device)
            step = _ScaledHookedBlock(model, sel, blocks, one, contexts.max_chunk_bytes) if use_hooks else \
                _ScaledBlock(model, sel, blocks, one, engine, contexts.max_chunk_bytes)
            values, grads = _context_values(step, ctx, sel, contexts.block_size, n_labels, gen)
            per_repeat.append(values)
            n_grads += grads
    everything = torch.cat(per_repeat)
    (estimate, stderr), *per_block = _mean_and_stderr_table(torch.cat([everything.sum(dim=1, keepdim=True),
                                                                       everything], dim=1))
    extra = _extra(n_grads, blocks if by_block else None, per_block, per_repeat)
    settings = {"n_contexts": int(per_repeat[0].shape[0]), "n_labels": n_labels, "repeats": repeats,
                "seed": contexts.seed, "engine": engine, "hooks": use_hooks, "contexts_given": contexts.batch is not None,
                "scale": getattr(scale, "__name__", repr(scale))}
    return CurvatureResult("adaptive_trace", estimate, stderr, sel.n_params, contexts.params,
                           int(everything.shape[0]), time.perf_counter() - start, settings, extra)
