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
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from ..errors import UserError
from ..errors import first_line as _first_line
from ..files import building, sha256_of
from ..jsonl import read_jsonl
from .base import Batch, Language

# the registry reads this from the file (``sameloss.registry``)
LANGUAGE = {"name": "corpus", "build": "build", "settings": ("data",), "describe": False}

META = "meta.json"
TOKENIZER = "tokenizer.json"
SHARD_ROWS = 65_536  # sequences per shard file
SPLITS = ("train", "heldout")
TRAINED_TOKENIZERS = ("wordpiece", "bpe")
SEP_CANDIDATES = ("[SEP]", "</s>", "<|endoftext|>")
# checksums of shards are verified (and every token id range-checked) on load up to this
# many bytes in all; beyond, only shapes and dtypes, and the rows are range-checked as read
VERIFY_BYTES = 256 * 2**20
# The longest sequence a corpus may hold. Attention scores are T^2 floats per head and
# sequence: at T = 8192 one head of one sequence is 256 MiB (a batch of 32 with 4 heads,
# 32 GiB: beyond a CPU's memory and most GPUs'); BERT and the paper use 128-512. Refused
# when preparing (and on load, for a meta.json that says more) with that estimate.
MAX_LEN = 8192
SHARD_DTYPES = ("uint16", "int32")
# files a Hugging Face tokenizer folder holds (one of them at least)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json", "merges.txt",
                   "tokenizer.model", "spiece.model", "sentencepiece.bpe.model")


def _gib(n: float) -> str:
    return f"{n / 2**30:.3g} GiB" if n >= 2**30 else f"{n / 2**20:.3g} MiB"


def check_max_len(max_len, where: str = "--max-len") -> None:
    """``UserError`` for a sequence length below 2 or above ``MAX_LEN`` (naming the
    attention memory it would take)."""
    if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 2:
        raise UserError(f"{where} must be an integer >= 2, got {max_len!r}")
    if max_len > MAX_LEN:
        raise UserError(f"{where} {max_len} is too long: one sequence's attention scores take T^2 x 4 bytes = "
                        f"{_gib(4 * max_len ** 2)} per head (limit {MAX_LEN} = {_gib(4 * MAX_LEN ** 2)}; "
                        "BERT uses 512)")


def limit_tokenizer_threads(n: int) -> None:
    """Give the ``tokenizers`` thread pool (Rust, rayon) ``n`` threads, as ``--threads``
    does torch's: it is sized from ``RAYON_NUM_THREADS`` when first used."""
    os.environ["RAYON_NUM_THREADS"] = str(int(n))


# ---- reading documents --------------------------------------------------------------------
def read_documents(path: str | Path, doc_per: str = "line") -> list[str]:
    """The documents of one file: ``.jsonl`` (``text`` of each record), ``.parquet`` (the
    ``text`` column) or plain text (``doc_per``: ``line`` or ``paragraph``)."""
    path = Path(path)
    if path.is_dir():
        raise UserError(f"{path} is a folder, not a text file")
    if not path.is_file():
        raise UserError(f"no such text file: {path}")
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json"):
        records = read_jsonl(path, read_text(path), lambda r: isinstance(r.get("text"), str),
                             "a document record (JSON with a string field 'text')")
        docs = [record["text"] for _, record in records]
    elif suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise UserError(f"reading {path} needs pyarrow (pip install pyarrow); or convert it to JSONL") from None
        try:
            table = pq.read_table(path)
        except Exception as exc:  # noqa: BLE001 - pyarrow raises ArrowInvalid, OSError, ... for a bad file
            raise UserError(f"{path} is not a readable Parquet file ({_first_line(exc)})") from None
        if "text" not in table.column_names:
            raise UserError(f"{path}: no 'text' column (columns: {', '.join(table.column_names)})")
        docs = [t for t in table.column("text").to_pylist() if isinstance(t, str)]
    else:
        text = read_text(path)
        if doc_per == "line":
            docs = text.splitlines()
        elif doc_per == "paragraph":
            docs = [" ".join(p.split()) for p in text.replace("\r\n", "\n").split("\n\n")]
        else:
            raise UserError(f"unknown document unit {doc_per!r}; choose line or paragraph")
    return [d.strip() for d in docs if d.strip()]


def read_text(path: Path) -> str:
    """A text file's contents: UTF-8 (a leading byte-order mark is dropped); ``UserError``
    naming the first bad byte for anything else, and for binary files (a NUL byte)."""
    data = path.read_bytes()
    nul = data.find(b"\x00")
    if nul >= 0:
        raise UserError(f"{path} looks binary (a NUL byte at offset {nul}), not text")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise UserError(f"{path} is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}); "
                        "convert it first, e.g. iconv -f latin1 -t utf-8") from None


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
        if folder.exists():
            raise UserError(f"--tokenizer {folder} is a file; give a tokenizer folder (or wordpiece / bpe)")
        raise UserError(f"tokenizer folder not found: {folder} (or give --tokenizer wordpiece / bpe)")
    if not any((folder / f).is_file() for f in TOKENIZER_FILES):
        raise UserError(f"{folder} holds no tokenizer (none of {', '.join(TOKENIZER_FILES)}); give a Hugging "
                        "Face tokenizer folder, or --tokenizer wordpiece / bpe to train one")
    if (folder / TOKENIZER).is_file():
        try:
            return tk.Tokenizer.from_file(str(folder / TOKENIZER))
        except Exception as exc:  # noqa: BLE001 - a broken file is the user's to fix
            raise UserError(f"cannot read {folder / TOKENIZER}: {_first_line(exc)}") from None
    try:
        import warnings

        from transformers import AutoTokenizer
        from transformers.utils import logging as hf_logging
        level = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()  # our one line, not transformers' notices before it
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                hf = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
        finally:
            hf_logging.set_verbosity(level)
    except ImportError:
        raise UserError(f"{folder} has no tokenizer.json; reading other tokenizer files needs transformers") from None
    except Exception as exc:  # noqa: BLE001
        # transformers' messages run over several lines; the first may end mid-sentence
        text = " ".join(str(exc).split())
        raise UserError(f"cannot load a tokenizer from {folder} ({type(exc).__name__}: {text[:300]})") from None
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
    """Write a prepared corpus to ``out`` (see the module docstring); returns its meta.

    ``out`` is built under a temporary sibling and renamed into place at the end
    (``files.building``): a kill or a full disk leaves no half-written corpus, and the
    rerun is not blocked."""
    out = Path(out)
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise UserError(f"--out {out} is a file, not a folder; choose a new --out folder")
    if out.exists() and any(out.iterdir()):
        raise UserError(f"{out} exists and is not empty; choose a new --out folder")
    if not files:
        raise UserError("no text files given")
    if not 0 < heldout < 1:
        raise UserError(f"--heldout must be in (0, 1), got {heldout}")
    if isinstance(vocab, bool) or not isinstance(vocab, int) or vocab < 10:
        raise UserError(f"--vocab must be an integer >= 10, got {vocab!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise UserError(f"--seed must be an integer >= 0, got {seed!r}")
    check_max_len(max_len)
    # a bad tokenizer folder is refused before the text is read
    folder_tok = None if tokenizer in TRAINED_TOKENIZERS else load_tokenizer_folder(tokenizer)
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
        tok = folder_tok
        tokenizer_source = str(Path(tokenizer).resolve())
    n_words = tok.get_vocab_size(with_added_tokens=True)
    sep = _sep_id(tok)
    pad_id, cls_id = n_words, n_words + 2
    dtype = np.uint16 if n_words + 3 <= np.iinfo(np.uint16).max else np.int32
    with building(out, what="corpus") as tmp:
        # written by Python, not tok.save: a full disk is then an OSError (one line), not
        # the Rust library's generic Exception
        (tmp / TOKENIZER).write_text(tok.to_str(pretty=True), encoding="utf-8")
        meta: dict = {"format": 1, "n_words": n_words, "max_len": max_len, "sep_id": sep,
                      "dtype": np.dtype(dtype).name, "tokenizer": tokenizer_source,
                      "tokenizer_sha256": sha256_of(tmp / TOKENIZER), "heldout_fraction": heldout, "seed": seed,
                      "doc_per": doc_per, "sources": sources, "splits": {}}
        for split in SPLITS:
            ids = encode(tok, split_docs[split])
            rows = pack(ids, sep, cls_id, pad_id, max_len)
            shards = []
            for k, start in enumerate(range(0, rows.shape[0], SHARD_ROWS)):
                name = f"{split}-{k:05d}.npy"
                np.save(tmp / name, rows[start:start + SHARD_ROWS].astype(dtype))
                shards.append({"file": name, "rows": int(min(SHARD_ROWS, rows.shape[0] - start)),
                               "sha256": sha256_of(tmp / name)})
            meta["splits"][split] = {"documents": len(split_docs[split]), "sequences": int(rows.shape[0]),
                                     "tokens": int(sum(len(d) + 1 for d in ids)), "shards": shards}
        (tmp / META).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    return meta


# ---- reading a prepared corpus ----------------------------------------------------------
def _is_count(value, minimum: int = 0) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def _meta_problem(meta) -> str | None:
    """What is wrong with a corpus's ``meta.json`` (``None``: nothing)."""
    if not isinstance(meta, dict):
        return f"a JSON {type(meta).__name__}, not an object"
    for key in ("n_words", "max_len", "sep_id", "dtype", "splits"):
        if key not in meta:
            return f"no {key!r}"
    if not _is_count(meta["n_words"], 1):
        return f"n_words {meta['n_words']!r} is not a positive integer"
    if not _is_count(meta["max_len"], 2):
        return f"max_len {meta['max_len']!r} is not an integer >= 2"
    if not _is_count(meta["sep_id"]) or meta["sep_id"] >= meta["n_words"]:
        return f"sep_id {meta['sep_id']!r} is not a word id below n_words {meta['n_words']}"
    if meta["dtype"] not in SHARD_DTYPES:
        return f"dtype {meta['dtype']!r} is not one of {', '.join(SHARD_DTYPES)}"
    if meta["n_words"] + 3 > np.iinfo(np.dtype(meta["dtype"])).max + 1:
        return f"n_words {meta['n_words']} + 3 specials do not fit dtype {meta['dtype']}"
    if not isinstance(meta.get("tokenizer_sha256", ""), str):
        return "tokenizer_sha256 is not a string"
    splits = meta["splits"]
    if not isinstance(splits, dict) or any(not isinstance(splits.get(k), dict) for k in SPLITS):
        return f"splits must hold {' and '.join(SPLITS)}"
    for split in SPLITS:
        shards = splits[split].get("shards")
        if not isinstance(shards, list) or not shards:
            return f"split {split!r} has no shards"
        for s in shards:
            if not isinstance(s, dict) or not isinstance(s.get("file"), str) or not isinstance(s.get("sha256"), str) \
                    or not _is_count(s.get("rows"), 1):
                return f"a shard of {split!r} is not {{file, rows, sha256}}"
            name = s["file"]
            if Path(name).name != name or name.startswith(".") or not name.endswith(".npy"):
                return f"shard file {name!r} is not a .npy file inside the corpus folder"
        if splits[split].get("sequences", sum(s["rows"] for s in shards)) != sum(s["rows"] for s in shards):
            return f"split {split!r} says {splits[split].get('sequences')} sequences, its shards hold " \
                   f"{sum(s['rows'] for s in shards)}"
    return None


def read_meta(folder: Path) -> dict:
    """A prepared corpus's ``meta.json``, checked (one ``UserError`` line when damaged)."""
    path = folder / META
    if not path.is_file():
        raise UserError(f"{folder} is not a prepared corpus (no {META}); run 'sameloss corpus prepare' first")
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise UserError(f"corpus file {path} is damaged (not UTF-8 text); prepare the corpus again") from None
    except json.JSONDecodeError as exc:
        raise UserError(f"corpus file {path} is damaged (not JSON: {exc.msg} at line {exc.lineno}); prepare the "
                        "corpus again") from None
    problem = _meta_problem(meta)
    if problem:
        raise UserError(f"corpus file {path} is damaged ({problem}); prepare the corpus again")
    check_max_len(meta["max_len"], f"{path}: max_len")
    return meta


# ---- the language -------------------------------------------------------------------------
class Corpus(Language):
    """A prepared corpus (``prepare_corpus``) read from its shards."""

    name = "corpus"
    exact = False  # no exact conditionals: the evaluator reports held-out cross-entropy
    uses_cls = True  # every sequence starts with [CLS]

    def __init__(self, folder: str | Path, verify: bool | None = None):
        """Read the corpus in ``folder``, validated cheaply on load: ``meta.json``'s fields,
        the tokenizer (its checksum, and that it has ``n_words`` tokens and the separator),
        every shard's dtype and shape as it is memory-mapped, and — for corpora up to
        ``VERIFY_BYTES`` (or ``verify=True``) — every shard's checksum and token range.
        Rows read later are range-checked too (``rows``). Damage is one ``UserError``."""
        folder = Path(folder)
        meta = read_meta(folder)
        self.folder, self.meta = folder, meta
        self.n_words, self.max_len, self.sep_id = meta["n_words"], meta["max_len"], meta["sep_id"]
        self._tokenizer = self._checked_tokenizer()
        total = sum((folder / s["file"]).stat().st_size if (folder / s["file"]).is_file() else 0
                    for sp in meta["splits"].values() for s in sp["shards"])
        verify = total <= VERIFY_BYTES if verify is None else verify
        self._rows = {}
        for split in SPLITS:
            self._rows[split] = [self._shard(s, verify) for s in meta["splits"][split]["shards"]]
        self._offsets = {k: np.cumsum([0] + [a.shape[0] for a in v]) for k, v in self._rows.items()}
        self._words: list[str] | None = None

    def _damaged(self, path: Path, what: str) -> UserError:
        return UserError(f"corpus file {path} is damaged ({what}); prepare the corpus again")

    def _checked_tokenizer(self):
        """The corpus's tokenizer, checked against ``meta.json`` (``None`` without the
        ``tokenizers`` package: then only its checksum is checked)."""
        path = self.folder / TOKENIZER
        if not path.is_file():
            raise UserError(f"corpus file missing: {path}; prepare the corpus again")
        want = self.meta.get("tokenizer_sha256")
        if want is not None and sha256_of(path) != want:
            raise UserError(f"{path} does not match its checksum in {META}; prepare the corpus again")
        try:
            import tokenizers
        except ImportError:
            return None
        try:
            tok = tokenizers.Tokenizer.from_file(str(path))
        except Exception as exc:  # noqa: BLE001 - the Rust library raises a plain Exception
            raise self._damaged(path, f"not a tokenizer: {_first_line(exc)}") from None
        size = tok.get_vocab_size(with_added_tokens=True)
        if size != self.n_words:
            raise self._damaged(self.folder / META, f"n_words {self.n_words}, but its tokenizer has {size} tokens")
        if tok.id_to_token(self.sep_id) not in SEP_CANDIDATES:
            raise self._damaged(self.folder / META, f"sep_id {self.sep_id} is not a separator token of the tokenizer")
        return tok

    def _shard(self, s: dict, verify: bool) -> np.ndarray:
        path = self.folder / s["file"]
        if not path.is_file():
            raise UserError(f"corpus shard missing: {path}")
        if verify and sha256_of(path) != s["sha256"]:
            raise UserError(f"corpus shard {path} does not match its checksum in {META}; prepare it again")
        try:
            arr = np.load(path, mmap_mode="r", allow_pickle=False)
        except (ValueError, OSError, EOFError) as exc:  # truncated, or not a .npy file at all
            raise self._damaged(path, f"not a token array: {_first_line(exc)}") from None
        if not isinstance(arr, np.ndarray):
            raise self._damaged(path, "not a single array")
        if arr.dtype != np.dtype(self.meta["dtype"]):
            raise self._damaged(path, f"dtype {arr.dtype}, expected {self.meta['dtype']}")
        if arr.shape != (s["rows"], self.max_len):
            raise UserError(f"corpus shard {path} has shape {arr.shape}, expected {(s['rows'], self.max_len)}")
        if verify:  # the file is in the page cache after its checksum: the range is one more pass
            self._check_ids(arr, path)
            if not (arr[:, 0] == self.cls_id).all():
                raise self._damaged(path, "a sequence does not start with [CLS]")
        return arr

    def _check_ids(self, ids: np.ndarray, path: Path | str) -> None:
        if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= self.vocab_size):
            bad = int(ids.max()) if int(ids.max()) >= self.vocab_size else int(ids.min())
            raise self._damaged(Path(path), f"token id {bad} outside 0..{self.vocab_size - 1}")

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
            # a large corpus is not range-checked on load: every row read is (O(batch))
            self._check_ids(out[sel], self.folder / self.meta["splits"][split]["shards"][k]["file"])
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
            _require_tokenizers()  # checked on load when the package is there
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
