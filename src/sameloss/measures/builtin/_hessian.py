"""What the fixed-batch Hessian measures share (Hutchinson, Hutch++, the top eigenvalue):
their fixed batch, their cost per Hessian-vector product, and the micro-batch that fits the
device."""

from __future__ import annotations

from ... import resources
from ..spec import Job, MeasureSpec, MemoryContext

# ``sameloss measure`` holds a Hessian's graph for the whole curvature batch unless that
# would not fit: then for the largest power-of-two share of it that does
SMALLEST_MICRO_BATCH = 1


def hessian_product_flops(spec: MeasureSpec, shape) -> float:
    """One Hessian-vector product over the curvature batch: about two forward and backward
    passes (3× a forward each)."""
    return spec.curvature_sentences * 2 * 3 * shape.sentence_flops


def curvature_micro_batch(job: Job, measure: str, settings: dict) -> int | None:
    """``spec.micro_batch`` when given, else the micro-batch that fits the device
    (``fitting_micro_batch`` under ``resources.device_memory_limit``). A model the estimate
    cannot build (a Hugging Face model) keeps the whole batch. Worked out once per model
    shape and settings in a call (``job.cache``)."""
    from ...models import kind_of_config

    spec = job.spec
    config = getattr(job.model, "config", None)
    if spec.micro_batch is not None or config is None or kind_of_config(config) is None:
        return spec.micro_batch
    key = ("micro_batch", measure, repr(config), spec.curvature_sentences, tuple(sorted(settings.items())),
           str(spec.device))
    if key not in job.cache:
        limit, _ = resources.device_memory_limit(spec.device)
        job.cache[key] = fitting_micro_batch(measure, config, spec.curvature_sentences, settings, limit)[0]
    return job.cache[key]


def curvature_batch(job: Job, measure: str, settings: dict):
    """The ``curvature.FixedBatch`` of ``job.spec``: ``curvature_sentences`` drawn with the
    spec's ``seed``, its ``params``, and the micro-batch of ``curvature_micro_batch``."""
    from ..curvature import FixedBatch

    spec = job.spec
    return FixedBatch(params=spec.params, n_sentences=spec.curvature_sentences, seed=spec.seed,
                      micro_batch=curvature_micro_batch(job, measure, settings))


def planned_peak(label: str, measure: str, spec: MeasureSpec, memory: MemoryContext, settings: dict) -> dict[str, int]:
    """The planned peak of a Hessian measure: at ``spec.micro_batch``, else at the one it
    would pick on the planned device (``memory.limit``), named in the label."""
    from ..curvature.memory import peak_bytes

    n = spec.curvature_sentences
    if spec.micro_batch is not None:
        return {label: peak_bytes(measure, memory.model_config, {**settings, "n_sentences": n,
                                                                  "micro_batch": spec.micro_batch}).bytes}
    micro, need = fitting_micro_batch(measure, memory.model_config, n, settings, memory.limit)
    return {label if micro is None else f"{label} (micro-batch {micro})": need}


def fitting_micro_batch(measure: str, config, n_sentences: int, settings: dict, limit: int) -> tuple[int | None, int]:
    """``(micro_batch, peak bytes)``: ``None`` (the whole batch at once) when the measure's
    own peak-memory estimate (``memory.peak_bytes``) times the allocator's slack
    (``memory.ALLOCATOR_SLACK``) is within ``limit`` bytes (0: no limit), else the largest
    power of two below the batch that is (at least 1)."""
    import torch

    from ..curvature.memory import ALLOCATOR_SLACK, peak_bytes

    candidates: list[int | None] = [None]
    size = 1 << (max(n_sentences - 1, 1)).bit_length() - 1  # the largest power of two below the batch
    while size >= SMALLEST_MICRO_BATCH:
        candidates.append(size)
        size //= 2
    with torch.random.fork_rng(devices=[]):  # the estimate draws nothing, but it must not be able to
        for micro in candidates:
            need = peak_bytes(measure, config, {**settings, "n_sentences": n_sentences, "micro_batch": micro}).bytes
            if not limit or need * ALLOCATOR_SLACK <= limit:
                break
    return micro, need
