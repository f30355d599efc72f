"""Data sets are registered objects (``data.sets.DATASETS``): one added in this test alone
is fetched, cached and listed by ``data fetch --help`` with no other edit."""

from __future__ import annotations

import pytest

from sameloss.cli import build_parser
from sameloss.data import fetch as data_fetch
from sameloss.data.convert import write_lines
from sameloss.data.sets import DATASETS, DataSet


def _convert(sources, out):
    write_lines(out / "text.txt", ["a first document", "a second one"])


def test_a_data_set_registered_in_a_test_is_fetched_and_listed(tmp_path, capsys):
    toy = DataSet("toy-text", "two made-up documents", "nothing at all", _convert)
    with DATASETS.added(toy):
        out, manifest, cached = data_fetch.fetch("toy-text", tmp_path)
        assert not cached and (out / "text.txt").read_text().splitlines() == ["a first document", "a second one"]
        assert manifest["what"] == "two made-up documents" and manifest["sources"] == {}
        assert data_fetch.fetch("toy-text", tmp_path)[2] is True  # the second call: cached
        with pytest.raises(SystemExit):
            build_parser().parse_args(["data", "fetch", "--help"])
        help_text = capsys.readouterr().out
        assert "toy-text: two made-up documents (stands in for nothing at all)" in " ".join(help_text.split())
    assert "toy-text" not in DATASETS
