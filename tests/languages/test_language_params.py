"""``language.params``: a language's constructor settings over its size's own (HMM.random's,
the PCFG's GrammarShape and max_len), parsed in one place, checked by each language, saved with
the run's config without changing configs that do not use it."""

from __future__ import annotations

import json

import pytest
import torch

from sameloss import config as configlib
from sameloss.cli import main
from sameloss.errors import UserError
from sameloss.languages import hmm as hmm_module
from sameloss.languages import make_language
from sameloss.languages import pcfg as pcfg_module
from sameloss.languages.hmm import HMM
from sameloss.languages.pcfg import PCFG
from sameloss.languages.pcfg_random import GrammarShape, random_layered
from sameloss.registry import language_params, parse_params
from sameloss.training.config import LanguageConfig, PretrainConfig
from sameloss.training.runfolder import config_differences
from sameloss.training.runio import build_language, read_config_dict

GRAMMAR_TENSORS = ("start", "rule_parent", "rule_left", "rule_right", "rule_prob", "emission")


# ---- syntax ------------------------------------------------------------------------------
def test_parse_params_reads_integers_then_decimals():
    got = parse_params(" n_states = 6 , concentration=0.5,smoothing=1e-3,length=-2")
    assert got == {"n_states": 6, "concentration": 0.5, "smoothing": 1e-3, "length": -2}
    assert [type(v) for v in got.values()] == [int, float, float, int]
    assert list(got) == ["n_states", "concentration", "smoothing", "length"]


@pytest.mark.parametrize("text, message", [
    ("", "language.params is empty"),
    ("   ", "language.params is empty"),
    ("n_states", "'n_states' is not key=value"),
    ("n_states=6,", "an empty item"),
    ("n_states=6,,length=3", "an empty item"),
    ("=6", "'' is not a setting name"),
    ("n-states=6", "'n-states' is not a setting name"),
    ("2x=6", "'2x' is not a setting name"),
    ("n_states=six", "n_states='six' is not a number"),
    ("n_states=", "n_states='' is not a number"),
    ("n_states=6=7", "n_states='6=7' is not a number"),
    ("concentration=nan", "concentration=nan is not a finite number"),
    ("concentration=inf", "concentration=inf is not a finite number"),
    ("n_states=6,n_states=7", "n_states is given twice"),
])
def test_bad_params_text_is_one_clear_line(text, message):
    with pytest.raises(ValueError) as exc:
        parse_params(text)
    assert message in str(exc.value) and "\n" not in str(exc.value)


def test_each_language_checks_the_keys_and_types_of_its_constructor():
    assert hmm_module.PARAMS == {"n_states": int, "n_words": int, "length": int, "concentration": float,
                                 "emission_concentration": float, "smoothing": float}
    assert pcfg_module.PARAMS == {"n_words": int, "n_roots": int, "n_levels": int, "symbols_per_level": int,
                                  "binary_rules_per_symbol": int, "emit_prob": float, "words_per_emission": int,
                                  "words_per_last_symbol": int, "concentration": float, "max_len": int}
    got = language_params("n_states=6,concentration=1", hmm_module.PARAMS, "hmm")
    assert got == {"n_states": 6, "concentration": 1.0} and type(got["concentration"]) is float
    with pytest.raises(UserError) as exc:
        language_params("n_states=6,n_hidden=3", hmm_module.PARAMS, "hmm")
    assert str(exc.value) == ("language.params: the hmm language takes no 'n_hidden'; it takes n_states, n_words, "
                              "length, concentration, emission_concentration, smoothing")
    with pytest.raises(UserError, match="takes no 'seed'"):  # language.seed selects the draw
        language_params("seed=3", hmm_module.PARAMS, "hmm")
    with pytest.raises(UserError, match="n_states must be an integer, got 6.5"):
        language_params("n_states=6.5", hmm_module.PARAMS, "hmm")
    with pytest.raises(UserError, match="language.params is empty"):  # text: a UserError, not a ValueError
        language_params("", hmm_module.PARAMS, "hmm")
    assert language_params(None, hmm_module.PARAMS, "hmm") == {}


# ---- the languages -----------------------------------------------------------------------
@pytest.mark.parametrize("size, seed", [("micro", None), ("micro", 5), ("tiny", 2)])
def test_an_hmm_with_params_is_hmm_random_of_the_size_with_them(size, seed):
    params = {"n_states": 6, "emission_concentration": 0.5, "length": 5}
    built = HMM.preset(size, seed=seed, params="n_states=6,emission_concentration=0.5,length=5")
    kwargs = {**hmm_module.PRESETS[size], **({} if seed is None else {"seed": seed}), **params}
    expected = HMM.random(**kwargs)
    assert built.n_states == 6 and built.max_len == 5
    for name in ("initial", "transition", "emission"):
        assert torch.equal(getattr(built, name), getattr(expected, name)), name
    # and it is another language than the size's own
    assert not torch.equal(built.emission[:4], HMM.preset(size, seed=seed).emission)
    # through the registry's builder too (language.* settings)
    made = make_language("hmm", preset=size, seed=seed, params="n_states=6,emission_concentration=0.5,length=5")
    assert torch.equal(made.transition, expected.transition) and torch.equal(made.emission, expected.emission)


@pytest.mark.parametrize("seed", [None, 4])
def test_a_pcfg_with_params_is_the_random_grammar_of_the_size_with_them(seed):
    built = PCFG.preset("micro", seed=seed, params="n_words=10,emit_prob=0.3,max_len=6")
    kwargs = {**pcfg_module.PRESETS["micro"], "n_words": 10, "emit_prob": 0.3}
    expected = random_layered(GrammarShape(**kwargs), seed=pcfg_module.PRESET_SEEDS["micro"] if seed is None else seed)
    assert built.n_words == 10 and built.max_len == 6
    for name in GRAMMAR_TENSORS:
        assert torch.equal(getattr(built.grammar, name), getattr(expected, name)), name
    own = PCFG.preset("micro", seed=seed).grammar
    assert own.n_words == 12 and not torch.equal(own.rule_prob, expected.rule_prob)
    made = make_language("pcfg", preset="micro", seed=seed, params="n_words=10,emit_prob=0.3,max_len=6")
    assert made.max_len == 6 and torch.equal(made.grammar.rule_prob, expected.rule_prob)


def test_pcfg_max_len_zero_is_refused_not_read_as_unset():
    with pytest.raises(UserError, match="max_len must be >= 1, got 0"):
        PCFG.preset("micro", params="max_len=0")


def test_unknown_keys_and_languages_without_params_are_refused():
    with pytest.raises(UserError) as exc:
        make_language("pcfg", preset="micro", params="n_states=4")
    assert "the pcfg language takes no 'n_states'; it takes n_words, n_roots" in str(exc.value)
    assert "max_len" in str(exc.value)
    with pytest.raises(UserError, match="language.params applies to the hmm, pcfg languages only"):
        make_language("dyck", preset="tiny", params="length=4")
    with pytest.raises(UserError, match="language.params changes the random grammar .* give one or the other"):
        make_language("pcfg", preset="micro", grammar="g.txt", params="n_words=10")


# ---- the config ----------------------------------------------------------------------------
def test_a_config_with_params_round_trips_and_builds_that_language(tmp_path):
    overrides = ["language.name=hmm", "language.size=micro", "language.seed=2",
                 "language.params=n_states=5,concentration=0.7", "steps=12"]
    cfg = configlib.load(PretrainConfig, None, overrides)
    assert cfg.language.params == "n_states=5,concentration=0.7"
    path = tmp_path / "config.toml"
    path.write_text(configlib.to_toml(cfg))
    assert 'params = "n_states=5,concentration=0.7"' in path.read_text()
    back = configlib.load(PretrainConfig, path)
    assert back == cfg
    assert config_differences(read_config_dict(path), configlib.to_dict(cfg)) == []
    other = configlib.load(PretrainConfig, None, overrides[:-2] + ["language.params=n_states=6", "steps=12"])
    assert config_differences(read_config_dict(path), configlib.to_dict(other)) == ["language.params"]
    language = build_language(back)
    expected = HMM.random(**{**hmm_module.PRESETS["micro"], "seed": 2, "n_states": 5, "concentration": 0.7})
    assert torch.equal(language.transition, expected.transition)
    assert torch.equal(language.emission, expected.emission)


def test_a_config_saved_before_params_loads_equal_with_the_same_repr(tmp_path):
    cfg = configlib.load(PretrainConfig, None, ["language.name=hmm", "language.size=micro", "steps=12"])
    text = configlib.to_toml(cfg)
    assert "# params = None (unset)" in text
    old = tmp_path / "config.toml"
    old.write_text(text.replace("# params = None (unset)\n", ""))
    assert "params" not in old.read_text()
    assert configlib.load(PretrainConfig, old) == cfg and cfg.language.params is None
    assert config_differences(read_config_dict(old), configlib.to_dict(cfg)) == []
    # the repr (part of cached measurements' keys) is the one before language.params existed
    assert repr(LanguageConfig()) == ("LanguageConfig(name='pcfg', size='tiny', seed=None, grammar=None, "
                                      "generator=None, k=None, length=None, pool=None, data=None)")
    shown = repr(LanguageConfig(name="hmm", params="n_states=5"))
    assert "seed=None, params='n_states=5', grammar=None" in shown


@pytest.mark.parametrize("value, message", [
    ('""', "language.params is empty"), ("n_states", "'n_states' is not key=value"),
    ("n_states=6,n_states=7", "n_states is given twice"), ("6", "expected str"),
])
def test_bad_params_syntax_is_refused_when_the_config_loads(value, message):
    with pytest.raises(UserError, match=message):
        configlib.load(PretrainConfig, None, ["language.name=hmm", f"language.params={value}"])


def test_pretrain_refuses_an_unknown_key_in_one_line(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["pretrain", "name=r", "--out", str(out), "language.name=hmm", "language.size=micro",
                 "language.params=n_hidden=3", "steps=2", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "takes no 'n_hidden'; it takes n_states" in err[0]


# ---- language describe ---------------------------------------------------------------------
def test_describe_takes_params(capsys):
    args = ["language", "describe", "hmm", "--size", "micro", "--n-sentences", "64", "--json"]
    assert main(args + ["--params", "n_states=6,n_words=5"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["n_words"] == 5 and summary["source"] == "size micro, params n_states=6,n_words=5"
    assert main(args + ["--params", "n_hidden=3"]) == 2
    assert "takes no 'n_hidden'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(args + ["--params", "n_states"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "argument --params: 'n_states' is not key=value" in err[0]


def test_an_exported_model_card_names_the_params():
    from pathlib import Path

    from sameloss.hf.export import model_card
    from sameloss.training.runio import init_model

    cfg = configlib.load(PretrainConfig, None, ["language.name=hmm", "language.size=micro", "language.seed=1",
                                                "language.params=n_states=5", "model.size=micro"])
    language = build_language(cfg)
    card = model_card(init_model(cfg, language), language, cfg, {"step": 1}, Path("ckpt"),
                      {"entropy": 1.0, "kl": 0.1, "loss": 1.1}, None)
    assert "`hmm` (size micro, seed 1, params n_states=5)" in card
