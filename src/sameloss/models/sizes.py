"""Named model sizes: the paper's Tables 3 and 4, its LSTM grid, and tiny CPU presets.

Transformer names
    ``t3-<d_model>``  a row of Table 3 (models of Section 2), e.g. ``t3-1024``;
    ``t4-<d_model>``  a row of Table 4 (Figure 5, widths chosen so that replication
                      embeds the smaller models into the larger ones), e.g. ``t4-960``;
    ``bert-medium`` = ``t3-512`` and ``bert-base`` = ``t3-768`` (Google's BERT shapes);
    ``tiny`` (≈0.1M parameters at vocabulary 203) and ``micro`` (a few thousand, tests).

LSTM names (App. A.4: d_hidden in {128, 256, 512, 768, 1024} × layers in {4, 6, 8, 12, 16})
    ``h<d_hidden>-l<layers>``, e.g. ``h512-l8``; the embedding width d_model = d_hidden;
    ``tiny`` and ``micro`` as above.

The paper's parameter counts (2M for ``t3-64`` … 110M for ``t3-768``, 235M for ``t3-1024``)
are these shapes with BERT's 30,522-token vocabulary and 512 positions (the tokenizer and
config of Izsak et al.'s code): ``t3-64`` then has 2.07M parameters, 1.95M of them in the
embedding. With the synthetic languages' vocabulary of about 200 words the same shapes
are much smaller (``t3-64``: 70k).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# (d_model, n_heads, n_layers, d_inter)
TABLE_3 = [
    (64, 1, 1, 256),
    (128, 2, 4, 512),
    (192, 3, 5, 768),
    (256, 4, 6, 1024),
    (512, 8, 8, 2048),
    (768, 12, 12, 3072),
    (1024, 16, 16, 4096),
    (1280, 20, 20, 5120),
    (1536, 24, 24, 6144),
]
TABLE_4 = [
    (128, 2, 4, 512),
    (192, 3, 5, 768),
    (320, 5, 6, 1024),
    (384, 6, 7, 2048),
    (640, 10, 12, 3072),
    (960, 15, 16, 4096),
    (1920, 30, 20, 5120),
]


def _shape(d_model: int, n_heads: int, n_layers: int, d_inter: int) -> dict[str, int]:
    return {"d_model": d_model, "n_heads": n_heads, "n_layers": n_layers, "d_inter": d_inter}


TRANSFORMER_SIZES: dict[str, dict[str, int]] = {
    "micro": _shape(16, 2, 1, 32),
    "tiny": _shape(64, 4, 2, 256),
    **{f"t3-{row[0]}": _shape(*row) for row in TABLE_3},
    **{f"t4-{row[0]}": _shape(*row) for row in TABLE_4},
}
TRANSFORMER_ALIASES: dict[str, str] = {"bert-medium": "t3-512", "bert-base": "t3-768"}

LSTM_HIDDEN = [128, 256, 512, 768, 1024]
LSTM_LAYERS = [4, 6, 8, 12, 16]
LSTM_SIZES: dict[str, dict[str, int]] = {
    "micro": {"d_model": 16, "d_hidden": 8, "n_layers": 1},
    "tiny": {"d_model": 64, "d_hidden": 64, "n_layers": 2},
    **{
        f"h{h}-l{n}": {"d_model": h, "d_hidden": h, "n_layers": n}
        for h in LSTM_HIDDEN
        for n in LSTM_LAYERS
    },
}
LSTM_ALIASES: dict[str, str] = {}


def size_names(kind: str) -> list[str]:
    """Every valid size name (aliases included) of a model kind (``"transformer"``, ``"lstm"``)."""
    from .kind import model_kind

    return model_kind(kind).size_names()


def transformer_config(size: str | Mapping[str, Any], vocab_size: int, max_len: int, **overrides: Any):
    """Config for a named size (or a table with d_model, n_heads, n_layers, d_inter).

    ``pad_id`` defaults to ``vocab_size - 3`` (the convention of
    ``sameloss.languages.base``); ``overrides`` set any other ``TransformerConfig`` field.
    Raises ``UserError`` for an unknown name or field.
    """
    from .kind import model_kind

    return model_kind("transformer").config(size, vocab_size, max_len, **overrides)


def lstm_config(size: str | Mapping[str, Any], vocab_size: int, max_len: int, **overrides: Any):
    """Config for a named LSTM size (or a table with d_model, d_hidden, n_layers); as
    ``transformer_config``."""
    from .kind import model_kind

    return model_kind("lstm").config(size, vocab_size, max_len, **overrides)
