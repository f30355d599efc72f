"""The headroom table: span views, every row against a direct computation on the same
design (HMM position tasks and PCFG span tasks), and against what ``measures.run`` gives
for the same few-shot design (one representation, one probe, one data draw)."""

from __future__ import annotations

import pytest
import torch

from sameloss import config as configlib
from sameloss.errors import UserError
from sameloss.languages import HMM, PCFG, Dyck
from sameloss.measures.fewshot import View, fewshot_accuracies, subset_indices
from sameloss.measures.headroom import KINDS, HeadroomDesign, headroom_table, span_view, task_data
from sameloss.measures.lookup import lookup_features
from sameloss.measures.run import MeasureSpec, measure_model, measure_reference
from sameloss.training.config import PretrainConfig
from sameloss.training.runio import load_checkpoint

SMOKE = dict(sizes=(20, 40), subsets=(3, 2), pool=80, test=120)


def test_span_view_reads_the_span():
    states = torch.arange(2 * 4 * 3, dtype=torch.float32).reshape(2, 4, 3)
    assert span_view((1, 3)) == View((1, 2)) and span_view((4, 5)) == View((4,))
    assert torch.equal(span_view((1, 3))(states), torch.cat([states[:, 1], states[:, 2]], dim=1))
    assert torch.equal(span_view((1, 3), "mean")(states), (states[:, 1] + states[:, 2]) / 2)
    assert torch.equal(span_view((0, None))(states), states.reshape(2, 12))  # to the end: every position
    assert torch.equal(span_view((0, 1))(states), states[:, 0])


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
    table = headroom_table(lang, design, trained={"trained": model}, random_init=cfg, data=data)
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
    text = table.format()
    assert "margins at n=40" in text and f"oracle − trained {m['below_oracle']:+.1f}" in text
    for r in table.rows:  # each row's line holds its accuracies, in %
        line = next(x for x in text.splitlines() if x.startswith(r.name))
        assert [f"{100 * r.accuracy[n]:.1f}" for n in design.sizes] == line[40:].split()[::3], r.name


def test_rows_are_what_measures_run_gives_for_the_same_design(checkpoint):
    """The random-init and look-up rows are ``measure_reference`` of the design's
    ``FewShot``, the trained row ``measure_model`` of it, subset by subset; the oracle row
    of an HMM state task is the HMM's oracle representation at the state's position."""
    model, lang, cfg, _ = load_checkpoint(checkpoint, "cpu")
    design = HeadroomDesign("task-5", sizes=(20,), subsets=(3,), pool=60, test=90)
    table = headroom_table(lang, design, trained={"trained": model}, random_init=cfg)
    spec = MeasureSpec(fewshot=design.fewshot(span_view(lang.tasks["task-5"].span)))
    key = "span_lbfgs_n20"
    for kind, want in (("random-init", measure_reference("random-init", lang, cfg, spec)),
                       ("look-up", measure_reference("lookup", lang, cfg, spec)),
                       ("trained", measure_model(model, lang, cfg, spec)),
                       ("oracle", measure_reference("oracle", lang, cfg, spec))):
        (got,) = table.of(kind)
        assert got.subsets[20] == want[key + "_subsets"] and got.accuracy[20] == want[key], kind
    assert table.accuracy("majority", 20) == measure_reference("lookup", lang, cfg, spec)["fewshot_majority"]


def test_pcfg_span_table_on_micro_orders_its_rows_sensibly():
    lang = PCFG.preset("micro")
    cfg = configlib.load(PretrainConfig, None, ["language.name=pcfg", "language.size=micro", "model.size=micro"])
    design = HeadroomDesign("span-2", sizes=(40,), subsets=(4,), pool=100, test=300)
    data = task_data(lang, design)
    table = headroom_table(lang, design, random_init=cfg, data=data)
    assert [r.kind for r in table.rows] == ["majority", "random-init", "look-up", "oracle"]
    # the span's two positions, concatenated
    assert table.of("look-up")[0].features == 2 * lang.n_words
    assert table.of("random-init")[0].features == 2 * 16
    assert table.of("oracle")[0].features == lang.grammar.n_nonterminals
    T, W = lang.max_len, lang.n_words

    def first_two(tok):  # the conditionals at positions 0 and 1, side by side
        return lookup_features(lang, tok).reshape(tok.shape[0], T, W)[:, :2].reshape(tok.shape[0], 2 * W)

    posterior = lang.tasks["span-2"].posterior
    direct = {"look-up": _direct(first_two(data.train.tokens), first_two(data.test.tokens), data, design),
              "oracle": _direct(posterior(data.train.tokens), posterior(data.test.tokens), data, design)}
    for kind, want in direct.items():
        assert table.accuracy(kind, 40) == pytest.approx(want[40], abs=1e-12), kind
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
