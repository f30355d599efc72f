"""``sameloss replicate``'s inputs (issue 63): a ``LABEL=`` with no folder, and a damaged
``differences.csv``, are one line and exit 2, never a table of dashes."""

from __future__ import annotations

import pytest

from sameloss.cli import main
from sameloss.experiments.stats.inference import DETECTED

from .test_isoloss_languages import _diff, _study


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_a_label_without_a_folder_is_refused(tmp_path, capsys):
    """Item 7: ``hmm=`` read the empty path as ``.`` and said the current folder "is not a
    finished isoloss study"."""
    a = _study(tmp_path / "a", [_diff("size", "late", 1.0, 0.8, 16, DETECTED)], "hmm:headroom:task=task-5")
    assert main(["replicate", "hmm=", str(a)]) == 2
    assert "'hmm=': LABEL=FOLDER needs a folder after '='" in _one_line(capsys)


@pytest.mark.parametrize("damage", ["cut", "empty", "folder"])
def test_a_damaged_differences_table_is_one_line(tmp_path, capsys, damage):
    """Item 3: a cut, empty or folder ``differences.csv`` of a finished study was taken
    silently (exit 0, every estimate shown as '–')."""
    lang = "hmm:headroom:task=task-5"
    a = _study(tmp_path / "a", [_diff("size", "late", 1.0, 0.8, 16, DETECTED)], lang)
    b = _study(tmp_path / "b", [_diff("size", "late", 0.5, 0.8, 16, DETECTED)])
    (b / "gate.csv").write_text("seed,trained,ok\n0,0.8,True\n1,0.8,False\n")  # a gate that stopped a seed
    table = b / "differences.csv"
    if damage == "cut":
        table.write_bytes(table.read_bytes()[:-40])  # a row cut short (a kill, a full disk)
    elif damage == "empty":
        table.write_bytes(b"")
    else:
        table.unlink()
        table.mkdir()
    assert main(["replicate", str(a), f"pcfg={b}"]) == 2
    assert str(table) in _one_line(capsys)
