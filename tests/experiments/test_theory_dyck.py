"""``sameloss reproduce theory`` / ``dyck`` at ``--scale smoke`` end to end, the LSTM rows
of ``sizes``, and the pieces of the theory recipe that can be checked exactly."""

from __future__ import annotations

import csv
import json
import re

import pytest
from experiments.test_reproduce import check_tables, run_cli
from helpers.figures import check_report_figures

from sameloss.experiments.recipes import dyck, sizes, theory
from sameloss.experiments.stats.inference import AGREES, AGREES_WEAKLY, DISAGREES, DISAGREES_WEAKLY, UNDEFINED

VERDICTS = {AGREES, AGREES_WEAKLY, DISAGREES, DISAGREES_WEAKLY, UNDEFINED}


def read(path):
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def common_checks(root, headings, figures):
    report = (root / "report.md").read_text()
    for heading in headings:
        assert heading in report, heading
    found = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", report)
    assert set(figures) <= set(found)
    assert check_report_figures(root) == len(found)
    claims = re.findall(r"\*\*Direction:\*\* ([^.]+)\.", report)
    assert claims and set(claims) <= VERDICTS
    assert check_tables(root) > 30
    return report


def test_theory_smoke_end_to_end(tmp_path):
    run_cli(["theory", "--scale", "smoke", "--out", str(tmp_path), "--no-progress"])
    root = tmp_path / "theory-smoke"
    report = common_checks(root, ["## The theory at work", "Lemma 3.2 along one run", "plain-SGD continuations",
                                  "slope of the trace", "### Claims of the paper, checked", "well-specified"],
                           ["theory-lemma-pcfg.png", "theory-sgd-pcfg.png"])
    p = theory.PRESETS["smoke"]
    lemma = read(root / "lemma.csv")
    assert [int(r["step"]) for r in lemma] == list(p.lemma.checkpoints)
    for r in lemma:
        f = {k: float(v) for k, v in r.items() if k.startswith(("trace_", "kl"))}
        assert f["kl"] > 0 and f["trace_fisher"] > 0
        # the Gauss–Newton matrix is positive semi-definite: each probe's vᵀGv = vᵀHv − vᵀ(H−G)v ≥ 0
        assert f["trace_hessian"] - f["trace_gap"] >= -1e-6 * abs(f["trace_hessian"])
        assert f["trace_hessian_model"] - f["trace_gap_model"] >= -1e-6 * abs(f["trace_hessian_model"])
        assert f["trace_hessian_cv"] == pytest.approx(f["trace_fisher"] + f["trace_gap"], rel=1e-12)
    sgd = read(root / "continuations.csv")
    assert len(sgd) == len(p.sgd.runs) * (len(p.sgd.checkpoints) + 1)
    for r in sgd:
        assert float(r["x"]) == pytest.approx(float(r["lr"]) * int(r["step"]) / int(r["batch_size"]))
    starts = {r["trace_fisher"] for r in sgd if r["step"] == "0"}
    assert len(starts) == 1  # every continuation starts from the same converged model
    # a continuation is a run forked from the converged checkpoint: plain SGD without dropout,
    # its own steps from 0 and fresh optimiser state
    c = p.sgd.runs[0]
    meta = json.loads((root / "runs" / c.name / "checkpoints" / "step_0000010" / "meta.json").read_text())
    cfg = meta["config"]
    assert (cfg["optim"]["name"], cfg["optim"]["lr"], cfg["optim"]["momentum"], cfg["model"]["dropout"],
            cfg["batch_size"]) == ("sgd", c.lr, 0.0, 0.0, c.batch_size)
    assert cfg["init_from"].endswith("step_0000030")
    assert (cfg["init_step"], cfg["init_optimizer"], cfg["seed"]) == ("restart", False, theory.CONTINUATION_SEED)
    assert "KL" in report and "Kendall τ" in report

    # a second call trains and measures nothing again
    run_cli(["theory", "--scale", "smoke", "--out", str(tmp_path), "--no-progress"])
    n = 1 + len(p.sgd.runs)
    assert f"{n} runs ({n} reused from an earlier call), 0 rows measured" in (root / "report.md").read_text()


def test_dyck_smoke_end_to_end(tmp_path):
    run_cli(["dyck", "--scale", "smoke", "--out", str(tmp_path), "--no-progress"])
    root = tmp_path / "dyck-smoke"
    report = common_checks(root, ["## Theorem 5.1", "dyck: solutions, flatness and few-shot transfer",
                                  "cheating", "### Claims of the paper, checked"], ["dyck-transfer.png"])
    p = dyck.PRESETS["smoke"]
    rows = read(root / "results.csv")
    assert len(rows) == len(p.solutions)
    for r in rows:
        assert float(r["trace_fisher"]) > 0
        for n in p.downstream.n_train:
            for pooling in ("mean", "first"):
                assert 0 <= float(r[f"down_acc_{pooling}_{n}"]) <= 1
                assert float(r[f"down_mse_{pooling}_{n}"]) >= 0
        # the sentences hold T/2 of each bracket; the task's strings are uniform: Var g* = T
        assert float(r["target_variance"]) == pytest.approx(8, rel=0.35)
    for run in (root / "runs").iterdir():
        cfg = (run / "config.toml").read_text()
        assert 'masking = "single"' in cfg and 'name = "dyck"' in cfg
    assert "1-layer m=8" in report


def test_sizes_smoke_trains_and_measures_the_lstm_family(tmp_path):
    run_cli(["sizes", "--scale", "smoke", "--out", str(tmp_path), "--no-progress"])
    root = tmp_path / "sizes-smoke"
    common_checks(root, ["bidirectional LSTMs"], ["sizes-pcfg-lstm.png"])
    rows = {r["model"]: r for r in read(root / "results.csv")}
    lstm = [r for name, r in rows.items() if "-lstm-" in name]
    assert len(lstm) == len(sizes.PRESETS["smoke"].lstms)
    for r in lstm:
        assert float(r["trace_fisher"]) > 0 and r["probe_B"] != ""
    cfg = (root / "runs" / "pcfg-lstm-h8-adamw" / "config.toml").read_text()
    assert 'kind = "lstm"' in cfg


def test_figure1_keeps_the_transformers_only():
    from sameloss.experiments.recipes import figure1

    for p in figure1.PRESETS.values():
        assert p.sizes.lstms == ()
    assert sizes.PRESETS["tiny"].lstms and sizes.PRESETS["paper"].lstm_use == ("hmm",)


def test_presets_are_checked():
    with pytest.raises(ValueError, match="at least 2 batches"):
        theory.LemmaSettings(steps=10, checkpoints=(10,), kl_sentences=8, fisher_contexts=8, fisher_labels=1,
                             hessian_batches=1, hessian_sentences=8, hessian_probes=1)
    with pytest.raises(ValueError, match="draws"):
        dyck.downstream((8, 64), draws=4, pool=32, n_test=8)
    with pytest.raises(ValueError, match="unknown LSTM size"):
        sizes.LSTMRun("x", "h3-l1", steps=1)
