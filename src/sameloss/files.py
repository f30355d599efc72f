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
* ``folder_lock``: an exclusive lock on a folder a command writes (a run, an experiment,
  a fetch target), so two processes never write one folder; the second gets one line
  naming the holder's pid. ``update_lock``: a short one that waits, for a file several
  processes add to (an experiment's ``measurements.json``).
* ``building``: a new folder is built under a temporary sibling name and renamed into
  place at the end, so a kill or a full disk never leaves a half-built folder under the
  real name (and never blocks the rerun).
* A file a user names (``measure --out``, ``plot --out``, ``replicate --csv``,
  ``language describe --save-grammar``) is written by ``write_output``, which first notes
  its sha256 and name in ``.sameloss-outputs`` beside it (one line appended per write).
  An existing file there is replaced only when that list holds its name with its current
  sha256 (``is_own_output``: sameloss wrote it, and nobody changed it since) — or with
  ``--force``; a symbolic link is never replaced by a file.
* Inside a run folder (and a folder of ``embed``) sameloss's files are its fixed names
  (``RUN_FILES``, ``checkpoints/step_N/`` with ``CHECKPOINT_FILES``, a tracker's ``tb/`` or
  ``wandb/``) and the files its ``.sameloss-outputs`` lists; ``foreign_in_run`` names
  anything else, which a command that deletes the folder (``--fresh``, ``embed --force``)
  refuses to delete.

A write that fails for want of storage (a full disk, a read-only folder) ends in one line
naming the file: ``storage.py``.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path

from .errors import UserError
from .storage import WriteError, storage_errors, storage_reason, write_error

RUN_MARKER = ".sameloss-run"
EMBEDDED_MARKER = ".sameloss-embedded"
EXPERIMENT_MARKER = ".sameloss-experiment"
RUN_CONFIG_HEADER = "# resolved config of run"
EMBEDDED_CONFIG_HEADER = "# config of the model embedded from"


def umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def honour_umask(path: str | Path, directory: bool = False) -> None:
    """Give a file made by ``tempfile`` (mode 0600, folders 0700) the mode a plain
    ``open``/``mkdir`` would have (0666/0777 less the umask)."""
    os.chmod(path, (0o777 if directory else 0o666) & ~umask())


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same folder."""
    with atomic_writer(path) as f:
        f.write(text)


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same folder."""
    with atomic_writer(path, binary=True) as f:
        f.write(data)


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


def atomic_writer(path: str | Path, newline: str | None = None, binary: bool = False):
    """``with atomic_writer(path) as f: ...``: a file (text, or bytes with ``binary``) opened
    under a temporary name in ``path``'s folder and renamed to ``path`` when the block ends
    without an error, with the mode a plain ``open`` would give it; on any failure (a full
    disk, a kill) the temporary file is removed and ``path`` is as it was. For writers that
    stream (``csv.writer``); ``atomic_write_text`` / ``_bytes`` for a whole string."""
    return _AtomicWriter(Path(path), newline, binary)


class _AtomicWriter:
    def __init__(self, path: Path, newline: str | None, binary: bool):
        self.path, self.newline, self.binary = path, newline, binary

    def __enter__(self):
        if self.path.is_dir() and not self.path.is_symlink():  # a user's folder where sameloss writes a file
            raise WriteError(f"cannot write {self.path}: a folder is there (not a file sameloss wrote); move it "
                             "away and run again")
        try:
            fd, self.tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".tmp-{self.path.name}-")
        except OSError as exc:
            raise self._named(exc) from None
        try:
            self.file = os.fdopen(fd, "wb") if self.binary else \
                os.fdopen(fd, "w", encoding="utf-8", newline=self.newline)
        except BaseException:
            os.close(fd)
            Path(self.tmp).unlink(missing_ok=True)
            raise
        return self.file

    def __exit__(self, kind, exc, traceback) -> bool:
        try:
            self.file.close()
            if kind is None:
                honour_umask(self.tmp)
                os.replace(self.tmp, self.path)
        except OSError as failed:  # a full disk noticed when the buffer is flushed
            if kind is None:
                raise self._named(failed) from None
            # else the block's own error (an interrupt, a failed write) is the one to tell
        finally:
            Path(self.tmp).unlink(missing_ok=True)
        if exc is not None and storage_reason(exc) is not None:  # the block's own write failed
            raise self._named(exc) from None
        return False

    def _named(self, exc: OSError | BaseException) -> BaseException:
        """A full disk, a file-size limit or a read-only folder as one line naming the file
        (``WriteError``, still an ``OSError``); any other error as it was."""
        reason = storage_reason(exc)
        return exc if reason is None else WriteError(f"cannot write {self.path}: {reason}")


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


# ---- files a user names: --out FILE -------------------------------------------------------
OUTPUTS = ".sameloss-outputs"
OUTPUTS_HEADER = ("# files sameloss wrote in this folder, one 'sha256  name' line per write: a file is "
                  "replaced only while its content is one listed here")
_OUTPUTS_COMPACT_BYTES = 1 << 16  # past this size the list keeps only the entries of files as they are now


def listed_digests(folder: Path) -> dict[str, set[str]]:
    """``{name: {sha256, ...}}`` of the ``OUTPUTS`` list in ``folder`` (empty without one)."""
    listed: dict[str, set[str]] = {}
    try:
        text = (Path(folder) / OUTPUTS).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return listed
    for line in text.splitlines():
        digest, sep, name = line.partition("  ")
        if sep and len(digest) == 64 and name and not line.startswith("#"):
            listed.setdefault(name, set()).add(digest)
    return listed


def is_own_output(path: str | Path) -> bool:
    """Whether the file ``path`` is one sameloss wrote and nobody changed since: the
    ``OUTPUTS`` list beside it holds its name with its current sha256."""
    path = Path(path)
    if path.is_symlink() or not path.is_file():
        return False
    digests = listed_digests(path.parent).get(path.name)
    return bool(digests) and sha256_of(path) in digests


def check_output(path: str | Path, force: bool = False, option: str = "--out", force_flag: str = "--force",
                 ours=None) -> bool:
    """``UserError`` (one line) unless ``path`` may be written: a symbolic link never (not
    even with ``force``), a folder never, an existing file only when sameloss wrote it
    (``is_own_output``, or ``ours(path)``: a format's own tag) or with ``force``. Returns
    whether a file is there (and will be replaced)."""
    path = Path(path)
    if path.is_symlink():
        raise UserError(f"{option} {path} is a symbolic link; sameloss never replaces a link with a file (give "
                        "another name)")
    if path.is_dir():
        raise UserError(f"{option} {path} is a folder; give a file name")
    if not path.exists():
        return False
    if not path.is_file():
        raise UserError(f"{option} {path} exists and is not a plain file; give another name")
    if force or is_own_output(path) or (ours is not None and ours(path)):
        return True
    raise UserError(f"{option} {path} exists and was not written by sameloss; not replacing it (choose another "
                    f"name, or pass {force_flag} to replace it)")


def write_output(path: str | Path, data: bytes | str, force: bool = False, option: str = "--out",
                 force_flag: str = "--force", ours=None) -> bool:
    """Write ``data`` to the file ``path`` a user named, atomically, after ``check_output``
    (again: the file may have appeared since the command began); its sha256 is added to
    the ``OUTPUTS`` list first, so that a later write may replace it. A full disk or a
    read-only folder is one ``UserError`` line, the old file intact. Returns whether a
    file was replaced."""
    path = Path(path)
    replaced = check_output(path, force, option, force_flag, ours)
    blob = data.encode("utf-8") if isinstance(data, str) else data
    listing = path.parent / OUTPUTS
    new_listing = not listing.exists() and not listing.is_symlink()
    with storage_errors(path):
        try:
            _record_output(path, hashlib.sha256(blob).hexdigest())
            atomic_write_bytes(path, blob)
        except BaseException:  # nothing written: a list this call began goes too
            if new_listing:
                listing.unlink(missing_ok=True)
            raise
    return replaced


def _record_output(path: Path, digest: str) -> None:
    if "\n" in path.name or "\r" in path.name:  # cannot be listed: such a file stays unproven (refused later)
        return
    listing = path.parent / OUTPUTS
    if listing.is_symlink() or (listing.exists() and not listing.is_file()):
        return  # not ours to write to: the file stays unproven
    if digest in listed_digests(path.parent).get(path.name, ()):
        return
    try:
        size = listing.stat().st_size
    except FileNotFoundError:
        size = 0
    if size > _OUTPUTS_COMPACT_BYTES:  # keep what still proves a file; a lost race only makes one unproven
        kept = []
        for name, digests in sorted(listed_digests(path.parent).items()):
            current = path.parent / name
            if current.is_file() and not current.is_symlink() and sha256_of(current) in digests:
                kept.append(f"{sha256_of(current)}  {name}")
        atomic_write_text(listing, "\n".join([OUTPUTS_HEADER, *kept]) + "\n")
        size = 1
    line = f"{digest}  {path.name}\n"
    # one short write with O_APPEND: lines of processes writing at once never interleave
    fd = os.open(listing, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        os.write(fd, ((OUTPUTS_HEADER + "\n") if size == 0 else "").encode() + line.encode("utf-8", "surrogateescape"))
    finally:
        os.close(fd)


# ---- what sameloss owns inside a run folder ------------------------------------------------
RUN_FILES = frozenset({RUN_MARKER, EMBEDDED_MARKER, "config.toml", "metrics.jsonl", "summary.json", OUTPUTS})
CHECKPOINT_FILES = frozenset({"meta.json", "model.safetensors", "state.pt"})
# a tracker's folder in a run (``training.tracking``: TensorBoard's event files in tb/,
# wandb's in wandb/): the library's names inside sameloss's folder, not searched entry by entry
TRACKER_FOLDERS = frozenset({"tb", "wandb"})
_CHECKPOINT = re.compile(r"step_\d+")
_CHECKPOINT_TMP = re.compile(r"\.tmp-step_\d+-\d+")  # ``checkpoint.save`` cut by a kill


def _is_atomic_tmp(name: str, owned) -> bool:
    """A temporary file of an atomic write of one of ``owned`` (``.tmp-<name>-*``), cut by a kill."""
    return name.startswith(".tmp-") and any(name.startswith(f".tmp-{o}-") for o in owned)


def foreign_in_run(folder: str | Path) -> list[str]:
    """Entries of a run folder (or of a folder written by ``embed``) that sameloss did not
    write, as paths relative to it, in a stable order: what ``--fresh`` and ``embed
    --force`` must not delete."""
    folder = Path(folder)
    listed = listed_digests(folder)
    found = []
    for entry in sorted(folder.iterdir(), key=lambda p: p.name):
        name = entry.name
        if entry.is_symlink():
            found.append(name)
        elif entry.is_file():
            if name in RUN_FILES or _is_atomic_tmp(name, RUN_FILES | set(listed)):
                continue
            if name not in listed or not is_own_output(entry):
                found.append(name)
        elif entry.is_dir() and name in TRACKER_FOLDERS:
            continue
        elif entry.is_dir() and name == "checkpoints":
            found += [f"{name}/{rel}" for rel in _foreign_in_checkpoints(entry)]
        else:
            found.append(name)
    return found


def _foreign_in_checkpoints(folder: Path) -> list[str]:
    found = []
    for entry in sorted(folder.iterdir(), key=lambda p: p.name):
        if entry.is_symlink() or not entry.is_dir() or not (
                _CHECKPOINT.fullmatch(entry.name) or _CHECKPOINT_TMP.fullmatch(entry.name)):
            found.append(entry.name)
            continue
        found += [f"{entry.name}/{p.name}" for p in sorted(entry.iterdir(), key=lambda p: p.name)
                  if p.is_symlink() or not p.is_file() or p.name not in CHECKPOINT_FILES]
    return found


# ---- locks -------------------------------------------------------------------------------
# A lock is an flock(2) on a hidden file beside the folder, ``.<name>.lock`` (beside, not
# inside: the folder may not exist yet, or be replaced while the lock is held). flock is
# released by the kernel when its holder dies, so a lock file left by a killed process is
# simply taken over — a stale holder needs no clean-up. The file holds the holder's pid,
# host and command for the message the second process prints.
# Ours, not the ``filelock`` package: filelock's Unix lock is the same flock(2), but it
# leaves its lock file behind after release (issue 39: a finished run leaves none), keeps no
# holder's pid / host / command for the refusal's message, and its re-entrancy is per lock
# object, where ours is per folder across the nested holders of one process (an experiment,
# then each run it trains). Wrapping it would keep all of this code and add a dependency.
LOCK_TIMEOUT_NOTE = "wait for it to finish, or stop it"
_HELD: dict[str, list] = {}  # lock path -> [fd, depth, parents it made]: re-entrant within one process


def lock_path(folder: str | Path) -> Path:
    folder = Path(folder).absolute()
    return folder.parent / f".{folder.name}.lock"


def _holder(path: Path) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        text = []
    pid = text[0].strip() if text else ""
    host = text[1].strip() if len(text) > 1 else ""
    cmd = text[2].strip() if len(text) > 2 else ""
    where = f"pid {pid}" if pid else "pid unknown"
    if host and host != socket.gethostname():
        where += f" on {host}"
    return where + (f": {cmd}" if cmd else "")


@contextlib.contextmanager
def folder_lock(folder: str | Path, what: str = "folder"):
    """Hold an exclusive lock on ``folder`` for the block (its parent is created if
    missing, and removed again at the end if this call made it and it is still empty). ``UserError`` naming the holder when another process holds it. Re-entrant:
    a process that holds the lock may take it again (e.g. ``reproduce`` locking its
    experiment, then each run it trains); the lock is released when the last of its
    holders ends, in whatever order they end (a ``Study`` nobody closed releases its
    hold when it is garbage-collected)."""
    path = lock_path(folder)
    key = str(path)
    if key in _HELD:
        _HELD[key][1] += 1
        try:
            yield path
        finally:
            _release(key, path)
        return
    made = _missing_parents(path.parent)  # removed again at the end if still empty
    fd = None
    for _ in range(100):
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise write_error(path.parent, exc) from None
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        except FileNotFoundError:  # another process removed the empty parent it had made: again
            continue
        except OSError as exc:
            raise write_error(path, exc) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise UserError(f"{Path(folder)} is in use by another sameloss process ({_holder(path)}); "
                            f"{LOCK_TIMEOUT_NOTE}") from None
        # the holder before us may have removed the file between our open and our flock:
        # then we hold a lock on a file nobody else can find; start again
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
        fd = None
    if fd is None:
        raise UserError(f"could not lock {Path(folder)} ({path} keeps changing)")
    try:
        info = f"{os.getpid()}\n{socket.gethostname()}\n{' '.join(sys.argv)[:300]}\n{time.time():.0f}\n"
        os.ftruncate(fd, 0)
        os.pwrite(fd, info.encode("utf-8", errors="replace"), 0)
    except OSError:
        pass  # the lock holds without the note (a full disk); the message says "pid unknown"
    _HELD[key] = [fd, 1, made]
    try:
        yield path
    finally:
        _release(key, path)


def _release(key: str, path: Path) -> None:
    """One holder of the lock ``key`` ends; the last one releases it."""
    held = _HELD[key]
    held[1] -= 1
    if held[1] > 0:
        return
    del _HELD[key]
    fd, _, made = held
    try:  # remove the file while still holding the lock (see the inode check above)
        if os.fstat(fd).st_ino == os.stat(path).st_ino:
            path.unlink()
    except OSError:
        pass
    os.close(fd)
    # a command refused before it wrote anything leaves no empty folder it made for
    # the lock (e.g. ``runs/``); a folder that holds anything stays
    for folder in made:
        try:
            folder.rmdir()
        except OSError:
            break


def _missing_parents(folder: Path) -> list[Path]:
    """The folders of ``folder``'s path that do not exist yet, deepest first."""
    missing = []
    while not folder.exists() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    return missing


@contextlib.contextmanager
def update_lock(path: str | Path):
    """Hold an exclusive lock for a read-modify-write of the file ``path`` by several
    processes (the workers of one experiment adding rows to its ``measurements.json``):
    unlike ``folder_lock``, a second process waits — the holder keeps it for one read and
    one atomic write. The lock file ``.<name>.lock`` beside ``path`` is removed by its last
    holder, as ``folder_lock``'s is (issue 39: none is left after a run): a holder unlinks
    it while still holding it, and a waiter that then gets the lock of the unlinked file
    sees that the path no longer names it and starts again."""
    lock = update_lock_path(path)
    fd = None
    while fd is None:
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError as exc:
            raise write_error(Path(path), exc) from None
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            same = os.fstat(fd).st_ino == os.stat(lock).st_ino
        except FileNotFoundError:
            same = False
        if not same:  # the holder before us removed it after we opened it: again
            os.close(fd)
            fd = None
    try:
        yield
    finally:
        try:
            lock.unlink()
        except OSError:
            pass
        os.close(fd)


def update_lock_path(path: str | Path) -> Path:
    """The lock file of ``update_lock(path)``: ``.<name>.lock`` beside ``path``."""
    path = Path(path)
    return path.parent / f".{path.name}.lock"


def holds_lock(folder: str | Path) -> bool:
    """Whether this process holds the lock of ``folder``."""
    return str(lock_path(folder)) in _HELD


# ---- folders built atomically ------------------------------------------------------------
PARTIAL_MARKER = ".sameloss-partial"


def _partial_name(target: Path) -> str:
    return f".{target.name}.partial-"


def is_empty_dir(path: Path) -> bool:
    return path.is_dir() and not path.is_symlink() and not any(path.iterdir())


def remove_stale_partials(target: str | Path) -> list[Path]:
    """Remove earlier, interrupted builds of ``target`` (siblings ``.<name>.partial-*``
    that carry ``PARTIAL_MARKER``); the caller holds ``target``'s lock, so none of them is
    being built. Returns what was removed."""
    target = Path(target).absolute()
    removed = []
    if not target.parent.is_dir():
        return removed
    for p in target.parent.glob(_partial_name(target) + "*"):
        if p.is_dir() and not p.is_symlink() and (p / PARTIAL_MARKER).is_file():
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p)
    return removed


@contextlib.contextmanager
def building(target: str | Path, replace: bool = False, what: str = "folder"):
    """Build the folder ``target`` atomically: the block writes into a temporary sibling
    (yielded), which is renamed to ``target`` when the block ends without an error; on any
    error the temporary folder is removed and ``target`` is as it was. A full disk (or a
    read-only folder) becomes one ``UserError`` line.

    ``target`` must not exist or be an empty folder — unless ``replace``, which the caller
    passes only after checking that the existing folder is its own (a marker or manifest
    proves it): the old folder is then swapped out and removed. Holds ``target``'s lock
    for the block and removes earlier interrupted builds first."""
    target = Path(target).absolute()
    with folder_lock(target, what):
        if target.exists() and not replace and not is_empty_dir(target):
            raise UserError(f"{target} already exists and is not empty; choose a new folder")
        remove_stale_partials(target)
        tmp = None
        try:
            tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=_partial_name(target)))
            honour_umask(tmp, directory=True)
            (tmp / PARTIAL_MARKER).write_text(f"sameloss is building {target.name} here (pid {os.getpid()})\n")
        except OSError as exc:  # a disk too full even for the marker: no empty partial left behind
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
            raise write_error(target, exc) from None
        try:
            yield tmp
            (tmp / PARTIAL_MARKER).unlink()
            if target.exists() and (replace or is_empty_dir(target)):
                if is_empty_dir(target):
                    target.rmdir()
                else:  # swap: the old folder becomes a marked partial, then goes
                    old = Path(tempfile.mkdtemp(dir=target.parent, prefix=_partial_name(target)))
                    os.rmdir(old)
                    os.rename(target, old)
                    try:
                        (old / PARTIAL_MARKER).write_text("replaced\n")
                    except OSError:
                        pass
                    os.rename(tmp, target)
                    shutil.rmtree(old, ignore_errors=True)
                    return
            os.rename(tmp, target)
        except BaseException as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            reason = storage_reason(exc)
            if reason is not None:
                raise UserError(f"cannot write {target}: {reason}") from None
            if isinstance(exc, UserError) and str(tmp) in str(exc):  # the temporary folder is gone:
                raise UserError(str(exc).replace(str(tmp), str(target))) from None  # name the target
            raise
