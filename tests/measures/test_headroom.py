"""The headroom table: span views, the random-init encoder, and every row against a direct
computation on the same design (HMM position tasks and PCFG span tasks)."""

from __future__ import annotations

import pytest
import torch

from sameloss import config as configlib
from sameloss.errors import UserError
from sameloss.languages import HMM, PCFG, Dyck
from sameloss.measures.fewshot import fewshot_accuracies, subset_indices
from sameloss.measures.headroom import (KINDS, HeadroomDesign, headroom_table, random_init_encoder, span_view,
                                        task_data)
from sameloss.measures.lookup import lookup_features
from sameloss.training.config import PretrainConfig
from sameloss.training.runio import build_language, init_model, load_checkpoint

SMOKE = dict(sizes=(20, 40), subsets=(3, 2), pool=80, test=120)


def test_span_view_concatenates_or_averages_the_span_and_zeroes_pads():
    pad = 9
    states = torch.arange(2 * 4 * 3, dtype=torch.float32).reshape(2, 4, 3)
    tokens = torch.tensor([[1, 2, 3, pad], [4, 5, pad, pad]])
    concat = span_view(states, tokens, pad, (1, 3), "concat")
    assert torch.equal(concat[0], torch.cat([states[0, 1], states[0, 2]]))
    assert torch.equal(concat[1], torch.cat([states[1, 1], torch.zeros(3)]))  # position 2 is a pad
    mean = span_view(states, tokens, pad, (0, None), "mean")
    assert torch.allclose(mean[0], states[0, :3].mean(dim=0))
    assert torch.allclose(mean[1], states[1, :2].mean(dim=0))  # the pads are left out of the mean
    assert span_view(states, tokens, pad, (0, None), "concat").shape == (2, 12)


def test_random_init_encoder_is_the_runs_initial_model_and_leaves_the_global_rng_alone():
    cfg = configlib.load(PretrainConfig, None, ["language.name=hmm", "language.size=micro", "model.size=micro",
                                                "seed=5"])
    lang = build_language(cfg)
    torch.manual_seed(123)
    before = torch.get_rng_state()
    model = random_init_encoder(cfg, lang)
    assert torch.equal(torch.get_rng_state(), before)
    torch.manual_seed(5)  # what pretrain does before building the model
    reference = init_model(cfg, lang, "cpu")
    for (name, a), (_, b) in zip(model.state_dict().items(), reference.state_dict().items()):
        assert torch.equal(a, b), name
    other = random_init_encoder(cfg, lang, seed=6)
    assert any(not torch.equal(a, b) for a, b in zip(model.state_dict().values(), other.state_dict().values()))


def _direct(features_pool, features_test, data, design):
    """Mean accuracy per size of the L-BFGS probe, computed here without the module."""
    out = {}
    for n, k in zip(design.sizes, design.subsets):
        acc, _ = fewshot_accuracies(features_pool, data.train.labels, features_test, data.test.labels,
                                    data.n_classes, subset_indices(design.pool, n, k, design.seed), "lbfgs",
                                    l2=design.l2)
        out[n] = sum(acc) / len(acc)
    return out


def test_hmm_position_task_rows_are_the_position_probes(checkpoint):
    """A position is a span of one: the look-up row probes the conditionals at that
    position only, the oracle the hidden state's posterior there, the trained row the
    encoder's states there."""
    model, lang, cfg, _ = load_checkpoint(checkpoint, "cpu")
    assert lang.tasks["task-5"].span == (4, 5)
    design = HeadroomDesign("task-5", **SMOKE)
    data = task_data(lang, design)
    table = headroom_table(lang, design, trained={"trained": model}, random_init=random_init_encoder(cfg, lang),
                           data=data)
    assert [r.kind for r in table.rows] == list(KINDS)
    T, W = lang.max_len, lang.n_words

    def at5(tok):
        return lookup_features(lang, tok).reshape(tok.shape[0], T, W)[:, 4]

    lookup = _direct(at5(data.train.tokens), at5(data.test.tokens), data, design)
    oracle = _direct(lang.posteriors(data.train.tokens)[:, 4], lang.posteriors(data.test.tokens)[:, 4], data, design)
    for n in design.sizes:
        assert table.of("look-up")[0].accuracy[n] == pytest.approx(lookup[n], abs=1e-12)
        assert table.of("oracle")[0].accuracy[n] == pytest.approx(oracle[n], abs=1e-12)
    assert table.of("look-up")[0].features == W and table.of("trained")[0].features == model.config.d_model
    m = table.margins(40)
    trained = table.accuracy("trained", 40)
    assert m["above_lookup"] == pytest.approx(100 * (trained - lookup[40]))
    assert m["below_oracle"] == pytest.approx(100 * (oracle[40] - trained))
    assert m["headroom"] == min(m["above_lookup"], m["above_random_init"], m["below_oracle"])
    assert "margins at n=40" in table.format()


def test_pcfg_span_table_on_micro_orders_its_rows_sensibly():
    lang = PCFG.preset("micro")
    cfg = configlib.load(PretrainConfig, None, ["language.name=pcfg", "language.size=micro", "model.size=micro"])
    design = HeadroomDesign("span-2", sizes=(40,), subsets=(4,), pool=100, test=300)
    data = task_data(lang, design)
    table = headroom_table(lang, design, random_init=random_init_encoder(cfg, lang), data=data)
    assert [r.kind for r in table.rows] == ["majority", "random-init", "look-up", "oracle"]
    # the span's two positions, concatenated
    assert table.of("look-up")[0].features == 2 * lang.n_words
    assert table.of("random-init")[0].features == 2 * 16
    assert table.of("oracle")[0].features == lang.grammar.n_nonterminals
    majority, lookup, oracle = (table.accuracy(k, 40) for k in ("majority", "look-up", "oracle"))
    assert oracle >= lookup >= majority - 0.05 and oracle > majority
    # the oracle's features are the posterior itself: its argmax is the label
    post = lang.tasks["span-2"].posterior(data.test.tokens)
    assert torch.equal(post.argmax(dim=1), data.test.labels)
    assert [d["kind"] for d in table.to_dicts()] == ["majority", "random-init", "look-up", "oracle"]


def test_tasks_without_a_span_are_refused():
    lang = Dyck.preset("tiny")
    with pytest.raises(UserError, match="no span"):
        headroom_table(lang, HeadroomDesign("mismatch", **SMOKE))
    with pytest.raises(UserError, match="pooling"):
        HeadroomDesign("span-1", pooling="max")
    with pytest.raises(UserError, match="sizes"):
        HeadroomDesign("span-1", sizes=(500,), subsets=(1,), pool=100)
    assert HMM.preset("micro").tasks["task-3-sampled"].span == (2, 3)
