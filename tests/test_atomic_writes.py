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


FULL_DISK = """
import resource, signal, sys
from pathlib import Path
from sameloss import files
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
path = Path(sys.argv[1])
try:
    if sys.argv[2] == "whole":
        files.atomic_write_text(path, "x" * 10_000)  # fails when the buffer is flushed at close
    else:
        with files.atomic_writer(path) as f:  # fails inside the block, on a write past the limit
            for _ in range(100):
                f.write("y" * 1000)
                f.flush()
except OSError as exc:
    from sameloss.errors import UserError
    print(type(exc).__name__, isinstance(exc, UserError), exc)
"""


@pytest.mark.parametrize("where", ["whole", "streamed"])
def test_a_full_disk_names_the_file_and_stays_an_oserror(tmp_path, where):
    """Issue 63 (item 9): a write the atomic writer made and the disk refused said "File too
    large" and no path; it names its file now, as a ``UserError`` line that callers which
    clean up after an ``OSError`` still catch. The earlier file and no temporary stay."""
    import subprocess
    import sys

    from helpers.processes import ENV

    path = tmp_path / "results.csv"
    path.write_text("earlier\n")
    done = subprocess.run([sys.executable, "-c", FULL_DISK, str(path), where], env=ENV, capture_output=True, text=True,
                          timeout=120)
    assert done.stdout.strip() == f"WriteError True cannot write {path}: File too large", done.stderr
    assert path.read_text() == "earlier\n" and [p.name for p in tmp_path.iterdir()] == ["results.csv"]
