"""Per-context, per-label squared gradient norms ``‖∇_θ log f_θ(x)_y‖²`` of any MLM by
``torch.func`` (``fisher_label_values``: one forward and k batched backward passes per
context, ghost norms for the linear layers), differentiable again in the weights.

The paper's Fisher-trace measure (``measures.curvature.fisher``) sums them; the
training-time flatness penalty (``training.objectives.flatness``, its per-example estimator)
differentiates them. It sits in ``models`` beside ``gradnorms`` (the same norms from
hooked batched passes, for the transformer) so that both layers above import it.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator

import torch
from torch import nn
from torch.func import vjp, vmap

from .derivatives import Blocks, SelectedParameters

def ghost_linears(model: nn.Module, sel: SelectedParameters, one: torch.Tensor) -> dict[str, nn.Linear]:
    """The ``nn.Linear`` layers whose per-sample gradient norms can be taken from their
    activations (see ``fisher_label_values``): with a selected parameter, weight and
    bias registered in this module only (not tied), and called exactly once per forward
    pass with ``[1, T, ·]`` inputs — checked by running the model on one context
    ``one [1, T]``. Assumed: the model reads a linear layer's weight only by calling the
    layer (true of the models here; a ``F.linear(x, layer.weight)`` elsewhere would be
    missed)."""
    uses = Counter(id(p) for _, p in model.named_parameters(remove_duplicate=False))
    candidates = {}
    for name, mod in model.named_modules():
        if not isinstance(mod, nn.Linear):
            continue
        own = [p for p in (mod.weight, mod.bias) if p is not None]
        if any(uses[id(p)] != 1 for p in own):
            continue
        if any(f"{name}.{k}" in sel.values for k in ("weight", "bias")):
            candidates[name] = mod
    calls: Counter = Counter()
    shapes_ok: dict[str, bool] = {}

    def hook(name):
        def fn(mod, inputs, output):
            calls[name] += 1
            shapes_ok[name] = inputs[0].dim() == 3 and tuple(output.shape) == (1, one.shape[1], mod.out_features)
        return fn

    handles = [mod.register_forward_hook(hook(name)) for name, mod in candidates.items()]
    try:
        with torch.no_grad():
            model(one)
    finally:
        for h in handles:
            h.remove()
    return {n: m for n, m in candidates.items() if calls[n] == 1 and shapes_ok[n]}


@contextlib.contextmanager
def _shift_outputs(linears: dict[str, nn.Linear], shifts: dict[str, torch.Tensor],
                   inputs: dict[str, torch.Tensor]) -> Iterator[None]:
    """While active, each layer's output gets ``+ shifts[name]`` (zeros: the function is
    unchanged, but the gradient w.r.t. the shift is the gradient w.r.t. the layer's
    output) and its input is recorded in ``inputs[name]``."""
    def hook(name):
        def fn(mod, args, output):
            inputs[name] = args[0]
            return output + shifts[name]
        return fn

    handles = [mod.register_forward_hook(hook(name)) for name, mod in linears.items()]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def _squared_norm(live: bool):
    """Each row's squared norm: differentiated again (``live``), a sum of squares (the norm's
    derivative is 0/0 at a zero gradient); else the measure's own arithmetic (its numbers are
    pinned bit for bit)."""
    if live:
        return lambda x: x.square().sum(dim=1)
    return lambda x: torch.linalg.vector_norm(x, dim=1).square()


def fisher_label_values(model: nn.Module, sel: SelectedParameters, tokens: torch.Tensor,
                        positions: torch.Tensor, labels: torch.Tensor, linears: dict[str, nn.Linear],
                        blocks: Blocks) -> tuple[torch.Tensor, torch.Tensor]:
    """``(squares [n, k, n_blocks], log_probs [n, k])``: for context ``i`` (``tokens[i]``
    with the prediction at ``positions[i]``) and each of its labels ``labels[i, j]``, the
    squared norm ``‖∇_θ log f_θ(x)_y‖²`` per block of parameters (``blocks``; the squared
    norm is a sum over parameters, so the blocks' values sum to the whole), and
    ``log f_θ(x)_y`` itself. Vectorised over contexts and labels.

    Differentiable in the selection's values when they are live (``select_parameters(...,
    live=True)``): every step below is a ``torch.func`` transform or a plain tensor
    operation, so the outer autograd differentiates through them (double backward) — the
    training-time flatness penalty (``training.objectives.flatness``) is this function's gradient.

    Sharing the forward pass. For one context, ``∂ log softmax(z)_y / ∂z = e_y − f``, so
    the gradient of every label is a vector-Jacobian product of the *same* logits
    ``z(θ)`` with cotangent ``e_y − f``: ``vjp`` runs the forward once and returns the
    pullback, ``vmap`` over the k cotangents runs the k backward passes as one batched
    pass, and the outer ``vmap`` does this for a chunk of contexts at once — one forward
    and k backwards per context, not k of each as ``vmap(grad)`` over (context, label)
    pairs would.

    Ghost norms (``linears``, from ``ghost_linears``; empty: none). Materialising
    per-sample gradients costs ``k · n_params`` memory per context and, for a weight
    ``W`` applied at T positions, a batched outer product ``Σ_t g_t a_tᵀ`` per label —
    most of the time. But ``‖Σ_t g_t a_tᵀ‖² = Σ_{t,t'} (a_t·a_t')(g_t·g_t')``: two T×T
    Gram matrices, of the layer's inputs ``a`` (shared by all labels) and of its output
    gradients ``g``. So each of ``linears`` gets a zero shift added to its output, whose
    gradient is ``g``; its weight and bias are held fixed in the VJP and their squared
    norms come from the Gram matrices (bias: ``‖Σ_t g_t‖²``). The other parameters
    (embeddings — the tied decoder among them —, LayerNorms, the output bias) are
    differentiated directly. Same value, faster (see ``bench/bench_trace.py``), and the
    memory no longer grows with the number of parameters.
    """
    seq_len = tokens.shape[1]
    squared_norm = _squared_norm(sel.live)
    block_of = dict(zip(sel.names, blocks.of))
    n_blocks = len(blocks.names)
    ghosted = {f"{n}.{k}" for n in linears for k in ("weight", "bias")}
    direct = {n: v for n, v in sel.values.items() if n not in ghosted}
    held = {n: v for n, v in sel.values.items() if n in ghosted}  # constants here
    weight_in = {n: f"{n}.weight" in sel.values for n in linears}
    bias_in = {n: f"{n}.bias" in sel.values for n in linears}

    def one_context(tok, pos, lab):
        def logits_at(values, shifts):
            inputs: dict[str, torch.Tensor] = {}
            with _shift_outputs(linears, shifts, inputs):
                out = sel.call(model, {**held, **values}, tok[None])[0]  # [T, V]
            # row `pos` by a one-hot product: indexing with a vmapped index would be
            # data-dependent control flow under vmap
            z = ((torch.arange(seq_len, device=out.device) == pos).to(out.dtype)[:, None] * out).sum(0)
            return z, inputs

        shifts = {n: torch.zeros(1, seq_len, m.out_features, dtype=sel.dtype, device=sel.device)
                  for n, m in linears.items()}
        z, pullback, inputs = vjp(logits_at, direct, shifts, has_aux=True)
        f = torch.softmax(z, dim=-1)
        onehot = (torch.arange(z.shape[-1], device=z.device) == lab[:, None]).to(z.dtype)
        g_direct, g_out = vmap(pullback)(onehot - f)  # dicts of [k, *shape]
        sq = [torch.zeros(lab.shape[0], dtype=z.dtype, device=z.device) for _ in range(n_blocks)]
        for name, g in g_direct.items():
            b = block_of[name]
            sq[b] = sq[b] + squared_norm(g.reshape(g.shape[0], -1))
        for n, mod in linears.items():
            g = g_out[n].reshape(lab.shape[0], -1, mod.out_features)  # [k, T, out]
            if weight_in[n]:
                a = inputs[n].reshape(-1, mod.in_features)  # [T, in]
                b = block_of[f"{n}.weight"]
                sq[b] = sq[b] + ((g @ g.transpose(1, 2)) * (a @ a.T)).sum(dim=(1, 2))
            if bias_in[n]:
                b = block_of[f"{n}.bias"]
                sq[b] = sq[b] + g.sum(dim=1).square().sum(dim=1)
        return torch.stack(sq, dim=1), (torch.log_softmax(z, dim=-1) * onehot).sum(dim=1)

    return vmap(one_context)(tokens, positions, labels)

