"""``sameloss reproduce text --scale smoke``: end to end on files the recipe writes itself."""

from __future__ import annotations

import csv

from helpers.figures import check_report_figures

from sameloss.cli import main
from sameloss.experiments.recipes import text


def test_text_recipe_smoke_end_to_end(tmp_path, capsys):
    assert main(["reproduce", "text", "--scale", "smoke", "--out", str(tmp_path), "--no-progress"]) == 0
    root = tmp_path / "text-smoke"
    report = (root / "report.md").read_text()
    assert "Real text: algorithms" in report and "no KL on real text" in report
    assert check_report_figures(root) == 1  # text-algorithms.png: a dot per algorithm, never a bar
    # the pair task (label "pairs", GLUE format rte) is shown under its label, with numbers
    table = report.split("**Real text: algorithms**")[1].split("###")[0].split("![")[0]  # (the figure follows)
    assert "fine-tune pairs (%)" in table and "–" not in table
    with open(root / "results.csv") as f:
        rows = {r["group"]: r for r in csv.DictReader(f)}
    assert set(rows) == {"adamw", "noreg", "sam"}
    for r in rows.values():
        assert float(r["loss"]) > 0 and float(r["trace_fisher"]) > 0
        assert 0 <= float(r["finetune_sst2"]) <= 1 and 0 <= float(r["finetune_rte"]) <= 1
        assert r["kl"] == "" and r["kl_note"] == "not defined for a corpus"
        assert abs(float(r["gap"]) - (float(r["loss"]) - float(r["train_loss"]))) < 1e-9
    # the three algorithms differ only in dropout, weight decay and SAM
    configs = {g: (root / "runs" / rows[g]["run"] / "config.toml").read_text() for g in rows}
    assert "rho = 0.05" in configs["sam"] and "rho = 0.0\n" in configs["noreg"]
    assert "dropout = 0.1" in configs["adamw"] and "dropout = 0.0" in configs["noreg"]
    assert 'mask_replace = "bert"' in configs["adamw"]
    # a second call reuses everything
    capsys.readouterr()
    assert main(["reproduce", "text", "--scale", "smoke", "--out", str(tmp_path), "--no-progress"]) == 0
    assert "3 runs (3 reused" in (root / "report.md").read_text()


def test_text_presets_are_typed():
    p = text.PRESETS["tiny"]
    assert p.corpus.sources == ("kjv", "austen") and {t.source for t in p.tasks} == {"rt-sst2", "wordnet"}
    assert text.PRESETS["paper"].pretrain.shape.size == "t3-1024" and text.PRESETS["small"].corpus.max_len == 128
