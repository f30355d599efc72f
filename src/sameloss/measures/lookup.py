"""The look-up-table baseline (App. A.5, Table 1 of the paper).

"The lookup table can be thought of as a model whose input is the masked sentence and
always output[s] the true conditional probabilities ... its pre-training loss is exactly
the entropy of [the] true conditional probability ... To evaluate [its] downstream
performance ... we concatenate the true conditional probability vector at each token as
the contextual embeddings and linear probe on top of it."

Representation (``lookup_features``): position ``t`` of a sentence is represented by
``P(x_t = · | x_{-t})`` — the true conditional of the word at ``t`` given every other
word, i.e. the output of the perfect MLM when ``t`` alone is masked — a vector of
``n_words`` probabilities. One ``language.conditionals(tokens, masked=all False,
query=real positions)`` call gives all of them (a position's conditional never depends on
its own word). Rows are concatenated over the ``max_len`` positions, with zeros at pad
positions (as the linear probe zeroes a model's pad features), giving
``[n, max_len · n_words]``.

A context the language gives probability zero has no conditional (``NaN``; e.g. Dyck's
task draws uniform bracket strings, most of which are not sentences of the pre-training
language). Such rows are set to zero — the table has nothing to say there — and their
number is reported in the result's settings (``nan_positions``).

The probe on top is ``probe.probe_features`` (same head, projection and seeds as the
linear probe of a model).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from tqdm import tqdm

from sameloss.languages.base import Language
from sameloss.measures.probe import DownstreamResult, ProbeSettings, probe_features
from sameloss.measures._compat import PROBE, old_keywords
from sameloss.measures.tasks import SPLITS, TaskData


@torch.no_grad()
def lookup_features(language: Language, tokens: torch.Tensor, batch_size: int = 4096,
                    progress: bool = False, return_nan_count: bool = False):
    """The look-up table's representation, float32 ``[n, T · n_words]`` (see the module
    docstring); with ``return_nan_count`` also the number of positions whose conditional
    was undefined (zeroed)."""
    n, T = tokens.shape
    W = language.n_words
    out = torch.zeros(n, T, W, dtype=torch.float32)
    nan_positions = 0
    for start in tqdm(range(0, n, batch_size), desc="conditionals", unit="batch", disable=not progress,
                      leave=False):
        tok = tokens[start:start + batch_size]
        real = tok != language.pad_id
        masked = torch.zeros_like(real)
        cond = language.conditionals(tok, masked, real)  # rows follow real.nonzero()
        bad = torch.isnan(cond).any(dim=1)
        if bad.any():
            nan_positions += int(bad.sum())
            cond = cond.masked_fill(bad[:, None], 0.0)
        out[start:start + tok.shape[0]][real] = cond.float()
    out = out.reshape(n, T * W)
    return (out, nan_positions) if return_nan_count else out


@old_keywords("settings", 2, ProbeSettings.of, PROBE, positional=("method", str, True))
def lookup_table_probe(language: Language, data: TaskData, settings: ProbeSettings = ProbeSettings(),
                       device: str | torch.device = "cpu", progress: bool = False) -> DownstreamResult:
    """The look-up-table baseline: a linear probe (``probe.probe_features``) on the true
    conditionals of the task's sentences — what the pre-training target itself carries.

    Args:
        language: the language (its exact conditionals are the features).
        data: the task's splits, of this language.
        settings: the head's training, the seeds and the projection (``probe.ProbeSettings``).
        device: where the head is trained.
        progress: show a progress bar.

    Returns:
        the test accuracy, mean ± std over the seeds.
    """
    if language.name != data.language:
        raise ValueError(f"task data of language {data.language!r} given with language {language.name!r}")
    features, nans = {}, 0
    for s in SPLITS:
        features[s], k = lookup_features(language, getattr(data, s).tokens, progress=progress,
                                         return_nan_count=True)
        nans += k
    extra = {"representation": "true single-mask conditionals of all positions concatenated, pad positions zero",
             "n_words": language.n_words, "nan_positions": nans}
    return probe_features(features, data, settings, measure="lookup_table", extra_settings=extra, device=device,
                          progress=progress)
