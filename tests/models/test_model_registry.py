"""Model kinds are registered objects (issue 37): a kind added in this test alone is
accepted by the config, built by ``build_model`` and ``init_model``, counted by the planner
and bounded by the memory check — nothing names a kind in an if-chain."""

from __future__ import annotations

import dataclasses
import types

import pytest

from sameloss import config as configlib
from sameloss import registry, resources
from sameloss.errors import UserError
from sameloss.experiments.engine import plan as planner
from sameloss.languages import make_language
from sameloss.models import LSTMConfig, LSTMMLM, build_model, kind_of_config
from sameloss.models.kind import ModelKind
from sameloss.training.config import PretrainConfig
from sameloss.training import runio
from sameloss.training.runio import init_model


@dataclasses.dataclass(frozen=True)
class WideConfig(LSTMConfig):
    """A throw-away architecture: an LSTM under another name and config class."""


class WideMLM(LSTMMLM):
    pass


def _module() -> types.ModuleType:
    module = types.ModuleType("toy_models")
    module.KIND = ModelKind("wide", WideConfig, WideMLM, {"one": {"d_model": 8, "d_hidden": 8, "n_layers": 1}}, {},
                            flops_per_token=lambda m: 1000.0, activations_per_token=lambda c, t: 7)
    return module


def test_a_kind_registered_in_a_test_is_configured_built_planned_and_checked():
    with registry.MODELS.added(registry.ModelEntry("wide", _module())):
        cfg = configlib.load(PretrainConfig, None, ["model.kind=wide", "model.size=one", "language.name=hmm",
                                                    "language.size=micro", "batch_size=4"])
        language = make_language("hmm", preset="micro")
        model = init_model(cfg, language)
        assert type(model) is WideMLM and kind_of_config(model.config).name == "wide"
        assert type(build_model("wide", "one", 10, 6)) is WideMLM
        shape = planner.model_shape(cfg, {})
        assert shape.kind == "wide" and planner.forward_flops_per_token(shape) == 1000.0
        meta = runio.meta_model(cfg, language)
        n = sum(p.numel() for p in meta.parameters())
        tokens = cfg.batch_size * language.max_len
        assert runio.training_bytes(cfg, language, meta) == \
            (4 * n + tokens * 7 + tokens * language.vocab_size * 2) * resources.FLOAT32
        with pytest.raises(UserError, match="unknown wide size 'two'; valid sizes: one"):
            build_model("wide", "two", 10, 6)
    with pytest.raises(UserError, match="model.kind must be one of lstm, transformer, got 'wide'"):
        configlib.load(PretrainConfig, None, ["model.kind=wide"])
    with pytest.raises(UserError, match="unknown model kind 'wide'; choose from lstm, transformer"):
        build_model("wide", "one", 10, 6)
