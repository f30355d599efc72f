"""Trackers (``training/tracking.py``): TensorBoard's event files, read back with its own
``EventAccumulator``, hold exactly what ``metrics.jsonl`` holds (train loss, lr, gradient norm,
steps/s, exact KL, log-KL, entropy), also across a resume, and the resolved config as text
and hparams; tracking never changes the trajectory; W&B runs offline, one W&B run per
sameloss run (a stand-in module records the calls; and the real package offline, its
transaction log read back), every row against its own step metric, grouped by experiment;
a reused run gets its metrics in a tracker that lacks them (issue 39); the gradient norm is
the update's."""

from __future__ import annotations

import importlib.machinery
import json
import struct
import sys
import types

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator

from sameloss import config as configlib
from sameloss.errors import UserError
from sameloss.training import PretrainConfig, load_checkpoint, pretrain
from sameloss.training.checkpoint import complete_checkpoints
from sameloss.training.tracking import check_tracker, log_measured, wandb_id


def small_config(**overrides) -> PretrainConfig:
    base = ["steps=12", "batch_size=32", "model.size=micro", "eval.every=6", "eval.n_sentences=64",
            "save_every=4", "log_every=3", "optim.warmup_steps=3", "device=cpu", "name=r"]
    return configlib.load(PretrainConfig, None, base + [f"{k}={v}" for k, v in overrides.items()])


def records(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def events(run_dir) -> dict[str, dict[int, float]]:
    acc = EventAccumulator(str(run_dir / "tb"), size_guidance={SCALARS: 0})
    acc.Reload()
    out = {}
    for tag in acc.Tags()["scalars"]:
        steps = [e.step for e in acc.Scalars(tag)]
        assert len(steps) == len(set(steps)), f"{tag}: a step logged twice"
        out[tag] = {e.step: e.value for e in acc.Scalars(tag)}
    return out


def expected(run_dir) -> dict[str, dict[int, float]]:
    """What metrics.jsonl says each tag must hold."""
    out: dict[str, dict[int, float]] = {}
    for r in records(run_dir):
        pairs = [("train/loss", r.get("train_loss")), ("train/lr", r.get("lr")), ("train/grad_norm", r.get("grad_norm")),
                 ("train/steps_per_s", r.get("steps_per_s")), ("train/tokens_per_s", r.get("tokens_per_s"))]
        ev = r.get("eval") or {}
        pairs += [("eval/kl", ev.get("kl")), ("eval/log_kl", ev.get("log_kl")), ("eval/entropy", ev.get("entropy")),
                  ("eval/loss", ev.get("loss"))]
        for tag, value in pairs:
            if value is not None:
                out.setdefault(tag, {})[r["step"]] = value
    return out


def assert_mirrors(run_dir) -> None:
    want, got = expected(run_dir), events(run_dir)
    assert {"train/loss", "train/lr", "train/grad_norm", "train/steps_per_s", "eval/kl", "eval/log_kl",
            "eval/entropy"} <= set(want)
    assert set(want) <= set(got)
    for tag, values in want.items():
        assert set(got[tag]) == set(values), tag
        for step, value in values.items():
            assert got[tag][step] == pytest.approx(value, rel=1e-6, abs=1e-30), (tag, step)  # float32 in the file


def weights(run_dir):
    return load_checkpoint(complete_checkpoints(run_dir)[-1]).model.state_dict()


def test_tensorboard_holds_what_metrics_jsonl_holds_and_changes_nothing(tmp_path):
    pretrain(small_config(), tmp_path / "tracked", progress=False, tracker="tensorboard")
    assert_mirrors(tmp_path / "tracked")
    evals = [r["step"] for r in records(tmp_path / "tracked") if r.get("eval")]
    assert evals == [6, 12]
    # tracking never changes the trajectory
    pretrain(small_config(), tmp_path / "plain", progress=False)
    a, b = weights(tmp_path / "tracked"), weights(tmp_path / "plain")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not (tmp_path / "plain" / "tb").exists()


def test_a_resumed_run_logs_each_step_once(tmp_path):
    import shutil

    cfg = small_config(checkpoints="[4]")
    pretrain(cfg, tmp_path / "r", progress=False, tracker="tensorboard", stop_after=7)
    shutil.rmtree(tmp_path / "r" / "checkpoints" / "step_0000007")  # killed after logging step 6, saved at 4
    assert [r["step"] for r in records(tmp_path / "r")] == [3, 6]
    pretrain(cfg, tmp_path / "r", progress=False, tracker="tensorboard", resume=True)
    # the resumed call logs step 6 again: TensorBoard shows it once (purged from step 5 on)
    assert_mirrors(tmp_path / "r")
    whole = tmp_path / "whole"
    pretrain(cfg, whole, progress=False)
    strip = [[{k: v for k, v in r.items() if k not in ("tokens_per_s", "steps_per_s")} for r in records(d)]
             for d in (tmp_path / "r", whole)]
    assert strip[0] == strip[1]


def test_the_gradient_norm_is_the_updates_and_clipping_reports_the_same(tmp_path):
    # clipping at a bound never reached leaves the update as it is; clip_grad_norm_'s norm
    # (the clipped path) and get_total_norm's (the other) must then agree step by step
    pretrain(small_config(), tmp_path / "a", progress=False)
    pretrain(small_config(**{"optim.grad_clip": 1e9}), tmp_path / "b", progress=False)
    a, b = ([r["grad_norm"] for r in records(tmp_path / d)] for d in ("a", "b"))
    assert a == pytest.approx(b, rel=1e-6) and all(x > 0 for x in a)
    # and it is the norm of the gradient of the update at that step, recomputed by hand from
    # the checkpoint before it (step 3, from a copy of the run stopped after step 2)
    cfg = small_config(steps=3, log_every=3)
    pretrain(cfg, tmp_path / "c", progress=False)
    pretrain(cfg, tmp_path / "d", progress=False, stop_after=2)  # its checkpoint at step 2
    from sameloss.training.data import global_batch
    from sameloss.training.runio import build_language

    model = load_checkpoint(tmp_path / "d" / "checkpoints" / "step_0000002").model
    language = build_language(cfg)
    state = torch.load(tmp_path / "d" / "checkpoints" / "step_0000002" / "state.pt", weights_only=False)
    torch.set_rng_state(state["rng"])  # dropout draws as in the run
    model.train()
    batch = global_batch(language, cfg.seed, 3, cfg.batch_size, cfg.mask_rate, cfg.mask_replace)
    logits = model(batch.inputs)
    loss = torch.nn.functional.cross_entropy(logits[batch.masked].float(), batch.targets[batch.masked],
                                             reduction="sum") / batch.n_targets
    loss.backward()
    norm = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in model.parameters() if p.grad is not None))
    assert records(tmp_path / "c")[-1]["grad_norm"] == pytest.approx(float(norm), rel=1e-5)


class _FakeRun:
    def __init__(self, calls):
        self.calls = calls

    def define_metric(self, name, step_metric=None):
        self.calls.append(("define_metric", name, step_metric))

    def log(self, scalars, step=None):
        assert step is None, "W&B's own step drops any row below its last: every row has a step metric instead"
        self.calls.append(("log", dict(scalars)))

    def finish(self):
        self.calls.append(("finish",))


def test_wandb_runs_offline_one_run_per_sameloss_run(tmp_path, monkeypatch):
    calls = []
    fake = types.ModuleType("wandb")
    fake.__spec__ = importlib.machinery.ModuleSpec("wandb", None)

    def init(**kwargs):
        calls.append(("init", kwargs))
        return _FakeRun(calls)

    fake.init = init
    monkeypatch.setitem(sys.modules, "wandb", fake)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    pretrain(small_config(), tmp_path / "r", progress=False, tracker="wandb")
    (kind, kwargs), *rest, last = calls
    assert kind == "init" and last == ("finish",)
    assert kwargs["mode"] == "offline" and kwargs["name"] == "r" and kwargs["id"] == wandb_id(tmp_path / "r")
    assert kwargs["dir"] == str(tmp_path / "r") and kwargs["config"]["optim"]["lr"] == 0.001
    assert kwargs["group"] is None  # a run of its own: no experiment to group it under
    defined = {c[1]: c[2] for c in rest if c[0] == "define_metric"}
    assert defined == {"step": None, "train/*": "step", "eval/*": "step", "measure/step": None,
                       "measure/*": "measure/step"}
    logs = [c[1] for c in rest if c[0] == "log"]
    logged = {scalars["step"]: scalars for scalars in logs}
    for r in records(tmp_path / "r"):
        assert logged[r["step"]]["train/loss"] == r["train_loss"]
        if r.get("eval"):
            assert logged[r["step"]]["eval/kl"] == r["eval"]["kl"]
    assert wandb_id(tmp_path / "r") != wandb_id(tmp_path / "other")


def test_a_missing_tracker_package_is_one_line_before_anything_is_written(tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(UserError, match=r"--tracker wandb needs the wandb package \(pip install wandb\)"):
        pretrain(small_config(), tmp_path / "r", progress=False, tracker="wandb")
    assert not (tmp_path / "r").exists()
    with pytest.raises(UserError, match="unknown tracker 'mlflow'"):
        check_tracker("mlflow")


# ---- the config, W&B offline for real, reused runs (issue 39) ------------------------------------
def test_tensorboard_keeps_the_resolved_config_as_text_and_hparams(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import TENSORS
    from tensorboard.plugins.hparams import plugin_data_pb2
    from tensorboard.util import tensor_util

    pretrain(small_config(**{"optim.lr": 0.002}), tmp_path / "r", progress=False, tracker="tensorboard")
    acc = EventAccumulator(str(tmp_path / "r" / "tb"), size_guidance={SCALARS: 0, TENSORS: 0})
    acc.Reload()
    (text,) = acc.Tensors("config/text_summary")
    toml = tensor_util.make_ndarray(text.tensor_proto).item().decode()
    assert "steps = 12" in toml and "lr = 0.002" in toml and toml.startswith("```toml")
    plugin = {k: plugin_data_pb2.HParamsPluginData.FromString(v) for k, v in acc.PluginTagToContent("hparams").items()}
    start = plugin["_hparams_/session_start_info"].session_start_info.hparams
    assert start["steps"].number_value == 12 and start["optim.lr"].number_value == pytest.approx(0.002)
    assert start["language.name"].string_value == "pcfg"
    declared = {m.name.tag for m in plugin["_hparams_/experiment"].experiment.metric_infos}
    assert {"eval/kl", "train/loss"} <= declared
    assert_mirrors(tmp_path / "r")  # and the scalars as before


def wandb_records(run_dir) -> list:
    """Every record of a run's offline W&B transaction logs (``wandb/offline-run-*/*.wandb``:
    LevelDB's log format, 32 KiB blocks of records each with a 7-byte header; wandb no longer
    ships a reader in Python).

    ``run.finish()`` returns once the run's last record is handed to wandb's service
    process, which writes it to the file a moment later (issue 63: the measured row was
    missing when the file was read at once, under load, and once alone). ``wandb.teardown``
    stops the service and waits for it, so every record is on disk before it is read."""
    import wandb
    from wandb.proto import wandb_internal_pb2

    wandb.teardown()
    out = []
    for path in sorted(run_dir.glob("wandb/offline-run-*/run-*.wandb")):
        data, off, parts = path.read_bytes(), 7, b""
        assert data[:4] == b":W&B"
        while off + 7 <= len(data):
            left = 32768 - off % 32768
            if left < 7:  # a block's tail too short for a header: padding
                off += left
                continue
            _, n, kind = struct.unpack("<IHB", data[off:off + 7])
            chunk, off = data[off + 7:off + 7 + n], off + 7 + n
            if kind == 0:  # the rest of the block is padding
                off += left - 7 - n
                continue
            parts = chunk if kind in (1, 2) else parts + chunk
            if kind in (1, 4):  # a full record, or the last part of one
                record = wandb_internal_pb2.Record()
                record.ParseFromString(parts)
                out.append(record)
    return out


def test_wandb_offline_keeps_measured_rows_behind_later_steps(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    experiment = tmp_path / "isoloss-smoke"
    (experiment / "runs").mkdir(parents=True)
    (experiment / ".sameloss-experiment").write_text("sameloss experiment folder\n")
    run = experiment / "runs" / "r"
    pretrain(small_config(), run, progress=False, tracker="wandb")
    # a checkpoint's measured row arrives after training logged step 12: it must not be dropped
    log_measured("wandb", run, "r", {"step": 4, "trace_fisher": 12.5, "probe_B": 0.5, "parameters": 900})
    logged = wandb_records(run)
    runs = [r.run for r in logged if r.WhichOneof("record_type") == "run"]
    assert runs and all(r.run_group == "isoloss-smoke" and r.run_id == wandb_id(run) for r in runs)
    config = {u.key: json.loads(u.value_json) for u in runs[0].config.update}
    assert config["optim"]["lr"] == 0.001 and config["steps"] == 12
    metrics = {(r.metric.name or r.metric.glob_name): r.metric.step_metric for r in logged
               if r.WhichOneof("record_type") == "metric"}
    assert metrics["train/*"] == "step" and metrics["measure/*"] == "measure/step"
    rows = [{i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item} for r in logged
            if r.WhichOneof("record_type") == "history"]
    measured = [row for row in rows if "measure/step" in row]
    assert measured == [pytest.approx({**measured[0], "measure/step": 4, "measure/trace_fisher": 12.5,
                                       "measure/probe_B": 0.5})]
    assert "measure/parameters" not in measured[0]
    trained = {row["step"]: row for row in rows if "train/loss" in row}
    assert {r["step"]: r["train_loss"] for r in records_of(run)} == \
        {s: pytest.approx(row["train/loss"]) for s, row in trained.items()}


def records_of(run_dir) -> list[dict]:
    """The records of metrics.jsonl that hold a train loss."""
    return [r for r in records(run_dir) if "train_loss" in r]


def test_a_reused_run_gets_its_metrics_in_a_tracker_that_lacks_them(tmp_path):
    from sameloss.experiments.engine.core import Study, StudySettings
    from sameloss.experiments.engine.runspec import RunSpec

    spec = RunSpec("r", (("steps", 12), ("batch_size", 32), ("model.size", "micro"), ("eval.every", 6),
                         ("eval.n_sentences", 64), ("save_every", 4), ("log_every", 3), ("optim.warmup_steps", 3),
                         ("device", "cpu"), ("language.name", "hmm"), ("language.size", "micro")))
    with Study(tmp_path / "s", StudySettings(progress=False, device="cpu")) as study:  # trained without a tracker
        run = study.train(spec).path
    assert not (run / "tb").exists()
    lines = []
    with Study(tmp_path / "s", StudySettings(progress=False, device="cpu", tracker="tensorboard"), log=lines.append) as study:
        assert study.train(spec).status == "reused"
    assert_mirrors(run)  # its whole metrics.jsonl, now in TensorBoard
    acc = EventAccumulator(str(run / "tb"))
    acc.Reload()
    assert "config/text_summary" in acc.Tags()["tensors"]
    assert not any("already hold" in line for line in lines)
    with Study(tmp_path / "s", StudySettings(progress=False, device="cpu", tracker="tensorboard"), log=lines.append) as study:
        study.train(spec)  # reused again: its events are there, and one line says so
    assert_mirrors(run)  # not written twice (a step logged twice fails events())
    (said,) = [line for line in lines if "already hold" in line]
    assert said.startswith("--tracker tensorboard: reused runs (e.g. r) already hold their metrics") and "\n" not in said
