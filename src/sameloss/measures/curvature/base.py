"""What every curvature measure shares: its result, the parameter selection, the loss
batch, the measuring mode, and two small tensor helpers."""

from __future__ import annotations

import contextlib
import dataclasses
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call
from torch.nn.attention import SDPBackend, sdpa_kernel

from ...errors import UserError
from ...languages.base import Language
from ...training.data import MaskedBatch, mask_batch, step_generator

# Random streams of ``step_generator`` (the training stream is 0, held-out evaluation 1).
STREAM_LOSS_BATCH = 11
STREAM_CONTEXTS = 12
STREAM_DRAWS = 13  # labels sampled from the model, Hutchinson probes, Lanczos start

ENGINES = ("auto", "func", "autograd")


# ---- results ----------------------------------------------------------------------------
@dataclass
class CurvatureResult:
    """One measurement. ``to_dict()`` is JSON-serialisable.

    measure: which quantity (``"trace_fisher"``, ``"trace_hutchinson"``,
        ``"top_eigenvalue"``, ``"sam_sharpness"``).
    estimate: its value; stderr: its Monte-Carlo standard error (``None`` where the
        measure is deterministic given its batch).
    n_params: number of parameter entries the measure is taken over; params: the regex.
    n_samples: contexts (Fisher), probes (Hutchinson), Lanczos iterations, or sentences
        of the batch (SAM).
    seconds: wall-clock time of the call. settings: the options used. extra:
        measure-specific details (repeat estimates, convergence, losses, ...).
    """

    measure: str
    estimate: float
    stderr: float | None
    n_params: int
    params: str | None
    n_samples: int
    seconds: float
    settings: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @property
    def relative_stderr(self) -> float | None:
        if self.stderr is None or self.estimate == 0:
            return None
        return abs(self.stderr / self.estimate)

    def __str__(self) -> str:
        err = "" if self.stderr is None else f" ± {self.stderr:.4g}"
        return f"{self.measure}: {self.estimate:.6g}{err} ({self.n_params} params, {self.seconds:.2f}s)"


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
    training penalty built from a measure: ``training.flatness``).
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



# where a parameter belongs in ``--trace-by block``: a numbered layer (ours ``blocks.3.``,
# Hugging Face BERT's ``encoder.layer.3.``, GPT-2's ``h.3.``, an LSTM's ``_l3`` /
# ``_l3_reverse``), else the embedding (a name with ``emb``: token, position, their
# LayerNorm; the tied decoder is the token embedding), else the head (MLM head, final
# LayerNorm, output bias)
_LAYER = re.compile(r"(?:^|\.)(?:blocks|layers?|h)\.(\d+)\.|_l(\d+)(?:_reverse)?$")


def block_name(parameter: str) -> str:
    """``"embedding"``, ``"layer<i>"`` or ``"head"`` for a parameter name."""
    found = _LAYER.search(parameter)
    if found:
        return f"layer{found.group(1) or found.group(2)}"
    return "embedding" if "emb" in parameter else "head"


def parameter_blocks(selection: SelectedParameters) -> Blocks:
    """The selected parameters grouped by ``block_name`` (in the order embedding,
    layer0, layer1, …, head; blocks with no selected parameter left out), as ``Blocks``
    over the selection's flat vectors."""
    names = [block_name(n) for n in selection.names]

    def order(name: str) -> tuple[int, int]:
        if name == "embedding":
            return (0, 0)
        if name == "head":
            return (2, 0)
        return (1, int(name[len("layer"):]))

    unique = sorted(set(names), key=order)
    index = {n: i for i, n in enumerate(unique)}
    return Blocks(tuple(unique), tuple(selection.sizes), tuple(index[n] for n in names))


def block_table(blocks: Blocks, values: dict[str, tuple[float, float | None]]) -> dict[str, dict]:
    """``{block: {"estimate", "stderr", "n_params"}}``: a measure's ``extra["blocks"]``."""
    counts = dict.fromkeys(blocks.names, 0)
    for size, b in zip(blocks.sizes, blocks.of):
        counts[blocks.names[b]] += size
    return {name: {"estimate": est, "stderr": se, "n_params": counts[name]} for name, (est, se) in values.items()}


def select_parameters(model: nn.Module, params: str | None = None, live: bool = False) -> SelectedParameters:
    """The parameters whose names match ``params`` (``re.search``; ``None``: all);
    ``live``: differentiable in them (``SelectedParameters``)."""
    return SelectedParameters(model, params, live)


def grads_or_zeros(grads: Sequence[torch.Tensor | None], tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """``torch.autograd.grad(..., allow_unused=True)`` output with each missing gradient
    (a parameter the output does not depend on) made an explicit zero."""
    return [g if g is not None else torch.zeros_like(p) for g, p in zip(grads, tensors)]


# ---- data ---------------------------------------------------------------------------------
def loss_batch(language: Language, n_sentences: int = 256, mask_rate: float | None = 0.15,
               seed: int = 0) -> MaskedBatch:
    """The fixed batch of the Hessian measures: ``n_sentences`` fresh sentences masked at
    ``mask_rate`` (at least one position each; ``None``: exactly one). A pure function of
    ``seed``, on a stream apart from training and evaluation."""
    if n_sentences < 1:
        raise UserError(f"the loss batch needs at least one sentence, got {n_sentences}")
    gen = step_generator(seed, 0, stream=STREAM_LOSS_BATCH)
    sample = language.sample(n_sentences, gen)
    return mask_batch(language, sample.tokens, sample.lengths, mask_rate, gen)


def sample_contexts(language: Language, n_contexts: int, seed: int = 0, repeat: int = 0) -> MaskedBatch:
    """Contexts ``x₋ₜ`` of the paper's estimator: sentences from the language, each with
    one masked position drawn uniformly over its tokens. A sentence with no maskable
    token (a corpus's last sequence can be ``[CLS] [SEP]``) is no context and is left
    out, so a corpus may give a few fewer than ``n_contexts``."""
    if n_contexts < 1:
        raise UserError(f"need at least one context, got {n_contexts}")
    gen = step_generator(seed, repeat, stream=STREAM_CONTEXTS)
    sample = language.sample(n_contexts, gen)
    batch = mask_batch(language, sample.tokens, sample.lengths, None, gen)
    keep = batch.masked.any(dim=1)
    if bool(keep.all()):
        return batch
    if not bool(keep.any()):
        raise UserError(f"none of the {n_contexts} sampled sentences has a token that can be masked")
    return type(batch)(batch.inputs[keep], batch.targets[keep], batch.masked[keep])


def batch_loss(logits: torch.Tensor, batch: MaskedBatch) -> torch.Tensor:
    """Mean cross-entropy of the true tokens at the masked positions (in the logits'
    precision; half precision is raised to float32)."""
    z = batch.at_masked(logits)
    if z.dtype in (torch.float16, torch.bfloat16):
        z = z.float()
    return F.cross_entropy(z, batch.at_masked(batch.targets))


def map_in_chunks(fn: Callable[..., torch.Tensor], *batched: torch.Tensor, row_bytes: int,
                  max_bytes: int) -> torch.Tensor:
    """``fn(*batched)`` computed on consecutive chunks of rows (first dimension) of the
    tensors and concatenated, each chunk of ``max_bytes // row_bytes`` rows (at least
    one): for a ``fn`` that treats rows independently but whose working memory grows
    by about ``row_bytes`` a row (per-sample gradients), the same result within a memory
    budget."""
    rows = max(1, max_bytes // max(1, row_bytes))
    n = batched[0].shape[0]
    return torch.cat([fn(*(t[i:i + rows] for t in batched)) for i in range(0, n, rows)])


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
    products: ``training.flatness``): the batching rule of ``layer_norm``'s backward
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
