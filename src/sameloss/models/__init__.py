"""Masked language models: a BERT-style transformer and a bidirectional LSTM.

Both map token ids ``[n, T]`` to logits ``[n, T, vocab_size]`` (``forward``) and to final
hidden states ``[n, T, d_features]`` (``features``), and ignore padding (``pad_id``).
``build_model`` makes any registered kind (``kind.py``; ``sameloss.registry.MODELS``) from
a named size (``sizes.py``).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from sameloss.models.kind import ModelKind, kind_of_config, model_kind
from sameloss.models.lstm import LSTMConfig, LSTMMLM
from sameloss.models.sizes import lstm_config, size_names, transformer_config
from sameloss.models.transformer import TransformerConfig, TransformerMLM

__all__ = [
    "LSTMConfig",
    "LSTMMLM",
    "ModelKind",
    "TransformerConfig",
    "TransformerMLM",
    "build_model",
    "kind_of_config",
    "lstm_config",
    "model_kind",
    "size_names",
    "transformer_config",
]


def build_model(kind: str, size: Any, vocab_size: int, max_len: int, **overrides: Any) -> nn.Module:
    """A freshly initialised MLM of a registered kind and a named size.

    Args:
        kind: ``"transformer"``, ``"lstm"`` or a plugin's (``sameloss.registry.MODELS``).
        size: a named size (``micro``, ``tiny``, ``t4-384``, ...; ``size_names(kind)``) or a
            table of shape fields.
        vocab_size: the language's vocabulary, special tokens included.
        max_len: the longest sentence.
        **overrides: config fields over the size's own (``dropout``, ``norm``, ...).

    Returns:
        the model (``forward``: ids ``[n, T]`` to logits ``[n, T, vocab_size]``; ``features``:
        final hidden states). ``UserError`` for an unknown kind, size or field.
    """
    return model_kind(kind).build(size, vocab_size, max_len, **overrides)
