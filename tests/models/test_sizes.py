"""Named sizes: the paper's tables, aliases, presets, overrides and errors."""

from __future__ import annotations

import pytest
from models.model_test_utils import MAX_LEN, VOCAB

from sameloss.errors import UserError
from sameloss.models import (
    LSTMMLM,
    TransformerMLM,
    build_model,
    lstm_config,
    size_names,
    transformer_config,
)
from sameloss.models.sizes import LSTM_SIZES, TRANSFORMER_SIZES

# d_model/n_heads/n_layers/d_inter, copied from the paper
TABLE_3 = """64/1/1/256 128/2/4/512 192/3/5/768 256/4/6/1024 512/8/8/2048 768/12/12/3072
             1024/16/16/4096 1280/20/20/5120 1536/24/24/6144"""
TABLE_4 = """128/2/4/512 192/3/5/768 320/5/6/1024 384/6/7/2048 640/10/12/3072 960/15/16/4096
             1920/30/20/5120"""


def rows(table: str) -> list[tuple[int, ...]]:
    return [tuple(map(int, row.split("/"))) for row in table.split()]


@pytest.mark.parametrize(("prefix", "table"), [("t3", TABLE_3), ("t4", TABLE_4)])
def test_paper_tables(prefix, table):
    for d, heads, layers, inter in rows(table):
        cfg = transformer_config(f"{prefix}-{d}", VOCAB, MAX_LEN)
        assert (cfg.d_model, cfg.n_heads, cfg.n_layers, cfg.d_inter) == (d, heads, layers, inter)
        assert cfg.d_head == 64  # App. B.4: BERT's head width throughout


def test_aliases_and_presets():
    for alias, name in [("bert-base", "t3-768"), ("bert-medium", "t3-512")]:
        assert transformer_config(alias, VOCAB, MAX_LEN) == transformer_config(name, VOCAB, MAX_LEN)
    assert 90_000 <= build_model("transformer", "tiny", 203, 33).num_parameters() <= 150_000
    assert build_model("transformer", "micro", 203, 33).num_parameters() < 10_000
    assert build_model("lstm", "micro", 203, 33).num_parameters() < 10_000
    assert "bert-base" in size_names("transformer")


def test_lstm_grid():
    for h in [128, 256, 512, 768, 1024]:
        for n in [4, 6, 8, 12, 16]:
            cfg = lstm_config(f"h{h}-l{n}", VOCAB, MAX_LEN)
            assert (cfg.d_hidden, cfg.n_layers, cfg.d_model) == (h, n, h)
    assert len(LSTM_SIZES) == 25 + 2


def test_defaults_and_overrides():
    cfg = transformer_config("micro", 203, 33)
    assert cfg.pad_id == 200 and cfg.vocab_size == 203 and cfg.max_len == 33
    assert cfg.norm == "post" and cfg.dropout == 0.1
    cfg = transformer_config("micro", 203, 33, norm="pre", dropout=0.0, n_layers=3)
    assert (cfg.norm, cfg.dropout, cfg.n_layers) == ("pre", 0.0, 3)
    custom = {"d_model": 32, "n_heads": 2, "n_layers": 1, "d_inter": 64}
    assert transformer_config(custom, 203, 33).d_model == 32


def test_build_model_kinds():
    assert isinstance(build_model("transformer", "micro", VOCAB, MAX_LEN), TransformerMLM)
    assert isinstance(build_model("lstm", "micro", VOCAB, MAX_LEN), LSTMMLM)
    with pytest.raises(UserError, match="unknown model kind 'gru'"):
        build_model("gru", "micro", VOCAB, MAX_LEN)


def test_unknown_size_lists_the_valid_ones():
    with pytest.raises(UserError) as err:
        transformer_config("t3-100", VOCAB, MAX_LEN)
    message = str(err.value)
    assert "'t3-100'" in message
    for name in TRANSFORMER_SIZES:
        assert name in message
    with pytest.raises(UserError, match="unknown transformer setting"):
        transformer_config("micro", VOCAB, MAX_LEN, hidden_size=3)
    with pytest.raises(UserError, match="missing d_inter"):
        transformer_config({"d_model": 32, "n_heads": 2, "n_layers": 1}, VOCAB, MAX_LEN)


@pytest.mark.parametrize(("size", "millions"), [("t3-64", 2.0), ("t3-128", 4.8), ("t3-192", 8.2), ("t3-256", 12.8)])
def test_paper_counts_are_bert_vocabulary(size, millions):
    """The paper's parameter counts are Table 3's shapes with BERT's vocabulary (30,522)
    and 512 positions — not with the synthetic languages' ~200 words."""
    n = build_model("transformer", size, 30_522, 512).num_parameters()
    assert abs(n / 1e6 - millions) < 0.05 * millions
