"""Forked runs (``init_from``): a fork with the base's settings is the base continued,
bit for bit; a fork's own settings replace the loaded optimiser's; bad forks are refused."""

from __future__ import annotations

import json

import pytest
import torch

from sameloss import config as configlib
from sameloss.errors import UserError
from sameloss.training import PretrainConfig, load_checkpoint, pretrain
from sameloss.training.checkpoint import checkpoint_dir, complete_checkpoints, load_state


def small_config(**overrides) -> PretrainConfig:
    base = ["steps=12", "batch_size=32", "model.size=micro", "eval.every=6", "eval.n_sentences=64",
            "save_every=4", "log_every=3", "optim.warmup_steps=3", "device=cpu", "checkpoints=[6]"]
    return configlib.load(PretrainConfig, None, base + [f"{k}={v}" for k, v in overrides.items()])


def weights(path):
    model = load_checkpoint(path).model
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_a_fork_with_the_base_settings_continues_the_base_bit_identically(tmp_path):
    whole = small_config()  # dropout 0.1: the RNG state comes from the checkpoint too
    pretrain(whole, tmp_path / "whole", progress=False)
    base = small_config(steps=6, checkpoints="[]")
    pretrain(base, tmp_path / "base", progress=False)
    fork = small_config(init_from=f'"{checkpoint_dir(tmp_path / "base", 6)}"', checkpoints="[]")
    pretrain(fork, tmp_path / "fork", progress=False)
    a = weights(complete_checkpoints(tmp_path / "whole")[-1])
    b = weights(complete_checkpoints(tmp_path / "fork")[-1])
    for k in a:
        assert torch.equal(a[k], b[k]), k
    # the fork's log starts after the checkpoint's step and ends with the whole run's evaluation
    log = [json.loads(line) for line in (tmp_path / "fork" / "metrics.jsonl").read_text().splitlines()]
    assert log[0]["step"] > 6
    whole_log = [json.loads(line) for line in (tmp_path / "whole" / "metrics.jsonl").read_text().splitlines()]
    assert log[-1]["eval"] == whole_log[-1]["eval"]


def test_a_fork_uses_its_own_weight_decay_lr_and_sam(tmp_path):
    pretrain(small_config(steps=6, checkpoints="[]"), tmp_path / "base", progress=False)
    start = checkpoint_dir(tmp_path / "base", 6)
    fork = small_config(init_from=f'"{start}"', **{"optim.weight_decay": 0.0, "model.dropout": 0.0,
                                                   "sam.rho": 0.05, "optim.lr": 5e-4})
    pretrain(fork, tmp_path / "fork", progress=False)
    state = load_state(complete_checkpoints(tmp_path / "fork")[-1])
    groups = state["optimizer"]["base"]["param_groups"]  # a SAM run: the base optimiser inside
    assert [g["weight_decay"] for g in groups] == [0.0, 0.0]
    assert [g["lr"] for g in groups] == [5e-4, 5e-4]
    # the moments were loaded (continued), not started afresh: the step count goes on
    base_state = load_state(start)["optimizer"]["state"]
    fork_state = state["optimizer"]["base"]["state"]
    assert float(fork_state[0]["step"]) == float(base_state[0]["step"]) + 6
    # the base's own decay is kept in a plain fork
    pretrain(small_config(init_from=f'"{start}"', **{"optim.weight_decay": 0.05}), tmp_path / "wd", progress=False)
    groups = load_state(complete_checkpoints(tmp_path / "wd")[-1])["optimizer"]["param_groups"]
    assert [g["weight_decay"] for g in groups] == [0.05, 0.0]


def test_bad_forks_are_refused(tmp_path):
    pretrain(small_config(steps=6, checkpoints="[]"), tmp_path / "base", progress=False)
    start = checkpoint_dir(tmp_path / "base", 6)
    with pytest.raises(UserError, match="not a checkpoint"):
        pretrain(small_config(init_from=f'"{tmp_path}"'), tmp_path / "a", progress=False)
    with pytest.raises(UserError, match="trains to steps=6"):
        pretrain(small_config(steps=6, checkpoints="[]", init_from=f'"{start}"'), tmp_path / "b", progress=False)
    with pytest.raises(UserError, match="do not fit"):
        pretrain(small_config(init_from=f'"{start}"', **{"model.d_model": 8, "model.n_heads": 1}), tmp_path / "c",
                 progress=False)
    with pytest.raises(UserError, match="state is adamw.s and does not fit"):
        pretrain(small_config(init_from=f'"{start}"', **{"optim.name": "sgd"}), tmp_path / "d", progress=False)


def test_a_restarted_fork_is_plain_sgd_from_the_checkpoints_weights(tmp_path):
    """``init_step = "restart"`` with ``init_optimizer = false``: steps 1..N of the fork's own
    data stream from the checkpoint's weights, bit-identical to a hand-written plain-SGD loop
    (what ``reproduce theory`` ran as its own loop before it became forks)."""
    from sameloss.training.data import global_batch
    from sameloss.training.objectives.mlm import mlm_loss

    pretrain(small_config(steps=6, checkpoints="[]"), tmp_path / "base", progress=False)  # AdamW
    start = checkpoint_dir(tmp_path / "base", 6)
    fork = small_config(init_from=f'"{start}"', init_step='"restart"', init_optimizer="false", seed=77, steps=5,
                        batch_size=8, checkpoints="[]", **{"optim.name": "sgd", "optim.lr": 0.1,
                                                           "optim.momentum": 0.0, "optim.weight_decay": 0.0,
                                                           "optim.warmup_steps": 0, "model.dropout": 0.0})
    pretrain(fork, tmp_path / "fork", progress=False)
    assert [p.name for p in complete_checkpoints(tmp_path / "fork")] == ["step_0000005"]

    from sameloss.training.checkpoint import load_weights
    from sameloss.training.runio import build_language, init_model

    language = build_language(fork)
    model = init_model(fork, language)  # the fork's model: no dropout
    load_weights(start, model)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(1, 6):
        batch = global_batch(language, 77, step, 8, fork.mask_rate)
        opt.zero_grad()
        mlm_loss(model, batch, batch.n_targets, 1)[0].backward()
        opt.step()
    got = weights(checkpoint_dir(tmp_path / "fork", 5))
    for k, v in model.state_dict().items():
        assert torch.equal(got[k], v), k
    log = [json.loads(line) for line in (tmp_path / "fork" / "metrics.jsonl").read_text().splitlines()]
    assert log[0]["step"] == 3 and log[-1]["step"] == 5  # its own steps (log_every=3), from 1


def test_a_fork_of_a_base_whose_weights_are_not_finite_names_the_base_checkpoint(tmp_path):
    """Issue 63 (noted): a base whose last update made its weights NaN (the checkpoint is
    saved before the next loss shows it) was reported by the fork, as its own loss that
    "became nan", naming the fork's checkpoints. The fork now names the base checkpoint."""
    from safetensors.torch import load_file, save_file

    pretrain(small_config(steps=6, checkpoints="[]"), tmp_path / "base", progress=False)
    start = checkpoint_dir(tmp_path / "base", 6)
    tensors = load_file(str(start / "model.safetensors"))
    name = sorted(tensors)[0]
    tensors[name][0] = float("nan")
    save_file(tensors, str(start / "model.safetensors"))
    with pytest.raises(UserError, match=rf"init_from: the weights of {start} are not finite \({name} holds NaN"):
        pretrain(small_config(init_from=f'"{start}"'), tmp_path / "fork", progress=False)
    assert not (tmp_path / "fork").exists()
