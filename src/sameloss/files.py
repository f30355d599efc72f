"""Files sameloss writes, and how it recognises its own folders before touching them.

* ``atomic_write_text`` (and ``atomic_write_json``, ``atomic_writer`` for streaming
  writers): a file is written under a temporary name beside it and renamed into place, so
  an interrupted write (a kill, a full disk) never leaves a half-written file under the
  real name; the temporary file is removed on any failure. Every file sameloss rewrites
  in place goes through these.
* Markers: a run folder gets ``.sameloss-run`` when ``pretrain`` creates it, a folder
  written by ``embed`` gets ``.sameloss-embedded``. Commands that delete or replace a
  folder (``pretrain --fresh``, ``embed --force``) do so only when it carries the
  marker — or, for folders made before the markers existed, when its ``config.toml``
  starts with the header sameloss writes. Anything else is left alone.
"""

from __future__ import annotations

import errno
import hashlib
import os
import tempfile
from pathlib import Path

from .errors import UserError

RUN_MARKER = ".sameloss-run"
EMBEDDED_MARKER = ".sameloss-embedded"
RUN_CONFIG_HEADER = "# resolved config of run"
EMBEDDED_CONFIG_HEADER = "# config of the model embedded from"


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same folder."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".tmp-{path.name}-")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_error(path: str | Path, exc: OSError) -> UserError:
    """A one-line ``UserError`` for a failed write (full disk, read-only folder, ...)."""
    reason = exc.strerror or str(exc) or type(exc).__name__
    return UserError(f"cannot write {path}: {reason}")


STORAGE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO}


def _first_line(path: Path) -> str:
    try:
        with path.open("r", encoding="utf-8", errors="replace") as f:
            return f.readline()
    except OSError:
        return ""


def is_run_dir(path: str | Path) -> bool:
    """Whether ``path`` is a run folder written by ``sameloss pretrain``."""
    path = Path(path)
    if not path.is_dir() or path.is_symlink():
        return False
    return (path / RUN_MARKER).is_file() or _first_line(path / "config.toml").startswith(RUN_CONFIG_HEADER)


def is_embedded_dir(path: str | Path) -> bool:
    """Whether ``path`` is a folder written by ``sameloss embed``."""
    path = Path(path)
    if not path.is_dir() or path.is_symlink():
        return False
    return (path / EMBEDDED_MARKER).is_file() or \
        _first_line(path / "config.toml").startswith(EMBEDDED_CONFIG_HEADER)


def atomic_writer(path: str | Path, newline: str | None = None):
    """``with atomic_writer(path) as f: ...``: a text file opened under a temporary name in
    ``path``'s folder and renamed to ``path`` when the block ends without an error; on any
    failure (a full disk, a kill) the temporary file is removed and ``path`` is as it was.
    For writers that stream (``csv.writer``); ``atomic_write_text`` for a whole string."""
    return _AtomicWriter(Path(path), newline)


class _AtomicWriter:
    def __init__(self, path: Path, newline: str | None):
        self.path, self.newline = path, newline

    def __enter__(self):
        fd, self.tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".tmp-{self.path.name}-")
        try:
            self.file = os.fdopen(fd, "w", encoding="utf-8", newline=self.newline)
        except BaseException:
            os.close(fd)
            Path(self.tmp).unlink(missing_ok=True)
            raise
        return self.file

    def __exit__(self, kind, exc, traceback) -> bool:
        try:
            self.file.close()
            if kind is None:
                os.replace(self.tmp, self.path)
        finally:
            Path(self.tmp).unlink(missing_ok=True)
        return False


def atomic_write_json(path: str | Path, obj, indent: int | None = 2, default=None) -> None:
    """``obj`` as JSON, written like ``atomic_write_text``."""
    import json

    atomic_write_text(path, json.dumps(obj, indent=indent, default=default))


def mark(path: Path, marker: str, text: str) -> None:
    (Path(path) / marker).write_text(text + "\n", encoding="utf-8")


def sha256_of(path: str | Path) -> str:
    """The sha256 of a file's bytes (read in 1 MiB blocks)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
