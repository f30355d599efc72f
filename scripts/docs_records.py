"""Result records and the facts the docs quote from them (issue 62): a number a page quotes
about a run is read from that run's record, or from ``sameloss plan``, never typed.

A *record* is a small JSON summary of one real run, committed in ``docs/records/NAME.json``:
the command, the commit, the machine, the load, the date, the wall time, and the numbers a page
quotes (verdicts, estimates, intervals, seeds), with ``source`` saying where it came from — the
run's folder (``python scripts/docs_outputs.py record FOLDER NAME`` writes it), or "transcribed
from the docs of COMMIT" where the run's folder was not kept. A record's figures, when it has
any, are the PNG files in ``docs/records/NAME/`` with their captions in the record.

A *fact* is a number inside a sentence, marked in the page by two HTML comments (invisible on
the site and on GitHub)::

    the main job took <!-- fact isoloss-quick wall_min .1f -->14.9<!-- /fact --> min

``fact SOURCE PATH [FORMAT]``: SOURCE is a record's name, or ``plan:EXPERIMENT:SCALE[:HARDWARE
[:WORKERS]]`` (what ``sameloss plan EXPERIMENT --scale SCALE --hardware HARDWARE --workers
WORKERS`` prints, on a CPU at the reference peak ``hardware.REFERENCE_CPU_PEAK``, so that the
text does not depend on the machine that regenerates it; workers default to 2 on a CPU, 1 on a
GPU). PATH is a dotted path into the record (``wall_min``, ``verdicts[adv @ late].mean``: a
``[KEY]`` picks the list element whose ``test``, ``name``, ``label``, ``model`` or ``run`` is KEY, or a table's
entry KEY when it has spaces or dots), or for a plan a
``/REGEX/`` whose first group is the fact (the first match in the plan's text). FORMAT is a
Python format spec (``.1f``, ``,.0f``, ``+.2f``), or ``ci`` and a spec (``ci.2f``: "mean [low,
high]" of an element with ``mean``, ``t_low`` and ``t_high``); a number's minus sign is
printed as "−".
"""

from __future__ import annotations

import csv
import datetime
import json
import math
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECORDS = ROOT / "docs" / "records"
# what every record says about its run (``check_record``)
REQUIRED = ("name", "command", "commit", "machine", "load", "date", "source")
FACT = re.compile(r"<!-- fact (?P<spec>.*?) -->(?P<value>.*?)<!-- /fact -->")
TOKEN = re.compile(r"(?:\[[^\]]*\]|/(?:[^/\\]|\\.)*/|[^\s\[/])+")
PLAN_PEAK_GFLOPS = 160  # hardware.REFERENCE_CPU_PEAK (a test checks they agree)


class FactError(Exception):
    """A fact that cannot be made: the record, the path or the plan's text is not there."""


# ---- records ---------------------------------------------------------------------------------
def shown(path: Path) -> str:
    """A path as a message names it: relative to the repository when inside it."""
    try:
        return str(Path(path).resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def record_path(name: str) -> Path:
    return RECORDS / f"{name}.json"


@lru_cache(maxsize=None)
def load_record(name: str) -> dict:
    path = record_path(name)
    if not path.exists():
        raise FactError(f"no record {name!r} ({shown(path)})")
    record = json.loads(path.read_text(encoding="utf-8"))
    why = check_record(record, name)
    if why:
        raise FactError(f"record {name!r}: {why}")
    return record


def check_record(record: dict, name: str) -> str | None:
    """Why a record is not one (a field missing, its name not its file's), or None."""
    missing = [k for k in REQUIRED if k not in record]
    if missing:
        return f"missing {', '.join(missing)}"
    if record["name"] != name:
        return f"its name is {record['name']!r}, its file {name}.json"
    return None


def all_records() -> list[str]:
    return sorted(p.stem for p in RECORDS.glob("*.json"))


def lookup(value, path: str):
    """The value at a dotted ``path`` (``a.b[KEY].c``) of a record."""
    for part in re.findall(r"[^.\[\]]+|\[[^\]]*\]", path):
        if part.startswith("["):
            key = part[1:-1]
            if isinstance(value, dict):  # a key with spaces or dots: [KEY]
                if key not in value:
                    raise FactError(f"{path}: no {key!r}")
                value = value[key]
                continue
            if not isinstance(value, list):
                raise FactError(f"{path}: [{key}] of something that is neither a list nor a table")
            found = [x for x in value if isinstance(x, dict)
                     and key in (x.get("test"), x.get("name"), x.get("label"), x.get("model"), x.get("run"))]
            if not found:
                raise FactError(f"{path}: no element {key!r}")
            value = found[0]
        else:
            if not isinstance(value, dict) or part not in value:
                raise FactError(f"{path}: no {part!r}")
            value = value[part]
    return value


def minus(text: str) -> str:
    """A number's minus sign as the typographic one (prose and tables alike)."""
    return re.sub(r"(?<![\w.])-(?=[\d.])", "−", text)


def number(value, spec: str) -> str:
    if value is None or isinstance(value, float) and not math.isfinite(value):
        return "–"
    if isinstance(value, str):
        return value
    return minus(format(value, spec))


def formatted(value, spec: str) -> str:
    """``value`` in the FORMAT of a fact (module docstring)."""
    if spec.startswith("ci"):
        spec = spec[2:] or ".2f"
        if not isinstance(value, dict):
            raise FactError("ci: of something without mean, t_low and t_high")
        return (f"{number(value.get('mean'), spec)} [{number(value.get('t_low'), spec)}, "
                f"{number(value.get('t_high'), spec)}]")
    if isinstance(value, (dict, list)):
        raise FactError("a fact is a number or a word, not a table")
    if not spec:
        return minus(str(value)) if isinstance(value, (int, float)) else str(value)
    try:
        return number(value, spec)
    except (TypeError, ValueError) as exc:
        raise FactError(f"format {spec!r}: {exc}") from None


# ---- plans -----------------------------------------------------------------------------------
def plan_args(source: str) -> list[str]:
    """``plan:EXPERIMENT:SCALE[:HARDWARE[:WORKERS]]`` as ``sameloss plan`` arguments."""
    parts = source.split(":")[1:]
    if len(parts) < 2 or len(parts) > 4:
        raise FactError(f"{source}: plan:EXPERIMENT:SCALE[:HARDWARE[:WORKERS]]")
    experiment, scale, *rest = parts
    hardware = rest[0] if rest else "cpu"
    workers = rest[1] if len(rest) > 1 else ("2" if hardware == "cpu" else "1")
    args = [experiment, "--scale", scale, "--hardware", hardware, "--workers", workers]
    return args + (["--cpu-peak", str(PLAN_PEAK_GFLOPS)] if hardware == "cpu" else [])


@lru_cache(maxsize=None)
def plan_text(args: tuple[str, ...]) -> str:
    """What ``sameloss plan ARGS`` prints (one process per plan; cached for this run)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, "-m", "sameloss.cli", "plan", *args], capture_output=True, text=True,
                          env=env, cwd=ROOT)
    if done.returncode:
        raise FactError(f"sameloss plan {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout


def prefetch_plans(texts: list[str]) -> None:
    """Run every plan the facts of ``texts`` read, at once (one process each, as many at a time
    as there are cores): a plan takes seconds to a minute, and pages quote several."""
    from concurrent.futures import ThreadPoolExecutor

    wanted = set()
    for text in texts:
        for spec in fact_specs(text):
            source = TOKEN.findall(spec)[0] if TOKEN.findall(spec) else ""
            if source.startswith("plan:"):
                try:
                    wanted.add(tuple(plan_args(source)))
                except FactError:
                    pass  # named when the fact is made
    with ThreadPoolExecutor(max_workers=max(1, min(len(wanted), os.cpu_count() or 1))) as pool:
        for _ in pool.map(_quiet_plan, sorted(wanted)):
            pass


def _quiet_plan(args: tuple[str, ...]) -> None:
    try:
        plan_text(args)
    except FactError:
        pass  # named when the fact is made (plan_text is not cached on failure)


def plan_fact(source: str, pattern: str) -> str:
    text = plan_text(tuple(plan_args(source)))
    found = re.search(pattern, text)
    if not found or not found.groups():
        raise FactError(f"{source}: /{pattern}/ (with a group) is not in what sameloss plan prints")
    return found.group(1)


# ---- facts -----------------------------------------------------------------------------------
def fact(spec: str) -> str:
    """The text of the fact ``spec`` (``SOURCE PATH [FORMAT]``)."""
    words = TOKEN.findall(spec)
    if len(words) not in (2, 3):
        raise FactError(f"fact {spec!r}: SOURCE PATH [FORMAT]")
    source, path, fmt = words[0], words[1], words[2] if len(words) == 3 else ""
    if source.startswith("plan:"):
        if not (path.startswith("/") and path.endswith("/") and len(path) > 2):
            raise FactError(f"fact {spec!r}: a plan's fact is a /REGEX/")
        value = plan_fact(source, path[1:-1])
        return formatted(float(value.replace(",", "")), fmt) if fmt else value
    return formatted(lookup(load_record(source), path), fmt)


def fill_facts(text: str, errors: list[str], where: str) -> str:
    """``text`` with every fact's value made anew (a fact that cannot be made: named in
    ``errors``, its value left)."""
    def one(m: re.Match) -> str:
        try:
            value = fact(m["spec"])
        except FactError as exc:
            errors.append(f"{where}: {exc}")
            return m.group(0)
        return f"<!-- fact {m['spec']} -->{value}<!-- /fact -->"

    return FACT.sub(one, text)


def fact_specs(text: str) -> list[str]:
    return [m["spec"] for m in FACT.finditer(text)]


# ---- tables from records ---------------------------------------------------------------------
def _ci(row: dict, keys=("mean", "t_low", "t_high"), spec: str = ".2f") -> str:
    if isinstance(row.get("digits"), int):  # a row transcribed with fewer digits keeps them
        spec = f".{row['digits']}f"
    values = (row.get(k) for k in keys)
    return formatted(dict(zip(("mean", "t_low", "t_high"), (_value(v) if isinstance(v, str) else v for v in values))),
                     "ci" + spec)


def verdict_table(record: dict) -> str:
    """A record's verdicts as the table the results pages show (accuracy, MDE, Holm, verdicts)."""
    rows = record.get("verdicts") or []
    if not rows:
        raise FactError(f"record {record['name']!r} has no verdicts")
    lines = ["| comparison @ point | pairs used | mean [95 %] (points) | MDE | Holm p | verdict | after Holm |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        used = f"{r['used']}/{r['of']}" if r.get("of") is not None else str(r.get("used", "–"))
        lines.append(f"| {r['test']} | {used} | {_ci(r)} | {number(r.get('mde'), '.2f')} | "
                     f"{number(r.get('holm_p'), '.3f')} | {r.get('verdict', '–')} | {r.get('after_holm') or '–'} |")
    return "\n".join(lines) + "\n"


def trace_table(record: dict) -> str:
    """A record's trace verdicts beside its verdicts (the trace of the Hessian, Fisher)."""
    rows = [r for r in record.get("verdicts") or [] if "trace" in r]
    if not rows:
        raise FactError(f"record {record['name']!r} has no trace verdicts")
    lines = ["| comparison @ point | trace [95 %] | trace δ | trace verdict |", "|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['test']} | {_ci(r, ('trace', 'trace_low', 'trace_high'), '.3f')} | "
                     f"{number(r.get('trace_margin'), '.3f')} | {r.get('trace_verdict', '–')} |")
    return "\n".join(lines) + "\n"


def pooled_table(record: dict) -> str:
    """A study across languages: per comparison the pooled estimate and each language's (a
    record of the stratified model: its verdict after Holm, δ, power and the interaction test;
    an earlier record: random effects with its MDE and I²)."""
    rows = record.get("pooled") or []
    if not rows:
        raise FactError(f"record {record['name']!r} has no pooled rows")
    languages = [lang["name"] for lang in record.get("languages", [])]
    if record.get("pooling") == "stratified":
        head = ["comparison @ point", "pooled [95 %] (stratified FE)", "δ", "pooled verdict", "after Holm",
                "power", "interaction p", *languages]
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for r in rows:
            each = [r.get("each", {}).get(name, "–") for name in languages]
            lines.append(f"| {r['test']}{' (claim)' if r.get('family') == 'claims' else ''} | {_ci(r)} | "
                         f"{number(r.get('margin'), 'g')} | {r['verdict']} | {r.get('after_holm') or '–'} | "
                         f"{number(r.get('power'), '.2f')} | {number(r.get('interaction_p'), '.2g')} | "
                         + " | ".join(each) + " |")
        return "\n".join(lines) + "\n"
    head = ["comparison @ point", "pooled [95 %]", "pooled MDE", "pooled verdict", *languages, "I²"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        each = [r.get("each", {}).get(name, "–") for name in languages]
        digits = f".{r['digits']}f" if isinstance(r.get("digits"), int) else ".2f"
        lines.append(f"| {r['test']} | {_ci(r)} | {number(r.get('mde'), digits)} | {r['verdict']} | "
                     + " | ".join(each) + f" | {number(r.get('i2'), '.2f')} |")
    return "\n".join(lines) + "\n"


def run_line(record: dict) -> str:
    """Two sentences: the run (command, date, machine, commit, wall time, load), then where its
    record came from."""
    wall = record.get("wall_min")
    cpu = record.get("cpu_s")
    return (f"Run {record['date']}: `{record['command']}` on {record['machine']}"
            + (f", commit `{record['commit']}`" if record.get("commit") else "")
            + (f"; {number(wall, '.1f')} min wall" if wall is not None else "")
            + (f", {number(cpu, ',.0f')} CPU-s" if cpu is not None else "")
            + f"; load {record['load']}. Its record, `docs/records/{record['name']}.json`: {record['source']}.\n")


def claims_list(record: dict) -> str:
    """A recipe's claims of the paper, checked: what the paper says, this run, the direction."""
    claims = record.get("claims") or []
    if not claims:
        raise FactError(f"record {record['name']!r} has no claims")
    return "\n".join(f"- **Paper:** {c['paper']}  \n  **This run:** {minus(c['this_run'])} **Direction:** "
                     f"{c['direction']}." for c in claims) + "\n"


def power_tables(record: dict) -> str:
    """``bench/isoloss_power.py --json``'s record: the designs' rates after Holm, the pooling's
    size, the flatness trend's size and power, the extrapolation rule's bias and coverage."""
    out = []
    for scale, rows in record["designs"].items():
        out += [f"**{scale}** (each claim on its planned seeds, Holm over the {len(rows)} claims; rates of a verdict "
                "that survives Holm):", "",
                "| claim | seeds | prior SD | δ | type-I at 0 | \"no effect\" at 0 | power at δ | \"no effect\" at δ "
                "| power at the planned effect |", "|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            planned = f"{number(r['power_at_planned'], '.3f')} at {r['planned']:g}" if r["control"] else "–"
            out.append(f"| {r['test']} | {r['seeds']} | {number(r['sd'], '.2f')} | {r['margin']:g} | "
                       f"{number(r['type1_at_0'], '.3f')} | {number(r['null_power_at_0'], '.3f')} | "
                       f"{number(r['power_at_margin'], '.3f')} | {number(r['tost_size_at_margin'], '.3f')} | {planned} |")
        out.append("")
    out += ["**Pooling across languages** (type-I at 0 and TOST's size at the margin of 1 point):", "",
            "| case | languages | seeds each | stratified FE: type-I | TOST | RE, HKSJ truncated: type-I | TOST "
            "| HKSJ untruncated: TOST |", "|---|---|---|---|---|---|---|---|"]
    for r in record["pooling"]:
        out.append(f"| {r['case']} | {r['languages']} | {r['seeds']} | {number(r['fe_type1'], '.3f')} | "
                   f"{number(r['fe_tost'], '.3f')} | {number(r['re_type1'], '.3f')} | {number(r['re_tost'], '.3f')} | "
                   f"{number(r['hksj_tost'], '.3f')} |")
    a = record["arms"]
    out += ["", f"**Flatness by assigned arm** (arms {', '.join(a['arms'])} on {a['seeds']} seeds, SD "
            f"{number(a['sd'], '.2f')}): the trend test's size {number(a['size (every arm at 0)'], '.3f')} (every arm "
            f"at 0), its power {number(a['power (strongest arm at δ)'], '.3f')} (the strongest arm at δ).", "",
            "**The extrapolation rule** with a curved KL–accuracy relation (true difference 1 point):", "",
            "| checkpoints | rule | bias (points) | 95 % coverage |", "|---|---|---|---|"]
    for r in record["extrapolation"]:
        out.append(f"| {r['checkpoints']} | {r['rule']} | {number(r['bias'], '+.3f')} | {number(r['coverage'], '.3f')} |")
    return "\n".join(out) + "\n"


TABLES = {"verdicts": verdict_table, "traces": trace_table, "pooled": pooled_table, "run": run_line,
          "claims": claims_list, "power": power_tables}


def record_block(name: str, view: str) -> str:
    if view not in TABLES:
        raise FactError(f"record {name}: unknown view {view!r}; one of {', '.join(TABLES)}")
    return TABLES[view](load_record(name))


def record_figures(name: str, page: Path, only: tuple[str, ...] = ()) -> str:
    """The figures a record keeps (``docs/records/NAME/``), embedded with their captions."""
    record = load_record(name)
    figures = [f for f in record.get("figures") or [] if not only or Path(f["file"]).stem in only]
    if not figures:
        raise FactError(f"record {name!r} keeps no figure{' ' + ','.join(only) if only else ''}")
    out = []
    for number, f in enumerate(figures, 1):
        path = RECORDS / name / f["file"]
        if not path.exists():
            raise FactError(f"record {name!r}: its figure {shown(path)} is missing")
        rel = os.path.relpath(path, page.parent).replace(os.sep, "/")
        # numbered as the page shows them: a record may keep some of its report's figures only
        caption = re.sub(r"^Figure \d+\. ", f"Figure {number}. ", f["caption"])
        out.append(f"![{f['alt']}]({rel})\n\n*{caption}*\n")
    return "\n".join(out)


# ---- writing a record from a finished study ---------------------------------------------------
def _rows(path: Path) -> list[dict]:
    if not path.exists():
        return []
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _value(text: str):
    """A CSV cell as JSON: a number where it is one (NaN: null), else the text."""
    if text in ("", None):
        return None
    try:
        v = float(text)
    except ValueError:
        return {"True": True, "False": False}.get(text, text)
    if not math.isfinite(v):
        return None
    return int(v) if v.is_integer() and re.fullmatch(r"-?\d+", text.strip()) else float(f"{v:.6g}")


VERDICT_COLUMNS = ("test", "claim", "sign", "mean", "t_low", "t_high", "mde", "holm_p", "verdict", "after_holm",
                   "used", "of", "family", "power", "trace", "trace_low", "trace_high", "trace_margin", "trace_verdict")
FIGURE = re.compile(r"^!\[(?P<alt>[^\]]*)\]\((?P<file>[^)]+\.png)\)\s*$")
CAPTION = re.compile(r"^\*\*Figure (?P<n>\d+)\.\*\* (?P<text>.*)$")
LINK = re.compile(r"\[([^\]]*)\]\((?![a-z]+://)[^)]*\)")


def _header(report: str) -> dict:
    out = {}
    found = re.search(r"Command: `([^`]*)` — written (\S+ \S+ UTC) on ([^\n]*?)\.\n", report)
    if found:
        out.update(command=found.group(1), date=found.group(2), machine=found.group(3))
    wall = re.search(r"Wall time of this call: (\d+) s", report)
    if wall:
        out["wall_min"] = round(int(wall.group(1)) / 60, 1)
    runtime = re.search(r"Runtime: [^\n]*?load average ([\d.]+) at the end", report)
    if runtime:
        out["load_at_end"] = float(runtime.group(1))
    return out


def _figures(report: str) -> list[dict]:
    lines = report.splitlines()
    out = []
    for i, line in enumerate(lines):
        found = FIGURE.match(line)
        if not found:
            continue
        caption = CAPTION.match(lines[i + 1]) if i + 1 < len(lines) else None
        text = LINK.sub(r"\1", caption["text"]) if caption else found["alt"]
        out.append({"file": found["file"], "alt": found["alt"],
                    "caption": (f"Figure {caption['n']}. " if caption else "") + text})
    return out


def _pooled(rows: list[dict]) -> dict:
    """A study across languages (``replication.csv``): its languages and, per comparison, the
    pooled estimate, verdict and each language's cell as the table shows it (``each``) and its
    numbers for a sentence (``by_language[TAG].mean``, ...): the stratified fixed-effects model's
    (its δ, df, verdict after Holm, power, interaction p; random effects beside it) where the
    table has ``pooled_df``, else (an earlier study's) random effects with HKSJ, its MDE and I²."""
    tags = [c[:-len("_verdict")] for c in rows[0] if c.endswith("_verdict") and c != "pooled_verdict"]

    def cell(r: dict, tag: str) -> str:
        if _value(r.get(f"{tag}_mean")) is None:
            return r.get(f"{tag}_verdict") or "–"
        return _ci(r, (f"{tag}_mean", f"{tag}_low", f"{tag}_high")) + f" ({_short(r.get(f'{tag}_verdict'))})"

    def by_language(r: dict) -> dict:
        return {t: {k: _value(r.get(f"{t}_{k}")) for k in ("mean", "low", "high", "used")}
                | {"verdict": r.get(f"{t}_verdict")} for t in tags}

    if "pooled_df" in rows[0]:
        return {"pooling": "stratified", "languages": [{"name": t} for t in tags],
                "pooled": [{"test": r["test"], "family": r.get("holm_family"), "mean": _value(r.get("pooled")),
                            "t_low": _value(r.get("pooled_low")), "t_high": _value(r.get("pooled_high")),
                            "df": _value(r.get("pooled_df")), "margin": _value(r.get("margin")),
                            "verdict": r.get("pooled_verdict"), "after_holm": r.get("pooled_after_holm"),
                            "decided": r.get("pooled_decided") == "True", "power": _value(r.get("pooled_power")),
                            "interaction_p": _value(r.get("interaction_p")),
                            "pooled_languages": _value(r.get("pooled_languages")), "agreement": r.get("agreement"),
                            "random": _value(r.get("random")), "random_low": _value(r.get("random_low")),
                            "random_high": _value(r.get("random_high")), "tau2": _value(r.get("tau2")),
                            "each": {t: cell(r, t) for t in tags}, "by_language": by_language(r)} for r in rows]}
    return {"languages": [{"name": t} for t in tags],
            "pooled": [{"test": r["test"], "mean": _value(r.get("random")), "t_low": _value(r.get("random_low")),
                        "t_high": _value(r.get("random_high")), "mde": _value(r.get("random_mde")),
                        "verdict": r.get("pooled_verdict"), "i2": _value(r.get("i2")),
                        "fixed": _value(r.get("pooled")), "each": {t: cell(r, t) for t in tags},
                        "by_language": by_language(r)} for r in rows]}


def _short(verdict) -> str:
    """A language's verdict in a table cell: its first words ("no effect beyond ±1")."""
    return str(verdict or "–").split(":")[0].split(" (")[0]


def _commit() -> str:
    def git(*args):
        return subprocess.run(["git", *args], capture_output=True, text=True, cwd=ROOT).stdout.strip()

    head = git("rev-parse", "--short", "HEAD")
    return head + ("+changes" if git("status", "--porcelain", "--untracked-files=no") else "") if head else ""


@dataclass(frozen=True)
class About:
    """What a record says that the study's folder does not: the load while it ran, the commit
    (default: this checkout's HEAD), the machine in words (default: report.md's), the command's
    CPU seconds (e.g. from /usr/bin/time), the CSV files whose rows it keeps
    (``FILE[:COLUMN,...]``), the command's time and the date the run ended."""

    load: str = ""
    commit: str = ""
    machine: str = ""
    cpu_s: float | None = None
    csvs: tuple[str, ...] = ()
    time: dict | None = None  # what ``/usr/bin/time -v`` measured of the command (``time_log``)
    date: str = ""  # when the run ended (default: report.md's: a report re-written later has its call's)


TIME_LINES = {"wall": r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (\S+)",
              "user": r"User time \(seconds\): ([\d.]+)", "system": r"System time \(seconds\): ([\d.]+)",
              "percent": r"Percent of CPU this job got: (\d+)%"}


def time_log(path: Path) -> dict:
    """The command's wall time, CPU seconds and share of a core from ``/usr/bin/time -v``'s
    report (the last one in the file: a log may hold the command's own output first)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise FactError(f"{path}: {exc.strerror or exc}") from None
    found = {k: re.findall(pattern, text) for k, pattern in TIME_LINES.items()}
    missing = [k for k, v in found.items() if not v]
    if missing:
        raise FactError(f"{path}: no /usr/bin/time -v report in it (no {', '.join(missing)} line)")
    seconds = _clock_seconds(found["wall"][-1])
    user, system = float(found["user"][-1]), float(found["system"][-1])
    return {"wall": _clock(seconds), "wall_min": round(seconds / 60, 1), "cpu_s": round(user + system),
            "cpu_system_s": round(system), "cpu_percent": int(found["percent"][-1])}


def _clock_seconds(text: str) -> float:
    """Seconds of an ``h:mm:ss`` or ``m:ss`` clock (``/usr/bin/time``'s)."""
    parts = [float(x) for x in text.split(":")]
    return sum(x * 60 ** i for i, x in enumerate(reversed(parts)))


def _clock(seconds: float) -> str:
    whole = int(seconds)
    return f"{whole // 3600}:{whole // 60 % 60:02d}:{whole % 60:02d}"


def untimed_span(text: str) -> float:
    """Seconds of a span ``START..END`` (ISO date-times, e.g. ``2026-11-29T13:11:23..2026-11-29T15:53:33``):
    a part of a run that ``/usr/bin/time`` did not report, e.g. a call killed with its session and
    then resumed, its span read from its log's and files' times."""
    try:
        start, end = (datetime.datetime.fromisoformat(x.strip()) for x in text.split(".."))
    except ValueError:
        raise FactError(f"{text!r}: not a span START..END of ISO date-times "
                        f"(e.g. 2026-11-29T13:11:23..2026-11-29T15:53:33)") from None
    if end <= start:
        raise FactError(f"{text!r}: the span ends before it starts")
    return (end - start).total_seconds()


def timed_calls(reports: list[dict], untimed: list[float]) -> dict | None:
    """The record's time of a run made of several calls (a study interrupted and resumed): the wall
    time of every call summed — those ``/usr/bin/time`` reported (``time_log``) and the untimed
    spans' (``untimed_span``) — and the CPU seconds of the reported calls only (``cpu_s``: an untimed
    call's CPU is not known, and the record says how much wall time that leaves out)."""
    if not reports and not untimed:
        return None
    if len(reports) == 1 and not untimed:
        return reports[0]
    timed_s = sum(_clock_seconds(r["wall"]) for r in reports)
    seconds = timed_s + sum(untimed)
    out = {"wall": _clock(seconds), "wall_min": round(seconds / 60, 1), "calls": len(reports) + len(untimed),
           "timed_wall_min": round(timed_s / 60, 1), "untimed_wall_min": round(sum(untimed) / 60, 1)}
    if reports:
        cpu = sum(r["cpu_s"] for r in reports)
        out.update(cpu_s=cpu, cpu_system_s=sum(r["cpu_system_s"] for r in reports),
                   cpu_percent=round(100 * cpu / timed_s) if timed_s else 0)
    return out


def study_record(folder: Path, name: str, about: About = About()) -> dict:
    """The record of a finished study folder (``OUT/EXPERIMENT-SCALE``): its report's command,
    date, machine and wall time; its CPU seconds (``costs.csv``); isoloss's verdicts
    (``verdicts.csv``), what it decided (``decided.csv``) and its pooled rows
    (``replication.csv``); its claims of the paper, checked (another recipe's), the rows of the
    CSV files ``csvs`` (``tables``: e.g. ``results.csv``); the figures its report embeds (copied
    beside the record)."""
    report = (folder / "report.md").read_text(encoding="utf-8")
    head = _header(report)
    if "command" not in head:
        raise FactError(f"{folder}/report.md names no command: not a finished study's report")
    record = {"name": name, "command": head["command"], "commit": about.commit or _commit(),
              "machine": about.machine or head["machine"],
              "load": about.load or (f"{head['load_at_end']} at the end" if "load_at_end" in head else "not recorded"),
              "date": about.date or head["date"], "source": f"the run's folder {folder.name}, recorded "
                                             f"{datetime.date.today().isoformat()} by scripts/docs_outputs.py record",
              "wall_min": head.get("wall_min")}
    if about.time:  # the command as /usr/bin/time measured it (a report re-written later has its own call's time)
        record.update(about.time)
    if about.cpu_s is not None:
        record["cpu_s"] = round(about.cpu_s)
    costs = _rows(folder / "costs.csv")
    if costs:
        # the units' own CPU seconds (costs.csv): not the command's start-up, nor a worker's
        record["units_cpu_s"] = round(sum(float(r["cpu_seconds"] or 0) for r in costs))
    verdicts = _rows(folder / "verdicts.csv")
    if verdicts:
        record["verdicts"] = [{k: _value(r.get(k)) for k in VERDICT_COLUMNS if k in r} for r in verdicts]
    decided = _rows(folder / "decided.csv")
    if decided:  # the claims' (Holm's family of the paper's claims) where decided.csv names families
        claims = [r for r in decided if r.get("family") == "claims"] or decided
        record.update(_decided([(r["test"], r["decided"] == "True") for r in claims]))
    seeds = _rows(folder / "runtime.csv")
    if seeds:
        record["seeds"] = len(seeds)
    pooled = _rows(folder / "replication.csv")
    if pooled:
        record.update(_pooled(pooled))
        if record.get("pooling") == "stratified":  # what a study across languages decided: its pooled claims
            record.update(_decided([(r["test"], r["decided"]) for r in record["pooled"] if r["family"] == "claims"]))
        for key, pattern in (("which_hold", r"^\*\*Which claims hold:\*\* (.*)$"),
                             ("not_tested", r"^\*\*Not tested here:\*\* (.*)$"),
                             ("gate_selection", r"The seeds each language ran, and what its gate admitted: (.*)$")):
            found = re.search(pattern, report, re.M)
            if found:  # without the Markdown line break ("  ") that ends the report's line
                record[key] = found.group(1).strip()
    claims = _claims(report)
    if claims:
        record["claims"] = claims
    for spec in about.csvs:  # FILE or FILE:COLUMN,COLUMN,...
        name, _, columns = spec.partition(":")
        rows = _rows(folder / name)
        if not rows:
            raise FactError(f"{folder / name}: no such file, or no rows")
        keep = columns.split(",") if columns else list(rows[0])
        missing = [c for c in keep if c not in rows[0]]
        if missing:
            raise FactError(f"{folder / name} has no column {', '.join(missing)}")
        record.setdefault("tables", {})[name] = [{k: _value(r[k]) for k in keep} for r in rows]
    answer = re.search(r"^\*\*Answer:\*\* (.*)$", report, re.M)
    if answer:  # the report's one-sentence answer, as it opens the report
        record["answer"] = answer.group(1)
    record["figures"] = _figures(report)
    return record


CLAIM = re.compile(r"^- \*\*Paper:\*\* (?P<paper>.*?)  \n  \*\*This run:\*\* (?P<run>.*?) \*\*Direction:\*\* "
                   r"(?P<direction>.*?)\.$", re.M)


def _decided(claims: list[tuple[str, bool]]) -> dict:
    """What a study decided of its claims (``(test, decided)``): how many, of how many, which."""
    return {"decided": sum(d for _, d in claims), "planned": len(claims),
            "decided_tests": [t for t, d in claims if d]}


def _claims(report: str) -> list[dict]:
    """The report's claims of the paper, checked: what the paper says, what this run measured and
    the direction (a recipe's ``Claim``s)."""
    return [{"paper": m["paper"], "this_run": m["run"], "direction": m["direction"]} for m in CLAIM.finditer(report)]


def write_record(folder: Path, name: str, about: About = About(), force: bool = False, figures: bool = True,
                 only: tuple[str, ...] = ()) -> Path:
    """``study_record`` written to ``docs/records/NAME.json``, its figures to ``docs/records/NAME/``
    (none with ``figures=False``; ``only``: those whose file stems are named; an existing record
    is replaced only with ``force``)."""
    if not re.fullmatch(r"[a-z0-9][a-z0-9.+-]*", name):
        raise FactError(f"record name {name!r}: lower-case letters, digits, '.', '+' and '-'")
    path = record_path(name)
    if path.exists() and not force:
        raise FactError(f"{shown(path)} exists (--force replaces it)")
    record = study_record(folder, name, about)
    stems = {Path(f["file"]).stem for f in record["figures"]}
    unknown = [s for s in only if s not in stems]
    if unknown:
        raise FactError(f"{folder}/report.md embeds no figure {', '.join(unknown)} (it has {', '.join(sorted(stems))})")
    kept_in = RECORDS / name
    if kept_in.exists():
        shutil.rmtree(kept_in)
    kept = []
    for f in record["figures"] if figures else []:
        if only and Path(f["file"]).stem not in only:
            continue
        if (folder / f["file"]).exists():
            kept_in.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(folder / f["file"], kept_in / Path(f["file"]).name)
            kept.append({**f, "file": Path(f["file"]).name})
    record["figures"] = kept
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return path
