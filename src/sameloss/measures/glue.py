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
reported is dev accuracy, as in the paper's GLUE rows. With ``n_train`` (``measure
--task-size N``) and more rows than ``n_train + n_validation``, a seeded sample
stratified by label (each class in proportion) of ``n_train`` training and
``n_validation`` validation rows is kept instead; ``dev.tsv`` stays whole.

Files are UTF-8 (a leading byte-order mark is dropped, as spreadsheets write one);
anything else — another encoding, a binary file — is one ``UserError`` line.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

import numpy as np
import torch

from ..errors import UserError
from .tasks import Split, TaskData

GLUE_COLUMNS = {"sst2": ("sentence",), "qnli": ("question", "sentence"), "rte": ("sentence1", "sentence2")}
PAIR_LABELS = {"entailment": 0, "not_entailment": 1}
PREFIX = "glue:"
VALIDATION_FRACTION = 0.1
# The most classes a task may have: GLUE's tasks have 2-3, the offline sets of ``data
# fetch`` up to 20. The probe and the fine-tuning head hold examples x classes outputs,
# so a stray label (1e9) would allocate terabytes: refused with that estimate instead.
MAX_CLASSES = 1000


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
    folder = Path(folder).expanduser()  # the shell leaves a ~ after "=" alone
    if not folder.is_dir():
        raise UserError(f"GLUE folder not found: {folder}")
    return name, folder


def glue_label(task: str) -> str:
    """The column name of a task in measured rows: ``glue:sst2=DIR`` → ``sst2``."""
    return task[len(PREFIX):].partition("=")[0] if is_glue(task) else task


def read_glue_tsv(path: Path, name: str) -> tuple[list[tuple[str, ...]], list[int]]:
    """The text columns and integer labels of one GLUE TSV."""
    from ..languages.text import read_text

    if not path.is_file():
        raise UserError(f"{path} not found (a GLUE folder needs train.tsv and dev.tsv)")
    try:
        rows = list(csv.reader(io.StringIO(read_text(path), newline=""), delimiter="\t", quoting=csv.QUOTE_NONE))
    except csv.Error as exc:
        raise UserError(f"{path}: not a tab-separated file ({exc})") from None
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
            if label >= MAX_CLASSES:
                n = len(rows) - 1
                raise UserError(f"{path}:{number}: label {label} would make a task of {label + 1} classes; its "
                                f"{n} examples' class scores alone would take {n} x {label + 1} x 4 bytes = "
                                f"{_bytes(4 * n * (label + 1))} (a task may have at most {MAX_CLASSES} classes)")
        texts.append(tuple(row[i] for i in where[:-1]))
        labels.append(label)
    return texts, labels


def _bytes(n: float) -> str:
    for unit in ("bytes", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.3g} {unit}"
        n /= 1000
    return f"{n:.3g} TB"


def stratified_sample(labels: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` indices of ``labels`` (sorted), drawn without replacement, each class in
    proportion to its count (largest remainders round the quotas to ``n``)."""
    labels = np.asarray(labels)
    order = rng.permutation(labels.size)
    by_class = order[np.argsort(labels[order], kind="stable")]  # each class's rows, in random order
    classes, counts = np.unique(labels, return_counts=True)
    exact = counts * n / labels.size
    quota = np.floor(exact).astype(np.int64)
    quota[np.argsort(-(exact - quota), kind="stable")[:n - int(quota.sum())]] += 1
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    picked = np.concatenate([by_class[s:s + q] for s, q in zip(starts, quota)])
    return np.sort(picked)


def split_rows(labels: torch.Tensor, seed: int, n_train: int | None = None,
               n_validation: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(train, validation)`` row indices (module docstring): all rows less a seeded
    10 % for validation; or, with ``n_train`` and more rows than ``n_train +
    n_validation`` (default ``n_train // 4``, at least 1), a label-stratified sample."""
    n = len(labels)
    rng = np.random.default_rng(seed)
    if n_train is not None:
        n_validation = max(1, n_train // 4) if n_validation is None else n_validation
    if n_train is None or n <= n_train + n_validation:
        order = torch.from_numpy(rng.permutation(n))
        n_val = max(1, round(VALIDATION_FRACTION * n)) if n > 1 else 0
        return order[n_val:].sort().values, order[:n_val].sort().values
    y = labels.numpy()
    kept = stratified_sample(y, n_train + n_validation, rng)
    val = kept[stratified_sample(y[kept], n_validation, rng)]
    train = np.setdiff1d(kept, val)
    return torch.from_numpy(train), torch.from_numpy(val)


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


def glue_task_data(language, task: str, seed: int = 0, n_train: int | None = None,
                   n_validation: int | None = None) -> TaskData:
    """Train / validation / test (= dev) splits of a GLUE-format task for a model
    pre-trained on a corpus or on the causal language (whose out-of-vocabulary sentences
    are dropped: ``kept_fraction``); ``n_train`` / ``n_validation``: a label-stratified
    sample of the training rows (``split_rows``)."""
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
        tr, val = split_rows(y, seed, n_train, n_validation)
    else:
        tr, val = split_rows(y, seed, n_train, n_validation)
        used = torch.cat([tr, val]).sort().values  # only the rows kept are encoded
        if used.numel() < len(y):
            train_texts = [train_texts[i] for i in used.tolist()]
            y = y[used]
            where = torch.full((int(used.max()) + 1,), -1, dtype=torch.long)
            where[used] = torch.arange(used.numel())
            tr, val = where[tr], where[val]
        x, dx = encode_examples(language, train_texts), encode_examples(language, dev_texts)

    def split(tokens, labels):
        return Split(tokens, language.lengths_of(tokens), labels)

    return TaskData(language=language.name, task=name, n_classes=n_classes, train=split(x[tr], y[tr]),
                    validation=split(x[val], y[val]), test=split(dx, dy), seed=seed, kept_fraction=kept_fraction)
