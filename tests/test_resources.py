"""Work that cannot fit in memory is refused before anything is allocated, in one line
naming the estimate and the limit (issue 20, item 9)."""

from __future__ import annotations

import pytest
import torch

from sameloss import config as configlib
from sameloss.cli import main
from sameloss.languages import make_language
from sameloss.training import PretrainConfig, runio

TINY = ["model.size=micro", "language.name=hmm", "language.size=micro", "device=cpu", "--no-progress"]


def refusal(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("sameloss: error: "), err
    assert "needs at least" in err[0] and "over the limit of" in err[0], err
    return err[0]


@pytest.mark.parametrize("override, names", [
    ("model.d_model=100000", "training 'r'"), ("eval.n_sentences=100000000", "eval.n_sentences=100000000"),
    ("batch_size=100000000", "batch 100000000"),
])
def test_a_pretrain_that_cannot_fit_is_refused_and_writes_nothing(tmp_path, capsys, override, names):
    out = tmp_path / "runs"
    assert main(["pretrain", "name=r", "--out", str(out), *TINY, override]) == 2
    assert names in refusal(capsys)
    assert list(tmp_path.iterdir()) == []  # no run folder, no empty runs/


@pytest.mark.parametrize("args, names", [
    (["--trace", "fisher", "--contexts", "100000000"], "--contexts 100000000"),
    (["--probe", "task-5", "--task-size", "100000000"], "--task-size 100000000"),
    (["--finetune", "task-5", "--task-size", "100000000"], "--task-size 100000000"),
    (["--loss", "--probe", "task-5", "--task-size", "100000000"], "--task-size 100000000"),  # before the loss
])
def test_a_measure_that_cannot_fit_is_refused_before_measuring(checkpoint, tmp_path, capsys, args, names):
    table = tmp_path / "rows.csv"
    assert main(["measure", str(checkpoint), *args, "--out", str(table), "--no-progress"]) == 2
    assert names in refusal(capsys) and capsys.readouterr().out == ""
    assert not table.exists()


def test_describe_of_too_many_sentences_is_refused(capsys):
    assert main(["language", "describe", "hmm", "--size", "micro", "--n-sentences", "100000000"]) == 2
    assert "--n-sentences 100000000" in refusal(capsys)


def test_the_limit_can_be_stated_and_work_that_fits_runs(tmp_path, capsys, monkeypatch):
    from sameloss import resources

    monkeypatch.setenv(resources.LIMIT_ENV, "100000")  # 100 kB: a micro model's optimiser alone is more
    assert main(["pretrain", "name=r", "--out", str(tmp_path), *TINY, "steps=1"]) == 2
    assert f"${resources.LIMIT_ENV}" in refusal(capsys)
    monkeypatch.setenv(resources.LIMIT_ENV, "lots")
    assert main(["pretrain", "name=r", "--out", str(tmp_path), *TINY, "steps=1"]) == 2
    assert "is not a number of bytes" in capsys.readouterr().err
    monkeypatch.delenv(resources.LIMIT_ENV)
    assert main(["pretrain", "name=r", "--out", str(tmp_path), *TINY, "steps=1", "eval.n_sentences=8"]) == 0


def test_the_training_estimate_counts_the_weights_optimiser_and_activations_without_allocating():
    cfg = configlib.load(PretrainConfig, None, ["model.size=micro", "language.name=hmm", "language.size=micro",
                                                "batch_size=4"])
    language = make_language("hmm", preset="micro")
    state = torch.get_rng_state()
    model = runio.meta_model(cfg, language)
    assert torch.equal(torch.get_rng_state(), state)  # no draw from the run's RNG stream
    assert all(p.device.type == "meta" for p in model.parameters())
    n = sum(p.numel() for p in model.parameters())
    estimate = runio.training_bytes(cfg, language, model)
    assert estimate >= 4 * 4 * n  # weights, gradients, AdamW's two moments in float32
    sam = configlib.load(PretrainConfig, None, ["model.size=micro", "language.name=hmm", "language.size=micro",
                                                "batch_size=4", "sam.rho=0.05", "model.dropout=0"])
    assert runio.training_bytes(sam, language, model) == estimate + 4 * n  # SAM's ascent copy
