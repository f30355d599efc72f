"""Launchers (``experiments/engine/launch.py``): the same results in this process, in local worker
processes and through the Slurm path (submitit's DebugExecutor); a GPU per worker (on a
mocked device count); the threads policy in every worker; the Slurm submission built from
the flags (the sbatch text submitit writes, sent to a stand-in ``sbatch``); a preempted unit
resumed bit-identically; seed shards, their locks, and the report that reuses them."""

from __future__ import annotations

import csv
import dataclasses
import functools
import itertools
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from sameloss.cli import main
from sameloss.errors import UserError
from sameloss.experiments import Job, Options, reproduce
from sameloss.experiments.engine.core import Study, StudySettings
from sameloss.experiments.engine.dispatch import execute_job
from sameloss.experiments.engine.runspec import RunSpec
from sameloss.experiments.engine.declare import run_unit
from sameloss.experiments.engine.dispatch import run_units
from sameloss.experiments.engine.slurm import Slurm
from sameloss.experiments.engine.launch import (LaunchOptions, Local, WorkerJob, default_workers,
    format_seeds, parse_seeds, worker_devices)
from sameloss.experiments.engine import study_log
from sameloss.experiments.recipes import isoloss
from sameloss.measures.run import MeasureSpec
from sameloss.training import load_checkpoint, pretrain
from sameloss.training.checkpoint import complete_checkpoints
from sameloss.training.distributed import process_device


TIMING = ("measure_seconds", "seconds")


def results(path: Path) -> list[dict]:
    """A results file without its timing columns (they differ between calls)."""
    with path.open(newline="") as f:
        return [{k: v for k, v in r.items() if k not in TIMING} for r in csv.DictReader(f)]


def statuses(root: Path) -> dict[str, str]:
    with (root / "runs.csv").open(newline="") as f:
        return {r["run"]: r["status"] for r in csv.DictReader(f)}


# ---- a GPU per worker, the threads policy ------------------------------------------------
def test_each_worker_gets_its_own_gpu_on_a_mocked_device_count():
    assert worker_devices(2, {}, device_count=2) == ["0", "1"]
    assert worker_devices(5, {}, device_count=2) == ["0", "1", "0", "1", "0"]  # more workers than GPUs
    # a parent restricted to GPUs 2 and 5 hands out those, not 0 and 1
    assert worker_devices(3, {"CUDA_VISIBLE_DEVICES": "2,5"}, device_count=2) == ["2", "5", "2"]
    assert worker_devices(2, {"CUDA_VISIBLE_DEVICES": "GPU-a1,GPU-b2"}, device_count=2) == ["GPU-a1", "GPU-b2"]
    assert worker_devices(3, {}, device_count=0) == [None, None, None]  # no GPU: nothing is restricted
    assert default_workers(threads=1, device_count=4, cpu_count=64) == 32  # 8 a GPU (WORKERS_PER_GPU)
    assert default_workers(threads=1, device_count=1, cpu_count=16) == 8  # a small model shares the card
    assert default_workers(threads=4, device_count=1, cpu_count=16) == 4  # as the host's cores allow
    assert default_workers(threads=8, device_count=4, cpu_count=16) == 4  # but one a GPU at least
    assert default_workers(threads=2, device_count=0, cpu_count=8) == 4  # one per --threads cores
    assert default_workers(threads=4, device_count=0, cpu_count=2) == 1


def test_under_torchrun_each_process_takes_its_local_rank(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert process_device(torch.device("cuda"), world_size=4) == torch.device("cuda", 3)
    assert process_device(torch.device("cpu"), world_size=4) == torch.device("cpu")
    assert process_device(torch.device("cuda"), world_size=1) == torch.device("cuda")  # one process: as resolved


def test_local_workers_see_their_gpu_and_apply_the_threads_policy(tmp_path):
    # int("7") stands in for a unit: what matters is the environment each worker reports
    jobs = [WorkerJob(functools.partial(int, "7"), threads=threads, name=f"job {i}") for i, threads in enumerate((1, 2))]
    launcher = Local(tmp_path / "submitit", workers=2, threads=1, devices=worker_devices(2, {}, device_count=2))
    lines = []
    out = launcher.run(jobs, lines.append)
    assert [o.value for o in out] == [7, 7] and all(o.error is None for o in out)
    # both start at once, one on each GPU
    assert [o.worker["cuda_visible_devices"] for o in out] == ["0", "1"]
    assert [o.worker["threads"] for o in out] == [1, 2]  # each worker applies its job's --threads
    assert [o.worker["omp_num_threads"] for o in out] == ["1", "1"]  # libgomp's count: the launcher's
    assert len({o.worker["pid"] for o in out}) == 2 and os.getpid() not in {o.worker["pid"] for o in out}
    assert len(lines) == 2 and all("done" in line for line in lines)


def test_a_user_error_in_a_worker_comes_back_as_its_one_line():
    from sameloss.threads import configure_threads

    out = WorkerJob(functools.partial(configure_threads, 0), threads=1, name="bad unit")()  # raises UserError
    assert out.error == "--threads must be a whole number >= 1, got 0" and out.value is None
    assert out.worker["pid"] == os.getpid()  # called here, as a worker process would call it


def test_a_refused_unit_stops_the_study_with_its_name_and_line(tmp_path):
    from sameloss.experiments.engine.launchers import make_launcher

    launcher = make_launcher(LaunchOptions("slurm", slurm_cluster="debug"), tmp_path, "test")
    study = Study(tmp_path, StudySettings(progress=False), launcher=launcher)
    bad = run_unit(RunSpec("bad", (("language.name", "causal"),)), MeasureSpec(loss=True))
    with pytest.raises(UserError) as err:
        run_units(study, [bad])
    assert str(err.value) == "run bad: the causal language needs masking=single: its exact conditionals take one " \
        "masked position per sentence (m masked positions cost K^m forward passes)"
    assert not (tmp_path / "runs" / "bad").exists()


def test_several_refused_units_are_one_line_and_the_log_says_why_each(tmp_path):
    """Issue 63 (item 5): a full disk during an isoloss study printed a line per seed (3)
    where the safety page promises one. The first unit's line says how many more stopped;
    the launcher's log line of each unit gives its reason."""
    from sameloss.experiments.engine.launchers import make_launcher

    launcher = make_launcher(LaunchOptions("slurm", slurm_cluster="debug"), tmp_path, "test")
    lines: list[str] = []
    study = Study(tmp_path, StudySettings(progress=False), launcher=launcher, log=lines.append)
    bad = [run_unit(RunSpec(name, (("language.name", "causal"),)), MeasureSpec(loss=True)) for name in ("a", "b")]
    with pytest.raises(UserError) as err:
        run_units(study, bad)
    assert len(str(err.value).splitlines()) == 1
    assert str(err.value).startswith("run a: the causal language needs masking=single") and \
        str(err.value).endswith(" (and 1 more unit(s) stopped; the log says why each)")
    failed = [line for line in lines if ": failed (" in line]
    assert len(failed) == 2 and all("the causal language needs masking=single" in line for line in failed), lines


def _processes_mentioning(text: str) -> list[int]:
    out = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and text in (proc / "cmdline").read_bytes().decode(errors="replace"):
                out.append(int(proc.name))
        except OSError:
            pass
    return out


def test_an_interrupted_local_study_leaves_no_worker_behind(tmp_path):
    folder = tmp_path / "submitit"
    quick = WorkerJob(functools.partial(int, "1"), threads=1, name="quick")
    # a worker busy for ten minutes (submitit's tasks ignore SIGTERM; SIGINT may be ignored too)
    slow = WorkerJob(functools.partial(exec, "import time; time.sleep(600)"), threads=1, name="slow")

    def interrupt(line):
        raise KeyboardInterrupt  # Ctrl-C (or SIGTERM, through the CLI) while the slow one runs

    with pytest.raises(KeyboardInterrupt):
        Local(folder, workers=2, threads=1, devices=[None, None]).run([quick, slow], interrupt)
    assert _processes_mentioning(str(folder)) == []


# ---- the same results through every launcher ---------------------------------------------
def test_dyck_gives_the_same_results_in_process_in_local_workers_and_through_the_slurm_path(tmp_path):
    reproduce(Job("dyck", "smoke", out=tmp_path / "inprocess"), Options(progress=False))
    reproduce(Job("dyck", "smoke", out=tmp_path / "local"),
              Options(progress=False, tracker="tensorboard", launch=LaunchOptions("local", workers=2)))
    reproduce(Job("dyck", "smoke", out=tmp_path / "slurm"),
              Options(progress=False, launch=LaunchOptions("slurm", slurm_cluster="debug", slurm_partition="gpu")))
    expected = results(tmp_path / "inprocess" / "dyck-smoke" / "results.csv")
    assert len(expected) >= 3
    measured = re.search(r"(\d+) rows measured", (tmp_path / "inprocess" / "dyck-smoke" / "report.md").read_text())
    for launcher in ("local", "slurm"):
        root = tmp_path / launcher / "dyck-smoke"
        assert results(root / "results.csv") == expected, launcher
        assert set(statuses(root).values()) == {"trained"}  # by the workers, this call
        # as many rows as in one process: none lost by a worker writing measurements.json
        # over another's (the report would have measured it again)
        assert re.search(r"(\d+) rows measured", (root / "report.md").read_text()).group(1) == measured.group(1)
    # the workers' logs are in the experiment's submitit folder
    assert list((tmp_path / "local" / "dyck-smoke" / "submitit").glob("*_log.err"))
    # the tracker mirrored each measured row at its step (read back from TensorBoard's files)
    from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator

    row = expected[0]
    tb = EventAccumulator(str(tmp_path / "local" / "dyck-smoke" / "runs" / row["run"] / "tb"),
                          size_guidance={SCALARS: 0})
    tb.Reload()
    (event,) = tb.Scalars("measure/trace_fisher")
    assert event.step == int(row["step"]) and event.value == pytest.approx(float(row["trace_fisher"]), rel=1e-6)


@pytest.mark.parametrize("experiment", ["figure1", "theory"])
def test_a_recipes_units_leave_its_report_nothing_to_train_or_measure(tmp_path, monkeypatch, experiment):
    """What a recipe declares as units is all its report trains and measures (otherwise
    the report would do that work in this process, one run after another, whatever the
    launcher). figure1 covers steps, sizes and algorithms, and the run they share."""
    import sameloss.experiments.engine.core as core
    import sameloss.experiments.engine.recipe as recipe_module
    import sameloss.measures.run as measures_run
    from sameloss import registry

    work = {"trained": 0, "measured": 0}
    at_report = {}
    real_pretrain, real_measure = core.pretrain, measures_run.measure_checkpoint

    def counted(key, real):
        def f(*args, **kwargs):
            work[key] += 1
            return real(*args, **kwargs)
        return f

    monkeypatch.setattr(core, "pretrain", counted("trained", real_pretrain))
    monkeypatch.setattr(measures_run, "measure_checkpoint", counted("measured", real_measure))
    recipe = registry.recipe(experiment)
    real_report = recipe.report

    def report(study, p, *args):
        at_report.update(work)
        return real_report(study, p, *args)

    monkeypatch.setattr(recipe, "report", report)
    # a recipe checked earlier in this process holds the report it had then (recipe._LOADED):
    # without a fresh check the patch above is not what runs, whatever ran before this test
    monkeypatch.setattr(recipe_module, "_LOADED", {})
    reproduce(Job(experiment, "smoke", out=tmp_path), Options(progress=False))
    assert at_report["trained"] > 0 and at_report["measured"] > 0
    assert work == at_report


def test_rows_two_workers_measure_at_once_are_both_kept(tmp_path):
    # two workers' studies of one experiment (a unit's study does not lock the experiment),
    # each holding what it read before the other wrote
    quiet = StudySettings(progress=False)
    first, second = Study(tmp_path, quiet, lock=False), Study(tmp_path, quiet, lock=False)
    first._memo("checkpoint", "runs/a/checkpoints/step_1", MeasureSpec(loss=True), "", lambda: {"kl": 0.1})
    second._memo("checkpoint", "runs/b/checkpoints/step_1", MeasureSpec(loss=True), "", lambda: {"kl": 0.2})
    with Study(tmp_path, StudySettings(progress=False)) as study:
        rows = study.cache
    assert sorted(row["kl"] for row in rows.values()) == [0.1, 0.2]


def _two_seed_smoke(monkeypatch):
    """isoloss at smoke with two seeds (the fewest its statistics take), for speed."""
    monkeypatch.setitem(isoloss.PRESETS, "smoke", dataclasses.replace(isoloss.PRESETS["smoke"], seeds=(0, 1)))


@pytest.fixture(scope="module")
def two_seed_results(tmp_path_factory):
    """``results.csv`` (timing columns aside) of the two-seed isoloss smoke study run in
    this process, uninterrupted: what every launcher, shard and rerun must give."""
    out = tmp_path_factory.mktemp("isoloss_two_seeds")
    with pytest.MonkeyPatch.context() as mp:
        _two_seed_smoke(mp)
        reproduce(Job("isoloss", "smoke", out=out), Options(progress=False))
    return results(out / "isoloss-smoke" / "results.csv")


HOLDER = textwrap.dedent("""
    import contextlib, sys, time
    from pathlib import Path
    from sameloss import files
    with contextlib.ExitStack() as stack:
        for folder in sys.argv[3:]:
            stack.enter_context(files.folder_lock(folder))
        Path(sys.argv[1]).write_text("held")
        while not Path(sys.argv[2]).exists():
            time.sleep(0.01)
""")


def _hold(tmp_path: Path, *folders: Path):
    """A process holding the locks of ``folders`` (as another sameloss process would)."""
    ready, release = tmp_path / "ready", tmp_path / "release"
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(ready), str(release), *map(str, folders)],
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    for _ in range(3000):  # a safety net for a broken child, not a timing assertion
        if ready.exists() or proc.poll() is not None:
            break
        time.sleep(0.01)
    assert ready.exists(), "the holder process did not take the locks"
    return proc, release


def test_isoloss_shards_then_a_local_report_give_the_in_process_results(tmp_path, monkeypatch, two_seed_results):
    _two_seed_smoke(monkeypatch)
    expected = two_seed_results

    root = tmp_path / "b" / "isoloss-smoke"
    # another process writes the experiment's report and runs seed 1: a shard on seed 1 is
    # refused, one on seed 0 runs beside them
    proc, release = _hold(tmp_path, root, root / "seeds" / "seed1")
    try:
        with pytest.raises(UserError, match=r"seeds/seed1 is in use by another sameloss process .*pid"):
            reproduce(Job("isoloss", "smoke", out=tmp_path / "b"), Options(progress=False, seeds=[1]))
        with pytest.raises(UserError, match=r"isoloss-smoke is in use by another sameloss process"):
            reproduce(Job("isoloss", "smoke", out=tmp_path / "b"), Options(progress=False))
        assert reproduce(Job("isoloss", "smoke", out=tmp_path / "b"), Options(progress=False, seeds=[0])) == root
    finally:
        release.write_text("go")
        proc.wait()
    assert not (root / "report.md").exists() and not (root / "seeds" / "seed1" / "runs").exists()
    assert (root / "seeds" / "seed0" / "runs" / "hmm-s0-base" / "summary.json").exists()

    # the report: seed 0 reused, the missing seed 1 run by a local worker
    reproduce(Job("isoloss", "smoke", out=tmp_path / "b"),
              Options(progress=False, launch=LaunchOptions("local", workers=2)))
    assert results(root / "results.csv") == expected
    status = statuses(root)
    assert {s for run, s in status.items() if "-s0-" in run} == {"reused"}
    assert {s for run, s in status.items() if "-s1-" in run} == {"trained"}


def test_seeds_are_refused_where_they_mean_nothing(tmp_path):
    with pytest.raises(UserError, match="dyck has no per-seed units"):
        reproduce(Job("dyck", "smoke", out=tmp_path), Options(progress=False, seeds=[0]))
    with pytest.raises(UserError, match=r"--seeds 7-9: not seeds of this study \(its seeds: 0-2\)"):
        reproduce(Job("isoloss", "smoke", out=tmp_path), Options(progress=False, seeds=[1, 7, 8, 9]))
    with pytest.raises(UserError, match="--fresh deletes the whole experiment"):
        reproduce(Job("isoloss", "smoke", out=tmp_path), Options(progress=False, seeds=[1], fresh=True))
    assert parse_seeds("0-3,8, 5") == [0, 1, 2, 3, 5, 8] and format_seeds([0, 1, 2, 3, 5, 8]) == "0-3,5,8"
    with pytest.raises(ValueError):
        parse_seeds("3-1")


@pytest.mark.parametrize("argv, message", [
    (["--workers", "2"], "--workers applies to --launcher local or slurm"),
    (["--launcher", "local", "--slurm-partition", "gpu"], "--slurm-partition applies to --launcher slurm"),
    (["--launcher", "slurm"], "--launcher slurm: no Slurm on this machine"),
    (["--launcher", "slurm", "--slurm-mem", "lots"], "is not a Slurm memory size"),
    (["--seeds", "x"], "is not a list of seeds"),
])
def test_launcher_flags_that_cannot_work_are_one_line(tmp_path, capsys, monkeypatch, argv, message):
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))  # no srun
    try:  # a usage error (argparse) exits, a UserError returns its code
        code = main(["reproduce", "dyck", "--scale", "smoke", "--out", str(tmp_path / "out"), *argv])
    except SystemExit as exc:
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err
    assert not (tmp_path / "out").exists()  # refused before anything is written


# ---- the Slurm submission ----------------------------------------------------------------
STAND_IN_SBATCH = """#!/bin/sh
cp "$1" "{record}"
echo "Submitted batch job 4242"
"""


def test_the_slurm_array_carries_the_flags(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    record = tmp_path / "submitted.sh"
    (bin_dir / "sbatch").write_text(STAND_IN_SBATCH.format(record=record))
    (bin_dir / "srun").write_text("#!/bin/sh\nexit 1\n")  # submitit looks for it; never run
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    options = LaunchOptions("slurm", workers=3, slurm_partition="gpu-long", slurm_time=90, slurm_gpus_per_task=1,
                            slurm_mem="32G")
    launcher = Slurm(tmp_path / "submitit", options, threads=2, job_name="sameloss-isoloss")
    jobs = [WorkerJob(functools.partial(int, str(i)), threads=2, name=f"seed {i}") for i in range(5)]
    submitted = launcher.submit(jobs)
    assert [j.job_id for j in submitted] == [f"4242_{i}" for i in range(5)]
    text = record.read_text()
    for line in ("#SBATCH --partition=gpu-long", "#SBATCH --time=90", "#SBATCH --gpus-per-task=1",
                 "#SBATCH --array=0-4%3", "#SBATCH --mem=32G", "#SBATCH --cpus-per-task=2",
                 "#SBATCH --job-name=sameloss-isoloss", "#SBATCH --nodes=1", "#SBATCH --ntasks-per-node=1",
                 "export OMP_NUM_THREADS=2"):
        assert line in text.splitlines(), line
    assert "#SBATCH --signal=USR2@" in text  # the preemption / timeout warning that requeues a task
    # each array task runs one of our jobs, in order
    from submitit.core.utils import DelayedSubmission

    for i, job in enumerate(submitted):
        delayed = DelayedSubmission.load(job.paths.submitted_pickle)
        assert isinstance(delayed.function, WorkerJob) and delayed.function.name == f"seed {i}"
    # no GPU asked for: no --gpus-per-task line
    cpu = Slurm(tmp_path / "submitit", dataclasses.replace(options, slurm_gpus_per_task=0), 1, "x")
    assert "slurm_gpus_per_task" not in cpu.parameters(5)
    assert cpu.parameters(2)["slurm_array_parallelism"] == 2  # never more at once than there are tasks


def test_the_gpus_a_task_asks_for_follow_the_studys_device(tmp_path, monkeypatch):
    """Issue 63: the smoke study (device cpu) asked --gpus-per-task=1, which sbatch refuses
    on a cluster without GPUs. By default: none for cpu, one for cuda; for auto, one where
    the partition has GPUs (sinfo's generic resources); --slurm-gpus-per-task wins."""
    from sameloss.experiments.engine.slurm import gpus_per_task

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    sinfo = bin_dir / "sinfo"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    slurm = LaunchOptions("slurm")
    assert gpus_per_task(slurm, "cpu") == 0 and gpus_per_task(slurm, "cuda") == 1
    assert gpus_per_task(dataclasses.replace(slurm, slurm_gpus_per_task=2), "cpu") == 2
    for listed, gpus in (("(null)\n", 0), ("(null)\ngpu:a100:4(S:0-1)\n", 1)):
        sinfo.write_text(f"#!/bin/sh\nprintf '{listed}'\n")
        sinfo.chmod(0o755)
        assert gpus_per_task(slurm, "auto") == gpus, listed


# ---- faults: the study's process, then a worker, killed with SIGKILL mid-run (issue 40) ----
TWO_SEEDS = ("import dataclasses\nfrom sameloss.experiments.recipes import isoloss\n"
             "isoloss.PRESETS['smoke'] = dataclasses.replace(isoloss.PRESETS['smoke'], seeds=(0, 1))\n")
FAULTS = Path(__file__).resolve().parents[1] / "helpers" / "faults"  # its sitecustomize.py kills on cue
FIRST_CUT, SECOND_CUT = "hmm-s1-late-adamw", "hmm-s1-late-short"  # seed 1's first two forks, in chain order


def _study_cli(out: Path, fault: str | None = None, wait: bool = True):
    """``sameloss reproduce isoloss --scale smoke --launcher local --workers 2`` (two seeds)
    in a child process, with ``SAMELOSS_TEST_FAULT=fault`` in its and its workers' environment
    (``helpers/faults/sitecustomize.py``: after a chosen checkpoint, a kill or a hang)."""
    from helpers.datacli import SRC, run_cli, start_cli

    args = ["reproduce", "isoloss", "--scale", "smoke", "--launcher", "local", "--workers", "2", "--out", str(out),
            "--no-progress"]
    env = {"PYTHONPATH": os.pathsep.join([str(FAULTS), SRC, *sys.path]), "SAMELOSS_TEST_FAULT": fault} \
        if fault else {}
    return (run_cli if wait else start_cli)(args, prelude=TWO_SEEDS, env=env)


def _cut_after_its_first_checkpoint(run: Path) -> Path:
    """``run`` holds one checkpoint and no summary: cut right after its first checkpoint
    (the fault's cue). Returns that checkpoint's weights file."""
    saved = complete_checkpoints(run)
    assert len(saved) == 1 and not (run / "summary.json").exists(), saved
    return saved[0] / "model.safetensors"


def test_a_killed_study_and_a_killed_worker_are_resumed_and_give_an_uninterrupted_runs_results(
        tmp_path, two_seed_results):
    """Deterministic: each kill comes right after a chosen checkpoint is saved, not after a sleep."""
    from helpers.datacli import alive, error_line, wait_for

    root = tmp_path / "isoloss-smoke"
    runs = root / "seeds" / "seed1" / "runs"
    # 1. the study's own process killed (SIGKILL) while both workers run: seed 1's worker
    # waits after FIRST_CUT's first checkpoint; the workers must not outlive the study
    hung = tmp_path / "hung"
    proc = _study_cli(tmp_path, f"{FIRST_CUT}:first:hang:{hung}", wait=False)
    try:
        wait_for(lambda: hung.exists() or proc.poll() is not None, "a worker at the chosen checkpoint", 600)
        assert proc.poll() is None, proc.communicate()
        holders = [int(p.read_text().split()[0]) for p in (root / "seeds").glob(".seed*.lock")]
    finally:
        proc.kill()
        proc.communicate()
    assert int(hung.read_text().split()[0]) in holders
    for pid in holders:  # each dies with the study (launch.die_with): none keeps a seed's lock
        wait_for(lambda: not alive(pid), f"worker {pid} to end with the study", 120)
    weights = _cut_after_its_first_checkpoint(runs / FIRST_CUT)
    inode = weights.stat().st_ino

    # 2. the rerun, with seed 1's worker killed (SIGKILL) after SECOND_CUT's first checkpoint:
    # the study ends in that unit's one line once the other worker has finished seed 0
    first = _study_cli(tmp_path, f"{SECOND_CUT}:first:kill")
    assert "seed 1: its worker ended without a result (killed?" in error_line(first)
    assert not (root / "results.csv").exists()
    assert (runs / FIRST_CUT / "summary.json").exists() and weights.stat().st_ino == inode  # resumed, not redone
    _cut_after_its_first_checkpoint(runs / SECOND_CUT)

    # 3. the rerun: what finished is reused, the cut run resumed, and the results are an
    # uninterrupted run's
    again = _study_cli(tmp_path)
    assert again.returncode == 0 and again.stderr == "", again.stderr
    assert results(root / "results.csv") == two_seed_results
    status = statuses(root)
    assert status[SECOND_CUT] == "resumed"
    assert {status[run] for run in ("hmm-s1-base", FIRST_CUT)} == {"reused"}
    assert {s for run, s in status.items() if "-s0-" in run} == {"reused"}  # the other worker finished seed 0
    assert {s for run, s in status.items() if "-s1-" in run} <= {"reused", "resumed", "trained"}  # (never started)
    assert re.search(r"[1-9]\d* taken from an earlier call", (root / "report.md").read_text())


def test_the_dry_run_prints_the_script_submitit_submits(tmp_path, monkeypatch, capsys):
    """--dry-run renders the array's job script from submitit's own sbatch writer, without a
    Slurm installation: exactly the text the real submission hands to sbatch (issue 39),
    with the account, QoS, constraint, extra options and an explicit --cpus-per-task."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    record = tmp_path / "submitted.sh"
    (bin_dir / "sbatch").write_text(STAND_IN_SBATCH.format(record=record))
    (bin_dir / "srun").write_text("#!/bin/sh\nexit 1\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    options = LaunchOptions("slurm", workers=2, slurm_partition="gpu", slurm_time=60, slurm_mem="16G",
                            slurm_account="proj42", slurm_qos="high", slurm_constraint="a100|h100",
                            slurm_extra=(("mail-type", "END"), ("exclude", "node7")), cpus_per_task=4)
    launcher = Slurm(tmp_path / "submitit", options, threads=1, job_name="sameloss-isoloss")
    script = launcher.script(5)  # no sbatch, no srun on the PATH yet
    for line in ("#SBATCH --account=proj42", "#SBATCH --qos=high", "#SBATCH --constraint='a100|h100'",
                 "#SBATCH --mail-type=END", "#SBATCH --exclude=node7", "#SBATCH --cpus-per-task=4",
                 "#SBATCH --array=0-4%2", "#SBATCH --partition=gpu", "#SBATCH --mem=16G", "#SBATCH --time=60",
                 "export OMP_NUM_THREADS=1"):
        assert line in script.splitlines(), line
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    launcher.submit([WorkerJob(functools.partial(int, str(i)), threads=1, name=f"seed {i}") for i in range(5)])
    assert record.read_text() == script  # what submitit really submits
    # without --cpus-per-task: one CPU per thread, as before
    assert "#SBATCH --cpus-per-task=3" in Slurm(tmp_path, LaunchOptions("slurm"), 3, "x").script(2).splitlines()
    # the command line: the script on stdout, exit 0, nothing written
    out = tmp_path / "out"
    assert main(["reproduce", "dyck", "--scale", "smoke", "--out", str(out), "--launcher", "slurm", "--dry-run",
                 "--slurm-account", "proj42", "--slurm-extra", "mail-type=END", "--cpus-per-task", "2"]) == 0
    printed = capsys.readouterr().out
    assert "#SBATCH --account=proj42" in printed and "#SBATCH --mail-type=END" in printed
    assert re.search(r"^#SBATCH --array=0-\d+%\d+$", printed, flags=re.M)
    assert not out.exists()


@pytest.mark.parametrize("args, says", [
    (["--launcher", "local", "--dry-run"], "--dry-run applies to --launcher slurm"),
    (["--launcher", "slurm", "--dry-run", "--slurm-extra", "time=5"], "sameloss sets --time itself"),
    (["--launcher", "slurm", "--dry-run", "--slurm-extra", "no-value"], "is not KEY=VALUE"),
    (["--launcher", "local", "--slurm-qos", "high"], "--slurm-qos applies to --launcher slurm"),
    (["--launcher", "slurm", "--dry-run", "--threads", "2", "--cpus-per-task", "1"], "fewer than the 2 threads"),
])
def test_slurm_flags_that_cannot_apply_are_one_line(tmp_path, capsys, args, says):
    try:
        code = main(["reproduce", "dyck", "--scale", "smoke", "--out", str(tmp_path / "o"), *args])
    except SystemExit as exc:  # a usage error, from argparse
        code = exc.code
    err = capsys.readouterr().err.strip()
    assert code == 2 and says in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "o").exists()


def test_study_progress_says_the_units_done_and_the_time_left(monkeypatch):
    """Off a terminal, each finished unit's line says how far the study is and how long the
    rest should take (a clock stand-in: 60 s per unit); on a terminal, a bar counts them."""
    from sameloss.experiments.engine import launch

    ticks = itertools.count(0.0, 60.0)  # each reading of the clock: a unit's 60 s later
    monkeypatch.setattr(launch.time, "monotonic", lambda: next(ticks))
    progress = study_log.StudyProgress(3, terminal=False)
    lines: list[str] = []
    jobs = [WorkerJob(functools.partial(int, str(i)), threads=1, name=f"seed {i}") for i in range(3)]
    assert [o.value for o in launch.InProcess().run(jobs, lines.append, progress.finished)] == [0, 1, 2]
    assert [re.sub(r"done in \d+ s", "done in N s", line) for line in lines] == [
        "[1/3] seed 0: done in N s; study 1/3 units, 60 s elapsed, about 2 min left",
        "[2/3] seed 1: done in N s; study 2/3 units, 2 min elapsed, about 60 s left",
        "[3/3] seed 2: done in N s; study 3/3 units, 3 min elapsed"]
    bar = study_log.StudyProgress(2, terminal=True)
    assert bar.finished() == "" and bar.bar.n == 1  # the bar shows it instead (tqdm: elapsed, time left)
    bar.close()


# ---- preemption --------------------------------------------------------------------------
def test_a_preempted_unit_is_resubmitted_and_resumes_bit_identically(tmp_path):
    spec = RunSpec("r", (("steps", 12), ("batch_size", 32), ("model.size", "micro"), ("eval.every", 6),
                         ("eval.n_sentences", 64), ("save_every", 4), ("log_every", 3), ("optim.warmup_steps", 3),
                         ("device", "cpu"), ("language.name", "hmm"), ("language.size", "micro")))
    mspec = MeasureSpec(loss=True, traces=("fisher",), loss_sentences=64, n_contexts=8, n_labels=2, repeats=1)

    def job(root: Path) -> WorkerJob:
        unit = run_unit(spec, mspec)
        return WorkerJob(functools.partial(execute_job, [unit], root, StudySettings(progress=False, device="cpu")),
                         threads=1, name=unit.name)

    whole = job(tmp_path / "whole")()
    # the preempted task was killed after step 5's checkpoint (as a kill would leave it)...
    pretrain(spec.config(), tmp_path / "preempted" / "runs" / "r", progress=False, stop_after=5)
    # ...and submitit requeues what the job's checkpoint() returns: the same job
    delayed = job(tmp_path / "preempted").checkpoint()
    assert isinstance(delayed.function, WorkerJob) and delayed.args == ()
    again = delayed.result()
    assert again.error is None and again.value[0].runs["r"].status == "resumed"
    assert whole.value[0].runs["r"].status == "trained"
    a = load_checkpoint(complete_checkpoints(tmp_path / "whole" / "runs" / "r")[-1]).model.state_dict()
    b = load_checkpoint(complete_checkpoints(tmp_path / "preempted" / "runs" / "r")[-1]).model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    rows = [Study(tmp_path / d, StudySettings(progress=False)).cache for d in ("whole", "preempted")]
    strip = [{k: {c: v for c, v in row.items() if c != "measure_seconds"} for k, row in cache.items()}
             for cache in rows]
    assert strip[0] == strip[1] and len(strip[0]) == 1


# ---- the main job's launcher -------------------------------------------------------------
def test_the_main_job_runs_its_seeds_on_the_cores_it_has():
    """``sameloss reproduce`` (no experiment, no --launcher) runs its seeds on local workers
    when submitit is there and the cores hold more than one worker; otherwise in process."""
    from sameloss.experiments.engine.launch import main_job_options

    assert main_job_options(None, 1, 0, 2, True) == LaunchOptions("local", 2)  # a 2-core CPU: 2 workers
    assert main_job_options(None, 1, 0, 1, True) == LaunchOptions()  # one core: in process
    assert main_job_options(None, 2, 0, 2, True) == LaunchOptions()  # --threads 2 on 2 cores: one worker
    assert main_job_options(None, 1, 0, 16, False) == LaunchOptions()  # no submitit
    assert main_job_options(None, 1, 2, 1, True) == LaunchOptions("local", 2)  # one worker a GPU at least
    assert main_job_options(None, 1, 1, 16, True) == LaunchOptions("local", 8)  # 8 share one GPU
    assert main_job_options(3, 1, 0, 1, True) == LaunchOptions("local", 3)  # --workers alone asks for local


def test_a_named_experiment_stays_in_process_and_the_main_job_follows_the_machine(monkeypatch):
    import argparse
    import os

    import torch

    from sameloss.experiments import cli as experiments_cli
    from sameloss.experiments.engine.launch import main_job_options

    parser = argparse.ArgumentParser()
    experiments_cli.add_reproduce_parser(parser.add_subparsers(dest="command"))
    named = parser.parse_args(["reproduce", "dyck"])
    assert experiments_cli._launch_options(named, experiments_cli._given(named)) == LaunchOptions()
    main_job = parser.parse_args(["reproduce"])
    expected = main_job_options(None, torch.get_num_threads(), torch.cuda.device_count(), os.cpu_count(), True)
    assert experiments_cli._launch_options(main_job, experiments_cli._given(main_job)).launcher == expected.launcher
    # a shard (--seeds) of the main job runs its seeds here unless a launcher is named
    shard = parser.parse_args(["reproduce", "--seeds", "0-1"])
    assert experiments_cli._launch_options(shard, experiments_cli._given(shard)).launcher == "inprocess"
    monkeypatch.setattr(os, "cpu_count", lambda: 1)
    assert experiments_cli._launch_options(main_job, experiments_cli._given(main_job)).launcher == "inprocess"
