"""bf16 training (``precision``) and a training loop that never waits for the device.

The meta device holds tensors without values: reading one (``.item()``, ``float(t)``,
``bool(t)``, ``.tolist()``, ``x[mask]`` with a data-dependent size) raises there. So a
loop that runs on it has no host round trip; only the designated read points (the log
windows' ``read``, the evaluator, the checkpoint) may read, once per log line, evaluation
or checkpoint.
"""

from __future__ import annotations

import json

import pytest
import torch

from sameloss import config as configlib
from sameloss.errors import UserError
from sameloss.training import PretrainConfig, pretrain
from sameloss.training import runio
from sameloss.training.evaluate import ExactEvaluator
from sameloss.training.member import Member
from sameloss.training.window import Windows
from training.test_pretrain import small_config, weights


# ---- precision --------------------------------------------------------------------------------
def test_precision_resolves_per_device():
    assert runio.resolve_precision("auto", "cpu") == torch.float32
    assert runio.resolve_precision("auto", torch.device("cuda", 0)) == torch.bfloat16  # the issue: bf16 on CUDA
    assert runio.resolve_precision("bf16", "cpu") == torch.bfloat16
    assert runio.resolve_precision("fp32", "cuda") == torch.float32
    with runio.autocast("bf16", "cpu"):
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16
    with runio.autocast("auto", "cpu"):
        assert not torch.is_autocast_enabled("cpu")
    with pytest.raises(UserError, match="'precision': 'fp16' is not one of auto, bf16, fp32"):
        small_config(precision="fp16")


def test_bf16_resume_after_a_kill_is_bit_identical(tmp_path):
    cfg = small_config(precision="bf16")  # dropout on: the RNG state is restored too
    pretrain(cfg, tmp_path / "whole", progress=False)
    pretrain(cfg, tmp_path / "split", progress=False, stop_after=5)
    pretrain(cfg, tmp_path / "split", progress=False, resume=True)
    a, b = weights(tmp_path / "whole"), weights(tmp_path / "split")
    for k in a:
        assert torch.equal(a[k], b[k]), k
        assert a[k].dtype == torch.float32, k  # checkpoints stay float32 (master weights)
    whole = [json.loads(x) for x in (tmp_path / "whole" / "metrics.jsonl").read_text().splitlines()]
    split = [json.loads(x) for x in (tmp_path / "split" / "metrics.jsonl").read_text().splitlines()]
    assert [r.get("train_loss") for r in whole] == [r.get("train_loss") for r in split]
    assert whole[-1]["eval"] == split[-1]["eval"]
    # bf16 really ran: the same seed in float32 ends elsewhere
    pretrain(small_config(precision="fp32"), tmp_path / "fp32", progress=False)
    c = weights(tmp_path / "fp32")
    assert any(not torch.equal(a[k], c[k]) for k in a)
    # and the precision is part of the trajectory: a resume may not change it
    pretrain(cfg, tmp_path / "r", progress=False, stop_after=4)
    with pytest.raises(UserError, match="config key 'precision' was 'bf16' and is now 'fp32'"):
        pretrain(small_config(precision="fp32"), tmp_path / "r", progress=False, resume=True)


def test_bf16_training_reaches_the_kl_of_float32_training(tmp_path):
    """A micro transformer, 200 steps on the micro HMM (KL falls from ~1.7 to ~0.31
    nats). Three fp32 seeds give the seed spread (0.312–0.321 when written); every bf16
    run must land inside it widened by a margin of half its width on each side, and
    differ from the fp32 run of its own seed by less than a tenth of it: bf16 rounding
    moves the result far less than the seed does."""
    def kl(precision, seed):
        cfg = configlib.load(PretrainConfig, None, [
            "steps=200", "batch_size=64", "model.size=micro", "language.name=hmm", "language.size=micro",
            "eval.every=0", "eval.n_sentences=500", "save_every=100000", "log_every=50", "optim.warmup_steps=20",
            "device=cpu", f"precision={precision}", f"seed={seed}", f"name={precision}-{seed}"])
        return pretrain(cfg, tmp_path / cfg.name, progress=False)["kl"]

    fp32 = [kl("fp32", s) for s in range(3)]
    bf16 = [kl("bf16", s) for s in range(3)]
    low, high = min(fp32), max(fp32)
    width = high - low
    assert width > 1e-3 and low < 0.5  # trained, and seeds differ
    margin = 0.5 * width
    for s in range(3):
        assert low - margin <= bf16[s] <= high + margin, (s, bf16[s], fp32)
        assert bf16[s] != fp32[s] and abs(bf16[s] - fp32[s]) < 0.1 * width, (s, bf16[s], fp32[s])


# ---- no host round trips in the step loop -----------------------------------------------------
@pytest.mark.parametrize("extra", [
    {"precision": "bf16", "optim.grad_clip": 1.0},
    {"sam.rho": 0.05, "model.dropout": 0.0},
    {"adversarial.weight": 0.1, "adversarial.task": "A", "adversarial.batch_size": 8,
     "adversarial.pool_size": 64},
    {"tracker": "tensorboard"},  # the gradient norm of the log steps and the tracker read nothing per step
    # the flatness penalty: labels drawn on the device, probes moved there; with the adversary too
    {"flatness.weight": 0.1, "precision": "bf16", "adversarial.weight": 0.1, "adversarial.task": "A",
     "adversarial.batch_size": 8, "adversarial.pool_size": 64},
    {"flatness.weight": -0.1, "flatness.measure": "hutchinson"},
], ids=["bf16-clip", "sam", "adversarial", "tracker", "flatness-fisher", "flatness-hutchinson"])
def test_the_training_loop_runs_on_the_meta_device_reading_only_at_log_lines(tmp_path, monkeypatch, extra):
    extra = dict(extra)
    tracker = extra.pop("tracker", "none")
    if tracker != "none":
        pytest.importorskip("tensorboard")
    reads = []
    monkeypatch.setattr(runio, "resolve_device", lambda name: torch.device("meta"))
    real_record = Windows.record

    def read(self):
        # the sums stay on the device until a log line, evaluation or checkpoint reads them once
        assert all(v.device.type == "meta" for v in self.sums.values()) and self.diverged.device.type == "meta"
        # the log step's gradient norm is kept on the device too
        assert self.grad_norm is None or self.grad_norm.device.type == "meta"
        if self._host is None:
            reads.append(("read", self.steps[0]))
            host = {k: torch.zeros(v.shape, dtype=v.dtype) for k, v in self.sums.items()}
            host["diverged"] = torch.full(self.diverged.shape, float("nan"), dtype=torch.float64)
            if self.grad_norm is not None:
                host["grad_norm"] = torch.zeros(self.grad_norm.shape)
            self._host = host
        return self._host

    def record(self, i, step, lr, logs):
        reads.append(("record", step))
        return real_record(self, i, step, lr, logs)

    monkeypatch.setattr(Windows, "read", read)
    monkeypatch.setattr(Windows, "record", record)
    monkeypatch.setattr(Member, "save", lambda self, step, window: reads.append(("save", step)))
    monkeypatch.setattr(ExactEvaluator, "evaluate", lambda self, model, device: reads.append(("eval", None)) or {})
    monkeypatch.setattr(runio, "write_summary", lambda *args: None)
    cfg = small_config(steps=10, log_every=5, save_every=10, **{"eval.every": 0}, **extra)
    pretrain(cfg, tmp_path / "r", progress=False, tracker=tracker)
    # the loop read nothing else (any read on the meta device raises); the reads happen
    # at the log lines, the final evaluation and the checkpoint only, once each
    assert reads == [("read", 5), ("record", 5), ("read", 5), ("record", 10), ("eval", None), ("save", 10)]


def test_exact_evaluation_runs_on_the_device_and_reads_back_once():
    from sameloss.languages import make_language

    language = make_language("hmm", "micro")
    cfg = small_config(**{"language.name": "hmm", "language.size": "micro"})
    ev = ExactEvaluator(language, 50, 0.15, seed=3, n_subsets=5, batch_size=16)  # four chunks
    on_meta = runio.init_model(cfg, language, "meta")
    table = ev.table(on_meta, "meta")  # every chunk on the device, nothing read back
    assert table.device.type == "meta" and table.shape == (4, 6)
    # on the CPU the same code gives the numbers of a direct computation from log_probs
    model = runio.init_model(cfg, language)
    result = ev.evaluate(model)
    logq, p = ev.log_probs(model), ev.true
    kl = (torch.special.xlogy(p, p) - p * logq[:, :language.n_words]).sum(1)
    assert result["kl"] == pytest.approx(float(kl.mean()), abs=1e-12)
    per_subset = torch.stack([kl[ev.subset == k].mean() for k in range(5)])
    assert result["kl_std"] == pytest.approx(float(per_subset.std()), abs=1e-12)
