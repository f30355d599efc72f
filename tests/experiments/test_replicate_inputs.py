"""``sameloss replicate``'s inputs (issue 63): a ``LABEL=`` with no folder, and a damaged
``differences.csv``, are one line and exit 2, never a table of dashes."""

from __future__ import annotations

from sameloss.cli import main

from .test_isoloss_languages import _language, _study


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_a_label_without_a_folder_is_refused(tmp_path, capsys):
    """Item 7: ``hmm=`` read the empty path as ``.`` and said the current folder "is not a
    finished isoloss study"."""
    a = _study(tmp_path / "a", _language("hmm", [1.0, 1.5, 0.7, 1.2]), "hmm:headroom:task=task-5")
    assert main(["replicate", "hmm=", str(a)]) == 2
    assert "'hmm=': LABEL=FOLDER needs a folder after '='" in _one_line(capsys)


# a cut, empty or folder differences.csv (item 3): test_isoloss_languages.test_replicate_refuses_in_one_line
