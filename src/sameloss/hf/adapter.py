"""Measure a Hugging Face masked LM on a sameloss language or a prepared corpus.

``HFMaskedLM`` wraps any ``AutoModelForMaskedLM`` model (BERT, RoBERTa, DistilBERT, …) as
a sameloss model: ``forward(tokens)`` maps sameloss ids ``[n, T]`` to logits
``[n, T, language.vocab_size]`` and ``features(tokens)`` to the last hidden states, so
the exact loss, the curvature measures, probes and fine-tuning run on it unchanged.

Ids. Each language word must be one token of the folder's tokenizer (looked up as is,
then as the tokenizer encodes it alone, which covers lower-casing); the words' ids, the
tokenizer's mask id and its pad and cls ids (cls: else bos; a missing one is replaced by
the mask id on input, where pads are never attended to and cls is never fed) form
``input_ids``, a lookup from sameloss id to HF id. The output keeps the HF logit rows of
the language's words and of pad, mask and cls, in sameloss order: the model's
distribution is renormalised over the language's vocabulary, the only outcomes the
language has. A special the tokenizer lacks gets a constant logit of -1e9 (probability 0,
no gradient), and so does a special whose HF id is already a word's (a corpus's
vocabulary holds the tokenizer's own specials as words): each HF row appears once. No
[CLS]/[SEP] is put around a sentence: the sentences are fed as the language writes them
(an exported sameloss model was trained that way).

A corpus (``language.name=corpus``, ``languages.text``) is mapped by its vocabulary's
token strings, looked up exactly (subword strings such as ``##ing`` mean nothing encoded
alone): a corpus prepared with the folder's own tokenizer (``sameloss corpus prepare
--tokenizer HF_DIR``) maps every id to itself, so the loss is the model's own
cross-entropy over its tokenizer's vocabulary. Its ``[CLS]`` (at position 0 of every
sequence, and of GLUE inputs) becomes the tokenizer's cls token, its pad and mask the
tokenizer's; its separator must be the tokenizer's.

The attention mask is passed as a ready 4-D additive mask (0 for real keys, the dtype's
minimum for pads): ``transformers`` then builds none itself, and its mask builder's
data-dependent branches would stop ``torch.func.vmap`` (the Fisher trace's engine). A
model that reads such a mask differently (DeBERTa) gets the plain 2-D one; the choice
is checked on a padded probe batch when the adapter is built (``_choose_mask_form``).
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import torch
from torch import nn

from ..errors import UserError
from ..libraries import quiet_transformers
from .vocab import word_tokens

MISSING_LOGIT = -1e9
# models whose position ids start after the pad id (RoBERTa's padding_idx offset)
_OFFSET_POSITIONS = {"roberta", "xlm-roberta", "camembert", "roberta-prelayernorm", "xmod", "data2vec-text"}


class HFMaskedLM(nn.Module):
    """A Hugging Face masked LM seen through a sameloss language's ids (see the module
    docstring). ``config`` carries what the measures read: ``pad_id`` (sameloss's),
    ``vocab_size``, ``max_len`` and ``dropout``."""

    def __init__(self, hf_model: nn.Module, input_ids: torch.Tensor, output_rows: torch.Tensor,
                 pad_id: int, max_len: int):
        super().__init__()
        self.hf = hf_model
        self.register_buffer("input_ids", input_ids.long(), persistent=False)
        self.register_buffer("output_rows", output_rows.clamp(min=0).long(), persistent=False)
        self.register_buffer("output_missing", output_rows < 0, persistent=False)
        hf_cfg = hf_model.config
        dropout = getattr(hf_cfg, "hidden_dropout_prob", getattr(hf_cfg, "dropout", None))
        self.config = SimpleNamespace(pad_id=pad_id, vocab_size=int(input_ids.numel()), max_len=max_len,
                                      dropout=dropout)
        self.mask_form, self.vmap_safe = self._choose_mask_form()
        with torch.no_grad():
            probe = torch.full((1, 1), pad_id + 1, dtype=torch.long, device=self.input_ids.device)  # the mask
            self.d_features = int(self.features(probe).shape[-1])

    def _inputs(self, tokens: torch.Tensor) -> dict:
        real = tokens != self.config.pad_id
        if self.mask_form == "2d":
            return {"input_ids": self.input_ids[tokens], "attention_mask": real.long()}
        dtype = next(self.hf.parameters()).dtype
        mask = torch.zeros(real.shape, dtype=dtype, device=tokens.device)
        mask = mask.masked_fill(~real, torch.finfo(dtype).min)[:, None, None, :]
        return {"input_ids": self.input_ids[tokens], "attention_mask": mask}

    def _choose_mask_form(self) -> tuple[str, bool]:
        """``("4d" | "2d", vmap_safe)``: the first mask form whose logits on a padded
        probe batch equal the model's own (2-D 0/1 mask, as transformers documents) and
        that runs under ``vmap``. The 4-D additive mask suits BERT, RoBERTa, DistilBERT,
        ALBERT, ELECTRA, MPNet, ModernBERT; DeBERTa reads a 4-D mask as 0/1 and needs
        the 2-D one. If neither runs under ``vmap``, ``vmap_safe`` is False and the
        curvature measures use plain autograd (``models.derivatives.resolve_engine``)."""
        from torch.func import functional_call, vmap
        from torch.nn.attention import SDPBackend, sdpa_kernel

        T = min(3, self.config.max_len)
        tokens = torch.full((2, T), self.config.pad_id + 1, dtype=torch.long, device=self.input_ids.device)
        tokens[1, 1:] = self.config.pad_id
        real = tokens != self.config.pad_id
        params = {n: p.detach() for n, p in self.named_parameters()}
        with torch.no_grad():
            was_training = self.training
            self.eval()
            try:
                ids = self.input_ids[tokens]
                ref = self.hf(input_ids=ids, attention_mask=real.long()).logits[real]
                for form in ("4d", "2d"):
                    self.mask_form = form
                    try:
                        out = self.hf(**self._inputs(tokens)).logits[real]
                        if not (torch.isfinite(out).all() and torch.allclose(out, ref, rtol=1e-4, atol=1e-4)):
                            continue
                        # the math kernel, as the measures run it (models.derivatives.measuring): the
                        # CPU flash-attention kernel has no vmap batching rule (a torch warning)
                        with sdpa_kernel(SDPBackend.MATH):
                            vmap(lambda t: functional_call(self, params, (t[None],))[0])(tokens)
                    except Exception:  # noqa: BLE001 - any failure just rules this form out
                        continue
                    return form, True
            finally:
                self.train(was_training)
        return "2d", False

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits ``[n, T, vocab_size]`` over the language's words and specials."""
        logits = self.hf(**self._inputs(tokens)).logits.index_select(-1, self.output_rows)
        return logits.masked_fill(self.output_missing, MISSING_LOGIT)

    def features(self, tokens: torch.Tensor) -> torch.Tensor:
        """The last hidden states ``[n, T, d]`` (``output_hidden_states``)."""
        return self.hf(**self._inputs(tokens), output_hidden_states=True).hidden_states[-1]


def is_hf_folder(path: str | Path) -> bool:
    """A folder with a Hugging Face ``config.json`` (and not a sameloss checkpoint)."""
    path = Path(path)
    return path.is_dir() and (path / "config.json").is_file() and not (path / "meta.json").exists()


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:300] + ("…" if len(text) > 300 else "")


def word_ids(tokenizer, language, folder: str | Path) -> list[int]:
    """The HF id of each language word (``UserError`` naming the first word the
    tokenizer cannot write as one token, or two words that share an id)."""
    vocab = tokenizer.get_vocab()
    specials = set(tokenizer.all_special_ids)
    ids, missing = [], []
    for word in word_tokens(language):
        hf_id = vocab.get(word)
        if hf_id is None:
            try:
                encoded = tokenizer(word, add_special_tokens=False)["input_ids"]
            except Exception:  # noqa: BLE001 - e.g. "Missing [UNK] token": the word is not one token
                encoded = []
            hf_id = encoded[0] if len(encoded) == 1 and encoded[0] not in specials else None
        if hf_id is None:
            missing.append(word)
        ids.append(hf_id)
    if missing:
        more = f" (and {len(missing) - 1} more of its {language.n_words} words)" if len(missing) > 1 else ""
        raise UserError(f"{folder}: the tokenizer cannot express the {language.name} language: word "
                        f"{missing[0]!r} is not one token of its vocabulary{more}")
    seen: dict[int, str] = {}
    for word, hf_id in zip(word_tokens(language), ids):
        if hf_id in seen:
            raise UserError(f"{folder}: the words {seen[hf_id]!r} and {word!r} are the same token (id {hf_id}) "
                            "in its tokenizer")
        seen[hf_id] = word
    return ids


def corpus_word_ids(tokenizer, language, folder: str | Path) -> list[int]:
    """The HF id of each token of a corpus's vocabulary, by exact string (``UserError``
    naming the first token the folder's tokenizer lacks, or a separator that is not the
    tokenizer's)."""
    vocab = tokenizer.get_vocab()
    ids = [vocab.get(word) if word else None for word in language.words]
    missing = [i for i, hf_id in enumerate(ids) if hf_id is None]
    if missing:
        more = f" (and {len(missing) - 1} more of its {language.n_words})" if len(missing) > 1 else ""
        raise UserError(f"{folder}: its tokenizer cannot express the corpus {language.folder}: token "
                        f"{language.words[missing[0]]!r} (corpus id {missing[0]}) is not in its vocabulary{more}; "
                        f"prepare the corpus with --tokenizer {folder}")
    sep = tokenizer.sep_token_id
    if sep is not None and ids[language.sep_id] != sep:
        raise UserError(f"{folder}: the corpus separates documents with {language.words[language.sep_id]!r}, "
                        f"the tokenizer with {tokenizer.sep_token!r}; prepare the corpus with --tokenizer {folder}")
    return ids


def load_hf_folder(folder: str | Path, language, device: str = "cpu") -> HFMaskedLM:
    """Load a local Hugging Face masked-LM folder to be measured on a sameloss language.

    Args:
        folder: the Hugging Face folder (``AutoModelForMaskedLM`` and its tokenizer).
        language: the sameloss language (or prepared corpus) it is measured on.
        device: where the model goes.

    Returns:
        a module mapping sameloss token ids to logits over the language's vocabulary, in
        float32 and eval mode, which every measure accepts. ``UserError`` for a folder that
        is not one, or whose tokenizer cannot express the language.
    """
    folder = Path(folder)
    try:
        import transformers
    except ImportError:
        raise UserError("measuring a Hugging Face folder needs the transformers package") from None
    # transformers logs its own warnings (e.g. an unknown model_type) before it raises: the
    # failure is ours to report, in one line; and one weight-loading bar per measure is noise
    try:
        with quiet_transformers(transformers):
            tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
            model = transformers.AutoModelForMaskedLM.from_pretrained(str(folder), local_files_only=True,
                                                                      dtype=torch.float32)
    except Exception as exc:  # transformers raises OSError, ValueError, KeyError, … for bad folders
        raise UserError(f"cannot load a Hugging Face masked LM from {folder}: {_one_line(exc)}") from None
    if tokenizer.mask_token_id is None:
        raise UserError(f"{folder}: its tokenizer has no mask token, so it is not a masked-LM tokenizer")
    hf_cfg = model.config
    positions = getattr(hf_cfg, "max_position_embeddings", None)
    if positions is not None and getattr(hf_cfg, "model_type", "") in _OFFSET_POSITIONS:
        positions -= (hf_cfg.pad_token_id or 0) + 1
    if positions is not None and language.max_len > positions:
        raise UserError(f"{folder}: the model takes {positions} positions, the {language.name} language's "
                        f"sentences up to {language.max_len}")
    is_corpus = getattr(language, "name", None) == "corpus" and hasattr(language, "folder")
    words = (corpus_word_ids if is_corpus else word_ids)(tokenizer, language, folder)
    mask = tokenizer.mask_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else getattr(hf_cfg, "pad_token_id", None)
    cls = tokenizer.cls_token_id if tokenizer.cls_token_id is not None else tokenizer.bos_token_id
    if is_corpus and cls is None:
        raise UserError(f"{folder}: its tokenizer has no cls (or bos) token, which every sequence of a corpus "
                        "starts with")
    n_rows = model.get_output_embeddings().weight.shape[0]
    used = [i for i in words + [mask, pad, cls] if i is not None]
    if max(used) >= n_rows:
        raise UserError(f"{folder}: its tokenizer has id {max(used)}, but the model's output layer has {n_rows} rows")
    # a special already among the words (a corpus's vocabulary holds them) keeps its row
    # there only: the softmax is then the model's own over the tokenizer's vocabulary
    taken = set(words)
    outputs = words + [-1 if i is None or i in taken else i for i in (pad, mask, cls)]
    inputs = words + [mask if i is None else i for i in (pad, mask, cls)]
    model.eval()
    adapter = HFMaskedLM(model, torch.tensor(inputs), torch.tensor(outputs), language.pad_id, language.max_len)
    return adapter.to(device).eval()


def language_config_of(folder: str | Path) -> Path | None:
    """The recipe an exported folder carries (``sameloss.toml``), if any."""
    path = Path(folder) / "sameloss.toml"
    return path if path.is_file() else None


def hf_row_info(folder: str | Path) -> dict:
    """``run`` and ``architecture`` of a folder for a measure row."""
    try:
        arch = json.loads((Path(folder) / "config.json").read_text()).get("architectures") or ["?"]
    except (OSError, ValueError):
        arch = ["?"]
    return {"run": Path(folder).name, "architecture": arch[0]}
