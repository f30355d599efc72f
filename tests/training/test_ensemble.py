"""Ensembles (``training.ensemble``): each member's run folder equals its one-model run's —
weights at every checkpoint, the KL curve, the log, the optimiser state — per kind of run:
within float32 rounding under the ``vmap`` strategy (batched matmuls sum in another order),
bit for bit under ``loop`` (member by member, each its run alone's computation); resuming is
bit for bit; a diverging member fails alone."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from sameloss import config as configlib
from sameloss.errors import UserError
from sameloss.training import PretrainConfig, pretrain
from sameloss.training.checkpoint import complete_checkpoints, load_state
from sameloss.training.ensemble import Failure, ensemble_key, groups, train_ensemble
from sameloss.training.runio import load_checkpoint

WEIGHT_ATOL = 2e-5  # float32: a dozen steps of batched vs one-model matmuls (measured ≤ 2e-7)
KL_RTOL = 1e-4
LOSS_RTOL = 1e-5
TIMING = {"tokens_per_s", "steps_per_s"}


def small(**overrides) -> PretrainConfig:
    base = ["steps=12", "batch_size=32", "model.size=micro", "eval.every=6", "eval.n_sentences=64", "save_every=4",
            "log_every=3", "optim.warmup_steps=3", "device=cpu", "model.dropout=0"]
    return configlib.load(PretrainConfig, None, base + [f"{k}={v}" for k, v in overrides.items()])


def _records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


STRATEGIES = pytest.mark.parametrize("strategy", ["vmap", "loop"])


def _close(a, b, rtol: float, what: str) -> float:
    """The relative deviation of two numbers (asserted within ``rtol``)."""
    dev = abs(a - b) / max(abs(b), 1e-12)
    assert dev <= rtol, f"{what}: {a!r} vs {b!r}"
    return dev


def compare_runs(a: Path, b: Path, exact: bool = False) -> dict[str, float]:
    """Every file of run folder ``a`` against ``b`` (``b``: the one-model run): the largest
    weight deviation over every checkpoint, and the largest relative KL deviation
    (``exact``: every number the same)."""
    scale = 0.0 if exact else 1.0
    assert (a / "config.toml").read_text() == (b / "config.toml").read_text()
    ca, cb = complete_checkpoints(a), complete_checkpoints(b)
    assert [p.name for p in ca] == [p.name for p in cb]
    worst = {"weights": 0.0, "kl": 0.0, "loss": 0.0}
    for pa, pb in zip(ca, cb):
        wa, wb = load_checkpoint(pa).model.state_dict(), load_checkpoint(pb).model.state_dict()
        assert wa.keys() == wb.keys()
        dev = max((wa[k] - wb[k]).abs().max().item() for k in wa)
        assert dev <= WEIGHT_ATOL * scale, f"{pa}: weights {dev}"
        worst["weights"] = max(worst["weights"], dev)
        sa, sb = load_state(pa), load_state(pb)
        assert sa["step"] == sb["step"] and torch.equal(sa["rng"], sb["rng"])
        assert sa["window"].keys() == sb["window"].keys() and sa["optimizer"].keys() == sb["optimizer"].keys()
        assert sa["schedule"]["last_epoch"] == sb["schedule"]["last_epoch"]
        ma, mb = (json.loads((p / "meta.json").read_text()) for p in (pa, pb))
        assert ma["config"] == mb["config"] and (ma["eval"] is None) == (mb["eval"] is None)
    ra, rb = _records(a), _records(b)
    assert [r["step"] for r in ra] == [r["step"] for r in rb]
    for x, y in zip(ra, rb):
        assert x.keys() == y.keys()
        for key in x.keys() - TIMING - {"step", "eval"}:
            rtol = (1e-3 if key == "grad_norm" else LOSS_RTOL) * scale
            worst["loss"] = max(worst["loss"], _close(x[key], y[key], rtol, f"{a.name} step {x['step']} {key}"))
        if "eval" in x:
            worst["kl"] = max(worst["kl"], _close(x["eval"]["kl"], y["eval"]["kl"], KL_RTOL * scale, f"{a.name} KL"))
    sa, sb = (json.loads((p / "summary.json").read_text()) for p in (a, b))
    assert sa.keys() == sb.keys() and sa["step"] == sb["step"] and sa["parameters"] == sb["parameters"]
    return worst


def ensemble_and_alone(tmp_path: Path, cfgs: list[PretrainConfig], strategy: str) -> dict[str, float]:
    """Train ``cfgs`` as one ensemble and each alone; every member compared (worst deviations)."""
    results = train_ensemble(cfgs, [tmp_path / "ens" / c.name for c in cfgs], progress=False, strategy=strategy)
    worst = {"weights": 0.0, "kl": 0.0, "loss": 0.0}
    exact = strategy == "loop"
    for cfg, got in zip(cfgs, results):
        alone = pretrain(cfg, tmp_path / "one" / cfg.name, progress=False)
        assert not isinstance(got, Failure), got
        _close(got["kl"], alone["kl"], 0.0 if exact else KL_RTOL, cfg.name)
        for k, v in compare_runs(tmp_path / "ens" / cfg.name, tmp_path / "one" / cfg.name, exact).items():
            worst[k] = max(worst[k], v)
    return worst


@STRATEGIES
def test_adamw_members_with_their_own_seeds_rates_decay_dropout_and_clipping(tmp_path, strategy):
    cfgs = [small(name="a", seed=0, dropout_draws="keyed", **{"model.dropout": 0.1}),
            small(name="b", seed=1, dropout_draws="keyed", **{"model.dropout": 0.0, "optim.lr": 3e-3,
                                                              "optim.grad_clip": 0.5}),
            small(name="c", seed=0, dropout_draws="keyed", **{"model.dropout": 0.2, "optim.weight_decay": 0.1,
                                                              "optim.warmup_steps": 6})]
    ensemble_and_alone(tmp_path, cfgs, strategy)


@STRATEGIES
def test_sgd_with_momentum(tmp_path, strategy):
    common = {"optim.name": "sgd", "optim.momentum": 0.9}
    cfgs = [small(name="a", seed=2, **common, **{"optim.lr": 0.05}),
            small(name="b", seed=3, **common, **{"optim.lr": 0.02, "optim.weight_decay": 0.0})]
    ensemble_and_alone(tmp_path, cfgs, strategy)


@STRATEGIES
def test_sam_each_member_its_own_radius_and_norm(tmp_path, strategy):
    cfgs = [small(name="a", seed=0, **{"sam.rho": 0.05}), small(name="b", seed=1, **{"sam.rho": 0.2})]
    ensemble_and_alone(tmp_path, cfgs, strategy)


@STRATEGIES
def test_adversarial_objective_per_member(tmp_path, strategy):
    adv = {"adversarial.task": "C", "adversarial.batch_size": 16, "adversarial.pool_size": 200}
    cfgs = [small(name="a", seed=0, **adv, **{"adversarial.weight": 0.05}),
            small(name="b", seed=1, **adv, **{"adversarial.weight": 0.2})]
    ensemble_and_alone(tmp_path, cfgs, strategy)


@STRATEGIES
def test_fisher_penalty_per_member(tmp_path, strategy):
    flat = {"flatness.sentences": 4}
    cfgs = [small(name="a", seed=0, **flat, **{"flatness.weight": 0.01}),
            small(name="b", seed=1, **flat, **{"flatness.weight": -0.01})]
    ensemble_and_alone(tmp_path, cfgs, strategy)


@STRATEGIES
def test_lstm(tmp_path, strategy):
    cfgs = [small(name="a", seed=0, **{"model.kind": "lstm"}), small(name="b", seed=1, **{"model.kind": "lstm"})]
    ensemble_and_alone(tmp_path, cfgs, strategy)


@STRATEGIES
def test_forks_of_the_embedded_larger_model(tmp_path, strategy):
    from sameloss.training.embed_io import embed_checkpoint

    base = small(name="base", steps=6, checkpoints="[6]")
    pretrain(base, tmp_path / "base", progress=False)
    large = embed_checkpoint(complete_checkpoints(tmp_path / "base")[-1], tmp_path / "embedded", width_factor=2,
                             optimizer="embedded")
    shape = {"model.d_model": 32, "model.n_heads": 4, "model.n_layers": 1, "model.d_inter": 64}
    cfgs = [small(name="a", init_from=str(large), **shape),
            small(name="b", init_from=str(large), dropout_draws="keyed", **shape,
                  **{"model.dropout": 0.1, "optim.weight_decay": 0.0})]
    ensemble_and_alone(tmp_path, cfgs, strategy)


@STRATEGIES
def test_members_join_at_their_first_step_and_leave_after_their_last(tmp_path, strategy):
    pretrain(small(name="base", checkpoints="[5]"), tmp_path / "base", progress=False)
    start = complete_checkpoints(tmp_path / "base")[0]
    assert start.name == "step_0000005"
    cfgs = [small(name="fork", steps=14, init_from=str(start), **{"optim.lr": 2e-3}),
            small(name="fresh", seed=4, steps=9),
            small(name="restart", steps=7, init_from=str(start), init_step="restart", init_optimizer="false")]
    ensemble_and_alone(tmp_path, cfgs, strategy)


@STRATEGIES
def test_a_killed_ensemble_resumes_bit_for_bit(tmp_path, strategy):
    cfgs = [small(name="a", seed=0, dropout_draws="keyed", **{"model.dropout": 0.1}),
            small(name="b", seed=1, dropout_draws="keyed", **{"model.dropout": 0.1, "optim.lr": 2e-3})]
    whole = train_ensemble(cfgs, [tmp_path / "whole" / c.name for c in cfgs], progress=False, strategy=strategy)
    cut = [tmp_path / "cut" / c.name for c in cfgs]
    train_ensemble(cfgs, cut, progress=False, stop_after=5, strategy=strategy)
    assert [p.name for p in complete_checkpoints(cut[0])][-1] == "step_0000005"
    again = train_ensemble(cfgs, cut, mode="resume", progress=False, strategy=strategy)
    assert whole == again
    for cfg in cfgs:
        a, b = tmp_path / "whole" / cfg.name, tmp_path / "cut" / cfg.name
        wa, wb = (load_checkpoint(complete_checkpoints(p)[-1]).model.state_dict() for p in (a, b))
        assert all(torch.equal(wa[k], wb[k]) for k in wa)
        strip = [{k: v for k, v in r.items() if k not in TIMING} for r in _records(a)]
        assert strip == [{k: v for k, v in r.items() if k not in TIMING} for r in _records(b)]


def test_a_run_cut_alone_resumes_in_an_ensemble_and_a_finished_one_is_reused(tmp_path):
    done, cut = small(name="done", seed=5), small(name="cut", seed=6)
    pretrain(done, tmp_path / "ens" / "done", progress=False)
    before = (tmp_path / "ens" / "done" / "summary.json").stat().st_mtime_ns
    pretrain(cut, tmp_path / "ens" / "cut", progress=False, stop_after=4)
    fresh = small(name="new", seed=7)
    got = train_ensemble([done, cut, fresh], [tmp_path / "ens" / c.name for c in (done, cut, fresh)],
                         progress=False)
    assert (tmp_path / "ens" / "done" / "summary.json").stat().st_mtime_ns == before
    for cfg, result in zip((done, cut, fresh), got):
        alone = pretrain(cfg, tmp_path / "one" / cfg.name, progress=False)
        _close(result["kl"], alone["kl"], KL_RTOL, cfg.name)
    compare_runs(tmp_path / "ens" / "cut", tmp_path / "one" / "cut")


@STRATEGIES
def test_a_diverging_member_fails_alone_and_the_others_go_on(tmp_path, strategy):
    good, bad = small(name="good", seed=0), small(name="bad", seed=1, **{"optim.lr": 1e30, "optim.warmup_steps": 0})
    got = train_ensemble([good, bad], [tmp_path / "ens" / "good", tmp_path / "ens" / "bad"], progress=False,
                         strategy=strategy)
    assert isinstance(got[1], Failure) and "the training loss became nan" in got[1].message.lower()
    with pytest.raises(UserError, match="the training loss became") as raised:
        pretrain(bad, tmp_path / "one" / "bad", progress=False)
    assert got[1].message == f"bad: {raised.value}".replace(str(tmp_path / "one"), str(tmp_path / "ens"))
    pretrain(good, tmp_path / "one" / "good", progress=False)
    compare_runs(tmp_path / "ens" / "good", tmp_path / "one" / "good", strategy == "loop")


def test_the_loop_strategy_reproduces_dropout_from_the_global_rng(tmp_path):
    cfgs = [small(name="a", seed=0, **{"model.dropout": 0.1}), small(name="b", seed=1, **{"model.dropout": 0.2}),
            small(name="c", seed=0, **{"model.dropout": 0.1, "sam.rho": 0.0, "optim.lr": 2e-3})]
    ensemble_and_alone(tmp_path, cfgs, "loop")


def test_what_cannot_be_one_ensemble_is_refused_in_one_line(tmp_path):
    with pytest.raises(UserError, match="global RNG"):
        train_ensemble([small(**{"model.dropout": 0.1})], [tmp_path / "a"], progress=False, strategy="vmap")
    with pytest.raises(UserError, match="differ in batch_size"):
        train_ensemble([small(name="a"), small(name="b", batch_size=16)], [tmp_path / "a", tmp_path / "b"],
                       progress=False)
    assert not (tmp_path / "a").exists()


def test_groups_by_key_under_a_cap():
    cfgs = [small(name=f"r{i}", seed=i) for i in range(5)] + [small(name="sam", **{"sam.rho": 0.05}),
                                                             small(name="drop", **{"model.dropout": 0.1})]
    assert groups(cfgs, 2) == [[0, 1], [2, 3], [4], [5], [6]]
    assert groups(cfgs, 64) == [[0, 1, 2, 3, 4], [5], [6]]
    assert groups(cfgs, 1) == [[i] for i in range(7)]
    assert groups(cfgs, 64, "loop") == [[0, 1, 2, 3, 4, 6], [5]]  # (any dropout: each member its own module)
    assert ensemble_key(cfgs[0]) == ensemble_key(small(name="x", seed=9, **{"optim.lr": 0.5, "sam.rho": 0.0}))
    assert math.isfinite(len(ensemble_key(cfgs[5])))


def test_batches_drawn_ahead_by_workers_are_the_batches(tmp_path, monkeypatch):
    from sameloss.training.data import global_batch
    from sameloss.training.ensemble_data import Ahead
    from sameloss.training.runio import build_language

    cfg = small()
    language = build_language(cfg)
    ahead = Ahead(language, [3, 1, 3], 5, 9, (8, 0.15, "mask"), workers=2)
    for step in range(5, 10):
        got = ahead.get(step)
        assert sorted(got) == [1, 3]
        for seed, batch in got.items():
            want = global_batch(language, seed, step, 8, 0.15)
            assert torch.equal(batch.inputs, want.inputs) and torch.equal(batch.masked, want.masked)
    assert ahead.get(10) is None and ahead.get(11) is None  # past its last step: the loop draws inline
    # an ensemble whose batches are drawn ahead (as on CUDA) is the same ensemble
    from sameloss.training import loop, step

    def inline(*args):
        raise AssertionError("a batch drawn inline")

    cfgs = [small(name="a", seed=0), small(name="b", seed=1, steps=9)]
    with monkeypatch.context() as patched:
        patched.setattr(loop, "DRAW_AHEAD", ("cpu",))
        patched.setattr(step, "global_batch", inline)
        results = train_ensemble(cfgs, [tmp_path / "ens" / c.name for c in cfgs], progress=False, strategy="vmap")
    for cfg, got in zip(cfgs, results):
        alone = pretrain(cfg, tmp_path / "one" / cfg.name, progress=False)
        _close(got["kl"], alone["kl"], KL_RTOL, cfg.name)
        compare_runs(tmp_path / "ens" / cfg.name, tmp_path / "one" / cfg.name)
