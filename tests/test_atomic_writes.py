"""The one atomic writer: the file is replaced whole or not at all."""

from __future__ import annotations

import json

import pytest

from sameloss import files


def test_atomic_writer_replaces_the_file_only_when_the_block_succeeds(tmp_path):
    path = tmp_path / "results.csv"
    path.write_text("earlier\n")
    with pytest.raises(RuntimeError):
        with files.atomic_writer(path) as f:
            f.write("half a ")
            raise RuntimeError("killed mid-write")
    assert path.read_text() == "earlier\n"
    assert [p.name for p in tmp_path.iterdir()] == ["results.csv"]  # no temporary file left
    with files.atomic_writer(path, newline="") as f:
        f.write("a,b\r\n")
    assert path.read_bytes() == b"a,b\r\n"


def test_atomic_write_json_round_trips(tmp_path):
    path = tmp_path / "cache.json"
    files.atomic_write_json(path, {"x": [1, 2.5], "p": tmp_path}, indent=1, default=str)
    assert json.loads(path.read_text()) == {"x": [1, 2.5], "p": str(tmp_path)}
    with pytest.raises(TypeError):
        files.atomic_write_json(path, {"bad": object()})
    assert json.loads(path.read_text())["x"] == [1, 2.5]  # the earlier content survives
    assert len(list(tmp_path.iterdir())) == 1
