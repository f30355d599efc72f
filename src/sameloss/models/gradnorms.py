"""Per-example squared gradient norms ``‖∇_θ log f_θ(x)_y‖²`` of the transformer MLM from
one ordinary batched forward pass and one ordinary batched backward pass per label slot —
no per-example autograd (``torch.func.vmap``) and no per-example gradient ever formed.

Why it is exact. For context ``i`` (tokens ``x``, the prediction at position ``pos``) and
label ``y`` the gradient of ``log softmax(z)_y`` (``z`` the logits at ``pos``) is the
pullback of the cotangent ``c = e_y − f`` (``f = softmax(z)``). Every parameter of
``TransformerMLM`` enters the function through an operation whose per-example parameter
gradient is a small contraction of what the forward pass saw and what the backward pass
sends back, so a batched backward (contexts are independent: the batch's backward is
each context's own) gives every context's gradient *pieces* at once, and the squared norm
is assembled from them:

* ``nn.Linear`` (input ``a_t``, output gradient ``g_t`` at the ``T`` positions): weight
  ``‖Σ_t g_t a_tᵀ‖² = Σ_{t,t'} (a_t·a_t')(g_t·g_t')`` (two ``T × T`` Gram matrices),
  bias ``‖Σ_t g_t‖²``;
* ``nn.LayerNorm`` (normalised input ``x̂_t``): weight ``‖Σ_t g_t ⊙ x̂_t‖²``, bias
  ``‖Σ_t g_t‖²``;
* the position table (``pos_emb.weight[:T]`` added to the token embeddings, rows
  distinct): ``Σ_t ‖g_t‖²`` with ``g`` the gradient at the embedding sum;
* the token table, used twice (tied): as the embedding (``A = Σ_t e_{x_t} g_tᵀ``, rows
  by token identity: ``‖A‖² = Σ_{t,t'} [x_t = x_t'] g_t·g_t'``) and as the decoder
  (``B = c hᵀ``, ``h`` the decoder's input at ``pos``: ``‖B‖² = ‖c‖²‖h‖²``), so
  ``‖A + B‖² = ‖A‖² + ‖B‖² + 2 Σ_t c[x_t] (g_t·h)``;
* the output bias: ``‖c‖²``.

Coverage is never assumed: ``covers`` accepts a model only when every module is one of
the transformer's own types (so its forward is the one above) and every selected
parameter has a rule here; the forward hooks also check that each recorded module ran
exactly once. The caller (``measures.curvature.fisher``) falls back to its ``vmap`` path
otherwise (the LSTM, Hugging Face models).

Differentiable: with ``create_graph=True`` the backward passes are recorded
(``torch.autograd.grad(..., create_graph=True)``) and the assembly is plain tensor
arithmetic, so the squared norms can be differentiated again in every parameter (double
backward) — what the training-time flatness penalty needs. The cotangent's ``f`` is then
live too, as in the ``vmap`` path.

This module sits in ``models`` (below ``training`` and ``measures``) so that both the
Fisher-trace measure and the training-time flatness penalty can import it.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Sequence

import torch
from torch import nn

from sameloss.models.transformer import MLP, Block, MLMHead, SelfAttention, TransformerMLM
from sameloss.models.dropout import Dropout

# the module types whose forward this module knows (exact types: a subclass may compute
# something else)
_KNOWN = (TransformerMLM, Block, SelfAttention, MLP, MLMHead, nn.Linear, nn.LayerNorm, nn.Embedding, nn.Dropout,
          Dropout, nn.ModuleList)


class NotCovered(ValueError):
    """The model (or a selected parameter) has no rule here: use the ``vmap`` path."""


def parameter_names(model: nn.Module, params: str | None) -> list[str]:
    """The parameters (tied ones once, ``named_parameters`` order) whose names match the
    regex ``params`` (``re.search``; ``None``: all) — the measures' selection rule."""
    names = [n for n, _ in model.named_parameters()]
    return names if params is None else [n for n in names if re.search(params, n)]


def _rules(model: nn.Module) -> dict[str, tuple[str, str]]:
    """``{parameter name: (kind, module name)}`` for every parameter this module can
    assemble; kinds: ``linear.weight``, ``linear.bias``, ``norm.weight``, ``norm.bias``,
    ``token``, ``position``, ``output_bias``."""
    rules: dict[str, tuple[str, str]] = {"tok_emb.weight": ("token", "tok_emb"),
                                         "pos_emb.weight": ("position", "pos_emb"),
                                         "head.bias": ("output_bias", "head")}
    for name, mod in model.named_modules():
        if isinstance(mod, nn.Linear):
            rules[f"{name}.weight"] = ("linear.weight", name)
            rules[f"{name}.bias"] = ("linear.bias", name)
        elif isinstance(mod, nn.LayerNorm) and len(mod.normalized_shape) == 1:
            rules[f"{name}.weight"] = ("norm.weight", name)
            rules[f"{name}.bias"] = ("norm.bias", name)
    return rules


def covers(model: nn.Module, names: Sequence[str]) -> bool:
    """Whether the squared gradient norms over parameters ``names`` can be assembled here:
    a ``TransformerMLM`` built of its own module types only, every name with a rule."""
    if type(model) is not TransformerMLM or any(type(m) not in _KNOWN for m in model.modules()):
        return False
    rules = _rules(model)
    return bool(names) and all(n in rules for n in names)


class RecordedForward:
    """One batched forward pass of ``model`` on ``tokens [n, T]`` with what the squared
    norms need recorded (inputs of the linear layers and LayerNorms, outputs as the
    tensors to differentiate by): ``logits [n, T, V]`` is the model's output, and
    ``squares`` runs the backward passes. Make it inside ``torch.enable_grad``."""

    def __init__(self, model: nn.Module, tokens: torch.Tensor, names: Sequence[str]):
        if not covers(model, names):
            raise NotCovered("per-example gradient norms from hooks cover the transformer MLM's own parameters only")
        self.model, self.tokens, self.names = model, tokens, list(names)
        rules = _rules(model)
        self.rules = {n: rules[n] for n in self.names}
        modules = dict(model.named_modules())
        wanted = {m for kind, m in self.rules.values() if kind.startswith(("linear", "norm"))}
        if any(kind in ("token", "position") for kind, _ in self.rules.values()):
            wanted.add("tok_emb")
        head = model.head
        decoder_input = "head.norm" if head.transform else "head"
        if any(kind == "token" for kind, _ in self.rules.values()):
            wanted.add(decoder_input)
        self.inputs: dict[str, torch.Tensor] = {}
        self.outputs: dict[str, torch.Tensor] = {}
        with self._hooks({m: modules[m] for m in sorted(wanted)}):
            self.logits = model(tokens)
        missing = wanted - set(self.outputs)
        if missing:
            raise RuntimeError(f"gradient norms: modules {sorted(missing)} did not run in the forward pass")
        # the decoder's input (the token table's rule): the head transform's LayerNorm
        # output, or the features
        self.decoder_in = self.outputs.get(decoder_input) if head.transform else self.inputs.get("head")

    @contextlib.contextmanager
    def _hooks(self, modules: dict[str, nn.Module]) -> Iterator[None]:
        def hook(name):
            def fn(mod, args, output):
                if name in self.outputs:
                    raise RuntimeError(f"gradient norms: module {name} ran twice in one forward pass")
                self.inputs[name] = args[0]
                if output.requires_grad is False:  # frozen weights: still differentiate by the activations
                    output = output.detach().requires_grad_()
                self.outputs[name] = output
                return output
            return fn

        handles = [m.register_forward_hook(hook(name)) for name, m in modules.items()]
        try:
            yield
        finally:
            for h in handles:
                h.remove()

    def squares(self, positions: torch.Tensor, labels: torch.Tensor, groups: Sequence[int] | None = None,
                n_groups: int = 1, create_graph: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """``(squares [n, k, n_groups], log_probs [n, k])``: for context ``i`` (its
        prediction at ``positions[i]``) and label ``labels[i, j]``, ``‖∇ log f_y‖²`` summed
        over the parameters of each group (``groups[p]``: the group of ``names[p]``;
        ``None``: one group), and ``log f_y``. One backward pass per label slot."""
        groups = [0] * len(self.names) if groups is None else list(groups)
        n, k = labels.shape
        rows = torch.arange(n, device=labels.device)
        z = self.logits[rows, positions]  # [n, V]
        log_f = torch.log_softmax(z, dim=-1)
        f = log_f.exp() if create_graph else torch.softmax(z, dim=-1).detach()
        targets = {m: self.outputs[m] for kind, m in self.rules.values() if kind.startswith(("linear", "norm"))}
        if any(kind in ("token", "position") for kind, _ in self.rules.values()):
            targets["tok_emb"] = self.outputs["tok_emb"]
        keys = list(targets)
        fixed = self._fixed(rows, positions)
        onehot = torch.nn.functional.one_hot(labels.T, z.shape[-1]).to(z.dtype)  # [k, n, V]
        # one backward pass per label slot (recorded with ``create_graph``); measured: the
        # k slots as one ``is_grads_batched`` pass are slower on the CPU (its vmap copies)
        per_slot = []
        for j in range(k):
            c = onehot[j] - f
            # no module to differentiate by when the selection is the output bias alone (its
            # norm is the cotangent's, issue 63): autograd refuses an empty list of inputs
            grads = torch.autograd.grad(z, [targets[m] for m in keys], grad_outputs=c, create_graph=create_graph,
                                        retain_graph=create_graph or j < k - 1, allow_unused=True) if keys else ()
            per_slot.append(self._per_parameter(self._filled(grads, keys, targets), c, fixed))
        per = {name: torch.stack([d[name] for d in per_slot]) for name in self.names}
        sq = [torch.zeros(k, n, dtype=z.dtype, device=z.device) for _ in range(n_groups)]
        for name, grp in zip(self.names, groups):
            sq[grp] = sq[grp] + per[name]
        out = torch.stack(sq, dim=2).transpose(0, 1)  # [n, k, n_groups]
        return out, log_f.gather(1, labels)

    def _fixed(self, rows: torch.Tensor, positions: torch.Tensor) -> dict:
        """What every label slot shares: the Gram matrices of the linear layers' inputs,
        the LayerNorms' normalised inputs, the decoder's input at ``pos``, the token
        identity matrix."""
        fixed: dict = {}
        modules = dict(self.model.named_modules())
        for kind, m in set(self.rules.values()):
            if kind == "linear.weight":
                a = self.inputs[m]  # [n, T, in]
                fixed[("gram", m)] = a @ a.transpose(1, 2)
            elif kind == "norm.weight":
                x, mod = self.inputs[m], modules[m]
                centred = x - x.mean(dim=-1, keepdim=True)
                fixed[("xhat", m)] = centred * torch.rsqrt(centred.square().mean(dim=-1, keepdim=True) + mod.eps)
            elif kind == "token":
                fixed["h"] = self.decoder_in[rows, positions]  # [n, d]
                fixed["same"] = (self.tokens[:, :, None] == self.tokens[:, None, :]).to(self.logits.dtype)
        return fixed

    @staticmethod
    def _filled(grads, keys, targets) -> dict[str, torch.Tensor]:
        """The output gradients by module, zeros for a module the labels do not reach."""
        return {m: (x if x is not None else torch.zeros_like(targets[m])) for m, x in zip(keys, grads)}

    def _per_parameter(self, g: dict, c: torch.Tensor, fixed: dict) -> dict[str, torch.Tensor]:
        """``{name: [..., n]}``: each selected parameter's squared per-example gradient norm
        for output gradients ``g`` (by module, ``[..., n, T, width]``) of the cotangents
        ``c [..., n, V]`` (a leading axis: label slots)."""
        per = {}
        for name, (kind, m) in self.rules.items():
            if kind == "linear.weight":
                gm = g[m]
                per[name] = ((gm @ gm.transpose(-1, -2)) * fixed[("gram", m)]).sum(dim=(-2, -1))
            elif kind in ("linear.bias", "norm.bias"):
                per[name] = g[m].sum(dim=-2).square().sum(dim=-1)
            elif kind == "norm.weight":
                per[name] = (g[m] * fixed[("xhat", m)]).sum(dim=-2).square().sum(dim=-1)
            elif kind == "position":
                per[name] = g["tok_emb"].square().sum(dim=(-2, -1))
            elif kind == "output_bias":
                per[name] = c.square().sum(dim=-1)
            else:  # the tied token table: embedding part A, decoder part B
                ge, h = g["tok_emb"], fixed["h"]
                aa = ((ge @ ge.transpose(-1, -2)) * fixed["same"]).sum(dim=(-2, -1))
                bb = c.square().sum(dim=-1) * h.square().sum(dim=-1)
                cx = c.gather(-1, self.tokens.expand(*c.shape[:-1], self.tokens.shape[-1]))
                ab = (cx * (ge @ h[..., None])[..., 0]).sum(dim=-1)
                per[name] = aa + bb + 2 * ab
        return per


def fisher_squares(model: nn.Module, tokens: torch.Tensor, positions: torch.Tensor, labels: torch.Tensor,
                   params: str | None = None, create_graph: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``(squares [n, k], log_probs [n, k])``: ``‖∇_θ log f_θ(x)_y‖²`` over the parameters
    matching ``params`` (``None``: all) and ``log f_θ(x)_y`` for each context
    ``(tokens[i], positions[i])`` and label ``labels[i, j]`` — the quantity of
    ``models.label_gradients.fisher_label_values`` without per-example autograd.
    ``create_graph=True``: differentiable again in every parameter (double backward).
    ``NotCovered`` for a model this module has no rules for. Run the model as it is
    measured (dropout off: ``models.derivatives.measuring``)."""
    names = parameter_names(model, params)
    with torch.enable_grad():
        forward = RecordedForward(model, tokens, names)
        squares, log_probs = forward.squares(positions, labels, create_graph=create_graph)
    return squares[..., 0], log_probs
