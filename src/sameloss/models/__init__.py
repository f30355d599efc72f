"""Masked language models: a BERT-style transformer and a bidirectional LSTM.

Both map token ids ``[n, T]`` to logits ``[n, T, vocab_size]`` (``forward``) and to final
hidden states ``[n, T, d_features]`` (``features``), and ignore padding (``pad_id``).
``build_model`` makes either from a named size (``sizes.py``).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from sameloss.errors import UserError
from sameloss.models.lstm import LSTMConfig, LSTMMLM
from sameloss.models.sizes import lstm_config, size_names, transformer_config
from sameloss.models.transformer import TransformerConfig, TransformerMLM

__all__ = [
    "LSTMConfig",
    "LSTMMLM",
    "TransformerConfig",
    "TransformerMLM",
    "build_model",
    "lstm_config",
    "size_names",
    "transformer_config",
]


def build_model(kind: str, size: Any, vocab_size: int, max_len: int, **overrides: Any) -> nn.Module:
    """A freshly initialised ``"transformer"`` or ``"lstm"`` MLM of a named size (or a
    table of shape fields); ``overrides`` set config fields (dropout, norm, …)."""
    if kind == "transformer":
        return TransformerMLM(transformer_config(size, vocab_size, max_len, **overrides))
    if kind == "lstm":
        return LSTMMLM(lstm_config(size, vocab_size, max_len, **overrides))
    raise UserError(f"unknown model kind {kind!r}; valid kinds: transformer, lstm")
