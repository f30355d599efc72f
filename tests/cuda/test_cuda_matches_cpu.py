"""The GPU path against the CPU: the training loop, the exact KL, the Fisher trace,
Lanczos' top eigenvalue, the embedding and SAM run on ``cuda`` and agree with the same
computation on the CPU to float32 tolerance.

Marked ``cuda`` and skipped (cheaply, before any model is built) where torch sees no CUDA
device; ``bench/gpu_check.sh`` runs them on a GPU (``pytest -m cuda tests/cuda``). float32
throughout (``precision=fp32``; TF32 stays off, torch's default for matmuls), so the only
differences are the order of float32 reductions.
"""

from __future__ import annotations

import copy
import os

import pytest
import torch

from sameloss import config as configlib
from sameloss.languages import make_language
from sameloss.measures.curvature import (FisherContexts, FixedBatch, loss_batch, sam_sharpness, top_eigenvalue,
                                         trace_fisher)
from sameloss.models import TransformerConfig, TransformerMLM
from sameloss.models.embed import embed
from sameloss.training import PretrainConfig, load_checkpoint, pretrain
from sameloss.training.checkpoint import complete_checkpoints
from sameloss.training.evaluate import ExactEvaluator

# SAMELOSS_TEST_DEVICE=cpu runs the same comparisons CPU against CPU: how the tests themselves
# are checked on a machine without a GPU.
DEVICE = os.environ.get("SAMELOSS_TEST_DEVICE", "cuda")
pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(DEVICE == "cuda" and not torch.cuda.is_available(),
                                 reason="needs a CUDA device (torch sees none)")]

RTOL, ATOL = 1e-4, 1e-6  # float32 reductions in another order


@pytest.fixture(scope="module")
def language():
    return make_language("pcfg", "tiny")


@pytest.fixture(scope="module")
def model(language):
    torch.manual_seed(0)
    cfg = TransformerConfig(vocab_size=language.vocab_size, max_len=language.max_len, d_model=16, n_heads=2,
                            n_layers=2, d_inter=32, pad_id=language.pad_id, dropout=0.0, attn_dropout=0.0,
                            init_std=0.3)
    return TransformerMLM(cfg).eval()


def on(model, device):
    return copy.deepcopy(model).to(device)


def close(a, b, rtol=RTOL, atol=ATOL):
    assert a == pytest.approx(b, rel=rtol, abs=atol), (a, b)


def test_training_loop_on_cuda_matches_cpu(tmp_path):
    base = ["steps=12", "batch_size=32", "model.size=micro", "eval.every=6", "eval.n_sentences=64",
            "save_every=12", "log_every=3", "optim.warmup_steps=3", "precision=fp32", "model.dropout=0"]
    finals = {}
    weights = {}
    for device in ("cpu", DEVICE):
        cfg = configlib.load(PretrainConfig, None, base + [f"device={device}"])
        finals[device] = pretrain(cfg, tmp_path / f"on_{len(finals)}", progress=False)
        m, *_ = load_checkpoint(complete_checkpoints(tmp_path / f"on_{len(finals) - 1}")[-1])
        weights[device] = {k: v.float().cpu() for k, v in m.state_dict().items()}
    close(finals[DEVICE]["kl"], finals["cpu"]["kl"], rtol=1e-3)
    for k, v in weights["cpu"].items():
        torch.testing.assert_close(weights[DEVICE][k], v, rtol=1e-3, atol=1e-4, msg=k)


def test_exact_kl_on_cuda_matches_cpu(language, model):
    ev = ExactEvaluator(language, 64, 0.15, seed=3, n_subsets=4, batch_size=16)
    cpu, gpu = ev.evaluate(on(model, "cpu"), "cpu"), ev.evaluate(on(model, DEVICE), DEVICE)
    for key in ("kl", "loss", "log_kl"):
        close(gpu[key], cpu[key])


def test_fisher_trace_on_cuda_matches_cpu(language, model):
    contexts = FisherContexts(n_contexts=64, seed=1)
    # the exact label expectation: no sampling on the device
    cpu = trace_fisher(on(model, "cpu"), language, contexts, n_labels=None)
    gpu = trace_fisher(on(model, DEVICE), language, contexts, n_labels=None)
    close(gpu.estimate, cpu.estimate)


def test_lanczos_top_eigenvalue_on_cuda_matches_cpu(language, model):
    batch = loss_batch(language, 64, 0.15, seed=2)
    cpu = top_eigenvalue(on(model, "cpu"), language, FixedBatch(batch=batch), max_iter=60, tol=1e-6)
    gpu = top_eigenvalue(on(model, DEVICE), language, FixedBatch(batch=batch.to(DEVICE)), max_iter=60, tol=1e-6)
    assert cpu.extra["converged"] and gpu.extra["converged"]
    close(gpu.estimate, cpu.estimate, rtol=1e-3)  # λ to Lanczos' tolerance on float32 products


def test_embedding_on_cuda_computes_the_same_function(language, model):
    tokens = loss_batch(language, 32, 0.15, seed=4).inputs
    small = on(model, DEVICE)
    large = embed(small, width_factor=2, extra_layers=1)
    assert next(large.parameters()).device.type == torch.device(DEVICE).type
    with torch.no_grad():
        want = model(tokens)
        got_small, got_large = small(tokens.to(DEVICE)).cpu(), large(tokens.to(DEVICE)).cpu()
        cpu_large = embed(on(model, "cpu"), width_factor=2, extra_layers=1)(tokens)
    torch.testing.assert_close(got_small, want, rtol=RTOL, atol=1e-5)
    torch.testing.assert_close(got_large, want, rtol=RTOL, atol=1e-4)
    torch.testing.assert_close(got_large, cpu_large, rtol=RTOL, atol=1e-4)


def test_sam_sharpness_on_cuda_matches_cpu(language, model):
    batch = loss_batch(language, 64, 0.15, seed=5)
    cpu = sam_sharpness(on(model, "cpu"), language, batch=batch)
    gpu = sam_sharpness(on(model, DEVICE), language, batch=batch)
    close(gpu.extra["loss"], cpu.extra["loss"])
    close(gpu.extra["grad_norm"], cpu.extra["grad_norm"])
    close(gpu.estimate, cpu.estimate, rtol=1e-3, atol=1e-6)  # a difference of two nearby losses


def test_sam_training_on_cuda_matches_cpu(tmp_path):
    base = ["steps=6", "batch_size=32", "model.size=micro", "eval.every=0", "eval.n_sentences=64",
            "save_every=6", "log_every=3", "optim.warmup_steps=2", "precision=fp32", "model.dropout=0",
            "sam.rho=0.05", "optim.weight_decay=0"]
    kl = {}
    for device in ("cpu", DEVICE):
        cfg = configlib.load(PretrainConfig, None, base + [f"device={device}"])
        kl[device] = pretrain(cfg, tmp_path / f"on_{len(kl)}", progress=False)["kl"]
    close(kl[DEVICE], kl["cpu"], rtol=1e-3)
