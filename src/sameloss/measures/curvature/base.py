"""What every curvature measure shares: its result, the parameter blocks, the loss batch
and the contexts, and a chunked map. The parameter selection, the measuring mode and the
engine live in ``models.derivatives`` (the training-time flatness penalty differentiates
through them too), where the measures import them from."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ...errors import UserError
from ...languages.base import Language
from ...models.derivatives import Blocks, SelectedParameters
from ...training.data import MaskedBatch, mask_batch, step_generator

# Random streams of ``step_generator`` (the training stream is 0, held-out evaluation 1).
STREAM_LOSS_BATCH = 11
STREAM_CONTEXTS = 12
STREAM_DRAWS = 13  # labels sampled from the model, Hutchinson probes, Lanczos start


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


# ---- data ----------------------------------------------------------------------------------
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
