"""The paper's estimator of the trace of the Hessian (App. B.1): the trace of the Fisher,
``E_{t, x₋ₜ} E_{y ∼ f_θ(x₋ₜ)} ‖∇_θ log f_θ(x₋ₜ)_y‖²``, with contexts from the language
and labels sampled from the model."""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import partial

import torch
from torch import nn

from ...errors import UserError
from ...languages.base import Language
from ...models import gradnorms
from ...models.label_gradients import fisher_label_values, ghost_linears
from ...training.data import MaskedBatch, step_generator
from .._compat import FISHER_CONTEXTS, old_keywords
from ...models.derivatives import (Blocks, SelectedParameters, grads_or_zeros, measuring, resolve_engine,
                                   select_parameters)
from .base import STREAM_DRAWS, CurvatureResult, block_table, map_in_chunks, parameter_blocks, sample_contexts
from .estimators import _mean_and_stderr_table


def _draw_labels(probs: torch.Tensor, n_labels: int | None, gen: torch.Generator
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Labels and weights ``[n, k]`` such that a context's value is
    ``Σ_j weight_j ‖∇ log f_{label_j}‖²``.

    ``n_labels=None``: every label, weighted by its probability — the exact inner
    expectation. Otherwise ``n_labels`` i.i.d. draws from ``probs`` (the model's full
    softmax, special tokens included: that is the distribution the loss is defined
    on). Repeated draws of a label are merged into one gradient with weight
    count/n_labels: the estimate is *identical* to averaging over the draws, but a
    near-saturated model's peaked conditionals repeat labels often, so far fewer
    backward passes are needed. ``k`` is the largest number of distinct labels of any
    row; shorter rows are padded with weight-0 labels.
    """
    n, vocab = probs.shape
    if n_labels is None:
        return torch.arange(vocab).expand(n, vocab), probs
    draws = torch.multinomial(probs, n_labels, replacement=True, generator=gen)
    counts = torch.zeros(n, vocab, dtype=probs.dtype).scatter_add_(1, draws, torch.ones_like(draws, dtype=probs.dtype))
    k = int((counts > 0).sum(dim=1).max())
    weights, labels = counts.topk(k, dim=1)
    return labels, weights / n_labels


def _fisher_values_func(model: nn.Module, sel: SelectedParameters, tokens: torch.Tensor,
                        positions: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor,
                        linears: dict[str, nn.Linear], blocks: Blocks) -> torch.Tensor:
    """Per-context ``Σ_j w_j ‖∇_θ log f_θ(x)_{y_j}‖²``, vectorised over contexts and labels,
    per block of parameters (``blocks``: ``[n, n_blocks]``; the squared norm is a sum
    over parameters, so the blocks' values sum to the whole): ``fisher_label_values``
    weighted."""
    squares, _ = fisher_label_values(model, sel, tokens, positions, labels, linears, blocks)
    return (weights.to(squares.dtype)[:, :, None] * squares).sum(dim=1)


def _fisher_values_autograd(model: nn.Module, sel: SelectedParameters, tokens: torch.Tensor,
                            positions: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor,
                            linears: dict | None = None, blocks: Blocks | None = None) -> torch.Tensor:
    """The same quantity with plain autograd: a loop over contexts, one backward per
    distinct label (the fallback for models torch.func cannot transform). The labels and
    weights are read to the host once (they pick which backward passes to run); the
    squared norms are summed on the device. A selection with per-entry ``scales``
    (``adaptive.ScaledSelection``) has each gradient scaled first: ``‖s ⊙ ∇_θ‖²``."""
    blocks = blocks or Blocks.whole(sel.sizes)
    scales = getattr(sel, "scales", None)
    scale = 1.0 if scales is None else torch.cat([scales[n].reshape(-1) for n in sel.names])
    out = torch.zeros(tokens.shape[0], len(blocks.names), dtype=torch.float64, device=tokens.device)
    for i, (row_labels, row_weights) in enumerate(zip(labels.tolist(), weights.tolist())):
        logp = torch.log_softmax(model(tokens[i:i + 1])[0, positions[i]], dim=-1)
        for y, w in zip(row_labels, row_weights):
            if w == 0:
                continue
            grads = grads_or_zeros(torch.autograd.grad(logp[y], sel.tensors, retain_graph=True, allow_unused=True),
                                   sel.tensors)
            out[i] += w * blocks.sums((scale * torch.cat([g.reshape(-1) for g in grads])).square()[None])[0]
    return out


class _VmapBlock:
    """One block of contexts' values ``[n, n_blocks]`` (float64) and its number of
    gradients, by ``fisher_label_values`` (``torch.func``; ghost norms of the linear
    layers) or the autograd loop: a no-grad forward for the label draws, then the
    per-sample gradient norms in chunks of about ``max_bytes``."""

    def __init__(self, model, sel: SelectedParameters, blocks: Blocks, one: torch.Tensor, engine: str,
                 ghost_norms: bool, max_bytes: int):
        self.model, self.sel, self.blocks, self.max_bytes = model, sel, blocks, max_bytes
        self.fn = _fisher_values_func if engine == "func" else _fisher_values_autograd
        self.linears = ghost_linears(model, sel, one) if engine == "func" and ghost_norms else {}
        # entries held per (context, label) in the batched backward: the gradients of
        # the directly differentiated parameters, and (roughly) the activation
        # gradients of every layer
        ghosted = sum(sel.values[x].numel() for n in self.linears for x in (f"{n}.weight", f"{n}.bias")
                      if x in sel.values)
        widths = sum(m.in_features + m.out_features for m in model.modules() if isinstance(m, nn.Linear))
        self.per_label = sel.n_params - ghosted + 2 * one.shape[1] * widths

    def __call__(self, chunk: MaskedBatch, positions: torch.Tensor, n_labels: int | None, gen: torch.Generator
                 ) -> tuple[torch.Tensor, int]:
        with torch.no_grad():
            # the labels are drawn on the host, from the seeded CPU generator, so a seed
            # draws the same labels on every device: the one read-back per block of
            # contexts (its number of distinct labels shapes what follows)
            probs = torch.softmax(chunk.at_masked(self.model(chunk.inputs)).double(), dim=-1).cpu()
        labels, weights = _draw_labels(probs, n_labels, gen)
        row_bytes = labels.shape[1] * self.per_label * self.sel.dtype.itemsize
        values = map_in_chunks(partial(self.fn, self.model, self.sel, linears=self.linears, blocks=self.blocks),
                               chunk.inputs, positions, labels.to(self.sel.device), weights.to(self.sel.device),
                               row_bytes=row_bytes, max_bytes=self.max_bytes).double()
        return values, int((weights > 0).sum())


# label slots the hooked path traces on the meta device (None: all; ``memory.peak_bytes``)
META_LABEL_SLOTS: list[int | None] = [None]


class _HookedBlock:
    """The same as ``_VmapBlock`` by ``models.gradnorms``: a hooked forward pass (its
    logits also give the label draws when the whole block fits in ``max_bytes``; else a
    no-grad forward does, and the hooked passes run in chunks), one backward pass per
    label slot, the squared norms assembled from activations and output gradients."""

    def __init__(self, model, sel: SelectedParameters, blocks: Blocks, one: torch.Tensor, max_bytes: int):
        self.model, self.sel, self.blocks, self.max_bytes = model, sel, blocks, max_bytes
        widths = sum(m.in_features + m.out_features for m in model.modules() if isinstance(m, nn.Linear))
        widths += sum(2 * m.normalized_shape[0] for m in model.modules() if isinstance(m, nn.LayerNorm))
        vocab = model.output_weight.shape[0]
        # per context: what the forward keeps for the backward (about three tensors per
        # layer width) and the logits, and the output gradients of one label slot
        self.row_bytes = 4 * one.shape[1] * (widths + vocab) * sel.dtype.itemsize

    def _values(self, forward: gradnorms.RecordedForward, positions, labels, weights) -> torch.Tensor:
        if labels.device.type == "meta" and META_LABEL_SLOTS[0] is not None:
            # the planner's memory trace (``memory.peak_bytes``) traces a few label slots and
            # extrapolates: each slot adds the same bytes (tracing every slot of a paper-size
            # draw on the meta device took minutes)
            labels, weights = labels[:, :META_LABEL_SLOTS[0]], weights[:, :META_LABEL_SLOTS[0]]
        squares, _ = forward.squares(positions, labels, self.blocks.of, len(self.blocks.names))
        return (weights.to(squares.dtype)[:, :, None] * squares).sum(dim=1).detach().double()

    def __call__(self, chunk: MaskedBatch, positions: torch.Tensor, n_labels: int | None, gen: torch.Generator
                 ) -> tuple[torch.Tensor, int]:
        n = chunk.inputs.shape[0]
        rows = max(1, self.max_bytes // self.row_bytes)
        with torch.enable_grad():
            whole = gradnorms.RecordedForward(self.model, chunk.inputs, self.sel.names) if rows >= n else None
            logits = whole.logits.detach() if whole is not None else None
            if logits is None:
                with torch.no_grad():
                    logits = self.model(chunk.inputs)
            # drawn on the host from the seeded CPU generator, as ``_VmapBlock`` does
            probs = torch.softmax(chunk.at_masked(logits).double(), dim=-1).cpu()
            labels, weights = _draw_labels(probs, n_labels, gen)
            labels, weights = labels.to(self.sel.device), weights.to(self.sel.device)
            if whole is not None:
                return self._values(whole, positions, labels, weights), int((weights > 0).sum())
            starts = range(0, n, rows)
            if chunk.inputs.device.type == "meta":
                # the planner's memory trace (``memory.peak_bytes``): every chunk has the first's
                # shapes and frees its gradients before the next, so the first two reach the
                # peak; tracing each of a paper-size block's chunks took minutes
                starts = starts[:2]
            values = [self._values(gradnorms.RecordedForward(self.model, chunk.inputs[i:i + rows], self.sel.names),
                                   positions[i:i + rows], labels[i:i + rows], weights[i:i + rows])
                      for i in starts]
        if len(values) * rows < n:  # (meta only) the chunks not traced: the shape of their values
            values.append(values[-1].new_empty((n - len(values) * rows, *values[-1].shape[1:])))
        return torch.cat(values), int((weights > 0).sum())


def _context_values(step, ctx: MaskedBatch, sel, block_size: int, n_labels: int | None,
                    gen: torch.Generator) -> tuple[torch.Tensor, int]:
    """One repeat's per-context values ``[contexts, blocks]`` (``step``: ``_HookedBlock`` or
    ``_VmapBlock``), ``block_size`` contexts at a time, and the gradients it took."""
    values, n_grads = [], 0
    for b0 in range(0, ctx.inputs.shape[0], block_size):
        chunk = ctx.rows(b0, b0 + block_size).to(sel.device)
        positions = ctx.masked[b0:b0 + block_size].long().argmax(dim=1).to(sel.device)
        block_values, grads = step(chunk, positions, n_labels, gen)
        values.append(block_values)
        n_grads += grads
    return torch.cat(values), n_grads


def _extra(n_grads: int, blocks: Blocks | None, per_block: list, per_repeat: list[torch.Tensor]) -> dict:
    """``trace_fisher``'s ``extra``: the gradients taken, each block's trace (``blocks``:
    ``by_block``) and, over several repeats, each repeat's estimate and their std."""
    extra: dict = {"n_gradients": n_grads}
    if blocks is not None:
        extra["blocks"] = block_table(blocks, dict(zip(blocks.names, per_block)))
    if len(per_repeat) > 1:
        reps = torch.stack([v.sum(dim=1).mean() for v in per_repeat]).cpu()
        extra.update(repeat_estimates=reps.tolist(), repeat_std=float(reps.std()))
    return extra


@dataclass(frozen=True)
class FisherContexts:
    """The contexts ``trace_fisher`` averages over, the parameters it measures, and how it
    takes their gradients (none of which changes the value, beyond rounding).

    Attributes:
        params: a regex: only the parameters whose name matches (default: all).
        batch: a ``MaskedBatch`` with exactly one masked position per row, used instead
            of sampling.
        n_contexts: contexts (sentences) sampled per repeat (``sample_contexts``: one
            uniformly placed mask per sentence).
        seed: of the contexts and labels.
        engine: ``auto``, ``func`` (torch.func) or ``autograd``.
        block_size: contexts sharing one forward pass for the label draws.
        max_chunk_bytes: the per-sample gradients of a chunk take about this much at most.
        ghost_norms: take the squared gradient norms of linear layers from their
            activations instead of materialising per-sample gradients (same value, faster;
            ``_fisher_values_func``).
        hooks: with ``ghost_norms``, the ``func`` engine and a model ``models.gradnorms``
            covers (the transformer MLM, any selection), the squared norms from one batched
            forward and one batched backward per label slot (``_HookedBlock``), no per-example
            autograd; the same quantity to rounding (the labels drawn are the same). Any
            other model (the LSTM, Hugging Face models) takes the ``vmap`` path (``_VmapBlock``).
    """

    params: str | None = None
    batch: MaskedBatch | None = None
    n_contexts: int = 10_000
    seed: int = 0
    engine: str = "auto"
    block_size: int = 256
    max_chunk_bytes: int = 2**27
    ghost_norms: bool = True
    hooks: bool = True


@old_keywords("contexts", 2, FisherContexts, FISHER_CONTEXTS,
              rename={"contexts": ("batch", lambda v: not isinstance(v, FisherContexts))})
def trace_fisher(model: nn.Module, language: Language, contexts: FisherContexts = FisherContexts(), *,
                 n_labels: int | None = 50, repeats: int = 1, by_block: bool = False) -> CurvatureResult:
    """The paper's estimate of the trace of the Hessian (App. B.1), which is exactly the
    trace of the Fisher ``E_{t,x₋ₜ} E_{y∼f} ‖∇_θ log f_θ(x₋ₜ)_y‖²``.

    Each context's label average is one i.i.d. sample: ``estimate`` is their mean and
    ``stderr`` their std / √(number of contexts). Paper: 10⁴ contexts × 50 labels, std over
    5 repeats.

    Args:
        model: the MLM (in eval mode for the measure).
        language: where the contexts come from.
        contexts: the contexts, the parameters and the gradients' engine and chunks
            (``FisherContexts``).
        n_labels: labels drawn per context from the model's own predictive distribution
            at the mask (``None``: the exact expectation over the vocabulary, no label noise).
        repeats: independent sets (fresh contexts and labels; with ``contexts.batch`` given,
            fresh labels only), each set's estimate and their std reported in ``extra`` as
            the paper does; ``estimate`` and ``stderr`` then pool all sets.
        by_block: also the trace of each diagonal block — embedding, each layer, head
            (``base.parameter_blocks``) — in ``extra["blocks"]``; they sum to the total,
            context by context.

    Returns:
        the estimate with its standard error, the settings and the seconds taken.
    """
    if n_labels is not None and n_labels < 1:
        raise UserError(f"n_labels must be >= 1 or None (exact), got {n_labels}")
    if repeats < 1:
        raise UserError(f"repeats must be >= 1, got {repeats}")
    start = time.perf_counter()
    engine = resolve_engine(model, contexts.engine)
    sel = select_parameters(model, contexts.params)
    if contexts.batch is not None:
        per_row = contexts.batch.masked.sum(dim=1)
        if not bool((per_row == 1).all()):
            raise UserError("contexts must have exactly one masked position per sentence")
    blocks = parameter_blocks(sel) if by_block else Blocks.whole(sel.sizes)
    per_repeat: list[torch.Tensor] = []  # [contexts, blocks] per repeat, on the device
    n_grads = 0
    use_hooks = engine == "func" and contexts.ghost_norms and contexts.hooks and gradnorms.covers(model, sel.names)
    with measuring(model):
        for r in range(repeats):
            ctx = contexts.batch if contexts.batch is not None else \
                sample_contexts(language, contexts.n_contexts, contexts.seed, r)
            gen = step_generator(contexts.seed, r, stream=STREAM_DRAWS)
            one = ctx.inputs[:1].to(sel.device)
            step = _HookedBlock(model, sel, blocks, one, contexts.max_chunk_bytes) if use_hooks else \
                _VmapBlock(model, sel, blocks, one, engine, contexts.ghost_norms, contexts.max_chunk_bytes)
            values, grads = _context_values(step, ctx, sel, contexts.block_size, n_labels, gen)
            per_repeat.append(values)
            n_grads += grads
    everything = torch.cat(per_repeat)  # [all contexts, blocks]
    (estimate, stderr), *per_block = _mean_and_stderr_table(torch.cat([everything.sum(dim=1, keepdim=True),
                                                                       everything], dim=1))
    extra = _extra(n_grads, blocks if by_block else None, per_block, per_repeat)
    settings = {"n_contexts": int(per_repeat[0].shape[0]), "n_labels": n_labels, "repeats": repeats,
                "seed": contexts.seed, "engine": engine, "ghost_norms": contexts.ghost_norms and engine == "func",
                "hooks": use_hooks, "contexts_given": contexts.batch is not None}
    return CurvatureResult("trace_fisher", estimate, stderr, sel.n_params, contexts.params, int(everything.shape[0]),
                           time.perf_counter() - start, settings, extra)
