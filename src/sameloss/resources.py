"""Refuse work that cannot fit in memory, before allocating any of it.

A setting such as ``model.d_model=100000``, ``eval.n_sentences=100000000`` or ``measure
--contexts 100000000`` used to start allocating — tens of GB in seconds, or minutes of
work — before the machine ran out of memory. Each entry point now estimates what the
setting needs from the configuration alone (the model on the meta device: no memory,
no initialisation) and refuses with one line naming the estimate and the limit.

The estimates are lower bounds (what the named tensors alone take, not a profile), so
a refusal is certain to be right, and work that fits is never refused; the limit leaves
room for everything else (``MEMORY_SHARE``).

This module holds the arithmetic and the limit only; the checks live in the layers they
check: a run's (``training.runio.check_pretrain``), a measure's
(``measures.run.check_measure``), sampled sentences' (``check_sentences``, here).
"""

from __future__ import annotations

import os

from .errors import UserError

# The share of the machine's physical memory one command may plan to use: the rest is
# for the OS, Python and torch themselves, other processes, and what the lower-bound
# estimates below leave out.
MEMORY_SHARE = 0.8
# Set to a number of bytes to state another limit (a job's allowance on a shared node).
LIMIT_ENV = "SAMELOSS_MEMORY_LIMIT"
# Bytes per token of sampled sentences: token ids, model inputs and targets (int64) and
# the mask (bool) — a lower bound; measured on a 2-core CPU (peak RSS of sampling 10^5
# sentences): Dyck 29-35, HMM 66-67, PCFG 356-372 bytes per token (the PCFG keeps its trees).
SENTENCE_BYTES_PER_TOKEN = 32
# A task's examples for a probe / fine-tuning / the look-up table: per token, the
# sentences, labels and per-position buffers (TASK_BYTES_PER_TOKEN), plus per feature
# (one entry of a position's hidden state; the look-up table: of its conditionals) the
# float32 features of every split and the working copies. Fitted to the peak RSS over
# the data of 7·10^4 examples on a 2-core CPU — probe: 320 B/token at d 16 (HMM), 844 at
# d 64 (PCFG), i.e. 145 + 10.9·d; fine-tuning: 176 and 433, i.e. 90 + 5.4·d — rounded
# down, so an estimate never exceeds what the work takes.
TASK_BYTES_PER_TOKEN = 90
PROBE_BYTES_PER_FEATURE = 10
FINETUNE_BYTES_PER_FEATURE = 5
FLOAT32, FLOAT64 = 4, 8


def physical_memory() -> int:
    """Bytes of physical memory of this machine (0 if the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def memory_limit() -> tuple[int, str]:
    """``(bytes, how it was set)``: ``$SAMELOSS_MEMORY_LIMIT``, else ``MEMORY_SHARE`` of
    the physical memory (0: no limit known)."""
    text = os.environ.get(LIMIT_ENV, "").strip()
    if text:
        try:
            value = int(float(text))
        except ValueError:
            value = 0
        if value <= 0:
            raise UserError(f"{LIMIT_ENV}={text!r} is not a number of bytes > 0 (unset it to use "
                            f"{MEMORY_SHARE:.0%} of the physical memory)")
        return value, f"${LIMIT_ENV}"
    total = physical_memory()
    return int(total * MEMORY_SHARE), f"{MEMORY_SHARE:.0%} of this machine's {human(total)}"


def device_memory_limit(device) -> tuple[int, str]:
    """The limit for tensors on ``device``: a CUDA device's own memory, else ``memory_limit``."""
    import torch

    device = torch.device(device)
    if device.type == "cuda" and torch.cuda.is_available():
        total = torch.cuda.get_device_properties(device.index or 0).total_memory
        return int(total * MEMORY_SHARE), f"{MEMORY_SHARE:.0%} of the GPU's {human(total)}"
    return memory_limit()


def human(n: float) -> str:
    for unit in ("bytes", "kB", "MB", "GB", "TB", "PB"):
        if abs(n) < 1000 or unit == "PB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.3g} {unit}"
        n /= 1000
    raise AssertionError


def check(estimate: float, what: str, hint: str, device=None) -> None:
    """``UserError`` (one line: the estimate, the limit, what to change) when ``estimate``
    bytes exceed the limit of ``device`` (default: the machine's memory)."""
    limit, how = device_memory_limit(device) if device is not None else memory_limit()
    if limit and estimate > limit:
        raise UserError(f"{what} needs at least {human(estimate)} of memory, over the limit of {human(limit)} "
                        f"({how}); {hint}")


def sentences_bytes(n: int, language) -> int:
    """A lower bound of ``n`` sampled and masked sentences of ``language``."""
    return n * language.max_len * SENTENCE_BYTES_PER_TOKEN


def conditionals_bytes(rows: int, language) -> int:
    """Exact conditionals of ``rows`` masked positions (float64 over the words), and the
    model's log-probabilities beside them."""
    return rows * (language.n_words + language.vocab_size) * FLOAT64


def masked_rows(n: int, language, rate: float | None) -> int:
    return n if rate is None else int(n * language.max_len * rate)


def evaluation_bytes(n: int, language, rate: float | None) -> int:
    """The fixed held-out set of an evaluator: exact conditionals on a synthetic
    language; on a corpus a held-out and a training set of sequences."""
    if not getattr(language, "exact", True):
        return 2 * sentences_bytes(n, language)
    return sentences_bytes(n, language) + conditionals_bytes(masked_rows(n, language, rate), language)


def check_sentences(n: int, language, what: str, hint: str) -> None:
    """Refuse sampling ``n`` sentences (and their exact conditionals) that cannot fit."""
    check(evaluation_bytes(n, language, None) + sentences_bytes(n, language), what, hint)
