"""The K allowed tokens of a causal language (``lm_generated.CausalLM``): explicit
generator ids, or the K most frequent tokens of the unrestricted generator, estimated from
its own seeded samples (``lm_generated.expected_token_counts``: the next-token
probabilities summed along the sampled sentences, which ranks every token and has less
noise than counting the sampled ones; the model's bos/eos/pad ids are left out). The list is written as JSON into
the generator folder (``tokens_filename``, never overwriting) and read back from there
next time, so a language is reproducible; ``tokenizer_words`` names them for display."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch

from sameloss.errors import UserError
from sameloss.errors import first_line as _one_line
from sameloss.files import atomic_write_json

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")


def tokens_filename(k: int, length: int, n_sentences: int, seed: int) -> str:
    """Name of the frequency-estimated token list inside the generator folder."""
    return f"sameloss-tokens-k{k}-len{length}-n{n_sentences}-seed{seed}.json"


def frequent_tokens(model, folder: Path, k: int, length: int, bos: int, n_sentences: int, seed: int,
                    counts_of: Callable) -> list[int]:
    """The cached list in ``folder`` if there is one, else estimate it (``counts_of(model,
    bos, length, n_sentences, seed)``: each generator token's expected count,
    ``lm_generated.expected_token_counts``) and cache it."""
    cache = folder / tokens_filename(k, length, n_sentences, seed)
    if cache.exists():
        return load_tokens(cache, k=k)
    config = model.config
    special = {i for i in (config.bos_token_id, config.eos_token_id, getattr(config, "pad_token_id", None))
               if isinstance(i, int)}
    vocab = int(model.get_output_embeddings().weight.shape[0])
    if k > vocab - len(special & set(range(vocab))):
        raise UserError(f"k={k} is larger than the generator's {vocab} tokens less its special tokens {sorted(special)}")
    counts = counts_of(model, bos, length, n_sentences, seed)
    counts[list(special & set(range(vocab)))] = -1.0
    # stable sort: ties (there are hardly any with expected counts) go to the smaller id
    order = torch.sort(-counts, stable=True).indices[:k]
    tokens = order.tolist()
    record = {"k": k, "length": length, "n_sentences": n_sentences, "seed": seed, "bos": bos,
              "generator": str(folder.resolve()), "tokens": tokens,
              "expected_counts": [float(counts[t]) for t in tokens]}
    try:  # atomic: a kill mid-write leaves no half-written cache to be read next time
        atomic_write_json(cache, record, indent=None)
    except OSError:
        pass  # a full disk or a read-only folder leaves the list uncached (it costs the estimate
        # next time); no warning: stderr carries only the command's own line
    return tokens


def save_tokens(path, tokens: list[int], length: int, bos: int, generator: str | None) -> None:
    """Write allowed generator ids (language-id order) as JSON (never overwrites)."""
    path = Path(path)
    if path.exists():
        raise UserError(f"{path} exists; not overwriting it")
    atomic_write_json(path, {"k": len(tokens), "length": length, "bos": bos, "generator": generator, "tokens": tokens},
                      indent=None)


def load_tokens(path, k: int | None = None) -> list[int]:
    """The allowed generator ids from a JSON file of ``save_tokens`` (or the cache)."""
    path = Path(path)
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        tokens = record["tokens"] if isinstance(record, dict) else record
        if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
            raise ValueError("'tokens' must be a list of integer ids")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UserError(f"{path}: not a token list: {_one_line(exc)}") from None
    if k is not None and len(tokens) != k:
        raise UserError(f"{path} holds {len(tokens)} tokens, not k={k}")
    return tokens


def tokenizer_words(transformers, folder: Path, tokens: list[int]) -> list[str] | None:
    """Token strings from the folder's tokenizer, if it has one (else ids are used)."""
    if not any((folder / f).exists() for f in TOKENIZER_FILES):
        return None
    try:
        tok = transformers.AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
        return [str(w) for w in tok.convert_ids_to_tokens(tokens)]
    except Exception:  # a tokenizer is only used for display names
        return None
