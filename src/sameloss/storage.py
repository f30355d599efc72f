"""Why a write failed, as one line: a full disk, a file-size limit or a read-only folder
(``STORAGE_ERRNOS``) in whichever form the writer reported it (an ``OSError``'s errno, a Rust
library's ``(os error N)``, numpy's short write; ``storage_reason``), turned into a
``UserError`` naming the file (``write_error``, or ``storage_errors`` around a block). Every
writer of ``files`` and every command that writes goes through these."""

from __future__ import annotations

import contextlib
import errno
import os
import re
from pathlib import Path

from .errors import UserError


class WriteError(UserError, OSError):
    """A failed write of the one atomic writer (``files.atomic_writer``), one line naming
    its file (``cannot write PATH: reason``): a ``UserError`` for the CLI, and still the
    ``OSError`` it was for a caller that cleans up after one (``except OSError``) or treats
    a write as optional."""

    def __init__(self, message: str):
        UserError.__init__(self, message)


def write_error(path: str | Path, exc: BaseException) -> UserError:
    """A one-line ``UserError`` for a failed write (full disk, read-only folder, ...);
    ``exc`` may be a library's error that carries the storage error (``storage_reason``).
    An error that is one already (a ``WriteError`` naming the very file) stays as it is."""
    if isinstance(exc, UserError):
        return exc
    reason = storage_reason(exc)
    if reason is None:
        reason = (exc.strerror if isinstance(exc, OSError) else None) or " ".join(str(exc).split()) \
            or type(exc).__name__
    return UserError(f"cannot write {path}: {reason}")


# EFBIG: a file-size limit (RLIMIT_FSIZE), which the tests use to play a full disk
STORAGE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO, errno.EFBIG}
# Writers that report a full disk without an OSError errno: the Rust libraries
# (safetensors' SafetensorError, tokenizers' Exception) put io::Error's "(os error N)" in
# their message; numpy's tofile (np.save to a path) raises OSError("N requested and M
# written") with no errno after a short write.
_RUST_OS_ERROR = re.compile(r"\(os error (\d+)\)")
_SHORT_WRITE = re.compile(r"^(\d+) requested and (\d+) written$")


def storage_reason(exc: BaseException | None) -> str | None:
    """Why a write failed when ``exc`` is a full disk, a file-size limit or a read-only
    folder (``STORAGE_ERRNOS``), in whichever form the writer reported it; else None.
    The exception chain is followed: torch's writer raises a ``RuntimeError`` whose
    ``__context__`` is the ``OSError`` (when it writes to a Python file object)."""
    seen = set()
    while exc is not None and id(exc) not in seen and not isinstance(exc, UserError):  # ours: already one line
        seen.add(id(exc))
        reason = _storage_reason(exc)
        if reason is not None:
            return reason
        exc = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
    return None


def _storage_reason(exc: BaseException) -> str | None:
    if isinstance(exc, OSError) and exc.errno in STORAGE_ERRNOS:
        return exc.strerror or str(exc) or type(exc).__name__
    text = str(exc).strip()
    rust = _RUST_OS_ERROR.search(text)
    if rust and int(rust.group(1)) in STORAGE_ERRNOS:
        return os.strerror(int(rust.group(1)))
    short = _SHORT_WRITE.match(text) if isinstance(exc, OSError) and exc.errno is None else None
    if short:
        return (f"only {short.group(2)} of {short.group(1)} bytes were written (the disk is full, or a file-size "
                "limit was reached)")
    return None


def storage_errors(where: str | Path):
    """A context manager turning a full disk / read-only folder (``STORAGE_ERRNOS``) inside
    the block into one ``UserError`` line naming ``where``."""
    return _StorageErrors(Path(where))


class _StorageErrors(contextlib.AbstractContextManager):
    def __init__(self, where: Path):
        self.where = where

    def __exit__(self, kind, exc, tb):
        reason = storage_reason(exc) if exc is not None else None
        if reason is not None:
            raise UserError(f"cannot write {self.where}: {reason}") from None
        return False
