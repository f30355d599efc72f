"""How flat is a trained MLM? Curvature of its pre-training loss (paper §3–4, App. B.1).

The paper's flatness measure is the trace of the Hessian of the MLM loss. Four views are
offered, each a function ``(model, language, **options) -> CurvatureResult``:

``trace_fisher``
    The paper's estimator (App. B.1). Near saturation the model's conditional equals the
    true one and the Hessian equals the Fisher (Bartlett identity, Lemma 3.2), so
    ``tr ∇²L ≈ E_{t, x₋ₜ} E_{y ∼ f_θ(x₋ₜ)} ‖∇_θ log f_θ(x₋ₜ)_y‖²`` — contexts from the
    language, labels *sampled from the model*. Every term is a squared norm, so the
    estimate is positive and its relative variance small. Away from saturation it
    measures the trace of the Fisher (Gauss–Newton) matrix, not of the Hessian.
``trace_hutchinson``
    ``E_v vᵀ∇²L v`` with Rademacher (or Gaussian) probes on the loss of a fixed batch with
    its *true* tokens — what the authors' released script computes. Exact in
    expectation for that batch's Hessian at any θ, but each probe is a Hessian-vector
    product (a double backward) and the probe variance is ``2 Σ_{i≠j} H_ij²``.
``top_eigenvalue``
    The largest Hessian eigenvalue of the same fixed-batch loss, by Lanczos.
``sam_sharpness``
    SAM's one-step sharpness ``L(θ + ρ g/‖g‖) − L(θ)`` on the same batch.

Conventions shared by all four:

* dropout is off while measuring (``model.eval()``); the previous mode is restored;
* ``params`` is a regex searched (``re.search``) in the names of
  ``model.named_parameters()``; ``None`` takes them all. Tied weights are one parameter
  (the transformer's token embedding is also its decoder) and count once. The others
  are held fixed. ``CurvatureResult.n_params`` says how many entries were measured;
* the loss of the Hessian measures is the mean cross-entropy of the true tokens over the
  masked positions of a batch drawn by ``loss_batch`` (15% masking by default; ``None``:
  one position per sentence), fixed for the call — pass ``batch=`` to reuse one;
* attention runs on PyTorch's "math" SDPA kernel: the fused CPU/CUDA kernels have no
  vmap batching rule, no forward-mode AD and no double backward.

Engines. With ``engine="func"`` (the default for the transformer) per-sample gradients
and Hessian-vector products are vectorised with ``torch.func`` (``functional_call`` +
``vmap`` of ``vjp``); the Fisher estimator also merges repeated label draws and takes the
squared gradient norms of linear layers from their activations ("ghost norms", see
``_fisher_values_func``). ``nn.LSTM`` with packed sequences supports none of vmap,
forward-AD or batched double backward, so models containing an RNN use
``engine="autograd"``: plain double backward per probe and a loop over contexts —
correct, but much slower.

Which is cheaper? On the tiny transformer (``bench/bench_trace.py``) the Fisher
estimator reaches a 2% relative standard error 4–5× faster than Hutchinson with the
paper's 50 labels per context, and about 10× faster with 2: its variance is mostly the
spread between contexts, so labels beyond a few per context buy little.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import re
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, vjp, vmap
from torch.nn.attention import SDPBackend, sdpa_kernel

from ..errors import UserError
from ..languages.base import Language
from ..training.data import MaskedBatch, mask_batch, step_generator

__all__ = [
    "CurvatureResult",
    "SelectedParameters",
    "loss_batch",
    "sample_contexts",
    "sam_sharpness",
    "select_parameters",
    "top_eigenvalue",
    "trace_fisher",
    "trace_hutchinson",
]

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


def _mean_and_stderr(values: torch.Tensor) -> tuple[float, float | None]:
    values = values.double()
    n = values.numel()
    mean = float(values.mean())
    if n < 2:
        return mean, None
    return mean, float(values.std() / math.sqrt(n))


# ---- which parameters -------------------------------------------------------------------
class SelectedParameters:
    """The parameters a measure differentiates, and the model as a pure function of them.

    ``values`` are detached copies-by-reference of the selected parameters (the inputs of
    the ``torch.func`` transforms); the other parameters are passed to
    ``functional_call`` detached, i.e. as constants. ``tensors`` are the live parameters
    (for the autograd engine). Vectors over the selection are flattened in ``names``
    order (``flat``/``unflat``).
    """

    def __init__(self, model: nn.Module, params: str | None):
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
        self.names = chosen
        self.tensors = [named[n] for n in chosen]
        self.values = {n: named[n].detach() for n in chosen}
        self.fixed = {n: p.detach() for n, p in named.items() if n not in self.values}
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


def select_parameters(model: nn.Module, params: str | None = None) -> SelectedParameters:
    """The parameters whose names match ``params`` (``re.search``; ``None``: all)."""
    return SelectedParameters(model, params)


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
    one masked position drawn uniformly over its tokens."""
    if n_contexts < 1:
        raise UserError(f"need at least one context, got {n_contexts}")
    gen = step_generator(seed, repeat, stream=STREAM_CONTEXTS)
    sample = language.sample(n_contexts, gen)
    return mask_batch(language, sample.tokens, sample.lengths, None, gen)


def _batch_loss(logits: torch.Tensor, batch: MaskedBatch) -> torch.Tensor:
    """Mean cross-entropy of the true tokens at the masked positions (in the logits'
    precision; half precision is raised to float32)."""
    z = logits[batch.masked]
    if z.dtype in (torch.float16, torch.bfloat16):
        z = z.float()
    return F.cross_entropy(z, batch.targets[batch.masked])


def _to(batch: MaskedBatch, device: torch.device) -> MaskedBatch:
    return MaskedBatch(batch.inputs.to(device), batch.targets.to(device), batch.masked.to(device))


# ---- measuring mode -----------------------------------------------------------------------
@contextlib.contextmanager
def _measuring(model: nn.Module) -> Iterator[None]:
    """Dropout off and attention on the math kernel (see the module docstring); cuDNN
    off because its RNN kernels have no double backward. Restores the model's mode."""
    was_training = model.training
    model.eval()
    try:
        with sdpa_kernel(SDPBackend.MATH), torch.backends.cudnn.flags(enabled=False):
            yield
    finally:
        model.train(was_training)


def _resolve_engine(model: nn.Module, engine: str) -> str:
    if engine not in ENGINES:
        raise UserError(f"unknown engine {engine!r}; choose from {', '.join(ENGINES)}")
    if engine != "auto":
        return engine
    return "autograd" if any(isinstance(m, nn.RNNBase) for m in model.modules()) else "func"


# ---- 1. the paper's estimator: E_y~f ‖∇ log f_y‖² -----------------------------------------
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


def _ghost_linears(model: nn.Module, sel: SelectedParameters, one: torch.Tensor) -> dict[str, nn.Linear]:
    """The ``nn.Linear`` layers whose per-sample gradient norms can be taken from their
    activations (see ``_fisher_values_func``): with a selected parameter, weight and
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


def _fisher_values_func(model: nn.Module, sel: SelectedParameters, tokens: torch.Tensor,
                        positions: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor,
                        linears: dict[str, nn.Linear]) -> torch.Tensor:
    """Per-context ``Σ_j w_j ‖∇_θ log f_θ(x)_{y_j}‖²``, vectorised over contexts and labels.

    Sharing the forward pass. For one context, ``∂ log softmax(z)_y / ∂z = e_y − f``, so
    the gradient of every label is a vector-Jacobian product of the *same* logits
    ``z(θ)`` with cotangent ``e_y − f``: ``vjp`` runs the forward once and returns the
    pullback, ``vmap`` over the k cotangents runs the k backward passes as one batched
    pass, and the outer ``vmap`` does this for a chunk of contexts at once — one forward
    and k backwards per context, not k of each as ``vmap(grad)`` over (context, label)
    pairs would.

    Ghost norms (``linears``, from ``_ghost_linears``; empty: none). Materialising
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
    ghosted = {f"{n}.{k}" for n in linears for k in ("weight", "bias")}
    direct = {n: v for n, v in sel.values.items() if n not in ghosted}
    held = {n: v for n, v in sel.values.items() if n in ghosted}  # constants here
    weight_in = {n: f"{n}.weight" in sel.values for n in linears}
    bias_in = {n: f"{n}.bias" in sel.values for n in linears}

    def one_context(tok, pos, lab, w):
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
        sq = torch.zeros(lab.shape[0], dtype=z.dtype, device=z.device)
        for g in g_direct.values():
            sq = sq + torch.linalg.vector_norm(g.reshape(g.shape[0], -1), dim=1).square()
        for n, mod in linears.items():
            g = g_out[n].reshape(lab.shape[0], -1, mod.out_features)  # [k, T, out]
            if weight_in[n]:
                a = inputs[n].reshape(-1, mod.in_features)  # [T, in]
                sq = sq + ((g @ g.transpose(1, 2)) * (a @ a.T)).sum(dim=(1, 2))
            if bias_in[n]:
                sq = sq + g.sum(dim=1).square().sum(dim=1)
        return (w.to(sq.dtype) * sq).sum()

    return vmap(one_context)(tokens, positions, labels, weights)


def _fisher_values_autograd(model: nn.Module, sel: SelectedParameters, tokens: torch.Tensor,
                            positions: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor,
                            linears: dict | None = None) -> torch.Tensor:
    """The same quantity with plain autograd: a loop over contexts, one backward per
    distinct label (the fallback for models torch.func cannot transform)."""
    out = torch.zeros(tokens.shape[0], dtype=torch.float64)
    for i in range(tokens.shape[0]):
        logp = torch.log_softmax(model(tokens[i:i + 1])[0, positions[i]], dim=-1)
        total = 0.0
        for y, w in zip(labels[i].tolist(), weights[i].tolist()):
            if w == 0:
                continue
            grads = torch.autograd.grad(logp[y], sel.tensors, retain_graph=True, allow_unused=True)
            total += w * sum(float(g.double().square().sum()) for g in grads if g is not None)
        out[i] = total
    return out


def trace_fisher(model: nn.Module, language: Language, *, n_contexts: int = 10_000,
                 n_labels: int | None = 50, params: str | None = None, seed: int = 0,
                 repeats: int = 1, contexts: MaskedBatch | None = None, block_size: int = 256,
                 max_chunk_bytes: int = 2**27, ghost_norms: bool = True,
                 engine: str = "auto") -> CurvatureResult:
    """The paper's estimate of the trace of the Hessian (App. B.1), which is exactly the
    trace of the Fisher ``E_{t,x₋ₜ} E_{y∼f} ‖∇_θ log f_θ(x₋ₜ)_y‖²``.

    ``n_contexts`` sentences from the language (``sample_contexts``), one uniformly
    placed mask each; for each, ``n_labels`` labels drawn from the model's own predictive
    distribution at the mask (``None``: the exact expectation over the vocabulary, no
    label noise). Paper: 10⁴ contexts × 50 labels, std over 5 repeats.

    Each context's label average is one i.i.d. sample: ``estimate`` is their mean and
    ``stderr`` their std / √(number of contexts). ``repeats > 1`` draws that many
    independent sets (fresh contexts and labels; with ``contexts=`` given, fresh labels
    only) and also reports each set's estimate and their std (``extra``), as the paper
    does; ``estimate`` and ``stderr`` then pool all sets.

    ``contexts``: a ``MaskedBatch`` with exactly one masked position per row, used
    instead of sampling. ``block_size`` contexts share one forward pass for the label
    draws; they are then processed in chunks whose per-sample gradients take about
    ``max_chunk_bytes`` at most. ``ghost_norms``: take the squared gradient norms of
    linear layers from their activations instead of materialising per-sample gradients
    (same value, faster; see ``_fisher_values_func``).
    """
    if n_labels is not None and n_labels < 1:
        raise UserError(f"n_labels must be >= 1 or None (exact), got {n_labels}")
    if repeats < 1:
        raise UserError(f"repeats must be >= 1, got {repeats}")
    start = time.perf_counter()
    engine = _resolve_engine(model, engine)
    sel = select_parameters(model, params)
    values_fn = _fisher_values_func if engine == "func" else _fisher_values_autograd
    if contexts is not None:
        per_row = contexts.masked.sum(dim=1)
        if not bool((per_row == 1).all()):
            raise UserError("contexts must have exactly one masked position per sentence")
    per_repeat: list[torch.Tensor] = []
    n_grads = 0
    with _measuring(model):
        for r in range(repeats):
            ctx = contexts if contexts is not None else sample_contexts(language, n_contexts, seed, r)
            gen = step_generator(seed, r, stream=STREAM_DRAWS)
            values = []
            one = ctx.inputs[:1].to(sel.device)
            linears = _ghost_linears(model, sel, one) if engine == "func" and ghost_norms else {}
            # entries held per (context, label) in the batched backward: the gradients of
            # the directly differentiated parameters, and (roughly) the activation
            # gradients of every layer
            ghosted = sum(sel.values[x].numel() for n in linears for x in (f"{n}.weight", f"{n}.bias")
                          if x in sel.values)
            widths = sum(m.in_features + m.out_features for m in model.modules() if isinstance(m, nn.Linear))
            per_label = sel.n_params - ghosted + 2 * one.shape[1] * widths
            for b0 in range(0, ctx.inputs.shape[0], block_size):
                tokens = ctx.inputs[b0:b0 + block_size].to(sel.device)
                masked = ctx.masked[b0:b0 + block_size].to(sel.device)
                positions = masked.long().argmax(dim=1)
                with torch.no_grad():
                    probs = torch.softmax(model(tokens)[masked].double(), dim=-1).cpu()
                labels, weights = _draw_labels(probs, n_labels, gen)
                n_grads += int((weights > 0).sum())
                k = labels.shape[1]
                chunk = max(1, max_chunk_bytes // (k * per_label * sel.dtype.itemsize))
                for c0 in range(0, tokens.shape[0], chunk):
                    sl = slice(c0, c0 + chunk)
                    values.append(values_fn(model, sel, tokens[sl], positions[sl], labels[sl].to(sel.device),
                                            weights[sl].to(sel.device), linears).double().cpu())
            per_repeat.append(torch.cat(values))
    everything = torch.cat(per_repeat)
    estimate, stderr = _mean_and_stderr(everything)
    extra: dict = {"n_gradients": n_grads}
    if repeats > 1:
        reps = torch.stack([v.mean() for v in per_repeat])
        extra.update(repeat_estimates=[float(v) for v in reps], repeat_std=float(reps.std()))
    settings = {"n_contexts": int(per_repeat[0].numel()), "n_labels": n_labels, "repeats": repeats,
                "seed": seed, "engine": engine, "ghost_norms": ghost_norms and engine == "func",
                "contexts_given": contexts is not None}
    return CurvatureResult("trace_fisher", estimate, stderr, sel.n_params, params, int(everything.numel()),
                           time.perf_counter() - start, settings, extra)


# ---- Hessian-vector products of the fixed-batch loss --------------------------------------
HVP = Callable[[torch.Tensor], torch.Tensor]


def _loss_operators(model: nn.Module, sel: SelectedParameters, batch: MaskedBatch, engine: str
                    ) -> tuple[torch.Tensor, torch.Tensor, HVP]:
    """``(loss, gradient, hvp)`` at the current parameters; ``hvp`` maps ``[m, P]`` flat
    vectors to ``[m, P]`` Hessian-vector products.

    The gradient's graph is built once and every product is a second backward through
    it (reverse-over-reverse): with ``engine="func"`` the pullback of ``vjp(grad(L))``
    vmapped over a chunk of vectors, with autograd ``autograd.grad(g, θ, v)`` per vector.
    (Forward-over-reverse, ``jvp(grad(L))``, measured no faster on CPU, and needs forward
    AD that the fused attention kernels lack.)
    """
    if engine == "func":
        def loss_fn(values):
            loss = _batch_loss(sel.call(model, values, batch.inputs), batch)
            return loss, loss

        def grad_fn(values):
            g, loss = grad(loss_fn, has_aux=True)(values)
            return g, loss

        gradient, pullback, loss = vjp(grad_fn, sel.values, has_aux=True)

        def hvp(vectors: torch.Tensor) -> torch.Tensor:
            return vmap(lambda v: sel.flat(pullback(sel.unflat(v))[0]))(vectors)

        return loss.detach(), sel.flat(gradient).detach(), hvp

    loss = _batch_loss(model(batch.inputs), batch)
    grads = torch.autograd.grad(loss, sel.tensors, create_graph=True, allow_unused=True)
    grads = [g if g is not None else torch.zeros_like(p) for g, p in zip(grads, sel.tensors)]

    def hvp(vectors: torch.Tensor) -> torch.Tensor:
        rows = []
        for v in vectors:
            hv = torch.autograd.grad(grads, sel.tensors, list(sel.unflat(v).values()), retain_graph=True,
                                     allow_unused=True)
            rows.append(sel.flat([h if h is not None else torch.zeros_like(p) for h, p in zip(hv, sel.tensors)]))
        return torch.stack(rows).detach()

    return loss.detach(), sel.flat([g.detach() for g in grads]), hvp


def _prepare_batch(language: Language, batch: MaskedBatch | None, n_sentences: int,
                   mask_rate: float | None, seed: int, device: torch.device) -> MaskedBatch:
    if batch is None:
        batch = loss_batch(language, n_sentences, mask_rate, seed)
    return _to(batch, device)


def _probes(n: int, dim: int, distribution: str, gen: torch.Generator, dtype: torch.dtype) -> torch.Tensor:
    if distribution == "rademacher":
        return (torch.randint(0, 2, (n, dim), generator=gen) * 2 - 1).to(dtype)
    return torch.randn(n, dim, generator=gen, dtype=torch.float64).to(dtype)


# ---- 2. Hutchinson --------------------------------------------------------------------------
def trace_hutchinson(model: nn.Module, language: Language, *, n_probes: int = 100,
                     distribution: str = "rademacher", params: str | None = None,
                     batch: MaskedBatch | None = None, n_sentences: int = 256,
                     mask_rate: float | None = 0.15, seed: int = 0, probe_chunk: int = 8,
                     engine: str = "auto") -> CurvatureResult:
    """Hutchinson's estimate ``mean_v vᵀ∇²L v`` of the trace of the Hessian of the
    fixed-batch loss (true tokens; ``loss_batch(language, n_sentences, mask_rate, seed)``
    unless ``batch`` is given), as in the authors' released script.

    Unbiased for that batch's Hessian at any θ (also away from saturation, where it
    differs from ``trace_fisher``). ``stderr`` is over probes only: it does not include
    the variation of the trace from batch to batch. ``distribution``: ``"rademacher"``
    (variance ``2 Σ_{i≠j} H_ij²``, the smaller) or ``"gaussian"`` (``2‖H‖_F²``).
    ``probe_chunk`` products are vectorised together.
    """
    if distribution not in ("rademacher", "gaussian"):
        raise UserError(f"probe distribution must be 'rademacher' or 'gaussian', got {distribution!r}")
    if n_probes < 1:
        raise UserError(f"n_probes must be >= 1, got {n_probes}")
    start = time.perf_counter()
    engine = _resolve_engine(model, engine)
    sel = select_parameters(model, params)
    batch_given = batch is not None
    batch = _prepare_batch(language, batch, n_sentences, mask_rate, seed, sel.device)
    gen = step_generator(seed, 0, stream=STREAM_DRAWS)
    quad = []
    with _measuring(model):
        loss, _, hvp = _loss_operators(model, sel, batch, engine)
        for p0 in range(0, n_probes, probe_chunk):
            v = _probes(min(probe_chunk, n_probes - p0), sel.n_params, distribution, gen, sel.dtype).to(sel.device)
            quad.append((v * hvp(v)).sum(dim=1).double().cpu())
    values = torch.cat(quad)
    estimate, stderr = _mean_and_stderr(values)
    settings = {"n_probes": n_probes, "distribution": distribution, "n_sentences": int(batch.inputs.shape[0]),
                "n_targets": int(batch.masked.sum()), "mask_rate": mask_rate, "seed": seed, "engine": engine,
                "batch_given": batch_given}
    return CurvatureResult("trace_hutchinson", estimate, stderr, sel.n_params, params, n_probes,
                           time.perf_counter() - start, settings, {"loss": float(loss)})


# ---- 3. top eigenvalue -----------------------------------------------------------------------
def _lanczos_top(hvp: HVP, dim: int, max_iter: int, tol: float, gen: torch.Generator,
                 dtype: torch.dtype, device: torch.device) -> dict:
    """Largest eigenvalue of a symmetric operator by Lanczos with full
    reorthogonalisation (the basis is kept, ``max_iter × dim`` float64 entries).

    Stops when the top Ritz pair's residual ``‖Hx − θx‖ = β_j |s_j|`` falls below
    ``tol · |θ|``, or when the Krylov space is invariant (β ≈ 0: the Ritz values are
    then exact eigenvalues of the operator).
    """
    q = torch.randn(dim, generator=gen, dtype=torch.float64).to(device)
    q /= q.norm()
    basis = [q]
    alphas: list[float] = []
    betas: list[float] = []
    top, smallest, residual, converged = float("nan"), float("nan"), float("inf"), False
    for j in range(min(max_iter, dim)):
        w = hvp(basis[-1].to(dtype)[None])[0].double()
        alpha = float(basis[-1] @ w)
        alphas.append(alpha)
        Q = torch.stack(basis)
        for _ in range(2):  # twice is enough (Kahan–Parlett)
            w = w - Q.T @ (Q @ w)
        beta = float(w.norm())
        T = torch.diag(torch.tensor(alphas, dtype=torch.float64))
        if betas:
            off = torch.tensor(betas, dtype=torch.float64)
            T += torch.diag(off, 1) + torch.diag(off, -1)
        theta, S = torch.linalg.eigh(T)
        top, smallest = float(theta[-1]), float(theta[0])
        residual = beta * abs(float(S[-1, -1]))
        if residual <= tol * max(abs(top), 1e-30) or beta <= 1e-12 * max(abs(top), 1e-30):
            converged = True
            break
        betas.append(beta)
        basis.append(w / beta)
    return {"eigenvalue": top, "iterations": len(alphas), "converged": converged, "residual": residual,
            "smallest_ritz_value": smallest}


def top_eigenvalue(model: nn.Module, language: Language, *, params: str | None = None,
                   batch: MaskedBatch | None = None, n_sentences: int = 256,
                   mask_rate: float | None = 0.15, seed: int = 0, max_iter: int = 100,
                   tol: float = 1e-6, engine: str = "auto") -> CurvatureResult:
    """Largest (algebraic) eigenvalue of the Hessian of the fixed-batch loss, by Lanczos
    on Hessian-vector products (``n_samples`` = iterations used).

    ``extra``: ``converged``, the final Ritz ``residual`` (``‖Hx − λx‖`` of the unit
    Ritz vector; a float32 model's products limit it to about 1e-6 of λ) and the
    ``smallest_ritz_value`` (an upper bound on the smallest eigenvalue: negative values
    mean the batch loss is not locally convex there).
    """
    start = time.perf_counter()
    engine = _resolve_engine(model, engine)
    sel = select_parameters(model, params)
    batch = _prepare_batch(language, batch, n_sentences, mask_rate, seed, sel.device)
    gen = step_generator(seed, 1, stream=STREAM_DRAWS)
    with _measuring(model):
        loss, _, hvp = _loss_operators(model, sel, batch, engine)
        out = _lanczos_top(hvp, sel.n_params, max_iter, tol, gen, sel.dtype, sel.device)
    settings = {"max_iter": max_iter, "tol": tol, "n_sentences": int(batch.inputs.shape[0]),
                "mask_rate": mask_rate, "seed": seed, "engine": engine}
    extra = {k: out[k] for k in ("converged", "residual", "smallest_ritz_value")} | {"loss": float(loss)}
    return CurvatureResult("top_eigenvalue", out["eigenvalue"], None, sel.n_params, params, out["iterations"],
                           time.perf_counter() - start, settings, extra)


# ---- 4. SAM sharpness --------------------------------------------------------------------------
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
    batch = _prepare_batch(language, batch, n_sentences, mask_rate, seed, sel.device)
    with _measuring(model):
        loss = _batch_loss(model(batch.inputs), batch)
        grads = torch.autograd.grad(loss, sel.tensors, allow_unused=True)
        g = sel.flat([x if x is not None else torch.zeros_like(p) for x, p in zip(grads, sel.tensors)])
        norm = g.double().norm()
        if norm == 0:
            raise UserError("the loss gradient is zero: SAM's ascent direction is undefined")
        eps = sel.unflat((rho * g.double() / norm).to(sel.dtype))
        with torch.no_grad():
            shifted = {n: sel.values[n] + eps[n] for n in sel.names}
            perturbed = _batch_loss(sel.call(model, shifted, batch.inputs), batch)
    sharpness = float(perturbed.double() - loss.detach().double())
    settings = {"rho": rho, "n_sentences": int(batch.inputs.shape[0]), "mask_rate": mask_rate, "seed": seed}
    extra = {"loss": float(loss.detach()), "perturbed_loss": float(perturbed), "grad_norm": float(norm),
             "first_order": float(rho * norm)}
    return CurvatureResult("sam_sharpness", sharpness, None, sel.n_params, params, int(batch.inputs.shape[0]),
                           time.perf_counter() - start, settings, extra)
