"""What the fixed-batch Hessian measures share (Hutchinson, Hutch++, the top eigenvalue):
their cost per Hessian-vector product, and the micro-batch that fits the device."""

from __future__ import annotations

from ... import resources
from ..spec import Job, MeasureSpec

# ``sameloss measure`` holds a Hessian's graph for the whole curvature batch unless that
# would not fit: then for the largest power-of-two share of it that does
SMALLEST_MICRO_BATCH = 1


def hessian_product_flops(spec: MeasureSpec, shape) -> float:
    """One Hessian-vector product over the curvature batch: about two forward and backward
    passes (3× a forward each)."""
    return spec.curvature_sentences * 2 * 3 * shape.sentence_flops


def curvature_micro_batch(job: Job, measure: str, settings: dict) -> int | None:
    """``spec.micro_batch`` when given; else ``None`` (the whole batch at once) when the
    measure's own peak-memory estimate (``memory.peak_bytes``, times the allocator's
    slack ``memory.ALLOCATOR_SLACK``) fits the device's limit
    (``resources.device_memory_limit``), else the largest power of two below the batch
    that fits (at least 1). A model the estimate cannot build (a Hugging Face model) keeps
    the whole batch. Worked out once per model shape and settings in a call (``job.cache``)."""
    spec = job.spec
    config = getattr(job.model, "config", None)
    if spec.micro_batch is not None or not _estimable(config):
        return spec.micro_batch
    key = ("micro_batch", measure, repr(config), spec.curvature_sentences, tuple(sorted(settings.items())),
           str(spec.device))
    if key not in job.cache:
        job.cache[key] = _fitting_micro_batch(measure, config, spec.curvature_sentences, settings, spec.device)
    return job.cache[key]


def _estimable(config) -> bool:
    from ...models import kind_of_config

    return config is not None and kind_of_config(config) is not None


def _fitting_micro_batch(measure: str, config, n_sentences: int, settings: dict, device) -> int | None:
    import torch

    from ..curvature.memory import ALLOCATOR_SLACK, peak_bytes

    limit, _ = resources.device_memory_limit(device)
    if not limit:
        return None
    candidates = [None]
    size = 1 << (max(n_sentences - 1, 1)).bit_length() - 1  # the largest power of two below the batch
    while size >= SMALLEST_MICRO_BATCH:
        candidates.append(size)
        size //= 2
    with torch.random.fork_rng(devices=[]):  # the estimate draws nothing, but it must not be able to
        for micro in candidates:
            need = peak_bytes(measure, config, {**settings, "n_sentences": n_sentences, "micro_batch": micro}).bytes
            if need * ALLOCATOR_SLACK <= limit:
                return micro
    return candidates[-1]
