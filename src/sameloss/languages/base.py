"""The protocol every synthetic language shares.

Token ids: words are ``0 .. n_words-1``; the special tokens follow them
(``pad_id = n_words``, ``mask_id = n_words + 1``, ``cls_id = n_words + 2``), so a
conditional distribution over words is simply the first ``n_words`` entries of a
vocabulary-sized vector. Sentences are left-aligned and padded on the right.

A language offers

* ``sample(n, generator) -> Batch`` — sentences (and the latent structure, if any);
* ``conditionals(tokens, masked, query=None)`` — exact ``P(x_t = w | unmasked tokens)``
  in float64 for every query position (default: the masked ones), marginalising the
  other masked positions, in one batched pass;
* ``entropy(...)`` — the optimal MLM loss with its standard error;
* ``tasks`` — named downstream tasks.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

N_SPECIAL = 3  # pad, mask, cls


@dataclass(frozen=True)
class Batch:
    """Sampled sentences.

    tokens: ``[n, T]`` long, padded with ``pad_id`` after ``lengths``.
    lengths: ``[n]`` long.
    latent: language-specific structure (HMM: hidden states ``[n, T]``; PCFG: the
        constituents as rows ``(sentence, start, end, symbol)``), or ``None``.
    """

    tokens: torch.Tensor
    lengths: torch.Tensor
    latent: torch.Tensor | None = None

    def __len__(self) -> int:
        return self.tokens.shape[0]


@dataclass(frozen=True)
class Estimate:
    """A Monte-Carlo estimate with its standard error."""

    mean: float
    stderr: float
    n: int

    def __str__(self) -> str:
        return f"{self.mean:.4f} ± {self.stderr:.4f}"


@dataclass(frozen=True)
class Task:
    """A downstream task: a labeller from sentences to class ids.

    ``label(batch)`` returns ``[n]`` long labels; ``-1`` marks a sentence the task
    leaves out (for example a span that cannot be a constituent). ``sample`` draws the
    task's input distribution when it differs from the pre-training one (Dyck); by
    default the language's own sampler is used.

    Where the label is about a latent at fixed positions (an HMM's k-th hidden state, the
    PCFG symbol over the first k words), ``span = (start, end)`` gives them (0-based,
    ``end`` exclusive; ``end=None``: to the end of each sentence) and ``posterior(tokens)``
    the exact float64 ``[n, K]`` vector the label is the argmax of (the hidden state's
    posterior, the span symbol's posterior given the sentence): where a span probe reads a
    model (``measures.headroom.span_view``) and what the oracle reads. ``None``: the task
    has none.
    """

    name: str
    n_classes: int
    label: Callable[[Batch], torch.Tensor]
    description: str = ""
    sample: Callable[[int, torch.Generator | None], Batch] | None = field(default=None)
    span: tuple[int, int | None] | None = None
    posterior: Callable[[torch.Tensor], torch.Tensor] | None = field(default=None)


def ratio_estimate(numerators: torch.Tensor, denominators: torch.Tensor) -> Estimate:
    """Σ numerators / Σ denominators with a delta-method standard error.

    Used for token-weighted means where each sentence contributes a sum over its tokens
    (numerator) and a token count (denominator).
    """
    num = numerators.double()
    den = denominators.double()
    n = num.numel()
    total = den.sum()
    ratio = num.sum() / total
    if n < 2:
        return Estimate(float(ratio), float("nan"), n)
    resid = num - ratio * den
    var = resid.pow(2).sum() / (n - 1) * n / total.pow(2)
    return Estimate(float(ratio), float(var.sqrt()), n)


def sample_mask(
    lengths: torch.Tensor, max_len: int, rate: float | None, generator: torch.Generator | None,
    maskable: torch.Tensor | None = None,
) -> torch.Tensor:
    """Positions to mask, ``[n, max_len]`` bool.

    ``rate=None``: exactly one position per sentence, uniform over its tokens.
    Otherwise each token is masked independently with probability ``rate``, and a
    sentence that drew none gets one uniform position, so every sentence has at
    least one prediction target. ``maskable`` (``[n, max_len]`` bool, optional) limits
    both to those positions (a corpus never masks ``[CLS]`` or ``[SEP]``). Drawn on
    ``lengths``' device (that of ``generator``).
    """
    n = lengths.shape[0]
    pos = torch.arange(max_len, device=lengths.device)
    valid = pos[None, :] < lengths[:, None]
    # one uniform position per sentence (used alone, or as the fallback)
    u = torch.rand(n, generator=generator, dtype=torch.float64, device=lengths.device)
    if maskable is None:
        one = (u * lengths.double()).long().clamp(max=max_len - 1)
        single = pos[None, :] == one[:, None]
    else:
        valid = valid & maskable
        count = valid.sum(dim=1)
        one = (u * count.double()).long().clamp(max=max_len - 1)
        single = valid & (valid.cumsum(dim=1) - 1 == one[:, None])  # the one-th maskable position
    if rate is None:
        return single & valid
    if not 0.0 < rate <= 1.0:
        raise ValueError(f"mask rate must be in (0, 1], got {rate}")
    draws = torch.rand(n, max_len, generator=generator, device=lengths.device) < rate
    masked = draws & valid
    empty = ~masked.any(dim=1)
    return torch.where(empty[:, None], single & valid, masked)  # (no data-dependent indexing)


def entropy_of(probs: torch.Tensor) -> torch.Tensor:
    """Shannon entropy (nats) along the last axis, with 0 log 0 = 0."""
    return -torch.special.xlogy(probs, probs).sum(dim=-1)


class Language(ABC):
    """Base class: subclasses set ``n_words``, ``max_len``, ``words`` and implement
    ``sample`` and ``conditionals``."""

    name: str = "language"
    n_words: int
    max_len: int
    words: list[str]

    # ---- vocabulary -----------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self.n_words + N_SPECIAL

    @property
    def pad_id(self) -> int:
        return self.n_words

    @property
    def mask_id(self) -> int:
        return self.n_words + 1

    @property
    def cls_id(self) -> int:
        return self.n_words + 2

    def decode(self, tokens: torch.Tensor) -> str:
        """One sentence of ids as text (pad dropped, mask shown as ``[MASK]``).

        Args:
            tokens: ``[T]`` ids.

        Returns:
            the words, space-separated.
        """
        out = []
        for t in tokens.tolist():
            if t == self.pad_id:
                continue
            out.append("[MASK]" if t == self.mask_id else "[CLS]" if t == self.cls_id else self.words[t])
        return " ".join(out)

    def lengths_of(self, tokens: torch.Tensor) -> torch.Tensor:
        return (tokens != self.pad_id).sum(dim=1)

    # ---- the protocol ---------------------------------------------------------------
    @abstractmethod
    def sample(self, n: int, generator: torch.Generator | None = None) -> Batch:
        """Draw ``n`` sentences.

        Args:
            n: sentences.
            generator: the random stream (``None``: torch's global one).

        Returns:
            the sentences, their lengths and their latent structure (if any).
        """

    @abstractmethod
    def conditionals(
        self, tokens: torch.Tensor, masked: torch.Tensor, query: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Exact masked-token conditionals, every query position in one batched pass.

        Query positions need not be masked: the conditional of a position never depends on
        its own word.

        Args:
            tokens: ``[n, T]`` ids (the value at a masked position is ignored).
            masked: ``[n, T]`` bool, positions whose word is hidden (marginalised).
            query: ``[n, T]`` bool, the positions to return ``P(x_t | tokens at unmasked
                positions other than t)`` for (default: ``masked``).

        Returns:
            float64 ``[Q, n_words]``, one row per query position in ``query.nonzero()``
            (row-major) order.
        """

    @property
    def tasks(self) -> dict[str, Task]:
        return {}

    # ---- derived quantities ---------------------------------------------------------
    def entropy(
        self,
        n_sentences: int = 10_000,
        generator: torch.Generator | None = None,
        mask_rate: float | None = None,
        batch_size: int = 2048,
    ) -> Estimate:
        """The optimal MLM loss (nats per masked token) with its standard error: the mean
        entropy of the true conditionals.

        Args:
            n_sentences: sentences sampled.
            generator: the random stream of the sentences and masks.
            mask_rate: ``None``: one masked position per sentence, averaged over every token
                of every sentence (token-weighted: all single-mask conditionals come from one
                pass); else random masks at that rate (at least one per sentence), averaged
                over the masked tokens — the optimal loss of MLM training at that rate.
            batch_size: sentences per pass.

        Returns:
            the estimate (``mean``, ``stderr``).
        """
        sums, counts = [], []
        for start in range(0, n_sentences, batch_size):
            batch = self.sample(min(batch_size, n_sentences - start), generator)
            tok = batch.tokens
            valid = torch.arange(tok.shape[1])[None, :] < batch.lengths[:, None]
            if mask_rate is None:
                masked = torch.zeros_like(valid)
                query = valid
            else:
                masked = sample_mask(batch.lengths, tok.shape[1], mask_rate, generator)
                query = masked
            h = entropy_of(self.conditionals(tok, masked, query))
            per_sentence = torch.zeros(tok.shape[0], dtype=torch.float64)
            per_sentence.index_add_(0, query.nonzero()[:, 0], h)
            sums.append(per_sentence)
            counts.append(query.sum(dim=1))
        return ratio_estimate(torch.cat(sums), torch.cat(counts))

    def describe(self, n_sentences: int = 4096, seed: int = 0, n_examples: int = 5,
                 mask_rate: float = 0.15) -> dict:
        """The summary ``sameloss language describe`` prints.

        Reports the optimal loss both with one masked position per sentence and at the
        training masking rate: for some languages (Dyck) a single masked token is
        determined by the rest and only the masked-rate figure is informative.

        Args:
            n_sentences: sentences sampled for the statistics.
            seed: of the samples.
            n_examples: example sentences shown.
            mask_rate: the training masking rate of the second entropy.

        Returns:
            a JSON-ready dict: vocabulary, lengths, both entropies, each task's class count,
            majority rate and kept fraction, examples.
        """
        gen = torch.Generator().manual_seed(seed)
        batch = self.sample(n_sentences, gen)
        lengths = batch.lengths.double()
        ent = self.entropy(n_sentences, gen)
        ent_masked = self.entropy(n_sentences, gen, mask_rate=mask_rate)
        tasks = {}
        for name, task in self.tasks.items():
            tb = task.sample(n_sentences, gen) if task.sample is not None else batch
            labels = task.label(tb)
            kept = labels[labels >= 0]
            counts = torch.bincount(kept, minlength=task.n_classes)
            tasks[name] = {
                "n_classes": task.n_classes,
                "classes_seen": int((counts > 0).sum()),
                "majority_rate": float(counts.max() / max(kept.numel(), 1)),
                "kept_fraction": float(kept.numel() / max(labels.numel(), 1)),
                "description": task.description,
            }
        return {
            "language": self.name,
            "n_words": self.n_words,
            "vocab_size": self.vocab_size,
            "max_len": self.max_len,
            "length": {
                "mean": float(lengths.mean()),
                "std": float(lengths.std()) if lengths.numel() > 1 else 0.0,
                "min": int(batch.lengths.min()),
                "max": int(batch.lengths.max()),
            },
            "entropy": {"mean": ent.mean, "stderr": ent.stderr, "n_sentences": ent.n,
                        "bits": ent.mean / math.log(2)},
            "entropy_masked": {"mean": ent_masked.mean, "stderr": ent_masked.stderr,
                               "n_sentences": ent_masked.n, "mask_rate": mask_rate},
            "tasks": tasks,
            "examples": [self.decode(batch.tokens[i]) for i in range(min(n_examples, len(batch)))],
        }
