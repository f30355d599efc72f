"""Registered languages (``found.py``): one damaged record is an error where its language is
used, and nowhere else (issue 63, item 4: it disabled every command, even ``pretrain --help``
and ``language describe`` of the other languages)."""

from __future__ import annotations

import shutil

import pytest

from sameloss import found
from sameloss.cli import main


@pytest.fixture
def damaged(tmp_path, monkeypatch):
    """The registered records, and a damaged one beside them."""
    folder = tmp_path / "registered"
    shutil.copytree(found.REGISTERED, folder)
    (folder / "hmm-broken-1.toml").write_text("name = \"hmm:broken-1\"\nspec = [\n")
    monkeypatch.setattr(found, "REGISTERED", folder)
    return folder / "hmm-broken-1.toml"


def test_a_damaged_record_stops_only_what_uses_it(damaged, capsys):
    with pytest.raises(SystemExit) as help_exit:
        main(["pretrain", "--help"])
    assert help_exit.value.code == 0
    assert main(["language", "describe", "hmm:search-1", "--n-sentences", "64"]) == 0
    assert "registered  hmm:search-1" in capsys.readouterr().out
    assert main(["language", "describe", "hmm:broken-1"]) == 2  # its name is listed; reading it is the error
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{damaged}: not a registered language record" in err[0]
    assert found.lookup("hmm:search-1") is not None
    with pytest.raises(found.UserError, match="hmm-broken-1.toml"):  # the study of them all: never one left out
        found.registered()
    # registering another language is not stopped by it; the damaged name is not overwritten
    other = found.Found("hmm:new-1", "hmm:micro:seed=3", "sameloss language search ...", "smoke", 0.5, 0.0, ())
    assert found.write(other).name == "hmm-new-1.toml"
    with pytest.raises(found.UserError, match="not a registered language record"):
        found.write(found.Found("hmm:broken-1", "hmm:micro:seed=4", "...", "smoke", 0.5, 0.0, ()))


def test_the_names_come_from_the_file_names(tmp_path):
    (tmp_path / "pcfg-search-2.toml").write_text("garbage")
    (tmp_path / "notes.toml").write_text("not a record's name")
    assert found.names(tmp_path) == ["pcfg:search-2"] and found.names(tmp_path / "none") == []
