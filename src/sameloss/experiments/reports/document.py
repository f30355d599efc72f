"""Tables, claims and the Markdown report of an experiment.

Every number in a table is read from a results file: a ``Table`` holds rows (dicts) and
``Column``s naming the keys to show, and the Markdown writes, before each table, a comment

    <!-- table source=results.csv key=model columns=loss±loss_std,probe_B±probe_B_std*100 -->

that says where each cell comes from: the row whose ``key`` column equals the first cell,
then per column ``value`` (``±err``, ``[low,high]``, ``*scale`` when present). The test
suite parses the tables back and checks every printed number against those files.

Claims are sentences computed from the numbers (``claims.py``); nothing in a report is
written in advance.
"""

from __future__ import annotations

import contextlib
import csv
import io
import itertools
import math
from dataclasses import dataclass, field
from pathlib import Path

from ...files import atomic_writer, write_output

MISSING = "–"
# where every word of a report and of the terminal's answer is defined (fork ids, late and scratch,
# target KL, δ, MDE, TOST, the Holm families, ...): the docs' glossary, named by its path in the repository
GLOSSARY = "docs/reference/glossary.md"
GLOSSARY_LINE = f"The words (fork ids, late and scratch, target KL, δ, MDE, TOST, Holm families): {GLOSSARY}."


@dataclass(frozen=True)
class Column:
    header: str
    key: str
    err: str | None = None  # shown as "value ± err"
    ci: tuple[str, str] | None = None  # shown as "value [low, high]"
    scale: float = 1.0  # e.g. 100 for accuracies in %
    fmt: str = ".4g"  # a format spec; "d" rounds to an integer
    err_fmt: str | None = None  # of the error (default: ".2g" when fmt is ".Ng", else fmt)
    text: bool = False  # shown as it is (not a number)

    def spec(self) -> str:
        if self.text:
            return f"{self.key}!text"
        s = self.key
        if self.err:
            s += f"±{self.err}"
        if self.ci:
            s += f"[{self.ci[0]},{self.ci[1]}]"
        if self.scale != 1.0:
            s += f"*{self.scale:g}"
        return s

    def cell(self, row: dict) -> str:
        if self.text:
            v = row.get(self.key)
            return MISSING if v in (None, "") else str(v).replace("|", "/")
        value = _number(row.get(self.key))
        if value is None:
            return MISSING
        text = self._f(value)
        if self.err:
            err = _number(row.get(self.err))
            if err is not None:
                text += f" ± {self._f(err, self._err_fmt())}"
        if self.ci:
            lo, hi = (_number(row.get(k)) for k in self.ci)
            if lo is not None and hi is not None:
                text += f" [{self._f(lo)}, {self._f(hi)}]"
        return text

    def _err_fmt(self) -> str:
        if self.err_fmt:
            return self.err_fmt
        return ".2g" if self.fmt.endswith("g") else self.fmt

    def _f(self, v: float, fmt: str | None = None) -> str:
        fmt = fmt or self.fmt
        if fmt.endswith("d"):
            return format(int(round(v * self.scale)), fmt)
        return format(v * self.scale, fmt)


def _number(v) -> float | None:
    if v is None or isinstance(v, bool):
        return None
    if isinstance(v, str):
        try:
            v = float(v)
        except ValueError:
            return None
    v = float(v)
    return v if math.isfinite(v) else None


@dataclass
class Table:
    title: str
    columns: list[Column]
    rows: list[dict]
    source: str = "results.csv"
    key: str = "model"
    key_header: str = "model"
    note: str = ""
    # the headers of the columns ``reproduce`` prints at its end (``terminal_summary``; empty: all)
    terminal: tuple[str, ...] = ()

    def plain(self) -> str:
        """The table as aligned plain text: its title, the key and the ``terminal`` columns (a
        title that lists columns is cut to its name when some are left out: it names those shown)."""
        columns = [c for c in self.columns if not self.terminal or c.header in self.terminal]
        title = self.title
        if len(columns) < len(self.columns):
            title = (f"{self.title.split(':')[0]} (the columns shown here: {', '.join(c.header for c in columns)}; "
                     "report.md has every column)")
        grid = [[self.key_header] + [c.header for c in columns]]
        grid += [[str(row[self.key])] + [c.cell(row) for c in columns] for row in self.rows]
        widths = [max(len(r[i]) for r in grid) for i in range(len(grid[0]))]
        lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in grid]
        lines.insert(1, "  ".join("-" * w for w in widths))
        return "\n".join([_plain(title), *lines])

    def markdown(self) -> str:
        spec = ",".join(c.spec() for c in self.columns)
        lines = [f"**{self.title}**", "",
                 f"<!-- table source={self.source} key={self.key} columns={spec} -->",
                 "| " + " | ".join([self.key_header] + [c.header for c in self.columns]) + " |",
                 "|" + "---|" * (len(self.columns) + 1)]
        for row in self.rows:
            cells = [str(row[self.key])] + [c.cell(row) for c in self.columns]
            lines.append("| " + " | ".join(cells) + " |")
        if self.note:
            lines += ["", self.note]
        return "\n".join(lines)


@dataclass
class Claim:
    paper: str  # what the paper claims, with its figure / table
    measured: str  # what this run measured (numbers computed from the results)
    verdict: str  # stats.verdict(...)

    def markdown(self) -> str:
        return f"- **Paper:** {self.paper}  \n  **This run:** {self.measured} **Direction:** {self.verdict}."


FIGURE_WIDTHS = {"column": 3.25, "page": 6.75}  # inches (``plots.style.WIDTHS``; ``--figure-width``)
FORMATS = ("png", "pdf", "svg")  # of a figure (``plots.save_figure``; ``--format``)


def parse_formats(text: str) -> tuple[str, ...]:
    """``"png"`` / ``"png,pdf"`` → the formats, in order (``ValueError`` naming a bad one)."""
    out = tuple(dict.fromkeys(f.strip().lower().lstrip(".") for f in text.split(",") if f.strip()))
    bad = [f for f in out if f not in FORMATS]
    if bad or not out:
        raise ValueError(f"unknown figure format {(bad or [text])[0]!r}; choose from {', '.join(FORMATS)} "
                         "(several: png,pdf)")
    return out


@dataclass(frozen=True)
class Figure:
    """A figure of a report and its caption, in the parts a reader needs: what is plotted,
    what the error bars are, how many models / runs / seeds, and which claim of the paper it
    tests. ``Study.figure`` writes the files and fills ``bars`` (from the plot's legend),
    ``data`` (the CSV of the plotted numbers) and ``other`` (the other formats)."""

    file: str  # the image the report embeds (a file in the experiment folder)
    shows: str  # what is plotted: panels, axes, what a marker / line is
    bars: str  # what the error bars are ("" when none are drawn)
    sample: str  # how many models, runs, checkpoints, seeds
    claim: str  # the claim of the paper the figure tests
    data: str = ""  # the CSV beside it with exactly the plotted numbers
    other: tuple[str, ...] = ()  # the same figure in other formats (PDF, SVG)

    def caption(self) -> str:
        parts = [_sentence(self.shows), f"Error bars: {_sentence(self.bars)}" if self.bars else
                 "No error bars.", _sentence(self.sample), f"Tests: {_sentence(self.claim)}"]
        return " ".join(p for p in parts if p)

    def markdown(self, number: int | None = None) -> str:
        label = f"Figure {number}." if number is not None else "Figure."
        links = [f"plotted numbers: [{self.data}]({self.data})"] if self.data else []
        links += [f"[{Path(o).suffix[1:].upper()}]({o})" for o in self.other]
        tail = f" ({'; '.join(links)})" if links else ""
        alt = self.shows.split(":")[0].replace("[", "(").replace("]", ")")  # the caption follows
        return f"![{alt}]({self.file})  \n**{label}** {self.caption()}{tail}"


def _sentence(text: str) -> str:
    text = text.strip()
    return text if not text or text.endswith((".", "?", "!")) else text + "."


@dataclass
class Section:
    title: str
    text: list[str] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    figures: list[Figure | tuple[str, str]] = field(default_factory=list)  # a plugin's may be (file, caption)
    claims: list[Claim] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    rows: list[dict] = field(default_factory=list)  # model rows for results.csv
    files: dict[str, list[dict]] = field(default_factory=dict)  # other CSV files: name -> rows
    runs: list = field(default_factory=list)  # core.RunInfo of the runs used
    # before the Runs table: what a reader needs first (a study's verdicts, issue 23)
    lead: bool = False
    # the answer in at most four lines (a lead section's: what was decided and which way, what
    # is open and what it would take), opening report.md and the terminal before anything else
    answer: list[str] = field(default_factory=list)
    figures_first: bool = False  # its figures before its tables (a study's forest plot above its verdicts)

    def markdown(self, level: int = 2, numbers=None) -> str:
        """The section; ``numbers`` (an iterator of integers) numbers its figures."""
        h = "#" * level
        parts = [f"{h} {self.title}"]
        parts += self.text
        tables = [t.markdown() for t in self.tables if t.rows]  # no empty table: nothing to read
        figures = []
        for figure in self.figures:
            if isinstance(figure, Figure):
                figures.append(figure.markdown(next(numbers) if numbers is not None else None))
            else:
                name, caption = figure
                figures.append(f"![{caption}]({name})  \n*{caption}*")
        parts += figures + tables if self.figures_first else tables + figures
        if self.claims:
            parts.append(f"{h}# Claims of the paper, checked\n\n" + "\n".join(c.markdown() for c in self.claims))
        if self.notes:
            parts.append(f"{h}# Notes\n\n" + "\n".join(f"- {n}" for n in self.notes))
        return "\n\n".join(parts)


def _plain(text: str) -> str:
    """Markdown emphasis and code marks removed: a line for the terminal."""
    return text.replace("**", "").replace("`", "")


def answer_lines(sections: list[Section], runtime: str = "") -> list[str]:
    """The lines that open a report and the terminal: the lead sections' ``answer`` lines,
    then ``runtime`` (at most five lines for one study)."""
    return [line for s in sections if s.lead for line in s.answer] + ([runtime] if runtime else [])


def terminal_summary(sections: list[Section], runtime: str = "") -> str:
    """What ``reproduce`` prints when it ends, the study's answer: its answer lines
    (``answer_lines``), then each lead section (a study's verdicts) — its tables as plain
    text (their ``terminal`` columns), or, a lead without a table, its text ("No verdict:
    no headroom ...") —; a report without a lead section gives its claims, each with this
    run's direction."""
    answer = answer_lines(sections, runtime)
    parts = ["\n".join(_plain(x) for x in answer)] if answer else []
    for s in (s for s in sections if s.lead):
        parts.append(f"== {_plain(s.title)} ==")
        tables = [t for t in s.tables if t.rows]
        parts += [t.plain() for t in tables] if tables else [_plain(x) for x in s.text]
    if len(parts) <= (1 if answer else 0):
        for s in sections:
            for c in s.claims:
                parts.append(_plain(f"- {c.paper}\n  this run: {c.measured} Direction: {c.verdict}."))
        if parts:
            parts.insert(1 if answer else 0, "== Claims of the paper, checked ==")
    return "\n\n".join(parts + [GLOSSARY_LINE] if parts else parts)


def merge_rows(rows: list[dict], key: str = "model") -> list[dict]:
    """One row per key (first-seen order); a key seen twice gets the union of fields,
    and ``experiment`` / ``group`` values are joined with ``+``."""
    out: dict[str, dict] = {}
    for row in rows:
        k = row[key]
        if k not in out:
            out[k] = dict(row)
            continue
        have = out[k]
        for f, v in row.items():
            if f in ("experiment", "group") and have.get(f) and v and v not in str(have[f]).split("+"):
                have[f] = f"{have[f]}+{v}"
            elif have.get(f) is None:
                have[f] = v
    return list(out.values())


def write_csv(rows: list[dict], path: Path, experiment: bool = True) -> None:
    """``rows`` as a CSV file, written atomically (a full disk: one ``UserError`` line,
    the old file intact) and noted in the experiment folder's marker (``folder.py``;
    ``experiment=False``: a file of the user's choosing, outside any experiment folder)."""
    from ... import storage

    path = Path(path)
    with (_output(path) if experiment else storage.storage_errors(path)), atomic_writer(path, newline="") as f:
        f.write(csv_text(rows))


def csv_text(rows: list[dict]) -> str:
    """``rows`` as CSV text, the columns in the order they first appear."""
    columns = list(dict.fromkeys(k for row in rows for k in row))
    out = io.StringIO(newline="")
    writer = csv.DictWriter(out, fieldnames=columns)
    writer.writeheader()
    for row in rows:
        writer.writerow({k: _csv_value(row.get(k)) for k in columns})
    return out.getvalue()


@contextlib.contextmanager
def _output(path: Path):
    """A file of the experiment folder being written: noted in its marker first (a file
    sameloss wrote is never taken for a user's, ``folder.py``); a full disk is one line."""
    from ... import storage
    from ..engine.folder import record_output

    with storage.storage_errors(path):
        record_output(path)
        yield


def _csv_value(v):
    if v is None:
        return ""
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, (list, tuple)):
        return " ".join(str(x) for x in v)
    return v


def write_report(root: Path, title: str, header: list[str], sections: list[Section], runtime: str = "") -> Path:
    """``results.csv`` (the model rows of every section, merged by model), the other CSV
    files, and ``report.md``: its title, the answer (``answer_lines``, with ``runtime``),
    the header, the sections."""
    rows = merge_rows([r for s in sections for r in s.rows])
    write_csv(rows, root / "results.csv")
    for s in sections:
        for name, file_rows in s.files.items():
            write_csv(file_rows, root / name)
    numbers = itertools.count(1)  # figures numbered through the report
    answer = answer_lines(sections, runtime)
    opening = ["  \n".join(answer)] if answer else []
    text = "\n\n".join([f"# {title}", *opening, *header, *(s.markdown(numbers=numbers) for s in sections)]) + "\n"
    path = root / "report.md"
    with _output(path):  # its sha256 listed in .sameloss-outputs: a later edit is seen (folder.edited_report)
        write_output(path, text, force=True)
    return path


# ---- what every report begins with ---------------------------------------------------------
def _doc_section(doc: str, heading: str) -> str:
    """The indented paragraph under ``heading`` in a recipe's docstring."""
    lines = (doc or "").splitlines()
    out, inside = [], False
    for line in lines:
        if line.startswith(heading):
            inside = True
            continue
        if inside:
            if line and not line.startswith(" "):
                break
            out.append(line.strip())
    return " ".join(x for x in out if x)


def report_header(doc: str, command: str, scale: str, study, wall: float, claims: bool = True) -> list[str]:
    """The report's opening lines: the command, the machine, the wall time and what it went
    to (``study``: the ``core.Study`` that ran it), what the paper reports (the recipe's
    docstring ``doc``, its "Expected result"), and how to read the claims (the words of a
    claim's direction only where the report has ``claims``)."""
    import os
    import platform
    from datetime import datetime, timezone

    import torch

    reused = sum(1 for r in study.runs.values() if r.status == "reused")
    machine = (f"{platform.machine()}, {os.cpu_count()} CPU cores, torch {torch.__version__} "
               f"({torch.get_num_threads()} threads)")
    if torch.cuda.is_available():
        machine += f", GPU {torch.cuda.get_device_name(0)}"
    workers = "" if study.launcher.name == "inprocess" else \
        f", summed over the units' workers (launcher {study.launcher.name})"
    lines = [
        f"Command: `{command}` — written {datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M UTC')} on {machine}.",
        f"Wall time of this call: {wall:.0f} s (training {study.timings['train']:.0f} s, measuring "
        f"{study.timings['measure']:.0f} s{workers}); {len(study.runs)} runs ({reused} reused from an earlier call), "
        f"{study.counts['measured']} rows measured, {study.counts['earlier']} taken from an earlier call's "
        "`measurements.json`." + (" Reused work is not in the wall time." if reused or study.counts["earlier"] else ""),
    ]
    expected = _doc_section(doc, "Expected result")
    if expected:
        lines.append(f"What the paper reports: {expected}")
    lines.append("Every claim sentence below is computed from `results.csv` by the recipe; intervals are 95%. "
                 + ("\"Agrees\" means the interval excludes 0 on the paper's side, \"agrees in direction\" that "
                    "only the point estimate does. " if claims else "") + GLOSSARY_LINE)
    if scale == "smoke":
        lines.append("**Scale `smoke` checks the pipeline only: models of a few dozen steps, measures of a few "
                     "dozen samples. Its numbers mean nothing.**")
    return lines


def runs_section(study, sections: list[Section]) -> Section:
    """The Runs table (``runs.csv``, written here): every run the sections name, once."""
    rows, seen = [], set()
    for s in sections:
        for info in s.runs:
            if info.spec.name in seen:
                continue
            seen.add(info.spec.name)
            ev = info.summary.get("eval", {}) or {}
            rows.append({"run": info.spec.name, "label": info.spec.label, "status": info.status,
                         "steps": info.config.steps, "parameters": info.summary.get("parameters"),
                         "final_kl": ev.get("kl"), "seconds": info.seconds,
                         "folder": study.rel(info.path), "overrides": " ".join(info.spec.overrides)})
    write_csv(rows, study.root / "runs.csv")
    section = Section("Runs")
    section.text.append("Pre-training runs (each in the folder `runs.csv` names, relative to this report — "
                        "`runs/<run>/`, or a seed's `seeds/seed<N>/runs/<run>/` —, with `config.toml`, "
                        "`metrics.jsonl`, `checkpoints/`, `summary.json`); status says whether this call trained, "
                        "resumed or reused it; seconds are this call's. Final KL is the run's own held-out "
                        "evaluation; the tables below use the larger measure set.")
    section.tables.append(Table("Runs", [Column("status", "status", text=True), Column("steps", "steps", fmt="d"),
                                         Column("parameters", "parameters", fmt="d"),
                                         Column("final KL", "final_kl", fmt=".3g"),
                                         Column("seconds", "seconds", fmt=".0f")],
                                rows, source="runs.csv", key="run", key_header="run"))
    return section

