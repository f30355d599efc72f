"""Second processes for the tests of issue 20: one holding a folder's lock, and the CLI run
in a child whose file-size limit plays a full disk."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import sameloss

SRC = str(Path(sameloss.__file__).resolve().parents[1])  # the sameloss these tests import
ENV = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1"}

HOLDER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from sameloss import files
    with files.folder_lock(sys.argv[1]):
        Path(sys.argv[2]).write_text("held")
        while not Path(sys.argv[3]).exists():
            time.sleep(0.01)
""")


class Holder:
    """A process holding ``files.folder_lock(folder)`` until ``release()``."""

    def __init__(self, folder: Path, scratch: Path):
        scratch.mkdir(parents=True, exist_ok=True)
        self.ready, self.done = scratch / "holder-ready", scratch / "holder-release"
        self.proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(folder), str(self.ready), str(self.done)],
                                     env=ENV)
        for _ in range(6000):  # a safety net for a broken child (60 s), not a timing assertion
            if self.ready.exists() or self.proc.poll() is not None:
                break
            time.sleep(0.01)
        assert self.ready.exists(), "the holder process did not take the lock"
        self.pid = self.proc.pid

    def release(self) -> None:
        self.done.write_text("go")
        self.proc.wait(timeout=60)

    def __enter__(self) -> Holder:
        return self

    def __exit__(self, *exc) -> None:
        if self.proc.poll() is None:
            self.release()


def run_cli(args: list[str], cwd: Path | None = None, file_size_limit: int | None = None,
            env: dict | None = None, timeout: float = 1800) -> subprocess.CompletedProcess:
    """``python -m sameloss.cli ARGS`` in a child process; with ``file_size_limit``, every
    write past that many bytes fails with EFBIG (a full disk that needs no tmpfs). ``timeout``
    only stops a hung child: generous, so a loaded machine does not fail a test."""
    def limit():
        if file_size_limit is not None:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (file_size_limit, file_size_limit))

    return subprocess.run([sys.executable, "-m", "sameloss.cli", *args], cwd=cwd, env=env or ENV,
                          preexec_fn=limit, capture_output=True, text=True, timeout=timeout)


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("sameloss: error: ")]
