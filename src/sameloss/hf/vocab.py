"""The token strings a language's ids are written as, shared by export and measuring.

Ids follow ``sameloss.languages.base``: words ``0 .. n_words-1``, then pad, mask, cls.
An exported tokenizer has exactly these ids, so an exported model's vocabulary *is* the
language's and no id is remapped — plus one id after them, ``[UNK]`` (``n_words + 3``),
which a word outside the language becomes: Hugging Face's tokenizers need an unknown
token to encode any new word (without it ``AutoTokenizer`` raises "Missing [UNK] token").
It comes after the language's specials so that every language id keeps its value; the
exported model gets one more embedding row for it (zero: an unknown word says nothing
but its position) whose output logit is ``UNK_LOGIT`` (never predicted; the probabilities
of the language's tokens are unchanged).
"""

from __future__ import annotations

SPECIAL_TOKENS = ("[PAD]", "[MASK]", "[CLS]")  # ids n_words, n_words + 1, n_words + 2
UNK_TOKEN = "[UNK]"  # id n_words + 3: exported tokenizers only
UNK_LOGIT = -1e9  # exp underflows to exactly 0 in float32 and bfloat16 beside any real logit


def word_tokens(language) -> list[str]:
    """One token string per word id: the language's own word names (PCFG: the grammar's
    words; HMM: ``w0, w1, …``; Dyck: ``(`` and ``)``; causal: the generator's tokens),
    or ``w<id>`` for every word when some name cannot be a whitespace-separated token
    (empty, holding whitespace, repeated, or equal to a special token)."""
    words = [str(w) for w in language.words]
    reserved = (*SPECIAL_TOKENS, UNK_TOKEN)
    usable = (len(set(words)) == len(words)
              and all(w and not any(c.isspace() for c in w) and w not in reserved for w in words))
    return words if usable else [f"w{i}" for i in range(len(words))]


def vocabulary(language) -> dict[str, int]:
    """Token string → sameloss id, words and specials."""
    vocab = {w: i for i, w in enumerate(word_tokens(language))}
    vocab.update({s: language.n_words + k for k, s in enumerate(SPECIAL_TOKENS)})
    return vocab


def unk_id(language) -> int:
    """The id of ``[UNK]`` in an exported tokenizer: after the language's specials."""
    return language.n_words + len(SPECIAL_TOKENS)


def save_tokenizer(language, folder, max_len: int) -> None:
    """A word-level ``tokenizers`` tokenizer (whitespace-separated words; a word outside
    the language becomes ``[UNK]``, see the module docstring) saved as ``tokenizer.json``
    with a ``PreTrainedTokenizerFast`` config: pad, mask and cls are the sameloss special
    ids; nothing is added around a sentence (the model was trained on bare sentences)."""
    import json
    from pathlib import Path

    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

    folder = Path(folder)
    vocab = {**vocabulary(language), UNK_TOKEN: unk_id(language)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token=UNK_TOKEN))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in (*SPECIAL_TOKENS, UNK_TOKEN)])
    tok.save(str(folder / "tokenizer.json"))
    pad, mask, cls = SPECIAL_TOKENS
    specials = {"pad_token": pad, "mask_token": mask, "cls_token": cls, "unk_token": UNK_TOKEN}
    config = {"tokenizer_class": "PreTrainedTokenizerFast", **specials, "model_max_length": max_len,
              "padding_side": "right", "clean_up_tokenization_spaces": False}
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (folder / "special_tokens_map.json").write_text(json.dumps(specials, indent=2) + "\n")


def add_unk_row(hf_model, language) -> None:
    """Give an exported ``BertForMaskedLM`` (``vocab_size`` = the language's) the row of
    ``[UNK]``: a zero embedding, and an output logit of ``UNK_LOGIT``."""
    import torch

    n = language.vocab_size
    assert hf_model.config.vocab_size == n and unk_id(language) == n
    hf_model.resize_token_embeddings(n + 1, mean_resizing=False)
    with torch.no_grad():
        hf_model.get_input_embeddings().weight[n].zero_()
        hf_model.cls.predictions.bias[n] = UNK_LOGIT


CORPUS_SPECIALS = dict(zip(SPECIAL_TOKENS, range(3)))  # name -> offset after the corpus's n_words


def save_corpus_tokenizer(language, folder, max_len: int) -> None:
    """The tokenizer of a corpus run (``language.name=corpus``): the corpus's own
    (``tokenizer.json`` of ``sameloss corpus prepare``, so text is split as in training),
    plus sameloss's ``[PAD]``, ``[MASK]`` and ``[CLS]`` at the ids the model was trained
    with (``n_words .. n_words + 2``, after the tokenizer's vocabulary), and a template
    that writes a text as training saw it: ``[CLS] text [SEP]`` (a pair: ``[CLS] a [SEP] b
    [SEP]``, one token type). A token of the tokenizer already named like one of those
    specials (a Hugging Face tokenizer folder's own ``[MASK]``) is renamed
    ``[unused:NAME]``: the name must mean sameloss's id. Unknown words are the
    tokenizer's own affair (its ``[UNK]``, which is one of the corpus's words)."""
    import json
    from pathlib import Path

    from tokenizers import Tokenizer, processors

    folder = Path(folder)
    data = json.loads(language.tokenizer.to_str())
    n = language.n_words
    ids = {name: n + k for name, k in CORPUS_SPECIALS.items()}
    vocab = data.get("model", {}).get("vocab")
    if isinstance(vocab, dict):  # WordPiece, BPE, WordLevel
        for name in ids:
            if name in vocab:
                vocab[f"[unused:{name[1:-1]}]"] = vocab.pop(name)
    elif isinstance(vocab, list):  # Unigram: [token, score] pairs
        for entry in vocab:
            if entry[0] in ids:
                entry[0] = f"[unused:{entry[0][1:-1]}]"
    # renamed, never removed: tokenizers numbers the added tokens that are not in the
    # model's vocabulary in order after it, so the ids must stay gap-free (n_words counts them)
    added = data.get("added_tokens") or []
    for t in added:
        if t.get("content") in ids:
            t["content"] = f"[unused:{t['content'][1:-1]}]"
    added += [{"id": i, "content": name, "single_word": False, "lstrip": False, "rstrip": False,
               "normalized": False, "special": True} for name, i in ids.items()]
    data["added_tokens"] = sorted(added, key=lambda t: t["id"])
    tok = Tokenizer.from_str(json.dumps(data))
    sep = language.words[language.sep_id]
    tok.post_processor = processors.TemplateProcessing(
        single=f"[CLS] $A {sep}", pair=f"[CLS] $A {sep} $B {sep}",
        special_tokens=[("[CLS]", ids["[CLS]"]), (sep, language.sep_id)])
    tok.save(str(folder / "tokenizer.json"))
    specials = {"pad_token": "[PAD]", "mask_token": "[MASK]", "cls_token": "[CLS]", "sep_token": sep}
    unk = data.get("model", {}).get("unk_token")
    if unk:
        specials["unk_token"] = unk
    config = {"tokenizer_class": "PreTrainedTokenizerFast", **specials, "model_max_length": max_len,
              "padding_side": "right", "clean_up_tokenization_spaces": False}
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (folder / "special_tokens_map.json").write_text(json.dumps(specials, indent=2) + "\n")
