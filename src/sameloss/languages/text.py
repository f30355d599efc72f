"""Real text: a prepared corpus as a language (``language.name=corpus language.data=DIR``).

``prepare_corpus(files, out, tokenizer=..., vocab=..., max_len=128)`` (``sameloss corpus
prepare``) reads documents from plain text (one document per line, or per blank-line
separated paragraph), JSONL (the ``text`` field of each record) or Parquet (the ``text``
column; needs ``pyarrow``), splits the *documents* into train and held-out by a seeded
permutation, tokenizes them with a local Hugging Face tokenizer folder or a WordPiece /
BPE tokenizer trained on the training documents (``tokenizers``), and writes to ``out``:

* ``tokenizer.json`` — the tokenizer (``tokenizers`` format);
* ``train-00000.npy``, ..., ``heldout-00000.npy`` — token shards ``[rows, max_len]``
  (uint16 when the ids fit, else int32);
* ``meta.json`` — sizes, special ids, the split, and the sha256 of every source file,
  shard and the tokenizer.

Sequences are built as in RoBERTa's "full sentences": the documents of a split are
joined into one token stream with ``[SEP]`` after each document and cut into chunks of
``max_len - 1`` tokens; each sequence is ``[CLS] chunk`` (the last one padded). So every
model trained on a corpus sees a CLS token at position 0, and fine-tuning can read it
(the paper's recipe, App. A.5).

Token ids follow the protocol of every language: the tokenizer's ids are the words
``0 .. n_words-1`` (its own special tokens, ``[SEP]`` among them, are words too), and
``pad``, ``mask``, ``cls`` come after them. ``[CLS]`` and ``[SEP]`` are never masked.

A corpus has no exact conditionals: ``conditionals`` raises, ``exact`` is False and the
pre-training evaluator reports the held-out cross-entropy instead of entropy + KL.
``sample(n, generator)`` draws ``n`` training sequences uniformly with replacement, so
a training batch is a pure function of ``(seed, step)`` like every other language's.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from ..errors import UserError
from ..files import sha256_of
from .base import Batch, Language

# the registry reads this from the file (``sameloss.registry``)
LANGUAGE = {"name": "corpus", "build": "build", "settings": ("data",), "describe": False}

META = "meta.json"
TOKENIZER = "tokenizer.json"
SHARD_ROWS = 65_536  # sequences per shard file
SPLITS = ("train", "heldout")
TRAINED_TOKENIZERS = ("wordpiece", "bpe")
SEP_CANDIDATES = ("[SEP]", "</s>", "<|endoftext|>")
# checksums of shards are verified on load up to this many bytes in all (beyond, only sizes)
VERIFY_BYTES = 256 * 2**20


# ---- reading documents --------------------------------------------------------------------
def read_documents(path: str | Path, doc_per: str = "line") -> list[str]:
    """The documents of one file: ``.jsonl`` (``text`` of each record), ``.parquet`` (the
    ``text`` column) or plain text (``doc_per``: ``line`` or ``paragraph``)."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"no such text file: {path}")
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json"):
        docs = []
        with path.open(encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise UserError(f"{path}:{number}: not a JSON record ({exc.msg})") from None
                if not isinstance(record, dict) or not isinstance(record.get("text"), str):
                    raise UserError(f"{path}:{number}: a JSONL record needs a string field 'text'")
                docs.append(record["text"])
    elif suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise UserError(f"reading {path} needs pyarrow (pip install pyarrow); or convert it to JSONL") from None
        table = pq.read_table(path)
        if "text" not in table.column_names:
            raise UserError(f"{path}: no 'text' column (columns: {', '.join(table.column_names)})")
        docs = [t for t in table.column("text").to_pylist() if isinstance(t, str)]
    else:
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise UserError(f"{path} is not UTF-8 text") from None
        if doc_per == "line":
            docs = text.splitlines()
        elif doc_per == "paragraph":
            docs = [" ".join(p.split()) for p in text.replace("\r\n", "\n").split("\n\n")]
        else:
            raise UserError(f"unknown document unit {doc_per!r}; choose line or paragraph")
    return [d.strip() for d in docs if d.strip()]


# ---- tokenizers -----------------------------------------------------------------------------
def _require_tokenizers():
    try:
        import tokenizers
    except ImportError:
        raise UserError("the corpus language needs the 'tokenizers' package (pip install 'sameloss[text]')") from None
    return tokenizers


def train_tokenizer(kind: str, documents: Sequence[str], vocab: int):
    """A lower-casing WordPiece (BERT's) or BPE tokenizer trained on ``documents``, with
    the special tokens ``[UNK]`` and ``[SEP]``."""
    tk = _require_tokenizers()
    from tokenizers import decoders, models, normalizers, pre_tokenizers, trainers

    special = ["[UNK]", "[SEP]"]
    if kind == "wordpiece":
        tok = tk.Tokenizer(models.WordPiece(unk_token="[UNK]"))
        tok.decoder = decoders.WordPiece()
        trainer = trainers.WordPieceTrainer(vocab_size=vocab, special_tokens=special, show_progress=False)
    elif kind == "bpe":
        tok = tk.Tokenizer(models.BPE(unk_token="[UNK]"))
        tok.decoder = decoders.BPEDecoder()
        trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=special, show_progress=False,
                                      end_of_word_suffix="</w>")
        tok.model = models.BPE(unk_token="[UNK]", end_of_word_suffix="</w>")
    else:
        raise UserError(f"unknown tokenizer {kind!r}; give a local tokenizer folder, wordpiece or bpe")
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.train_from_iterator(documents, trainer=trainer)
    return tok


def load_tokenizer_folder(folder: str | Path):
    """The fast tokenizer of a local Hugging Face tokenizer folder (no network)."""
    tk = _require_tokenizers()
    folder = Path(folder)
    if not folder.is_dir():
        raise UserError(f"tokenizer folder not found: {folder} (or give --tokenizer wordpiece / bpe)")
    if (folder / TOKENIZER).is_file():
        try:
            return tk.Tokenizer.from_file(str(folder / TOKENIZER))
        except Exception as exc:  # noqa: BLE001 - a broken file is the user's to fix
            raise UserError(f"cannot read {folder / TOKENIZER}: {str(exc).splitlines()[0]}") from None
    try:
        from transformers import AutoTokenizer
        hf = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except ImportError:
        raise UserError(f"{folder} has no tokenizer.json; reading other tokenizer files needs transformers") from None
    except Exception as exc:  # noqa: BLE001
        raise UserError(f"cannot load a tokenizer from {folder}: {str(exc).splitlines()[0]}") from None
    if not getattr(hf, "is_fast", False):
        raise UserError(f"the tokenizer in {folder} has no fast (tokenizers) version")
    return hf.backend_tokenizer


def _sep_id(tok) -> int:
    for token in SEP_CANDIDATES:
        i = tok.token_to_id(token)
        if i is not None:
            return int(i)
    raise UserError(f"the tokenizer has none of the separator tokens {', '.join(SEP_CANDIDATES)}")


def encode(tok, texts: Sequence[str]) -> list[list[int]]:
    """Token ids of each text, without the tokenizer's own special tokens."""
    return [e.ids for e in tok.encode_batch(list(texts), add_special_tokens=False)]


# ---- preparing ------------------------------------------------------------------------------
def pack(ids: list[list[int]], sep_id: int, cls_id: int, pad_id: int, max_len: int) -> np.ndarray:
    """``[n, max_len]`` int64: the documents joined with ``[SEP]`` after each, cut into
    chunks of ``max_len - 1``, each behind a ``[CLS]`` (the last chunk padded)."""
    if max_len < 2:
        raise UserError(f"--max-len must be at least 2, got {max_len}")
    lengths = np.fromiter((len(d) + 1 for d in ids), dtype=np.int64, count=len(ids))
    stream = np.full(int(lengths.sum()), sep_id, dtype=np.int64)
    ends = np.cumsum(lengths)
    flat = np.concatenate([np.asarray(d, dtype=np.int64) for d in ids]) if ids else np.empty(0, np.int64)
    # every position but each document's last one (its [SEP]) takes the next word
    word_pos = np.ones(stream.size, dtype=bool)
    word_pos[ends - 1] = False
    stream[word_pos] = flat
    chunk = max_len - 1
    n = -(-stream.size // chunk)
    body = np.full(n * chunk, pad_id, dtype=np.int64)
    body[:stream.size] = stream
    out = np.empty((n, max_len), dtype=np.int64)
    out[:, 0] = cls_id
    out[:, 1:] = body.reshape(n, chunk)
    return out


def prepare_corpus(files: Sequence[str | Path], out: str | Path, tokenizer: str = "wordpiece", vocab: int = 8000,
                   max_len: int = 128, heldout: float = 0.05, seed: int = 0, doc_per: str = "line") -> dict:
    """Write a prepared corpus to ``out`` (see the module docstring); returns its meta."""
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"{out} exists and is not empty; choose a new --out folder")
    if not files:
        raise UserError("no text files given")
    if not 0 < heldout < 1:
        raise UserError(f"--heldout must be in (0, 1), got {heldout}")
    if vocab < 10:
        raise UserError(f"--vocab must be at least 10, got {vocab}")
    sources, documents = [], []
    for f in files:
        docs = read_documents(f, doc_per)
        sources.append({"path": str(Path(f).resolve()), "sha256": sha256_of(Path(f)), "documents": len(docs)})
        documents += docs
    if len(documents) < 2:
        raise UserError(f"the text files hold {len(documents)} document(s); a corpus needs at least 2 "
                        "(one for training, one held out)")
    order = np.random.default_rng(seed).permutation(len(documents))
    n_held = min(max(1, round(heldout * len(documents))), len(documents) - 1)
    split_docs = {"heldout": [documents[i] for i in np.sort(order[:n_held])],
                  "train": [documents[i] for i in np.sort(order[n_held:])]}
    if tokenizer in TRAINED_TOKENIZERS:
        tok = train_tokenizer(tokenizer, split_docs["train"], vocab)  # held-out text is never seen
        tokenizer_source = f"{tokenizer} trained on the training documents (vocab {vocab})"
    else:
        tok = load_tokenizer_folder(tokenizer)
        tokenizer_source = str(Path(tokenizer).resolve())
    n_words = tok.get_vocab_size(with_added_tokens=True)
    sep = _sep_id(tok)
    pad_id, cls_id = n_words, n_words + 2
    dtype = np.uint16 if n_words + 3 <= np.iinfo(np.uint16).max else np.int32
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / TOKENIZER))
    meta: dict = {"format": 1, "n_words": n_words, "max_len": max_len, "sep_id": sep, "dtype": np.dtype(dtype).name,
                  "tokenizer": tokenizer_source, "tokenizer_sha256": sha256_of(out / TOKENIZER),
                  "heldout_fraction": heldout, "seed": seed, "doc_per": doc_per, "sources": sources, "splits": {}}
    for split in SPLITS:
        ids = encode(tok, split_docs[split])
        rows = pack(ids, sep, cls_id, pad_id, max_len)
        shards = []
        for k, start in enumerate(range(0, rows.shape[0], SHARD_ROWS)):
            name = f"{split}-{k:05d}.npy"
            np.save(out / name, rows[start:start + SHARD_ROWS].astype(dtype))
            shards.append({"file": name, "rows": int(min(SHARD_ROWS, rows.shape[0] - start)),
                           "sha256": sha256_of(out / name)})
        meta["splits"][split] = {"documents": len(split_docs[split]), "sequences": int(rows.shape[0]),
                                 "tokens": int(sum(len(d) + 1 for d in ids)), "shards": shards}
    (out / META).write_text(json.dumps(meta, indent=2) + "\n")
    return meta


# ---- the language -------------------------------------------------------------------------
class Corpus(Language):
    """A prepared corpus (``prepare_corpus``) read from its shards."""

    name = "corpus"
    exact = False  # no exact conditionals: the evaluator reports held-out cross-entropy
    uses_cls = True  # every sequence starts with [CLS]

    def __init__(self, folder: str | Path, verify: bool | None = None):
        folder = Path(folder)
        if not (folder / META).is_file():
            raise UserError(f"{folder} is not a prepared corpus (no {META}); run 'sameloss corpus prepare' first")
        meta = json.loads((folder / META).read_text())
        self.folder, self.meta = folder, meta
        self.n_words, self.max_len, self.sep_id = meta["n_words"], meta["max_len"], meta["sep_id"]
        total = sum((folder / s["file"]).stat().st_size if (folder / s["file"]).exists() else 0
                    for sp in meta["splits"].values() for s in sp["shards"])
        verify = total <= VERIFY_BYTES if verify is None else verify
        self._rows = {}
        for split in SPLITS:
            arrays = []
            for s in meta["splits"][split]["shards"]:
                path = folder / s["file"]
                if not path.is_file():
                    raise UserError(f"corpus shard missing: {path}")
                if verify and sha256_of(path) != s["sha256"]:
                    raise UserError(f"corpus shard {path} does not match its checksum in {META}; prepare it again")
                arr = np.load(path, mmap_mode="r")
                if arr.shape != (s["rows"], self.max_len):
                    raise UserError(f"corpus shard {path} has shape {arr.shape}, expected {(s['rows'], self.max_len)}")
                arrays.append(arr)
            self._rows[split] = arrays
        self._offsets = {k: np.cumsum([0] + [a.shape[0] for a in v]) for k, v in self._rows.items()}
        self._tokenizer = None
        self._words: list[str] | None = None

    # ---- data ---------------------------------------------------------------------------
    def n_sequences(self, split: str = "train") -> int:
        return int(self._offsets[split][-1])

    def rows(self, index: torch.Tensor | np.ndarray, split: str = "train") -> torch.Tensor:
        """Sequences ``index`` of a split, ``[len(index), max_len]`` long."""
        index = np.asarray(index, dtype=np.int64)
        offsets = self._offsets[split]
        shard = np.searchsorted(offsets, index, side="right") - 1
        out = np.empty((index.size, self.max_len), dtype=np.int64)
        for k in np.unique(shard):  # one fancy-indexing read per shard
            sel = shard == k
            out[sel] = self._rows[split][k][index[sel] - offsets[k]]
        return torch.from_numpy(out)

    def batch_of(self, tokens: torch.Tensor) -> Batch:
        return Batch(tokens, self.lengths_of(tokens))

    def sample(self, n: int, generator: torch.Generator | None = None) -> Batch:
        """``n`` training sequences, uniformly with replacement."""
        index = torch.randint(self.n_sequences("train"), (n,), generator=generator)
        return self.batch_of(self.rows(index.numpy()))

    def split_batch(self, split: str, n: int | None = None) -> Batch:
        """The first ``n`` sequences (all if ``None``) of a split, in file order."""
        total = self.n_sequences(split)
        n = total if n is None else min(n, total)
        return self.batch_of(self.rows(np.arange(n), split))

    def maskable(self, tokens: torch.Tensor) -> torch.Tensor:
        """[CLS] and [SEP] are never prediction targets (as in BERT)."""
        return (tokens != self.cls_id) & (tokens != self.sep_id)

    def conditionals(self, tokens, masked, query=None):
        raise UserError("exact conditionals are not defined for a corpus (real text has no known distribution); "
                        "the corpus evaluator reports held-out cross-entropy instead")

    def entropy(self, *args, **kwargs):
        raise UserError("the entropy of a corpus is not known (no exact conditionals)")

    # ---- text ---------------------------------------------------------------------------
    @property
    def tokenizer(self):
        if self._tokenizer is None:
            tk = _require_tokenizers()
            self._tokenizer = tk.Tokenizer.from_file(str(self.folder / TOKENIZER))
        return self._tokenizer

    @property
    def words(self) -> list[str]:
        if self._words is None:
            vocab = self.tokenizer.get_vocab(with_added_tokens=True)
            self._words = [""] * self.n_words
            for token, i in vocab.items():
                if i < self.n_words:
                    self._words[i] = token
        return self._words

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        return encode(self.tokenizer, texts)

    def describe(self, n_sentences: int = 4096, seed: int = 0, n_examples: int = 5, mask_rate: float = 0.15) -> dict:
        m = self.meta
        words = self.words
        held = self.split_batch("heldout", n_examples)
        return {"language": "corpus", "folder": str(self.folder), "n_words": self.n_words,
                "vocab_size": self.vocab_size, "max_len": self.max_len, "tokenizer": m["tokenizer"],
                "splits": {k: {x: v[x] for x in ("documents", "sequences", "tokens")} for k, v in m["splits"].items()},
                "examples": [" ".join(words[t] if t < self.n_words else "[CLS]" for t in row.tolist()
                                      if t != self.pad_id) for row in held.tokens]}


__all__ = ["Corpus", "encode", "load_tokenizer_folder", "pack", "prepare_corpus", "read_documents", "train_tokenizer"]


def build(data: str | None = None) -> Corpus:
    """The corpus prepared in the folder ``language.data``."""
    if data is None:
        raise UserError("the corpus language needs language.data=DIR (a folder from 'sameloss corpus prepare')")
    return Corpus(data)
