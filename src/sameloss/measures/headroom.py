"""Headroom of a downstream task: few-shot span probes of every representation, one table.

A task separates models only if a trained encoder sits well above what needs no training
(the look-up table, a random encoder) and well below what knows the answer (the oracle).
``headroom_table`` measures that, for any task whose label is about a latent at fixed
positions (``Task.span`` and ``Task.posterior``: an HMM's k-th hidden state, the PCFG
symbol over the first k words), with the same few-shot design for every row:

* **majority** — always the most frequent training class (its test rate);
* **random-init encoder** — a run's model as initialised (its config: the run's own
  initial weights, drawn without touching the global RNG);
* **look-up table** — the true single-mask conditionals ``P(x_t = · | x_{-t})`` at the
  span's positions (``lookup.lookup_features``): the perfect MLM's output;
* **trained** — each encoder given (its final hidden states at the span's positions);
* **oracle** — the task's exact posterior (the vector its label is the argmax of: the
  hidden state's posterior, P(symbol spans the span | sentence) from inside–outside).

The span's representation (``span_view``: a ``fewshot.View`` of the span's positions). The
span is fixed per task and every labelled sentence covers it (a span task labels ``-1`` a
sentence shorter than the span), so position ``t`` of the span is the same word slot in
every example. The default ``pooling="concat"`` puts the span's per-position vectors side
by side: for a span of one position (an HMM state) it *is* the position probe, it keeps
word order (the symbol over ``w1 w2`` need not be the one over ``w2 w1``), and a linear
probe on it can represent any probe on the mean (so mean-pooling could only lose
accuracy); a span of k positions costs k × d features (≤ 8 × 64 for the headroom sizes, a
few seconds of L-BFGS). ``pooling="mean"`` averages the span's positions instead (for a
span to the end of the sentence, ``end=None``, over all ``T`` positions, pads counting as
the zeros every representation has there, as ``View`` does for the isoloss all-positions
probe).

The representations are the ones every study measures (``representations.py``): a model's
final hidden states (``model_representation``; the random-init encoder is
``reference_representation("random-init", ...)`` of a run config: its own initial weights,
the global RNG left alone), the look-up table (``reference_representation("lookup", ...)``),
and for the oracle the task's posterior as a one-position representation.

Probes: converged L-BFGS linear heads (``fewshot.fewshot_probes`` on the design's
``FewShot``: ``method="lbfgs"``, ``l2`` on the standardised features), trained on the same
``subsets`` of ``n`` examples drawn from one labelled pool and tested on one test set (the
pool and test set ``measures.run`` draws for the same ``FewShot``), so every row is paired
down to the subset with every other — and with the few-shot columns ``measure_model`` and
``measure_reference`` (``MeasureSpec(fewshot=design.fewshot(task))``) give. The margins (``Headroom.margins``) are
the trained model's accuracy minus the better of look-up and random-init, and the oracle's
minus the trained model's, in points.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import torch

from ..errors import UserError
from ..languages.base import Language, Task
from .fewshot import POOLINGS, FewShot, View, fewshot_probes
from .representations import model_representation, reference_representation
from .tasks import TaskData, get_task, make_task_data

KINDS = ("majority", "random-init", "look-up", "trained", "oracle")
VIEW = "span"  # the one view of a headroom design's FewShot


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

    def fewshot(self, view: View) -> FewShot:
        """This design as ``fewshot_probes`` (and ``MeasureSpec``) take it: one view, named
        ``span``, probed by the converged L-BFGS head."""
        return FewShot(self.task, ((VIEW, view),), self.sizes, self.subsets, self.pool, self.test,
                       endpoints=((VIEW, "lbfgs"),), l2=self.l2, seed=self.seed)


@dataclass
class HeadroomRow:
    """One representation's few-shot accuracy (fractions) per probe size: the mean over
    subsets, its std (ddof 1), every subset's accuracy and the largest gradient norm the
    L-BFGS heads left (how converged they are)."""

    name: str
    kind: str
    accuracy: dict[int, float]
    std: dict[int, float] = field(default_factory=dict)
    subsets: dict[int, list[float]] = field(default_factory=dict)
    features: int = 0  # the probe's input width (0: majority)
    grad: dict[int, float] = field(default_factory=dict)


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


def span_view(span: tuple[int, int | None], pooling: str = "concat") -> View:
    """The ``View`` of a representation ``[n, T, d]`` that reads the span ``[start, end)``
    (``end=None``: to the last position): its positions side by side (``concat``,
    ``[n, len · d]``) or averaged (``mean``, ``[n, d]``)."""
    start, end = span
    return View(None if end is None else tuple(range(start, end)), pooling)


def task_data(language: Language, design: HeadroomDesign) -> TaskData:
    """The design's labelled pool and test set (no validation split: few-shot) — the ones
    ``measures.run`` draws for ``design.fewshot(...)``."""
    span_task(language, design.task)
    return make_task_data(language, design.task, n_train=design.pool, n_validation=0, n_test=design.test,
                          seed=design.seed)


def headroom_table(language: Language, design: HeadroomDesign, trained: Mapping[str, torch.nn.Module] | None = None,
                   random_init=None, data: TaskData | None = None) -> Headroom:
    """The headroom table of ``design.task`` (see the module docstring): majority,
    random-init encoder(s) (``random_init``: a run config — ``PretrainConfig``, its model
    as initialised from its ``seed`` — or name → config), look-up table, each ``trained``
    encoder (name → model), oracle. ``data``: the design's ``task_data`` when the caller
    already has it."""
    task = span_task(language, design.task)
    data = data if data is not None else task_data(language, design)
    at_span = design.fewshot(span_view(task.span, design.pooling))
    whole = design.fewshot(View((0,)))  # the oracle's posterior is about the span already

    def row(name: str, kind: str, representation, fewshot: FewShot = at_span) -> HeadroomRow:
        pool_h, test_h = representation(data.train.tokens), representation(data.test.tokens)
        r = fewshot_probes(pool_h, test_h, data.train.labels, data.test.labels, data.n_classes, fewshot)
        keys = {n: f"{VIEW}_lbfgs_n{n}" for n in design.sizes}
        return HeadroomRow(name, kind, {n: r[k] for n, k in keys.items()}, {n: r[k + "_std"] for n, k in keys.items()},
                           {n: r[k + "_subsets"] for n, k in keys.items()},
                           features=int(fewshot.view(VIEW)(pool_h[:1]).shape[1]),
                           grad={n: r[k + "_grad"] for n, k in keys.items()})

    majority = data.majority()[1]
    rows = [HeadroomRow("majority class", "majority", {n: majority for n in design.sizes},
                        {n: 0.0 for n in design.sizes})]
    if random_init is not None and not isinstance(random_init, Mapping):
        random_init = {"random-init encoder": random_init}
    for name, cfg in (random_init or {}).items():
        rows.append(row(name, "random-init", lambda tok, c=cfg: reference_representation("random-init", language, c,
                                                                                          tok)))
    rows.append(row("look-up table (true conditionals)", "look-up",
                    lambda tok: reference_representation("lookup", language, None, tok)))
    for name, model in (trained or {}).items():
        rows.append(row(name, "trained", lambda tok, m=model: model_representation(m, tok)))
    rows.append(row("oracle (true posterior)", "oracle", lambda tok: task.posterior(tok)[:, None, :], whole))
    return Headroom(language.name, design.task, task.span, design.pooling, data.n_classes, rows)
