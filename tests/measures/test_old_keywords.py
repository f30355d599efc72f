"""The measures' keywords from before their settings objects still work, with a
``DeprecationWarning`` naming what to write instead (issue 62, CHANGELOG.md 0.2.0): the same
numbers as the new call; old and new at once is a ``TypeError``."""

from __future__ import annotations

import pytest
import torch

from sameloss.languages import make_language
from sameloss.measures.curvature import (FisherContexts, FixedBatch, loss_batch, sample_contexts, top_eigenvalue,
                                         trace_fisher, trace_hutchinson)
from sameloss.measures.lookup import lookup_table_probe
from sameloss.measures.probe import ProbeSettings, probe_features
from sameloss.measures.tasks import make_task_data
from sameloss.models import TransformerConfig, TransformerMLM


@pytest.fixture(scope="module")
def language():
    return make_language("pcfg", "tiny")


@pytest.fixture(scope="module")
def model(language):
    torch.manual_seed(0)
    cfg = TransformerConfig(vocab_size=language.vocab_size, max_len=language.max_len, d_model=4, n_heads=1,
                            n_layers=1, d_inter=8, pad_id=language.pad_id, init_std=0.5)
    return TransformerMLM(cfg).double().eval()


def test_trace_hutchinson_and_top_eigenvalue_take_the_fixed_batchs_old_keywords(model, language):
    new = trace_hutchinson(model, language, FixedBatch(n_sentences=8, seed=3, engine="autograd"), n_probes=4)
    with pytest.warns(DeprecationWarning, match=r"trace_hutchinson: the keywords n_sentences, seed, engine are "
                                                r"deprecated: pass fixed=FixedBatch\(n_sentences=\.\.\., seed=\.\.\., "
                                                r"engine=\.\.\.\) instead"):
        old = trace_hutchinson(model, language, n_probes=4, n_sentences=8, seed=3, engine="autograd")
    assert old.estimate == new.estimate and old.stderr == new.stderr
    batch = loss_batch(language, n_sentences=8, mask_rate=0.15, seed=1)
    with pytest.warns(DeprecationWarning, match="top_eigenvalue: the keywords batch"):
        old = top_eigenvalue(model, language, batch=batch, max_iter=20)
    assert old.estimate == top_eigenvalue(model, language, FixedBatch(batch=batch), max_iter=20).estimate
    with pytest.raises(TypeError, match="give fixed= or the old keywords"):
        trace_hutchinson(model, language, FixedBatch(), n_probes=2, seed=1)


def test_trace_fisher_takes_its_old_keywords_and_its_old_contexts_batch(model, language):
    contexts = sample_contexts(language, 6, seed=2)
    new = trace_fisher(model, language, FisherContexts(batch=contexts), n_labels=None)
    with pytest.warns(DeprecationWarning, match=r"pass contexts=FisherContexts\(batch=\.\.\.\)"):
        old = trace_fisher(model, language, contexts=contexts, n_labels=None)  # the old contexts= was the batch
    assert old.estimate == new.estimate
    with pytest.warns(DeprecationWarning, match="the keywords n_contexts, seed"):
        a = trace_fisher(model, language, n_contexts=5, seed=4, n_labels=2)
    assert a.estimate == trace_fisher(model, language, FisherContexts(n_contexts=5, seed=4), n_labels=2).estimate
    # the new keyword, a FisherContexts, is not taken for the old one
    trace_fisher(model, language, contexts=FisherContexts(batch=contexts), n_labels=None)


def test_the_probes_take_their_old_keywords_and_positional_method(language):
    data = make_task_data(language, "B", n_train=60, n_validation=20, n_test=40, seed=0)
    gen = torch.Generator().manual_seed(0)
    features = {s: torch.randn(len(getattr(data, s)), 6, generator=gen) for s in ("train", "validation", "test")}
    settings = ProbeSettings.of("lbfgs", seeds=(0, 1), l2=1e-3)
    new = probe_features(features, data, settings)
    with pytest.warns(DeprecationWarning, match=r"probe_features: the keywords method, seeds, l2 are deprecated: "
                                                r"pass settings=ProbeSettings\.of\(method=\.\.\., seeds=\.\.\., "
                                                r"l2=\.\.\.\)"):
        old = probe_features(features, data, method="lbfgs", seeds=(0, 1), l2=1e-3)
    assert old.mean == new.mean and old.accuracies == new.accuracies
    with pytest.warns(DeprecationWarning):  # the old third positional argument was the measure's name
        named = probe_features(features, data, "my_probe", method="lbfgs", seeds=(0, 1), l2=1e-3)
    assert named.measure == "my_probe" and named.accuracies == new.accuracies
    with pytest.warns(DeprecationWarning, match="lookup_table_probe: the keywords seeds, method"):
        old = lookup_table_probe(language, data, "lbfgs", seeds=(0,))  # method: its old third positional
    assert old.accuracies == lookup_table_probe(language, data, ProbeSettings.of("lbfgs", seeds=(0,))).accuracies
