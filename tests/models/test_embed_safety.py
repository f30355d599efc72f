"""`sameloss embed` never writes into a run and replaces only its own output (issue 10);
a damaged checkpoint is one line and writes nothing.

Every case goes through ``sameloss.cli.main`` as a user would and checks the exit code,
that the error is one line naming the problem, and that the files around are unchanged.
"""

from __future__ import annotations

import json

import pytest

from sameloss.cli import main
from sameloss.training.checkpoint import complete_checkpoints

from helpers.safety import WEIGHT_DAMAGE, copy_run, damage, one_error_line, snapshot


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
    (out / "notes.txt").write_text("what I saw")  # a user's file in an earlier embed's output: kept
    before = snapshot(out)
    assert main(["embed", str(ckpt), "--out", str(out), "--width-factor", "2", "--force"]) == 2
    assert "--force deletes only what sameloss wrote" in one_error_line(capsys) and snapshot(out) == before
    (out / "notes.txt").unlink()
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


@pytest.mark.parametrize("kind", WEIGHT_DAMAGE)
def test_embed_of_a_damaged_checkpoint_is_one_line_and_writes_nothing(runs, tmp_path, capsys, kind):
    run = copy_run(runs, "finished", tmp_path)
    bad = damage(complete_checkpoints(run)[-1], kind)
    out = tmp_path / "big"
    assert main(["embed", str(bad.parent), "--out", str(out), "--width-factor", "2"]) == 2
    assert str(bad) in one_error_line(capsys)
    assert not out.exists() and not list(tmp_path.glob(".tmp-*"))

