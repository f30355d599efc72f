"""Run ``sameloss`` in a child process, for the data layer's fault tests: a full disk
(a file-size limit), a kill -9, a second process beside the first.

A full disk is played with ``RLIMIT_FSIZE`` (and SIGXFSZ ignored), so that writing past
``fsize`` bytes into any one file fails with EFBIG, which sameloss treats as a full disk;
no tmpfs is needed. ``prelude`` is Python run before the CLI (to point a module constant
at a test fixture, or replace a downloader by a fake one).
"""

from __future__ import annotations

import io
import os
import resource
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import sameloss

SRC = str(Path(sameloss.__file__).resolve().parents[1])
PYTHON = sys.executable  # taken at import: a test may stand a fake downloader in for sys.executable

MAIN = "import sys\nfrom sameloss.cli import main\nsys.exit(main(sys.argv[1:]))\n"


def _env(extra: dict | None) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, *sys.path]), "OMP_NUM_THREADS": "1"}
    env.update(extra or {})
    return env


def _limit(fsize: int | None):
    if fsize is None:
        return None

    def preexec():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
    return preexec


def cli_command(args, prelude: str = "") -> list[str]:
    return [PYTHON, "-c", prelude + "\n" + MAIN, *[str(a) for a in args]]


def run_cli(args, *, cwd=None, fsize: int | None = None, prelude: str = "", env: dict | None = None,
            timeout: float = 600) -> subprocess.CompletedProcess:
    """``sameloss ARGS`` in a child process; its exit code, stdout and stderr."""
    return subprocess.run(cli_command(args, prelude), cwd=cwd, env=_env(env), preexec_fn=_limit(fsize),
                          capture_output=True, text=True, timeout=timeout)


def start_cli(args, *, cwd=None, prelude: str = "", env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(cli_command(args, prelude), cwd=cwd, env=_env(env), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def error_line(result) -> str:
    """The one error line of a failed command (exit 2, exactly one line on stderr)."""
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith("sameloss"), \
        (result.returncode, result.stderr)
    return lines[0]


def wait_for(condition, what: str, seconds: float = 120) -> None:
    """Poll ``condition`` (a safety net for a stuck child, not a timing assertion)."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie waiting to be reaped counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def leftovers(folder: Path) -> list[str]:
    """Entries of ``folder`` that a finished command should not have left (partial builds,
    temporary files)."""
    return sorted(p.name for p in folder.iterdir() if ".partial" in p.name or p.name.startswith(".tmp-"))


def fake_vader(downloads: Path) -> Path:
    """A small stand-in for the vaderSentiment sdist (its ground-truth file of 40 rated
    sentences, in the nested tarballs of the real one) in ``downloads``."""
    inner = io.BytesIO()
    with tarfile.open(fileobj=inner, mode="w:gz") as t:
        data = "".join(f"{i}\t{(-1) ** i * 1.5}\tsentence number {i}\r\n" for i in range(1, 41)).encode()
        info = tarfile.TarInfo("hutto_ICWSM_2014/movieReviewSnippets_GroundTruth.txt")
        info.size = len(data)
        t.addfile(info, io.BytesIO(data))
    path = downloads / "vaderSentiment-3.3.2.tar.gz"
    with tarfile.open(path, "w:gz") as t:
        info = tarfile.TarInfo("vaderSentiment-3.3.2/additional_resources/hutto_ICWSM_2014.tar.gz")
        info.size = len(inner.getvalue())
        t.addfile(info, io.BytesIO(inner.getvalue()))
    return path
