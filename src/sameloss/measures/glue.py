"""Downstream tasks from GLUE-format TSV files, for models pre-trained on a corpus.

A task is named ``glue:NAME=DIR`` (``sameloss measure RUN --finetune glue:sst2=DIR``);
``DIR`` holds ``train.tsv`` and ``dev.tsv`` with a header row naming the columns, as GLUE
distributes them:

* ``sst2``: ``sentence``, ``label``;
* ``qnli``: ``question``, ``sentence``, ``label``;
* ``rte``: ``sentence1``, ``sentence2``, ``label``.

Other columns (GLUE's ``index``) are ignored. Labels are integers; for the two pair tasks
GLUE's own strings ``entailment`` (0) and ``not_entailment`` (1) are accepted too.
Files are read with the ``csv`` module (tab-separated, no quoting, as GLUE's TSVs are
written), so ``datasets`` is not needed.

Inputs are encoded with the corpus's tokenizer as ``[CLS] a [SEP]`` or ``[CLS] a [SEP] b
[SEP]`` (the longer text is cut first when a pair is over ``max_len``), padded to the
corpus's ``max_len``.

For the causal language (``language.name=causal``; the paper's SST-2 / QNLI on OPT
data) inputs are re-tokenised with the generator's own tokenizer (the generator folder
must hold one) and mapped into the language's K-token vocabulary:

* length rule: a text is cut to its first T tokens (a pair: the two parts joined with no
  separator — the K words have none — the longer cut first, as above), and padded to T;
* out-of-vocabulary rule: an example with a token outside the K allowed ones (within
  those T), or with no token, is *dropped*, not altered — a mapped or deleted token
  would make sentences the language cannot produce. The fraction kept is reported
  (``kept_fraction``); too few kept examples is an error.

Splits: the training rows less a seeded 10 % (the validation split
that picks the fine-tuning epoch), and ``dev.tsv`` as the test split — the accuracy
reported is dev accuracy, as in the paper's GLUE rows.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import torch

from ..errors import UserError
from .tasks import Split, TaskData

GLUE_COLUMNS = {"sst2": ("sentence",), "qnli": ("question", "sentence"), "rte": ("sentence1", "sentence2")}
PAIR_LABELS = {"entailment": 0, "not_entailment": 1}
PREFIX = "glue:"
VALIDATION_FRACTION = 0.1


def is_glue(task: str) -> bool:
    return task.startswith(PREFIX)


def parse_glue(task: str) -> tuple[str, Path]:
    """``glue:NAME=DIR`` → ``(NAME, DIR)``, checked."""
    body = task[len(PREFIX):]
    name, sep, folder = body.partition("=")
    if not sep or not folder:
        raise UserError(f"a GLUE task is written glue:NAME=DIR, got {task!r}")
    if name not in GLUE_COLUMNS:
        raise UserError(f"unknown GLUE task {name!r}; choose from {', '.join(GLUE_COLUMNS)}")
    folder = Path(folder)
    if not folder.is_dir():
        raise UserError(f"GLUE folder not found: {folder}")
    return name, folder


def glue_label(task: str) -> str:
    """The column name of a task in measured rows: ``glue:sst2=DIR`` → ``sst2``."""
    return task[len(PREFIX):].partition("=")[0] if is_glue(task) else task


def read_glue_tsv(path: Path, name: str) -> tuple[list[tuple[str, ...]], list[int]]:
    """The text columns and integer labels of one GLUE TSV."""
    if not path.is_file():
        raise UserError(f"{path} not found (a GLUE folder needs train.tsv and dev.tsv)")
    with path.open(encoding="utf-8", newline="") as f:
        rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    rows = [r for r in rows if any(c.strip() for c in r)]
    if not rows:
        raise UserError(f"{path} is empty")
    header = [c.strip() for c in rows[0]]
    wanted = (*GLUE_COLUMNS[name], "label")
    missing = [c for c in wanted if c not in header]
    if missing:
        raise UserError(f"{path}: missing column {missing[0]!r} in the header (a {name} TSV has columns "
                        f"{', '.join(wanted)})")
    where = [header.index(c) for c in wanted]
    if len(rows) < 2:
        raise UserError(f"{path} has a header but no examples")
    texts, labels = [], []
    for number, row in enumerate(rows[1:], 2):
        if len(row) <= max(where):
            raise UserError(f"{path}:{number}: {len(row)} columns, expected {len(header)}")
        raw = row[where[-1]].strip()
        if name != "sst2" and raw in PAIR_LABELS:
            label = PAIR_LABELS[raw]
        else:
            try:
                label = int(raw)
            except ValueError:
                raise UserError(f"{path}:{number}: label {raw!r} is not an integer") from None
            if label < 0:
                raise UserError(f"{path}:{number}: label {label} is negative")
        texts.append(tuple(row[i] for i in where[:-1]))
        labels.append(label)
    return texts, labels


def _cut(la: int, lb: int, budget: int) -> tuple[int, int]:
    """Lengths of a pair's two parts within ``budget`` tokens: the longer one is cut first."""
    if la + lb <= budget:
        return la, lb
    if la >= lb:
        lb = min(lb, budget // 2)
        return budget - lb, lb
    la = min(la, budget // 2)
    return la, budget - la


def encode_causal(language, texts: list[tuple[str, ...]]) -> tuple[torch.Tensor, torch.Tensor]:
    """``([n, T] language ids, [n] kept)`` for the causal language (module docstring):
    the generator's tokenizer, a pair's parts joined without separator (the longer cut
    first) within T tokens, padded; a sentence with a token outside the K allowed
    (within those T) or with no token is not kept."""
    T, pad = language.max_len, language.pad_id
    to_language = language.generator_to_language().numpy()
    columns = [language.encode_generator([(" " if k else "") + t[k].strip() for t in texts])
               for k in range(len(texts[0]))]
    out = np.full((len(texts), T), pad, dtype=np.int64)
    kept = np.zeros(len(texts), dtype=bool)
    for i in range(len(texts)):  # building rows of ragged lists (the tokenizer's work is batched)
        parts = [c[i] for c in columns]
        if len(parts) == 1:
            seq = parts[0][:T]
        else:
            la, lb = _cut(len(parts[0]), len(parts[1]), T)
            seq = parts[0][:la] + parts[1][:lb]
        seq = np.asarray(seq, dtype=np.int64)
        # a tokenizer may know ids the model's head lacks (added tokens): out of vocabulary too
        ids = np.where(seq < to_language.size, to_language[seq.clip(max=to_language.size - 1)], -1)
        if ids.size and (ids >= 0).all():
            out[i, :ids.size] = ids
            kept[i] = True
    return torch.from_numpy(out), torch.from_numpy(kept)


def encode_examples(language, texts: list[tuple[str, ...]]) -> torch.Tensor:
    """``[n, max_len]`` ids: ``[CLS] a [SEP]`` or ``[CLS] a [SEP] b [SEP]``, padded."""
    T, cls, sep, pad = language.max_len, language.cls_id, language.sep_id, language.pad_id
    columns = [language.encode([t[k] for t in texts]) for k in range(len(texts[0]))]
    out = np.full((len(texts), T), pad, dtype=np.int64)
    for i in range(len(texts)):  # building rows of ragged lists (the tokenizer's work is batched)
        parts = [c[i] for c in columns]
        budget = T - 1 - len(parts)
        if len(parts) == 1:
            a = parts[0][:budget]
            seq = [cls, *a, sep]
        else:
            la, lb = _cut(len(parts[0]), len(parts[1]), budget)
            seq = [cls, *parts[0][:la], sep, *parts[1][:lb], sep]
        out[i, :len(seq)] = seq
    return torch.from_numpy(out)


def glue_task_data(language, task: str, seed: int = 0) -> TaskData:
    """Train / validation / test (= dev) splits of a GLUE-format task for a model
    pre-trained on a corpus or on the causal language (whose out-of-vocabulary sentences
    are dropped: ``kept_fraction``)."""
    name, folder = parse_glue(task)
    causal = hasattr(language, "encode_generator")
    if not causal and not hasattr(language, "encode"):
        raise UserError(f"GLUE tasks need a model pre-trained on a corpus (language.name=corpus) or on the causal "
                        f"language; this one was trained on {language.name!r}")
    train_texts, train_labels = read_glue_tsv(folder / "train.tsv", name)
    dev_texts, dev_labels = read_glue_tsv(folder / "dev.tsv", name)
    n_classes = max(2, max(train_labels + dev_labels) + 1)
    y, dy = torch.tensor(train_labels, dtype=torch.long), torch.tensor(dev_labels, dtype=torch.long)
    kept_fraction = 1.0
    if causal:
        x, keep = encode_causal(language, train_texts)
        dx, dkeep = encode_causal(language, dev_texts)
        for file, k in (("train.tsv", keep), ("dev.tsv", dkeep)):
            if int(k.sum()) < (2 if file == "train.tsv" else 1):
                raise UserError(f"{folder / file}: {int(k.sum())} of {len(k)} examples use only the causal "
                                f"language's K={language.n_words} allowed tokens within their first "
                                f"{language.max_len} tokens; too few to train and test on")
        kept_fraction = float(keep.sum() + dkeep.sum()) / (len(keep) + len(dkeep))
        x, y, dx, dy = x[keep], y[keep], dx[dkeep], dy[dkeep]
    else:
        x, dx = encode_examples(language, train_texts), encode_examples(language, dev_texts)
    order = torch.from_numpy(np.random.default_rng(seed).permutation(len(y)))
    n_val = max(1, round(VALIDATION_FRACTION * len(y))) if len(y) > 1 else 0
    val, tr = order[:n_val].sort().values, order[n_val:].sort().values

    def split(tokens, labels):
        return Split(tokens, language.lengths_of(tokens), labels)

    return TaskData(language=language.name, task=name, n_classes=n_classes, train=split(x[tr], y[tr]),
                    validation=split(x[val], y[val]), test=split(dx, dy), seed=seed, kept_fraction=kept_fraction)
