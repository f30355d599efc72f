"""Helpers of the experiment machinery: config comparison, table cells, row merging."""

from __future__ import annotations

import pytest

from sameloss.experiments.core import config_differences
from sameloss.experiments.report import Column, Table, merge_rows


def test_config_differences_treats_missing_as_none_and_lists_as_tuples():
    saved = {"steps": 10, "checkpoints": [1, 2], "optim": {"lr": 0.001}}
    wanted = {"steps": 10, "checkpoints": (1, 2), "optim": {"lr": 0.001, "warmup_fraction": None}}
    assert config_differences(saved, wanted) == []
    wanted["optim"]["lr"] = 0.002
    wanted["steps"] = 12
    assert config_differences(saved, wanted) == ["optim.lr", "steps"]


def test_column_cells():
    row = {"acc": 0.9531, "acc_std": 0.0042, "n": 3.0, "t": 12.3456, "t_lo": 10.0, "t_hi": 14.5, "s": "ok",
           "missing": None, "nan": float("nan")}
    assert Column("acc", "acc", "acc_std", scale=100, fmt=".1f").cell(row) == "95.3 ± 0.4"
    assert Column("t", "t", ci=("t_lo", "t_hi"), fmt=".3g").cell(row) == "12.3 [10, 14.5]"
    assert Column("t", "t", "acc_std").cell(row) == "12.35 ± 0.0042"
    assert Column("n", "n", fmt="d").cell(row) == "3"
    assert Column("s", "s", text=True).cell(row) == "ok"
    assert Column("m", "missing").cell(row) == "–" and Column("m", "nan").cell(row) == "–"
    spec = Column("acc", "acc", "acc_std", scale=100).spec()
    assert spec == "acc±acc_std*100"
    md = Table("T", [Column("acc", "acc", "acc_std", scale=100, fmt=".1f")], [dict(row, model="m1")]).markdown()
    assert "<!-- table source=results.csv key=model columns=acc±acc_std*100 -->" in md
    assert "| m1 | 95.3 ± 0.4 |" in md


def test_merge_rows_joins_experiments():
    rows = [{"model": "a", "experiment": "steps", "x": 1, "y": None},
            {"model": "b", "experiment": "sizes", "x": 2},
            {"model": "a", "experiment": "sizes", "y": 5, "size": "d64"}]
    merged = merge_rows(rows)
    assert [r["model"] for r in merged] == ["a", "b"]
    assert merged[0] == {"model": "a", "experiment": "steps+sizes", "x": 1, "y": 5, "size": "d64"}


@pytest.mark.parametrize("scale", ["smoke", "tiny", "small", "paper"])
def test_every_run_of_every_preset_is_a_valid_config(scale):
    """The GPU presets cannot be run here: at least every run's config must load, every
    measured checkpoint must be kept, and a run shared by two recipes must be defined
    the same way in both."""
    from sameloss.experiments.common import measure_spec
    from sameloss.experiments.recipes import algorithms, sizes, steps
    from sameloss.models.sizes import TRANSFORMER_SIZES

    seen = {}
    for language in ("pcfg", "hmm"):
        specs = [spec for recipe in (steps, sizes, algorithms) for spec in recipe.runs(recipe.PRESETS[scale],
                                                                                      language, 0)]
        for spec in specs:
            cfg = spec.config()
            assert cfg.name == spec.name and cfg.language.name == language
            assert set(spec.measure_steps) <= set(cfg.checkpoint_steps())
            if spec.name in seen:
                assert seen[spec.name] == spec.overrides, spec.name
            seen[spec.name] = spec.overrides
        for recipe in (steps, sizes, algorithms):
            p = recipe.PRESETS[scale]
            measure_spec(p, p.tasks[language])
    assert sizes.PRESETS[scale].embed_into in TRANSFORMER_SIZES
