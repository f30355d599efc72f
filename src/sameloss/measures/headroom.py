"""Headroom of a downstream task: few-shot span probes of every representation, one table.

A task separates models only if a trained encoder sits well above what needs no training
(the look-up table, a random encoder) and well below what knows the answer (the oracle).
``headroom_table`` measures that, for any task whose label is about a latent at fixed
positions (``Task.span`` and ``Task.posterior``: an HMM's k-th hidden state, the PCFG
symbol over the first k words), with the same few-shot design for every row:

* **majority** — always the most frequent training class (its test rate);
* **random-init encoder** — the trained model's architecture, freshly initialised
  (``random_init_encoder``: the run's own initial weights, drawn without touching the
  global RNG);
* **look-up table** — the true single-mask conditionals ``P(x_t = · | x_{-t})`` at the
  span's positions (``lookup.lookup_features``): the perfect MLM's output;
* **trained** — each encoder given (its final hidden states at the span's positions);
* **oracle** — the task's exact posterior (the vector its label is the argmax of: the
  hidden state's posterior, P(symbol spans the span | sentence) from inside–outside).

The span's representation (``span_view``). The span is fixed per task and every labelled
sentence covers it (a span task labels ``-1`` a sentence shorter than the span), so
position ``t`` of the span is the same word slot in every example. The default
``pooling="concat"`` concatenates the span's per-position vectors: for a span of one
position (an HMM state) it *is* the position probe, it keeps word order (the symbol over
``w1 w2`` need not be the one over ``w2 w1``), and a linear probe on it can represent
any probe on the mean (so mean-pooling could only lose accuracy); a span of k positions
costs k × d features (≤ 8 × 64 for the headroom sizes, a few seconds of L-BFGS). For long
spans (the whole sentence, ``end=None``) ``pooling="mean"`` averages over the span's real
words instead (pads left out). Pad positions of a span are zero in every representation,
as in ``probe.extract_features``.

Probes: converged L-BFGS linear heads (``fewshot.fewshot_accuracies``, ``method="lbfgs"``,
``l2`` on the standardised features), trained on the same ``subsets`` of ``n`` examples
drawn from one labelled pool and tested on one test set (``tasks.make_task_data``), so
every row is paired down to the subset with every other. The margins (``Headroom.margins``)
are the trained model's accuracy minus the better of look-up and random-init, and the
oracle's minus the trained model's, in points.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import torch

from ..errors import UserError
from ..languages.base import Language, Task
from .fewshot import fewshot_accuracies, subset_indices
from .lookup import lookup_features
from .probe import extract_features, model_pad_id
from .tasks import TaskData, get_task, make_task_data

POOLINGS = ("concat", "mean")
KINDS = ("majority", "random-init", "look-up", "trained", "oracle")


@dataclass(frozen=True)
class HeadroomDesign:
    """The few-shot design every row of a headroom table gets: ``task``; per size ``n`` in
    ``sizes``, ``subsets`` training subsets of the ``pool``-example labelled pool; one test
    set of ``test`` examples; the convex probe's ``l2``; how the span is pooled; the data
    and subsets' seed."""

    task: str
    sizes: tuple[int, ...] = (200,)
    subsets: tuple[int, ...] = (40,)
    pool: int = 2000
    test: int = 20_000
    l2: float = 1e-2
    pooling: str = "concat"
    seed: int = 0

    def __post_init__(self):
        if len(self.sizes) != len(self.subsets) or not self.sizes:
            raise UserError("headroom design: one subset count per probe size, at least one size")
        if min(self.sizes) < 1 or max(self.sizes) > self.pool or min(self.subsets) < 1 or self.test < 1:
            raise UserError(f"headroom design: sizes {self.sizes} must lie in 1..pool={self.pool}, subsets >= 1, "
                            f"test >= 1")
        if self.pooling not in POOLINGS:
            raise UserError(f"headroom design: pooling must be one of {', '.join(POOLINGS)}, got {self.pooling!r}")
        if not (self.l2 > 0 and math.isfinite(self.l2)):
            raise UserError(f"headroom design: l2 must be a positive number, got {self.l2}")


@dataclass
class HeadroomRow:
    """One representation's few-shot accuracy (fractions) per probe size: the mean over
    subsets, its std (ddof 1) and every subset's accuracy."""

    name: str
    kind: str
    accuracy: dict[int, float]
    std: dict[int, float] = field(default_factory=dict)
    subsets: dict[int, list[float]] = field(default_factory=dict)
    features: int = 0  # the probe's input width (0: majority)


@dataclass
class Headroom:
    """A headroom table: the task, its span and pooling, and the rows in ``KINDS`` order."""

    language: str
    task: str
    span: tuple[int, int | None]
    pooling: str
    n_classes: int
    rows: list[HeadroomRow]

    def of(self, kind: str) -> list[HeadroomRow]:
        return [r for r in self.rows if r.kind == kind]

    def accuracy(self, kind: str, n: int) -> float:
        """The mean accuracy of the rows of one kind (e.g. several trained seeds) at size ``n``."""
        rows = self.of(kind)
        return float(np.mean([r.accuracy[n] for r in rows])) if rows else float("nan")

    def margins(self, n: int) -> dict[str, float]:
        """In points at size ``n``: the trained model (mean over trained rows) above the
        look-up table, above the random-init encoder, and below the oracle; ``headroom``
        is the smallest of the three (nan where a row is missing)."""
        trained = self.accuracy("trained", n)
        out = {"above_lookup": 100 * (trained - self.accuracy("look-up", n)),
               "above_random_init": 100 * (trained - self.accuracy("random-init", n)),
               "below_oracle": 100 * (self.accuracy("oracle", n) - trained)}
        out["headroom"] = min(out.values())
        return out

    def to_dicts(self) -> list[dict]:
        """One flat dict per row (``acc_n200``, ``acc_n200_std``, ...), for a CSV."""
        out = []
        for r in self.rows:
            d = {"language": self.language, "task": self.task, "representation": r.name, "kind": r.kind,
                 "features": r.features}
            for n, a in r.accuracy.items():
                d[f"acc_n{n}"] = a
                d[f"acc_n{n}_std"] = r.std.get(n, 0.0)
            out.append(d)
        return out

    def format(self) -> str:
        """The table as plain text (accuracies in %), with the margins."""
        sizes = list(self.rows[0].accuracy)
        head = f"{'representation':<40}" + "".join(f"{'n=' + str(n):>16}" for n in sizes)
        lines = [f"headroom of {self.language} task {self.task} (span {_span_text(self.span)}, "
                 f"{self.pooling}, {self.n_classes} classes)", head]
        for r in self.rows:
            cells = "".join(f"{100 * r.accuracy[n]:>9.1f} ± {100 * r.std.get(n, 0.0):4.1f}" for n in sizes)
            lines.append(f"{r.name:<40}{cells}")
        if self.of("trained"):
            for n in sizes:
                m = self.margins(n)
                lines.append(f"margins at n={n} (points): trained − look-up {m['above_lookup']:+.1f}, trained − "
                             f"random-init {m['above_random_init']:+.1f}, oracle − trained {m['below_oracle']:+.1f}")
        return "\n".join(lines)


def _span_text(span: tuple[int, int | None]) -> str:
    return f"[{span[0]}, {'end' if span[1] is None else span[1]})"


def span_task(language: Language, name: str) -> Task:
    """The task ``name`` of ``language``, which must have a span and a posterior."""
    task = get_task(language, name)
    if task.span is None or task.posterior is None:
        raise UserError(f"task {name!r} of {language.name} is not about a latent at fixed positions (no span and "
                        f"posterior): it has no span probe or oracle")
    return task


def span_view(states: torch.Tensor, tokens: torch.Tensor, pad_id: int, span: tuple[int, int | None],
              pooling: str = "concat") -> torch.Tensor:
    """``[n, D]``: the per-position representation ``states [n, T, d]`` restricted to the
    span (``pooling="concat"``: ``D = span length × d``; ``"mean"``: the mean over the
    span's real words, ``D = d``), pad positions zero."""
    start, end = span
    end = states.shape[1] if end is None else end
    h = states[:, start:end]
    real = (tokens[:, start:end] != pad_id)[..., None].to(h.dtype)
    h = h * real
    if pooling == "concat":
        return h.reshape(h.shape[0], -1)
    if pooling == "mean":
        return h.sum(dim=1) / real.sum(dim=1).clamp(min=1)
    raise ValueError(f"unknown pooling {pooling!r}")


def encoder_states(model: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """``[n, T, d]`` float32: a frozen encoder's final hidden states, zero at pads."""
    flat = extract_features(model, tokens, model_pad_id(model))
    return flat.reshape(tokens.shape[0], tokens.shape[1], -1)


def lookup_states(language: Language, tokens: torch.Tensor) -> torch.Tensor:
    """``[n, T, n_words]`` float32: the true single-mask conditionals, zero at pads."""
    return lookup_features(language, tokens).reshape(tokens.shape[0], tokens.shape[1], language.n_words)


def random_init_encoder(cfg, language: Language, seed: int | None = None) -> torch.nn.Module:
    """The model of run config ``cfg`` as initialised from ``seed`` (default ``cfg.seed``:
    the run's own initial weights), on the CPU; the global RNG is left as it was."""
    from ..training.runio import init_model

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed if seed is None else seed)
        return init_model(cfg, language, "cpu")


def probe_rows(pool_x: torch.Tensor, test_x: torch.Tensor, data: TaskData, design: HeadroomDesign
               ) -> tuple[dict[int, float], dict[int, float], dict[int, list[float]]]:
    """Mean, std (ddof 1) and per-subset test accuracy of the converged L-BFGS probe on
    ``[pool, D]`` / ``[test, D]`` features, per size of the design."""
    mean, std, subsets = {}, {}, {}
    for n, k in zip(design.sizes, design.subsets):
        idx = subset_indices(design.pool, n, k, design.seed)
        acc, _ = fewshot_accuracies(pool_x, data.train.labels, test_x, data.test.labels, data.n_classes, idx,
                                    "lbfgs", l2=design.l2)
        mean[n] = float(np.mean(acc))
        std[n] = float(np.std(acc, ddof=1)) if len(acc) > 1 else 0.0
        subsets[n] = acc
    return mean, std, subsets


def task_data(language: Language, design: HeadroomDesign) -> TaskData:
    """The design's labelled pool and test set (no validation split: few-shot)."""
    span_task(language, design.task)
    return make_task_data(language, design.task, n_train=design.pool, n_validation=0, n_test=design.test,
                          seed=design.seed)


def headroom_table(language: Language, design: HeadroomDesign, trained: Mapping[str, torch.nn.Module] | None = None,
                   random_init: torch.nn.Module | Mapping[str, torch.nn.Module] | None = None,
                   data: TaskData | None = None) -> Headroom:
    """The headroom table of ``design.task`` (see the module docstring): majority,
    random-init encoder(s) (``random_init``: one model or name → model), look-up table,
    each ``trained`` encoder (name → model), oracle. ``data``: the design's
    ``task_data`` when the caller already has it."""
    task = span_task(language, design.task)
    data = data if data is not None else task_data(language, design)
    pad = language.pad_id

    def row(name: str, kind: str, features) -> HeadroomRow:
        pool_x, test_x = features(data.train.tokens), features(data.test.tokens)
        mean, std, subsets = probe_rows(pool_x, test_x, data, design)
        return HeadroomRow(name, kind, mean, std, subsets, features=int(pool_x.shape[1]))

    def at_span(per_position):
        return lambda tok: span_view(per_position(tok), tok, pad, task.span, design.pooling)

    majority = data.majority()[1]
    rows = [HeadroomRow("majority class", "majority", {n: majority for n in design.sizes},
                        {n: 0.0 for n in design.sizes})]
    if isinstance(random_init, torch.nn.Module):
        random_init = {"random-init encoder": random_init}
    for name, model in (random_init or {}).items():
        rows.append(row(name, "random-init", at_span(lambda tok, m=model: encoder_states(m, tok))))
    rows.append(row("look-up table (true conditionals)", "look-up", at_span(lambda tok: lookup_states(language, tok))))
    for name, model in (trained or {}).items():
        rows.append(row(name, "trained", at_span(lambda tok, m=model: encoder_states(m, tok))))
    # the oracle's posterior is already about the span: no view
    rows.append(row("oracle (true posterior)", "oracle", task.posterior))
    return Headroom(language.name, design.task, task.span, design.pooling, data.n_classes, rows)
