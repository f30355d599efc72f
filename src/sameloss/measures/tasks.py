"""Downstream data sets: labelled train / validation / test splits of a language's task.

``make_task_data(language, "task-5", n_train=2000, n_validation=500, n_test=1000, seed=0)``
draws sentences (from the task's own ``sample`` if it has one — Dyck's task uses uniform
strings — else from the language), labels them with ``task.label`` and drops the
sentences the task leaves out (label ``-1``) until each split has its size. The paper
uses 0.1M examples per task (App. A.2); the defaults here are small enough for a CPU.

Determinism and independence. Each split draws from its own ``torch.Generator`` whose
seed is a hash of ``(seed, split)`` (``split_seed``), apart from the pre-training stream
(``training.data.step_generator`` mixes ``(seed, step)`` with other constants), so the same
``seed`` gives the same splits, and the three splits are independent draws. They are not
de-duplicated: they are i.i.d. samples of the task distribution, as in the paper; on a
language with few distinct sentences (a short Dyck length) the same sentence can appear in
two splits.

Every split's tokens are ``[n, language.max_len]`` (padded on the right with ``pad_id``),
so representations that concatenate all positions have the same width in every split.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from tqdm import tqdm

from sameloss.errors import UserError
from sameloss.languages.base import Batch, Language, Task

SPLITS = ("train", "validation", "test")
# sentences are drawn and labelled in chunks of at most this many (labellers are batched)
CHUNK = 4096
# give up when this many sentences were drawn without filling a split (the task leaves
# almost everything out)
MAX_DRAW_FACTOR = 50


@dataclass(frozen=True)
class Split:
    """One labelled split: ``tokens [n, max_len]`` long (pad on the right), ``lengths [n]``
    and ``labels [n]`` long in ``0 .. n_classes-1``."""

    tokens: torch.Tensor
    lengths: torch.Tensor
    labels: torch.Tensor

    def __len__(self) -> int:
        return int(self.labels.shape[0])


@dataclass(frozen=True)
class TaskData:
    """A task's three splits, with what produced them."""

    language: str
    task: str
    n_classes: int
    train: Split
    validation: Split
    test: Split
    seed: int
    kept_fraction: float  # fraction of drawn sentences the task labels (not -1)

    def sizes(self) -> dict[str, int]:
        return {name: len(getattr(self, name)) for name in SPLITS}

    def majority(self) -> tuple[int, float]:
        """The most frequent training class and its rate on the test split — the accuracy
        of always predicting it (the majority-class baseline)."""
        counts = torch.bincount(self.train.labels, minlength=self.n_classes)
        top = int(counts.argmax())
        rate = float((self.test.labels == top).double().mean()) if len(self.test) else float("nan")
        return top, rate


def get_task(language: Language, name: str) -> Task:
    """The task called ``name``; a ``UserError`` listing the valid names otherwise."""
    tasks = language.tasks
    if name not in tasks:
        valid = ", ".join(tasks) if tasks else "(none)"
        hint = "; a corpus model takes GLUE-format tasks, glue:NAME=DIR" if not getattr(language, "exact", True) else ""
        raise UserError(f"language {language.name!r} has no task {name!r}; its tasks are: {valid}{hint}")
    return tasks[name]


def split_seed(seed: int, split: str) -> int:
    """The generator seed of one split: a multiplicative hash of ``(seed, split)``,
    different for every pair and apart from the pre-training stream's seeds."""
    index = SPLITS.index(split)
    return (seed * 0x2545F491 + (index + 1) * 0x9E3779B97F4A7C15 + 0x5851F42D) % (2**63 - 1)


def _pad_to(tokens: torch.Tensor, width: int, pad_id: int) -> torch.Tensor:
    if tokens.shape[1] == width:
        return tokens
    if tokens.shape[1] > width:
        raise ValueError(f"sampled sentences of width {tokens.shape[1]} exceed max_len {width}")
    out = torch.full((tokens.shape[0], width), pad_id, dtype=tokens.dtype)
    out[:, :tokens.shape[1]] = tokens
    return out


def draw_split(language: Language, task: Task, n: int, generator: torch.Generator,
               progress: bool = False, desc: str = "") -> tuple[Split, int, int]:
    """``n`` labelled sentences (label ``-1`` dropped), how many sentences were drawn in
    all and how many of those the task labelled."""
    sampler = task.sample if task.sample is not None else language.sample
    tokens, lengths, labels = [], [], []
    have = drawn = labelled = 0
    bar = tqdm(total=n, desc=desc, unit="ex", disable=not progress, leave=False)
    while have < n:
        if drawn >= MAX_DRAW_FACTOR * max(n, CHUNK):
            bar.close()
            raise UserError(
                f"task {task.name!r} labels only {have} of {drawn} sentences drawn "
                f"(label -1 for the rest); cannot fill a split of {n}")
        # ask for what is missing, scaled up by the kept fraction seen so far
        rate = labelled / drawn if drawn and labelled else 1.0
        want = min(CHUNK, max(16, int((n - have) / max(rate, 1e-3) * 1.1) + 1))
        batch: Batch = sampler(want, generator)
        y = task.label(batch).long()
        if y.shape != (len(batch),):
            raise ValueError(f"task {task.name!r} returned labels of shape {tuple(y.shape)} for {len(batch)} sentences")
        good = (y >= 0).nonzero().flatten()
        labelled += good.numel()
        keep = good[: n - have]
        if keep.numel() and int(y[keep].max()) >= task.n_classes:
            raise ValueError(f"task {task.name!r} returned a label >= n_classes ({task.n_classes})")
        tokens.append(_pad_to(batch.tokens[keep].long(), language.max_len, language.pad_id))
        lengths.append(batch.lengths[keep].long())
        labels.append(y[keep])
        have += keep.numel()
        drawn += len(batch)
        bar.update(keep.numel())
    bar.close()
    if not tokens:  # n == 0
        empty = torch.empty(0, language.max_len, dtype=torch.long)
        return Split(empty, torch.empty(0, dtype=torch.long), torch.empty(0, dtype=torch.long)), 0, 0
    return Split(torch.cat(tokens), torch.cat(lengths), torch.cat(labels)), drawn, labelled


def make_task_data(language: Language, task: str, n_train: int = 2000, n_validation: int = 500,
                   n_test: int = 1000, seed: int = 0, progress: bool = False) -> TaskData:
    """Train / validation / test splits of a language's task, a pure function of the arguments.

    Args:
        language: the language whose task it is.
        task: the task's name (``language.tasks``; e.g. ``task-5``, ``span-1``, ``B``).
        n_train: training examples.
        n_validation: validation examples.
        n_test: test examples.
        seed: of the sentences drawn.
        progress: show a progress bar.

    Returns:
        the splits (token ids and labels each).
    """
    t = get_task(language, task)
    sizes = {"train": n_train, "validation": n_validation, "test": n_test}
    for name, size in sizes.items():
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise UserError(f"n_{name} must be a non-negative integer, got {size!r}")
    if n_train < 1 or n_test < 1:
        raise UserError("a task needs at least one training and one test example")
    splits, labelled, drawn = {}, 0, 0
    for name in SPLITS:
        gen = torch.Generator().manual_seed(split_seed(seed, name))
        splits[name], d, k = draw_split(language, t, sizes[name], gen, progress, desc=f"{task} {name}")
        labelled += k
        drawn += d
    return TaskData(language=language.name, task=task, n_classes=t.n_classes, seed=seed,
                    kept_fraction=labelled / max(drawn, 1), **splits)
