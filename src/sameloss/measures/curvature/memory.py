"""Peak memory of each curvature measure, worked out on the ``meta`` device.

``peak_bytes(measure, model_config, settings)`` runs the measure's own code on a copy of
the model on the meta device (tensors with a shape and a dtype but no storage) at the
measure's batch, and follows every tensor storage it allocates while it is alive: the
peak of their sum, plus the model's weights, is the device memory the measure needs. The
values the code would read back (the Lanczos coefficients, the final means) are stood in
for by ones, so nothing is computed and nothing allocated (t3-1024 takes 3 s for the
Fisher estimator to 80 s for Hutch++ on a busy 2-core CPU), and the numbers follow the
code as it changes (no formula to keep in step).
(torch's ``MemTracker`` does the same on fake tensors but cannot see through the
``torch.func`` wrappers the Hessian products use; the tracker here sits below them.)

Where a measure's memory is linear in a setting, the run is short and the rest is
arithmetic: Hutchinson's peak is that of one chunk of probes (later chunks free the
earlier ones), the Fisher estimator's that of one block of contexts, and Lanczos' is
measured with a 2-vector basis and one restart, plus ``(basis_size − 2)`` parameter-sized
vectors. ``legacy=True`` gives the top eigenvalue as the code before issue 26 held it:
the whole float64 basis (``max_iter`` vectors) and a stacked copy of it, re-made at every
product, besides the operator's working memory.

Not counted: workspace inside single kernels, the allocator's slack (caching,
fragmentation) and the CUDA context — on the CPU, a real Hutchinson run's peak resident
memory grew by 1.5× the estimate (``bench/bench_curvature_memory.py``: 1600 MiB against
1058 MiB), so budget that much headroom —, and host memory (probes are drawn on the CPU:
``probe_chunk × P × 4`` bytes there, ``host_bytes``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from ...errors import UserError
from ...training.data import MaskedBatch

# Real peaks exceed the estimates by the allocator's caching and fragmentation: a Hutchinson
# run's peak resident memory was 1.5x its estimate on the CPU (module docstring). A measure
# that sizes its work to the device divides the memory it may use by this.
ALLOCATOR_SLACK = 1.5

MEASURES = ("trace_fisher", "trace_hutchinson", "trace_hutchpp", "top_eigenvalue", "sam_sharpness", "adaptive_trace")

# the settings of ``sameloss measure`` (``MeasureSpec``) and of the measures' defaults
DEFAULTS: dict[str, dict] = {
    "trace_fisher": {"n_labels": 50, "block_size": 256, "max_chunk_bytes": 2**27, "by_block": False,
                     "ghost_norms": True},
    "trace_hutchinson": {"n_sentences": 1024, "n_probes": 100, "probe_chunk": 8, "by_block": False,
                         "micro_batch": None},
    "trace_hutchpp": {"n_sentences": 1024, "n_probes": 100, "probe_chunk": 8, "by_block": False,
                      "micro_batch": None},
    "top_eigenvalue": {"n_sentences": 1024, "max_iter": 100, "basis_size": 20, "micro_batch": None},
    "sam_sharpness": {"n_sentences": 1024},
    "adaptive_trace": {"n_labels": 50, "block_size": 256, "max_chunk_bytes": 2**27, "by_block": False,
                       "hooks": True},
}


@dataclass
class MemoryEstimate:
    """``bytes``: the device peak of one measure; ``parts``: what it is made of
    (``weights``, the measure's ``working`` peak, and for the legacy Lanczos its basis);
    ``host_bytes``: the probes drawn on the host at a time."""

    measure: str
    bytes: int
    parts: dict[str, int]
    settings: dict
    host_bytes: int = 0
    n_params: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def gib(self) -> float:
        return self.bytes / 2**30

    def __str__(self) -> str:
        parts = ", ".join(f"{k} {v / 2**30:.2f}" for k, v in self.parts.items())
        return f"{self.measure}: {self.gib:.2f} GiB ({parts})"


class StorageTracker(TorchDispatchMode):
    """Follows the storages of the tensors every op returns on ``device_type`` (meta:
    what a measure would allocate on its device), each counted once
    (views share theirs) while alive: ``peak`` is the largest sum seen. Alive means held
    anywhere — also by autograd's saved tensors in C++ — as a weak reference to the storage
    itself tells."""

    def __init__(self, device_type: str = "meta"):
        super().__init__()
        self.device_type = device_type
        self.live: dict[int, tuple[StorageWeakRef, int]] = {}
        self.current = 0
        self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        fresh = []
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type == self.device_type:
                storage = t.untyped_storage()
                if storage._cdata not in self.live:
                    fresh.append(storage)
        if fresh:
            for key in [k for k, (ref, _) in self.live.items() if ref.expired()]:
                self.current -= self.live.pop(key)[1]
            for storage in fresh:
                if storage._cdata not in self.live:
                    self.live[storage._cdata] = (StorageWeakRef(storage), storage.nbytes())
                    self.current += storage.nbytes()
            self.peak = max(self.peak, self.current)
        return out


@contextlib.contextmanager
def stand_in_reads(record: list | None = None) -> Iterator[None]:
    """While active, reading a meta tensor (``.tolist()``, ``.item()``, ``float``,
    ``int``, ``bool``, ``.cpu()``) gives ones of its shape instead of an error, so code
    that reads values back runs to its end on the meta device. Each read's kind is
    appended to ``record`` (the tests count a measure's reads of its device)."""
    T = torch.Tensor
    saved = {name: getattr(T, name) for name in ("tolist", "item", "__float__", "__int__", "__bool__", "__index__",
                                                 "cpu")}

    def ones(t):
        return torch.ones(t.shape, dtype=t.dtype if t.dtype != torch.bool else torch.bool)

    def wrap(name, stand_in):
        original = saved[name]

        def method(self, *args, **kwargs):
            if self.device.type == "meta":
                if record is not None:
                    record.append(name)
                return stand_in(self)
            return original(self, *args, **kwargs)
        return method

    replacements = {"tolist": lambda t: ones(t).tolist(), "item": lambda t: ones(t).reshape(-1)[0].item(),
                    "__float__": lambda t: 1.0, "__int__": lambda t: 1, "__index__": lambda t: 1,
                    "__bool__": lambda t: True, "cpu": ones}
    try:
        for name, stand_in in replacements.items():
            setattr(T, name, wrap(name, stand_in))
        yield
    finally:
        for name, method in saved.items():
            setattr(T, name, method)


@contextlib.contextmanager
def meta_probes() -> Iterator[None]:
    """Probes (and the Lanczos start vector) made on the meta device directly, instead of
    drawn on the host and moved (which would allocate and fill them for real)."""
    from . import estimators

    original = estimators.probe_vectors

    def probes(n, dim, distribution, generator, dtype, device=None):
        return torch.empty(n, dim, dtype=dtype, device="meta")

    estimators.probe_vectors = probes
    try:
        yield
    finally:
        estimators.probe_vectors = original


def meta_model(model_config) -> torch.nn.Module:
    """The model of a registered kind's config (``TransformerConfig``, ``LSTMConfig``) on the
    meta device."""
    from ...models import kind_of_config

    kind = kind_of_config(model_config)
    if kind is None:
        raise UserError(f"need the config of a sameloss model (TransformerConfig, LSTMConfig), got "
                        f"{type(model_config).__name__}")
    with torch.device("meta"):
        return kind.model_class(model_config)


def stand_in_batch(model_config, n_sentences: int) -> MaskedBatch:
    """``n_sentences`` full-length sentences (on the host, as the measures draw them; a
    few bytes each), one masked position each (the curvature measures' masking)."""
    T = model_config.max_len
    tokens = torch.zeros(n_sentences, T, dtype=torch.long)
    masked = torch.zeros(n_sentences, T, dtype=torch.bool)
    masked[:, 0] = True
    return MaskedBatch(tokens, tokens, masked)


@contextlib.contextmanager
def first_chunk_only() -> Iterator[None]:
    """The Fisher estimator's per-sample gradients computed for the first chunk of
    contexts only (the later chunks need the same memory, one after the other), the rest
    stood in for by an empty result of the full shape."""
    from . import fisher

    original = fisher.map_in_chunks

    def first(fn, *batched, row_bytes, max_bytes):
        rows = max(1, max_bytes // max(1, row_bytes))
        head = fn(*(t[:rows] for t in batched))
        return torch.empty(batched[0].shape[0], *head.shape[1:], dtype=head.dtype, device=head.device)

    fisher.map_in_chunks = first
    try:
        yield
    finally:
        fisher.map_in_chunks = original


def _label_slots(model, n_labels: int | None) -> int:
    """Distinct label slots of a Fisher draw: ``n_labels`` at most, the vocabulary at most
    (0 where the model has no output matrix to read the vocabulary from: then traced in full)."""
    weight = getattr(model, "output_weight", None)
    if weight is None:
        return 0
    vocab = weight.shape[0]
    return min(n_labels or vocab, vocab)


def _fisher_working_peak(run, slots: int) -> int:
    """The Fisher trace's working peak with ``slots`` label slots: the hooked path
    (``fisher._HookedBlock``) keeps each slot's squared norms until it sums them, so its peak
    grows by the same bytes per slot — traced at 2 and 3 slots and extrapolated (equal to
    tracing every slot: 101,365,912 bytes both ways on the isoloss tiny model, 11 slots); the
    vmap path ignores the limit (its two traces are equal)."""
    from . import fisher

    if slots <= 3:
        return _working_peak(run)
    peaks = []
    for k in (2, 3):
        fisher.META_LABEL_SLOTS[0] = k
        try:
            peaks.append(_working_peak(run))
        finally:
            fisher.META_LABEL_SLOTS[0] = None
    return peaks[0] + (slots - 2) * (peaks[1] - peaks[0])


def _working_peak(run) -> int:
    with stand_in_reads(), meta_probes(), first_chunk_only(), StorageTracker() as tracker:
        run()
    return tracker.peak


def _sentences(s: dict) -> int:
    """Sentences to run a Hessian measure on: with micro-batches, two of them show the
    steady state (one graph alive at a time, the products summed), so no more are run."""
    micro = s.get("micro_batch")
    return s["n_sentences"] if micro is None else min(s["n_sentences"], 2 * micro)


def peak_bytes(measure: str, model_config, settings: dict | None = None, legacy: bool = False) -> MemoryEstimate:
    """The device memory that ``measure`` (one of ``MEASURES``) needs on the model of
    ``model_config`` (a ``TransformerConfig`` / ``LSTMConfig``, e.g.
    ``models.transformer_config("t3-1024", vocab_size, max_len)``), with ``settings``
    (the measure's keyword arguments and fields of its ``FixedBatch`` / ``FisherContexts``,
    over ``DEFAULTS[measure]``). ``legacy``: the top eigenvalue as the code before issue 26
    held it (see the module docstring)."""
    from .fisher import FisherContexts, trace_fisher
    from .hessian import FixedBatch, sam_sharpness, top_eigenvalue, trace_hutchinson

    if measure not in MEASURES:
        raise UserError(f"unknown curvature measure {measure!r}; choose from {', '.join(MEASURES)}")
    unknown = set(settings or {}) - set(DEFAULTS[measure])
    if unknown:
        raise UserError(f"unknown setting(s) of {measure}: {', '.join(sorted(unknown))}; "
                        f"valid: {', '.join(DEFAULTS[measure])}")
    s = {**DEFAULTS[measure], **(settings or {})}
    model = meta_model(model_config)
    n_params = sum(p.numel() for p in model.parameters())
    itemsize = next(model.parameters()).dtype.itemsize
    weights = n_params * itemsize
    parts: dict[str, int] = {"weights": weights}
    host, notes = 0, []

    if measure in ("trace_hutchinson", "trace_hutchpp"):
        # Hutchinson: one chunk of probes is the steady state (each chunk frees the last)
        probes = s["n_probes"] if measure == "trace_hutchpp" else min(s["n_probes"], s["probe_chunk"])
        fixed = FixedBatch(batch=stand_in_batch(model_config, _sentences(s)), micro_batch=s["micro_batch"])
        parts["working"] = _working_peak(lambda: trace_hutchinson(
            model, None, fixed, n_probes=probes, probe_chunk=s["probe_chunk"], by_block=s["by_block"],
            estimator=measure.removeprefix("trace_")))
        host = s["probe_chunk"] * n_params * itemsize
    elif measure == "top_eigenvalue":
        fixed = FixedBatch(batch=stand_in_batch(model_config, _sentences(s)), micro_batch=s["micro_batch"])
        if legacy:
            # the operator and one product (a basis of 2, no restart), then the old basis
            parts["working"] = _working_peak(lambda: top_eigenvalue(model, None, fixed, max_iter=1, basis_size=2))
            parts["basis (float64, max_iter vectors)"] = s["max_iter"] * n_params * 8
            parts["re-stacked copy of the basis"] = s["max_iter"] * n_params * 8
        else:
            # a 2-vector basis through one restart, then the basis_size − 2 vectors more
            parts["working"] = _working_peak(lambda: top_eigenvalue(model, None, fixed, max_iter=4, basis_size=2))
            parts["basis beyond 2 vectors"] = (s["basis_size"] - 2) * n_params * itemsize
        host = n_params * 8  # the float64 start vector
    elif measure == "sam_sharpness":
        batch = stand_in_batch(model_config, s["n_sentences"])
        parts["working"] = _working_peak(lambda: sam_sharpness(model, None, batch=batch))
    elif measure == "adaptive_trace":  # as the Fisher trace: one block of contexts
        from .adaptive import adaptive_trace

        contexts = FisherContexts(batch=stand_in_batch(model_config, s["block_size"]), block_size=s["block_size"],
                                  max_chunk_bytes=s["max_chunk_bytes"], hooks=s["hooks"])
        parts["working"] = _fisher_working_peak(lambda: adaptive_trace(
            model, None, contexts, n_labels=s["n_labels"], by_block=s["by_block"]),
            slots=_label_slots(model, s["n_labels"]))
        notes.append("labels: as many distinct ones per context as the vocabulary and n_labels allow")
    else:  # trace_fisher: one block of contexts is the steady state
        contexts = FisherContexts(batch=stand_in_batch(model_config, s["block_size"]), block_size=s["block_size"],
                                  max_chunk_bytes=s["max_chunk_bytes"], ghost_norms=s["ghost_norms"])
        parts["working"] = _fisher_working_peak(lambda: trace_fisher(
            model, None, contexts, n_labels=s["n_labels"], by_block=s["by_block"]),
            slots=_label_slots(model, s["n_labels"]))
        notes.append("labels: as many distinct ones per context as the vocabulary and n_labels allow (the worst "
                     "case; a trained model's peaked conditionals repeat labels and need less)")
    return MemoryEstimate(measure, sum(parts.values()), parts, s, host, n_params, notes)


def training_step_bytes(model_config, batch_size: int) -> int:
    """The device memory of one AdamW training step of ``model_config``'s model on
    ``batch_size`` full-length sentences (``sameloss plan``): the weights, the peak of the
    forward and backward (activations and gradients, float32), and AdamW's two moments."""
    model = meta_model(model_config)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    tokens = torch.zeros(batch_size, model_config.max_len, dtype=torch.long, device="meta")
    with stand_in_reads(), StorageTracker() as tracker:
        model(tokens).float().logsumexp(-1).sum().backward()
    return weights + tracker.peak + 2 * weights


def forward_bytes(model_config, n_sentences: int) -> int:
    """The device memory of one forward pass without gradients over ``n_sentences``
    full-length sentences, with float64 log-probabilities of every position (the exact-KL
    evaluation's chunk; probe features need less)."""
    model = meta_model(model_config)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    tokens = torch.zeros(n_sentences, model_config.max_len, dtype=torch.long, device="meta")
    with torch.no_grad(), stand_in_reads(), StorageTracker() as tracker:
        torch.log_softmax(model(tokens).double(), -1)
    return weights + tracker.peak


def memory_table(sizes: tuple[str, ...] = ("t3-256", "t3-768", "t3-1024"), vocab_size: int = 203,
                 max_len: int = 32, settings: dict[str, dict] | None = None) -> list[dict]:
    """Rows ``{size, measure, variant, gib}`` for every measure at every size: ``before``
    (the code before issue 26, where it differs), ``after`` (the defaults), and, for the
    Hessian measures, ``after, micro_batch=64``. The vocabulary and length default to the
    paper's PCFG (200 words + 3 specials, 32 tokens)."""
    from ...models import transformer_config

    rows = []
    for size in sizes:
        cfg = transformer_config(size, vocab_size, max_len, dropout=0.0, attn_dropout=0.0)
        for measure in MEASURES:
            given = (settings or {}).get(measure, {})
            variants = [("after", given, False)]
            if measure == "top_eigenvalue":
                variants.insert(0, ("before", given, True))
            if "micro_batch" in DEFAULTS[measure]:
                variants.append(("after, micro_batch=64", {**given, "micro_batch": 64}, False))
            for variant, s, legacy in variants:
                est = peak_bytes(measure, cfg, s, legacy=legacy)
                rows.append({"size": size, "measure": measure, "variant": variant, "gib": est.gib,
                             "n_params": est.n_params, "parts_gib": {k: v / 2**30 for k, v in est.parts.items()}})
    return rows

