"""The token strings a language's ids are written as, shared by export and measuring.

Ids follow ``sameloss.languages.base``: words ``0 .. n_words-1``, then pad, mask, cls.
An exported tokenizer has exactly these ids, so an exported model's vocabulary *is* the
language's and no id is remapped.
"""

from __future__ import annotations

SPECIAL_TOKENS = ("[PAD]", "[MASK]", "[CLS]")  # ids n_words, n_words + 1, n_words + 2


def word_tokens(language) -> list[str]:
    """One token string per word id: the language's own word names (PCFG: the grammar's
    words; HMM: ``w0, w1, …``; Dyck: ``(`` and ``)``; causal: the generator's tokens),
    or ``w<id>`` for every word when some name cannot be a whitespace-separated token
    (empty, holding whitespace, repeated, or equal to a special token)."""
    words = [str(w) for w in language.words]
    usable = (len(set(words)) == len(words)
              and all(w and not any(c.isspace() for c in w) and w not in SPECIAL_TOKENS for w in words))
    return words if usable else [f"w{i}" for i in range(len(words))]


def vocabulary(language) -> dict[str, int]:
    """Token string → sameloss id, words and specials."""
    vocab = {w: i for i, w in enumerate(word_tokens(language))}
    vocab.update({s: language.n_words + k for k, s in enumerate(SPECIAL_TOKENS)})
    return vocab


def save_tokenizer(language, folder, max_len: int) -> None:
    """A word-level ``tokenizers`` tokenizer (whitespace-separated words, no unknown
    token: a word outside the language is an error, not a silent ``[UNK]``) saved as
    ``tokenizer.json`` with a ``PreTrainedTokenizerFast`` config: pad, mask and cls are
    the sameloss special ids; nothing is added around a sentence (the model was trained
    on bare sentences)."""
    import json
    from pathlib import Path

    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

    folder = Path(folder)
    tok = Tokenizer(models.WordLevel(vocabulary(language), unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIAL_TOKENS])
    tok.save(str(folder / "tokenizer.json"))
    pad, mask, cls = SPECIAL_TOKENS
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "pad_token": pad, "mask_token": mask,
              "cls_token": cls, "model_max_length": max_len, "padding_side": "right",
              "clean_up_tokenization_spaces": False}
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (folder / "special_tokens_map.json").write_text(
        json.dumps({"pad_token": pad, "mask_token": mask, "cls_token": cls}, indent=2) + "\n")
