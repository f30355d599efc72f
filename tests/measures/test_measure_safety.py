"""`sameloss measure` checks its output before measuring, writes rows atomically, and names a
damaged checkpoint while keeping the good rows (issue 10).

Every case goes through ``sameloss.cli.main`` as a user would and checks the exit code,
that the error is one line naming the problem, and that the files around are unchanged.
"""

from __future__ import annotations

import errno
import json
import os

import pytest

from sameloss.cli import main
from sameloss.training.checkpoint import complete_checkpoints

from helpers.safety import WEIGHT_DAMAGE, copy_run, damage, one_error_line


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


def test_measure_never_replaces_a_users_file_or_a_link_and_force_replaces_the_file(runs, tmp_path, capsys,
                                                                                  monkeypatch):
    """Issue 40: ``--out user/notes.txt`` replaced a user's prose by JSON rows, and
    ``--out link.csv`` a user's link by a file."""
    import sameloss.measures.run as run_module

    notes = tmp_path / "notes.txt"
    notes.write_text("my notes, do not lose\n")
    link = tmp_path / "link.csv"
    link.symlink_to(notes)
    measure = run_module.measure_checkpoint

    def never(*args, **kwargs):
        raise AssertionError("measured before checking --out")

    monkeypatch.setattr(run_module, "measure_checkpoint", never)
    for args, words in ([[str(notes)], "notes.txt exists and was not written by sameloss; not replacing it"],
                        [[str(link), "--force"], "link.csv is a symbolic link; sameloss never replaces a link"]):
        assert main(["measure", str(runs / "finished"), "--loss", "--no-progress", "--out", *args]) == 2
        assert words in one_error_line(capsys)
    assert notes.read_text() == "my notes, do not lose\n" and link.is_symlink()
    monkeypatch.setattr(run_module, "measure_checkpoint", measure)
    assert main(["measure", str(runs / "finished"), "--loss", "--no-progress", "--out", str(notes), "--force"]) == 0
    first = json.loads(notes.read_text())
    assert [row["step"] for row in first] == [3, 6]
    # now sameloss's (listed in .sameloss-outputs beside it): a rerun replaces it without --force
    assert main(["measure", str(runs / "finished"), "--loss", "--no-progress", "--out", str(notes)]) == 0
    assert json.loads(notes.read_text()) == first


def test_a_failed_write_of_the_rows_leaves_no_temporary_file_and_keeps_the_old_results(tmp_path, monkeypatch):
    from sameloss.errors import UserError
    from sameloss.measures.run import write_rows

    out = tmp_path / "m.csv"
    out.write_text("old results\n")

    def full(*args):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    with pytest.raises(UserError, match="cannot write .*m.csv: No space left on device"):
        write_rows([{"step": 1, "loss": 2.0}], out, force=True)
    assert out.read_text() == "old results\n"
    assert [p.name for p in tmp_path.iterdir()] == ["m.csv"]


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

