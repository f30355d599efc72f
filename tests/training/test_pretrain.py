"""Pre-training: exact resume, DDP equivalence, the loss decomposition, checkpoints."""

from __future__ import annotations

import json
import os
import socket

import pytest
import torch
import torch.multiprocessing as mp

from sameloss import config as configlib
from sameloss.errors import UserError
from sameloss.languages import PCFG
from sameloss.training import PretrainConfig, load_checkpoint, pretrain
from sameloss.training.checkpoint import complete_checkpoints
from sameloss.training.data import global_batch, shard_bounds
from sameloss.training.evaluate import ExactEvaluator
from sameloss.training.runio import build_language, init_model


def small_config(**overrides) -> PretrainConfig:
    base = ["steps=12", "batch_size=32", "model.size=micro", "eval.every=6", "eval.n_sentences=64",
            "save_every=4", "log_every=3", "optim.warmup_steps=3", "device=cpu"]
    return configlib.load(PretrainConfig, None, base + [f"{k}={v}" for k, v in overrides.items()])


def weights(run_dir):
    model, _, _, _ = load_checkpoint(complete_checkpoints(run_dir)[-1])
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_resume_after_a_kill_is_bit_identical(tmp_path):
    cfg = small_config()  # dropout 0.1: the RNG state must be restored too
    pretrain(cfg, tmp_path / "whole", progress=False)
    pretrain(cfg, tmp_path / "split", progress=False, stop_after=5)  # "killed" after step 5
    assert [p.name for p in complete_checkpoints(tmp_path / "split")][-1] == "step_0000005"
    pretrain(cfg, tmp_path / "split", progress=False, resume=True)
    a, b = weights(tmp_path / "whole"), weights(tmp_path / "split")
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    # the metrics log has no duplicated steps after the resume
    steps = [json.loads(line)["step"] for line in (tmp_path / "split" / "metrics.jsonl").read_text().splitlines()]
    assert steps == sorted(set(steps))
    whole = [json.loads(line) for line in (tmp_path / "whole" / "metrics.jsonl").read_text().splitlines()]
    split = [json.loads(line) for line in (tmp_path / "split" / "metrics.jsonl").read_text().splitlines()]
    assert whole[-1]["eval"] == split[-1]["eval"]


def test_resume_refuses_a_changed_trajectory(tmp_path):
    pretrain(small_config(), tmp_path / "r", progress=False, stop_after=4)
    with pytest.raises(UserError, match="config key 'optim.lr' was 0.001 and is now 0.002"):
        pretrain(small_config(**{"optim.lr": 0.002}), tmp_path / "r", progress=False, resume=True)
    # more steps is fine (the schedule does not depend on them)
    pretrain(small_config(steps=14), tmp_path / "r", progress=False, resume=True)


def test_resume_of_a_run_saved_before_a_config_key_existed(tmp_path):
    # a config.toml without a key added since (here mask_replace) holds its default: the
    # run resumes, as reproduce reuses it
    pretrain(small_config(), tmp_path / "r", progress=False, stop_after=4)
    path = tmp_path / "r" / "config.toml"
    lines = path.read_text().splitlines()
    assert any(line.startswith("mask_replace") for line in lines)
    path.write_text("".join(line + "\n" for line in lines if not line.startswith("mask_replace")))
    pretrain(small_config(), tmp_path / "r", progress=False, resume=True)
    assert [p.name for p in complete_checkpoints(tmp_path / "r")][-1] == "step_0000012"


def test_checkpoint_round_trip_gives_the_same_function(tmp_path):
    cfg = small_config(steps=4, **{"checkpoints": "[2]"})
    pretrain(cfg, tmp_path / "r", progress=False)
    names = [p.name for p in complete_checkpoints(tmp_path / "r")]
    assert "step_0000002" in names and "step_0000004" in names
    model, language, loaded_cfg, _ = load_checkpoint(tmp_path / "r" / "checkpoints" / "step_0000004")
    assert loaded_cfg == cfg
    tokens = language.sample(16, torch.Generator().manual_seed(0)).tokens
    out = model(tokens)
    # tied weights survive the round trip as one tensor
    assert model.output_weight.data_ptr() == model.tok_emb.weight.data_ptr()
    again, _, _, _ = load_checkpoint(tmp_path / "r" / "checkpoints" / "step_0000004")
    assert torch.equal(out, again(tokens))


def test_loss_is_entropy_plus_kl():
    """The exact loss E_p[-log q] against the cross-entropy of the sampled held-out
    tokens (an independent estimate of the same quantity) and the identity per token."""
    language = PCFG.preset("tiny")
    cfg = small_config()
    model = init_model(cfg, language)
    ev = ExactEvaluator(language, 3000, 0.15, seed=5)
    result = ev.evaluate(model)
    assert result["loss"] == pytest.approx(result["entropy"] + result["kl"], abs=1e-12)
    assert result["kl"] > 0
    # the sampled-token cross-entropy estimates the same expectation
    se = result["sampled_loss_std"] / 5 ** 0.5
    assert abs(result["sampled_loss"] - result["loss"]) < 4 * se + 1e-3
    # per token: H(p) + KL(p||q) computed from scratch
    logq = ev.log_probs(model)
    p = ev.true
    kl = (torch.special.xlogy(p, p) - p * logq[:, :language.n_words]).sum(1)
    assert float(kl.mean()) == pytest.approx(result["kl"], abs=1e-12)
    # a model that outputs the true conditionals has zero KL
    assert float((torch.special.xlogy(p, p) - torch.special.xlogy(p, p)).sum()) == 0


def test_every_process_gets_its_slice_of_the_same_global_batch():
    language = PCFG.preset("tiny")
    full = global_batch(language, 0, 7, 10, 0.15)
    # every process builds the global batch itself (as the loop does): the same (seed, step)
    # must give the same batch, and the shards must tile it
    again = [global_batch(language, 0, 7, 10, 0.15) for _ in range(3)]
    assert all(torch.equal(a.inputs, full.inputs) and torch.equal(a.masked, full.masked) for a in again)
    parts = [a.shard(r, 3) for r, a in enumerate(again)]
    assert torch.equal(torch.cat([p.inputs for p in parts]), full.inputs)
    assert torch.equal(torch.cat([p.masked for p in parts]), full.masked)
    assert [shard_bounds(10, r, 3) for r in range(3)] == [(0, 4), (4, 7), (7, 10)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ddp_worker(rank, world_size, port, cfg, run_dir):
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    from sameloss.training import distributed
    try:
        pretrain(cfg, run_dir, progress=False)
    finally:
        distributed.teardown()


@pytest.mark.parametrize("optim, atol", [
    # SGD is linear in the gradient: only float round-off separates the two runs
    ("sgd", 1e-6),
    # Adam divides by sqrt(v): a gradient entry near zero turns round-off into up to a
    # whole step (lr = 1e-3), so allow a tenth of one step
    ("adamw", 1e-4),
])
def test_two_process_gloo_run_matches_single_process(tmp_path, optim, atol):
    # dropout off: each process draws its own dropout masks, so only the deterministic
    # model is comparable across process counts
    cfg = small_config(steps=6, **{"model.dropout": 0.0, "batch_size": 30, "optim.name": optim,
                                   "optim.lr": 0.1 if optim == "sgd" else 1e-3})
    pretrain(cfg, tmp_path / "single", progress=False)
    mp.start_processes(_ddp_worker, args=(2, _free_port(), cfg, tmp_path / "ddp"), nprocs=2,
                       start_method="spawn")
    a, b = weights(tmp_path / "single"), weights(tmp_path / "ddp")
    moved = max(float((a[k] - weights_at_init(cfg)[k]).abs().max()) for k in a)
    assert moved > 10 * atol  # the runs really trained
    for k in a:
        assert torch.allclose(a[k], b[k], atol=atol, rtol=0), (k, (a[k] - b[k]).abs().max())


def weights_at_init(cfg):
    torch.manual_seed(cfg.seed)  # as pretrain does before it builds the model
    return init_model(cfg, build_language(cfg)).state_dict()


def test_bad_config_values_are_one_line_errors():
    with pytest.raises(UserError, match="unknown config key 'optim.learning_rate'"):
        small_config(**{"optim.learning_rate": 1})
    with pytest.raises(UserError, match="config key 'steps': expected int, got 'many'"):
        small_config(steps="many")
    with pytest.raises(UserError, match="model.kind must be one of lstm, transformer, got 'gru'"):
        small_config(**{"model.kind": "gru"})
    with pytest.raises(UserError, match="mask_rate must be in"):
        small_config(mask_rate=1.5)


# the loss is read once per log line (every 3 steps) or checkpoint (every 4): a bad step 7
# is caught before the step-8 checkpoint, a bad step 5 at the step-6 log line
@pytest.mark.parametrize("bad_step,value", [(7, "nan"), (5, "inf")])
def test_nan_loss_stops_with_a_clear_message_and_keeps_the_last_good_checkpoint(tmp_path, monkeypatch, bad_step,
                                                                               value):
    from sameloss.training import loop
    from sameloss.training.objectives import mlm

    real = mlm.mlm_loss
    calls = {"n": 0}

    def poisoned(*args):
        calls["n"] += 1
        loss, summed = real(*args)
        if calls["n"] == bad_step:
            return loss * float(value), summed * float(value)
        return loss, summed

    monkeypatch.setattr(mlm, "mlm_loss", poisoned)
    with pytest.raises(loop.TrainingDiverged,
                       match=rf"became {value} at step {bad_step}; the last good checkpoint is .*step_0000004"):
        pretrain(small_config(), tmp_path / "r", progress=False)
    assert [p.name for p in complete_checkpoints(tmp_path / "r")] == ["step_0000004"]


def test_lstm_pretrains_and_resumes(tmp_path):
    cfg = small_config(steps=6, **{"model.kind": "lstm", "language.name": "hmm"})
    result = pretrain(cfg, tmp_path / "lstm", progress=False)
    assert result["kl"] > 0 and result["loss"] == pytest.approx(result["entropy"] + result["kl"])


def test_schedule_warms_up_holds_and_optionally_decays():
    cfg = small_config(steps=100, **{"optim.warmup_steps": 10, "optim.decay_steps": 20,
                                     "optim.final_lr_factor": 0.1})
    f = [cfg.lr_factor(s) for s in range(100)]
    assert f[0] == pytest.approx(0.1) and f[9] == 1.0 and f[79] == 1.0
    assert f[99] == pytest.approx(0.1) and all(a >= b for a, b in zip(f[79:], f[80:]))
    assert small_config(steps=100, **{"optim.warmup_fraction": 0.12}).warmup == 12


def test_resume_refuses_more_steps_when_the_schedule_depends_on_them(tmp_path):
    cfg = small_config(**{"optim.decay_steps": 4})
    pretrain(cfg, tmp_path / "r", progress=False, stop_after=4)
    with pytest.raises(UserError, match="config key 'steps' was 12 and is now 20"):
        pretrain(small_config(steps=20, **{"optim.decay_steps": 4}), tmp_path / "r", progress=False, resume=True)


def test_schedule_holds_the_final_lr_for_final_steps_after_the_decay():
    cfg = small_config(steps=100, **{"optim.warmup_steps": 10, "optim.decay_steps": 20,
                                     "optim.final_lr_factor": 0.1, "optim.final_steps": 30})
    f = [cfg.lr_factor(s) for s in range(100)]
    assert f[9] == 1.0 and f[49] == 1.0  # constant up to the decay (steps 50..69)
    assert f[50] < 1.0 and f[69] == pytest.approx(0.1) and all(a >= b for a, b in zip(f[49:70], f[50:70]))
    assert f[70:] == [pytest.approx(0.1)] * 30  # the stretch at the final lr
    # without a stretch the schedule is the one it always was
    old = small_config(steps=100, **{"optim.warmup_steps": 10, "optim.decay_steps": 20,
                                     "optim.final_lr_factor": 0.1})
    assert old.lr_factor(79) == 1.0 and old.lr_factor(99) == pytest.approx(0.1)
    with pytest.raises(UserError, match="must not exceed steps"):
        small_config(steps=40, **{"optim.decay_steps": 20, "optim.final_steps": 30})


def test_resume_within_the_final_stretch_is_bit_identical(tmp_path):
    cfg = small_config(**{"optim.decay_steps": 4, "optim.final_steps": 4, "optim.final_lr_factor": 0.1})
    pretrain(cfg, tmp_path / "whole", progress=False)
    pretrain(cfg, tmp_path / "split", progress=False, stop_after=9)  # killed inside the stretch
    pretrain(cfg, tmp_path / "split", progress=False, resume=True)
    a, b = weights(tmp_path / "whole"), weights(tmp_path / "split")
    assert all(torch.equal(a[k], b[k]) for k in a)
    # the stretch's position depends on the run's length: a longer run cannot resume this one
    pretrain(small_config(**{"optim.final_steps": 4}), tmp_path / "hold", progress=False, stop_after=4)
    with pytest.raises(UserError, match="config key 'steps' was 12 and is now 20"):
        pretrain(small_config(steps=20, **{"optim.final_steps": 4}), tmp_path / "hold", progress=False,
                 resume=True)


def test_eval_at_checkpoints_evaluates_exactly_the_kept_checkpoints(tmp_path):
    cfg = small_config(**{"eval.every": 0, "eval.at_checkpoints": "true", "checkpoints": "[5,7]"})
    pretrain(cfg, tmp_path / "r", progress=False)
    log = [json.loads(line) for line in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log if "eval" in r] == [5, 7, 12]
    meta = json.loads((complete_checkpoints(tmp_path / "r")[0] / "meta.json").read_text())
    assert meta["step"] == 5 and meta["eval"]["kl"] == next(r["eval"]["kl"] for r in log if r["step"] == 5)
