"""``reproduce steps`` / ``sizes`` with the causal language (the paper's OPT panels) at smoke."""

from __future__ import annotations

import csv
import shutil

import pytest
from experiments.test_reproduce import check_tables, run_cli
from helpers.figures import check_report_figures

from sameloss.errors import UserError
from sameloss.experiments import Job, Options, reproduce
from sameloss.experiments.presets.causal import CAUSAL, GENERATOR_ENV
from sameloss.experiments.recipes import figure1, sizes, steps
from sameloss.languages.lm_generated import CausalLM
from sameloss.measures.glue import glue_task_data

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")


def _rows(root):
    with (root / "results.csv").open(newline="") as f:
        return {r["model"]: r for r in csv.DictReader(f)}


@pytest.mark.parametrize("experiment", ["sizes", "steps"])
def test_smoke_runs_the_causal_language_end_to_end(experiment, tmp_path, monkeypatch):
    monkeypatch.setenv("SAMELOSS_DATA", str(tmp_path / "cache"))
    run_cli([experiment, "--scale", "smoke", "--out", str(tmp_path), "--no-progress"])
    root = tmp_path / f"{experiment}-smoke"
    report = (root / "report.md").read_text()
    c = CAUSAL["smoke"]
    assert f"causal (K={c.k}, T={c.length}, random generator)" in report
    assert (root / f"{experiment}-causal.png").stat().st_size > 1000
    check_report_figures(root)
    rows = {m: r for m, r in _rows(root).items() if r["language"] == "causal"}
    assert rows and any(m.startswith("pcfg-") for m in _rows(root))  # the other languages still run
    for r in rows.values():
        assert float(r["kl"]) > 0 and float(r["trace_fisher"]) > 0 and 0 <= float(r["probe_sst2"]) <= 1
    (built,) = (tmp_path / "cache" / "causal").iterdir()  # in the data cache, not the experiment folder
    generator = built / "generator"
    for name in rows:
        cfg = (root / "runs" / name.split("@")[0] / "config.toml").read_text()
        assert 'masking = "single"' in cfg and f'generator = "{generator.resolve()}"' in cfg
        assert f"k = {c.k}" in cfg and f"length = {c.length}" in cfg
    assert check_tables(root) > 10
    # the stand-in task round-trips through the generator's tokenizer: nothing dropped
    lm = CausalLM.from_pretrained(generator, k=c.k, length=c.length)
    task = built / "sst2-standin-seed0"
    data = glue_task_data(lm, f"glue:sst2={task}")
    assert data.kept_fraction == 1.0 and len(data.test) > 0
    # a second call reuses the generator, the runs and the rows
    stamp = (generator / "model.safetensors").stat().st_mtime_ns
    reproduce(Job(experiment, "smoke", out=tmp_path), Options(progress=False))
    assert (generator / "model.safetensors").stat().st_mtime_ns == stamp
    with (root / "runs.csv").open(newline="") as f:
        assert {r["status"] for r in csv.DictReader(f)} == {"reused"}
    # a copied experiment folder still names a generator that exists: its runs are reused
    shutil.copytree(root, tmp_path / "copy" / root.name)
    reproduce(Job(experiment, "smoke", out=tmp_path / "copy"), Options(progress=False))
    with (tmp_path / "copy" / root.name / "runs.csv").open(newline="") as f:
        assert {r["status"] for r in csv.DictReader(f)} == {"reused"}


def test_figure1_and_other_callers_leave_the_causal_language_out():
    for p in figure1.PRESETS.values():
        assert p.sizes.causal is not None  # it is there, and figure1's report passes its own languages
    from sameloss.experiments.presets.common import causal_part

    assert causal_part(None, sizes.PRESETS["smoke"], ("pcfg",)) is None


def test_gpu_scales_use_the_papers_k_and_t_and_need_a_generator(tmp_path, monkeypatch, capsys):
    for recipe in (sizes, steps):
        for scale in ("small", "paper"):
            c = recipe.PRESETS[scale].causal
            assert (c.generator, c.k, c.length) == ("path", 2000, 24)
    monkeypatch.delenv(GENERATOR_ENV, raising=False)
    from sameloss.cli import main

    # refused before anything trains: the causal language is prepared first
    assert main(["reproduce", "sizes", "--scale", "small", "--out", str(tmp_path), "--no-progress",
                 "--device", "cpu"]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("sameloss: error:")]
    assert len(errors) == 1 and GENERATOR_ENV in errors[0]
    assert not (tmp_path / "sizes-small" / "runs").exists()
    from sameloss.experiments.presets.causal import prepare_causal

    monkeypatch.setenv("SAMELOSS_DATA", str(tmp_path / "cache"))

    class _Study:
        root = tmp_path / "x"
        seed = 0

        def log(self, msg):
            pass

    with pytest.raises(UserError, match=GENERATOR_ENV):
        prepare_causal(_Study(), CAUSAL["small"])
    monkeypatch.setenv(GENERATOR_ENV, str(tmp_path / "missing"))
    with pytest.raises(UserError, match="not a Hugging Face model folder"):
        prepare_causal(_Study(), CAUSAL["small"])
