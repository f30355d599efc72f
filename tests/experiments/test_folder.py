"""Experiment folders are sameloss's only where its marker says so (issue 20, items 2, 3, 4
and 8): ``--fresh`` deletes nothing of a user's, ``reproduce`` never deletes a folder
without sameloss's marker, two processes never write one experiment, a full disk is one
line, and a bad ``--out`` is one line."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import pytest

from sameloss import files
from sameloss.cli import main
from sameloss.errors import UserError
from sameloss.experiments.engine.core import Study, StudySettings
from sameloss.experiments.engine.runspec import RunSpec
from helpers.processes import ENV, Holder, error_lines, run_cli

STEPS = ["reproduce", "steps", "--scale", "smoke", "--no-progress"]
RUN = (("steps", 2), ("batch_size", 8), ("model.size", "micro"), ("language.name", "hmm"),
       ("language.size", "micro"), ("eval.n_sentences", 16), ("optim.warmup_steps", 1), ("device", "cpu"),
       ("save_every", 100), ("log_every", 1))


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def the_error(capsys) -> str:
    """The one error line: stderr holds nothing else (reproduce's headings and progress go
    to stdout when stderr is not a terminal, issue 40)."""
    err = capsys.readouterr().err
    errors = error_lines(err)
    assert len(errors) == 1 and err.strip().splitlines() == errors, err
    return errors[0]


def figure_files(root: Path) -> list[str]:
    """The figures and their plotted numbers (``<stem>.data.csv``) in an experiment folder."""
    found = sorted(p.name for p in [*root.glob("*.png"), *root.glob("*.data.csv")])
    assert len(found) % 2 == 0 and found
    return found


@pytest.fixture
def copy(steps_smoke, tmp_path) -> Path:
    """A copy of a finished ``reproduce steps --scale smoke`` (the folder holding steps-smoke/)."""
    out = tmp_path / "out"
    shutil.copytree(steps_smoke, out)
    return out


# ---------------------------------------------------------------------------- item 2: markers, --fresh


def test_reproduce_marks_the_folder_and_lists_what_it_wrote(steps_smoke):
    root = steps_smoke / "steps-smoke"
    lines = (root / files.EXPERIMENT_MARKER).read_text().splitlines()
    assert sorted(lines[1:]) == figure_files(root) and lines[1:]
    assert not list(steps_smoke.glob(".*.lock"))  # the experiment's lock is released


def test_fresh_refuses_a_users_file_beside_the_report_and_deletes_nothing(copy, capsys):
    root = copy / "steps-smoke"
    (root / "thesis.tex").write_text("years of work")
    before = snapshot(copy)
    assert main([*STEPS, "--out", str(copy), "--fresh"]) == 2
    line = the_error(capsys)
    assert "steps-smoke/thesis.tex" in line and "--fresh deletes only what sameloss wrote" in line
    assert snapshot(copy) == before


@pytest.mark.parametrize("where", ["runs/mine", "embedded/mine", "seeds/seed0", "notes"])
def test_fresh_refuses_a_users_folder_anywhere_sameloss_writes(copy, capsys, where):
    root = copy / "steps-smoke"
    (root / where).mkdir(parents=True)
    (root / where / "data.txt").write_text("mine")
    before = snapshot(copy)
    assert main([*STEPS, "--out", str(copy), "--fresh"]) == 2
    assert f"steps-smoke/{where}" in the_error(capsys)
    assert snapshot(copy) == before


@pytest.mark.parametrize("where", ["my_analysis.txt", "checkpoints/step_0000024/notes.txt", "checkpoints/mine",
                                   "metrics-mine.jsonl"])
def test_fresh_keeps_a_users_file_inside_a_run_folder(copy, capsys, where):
    """A run folder is sameloss's, but a user's notes put in it are theirs (issue 40)."""
    run = copy / "steps-smoke" / "runs" / "pcfg-micro-sgd"
    (run / where).parent.mkdir(parents=True, exist_ok=True)
    (run / where).write_text("my analysis")
    before = snapshot(copy)
    assert main([*STEPS, "--out", str(copy), "--fresh"]) == 2
    line = the_error(capsys)
    assert f"steps-smoke/runs/pcfg-micro-sgd/{where}" in line and "--fresh deletes only what sameloss wrote" in line
    assert snapshot(copy) == before


def test_fresh_deletes_an_out_file_sameloss_wrote_in_a_run_folder_and_keeps_an_edited_one(copy, capsys):
    """``measure --out`` lists what it wrote in .sameloss-outputs: that file is sameloss's,
    until someone changes it."""
    root = copy / "steps-smoke"
    run = root / "runs" / "pcfg-micro-sgd"
    files.write_output(run / "measures.csv", "step,kl\n24,0.5\n")
    (run / "checkpoints" / ".tmp-step_0000030-999").mkdir()  # a save cut by a kill: sameloss's
    files.write_output(root / "table.csv", "a,b\n")
    with open(run / "measures.csv", "a") as f:
        f.write("my own row\n")
    assert main([*STEPS, "--out", str(copy), "--fresh"]) == 2
    assert "runs/pcfg-micro-sgd/measures.csv" in the_error(capsys)
    files.write_output(run / "measures.csv", "step,kl\n24,0.5\n", force=True)
    with Study(root, StudySettings(progress=False), fresh=True):
        assert [p.name for p in root.iterdir()] == [files.EXPERIMENT_MARKER]


def test_fresh_deletes_a_folder_that_holds_only_sameloss_outputs(copy):
    root = copy / "steps-smoke"
    (root / ".tmp-report.md-x1y2").write_text("a killed atomic write")  # sameloss's leftover
    (root / "runs" / ".pcfg-micro-adamw.lock").write_text("123")  # a killed run's lock file
    with Study(root, StudySettings(progress=False), fresh=True):
        assert [p.name for p in root.iterdir()] == [files.EXPERIMENT_MARKER]


def test_fresh_deletes_what_the_launchers_and_trackers_wrote(copy):
    """A launched experiment also holds submitit's files, the lock under which workers
    merge their rows, and each run's tracker events: all sameloss's."""
    root = copy / "steps-smoke"
    (root / "submitit").mkdir()
    (root / "submitit" / "4242_0_log.err").write_text("a worker's log")
    (root / ".measurements.json.lock").write_text("")  # files.update_lock leaves it
    run = next(p for p in sorted((root / "runs").iterdir()) if p.is_dir())
    (run / "tb").mkdir()
    (run / "tb" / "events.out.tfevents.1.host").write_bytes(b"events")
    with Study(root, StudySettings(progress=False), fresh=True):
        assert [p.name for p in root.iterdir()] == [files.EXPERIMENT_MARKER]


def test_fresh_never_deletes_a_seed_a_shard_is_running(copy, capsys):
    """A ``reproduce --seeds`` shard holds its seed folder's lock, not the experiment's."""
    root = copy / "steps-smoke"
    with Study(root / "seeds" / "seed0", StudySettings(progress=False)):  # a seed sub-study (marked)
        pass
    before = snapshot(copy)
    with Holder(root / "seeds" / "seed0", copy.parent / "scratch") as holder:
        assert main([*STEPS, "--out", str(copy), "--fresh"]) == 2
        assert f"pid {holder.pid}" in the_error(capsys)
    assert snapshot(copy) == before


def test_fresh_deletes_a_seed_studys_cost_record_and_names_a_users_file_beside_it(copy, capsys):
    """Issue 63 (item 1): ``--fresh`` on a finished isoloss study always refused, naming the
    ``seeds/seed0/cost.json`` sameloss itself wrote (``walk.keep_first_cost``); where a file
    of the user's was there too, the line named ``cost.json`` instead of it."""
    from sameloss.experiments.engine.walk import UnitRecord, keep_first_cost

    root = copy / "steps-smoke"
    for n in (0, 1):
        with Study(root / "seeds" / f"seed{n}", StudySettings(progress=False)):  # a seed's sub-study (marked)
            pass
        keep_first_cost(root / "seeds" / f"seed{n}", UnitRecord(f"seed {n}", cpu={}, cpu_seconds=1.5), print)
    (root / "seeds" / "seed1" / "notes.txt").write_text("mine")
    before = snapshot(copy)
    assert main([*STEPS, "--out", str(copy), "--fresh"]) == 2
    error = the_error(capsys)
    assert "steps-smoke/seeds/seed1/notes.txt" in error and "cost.json" not in error and "more" not in error
    assert snapshot(copy) == before
    (root / "seeds" / "seed1" / "notes.txt").unlink()
    with Study(root, StudySettings(progress=False), fresh=True):
        assert [p.name for p in root.iterdir()] == [files.EXPERIMENT_MARKER]


@pytest.mark.parametrize("table", ["measured.csv", "costs.csv", "report.md"])
def test_a_folder_where_sameloss_writes_a_table_is_one_line_before_anything_runs(copy, capsys, table):
    """Issue 63 (item 2): ``measured.csv`` or ``costs.csv`` replaced by a folder, then
    ``reproduce`` again: a 24-line ``IsADirectoryError`` traceback and exit 1 when the
    table was written, after the study. Now one line naming it, before anything runs, and
    the folder (the user's) is kept, with ``--fresh`` too."""
    root = copy / "steps-smoke"
    (root / table).unlink(missing_ok=True)  # (steps writes no costs.csv: its units have no CPU record)
    (root / table).mkdir()
    (root / table / "mine.txt").write_text("mine")
    (root / "measurements.json").unlink()  # were anything to run, it would run before the tables
    before = snapshot(copy)
    for fresh in ([], ["--fresh"]):
        assert main([*STEPS, "--out", str(copy), *fresh]) == 2
        assert f"steps-smoke/{table} is a folder" in the_error(capsys)
        assert snapshot(copy) == before


def test_the_atomic_writer_refuses_a_folder_at_its_path(tmp_path):
    """Under every writer (a file the study writes later, a cache): a folder at the path is
    one line naming it, and is kept."""
    (tmp_path / "table.csv").mkdir()
    with pytest.raises(UserError, match=r"table.csv: a folder is there"):
        files.atomic_write_text(tmp_path / "table.csv", "a,b\n")
    assert (tmp_path / "table.csv").is_dir() and [p.name for p in tmp_path.iterdir()] == ["table.csv"]


def test_lines_a_user_added_to_the_report_are_kept_and_named(copy, capsys):
    """Issue 63 (noted): lines appended to ``report.md`` were dropped silently by a rerun
    (and deleted by ``--fresh``). The report's sha256 is listed when it is written; a
    changed report stops the rerun before anything runs, in one line naming it, and is
    kept; restored, the rerun works."""
    report = copy / "steps-smoke" / "report.md"
    written = report.read_text()
    report.write_text(written + "\nMy reading of the figure: ...\n")
    (copy / "steps-smoke" / "measurements.json").unlink()  # were anything to run, it would run first
    before = snapshot(copy)
    for fresh in ([], ["--fresh"]):
        assert main([*STEPS, "--out", str(copy), *fresh]) == 2
        assert f"{report} was changed since sameloss wrote it" in the_error(capsys)
        assert snapshot(copy) == before
    report.write_text(written)
    assert main([*STEPS, "--out", str(copy)]) == 0


def test_fresh_on_a_symlink_is_one_line_and_deletes_nothing(copy, tmp_path, capsys):
    real = tmp_path / "elsewhere"
    (copy / "steps-smoke").rename(real)
    (copy / "steps-smoke").symlink_to(real)
    before = snapshot(real)
    assert main([*STEPS, "--out", str(copy), "--fresh"]) == 2
    assert "symbolic link" in the_error(capsys)
    assert snapshot(real) == before and (copy / "steps-smoke").is_symlink()


def test_reproduce_never_deletes_a_users_folder_at_a_run_name(tmp_path):
    """Study.train removed ``runs/<name>/`` when it held no complete checkpoint."""
    study = Study(tmp_path / "exp", StudySettings(progress=False))
    mine = study.runs_dir / "r"
    mine.mkdir(parents=True)
    (mine / "notes.txt").write_text("mine")
    with pytest.raises(UserError, match="not a sameloss run folder"):
        study.train(RunSpec("r", RUN))
    assert (mine / "notes.txt").read_text() == "mine"


def test_a_started_run_without_a_checkpoint_is_started_again(tmp_path):
    """A marked run folder with no complete checkpoint holds nothing to keep: it is redone."""
    study = Study(tmp_path / "exp", StudySettings(progress=False))
    run = study.runs_dir / "r"
    run.mkdir(parents=True)
    files.mark(run, files.RUN_MARKER, "sameloss run r")
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    info = study.train(RunSpec("r", RUN))
    assert info.status == "trained" and (run / "summary.json").is_file()


def test_an_unmarked_folder_holding_a_users_file_is_refused_without_fresh_too(tmp_path, capsys):
    root = tmp_path / "steps-smoke"
    root.mkdir()
    (root / "report.md").write_text("my own report")
    (root / "thesis.tex").write_text("years of work")
    before = snapshot(tmp_path)
    assert main([*STEPS, "--out", str(tmp_path)]) == 2
    line = the_error(capsys)
    assert "is not an experiment folder" in line and "thesis.tex" in line
    assert snapshot(tmp_path) == before and sorted(p.name for p in tmp_path.iterdir()) == ["steps-smoke"]


def test_a_folder_made_before_the_marker_is_reused_and_adopted(copy, capsys):
    """Every entry is one sameloss writes (the figures: those its report.md names): the
    runs are reused, the folder is marked; --fresh may then redo it."""
    root = copy / "steps-smoke"
    (root / files.EXPERIMENT_MARKER).unlink()
    with Study(root, StudySettings(progress=False)):  # adopted: the figures its report names are listed as sameloss's
        assert sorted((root / files.EXPERIMENT_MARKER).read_text().splitlines()[1:]) == figure_files(root)
    (root / files.EXPERIMENT_MARKER).unlink()
    assert main([*STEPS, "--out", str(copy)]) == 0
    assert (root / files.EXPERIMENT_MARKER).is_file()
    assert "trained" not in (root / "runs.csv").read_text()  # every run reused
    (root / files.EXPERIMENT_MARKER).unlink()
    (root / "thesis.tex").write_text("years of work")
    assert main([*STEPS, "--out", str(copy), "--fresh"]) == 2
    assert "thesis.tex" in the_error(capsys) and (root / "thesis.tex").exists()


def test_a_legacy_report_names_its_figures_data_files_and_formats_but_no_other_link(tmp_path):
    """The caption's links beside a figure it embeds are sameloss's; any other link (a
    user's notes in a report.md) is not."""
    from sameloss.experiments.engine.folder import legacy_outputs

    names = ["a.png", "a.data.csv", "a.pdf", "b.data.csv", "thesis.tex"]
    for name in names:
        (tmp_path / name).write_text("x")
    (tmp_path / "report.md").write_text(
        "![a](a.png)  \n**Figure 1.** What. (plotted numbers: [a.data.csv](a.data.csv); [PDF](a.pdf))\n"
        "see [my notes](thesis.tex) and [numbers](b.data.csv)\n")
    assert legacy_outputs(tmp_path) == {"a.png", "a.data.csv", "a.pdf"}


# ---------------------------------------------------------------------------- item 8: bad --out


@pytest.mark.parametrize("case", ["out-is-a-file", "experiment-is-a-file"])
def test_an_out_or_experiment_folder_that_is_a_file_is_one_line(tmp_path, capsys, case):
    target = tmp_path / "file" if case == "out-is-a-file" else tmp_path / "steps-smoke"
    target.write_text("mine")
    out = tmp_path / "file" if case == "out-is-a-file" else tmp_path
    for fresh in ([], ["--fresh"]):
        assert main([*STEPS, "--out", str(out), *fresh]) == 2
        assert "not a folder" in the_error(capsys)
        assert target.read_text() == "mine" and sorted(p.name for p in tmp_path.iterdir()) == [target.name]


# ---------------------------------------------------------------------------- item 3: one process per folder


def test_a_second_reproduce_on_one_experiment_is_refused_naming_the_holder(tmp_path, capsys):
    root = tmp_path / "steps-smoke"
    with Holder(root, tmp_path / "scratch") as holder:
        assert main([*STEPS, "--out", str(tmp_path)]) == 2
        line = the_error(capsys)
        assert f"pid {holder.pid}" in line and "in use by another sameloss process" in line
    assert not root.exists()  # nothing written


def test_a_study_releases_its_lock_when_closed(tmp_path):
    study = Study(tmp_path / "exp", StudySettings(progress=False))
    assert files.holds_lock(tmp_path / "exp")
    study.close()
    assert not files.holds_lock(tmp_path / "exp")
    with Study(tmp_path / "exp", StudySettings(progress=False)):  # and a later study takes it
        pass


# ---------------------------------------------------------------------------- item 4: a full disk


def results_untimed(root: Path) -> list[dict]:
    """results.csv's rows, the timing column aside (a checkpoint measured again takes
    another time)."""
    with open(root / "results.csv", newline="") as f:
        return [{k: v for k, v in row.items() if k != "measure_seconds"} for row in csv.DictReader(f)]


@pytest.mark.parametrize("cut", ["measurements", "training"])
def test_a_full_disk_during_reproduce_is_one_line_and_the_rerun_works(copy, cut):
    """With a 4 kB file-size limit each larger write fails: while writing the measurements
    again (their rows gone), or while a run resumes training mid-way (its last checkpoints
    gone, issue 40: the progress lines printed before the error were on stderr). stderr
    holds the one line and nothing else, no temporary file stays, the earlier report is
    intact; after "freeing space" the rerun resumes and its results.csv is the same."""
    root = copy / "steps-smoke"
    report, results = (root / "report.md").read_bytes(), results_untimed(root)
    if cut == "measurements":
        (root / "measurements.json").unlink()
    else:
        run = root / "runs" / "pcfg-micro-sgd"
        (run / "summary.json").unlink()
        for step in sorted((run / "checkpoints").iterdir())[-2:]:
            shutil.rmtree(step)
    args = ["reproduce", "steps", "--scale", "smoke", "--out", str(copy)]  # with progress lines
    done = run_cli(args, file_size_limit=4096, env={**ENV, "SAMELOSS_PROGRESS_SECONDS": "0"})
    assert done.returncode == 2, done.stderr
    errors = error_lines(done.stderr)
    assert len(errors) == 1 and done.stderr.strip().splitlines() == errors, done.stderr
    assert "cannot write" in errors[0] and "File too large" in errors[0]
    if cut == "training":
        assert "runs/pcfg-micro-sgd/checkpoints/step_" in errors[0] and "pcfg-micro-sgd: 17/24 steps" in done.stdout
    assert not [p for p in copy.rglob("*") if p.name.startswith(".tmp-") or p.name.endswith(".tmp")]
    assert (root / "report.md").read_bytes() == report
    assert main([*STEPS, "--out", str(copy)]) == 0
    assert (root / "measurements.json").is_file() and results_untimed(root) == results


def test_a_full_disk_while_the_data_cache_is_built_names_the_file(tmp_path):
    """Issue 63 (item 9): with an empty data cache, ``reproduce steps`` first builds the
    causal language there; a full disk then said "File too large" and no path (the toy
    corpus was written with a plain ``write_text``). It names the file now, and leaves no
    temporary file."""
    cache = tmp_path / "cache"
    done = run_cli([*STEPS, "--out", str(tmp_path / "out")], file_size_limit=4096,
                   env={**ENV, "SAMELOSS_DATA": str(cache)})
    errors = error_lines(done.stderr)
    assert done.returncode == 2 and len(errors) == 1 and done.stderr.strip().splitlines() == errors, done.stderr
    assert errors[0].startswith(f"sameloss: error: cannot write {cache}/causal/") and \
        errors[0].endswith("/toy/corpus.txt: File too large"), errors[0]
    assert not [p for p in cache.rglob("*") if p.name.startswith(".tmp-")]


# ---------------------------------------------------------------------------- item 15: progress of cached work


def test_cached_checkpoints_show_no_rate(copy, capsys, monkeypatch):
    """Rows from measurements.json took no time: their "3.85e+03 checkpoint/s" meant nothing."""
    monkeypatch.setenv("SAMELOSS_PROGRESS_SECONDS", "0")
    assert main(["reproduce", "steps", "--scale", "smoke", "--out", str(copy)]) == 0
    out = capsys.readouterr().out  # progress on stdout: stderr is not a terminal here
    assert "checkpoint/s" not in out and "measure runs/" in out  # every row cached, none counted
    (copy / "steps-smoke" / "measurements.json").unlink()
    assert main(["reproduce", "steps", "--scale", "smoke", "--out", str(copy)]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if "checkpoint/s" in line]
    assert lines and len(lines) == len(set(lines))  # measured ones counted, each line once


def test_fresh_never_deletes_a_run_another_process_is_writing(copy, capsys):
    root = copy / "steps-smoke"
    run = next(p for p in sorted((root / "runs").iterdir()) if p.is_dir())
    before = snapshot(copy)
    with Holder(run, copy.parent / "scratch") as holder:
        assert main([*STEPS, "--out", str(copy), "--fresh"]) == 2
        assert f"pid {holder.pid}" in the_error(capsys)
    assert snapshot(copy) == before
