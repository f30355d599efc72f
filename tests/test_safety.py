"""Nothing a user points sameloss at is lost (issue 10): safe paths, damaged files,
validation before any folder is made, clean interrupts, logs that read the same after a
resume, plain progress lines in log files.

Every case goes through ``sameloss.cli.main`` as a user would and checks the exit code,
that the error is one line naming the problem, and that the files around are unchanged.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from sameloss import config as configlib
from sameloss.cli import main
from sameloss.training import PretrainConfig, pretrain
from sameloss.training.checkpoint import complete_checkpoints

TINY = ["batch_size=16", "model.size=micro", "language.name=hmm", "language.preset=micro", "eval.every=0",
        "eval.n_sentences=32", "optim.warmup_steps=2", "device=cpu"]


def tiny_config(*overrides: str) -> PretrainConfig:
    return configlib.load(PretrainConfig, None, [*TINY, *overrides])


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` with its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("sameloss: error: "), err
    return err[0]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """``finished``: 6 steps with checkpoints 3 and 6 and summary.json; ``interrupted``:
    8 steps stopped after step 6, checkpoints 3 and 6, no summary."""
    root = tmp_path_factory.mktemp("safety_runs")
    pretrain(tiny_config("name=finished", "steps=6", "checkpoints=[3]", "log_every=2"), root / "finished",
             progress=False)
    pretrain(tiny_config("name=interrupted", "steps=8", "checkpoints=[3]", "log_every=2", "save_every=100"),
             root / "interrupted", progress=False, stop_after=6)
    return root


def copy_run(runs: Path, name: str, tmp_path: Path) -> Path:
    out = tmp_path / "runs"
    out.mkdir(exist_ok=True)
    shutil.copytree(runs / name, out / name)
    return out / name


# ---------------------------------------------------------------------------- 1. name and --fresh


@pytest.mark.parametrize("name", ["", ".", "..", "../victim", "a/b", "a\\b", "/ABS/victim"])
def test_run_name_must_be_one_plain_folder_name(tmp_path, capsys, name):
    out, victim = tmp_path / "out", tmp_path / "victim"
    (out / "other-run").mkdir(parents=True)
    (out / "other-run" / "config.toml").write_text("# resolved config of run other-run\n")
    victim.mkdir()
    (victim / "thesis.tex").write_text("years of work")
    before = snapshot(tmp_path)
    name = name.replace("/ABS/victim", str(victim))
    assert main(["pretrain", f"name={name}", "--fresh", "--out", str(out), *TINY, "steps=2", "--no-progress"]) == 2
    assert "name must be a plain folder name" in one_error_line(capsys)
    assert snapshot(tmp_path) == before


def test_fresh_refuses_a_folder_that_is_not_a_run(tmp_path, capsys):
    out = tmp_path / "out"
    (out / "notes").mkdir(parents=True)
    (out / "notes" / "thesis.tex").write_text("years of work")
    assert main(["pretrain", "name=notes", "--fresh", "--out", str(out), *TINY, "steps=2", "--no-progress"]) == 2
    assert "is not a sameloss run folder" in one_error_line(capsys)
    assert (out / "notes" / "thesis.tex").read_text() == "years of work"


def test_fresh_replaces_a_run_with_the_marker_or_the_old_config_header(runs, tmp_path, capsys):
    run = copy_run(runs, "finished", tmp_path)
    assert (run / ".sameloss-run").is_file()
    args = ["pretrain", "name=finished", "--fresh", "--out", str(run.parent), *TINY, "steps=2", "--no-progress"]
    assert main(args) == 0
    assert json.loads((run / "summary.json").read_text())["step"] == 2
    (run / ".sameloss-run").unlink()  # a run made before the marker existed
    assert main(args) == 0
    assert (run / ".sameloss-run").is_file()


def test_fresh_with_a_bad_setting_keeps_the_old_run(runs, tmp_path, capsys):
    run = copy_run(runs, "finished", tmp_path)
    before = snapshot(run)
    assert main(["pretrain", "name=finished", "--fresh", "--out", str(run.parent), *TINY,
                 "language.preset=nonexistent", "steps=2", "--no-progress"]) == 2
    assert "nonexistent" in one_error_line(capsys)
    assert snapshot(run) == before


# ---------------------------------------------------------------------------- 2. embed --out


def test_embed_refuses_an_existing_out_without_force_and_replaces_only_its_own(runs, tmp_path, capsys):
    ckpt = complete_checkpoints(runs / "finished")[-1]
    out = tmp_path / "big"
    assert main(["embed", str(ckpt), "--out", str(out), "--width-factor", "2"]) == 0
    capsys.readouterr()
    before = snapshot(out)
    assert main(["embed", str(ckpt), "--out", str(out), "--width-factor", "3"]) == 2
    assert "already exists" in one_error_line(capsys) and snapshot(out) == before
    assert main(["embed", str(ckpt), "--out", str(out), "--width-factor", "3", "--force"]) == 0
    meta = json.loads(next(out.rglob("meta.json")).read_text())
    assert meta["embedded_from"]["width_factor"] == 3
    capsys.readouterr()
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "data.csv").write_text("1,2\n")
    assert main(["embed", str(ckpt), "--out", str(mine), "--width-factor", "2", "--force"]) == 2
    assert "not written by sameloss embed" in one_error_line(capsys)
    assert (mine / "data.csv").read_text() == "1,2\n" and len(list(mine.iterdir())) == 1
    assert not list(tmp_path.glob(".tmp-*"))


@pytest.mark.parametrize("where", ["run", "inside-run", "checkpoint"])
def test_embed_never_writes_into_a_run(runs, tmp_path, capsys, where):
    run = copy_run(runs, "finished", tmp_path)
    ckpt = complete_checkpoints(run)[0]
    out = {"run": run, "inside-run": run / "embedded", "checkpoint": complete_checkpoints(run)[-1]}[where]
    before = snapshot(run)
    assert main(["embed", str(ckpt), "--out", str(out), "--width-factor", "2", "--force"]) == 2
    assert "never writes into a run" in one_error_line(capsys)
    assert snapshot(run) == before


def test_embed_into_and_width_factor_conflict(runs, tmp_path, capsys):
    ckpt = complete_checkpoints(runs / "finished")[-1]
    with pytest.raises(SystemExit) as exc:
        main(["embed", str(ckpt), "--out", str(tmp_path / "x"), "--into", "t3-128", "--width-factor", "2"])
    assert exc.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


# ---------------------------------------------------------------------------- 3. --resume of a finished run


def test_resume_of_a_finished_run_says_so_and_changes_nothing(runs, tmp_path, capsys):
    run = copy_run(runs, "finished", tmp_path)
    before = snapshot(run)
    assert main(["pretrain", "name=finished", "--out", str(run.parent), *TINY, "steps=6", "checkpoints=[3]",
                 "log_every=2", "--resume", "--no-progress"]) == 0
    assert capsys.readouterr().out.strip() == f"{run} is complete (step 6 of 6); nothing to do"
    assert snapshot(run) == before


# ---------------------------------------------------------------------------- 4. measure --out


@pytest.mark.parametrize("kind", ["folder", "under-a-file"])
def test_measure_checks_the_output_path_before_measuring(runs, tmp_path, capsys, kind, monkeypatch):
    import sameloss.measures.run as run_module

    def never(*args, **kwargs):
        raise AssertionError("measured before checking --out")

    monkeypatch.setattr(run_module, "measure_checkpoint", never)
    target = tmp_path / "results"
    if kind == "folder":
        target.mkdir()
    else:
        target.write_text("not a folder")
        target = target / "m.csv"
    assert main(["measure", str(runs / "finished"), "--loss", "--out", str(target), "--no-progress"]) == 2
    assert str(target) in one_error_line(capsys)
    assert not [p for p in tmp_path.rglob("*") if p.name.endswith(".tmp") or p.name.startswith(".tmp")]


def test_a_failed_write_of_the_rows_leaves_no_temporary_file_and_keeps_the_old_results(tmp_path, monkeypatch):
    from sameloss.errors import UserError
    from sameloss.measures.run import write_rows

    out = tmp_path / "m.csv"
    out.write_text("old results\n")

    def full(*args):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    with pytest.raises(UserError, match="cannot write .*m.csv: No space left on device"):
        write_rows([{"step": 1, "loss": 2.0}], out)
    assert out.read_text() == "old results\n"
    assert [p.name for p in tmp_path.iterdir()] == ["m.csv"]


# ---------------------------------------------------------------------------- 5. damaged files


def _garbage(path: Path) -> None:
    path.write_bytes(bytes(range(256)) * 3)


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _wrong_shape(path: Path) -> None:
    from safetensors.torch import load_file
    tensors = load_file(str(path))
    name = next(iter(tensors))
    tensors[name] = torch.zeros(*(s + 1 for s in tensors[name].shape))
    save_file(tensors, str(path))


def _no_config(path: Path) -> None:
    meta = json.loads(path.read_text())
    del meta["config"]
    path.write_text(json.dumps(meta))


CHECKPOINT_DAMAGE = {
    "safetensors-truncated": ("model.safetensors", _truncate),
    "safetensors-garbage": ("model.safetensors", _garbage),
    "safetensors-empty": ("model.safetensors", lambda p: p.write_bytes(b"")),
    "safetensors-missing": ("model.safetensors", Path.unlink),
    "safetensors-wrong-shape": ("model.safetensors", _wrong_shape),
    "state-truncated": ("state.pt", _truncate),
    "state-garbage": ("state.pt", _garbage),
    "state-missing": ("state.pt", Path.unlink),
    "meta-garbage": ("meta.json", _garbage),
    "meta-empty": ("meta.json", lambda p: p.write_text("")),
    "meta-no-config": ("meta.json", _no_config),
}
WEIGHT_DAMAGE = [k for k, (f, _) in CHECKPOINT_DAMAGE.items() if f != "state.pt"]  # what measure/embed read


def damage(checkpoint: Path, kind: str) -> Path:
    name, how = CHECKPOINT_DAMAGE[kind]
    how(checkpoint / name)
    return checkpoint / name


@pytest.mark.parametrize("kind", WEIGHT_DAMAGE)
def test_measure_of_a_damaged_checkpoint_is_one_line_naming_the_file(runs, tmp_path, capsys, kind):
    run = copy_run(runs, "finished", tmp_path)
    bad = damage(complete_checkpoints(run)[-1], kind)
    assert main(["measure", str(bad.parent), "--loss", "--no-progress"]) == 2
    assert str(bad) in one_error_line(capsys)


@pytest.mark.parametrize("kind", WEIGHT_DAMAGE)
def test_measure_of_a_run_keeps_the_good_rows_and_names_the_damaged_checkpoint(runs, tmp_path, capsys, kind):
    run = copy_run(runs, "finished", tmp_path)
    good, last = complete_checkpoints(run)
    bad = damage(last, kind)
    table = tmp_path / "rows.json"
    assert main(["measure", str(run), "--loss", "--out", str(table), "--no-progress", "--json"]) == 2
    captured = capsys.readouterr()
    rows = json.loads(captured.out)
    assert [r["step"] for r in rows] == [3] and json.loads(table.read_text()) == rows
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and str(bad) in err[0] and "skipped" in err[0], err


@pytest.mark.parametrize("kind", WEIGHT_DAMAGE)
def test_embed_of_a_damaged_checkpoint_is_one_line_and_writes_nothing(runs, tmp_path, capsys, kind):
    run = copy_run(runs, "finished", tmp_path)
    bad = damage(complete_checkpoints(run)[-1], kind)
    out = tmp_path / "big"
    assert main(["embed", str(bad.parent), "--out", str(out), "--width-factor", "2"]) == 2
    assert str(bad) in one_error_line(capsys)
    assert not out.exists() and not list(tmp_path.glob(".tmp-*"))


RESUME = ["name=interrupted", *TINY, "steps=8", "checkpoints=[3]", "log_every=2", "save_every=100", "--resume",
          "--no-progress"]


@pytest.mark.parametrize("kind", list(CHECKPOINT_DAMAGE))
def test_resume_falls_back_to_the_newest_valid_checkpoint(runs, tmp_path, capsys, kind):
    run = copy_run(runs, "interrupted", tmp_path)
    older, newest = complete_checkpoints(run)
    bad = damage(newest, kind)
    assert main(["pretrain", "--out", str(run.parent), *RESUME]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(bad) in err[0] and f"resuming from {older} instead" in err[0], err
    # the run went on from step 3 to the end like an uninterrupted one
    whole = tmp_path / "whole"
    pretrain(tiny_config("name=interrupted", "steps=8", "checkpoints=[3]", "log_every=2", "save_every=100"),
             whole, progress=False)
    metrics = [json.loads(line)["train_loss"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    expected = [json.loads(line)["train_loss"] for line in (whole / "metrics.jsonl").read_text().splitlines()]
    assert metrics == expected


@pytest.mark.parametrize("kind", list(CHECKPOINT_DAMAGE))
def test_resume_with_no_valid_checkpoint_is_one_line(runs, tmp_path, capsys, kind):
    run = copy_run(runs, "interrupted", tmp_path)
    for checkpoint in complete_checkpoints(run):
        damage(checkpoint, kind)
    assert main(["pretrain", "--out", str(run.parent), *RESUME]) == 2
    line = one_error_line(capsys)
    assert "no valid checkpoint" in line and CHECKPOINT_DAMAGE[kind][0] in line


@pytest.mark.parametrize("name, text", [("config.toml", "[[[ not toml"), ("metrics.jsonl", "{\"step\": 1}\nxx\n"),
                                        ("metrics.jsonl", "\x00\xff garbage\n")])
def test_resume_with_a_damaged_run_file_names_it(runs, tmp_path, capsys, name, text):
    run = copy_run(runs, "interrupted", tmp_path)
    (run / name).write_text(text, encoding="latin-1")
    before = snapshot(run)
    assert main(["pretrain", "--out", str(run.parent), *RESUME]) == 2
    assert f"{run / name}" in one_error_line(capsys)
    assert snapshot(run) == before


def test_resume_drops_an_unfinished_last_metrics_line(runs, tmp_path, capsys):
    run = copy_run(runs, "interrupted", tmp_path)
    with (run / "metrics.jsonl").open("a") as f:
        f.write('{"step": 7, "train_lo')  # a kill or a full disk mid-write
    assert main(["pretrain", "--out", str(run.parent), *RESUME]) == 0
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [2, 4, 6, 8]


def test_a_full_disk_while_saving_a_checkpoint_is_one_line_and_leaves_nothing_half_written(tmp_path, capsys,
                                                                                           monkeypatch):
    import sameloss.training.checkpoint as ckpt

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ckpt, "save_model", full)
    out = tmp_path / "out"
    assert main(["pretrain", "name=r", "--out", str(out), *TINY, "steps=4", "save_every=2", "--no-progress"]) == 2
    line = one_error_line(capsys)
    assert "No space left on device" in line and "step_0000002" in line
    # nothing to resume was written: the new run's folder is gone, no temporary folder anywhere
    assert not (out / "r").exists() and not list(tmp_path.rglob(".tmp-*"))


# ---------------------------------------------------------------------------- reproduce over damaged files


@pytest.fixture(scope="module")
def experiment(steps_smoke):
    return steps_smoke


@pytest.mark.parametrize("target", ["config.toml", "summary.json", "meta.json", "model.safetensors"])
def test_reproduce_over_a_damaged_file_is_one_line_naming_it(experiment, tmp_path, capsys, target):
    out = tmp_path / "out"
    shutil.copytree(experiment, out)
    run = next((out / "steps-smoke" / "runs").iterdir())
    path = {"config.toml": run / "config.toml", "summary.json": run / "summary.json"}.get(target) or \
        complete_checkpoints(run)[-1] / target
    _garbage(path)
    (out / "steps-smoke" / "measurements.json").unlink()  # measure again: the checkpoints are read
    capsys.readouterr()
    assert main(["reproduce", "steps", "--preset", "smoke", "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err  # reproduce logs its steps on stderr; the error is its last line
    errors = [line for line in err.splitlines() if line.startswith("sameloss: error: ")]
    assert len(errors) == 1 and str(path) in errors[0] and err.strip().splitlines()[-1] == errors[0], err
    assert "Traceback" not in err


def test_reproduce_resumes_an_interrupted_run_from_its_newest_valid_checkpoint(experiment, tmp_path, capsys):
    out = tmp_path / "out"
    shutil.copytree(experiment, out)
    run = next((out / "steps-smoke" / "runs").iterdir())
    (run / "summary.json").unlink()
    bad = damage(complete_checkpoints(run)[-1], "safetensors-garbage")
    capsys.readouterr()
    assert main(["reproduce", "steps", "--preset", "smoke", "--out", str(out), "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert f"{bad}: unreadable" in err and "resuming from" in err
    assert json.loads((run / "summary.json").read_text())["step"] == 24


# ---------------------------------------------------------------------------- 6. failed start


def test_a_start_that_fails_before_the_first_checkpoint_leaves_no_run_folder(tmp_path, capsys, monkeypatch):
    from sameloss.errors import UserError
    from sameloss.training.evaluate import ExactEvaluator

    def fails(self, *args, **kwargs):
        raise UserError("evaluation failed")

    monkeypatch.setattr(ExactEvaluator, "evaluate", fails)
    out = tmp_path / "out"
    args = ["pretrain", "name=r", "--out", str(out), *TINY, "steps=4", "eval.every=2", "--no-progress"]
    assert main(args) == 2
    assert "evaluation failed" in one_error_line(capsys)
    assert not (out / "r").exists()
    monkeypatch.undo()
    assert main(args) == 0  # the corrected rerun is not blocked


# ---------------------------------------------------------------------------- 9. validation


@pytest.mark.parametrize("override, message", [
    ("optim.lr=nan", "finite"), ("optim.lr=inf", "finite"), ("optim.lr=-inf", "finite"),
    ("log_every=0", "log_every must be >= 1"), ("save_every=0", "save_every must be >= 1"),
    ("eval.n_sentences=0", "eval.n_sentences must be >= 1"), ("eval.n_subsets=0", "eval.n_subsets must be in"),
    ("eval.every=-1", "eval.every must be >= 0"), ("language.seed=-1", "language.seed must be >= 0"),
    ("model.dropout=nan", "finite"),
])
def test_bad_settings_are_one_line_and_leave_nothing(tmp_path, capsys, override, message):
    out = tmp_path / "out"
    assert main(["pretrain", "name=r", "--out", str(out), *TINY, "steps=2", override, "--no-progress"]) == 2
    assert message in one_error_line(capsys)
    assert not out.exists()


@pytest.mark.parametrize("kind", ["folder", "binary"])
def test_a_config_that_is_not_a_toml_file_is_one_line(tmp_path, capsys, kind):
    path = tmp_path / "cfg"
    if kind == "folder":
        path.mkdir()
    else:
        path.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe\x00\x00")
    assert main(["pretrain", "--config", str(path), "--out", str(tmp_path / "out")]) == 2
    assert str(path) in one_error_line(capsys)
    assert not (tmp_path / "out").exists()


def test_describe_refuses_a_negative_seed(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["language", "describe", "hmm", "--preset", "micro", "--seed", "-1"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "expected an integer >= 0" in err[0]


def test_sigterm_stops_pretrain_like_ctrl_c_with_a_resume_hint(tmp_path):
    out = tmp_path / "out"
    import sameloss
    src = str(Path(sameloss.__file__).resolve().parents[1])  # the sameloss these tests import
    env = {**os.environ, "PYTHONPATH": src, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "sameloss.cli", "pretrain", "name=r", "--out", str(out), *TINY,
                             "steps=100000", "save_every=5", "--no-progress"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 120
    while not complete_checkpoints(out / "r") and time.monotonic() < deadline:
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sameloss: SIGTERM; resume with --resume: ") and \
        lines[0].endswith("--resume"), err
    assert complete_checkpoints(out / "r") and not list(out.rglob(".tmp-*"))


# ---------------------------------------------------------------------------- 10-12


def test_print_config_shows_unset_keys_and_loads_back(tmp_path, capsys):
    assert main(["pretrain", "--print-config", "steps=10", "model.d_model=32"]) == 0
    text = capsys.readouterr().out
    assert "# seed = None (unset)" in text and "# d_hidden = None (unset)" in text
    assert "# grad_clip = None (unset)" in text and "d_model = 32" in text
    path = tmp_path / "c.toml"
    path.write_text(text)
    assert configlib.load(PretrainConfig, path) == configlib.load(PretrainConfig, None, ["steps=10",
                                                                                        "model.d_model=32"])


def test_the_train_loss_log_after_a_resume_equals_an_uninterrupted_run(tmp_path):
    cfg = tiny_config("steps=12", "log_every=4", "save_every=100")
    pretrain(cfg, tmp_path / "whole", progress=False)
    pretrain(cfg, tmp_path / "split", progress=False, stop_after=6)  # killed in the middle of a log window
    pretrain(cfg, tmp_path / "split", progress=False, resume=True)

    def losses(run):
        return [(r["step"], r["train_loss"]) for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())]
    assert losses(tmp_path / "split") == losses(tmp_path / "whole")
    assert [s for s, _ in losses(tmp_path / "whole")] == [4, 8, 12]


def test_progress_in_a_log_file_is_plain_lines(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("SAMELOSS_PROGRESS_SECONDS", "0")
    assert main(["pretrain", "name=r", "--out", str(tmp_path), *TINY, "steps=5", "log_every=1"]) == 0
    err = capsys.readouterr().err
    assert "\r" not in err
    lines = err.strip().splitlines()
    assert lines[0].startswith("r: 1/5 steps (20%)") and lines[-1].startswith("r: 5/5 steps (100%)")
    assert "loss=" in lines[-1]


def test_reproduce_fresh_deletes_only_an_experiment_folder(tmp_path, capsys):
    folder = tmp_path / "steps-smoke"
    folder.mkdir()
    (folder / "thesis.tex").write_text("years of work")
    assert main(["reproduce", "steps", "--preset", "smoke", "--out", str(tmp_path), "--fresh", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("sameloss: error: ") and "is not an experiment folder" in err[-1] \
        and "thesis.tex" in err[-1]
    assert (folder / "thesis.tex").read_text() == "years of work"
