"""Languages found by ``sameloss language search`` and registered by name (issue 48): one small
TOML file per language in ``languages/registered/`` — a new language is one file in one folder.
(A module of the base layer, beside ``registry``: ``language describe --help`` lists the names
without importing the languages, hence torch.)

    sameloss language search hmm n_states=4..8 ... --gate-seeds 16 --register hmm:search-1
    sameloss language describe hmm:search-1          # the record: gate per seed, the command
    sameloss reproduce isoloss --language hmm:search-1

A record holds the name (``FAMILY:LABEL``, e.g. ``hmm:search-1``), the ``--language`` spec the
search printed as passing (the first passing draw in its drawing order: the search writes the
record itself, nothing is picked by hand), the exact command that found it, the isoloss scale
whose gate it passed and that gate per seed (the trained base, the look-up table, the
random-init encoder and the oracle at the primary probe, in points, and the three margins).
The name resolves to the spec wherever ``--language`` takes one (``isoloss.parse_language``).
Reads TOML only: no torch, no languages, no experiments.
"""

from __future__ import annotations

import math
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from .errors import UserError

REGISTERED = Path(__file__).parent / "languages" / "registered"  # the folder: one ``<family>-<label>.toml`` per language
# the per-seed gate columns a record keeps (``experiments.search.gate``'s row), points
GATE_COLUMNS = ("seed", "trained", "lookup", "random_init", "oracle", "above_lookup", "above_random_init",
                "below_oracle", "ok")
NAME = re.compile(r"^(?P<family>[a-z][a-z0-9_]*):(?P<label>[a-z][a-z0-9-]*)$")


@dataclass(frozen=True)
class Found:
    """One registered language (module docstring)."""

    name: str
    spec: str
    command: str
    scale: str
    gate_pass: float  # the share of seeds the search required
    margin: float  # the gate's margin in points (the study's ``verdicts.headroom_margin``)
    gate: tuple[dict, ...]  # per seed: ``GATE_COLUMNS``

    @property
    def family(self) -> str:
        return self.name.partition(":")[0]

    @property
    def passed(self) -> int:
        return sum(bool(r["ok"]) for r in self.gate)

    @property
    def file(self) -> str:
        return self.name.replace(":", "-") + ".toml"


def check_name(name: str, family: str, sizes: tuple[str, ...] = ()) -> None:
    """``UserError`` unless ``name`` is ``FAMILY:LABEL`` of ``family`` whose label is not one of
    the family's sizes (``hmm:headroom`` already means a size)."""
    m = NAME.match(name or "")
    if m is None or m["family"] != family:
        raise UserError(f"--register {name!r}: give {family}:LABEL (LABEL: lower-case letters, digits, '-'), "
                        f"e.g. {family}:search-1")
    if m["label"] in sizes:
        raise UserError(f"--register {name!r}: {m['label']!r} is a size of {family}; choose another label")


def _read(path: Path) -> Found:
    try:
        d = tomllib.loads(path.read_text(encoding="utf-8"))
        gate = tuple({k: r[k] for k in GATE_COLUMNS} for r in d["gate"])
        found = Found(str(d["name"]), str(d["spec"]), str(d["command"]), str(d["scale"]), float(d["gate_pass"]),
                      float(d["margin"]), gate)
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, KeyError, TypeError, ValueError) as exc:
        raise UserError(f"{path}: not a registered language record ({exc})") from None
    if found.file != path.name:
        raise UserError(f"{path}: holds {found.name!r}, whose file would be {found.file}")
    return found


def registered(folder: Path | None = None) -> dict[str, Found]:
    """Every registered language by name, in file-name order (``UserError`` naming a damaged
    record: what reads them all — the study across the registered languages — must not
    leave one out silently)."""
    folder = REGISTERED if folder is None else Path(folder)
    return {f.name: f for f in (_read(p) for p in sorted(folder.glob("*.toml")))} if folder.is_dir() else {}


def names(folder: Path | None = None) -> list[str]:
    """The registered names, from the records' file names alone (``<family>-<label>.toml``),
    without reading them (issue 63: one damaged record made the parser, hence every command,
    even ``pretrain --help``, fail); a damaged one is an error when its language is used."""
    folder = REGISTERED if folder is None else Path(folder)
    if not folder.is_dir():
        return []
    found = (p.stem.replace("-", ":", 1) for p in sorted(folder.glob("*.toml")))
    return [name for name in found if NAME.match(name)]


def lookup(name: str, folder: Path | None = None) -> Found | None:
    """The registered language ``name`` (``None``: no such name; cheap when the text is no name),
    read from its own record only: another record's damage is not this name's."""
    if NAME.match(name.strip()) is None:
        return None
    path = (REGISTERED if folder is None else Path(folder)) / (name.strip().replace(":", "-") + ".toml")
    return _read(path) if path.is_file() else None


def _toml(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else "nan"
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def record_text(found: Found) -> str:
    """The record as TOML (``_read`` reads it back)."""
    head = ["# a language found by `sameloss language search` (src/sameloss/found.py); written by "
            "its --register", *(f"{k} = {_toml(getattr(found, k))}" for k in
                                ("name", "spec", "command", "scale", "gate_pass", "margin"))]
    rows = ["", *("\n".join(["[[gate]]", *(f"{k} = {_toml(r[k])}" for k in GATE_COLUMNS)]) + "\n" for r in found.gate)]
    return "\n".join(head) + "\n" + "\n".join(rows)


def write(found: Found, folder: Path | None = None) -> Path:
    """Write the record (``UserError`` if the name is registered with another spec: a name
    means one language for good; the same spec is rewritten, e.g. by a rerun of its search)."""
    from .files import atomic_write_text
    from .storage import storage_errors

    folder = REGISTERED if folder is None else Path(folder)
    known = lookup(found.name, folder)  # a damaged record of this name: an error naming it
    if known is not None and known.spec != found.spec:
        raise UserError(f"--register {found.name}: already registered as {known.spec} ({folder / found.file}); "
                        "choose another name")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / found.file
    with storage_errors(path):
        atomic_write_text(path, record_text(found))
    return path


def _items(spec: str) -> tuple[str, str, list[str]]:
    """A record's spec (``NAME:SIZE:key=value,...``, as the search prints it) split: name, size,
    its ``key=value`` items."""
    name, size, rest = (spec.split(":") + ["", ""])[:3]
    return name, size, [i for i in rest.split(",") if i]


def settings_of(spec: str) -> tuple[str, str, int | None, str | None]:
    """``(family, size, seed, params)`` of a record's spec (``task=`` is the study's, not the
    language's: ``task_of``)."""
    name, size, items = _items(spec)
    items = [i for i in items if not i.startswith("task=")]
    seed = next((int(i.partition("=")[2]) for i in items if i.startswith("seed=")), None)
    return name, size, seed, ",".join(i for i in items if not i.startswith("seed=")) or None


def task_of(spec: str) -> str | None:
    """The task a record's spec names (``task=``), ``None`` where it names none."""
    return next((i.partition("=")[2] for i in _items(spec)[2] if i.startswith("task=")), None)


def describe_args(args) -> Found | None:
    """``language describe NAME`` of a registered name: its record, with ``args`` set to its
    language (family, size, seed, params); ``None`` where ``args.name`` is a family."""
    found = lookup(args.name)
    if found is None:
        return None
    if any(getattr(args, k) is not None for k in ("size", "params", "grammar", "seed")):
        raise UserError(f"{args.name} is a registered language: its size, seed and settings are its own "
                        "(no --size, --seed, --params or --grammar)")
    args.name, args.size, args.seed, args.params = settings_of(found.spec)
    return found


def describe_text(found: Found) -> str:
    """What ``sameloss language describe NAME`` prints before the language's own summary."""
    lines = [f"registered  {found.name} = {found.spec}",
             f"found by    {found.command}",
             f"gate        passed on {found.passed} of {len(found.gate)} seeds' bases (isoloss scale {found.scale}; "
             f"required: {found.gate_pass:.4g} of them; margins >= {found.margin:g} points: trained - look-up, "
             "trained - random-init, oracle - trained)",
             f"  {'seed':>4} {'look-up':>8} {'random-init':>11} {'trained':>8} {'oracle':>7}   margins"]
    for r in found.gate:
        lines.append(f"  {r['seed']:>4} {r['lookup']:>8.1f} {r['random_init']:>11.1f} {r['trained']:>8.1f} "
                     f"{r['oracle']:>7.1f}   {r['above_lookup']:+.1f} / {r['above_random_init']:+.1f} / "
                     f"{r['below_oracle']:+.1f}{'' if r['ok'] else '  FAILED'}")
    lo = {k: min(r[k] for r in found.gate) for k in ("above_lookup", "above_random_init", "below_oracle")}
    lines.append(f"  smallest margins: {lo['above_lookup']:+.1f} / {lo['above_random_init']:+.1f} / "
                 f"{lo['below_oracle']:+.1f}")
    return "\n".join(lines)


__all__ = ["Found", "REGISTERED", "check_name", "describe_args", "describe_text", "lookup", "names", "record_text", "registered", "settings_of", "task_of", "write"]
