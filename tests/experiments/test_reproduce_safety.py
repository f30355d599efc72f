"""`sameloss reproduce` over damaged files, after an interrupted run, and `--fresh` on a folder
that is not an experiment (issue 10).

Every case goes through ``sameloss.cli.main`` as a user would and checks the exit code,
that the error is one line naming the problem, and that the files around are unchanged.
"""

from __future__ import annotations

import json
import shutil

import pytest

from sameloss.cli import main
from sameloss.training.checkpoint import complete_checkpoints

from helpers.safety import _garbage, damage


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
    captured = capsys.readouterr()  # the error alone on stderr; reproduce's headings on stdout (issue 40)
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("sameloss: error: ") and str(path) in err[0], captured.err
    assert "reproduce steps --scale smoke (seed 0) in " in captured.out


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


def test_reproduce_fresh_deletes_only_an_experiment_folder(tmp_path, capsys):
    folder = tmp_path / "steps-smoke"
    folder.mkdir()
    (folder / "thesis.tex").write_text("years of work")
    assert main(["reproduce", "steps", "--preset", "smoke", "--out", str(tmp_path), "--fresh", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("sameloss: error: ") and "is not an experiment folder" in err[-1] \
        and "thesis.tex" in err[-1]
    assert (folder / "thesis.tex").read_text() == "years of work"



@pytest.mark.parametrize("experiment_args", [["isoloss", "--seeds", "5"], ["steps", "--seeds", "0"]])
def test_a_refused_shard_leaves_no_folder_behind(tmp_path, capsys, experiment_args):
    """Issue 63 (item 6): ``--seeds 5`` of a study whose seeds are 0-2 was refused after
    the study's folder was made and marked: an empty experiment folder stayed. The seeds
    are checked on the declaration as ``sameloss plan`` reads it, before any folder."""
    out = tmp_path / "out"
    assert main(["reproduce", experiment_args[0], "--scale", "smoke", *experiment_args[1:], "--out", str(out),
                 "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and ("not seeds of this study" in err[0] or "no per-seed units" in err[0]), err
    assert not out.exists()


@pytest.mark.parametrize("command", ["reproduce", "plan"])
def test_a_negative_seed_is_refused(tmp_path, capsys, command):
    """Issue 63 (noted): ``--seed -1`` ran seeds -1, 0, 1 where every other command refuses
    a negative seed."""
    out = ["--out", str(tmp_path / "out")] if command == "reproduce" else []
    with pytest.raises(SystemExit) as usage:  # a usage error: argparse's exit
        main([command, "isoloss", "--scale", "smoke", "--seed", "-1", *out])
    assert usage.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--seed: expected an integer >= 0, got '-1'" in err[0], err
    assert not (tmp_path / "out").exists()
