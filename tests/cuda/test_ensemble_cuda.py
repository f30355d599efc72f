"""The ensemble on a GPU (``training.ensemble``, issues 47 and 51): each member equals its
one-model run on the same device — within float32 rounding under ``vmap`` (keyed dropout),
and under ``loop`` with dropout from the global (CUDA) RNG, each member's own state swapped
in; keyed masks are the same bits on the GPU as on the CPU; a bf16 ensemble trains.

Marked ``cuda`` and skipped where torch sees no CUDA device (``SAMELOSS_TEST_DEVICE=cpu``:
the same checks on the CPU, how ``bench/gpu_check.sh``'s dry run checks them)."""

from __future__ import annotations

import math
import os

import pytest
import torch

from sameloss import config as configlib
from sameloss.training import PretrainConfig, keyed, load_checkpoint, pretrain
from sameloss.training.checkpoint import complete_checkpoints
from sameloss.training.ensemble import Failure, train_ensemble

DEVICE = os.environ.get("SAMELOSS_TEST_DEVICE", "cuda")
pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(DEVICE == "cuda" and not torch.cuda.is_available(),
                                 reason="needs a CUDA device (torch sees none)")]


def small(precision: str = "fp32", **overrides) -> PretrainConfig:
    base = ["steps=12", "batch_size=32", "model.size=micro", "eval.every=6", "eval.n_sentences=64",
            "save_every=12", "log_every=3", "optim.warmup_steps=3", f"precision={precision}", f"device={DEVICE}"]
    return configlib.load(PretrainConfig, None, base + [f"{k}={v}" for k, v in overrides.items()])


def final_weights(run) -> dict:
    m, *_ = load_checkpoint(complete_checkpoints(run)[-1])
    return {k: v.float().cpu() for k, v in m.state_dict().items()}


def members_match_their_runs(tmp_path, cfgs, strategy: str, rtol: float, atol: float) -> None:
    got = train_ensemble(cfgs, [tmp_path / "ens" / c.name for c in cfgs], progress=False, strategy=strategy)
    for cfg, result in zip(cfgs, got):
        assert not isinstance(result, Failure), result
        alone = pretrain(cfg, tmp_path / "one" / cfg.name, progress=False)
        assert result["kl"] == pytest.approx(alone["kl"], rel=10 * rtol), cfg.name
        a, b = final_weights(tmp_path / "ens" / cfg.name), final_weights(tmp_path / "one" / cfg.name)
        for k in a:
            torch.testing.assert_close(a[k], b[k], rtol=rtol, atol=atol, msg=f"{cfg.name} {k}")


def test_a_vmap_ensemble_with_keyed_dropout_matches_its_runs(tmp_path):
    cfgs = [small(name="a", seed=0, dropout_draws="keyed", **{"model.dropout": 0.1}),
            small(name="b", seed=1, dropout_draws="keyed", **{"model.dropout": 0.2, "optim.lr": 2e-3}),
            small(name="c", seed=2, **{"model.dropout": 0.0, "optim.grad_clip": 0.5})]
    members_match_their_runs(tmp_path, cfgs, "vmap", 1e-4, 1e-5)


def test_a_loop_ensemble_with_global_rng_dropout_matches_its_runs(tmp_path):
    cfgs = [small(name="a", seed=0, **{"model.dropout": 0.1}), small(name="b", seed=1, **{"model.dropout": 0.1}),
            small(name="c", seed=0, **{"model.dropout": 0.1, "sam.rho": 0.0, "optim.weight_decay": 0.0})]
    members_match_their_runs(tmp_path, cfgs, "loop", 1e-6, 1e-7)


def test_keyed_masks_are_the_same_bits_on_every_device():
    cpu = keyed.one_model(5, 17, keyed.PASS_UPDATE, 0.1, 2, torch.device("cpu"))
    dev = keyed.one_model(5, 17, keyed.PASS_UPDATE, 0.1, 2, torch.device(DEVICE))
    masks = []
    for d, where in ((cpu, "cpu"), (dev, DEVICE)):
        with keyed.draws(d):
            masks.append(keyed.mask_scale(1, torch.Size([64, 16, 32]), torch.float32, torch.device(where)).cpu())
    assert torch.equal(masks[0], masks[1])


def test_a_bf16_ensemble_trains(tmp_path):
    cfgs = [small("auto", name=f"m{i}", seed=i, dropout_draws="keyed", **{"model.dropout": 0.1}) for i in range(4)]
    got = train_ensemble(cfgs, [tmp_path / c.name for c in cfgs], progress=False, strategy="vmap")
    assert all(isinstance(r, dict) and math.isfinite(r["kl"]) for r in got)
