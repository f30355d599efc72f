"""What a derivative of a model in its weights is taken over, and how the model runs while
it is: the parameter selection (``SelectedParameters``: the model as a pure function of the
selected weights, for ``torch.func``), partitions of the flat coordinates (``Blocks``), the
measuring mode (dropout off, the math attention kernel, an LSTM unrolled), LayerNorms
made of elementary operations (``composite_layer_norms``) and the engine a model allows.

It sits in ``models`` (below ``training`` and ``measures``, as ``gradnorms`` does) because
both the curvature measures (``measures.curvature``) and the training-time flatness
penalty (``training.objectives.flatness``) differentiate through it.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torch.func import functional_call
from torch.nn.attention import SDPBackend, sdpa_kernel

from ..errors import UserError

ENGINES = ("auto", "func", "autograd")


# ---- which parameters -------------------------------------------------------------------
class SelectedParameters:
    """The parameters a measure differentiates, and the model as a pure function of them.

    ``values`` are detached copies-by-reference of the selected parameters (the inputs of
    the ``torch.func`` transforms); the other parameters are passed to
    ``functional_call`` detached, i.e. as constants. ``tensors`` are the live parameters
    (for the autograd engine). Vectors over the selection are flattened in ``names``
    order (``flat``/``unflat``).

    ``live=True``: ``values`` and the others are the live parameters themselves, so that
    what the transforms compute stays differentiable by ordinary autograd in every
    parameter — the selected ones and the others, which the transforms hold constant (a
    training penalty built from a measure: ``training.objectives.flatness``).
    """

    def __init__(self, model: nn.Module, params: str | None, live: bool = False):
        named = dict(model.named_parameters())  # removes duplicates: tied weights once
        if params is None:
            chosen = list(named)
        else:
            try:
                pattern = re.compile(params)
            except re.error as exc:
                raise UserError(f"invalid parameter regex {params!r}: {exc}") from None
            chosen = [n for n in named if pattern.search(n)]
            if not chosen:
                raise UserError(f"parameter regex {params!r} matches no parameter; names are: "
                                + ", ".join(named))
        self.pattern = params
        self.live = live
        self.names = chosen
        self.tensors = [named[n] for n in chosen]
        self.values = {n: named[n] if live else named[n].detach() for n in chosen}
        self.fixed = {n: p if live else p.detach() for n, p in named.items() if n not in self.values}
        self.shapes = [p.shape for p in self.tensors]
        self.sizes = [p.numel() for p in self.tensors]
        self.n_params = sum(self.sizes)
        first = self.tensors[0]
        self.dtype, self.device = first.dtype, first.device

    def call(self, model: nn.Module, values: dict[str, torch.Tensor], tokens: torch.Tensor) -> torch.Tensor:
        """``model(tokens)`` with the selected parameters replaced by ``values``."""
        return functional_call(model, {**self.fixed, **values}, (tokens,))

    def flat(self, tensors: dict[str, torch.Tensor] | list[torch.Tensor] | tuple) -> torch.Tensor:
        """One flat vector from per-parameter tensors (a dict by name, or a list in
        ``names`` order)."""
        if isinstance(tensors, dict):
            tensors = [tensors[n] for n in self.names]
        return torch.cat([t.reshape(-1) for t in tensors])

    def unflat(self, vector: torch.Tensor) -> dict[str, torch.Tensor]:
        parts = vector.split(self.sizes)
        return {n: p.view(s) for n, p, s in zip(self.names, parts, self.shapes)}


# ---- blocks of parameters -----------------------------------------------------------------
@dataclass(frozen=True)
class Blocks:
    """A partition of the flat coordinates ``[0, dim)`` into named blocks: consecutive
    segments of lengths ``sizes`` (covering ``[0, dim)`` in order; e.g. one per
    parameter tensor), segment ``i`` belonging to block ``of[i]`` (an index into
    ``names``). ``sums`` adds a row's entries per block: the per-block part of a trace
    estimate, so the blocks' estimates sum to the total one."""

    names: tuple[str, ...]
    sizes: tuple[int, ...]
    of: tuple[int, ...]

    def __post_init__(self):
        if len(self.sizes) != len(self.of) or any(not 0 <= b < len(self.names) for b in self.of):
            raise ValueError("every segment needs a block index into names")

    @property
    def dim(self) -> int:
        return sum(self.sizes)

    @classmethod
    def whole(cls, dim: int | Sequence[int]) -> Blocks:
        """One block, ``"all"``, of ``dim`` coordinates (or of segments of these sizes)."""
        sizes = (dim,) if isinstance(dim, int) else tuple(dim)
        return cls(("all",), sizes, (0,) * len(sizes))

    def sums(self, x: torch.Tensor) -> torch.Tensor:
        """``[k, dim] -> [k, len(names)]`` float64: each row's entries summed per block
        (in float64; a fixed order — no atomics —, so reruns give the same numbers)."""
        per_segment = torch.stack([p.sum(dim=1, dtype=torch.float64) for p in x.split(self.sizes, dim=1)], dim=1)
        if len(self.names) == len(self.sizes) and self.of == tuple(range(len(self.sizes))):
            return per_segment
        onehot = torch.zeros(len(self.sizes), len(self.names), dtype=torch.float64, device=x.device)
        onehot[torch.arange(len(self.sizes)), torch.tensor(self.of)] = 1.0
        return per_segment @ onehot


def select_parameters(model: nn.Module, params: str | None = None, live: bool = False) -> SelectedParameters:
    """The parameters whose names match ``params`` (``re.search``; ``None``: all);
    ``live``: differentiable in them (``SelectedParameters``)."""
    return SelectedParameters(model, params, live)


def grads_or_zeros(grads: Sequence[torch.Tensor | None], tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """``torch.autograd.grad(..., allow_unused=True)`` output with each missing gradient
    (a parameter the output does not depend on) made an explicit zero."""
    return [g if g is not None else torch.zeros_like(p) for g, p in zip(grads, tensors)]


# ---- measuring mode -----------------------------------------------------------------------
@contextlib.contextmanager
def measuring(model: nn.Module) -> Iterator[None]:
    """Dropout off, attention on the math kernel (see the package docstring), an LSTM
    MLM unrolled into plain tensor operations that ``torch.func`` transforms (cuDNN off
    too, for RNNs run by the autograd engine: its kernels have no double backward).
    Restores the model's mode."""
    was_training = model.training
    model.eval()
    unrolled = getattr(model, "unrolled", None)  # an LSTM in plain tensor operations (models/lstm.py)
    try:
        with sdpa_kernel(SDPBackend.MATH), torch.backends.cudnn.flags(enabled=False), \
                (unrolled() if unrolled is not None else contextlib.nullcontext()):
            yield
    finally:
        model.train(was_training)


@contextlib.contextmanager
def composite_layer_norms(model: nn.Module) -> Iterator[None]:
    """While active, every ``nn.LayerNorm`` of ``model`` computes ``(x − μ)/√(σ² + ε)·γ + β``
    from elementary operations instead of the fused ``layer_norm`` kernel: the same
    function, to rounding. Needed wherever a ``torch.func``-transformed backward pass is
    itself differentiated (a gradient of per-sample gradient norms or of Hessian-vector
    products: ``training.objectives.flatness``): the batching rule of ``layer_norm``'s backward
    gives wrong derivatives there (pytorch/functorch#534, still open) — measured on the
    micro transformer in float64, the gradient of the exact Fisher trace was 2e-5 off
    relative to finite differences (6 % for a single LayerNorm), and exact with this.
    Measures of first and second order (per-sample gradients, Hessian-vector products)
    are not affected and keep the fused kernel."""
    norms = [m for m in model.modules() if isinstance(m, nn.LayerNorm)]

    def composite(m: nn.LayerNorm):
        dims = tuple(range(-len(m.normalized_shape), 0))

        def forward(x: torch.Tensor) -> torch.Tensor:
            centred = x - x.mean(dim=dims, keepdim=True)
            y = centred * torch.rsqrt(centred.square().mean(dim=dims, keepdim=True) + m.eps)
            if m.weight is not None:
                y = y * m.weight
            return y + m.bias if m.bias is not None else y
        return forward

    for m in norms:
        m.forward = composite(m)  # an instance attribute: shadows the class's forward
    try:
        yield
    finally:
        for m in norms:
            del m.forward


def resolve_engine(model: nn.Module, engine: str) -> str:
    """``"func"`` or ``"autograd"``; ``"auto"``: autograd for models that say
    ``vmap_safe = False`` (a Hugging Face model ``torch.func`` cannot batch) and for models
    with an RNN that cannot run unrolled (the LSTM MLM can: ``LSTMMLM.unrolled``, entered
    by ``measuring``)."""
    if engine not in ENGINES:
        raise UserError(f"unknown engine {engine!r}; choose from {', '.join(ENGINES)}")
    if engine != "auto":
        return engine
    if getattr(model, "vmap_safe", True) is False:
        return "autograd"
    if hasattr(model, "unrolled"):
        return "func"
    return "autograd" if any(isinstance(m, nn.RNNBase) for m in model.modules()) else "func"

