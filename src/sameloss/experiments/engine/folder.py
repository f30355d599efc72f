"""What sameloss owns in an experiment folder, and how it writes there (issue 20).

An experiment folder (``<out>/<experiment>-<scale>[-seed<N>]/``, and each seed
sub-study of isoloss, ``seeds/seed<N>/``) is marked when a ``Study`` creates it: the
file ``.sameloss-experiment`` (``files.EXPERIMENT_MARKER``) says so, and lists, one per
line after its first, every other file sameloss wrote at the top of the folder (figures,
CSV tables; ``record_output`` adds them as they are written). What sameloss owns there:

* the fixed files ``OWN_FILES`` and the files the marker lists (and the temporary files
  of an interrupted atomic write of one of them: ``.tmp-<name>-*``, ``<name>.tmp``);
* ``runs/``: run folders (``files.is_run_dir``: the run marker, or the config header of
  runs made before the marker), and the lock files / marked partial builds beside them;
  inside a run folder only what ``files.foreign_in_run`` accepts (its fixed files,
  checkpoints, a tracker's folder, the files its ``.sameloss-outputs`` lists): a user's
  notes put in a run folder are theirs;
* ``embedded/``: folders written by ``embed`` (``files.is_embedded_dir``), likewise;
* ``.sameloss-outputs`` and the files it lists with their current sha256
  (``files.is_own_output``: e.g. a ``measure --out`` written into the folder);
* ``seeds/``: seed sub-studies, each an experiment folder owned by the same rules;
* ``data/`` and ``continued/``: what the ``text`` and ``theory`` recipes build there, and
  ``submitit/``: the launchers' files (``launch.py``: pickled units, worker logs) —
  sameloss's names inside sameloss's folder, not searched entry by entry;
* ``.measurements.json.lock``: the lock under which workers merge their rows into
  ``measurements.json`` (``files.update_lock``). (Inside a run folder, a tracker's
  ``tb/`` or ``wandb/`` is the run's: a run folder is judged by its marker.)

Anything else is a user's. ``--fresh`` deletes a folder only when it holds nothing of a
user's, and never deletes a folder without sameloss's marker — except a folder made
before the marker existed whose every entry is one sameloss writes (``legacy_outputs``:
the fixed files and the figures, their data files and the tables its ``report.md``
names); such a folder is then adopted (marked) by ``reproduce`` too. A folder holding
anything of a user's is refused by ``--fresh`` with one line naming the entry, and an
unmarked one is refused by ``reproduce`` altogether (it may be a user's folder that
happens to have the name).
"""

from __future__ import annotations

import re
from pathlib import Path

from ... import files
from ...errors import UserError
from .launch import SUBMITIT_DIR
from .layout import COST_FILE, COSTS_TABLE, EMBEDDED, MEASURED_TABLE, RUNS, SEEDS

MEASUREMENTS = "measurements.json"
OWN_FILES = frozenset({MEASUREMENTS, files.update_lock_path(MEASUREMENTS).name, "report.md", "results.csv",
                       "runs.csv", MEASURED_TABLE, COSTS_TABLE, COST_FILE, files.EXPERIMENT_MARKER, files.OUTPUTS})
MARKER_HEADER = "sameloss experiment folder (sameloss reproduce); files it wrote here:"
# sub-folder -> the test each of its entries must pass to be sameloss's
_RUNS, _EMBEDDED, _SEEDS = RUNS, EMBEDDED, SEEDS
OWN_FOLDERS_WHOLE = frozenset({"data", "continued", SUBMITIT_DIR})


def is_marked(root: Path) -> bool:
    root = Path(root)
    return root.is_dir() and not root.is_symlink() and (root / files.EXPERIMENT_MARKER).is_file()


def listed_outputs(root: Path) -> set[str]:
    """The file names the marker of ``root`` lists (empty without a marker)."""
    try:
        lines = (Path(root) / files.EXPERIMENT_MARKER).read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return set()
    return {line.strip() for line in lines[1:] if line.strip() and "/" not in line}


def mark(root: Path, outputs: set[str] = frozenset()) -> None:
    """Write the marker of ``root`` listing ``outputs`` (and what it listed already)."""
    names = sorted((listed_outputs(root) | set(outputs)) - OWN_FILES)
    files.atomic_write_text(Path(root) / files.EXPERIMENT_MARKER, "\n".join([MARKER_HEADER, *names]) + "\n")


def record_output(path: Path) -> None:
    """Note in the marker of the folder holding ``path`` that sameloss wrote it (a figure
    or a table at the top of an experiment folder); nothing for another folder."""
    path = Path(path)
    root = path.parent
    if path.name in OWN_FILES or not is_marked(root) or path.name in listed_outputs(root):
        return
    mark(root, {path.name})


def forget_output(path: Path) -> None:
    """Drop ``path`` from the marker of the folder holding it (a figure removed because its
    format is no longer asked for); nothing for another folder or a name it does not list."""
    path = Path(path)
    root = path.parent
    listed = listed_outputs(root)
    if not is_marked(root) or path.name not in listed:
        return
    names = sorted((listed - {path.name}) - OWN_FILES)
    files.atomic_write_text(root / files.EXPERIMENT_MARKER, "\n".join([MARKER_HEADER, *names]) + "\n")


_REFERENCE = re.compile(r"!\[[^\]]*\]\(([^)/\s]+)\)|source=([^\s/]+)")
_LINK = re.compile(r"\]\(([^)/\s]+)\)")
# what a figure's caption links beside the image (``report.Figure``): its plotted numbers
# and the same figure in the other formats (``plots.FORMATS``)
_FIGURE_COMPANIONS = (".data.csv", ".png", ".pdf", ".svg")


def legacy_outputs(root: Path) -> set[str]:
    """The files a ``report.md`` of ``root`` names and that exist (its figures, their
    captions' data files and other formats — only those named after a figure it embeds —
    and its tables' source files): sameloss's in a folder made before the marker existed."""
    root = Path(root)
    try:
        text = (root / "report.md").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return set()
    named = {a or b for a, b in _REFERENCE.findall(text)}
    stems = {Path(a).stem for a, _ in _REFERENCE.findall(text) if a}
    named |= {link for link in _LINK.findall(text)
              if any(link == stem + suffix for stem in stems for suffix in _FIGURE_COMPANIONS)}
    return {name for name in named if (root / name).is_file()}


def _is_temporary_of(name: str, owned: set[str]) -> bool:
    """An atomic write's leftover of an owned file (a kill between write and rename)."""
    if name.startswith(".tmp-"):
        return any(name.startswith(f".tmp-{o}-") for o in owned)
    return name.endswith(".tmp") and name[:-4] in owned


def _is_lock_or_partial(entry: Path) -> bool:
    name = entry.name
    if name.startswith(".") and name.endswith(".lock") and entry.is_file() and not entry.is_symlink():
        return True
    return name.startswith(".") and ".partial-" in name and entry.is_dir() and not entry.is_symlink() \
        and (entry / files.PARTIAL_MARKER).is_file()


def foreign_entries(root: Path, *, legacy: bool = False) -> list[str]:
    """Entries under ``root`` that sameloss did not write (paths relative to ``root``'s
    parent), in a stable order; ``legacy``: ``root`` has no marker, and what its
    ``report.md`` names counts as sameloss's (see the module docstring)."""
    root = Path(root)
    owned = set(OWN_FILES) | listed_outputs(root) | (legacy_outputs(root) if legacy else set())
    found = []
    for entry in sorted(root.iterdir(), key=lambda p: p.name):
        rel = f"{root.name}/{entry.name}"
        if entry.is_symlink():
            found.append(rel)
        elif entry.is_file():
            if entry.name not in owned and not _is_temporary_of(entry.name, owned) and not files.is_own_output(entry):
                found.append(rel)
            elif entry.name == REPORT and edited_report(root) is not None:  # the user's lines are in it
                found.append(rel)
        elif not entry.is_dir():
            found.append(rel)
        elif entry.name in OWN_FOLDERS_WHOLE:
            continue
        elif entry.name in (_RUNS, _EMBEDDED, _SEEDS):
            for child in sorted(entry.iterdir(), key=lambda p: p.name):
                if _is_lock_or_partial(child):
                    continue
                if entry.name == _SEEDS:
                    if not is_marked(child):
                        found.append(f"{rel}/{child.name}")
                    else:  # a seed's sub-study, by the same rules (its entries named from here)
                        found += [f"{rel}/{x}" for x in foreign_entries(child)]
                    continue
                ok = files.is_run_dir(child) if entry.name == _RUNS else files.is_embedded_dir(child)
                if not ok:
                    found.append(f"{rel}/{child.name}")
                else:  # inside a run (or embed) folder: its fixed files, and what its .sameloss-outputs lists
                    found += [f"{rel}/{child.name}/{x}" for x in files.foreign_in_run(child)]
        else:
            found.append(rel)
    return found


def check_usable(root: Path, fresh: bool) -> bool:
    """``UserError`` (one line naming the problem) unless ``reproduce`` may use the
    experiment folder ``root`` (with ``fresh``: delete it and start again); returns
    whether it is an unmarked folder of sameloss's outputs (legacy: to be marked)."""
    root = Path(root)
    if root.is_symlink():
        if fresh:
            raise UserError(f"{root} is a symbolic link; --fresh deletes only a real experiment folder: remove the "
                            "link yourself or pass another --out")
        if not root.is_dir():
            raise UserError(f"{root} is a symbolic link to no folder; remove it or pass another --out")
    if root.exists() and not root.is_dir():
        raise UserError(f"{root} exists and is not a folder; pass another --out")
    if not root.exists() or files.is_empty_dir(root):
        return False
    marked = is_marked(root)
    _check_own_files(root)
    if marked and not fresh:  # nothing to refuse (and other processes' units may be writing in it)
        return False
    foreign = foreign_entries(root, legacy=not marked)
    if foreign and not marked:
        raise UserError(f"{root} is not an experiment folder of sameloss reproduce (no {files.EXPERIMENT_MARKER} "
                        f"marker, and it holds {foreign[0]}, which sameloss does not write); move it away or pass "
                        "another --out")
    if foreign and fresh:
        more = f" (and {len(foreign) - 1} more)" if len(foreign) > 1 else ""
        raise UserError(f"--fresh deletes only what sameloss wrote, and {root} also holds {foreign[0]}{more}; "
                        "move it away (or delete the folder yourself) and run again")
    return not marked


def _check_own_files(root: Path) -> None:
    """``UserError`` now, before anything runs, where a file sameloss writes at the top of
    ``root`` (``OWN_FILES``, and the figures and tables the marker lists) is a folder: it is
    a user's (issue 63: a ``measured.csv`` replaced by a folder stopped a finished study's
    rerun with a traceback when the table was written)."""
    for name in sorted(OWN_FILES | listed_outputs(root)):
        path = root / name
        if path.is_dir() and not path.is_symlink():
            raise UserError(f"{path} is a folder, where sameloss writes its {name}; move it away and run again")


REPORT = "report.md"


def edited_report(root: Path) -> Path | None:
    """``root``'s ``report.md`` when it was changed since sameloss wrote it (its sha256,
    listed in ``.sameloss-outputs`` when written, no longer matches: lines a user added);
    ``None`` otherwise, and for a report written before the digests were kept."""
    path = Path(root) / REPORT
    if path.is_symlink() or not path.is_file():
        return None
    digests = files.listed_digests(Path(root)).get(REPORT)
    return path if digests and files.sha256_of(path) not in digests else None


def check_report(root: Path) -> None:
    """``UserError`` now, before a study runs, when its rerun would replace a report a
    user changed (issue 63: lines appended to ``report.md`` were dropped silently)."""
    path = edited_report(root)
    if path is not None:
        raise UserError(f"{path} was changed since sameloss wrote it, and the study writes its report again: keep "
                        "your version under another name (notes in a file of your own beside it stay) and run again")


def unit_folders(root: Path) -> list[tuple[Path, str]]:
    """The folders the units of an experiment lock (``dispatch.execute``), with what
    their locks are called: its seed sub-studies (``"unit"``) and run folders (``"run"``),
    the seed sub-studies' included — what ``--fresh`` locks before it deletes."""
    root = Path(root)
    seeds = [(p, "unit") for p in sorted((root / _SEEDS).glob("*")) if is_marked(p)]
    return seeds + [(p, "run") for p in run_folders(root)]


def run_folders(root: Path) -> list[Path]:
    """The run folders of an experiment folder, its seed sub-studies' included."""
    root = Path(root)
    found = [p for p in sorted((root / _RUNS).glob("*")) if files.is_run_dir(p)]
    for seed in sorted((root / _SEEDS).glob("*")):
        if is_marked(seed):
            found += run_folders(seed)
    return found
