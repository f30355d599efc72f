"""The Slurm launcher against a real ``sbatch`` (issue 63): a one-node cluster of this machine,
started by ``scripts/slurm_local.sh start`` (``.ci/run`` starts it; CI sets ``CI=true``, and
there a missing cluster fails these tests instead of skipping them).

* the smoke isoloss study with default flags on a CPU-only cluster (no GPU asked for a CPU
  study), run as two shards then aggregated, gives the local launcher's numbers file for
  file — with one shard's task requeued by ``scontrol requeue`` mid-run (a preemption: it
  resumes) and the other's cancelled by ``scancel`` (its unit's one line; the aggregating
  run resumes it);
* a task over its time limit is reported with its unit (its seed) and its log;
* what ``sbatch`` refuses (a partition that does not exist, a feature no node has, more
  memory than a node has) is one line and exit 2, before any file is written. (A bad
  ``--slurm-account`` is refused the same way on a cluster that enforces accounts; this one
  keeps no accounting database, so it accepts any.)
"""

from __future__ import annotations

import csv
import functools
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from helpers.datacli import run_cli, start_cli, wait_for

# the files of the smoke study free of wall-clock numbers (runs.csv, costs.csv, runtime.csv,
# measured.csv and results.csv carry seconds)
SAME = ("differences.csv", "verdicts.csv", "gate.csv", "headroom.csv", "pairs.csv", "decided.csv", "regression.csv",
        "dose.csv", "dose_points.csv", "flatness_arms.csv", "flatness_trend.csv", "margins.csv", "sam_controls.csv",
        "size.csv", "forest.data.csv", "scatter.data.csv",
        "curves.data.csv")
STUDY = ["reproduce", "isoloss", "--scale", "smoke", "--no-progress"]


def _cluster_up() -> bool:
    if shutil.which("sbatch") is None:
        return False
    done = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True)
    return done.returncode == 0 and any(s in done.stdout for s in ("idle", "mixed", "alloc"))


@pytest.fixture(scope="module", autouse=True)
def cluster():
    if not _cluster_up():
        why = "no Slurm cluster here (bash scripts/slurm_local.sh start makes one of this machine)"
        if os.environ.get("CI"):
            pytest.fail(f"{why}: CI runs these tests, .ci/run starts it")
        pytest.skip(why)


def _untimed(path: Path) -> list[dict]:
    with path.open(newline="") as f:
        return [{k: v for k, v in r.items() if not k.endswith("seconds")} for r in csv.DictReader(f)]


def _task_log(root: Path, started: set[str]) -> Path:
    """The log of a task of ``root``'s array that started since ``started`` was taken."""
    found: list[Path] = []

    def new():
        found[:] = [p for p in (root / "submitit").glob("*_log.out") if p.name not in started]
        return bool(found)
    wait_for(new, "a Slurm task to start", seconds=600)
    return found[0]


def _checkpointed(seed_root: Path) -> bool:
    return any(seed_root.glob("runs/*/checkpoints/step_*/meta.json"))


def _one_error(done) -> str:
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and lines[0].startswith("sameloss: error: "), done.stderr
    return lines[0]


def test_shards_through_sbatch_requeued_and_cancelled_give_the_local_launchers_study(tmp_path):
    local, cluster = tmp_path / "local", tmp_path / "slurm"
    done = run_cli([*STUDY, "--launcher", "local", "--out", str(local)])
    assert done.returncode == 0, done.stderr
    root = cluster / "isoloss-smoke"
    # shard 1, seed 0: its task requeued once it has a checkpoint (a preemption); it resumes
    shard = start_cli([*STUDY, "--launcher", "slurm", "--seeds", "0", "--out", str(cluster)])
    log = _task_log(root, set())
    task = log.name[:-len("_0_log.out")]  # one unit: a job of its own (submitit submits no array of one)
    wait_for(lambda: _checkpointed(root / "seeds" / "seed0"), "seed 0's first checkpoint", seconds=600)
    subprocess.run(["scontrol", "requeue", task], check=True)
    out, err = shard.communicate(timeout=1200)
    assert shard.returncode == 0 and not err, err
    assert "DUE TO JOB REQUEUE" in log.with_name(log.name.replace(".out", ".err")).read_text()
    # shard 2, seeds 1-2: seed 1's task cancelled once it has a checkpoint: its unit's one line
    started = {p.name for p in (root / "submitit").glob("*_log.out")}
    shard = start_cli([*STUDY, "--launcher", "slurm", "--seeds", "1-2", "--out", str(cluster)])
    log = _task_log(root, started)
    array = log.name.split("_")[0]
    wait_for(lambda: _checkpointed(root / "seeds" / "seed1"), "seed 1's first checkpoint", seconds=600)
    subprocess.run(["scancel", f"{array}_0"], check=True)
    out, err = shard.communicate(timeout=1200)
    lines = err.strip().splitlines()
    assert shard.returncode == 2 and len(lines) == 1, err
    assert re.match(rf"sameloss: error: seed 1: its Slurm task {array}_0 ended CANCELLED \(cancelled\) without a "
                    rf"result; log: {re.escape(str(root / 'submitit'))}/{array}_0_0_log.err; run the same command",
                    lines[0]), lines[0]
    # the study with default flags: the cancelled seed resumed, the others reused; the report's
    # numbers are the local launcher's, file for file
    done = run_cli([*STUDY, "--launcher", "slurm", "--out", str(cluster)])
    assert done.returncode == 0 and not done.stderr, done.stderr
    assert "#SBATCH --gpus-per-task" not in "".join(p.read_text() for p in (root / "submitit").glob("*.sh"))
    for name in SAME:
        assert (root / name).read_bytes() == (local / "isoloss-smoke" / name).read_bytes(), name
    assert _untimed(root / "results.csv") == _untimed(local / "isoloss-smoke" / "results.csv")


def test_a_task_over_its_time_limit_is_reported_with_its_unit_and_log(tmp_path):
    """``--slurm-time 1``: submitit's warning signal (90 s before the end) comes at once, so
    the task is requeued (``--slurm-requeues 1``), then ends at the next; its unit's line
    names the limit and the task's log."""
    from sameloss.experiments.engine.launch import LaunchOptions, WorkerJob
    from sameloss.experiments.engine.launchers import make_launcher

    launcher = make_launcher(LaunchOptions("slurm", slurm_time=1, slurm_requeues=1), tmp_path, "sameloss-test",
                             device="cpu")
    lines: list[str] = []
    out = launcher.run([WorkerJob(functools.partial(time.sleep, 600), threads=1, name="seed 3")], lines.append)
    error = out[0].error
    assert error is not None and "ran out of its time limit (--slurm-time) once more than it may be requeued" in error
    log = Path(error.split("; log: ")[1].split(";")[0])
    assert log.is_file() and log.parent == tmp_path / "submitit"
    assert any(line.startswith("[1/1] seed 3: failed") and "ran out of its time limit" in line for line in lines)
    text = log.read_text()
    assert text.count("DUE TO JOB REQUEUE") == 1 or "requeu" in text.lower()  # requeued once, then ended


@pytest.mark.parametrize("flags, says", [
    (["--slurm-partition", "nowhere"], "invalid partition specified: nowhere"),
    (["--slurm-constraint", "no-such-feature"], "Invalid feature specification"),
    (["--slurm-mem", "100000G"], "Requested node configuration is not available"),
    (["--slurm-gpus-per-task", "1"], "Invalid generic resource (gres) specification"),
])
def test_what_sbatch_refuses_is_one_line_before_any_file(tmp_path, flags, says):
    done = run_cli(["reproduce", "steps", "--scale", "smoke", "--launcher", "slurm", *flags, "--out",
                    str(tmp_path / "out")])
    error = _one_error(done)
    assert error.startswith("sameloss: error: sbatch refuses the job array (") and says in error, error
    assert not (tmp_path / "out").exists()
