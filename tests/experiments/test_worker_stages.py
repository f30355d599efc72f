"""The main log says what running local workers do (``study_log.WorkerStages``)."""

from __future__ import annotations

from types import SimpleNamespace

from sameloss.experiments.engine.study_log import WorkerStages, last_line


def test_a_worker_stage_is_logged_once_when_it_changes(tmp_path):
    out = tmp_path / "w.out"
    out.write_text("run hmm-s0-base: training 1000 steps\n")
    lines = []
    stages = WorkerStages(lines.append, every=0.0)
    job = SimpleNamespace(paths=SimpleNamespace(stdout=out))
    stages.report({"seed 0": job}, 0, 4)
    stages.report({"seed 0": job}, 0, 4)  # unchanged: not repeated
    with out.open("a") as f:
        f.write("measure runs/hmm-s0-base/checkpoints/step_0001000\n")
    stages.report({"seed 0": job}, 1, 4)
    assert lines == ["[0/4 done] seed 0: run hmm-s0-base: training 1000 steps", "[1/4 done] seed 0: measure runs/hmm-s0-base/checkpoints/step_0001000"]


def test_last_line_of_a_missing_or_empty_log_is_empty(tmp_path):
    assert last_line(None) == "" and last_line(tmp_path / "nope") == ""
    (tmp_path / "e").write_text("\n\n")
    assert last_line(tmp_path / "e") == ""


def test_stages_wait_their_interval():
    lines = []
    stages = WorkerStages(lines.append, every=3600.0)
    stages.report({"seed 0": SimpleNamespace(paths=SimpleNamespace(stdout=None))}, 0, 1)
    assert lines == []
