"""Helpers of the experiment machinery: config comparison, table cells, row merging."""

from __future__ import annotations

import pytest

from sameloss.training.runfolder import config_differences
from sameloss.experiments.reports.document import Column, Table, merge_rows


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
    from sameloss.experiments.presets.common import measure_spec
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


def test_presets_are_checked_when_built():
    """A misspelt field or an unknown size fails when the preset is built (at import),
    not after training."""
    from sameloss.experiments.presets.common import COMMON, ReferenceRun, Shape
    from sameloss.experiments.recipes.steps import SGDRun, StepsPreset

    sgd = SGDRun(lr=0.05, steps=24, checkpoints=(12, 24))
    with pytest.raises(TypeError, match="main_tsk"):
        StepsPreset(**COMMON["smoke"].common(), use=("pcfg",), main_tsk={"pcfg": "B"}, sgd=sgd)
    with pytest.raises(ValueError, match="main task 'C'"):
        StepsPreset(**COMMON["smoke"].common(), use=("pcfg",), main_task={"pcfg": "C"}, sgd=sgd)
    with pytest.raises(ValueError, match="unknown model size 'tinyy'"):
        Shape("tinyy")
    with pytest.raises(ValueError, match="checkpoints"):
        ReferenceRun(Shape("micro"), label="micro", steps=24, checkpoints=(8, 30))


def test_run_spec_writes_overrides_and_refuses_unknown_keys():
    from sameloss.experiments.engine.runspec import RunSpec

    spec = RunSpec("r", (("language.size", "micro"), ("checkpoints", (8, 12)), ("optim.lr", 0.05),
                         ("sam.adaptive", True), ("steps", 12)))
    assert spec.overrides == ("language.size=micro", "checkpoints=[8,12]", "optim.lr=0.05", "sam.adaptive=true",
                              "steps=12")
    cfg = spec.config()
    assert (cfg.language.size, cfg.checkpoints, cfg.optim.lr, cfg.sam.adaptive) == ("micro", (8, 12), 0.05, True)
    with pytest.raises(ValueError, match="'optim.lrr' is not a config key"):
        RunSpec("r", (("optim.lrr", 0.05),))


def test_a_config_saved_with_language_preset_still_loads_and_matches(tmp_path):
    """``language.preset`` is the old name of ``language.size``: a run saved with it loads,
    and compares equal to the same config today (so it is reused or resumed)."""
    from sameloss import config as configlib
    from sameloss.errors import UserError
    from sameloss.training.config import PretrainConfig
    from sameloss.training.runio import read_config_dict

    cfg = configlib.load(PretrainConfig, None, ["language.size=micro", "steps=12"])
    old = tmp_path / "config.toml"
    old.write_text(configlib.to_toml(cfg).replace('size = "micro"', 'preset = "micro"'))
    assert 'preset = "micro"' in old.read_text()
    assert configlib.load(PretrainConfig, old) == cfg
    assert config_differences(read_config_dict(old), configlib.to_dict(cfg)) == []
    assert configlib.load(PretrainConfig, None, ["language.preset=micro"]).language.size == "micro"
    with pytest.raises(UserError, match="given twice"):
        configlib.load(PretrainConfig, None, ["language.preset=micro", "language.size=tiny"])


def test_study_lookup_table_is_the_measures_look_up_table_with_the_runs_eval_seed(tmp_path):
    """The look-up table's loss is the entropy on the run's own held-out set (its
    ``eval.seed``), with the probe columns of ``measure_lookup_table``."""
    from sameloss import config as configlib
    from sameloss.experiments.engine.core import Study, StudySettings
    from sameloss.languages import make_language
    from sameloss.measures.run import MeasureSpec
    from sameloss.training.config import PretrainConfig
    from sameloss.training.evaluate import ExactEvaluator

    spec = MeasureSpec(loss=True, lookup=("B",), loss_sentences=40, task_train=48, task_validation=16,
                       task_test=32, probe_method="adamw", probe_epochs=1, seeds=(0,))
    language = make_language("pcfg", preset="micro")
    rows = {}
    for eval_seed in (7, 8):
        cfg = configlib.load(PretrainConfig, None, ["language.name=pcfg", "language.size=micro",
                                                    f"eval.seed={eval_seed}"])
        rows[eval_seed] = Study(tmp_path / "study", StudySettings(progress=False, device="cpu")).reference("lookup-table", cfg, spec)
        entropy = ExactEvaluator(language, 40, cfg.mask_rate, eval_seed, cfg.eval.n_subsets).entropy
        assert rows[eval_seed]["loss"] == pytest.approx(float(entropy.mean()), rel=1e-12)
        assert rows[eval_seed]["kl"] == 0.0 and 0.0 <= rows[eval_seed]["lookup_B"] <= 1.0
    assert rows[7]["loss"] != rows[8]["loss"]


def test_error_column_and_standard_errors():
    from sameloss.experiments.reports.claims import error_column, quantity_se

    assert [error_column(k) for k in ("trace_fisher", "trace_embedded", "probe_B", "lookup_B", "loss")] == \
        ["trace_fisher_se", "trace_embedded_se", "probe_B_std", "lookup_B_std", "loss_std"]
    row = {"trace_fisher_se": 0.5, "probe_B_std": 0.4, "lookup_B_std": 0.4, "kl_std": 0.5}
    assert quantity_se(row, "trace_fisher") == 0.5
    assert quantity_se(row, "probe_B", n_seeds=4) == pytest.approx(0.2)
    assert quantity_se(row, "lookup_B", n_seeds=4) == pytest.approx(0.2)
    assert quantity_se(row, "kl", n_subsets=25) == pytest.approx(0.1)


def test_a_key_missing_from_a_saved_config_means_its_default(tmp_path):
    # a run saved before a key existed (here mask_replace, default "mask") is the same run
    from sameloss import config as configlib
    from sameloss.training.config import PretrainConfig
    from sameloss.training.runio import read_config_dict

    def saved_without_mask_replace(cfg):
        path = tmp_path / "config.toml"
        path.write_text("".join(line + "\n" for line in configlib.to_toml(cfg).splitlines()
                                if not line.startswith("mask_replace")))
        return read_config_dict(path)

    wanted = configlib.to_dict(PretrainConfig(steps=10))
    assert config_differences(saved_without_mask_replace(PretrainConfig(steps=10)), wanted) == []
    assert config_differences(saved_without_mask_replace(PretrainConfig(steps=12)), wanted) == ["steps"]
    # a saved value that differs from the default is still a difference
    assert config_differences(configlib.to_dict(PretrainConfig(steps=10, mask_replace="bert")), wanted) == \
        ["mask_replace"]


def test_every_measured_row_goes_through_one_cache(tmp_path, monkeypatch):
    """``Study.measure`` and ``Study.reference`` (and ``lookup``) store their rows in
    ``measurements.json`` by one key routine: a second study on the folder measures nothing."""
    from sameloss import config as configlib
    from sameloss.experiments.engine.core import Study, StudySettings
    from sameloss.measures import run as measures_run
    from sameloss.measures.fewshot import FewShot, View
    from sameloss.measures.run import MeasureSpec
    from sameloss.training import pretrain
    from sameloss.training.checkpoint import checkpoint_dir
    from sameloss.training.config import PretrainConfig

    cfg = configlib.load(PretrainConfig, None, ["language.name=hmm", "language.size=micro", "model.size=micro",
                                                "steps=4", "batch_size=8", "eval.n_sentences=16", "device=cpu"])
    pretrain(cfg, tmp_path / "run", progress=False)
    design = FewShot("task-5", (("pos", View((4,))),), sizes=(4,), subsets=(2,), pool=12, test=20,
                     endpoints=(("pos", "lbfgs"),))
    spec = MeasureSpec(loss=True, loss_sentences=16, fewshot=design)
    loads = []
    real_load = measures_run.load_checkpoint
    monkeypatch.setattr(measures_run, "load_checkpoint", lambda *a, **k: loads.append(a[0]) or real_load(*a, **k))
    first = Study(tmp_path / "study", StudySettings(progress=False, device="cpu"))
    rows = [first.measure(checkpoint_dir(tmp_path / "run", 4), spec), first.reference("oracle", cfg, spec),
            first.reference("random-init", cfg, spec)]
    assert first.counts["measured"] == 3
    assert len(loads) == 1  # the loss and the few-shot probes of the checkpoint: one load
    assert {"loss", "kl", "pos_lbfgs_n4"} <= set(rows[0])

    def fail(*args, **kwargs):
        raise AssertionError("measured again")
    monkeypatch.setattr(measures_run, "measure_checkpoint", fail)
    monkeypatch.setattr(measures_run, "measure_reference", fail)
    again = Study(tmp_path / "study", StudySettings(progress=False, device="cpu"))
    assert [again.measure(checkpoint_dir(tmp_path / "run", 4), spec), again.reference("oracle", cfg, spec),
            again.reference("random-init", cfg, spec)] == rows
    assert again.counts == {"measured": 0, "cached": 3, "earlier": 3}
    # another initial model is another random-init encoder
    other = configlib.load(PretrainConfig, None, ["language.name=hmm", "language.size=micro", "model.size=micro",
                                                  "seed=1", "device=cpu"])
    with pytest.raises(AssertionError, match="measured again"):
        again.reference("random-init", other, spec)
