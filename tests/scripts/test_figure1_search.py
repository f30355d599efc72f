"""scripts/figure1_search.py: its runs are valid configs that vary what they say they vary."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "figure1_search.py"


@pytest.fixture(scope="module")
def search():
    spec = importlib.util.spec_from_file_location("figure1_search", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("language", ["pcfg", "hmm"])
def test_runs_load_and_differ_only_as_named(search, language):
    setting = search.SETTINGS[language]
    configs = {spec.name: spec.config() for spec in search.runs(setting)}
    assert len(configs) == sum(len(seeds) for _, _, seeds in setting["variants"])
    for name, cfg in configs.items():
        assert cfg.language.name == language and cfg.steps == setting["steps"]
        assert cfg.optim.decay_steps == setting["decay"]
        assert tuple(cfg.checkpoints) == setting["measure"]
        assert cfg.seed == int(name.rsplit("seed", 1)[1])
    assert configs["adamw-seed0"].model.dropout == 0.1 and configs["adamw-seed0"].optim.weight_decay == 0.01
    assert configs["noreg-seed0"].model.dropout == 0.0 and configs["noreg-seed0"].optim.weight_decay == 0.0
    assert configs["sam-seed0"].sam.rho == 0.05 and configs["adamw-seed0"].sam.rho == 0.0
    assert configs["d32-seed0"].model.d_model == 32
