"""Reference representations and few-shot measures: the random-init encoder is the run's own
initial model (no global RNG side effect), the look-up table is the true conditionals, the
oracle the true posteriors; a model measured by ``measure_model`` and the same model as a
reference give the same probes."""

from __future__ import annotations

import pytest
import torch

from sameloss import config as configlib
from sameloss.errors import UserError
from sameloss.measures.fewshot import FewShot, View
from sameloss.measures.representations import model_representation, reference_representation
from sameloss.measures.run import MeasureSpec, measure_model, measure_reference
from sameloss.training.config import PretrainConfig
from sameloss.training.runio import build_language, init_model


@pytest.fixture(scope="module")
def cfg():
    return configlib.load(PretrainConfig, None, ["language.name=hmm", "language.size=micro", "model.size=micro",
                                                 "seed=5", "device=cpu"])


@pytest.fixture(scope="module")
def language(cfg):
    return build_language(cfg)


def spec(task="task-5"):
    design = FewShot(task, (("pos", View((4,))), ("all", View())), sizes=(8,), subsets=(2,), pool=24, test=40,
                     endpoints=(("pos", "lbfgs"), ("all", "adamw")), epochs=2)
    return MeasureSpec(fewshot=design)


def test_the_references_are_what_they_say(cfg, language):
    tokens = language.sample(6, torch.Generator().manual_seed(0)).tokens
    torch.manual_seed(123)
    before = torch.get_rng_state()
    h = reference_representation("random-init", language, cfg, tokens)
    assert torch.equal(torch.get_rng_state(), before)  # no global side effect
    torch.manual_seed(cfg.seed)
    assert torch.equal(h, model_representation(init_model(cfg, language), tokens))  # the run's initial weights
    lookup = reference_representation("lookup", language, cfg, tokens)
    assert lookup.shape == (6, language.max_len, language.n_words)
    real = tokens != language.pad_id
    assert torch.allclose(lookup[real].sum(-1), torch.ones(int(real.sum())), atol=1e-5)  # distributions
    oracle = reference_representation("oracle", language, cfg, tokens)
    assert oracle.shape[:2] == tokens.shape and torch.allclose(oracle.sum(-1), torch.ones(tokens.shape), atol=1e-5)
    with pytest.raises(UserError, match="no true posteriors"):
        pcfg = configlib.load(PretrainConfig, None, ["language.name=pcfg", "language.size=micro"])
        reference_representation("oracle", build_language(pcfg), pcfg, tokens)
    with pytest.raises(UserError, match="unknown reference"):
        reference_representation("best", language, cfg, tokens)


def test_a_reference_is_measured_like_a_model(cfg, language):
    s = spec()
    ref = measure_reference("random-init", language, cfg, s)
    torch.manual_seed(cfg.seed)
    row = measure_model(init_model(cfg, language), language, cfg, s)
    for key in s.fewshot.columns():
        assert ref[key] == row[key] and ref[f"{key}_subsets"] == row[f"{key}_subsets"]
    assert 0 < ref["fewshot_majority"] < 1
    oracle = measure_reference("oracle", language, cfg, s)
    assert oracle["fewshot_majority"] == ref["fewshot_majority"]  # the same task data
    assert oracle["pos_lbfgs_n8_subsets"] != ref["pos_lbfgs_n8_subsets"]
    with pytest.raises(UserError, match="fewshot design"):
        measure_reference("oracle", language, cfg, MeasureSpec(loss=True))
