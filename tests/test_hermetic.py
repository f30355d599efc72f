"""The suite is hermetic (issue 63, item 9): every cache sameloss and its libraries keep
outside a run folder points into this session's own folder (``conftest.pytest_configure``),
in the tests' process and in every process they start, so that no test reads what an earlier
command left in the user's home, nor writes there."""

from __future__ import annotations

import os
from pathlib import Path

from conftest import CACHE_VARIABLES, SESSION_CACHES
from helpers.processes import ENV, run_cli


def test_every_cache_points_into_the_sessions_folder():
    root = Path(os.environ[SESSION_CACHES])
    assert root.is_dir() and not str(root).startswith(str(Path.home()))
    for variable in CACHE_VARIABLES:
        assert Path(os.environ[variable]).is_relative_to(root), variable
        assert ENV[variable] == os.environ[variable], variable  # the child processes' too


def test_a_study_writes_nothing_into_home(tmp_path):
    """The smoke ``steps`` study (it builds the causal language in the data cache, draws
    figures with matplotlib, trains with torch) run with HOME pointed at an empty folder:
    the folder stays empty."""
    home = tmp_path / "home"
    home.mkdir()
    done = run_cli(["reproduce", "steps", "--scale", "smoke", "--out", str(tmp_path / "out"), "--no-progress"],
                   env={**ENV, "HOME": str(home)})
    assert done.returncode == 0, done.stderr
    assert sorted(str(p.relative_to(home)) for p in home.rglob("*")) == []
