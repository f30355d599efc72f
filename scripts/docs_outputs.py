"""Regenerate every command output and run figure the documentation shows (issue 50): nothing
a page shows as printed by sameloss is typed by hand.

A page marks each generated block with two HTML comments (invisible on the site):

    <!-- generated: SPEC -->
    ...replaced by this script...
    <!-- end generated -->

SPEC is one of

    command ARGS...          run ``sameloss ARGS...`` now and show what it prints (stdout and
                             stderr, as a terminal shows them)
    python [stdout]          run the page's ``python`` code blocks (all of them, in order, as one
                             script in a scratch folder) and show what they print (stdout: their
                             stdout only, without the notes and progress lines on stderr)
    log LABEL [tail=N]       the printed output of a run, from the log given by ``--log LABEL=FILE``
                             (its last N lines); the run's --out folder is shown as ``runs``
    scale LABEL              a note saying which command, scale and date the run's outputs came from
    report-lead LABEL        report.md of the run, from its first section to its first table (its answer)
    verdict LABEL            the run's first decided comparison (verdicts.csv), in one sentence
    figures LABEL DIR [only=STEM,...]
                             the run's figures (the PNG/SVG report.md embeds; only= those stems)
                             copied to DIR (relative to the page) as LABEL-NAME, embedded with
                             report.md's captions
    record NAME VIEW         from the committed record docs/records/NAME.json (scripts/docs_records.py):
                             VIEW verdicts (its verdict table), traces (its trace verdicts), pooled
                             (a study across languages), run (one sentence: command, date, machine,
                             load, wall time, where the record came from), claims (a recipe's
                             claims of the paper, checked)
    record-figures NAME [only=STEM,...]
                             the figures the record keeps (docs/records/NAME/), with their captions
    cli-reference            every command's --help, as argparse prints it (100 columns)
    cli-flags --FLAG ...     what each of these flags means in every command that takes it
    gallery                  every figure the results pages embed from records, by page

Inside a sentence a number is a *fact*, ``<!-- fact SOURCE PATH [FORMAT] -->VALUE<!-- /fact -->``,
read from a record or from ``sameloss plan`` (scripts/docs_records.py says how).

A LABEL names a run folder given on the command line (``--run LABEL=FOLDER``, an experiment
folder such as ``runs/isoloss-quick``); blocks of a label not given are left as they are, so
the command outputs can be refreshed without a run. Usage, from the repository root:

    python scripts/docs_outputs.py                                  # the command outputs only
    sameloss reproduce --out /tmp/q --no-progress 2>&1 | tee /tmp/q.log
    python scripts/docs_outputs.py --run tutorial=/tmp/q/isoloss-quick --log tutorial=/tmp/q.log

    python scripts/docs_outputs.py record runs/isoloss-quick isoloss-quick --load "0.6 before, 1.0 after"

``record FOLDER NAME`` writes the record of a finished study (its report's command, date,
machine and wall time, its CPU seconds, verdicts, what it decided, pooled rows and figures) to
docs/records/NAME.json; then a plain run regenerates every page that quotes it.

``--check`` writes nothing and fails (exit 1, each problem on a line) where a page differs from
what its records, ``sameloss plan`` and the CLI make now (record blocks, facts, the CLI
reference), where a block's SPEC does not parse, where a generated block is empty, and where a
page still says "Not inserted yet" or "not run:" (a placeholder where a run's output belongs).
Command, log and run-folder blocks are checked for these but not rerun (they need the run).
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import docs_records as records  # noqa: E402  (the script's sibling)

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
BLOCK = re.compile(r"(<!-- generated: (?P<spec>.*?) -->\n)(?P<body>.*?)(<!-- end generated -->)", re.S)
SPECS = ("command", "python", "log", "scale", "report-lead", "verdict", "figures", "record", "record-figures",
         "cli-reference", "cli-flags", "gallery")
# made from what the repository holds (records, the plan, the CLI): --check makes them anew and compares
CHECKED = ("record", "record-figures", "cli-reference", "cli-flags", "gallery")
# what a page never says where a run's output belongs (a placeholder, a run said not to exist)
BANNED = ("Not inserted yet", "not run:")
FIGURE = re.compile(r"^!\[(?P<alt>[^\]]*)\]\((?P<file>[^)]+\.(?:png|svg))\)\s*$")
CAPTION = re.compile(r"^\*\*Figure (?P<n>\d+)\.\*\* (?P<text>.*)$")
LINK = re.compile(r"\[([^\]]*)\]\((?![a-z]+://)[^)]*\)")


def pages() -> list[Path]:
    """Every page the generator fills: the docs and the README."""
    return [*sorted(DOCS.rglob("*.md")), README]


def blocks(text: str) -> list[re.Match]:
    return list(BLOCK.finditer(text))


def check_spec(spec: str) -> str | None:
    """Why a SPEC does not parse, or None."""
    words = spec.split()
    if not words or words[0] not in SPECS:
        return f"unknown generator {words[0] if words else ''!r}; one of {', '.join(SPECS)}"
    if words[0] == "python":
        return None if words[1:] in ([], ["stdout"]) else "python [stdout]"
    if words[0] in ("cli-reference", "gallery"):
        return None if len(words) == 1 else f"{words[0]} takes nothing"
    if words[0] == "cli-flags":
        return None if len(words) > 1 and all(w.startswith("--") for w in words[1:]) else "cli-flags --FLAG ..."
    if words[0] not in ("command", "python") and len(words) < 2:
        return f"{words[0]} needs a run LABEL" if words[0] not in ("record", "record-figures") else \
            f"{words[0]} needs a record NAME"
    if words[0] == "figures" and (len(words) not in (3, 4) or len(words) == 4 and not words[3].startswith("only=")):
        return "figures LABEL DIR [only=STEM,...]"
    if words[0] == "record" and (len(words) != 3 or words[2] not in records.TABLES):
        return f"record NAME VIEW, VIEW one of {', '.join(records.TABLES)}"
    if words[0] == "record-figures" and (len(words) not in (2, 3) or len(words) == 3
                                         and not words[2].startswith("only=")):
        return "record-figures NAME [only=STEM,...]"
    return None


# ---- the generators -------------------------------------------------------------------------
def _run(argv: list[str], what: str, stdout_only: bool = False) -> str:
    """What ``argv`` prints, run as a user would (one thread; a fresh scratch folder as the
    working directory, so that nothing lands in the checkout); ``stdout_only``: its stdout."""
    import tempfile

    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src") + os.pathsep
           + os.environ.get("PYTHONPATH", "")}
    with tempfile.TemporaryDirectory(prefix="sameloss-docs-") as scratch:
        done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=scratch)
    if done.returncode:
        raise SystemExit(f"{what} failed ({done.returncode}): {done.stderr.strip()}")
    return fence(done.stdout if stdout_only else done.stdout + done.stderr)


def run_command(args: list[str]) -> str:
    return _run([sys.executable, "-m", "sameloss.cli", *args], f"sameloss {' '.join(args)}")


def python_blocks(text: str) -> str:
    """A page's ``python`` code blocks, in order, as one script."""
    return "\n".join(re.findall(r"```python\n(.*?)```", text, flags=re.S))


def run_python(page: Path, stdout_only: bool = False) -> str:
    return _run([sys.executable, "-c", python_blocks(page.read_text(encoding="utf-8"))],
                f"the python blocks of {page.relative_to(ROOT)}", stdout_only)


def fence(text: str, kind: str = "text") -> str:
    return f"```{kind}\n{text.rstrip()}\n```\n"


def _out_folder(run: Path) -> str:
    return str(run.resolve().parent)


def log_block(run: Path, log: Path, tail: int | None) -> str:
    lines = log.read_text(encoding="utf-8").rstrip().splitlines()
    text = "\n".join(lines[-tail:] if tail else lines).replace(_out_folder(run), "runs")
    return fence(text)


def _command_line(run: Path) -> tuple[str, str]:
    """The run's command and its date, from report.md's header."""
    report = (run / "report.md").read_text(encoding="utf-8")
    found = re.search(r"Command: `([^`]*)` — written (\S+ \S+ UTC)", report)
    return (found.group(1), found.group(2)) if found else ("(report.md names no command)", "an unknown date")


def scale_block(run: Path) -> str:
    command, date = _command_line(run)
    scale = re.search(r"--scale (\S+)", command)
    scale = scale.group(1) if scale else "?"
    caveat = (" The smoke scale checks the pipeline only: its numbers mean nothing, and its verdicts are not "
              "the study's." if scale == "smoke" else "")
    return (f'!!! note "Shown from a run at scale `{scale}`"\n'
            f"    The outputs and figures from the run on this page are those of `{command}`, run on {date} and "
            f"inserted by `scripts/docs_outputs.py`; paths are shown under `runs/`.{caveat}\n")


def report_lead(run: Path) -> str:
    """report.md's answer: the lines under its title, above the header that names the
    command (``Command: ...``), each paragraph wrapped to 100 columns (a report without
    them: its first section, to its first table)."""
    import textwrap

    lines = (run / "report.md").read_text(encoding="utf-8").splitlines()
    header = next((i for i, line in enumerate(lines) if line.startswith("Command: `")), None)
    if header is not None and header > 1 and any(line.strip() for line in lines[1:header]):
        start, end = 1, header
    else:
        start = next((i for i, line in enumerate(lines) if line.startswith("## ")), 0)
        end = next((i for i, line in enumerate(lines) if i > start and line.startswith(("<!-- table", "|", "!["))),
                   len(lines))
    paragraphs = "\n".join(lines[start:end]).strip().split("\n\n")
    def wrap(paragraph: str) -> str:  # each line of it (an answer's lines end in a Markdown break)
        return "\n".join(textwrap.fill(line.rstrip(), 100) for line in paragraph.splitlines())

    return fence("\n\n".join(wrap(p) if not p.startswith("#") else p for p in paragraphs), "markdown")


def verdict_block(run: Path) -> str:
    """The first comparison the run decided, in one sentence (or that it decided none)."""
    path = run / "verdicts.csv"
    if not path.exists():
        return f"*(this run wrote no `verdicts.csv`)*\n"
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    decided = [r for r in rows if r.get("verdict", "").startswith(("detected", "no effect"))]
    if not decided:
        kinds = sorted({r.get("verdict", "") for r in rows})
        return (f"This run decided none of its {len(rows)} comparisons (their verdicts: "
                + "; ".join(f"*{k}*" for k in kinds) + ").\n")
    r = decided[0]
    interval = (f" [{float(r['t_low']):.2f}, {float(r['t_high']):.2f}]"
                if all(math.isfinite(float(r.get(k) or "nan")) for k in ("t_low", "t_high")) else "")
    mde = float(r.get("mde") or "nan")
    return (f"This run decided {len(decided)} of its {len(rows)} comparisons. The first, **{r['test']}** "
            f"({r.get('claim', '')}): a paired accuracy difference of {float(r['mean']):+.2f} points{interval} "
            f"over {r.get('used', '?')} seeds" + (f", MDE {mde:.2f}" if math.isfinite(mde) else "")
            + f": *{r['verdict']}*" + (f", after Holm *{r['after_holm']}*" if r.get("after_holm") else "") + ".\n")


def figures_block(run: Path, label: str, page: Path, folder: str, only: tuple[str, ...] = ()) -> str:
    """Copy the figures report.md embeds into FOLDER (relative to the page) as LABEL-NAME and
    embed them there with report.md's captions; ``only``: these figures (their file stems),
    copied beside the others (the earlier LABEL-* files are replaced only without it)."""
    lines = (run / "report.md").read_text(encoding="utf-8").splitlines()
    dest = page.parent / folder
    dest.mkdir(parents=True, exist_ok=True)
    if not only:
        for old in dest.glob(f"{label}-*"):
            old.unlink()
    out = []
    for i, line in enumerate(lines):
        found = FIGURE.match(line)
        if not found or not (run / found["file"]).exists() or (only and Path(found["file"]).stem not in only):
            continue
        name = f"{label}-{Path(found['file']).name}"
        shutil.copyfile(run / found["file"], dest / name)
        caption = CAPTION.match(lines[i + 1]) if i + 1 < len(lines) else None
        # a link to the run's own files (the figure's data CSV) means nothing on the site: its text stays
        text = LINK.sub(r"\1", caption["text"]) if caption else found["alt"]
        number = f"Figure {caption['n']}. " if caption else ""
        out.append(f"![{found['alt']}]({folder}/{name})\n\n*{number}{text}*\n")
    return "\n".join(out) if out else "*(this run's report embeds no figure)*\n"


# ---- the CLI reference ----------------------------------------------------------------------
def cli_reference() -> str:
    """Every command's ``--help`` as argparse prints it at 100 columns, one section each (the
    commands in ``sameloss --help``'s order): the site's CLI reference, made from the parser."""
    from sameloss.cli import build_parser

    columns = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"  # argparse wraps to the terminal: one width for the page
    try:
        return _cli_reference(build_parser())
    finally:
        if columns is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = columns


def _cli_reference(parser) -> str:
    import argparse as _argparse

    out = ["### `sameloss`\n", fence(_help(parser))]

    def walk(p: _argparse.ArgumentParser, words: list[str]) -> None:
        for action in p._actions:
            if isinstance(action, _argparse._SubParsersAction):
                for name, sub in _unique(action.choices.items()):
                    out.append(f"### `sameloss {' '.join(words + [name])}`\n")
                    out.append(fence(_help(sub)))
                    walk(sub, words + [name])

    walk(parser, [])
    return "\n".join(out)


def cli_flags(flags: list[str]) -> str:
    """A table of what each of ``flags`` means in every command that takes it: its argument and
    its help's first clause, made from the parser like the reference (``plan``'s copies of
    ``reproduce``'s flags — "the --X reproduce would use" — are left out: they mean the same)."""
    import argparse as _argparse

    from sameloss.cli import build_parser

    uses: dict[str, list[tuple[str, str, str]]] = {flag: [] for flag in flags}

    def walk(p: _argparse.ArgumentParser, words: list[str]) -> None:
        for action in p._actions:
            if isinstance(action, _argparse._SubParsersAction):
                for name, sub in _unique(action.choices.items()):
                    walk(sub, words + [name])
            elif action.help != _argparse.SUPPRESS and words:
                for flag in set(action.option_strings) & set(flags):
                    if (action.help or "").startswith(f"the {flag} reproduce would use"):
                        continue
                    meta = f" {action.metavar}" if action.metavar and action.nargs != 0 else ""
                    uses[flag].append((" ".join(words), meta, _clause(action.help)))

    walk(build_parser(), [])
    lines = ["| flag | command | what it is there |", "|---|---|---|"]
    for flag in flags:
        if not uses[flag]:
            raise records.FactError(f"cli-flags: no command takes {flag}")
        lines += [f"| `{flag}{meta}` | `{command}` | {text} |" for command, meta, text in uses[flag]]
    return "\n".join(lines) + "\n"


def _clause(text: str) -> str:
    """A help text's first clause (up to its first '; ' outside parentheses), as a table cell."""
    text = " ".join((text or "").replace("%%", "%").split())
    depth = 0
    for i, ch in enumerate(text):
        depth += (ch == "(") - (ch == ")")
        if depth == 0 and text.startswith("; ", i):
            return text[:i].replace("|", "/")
    return text.replace("|", "/")


def _unique(items):
    seen = set()
    for name, sub in items:  # an alias is the same parser: listed once
        if id(sub) not in seen:
            seen.add(id(sub))
            yield name, sub


def _help(parser) -> str:
    return parser.format_help().replace(str(ROOT), ".")


# ---- the gallery ------------------------------------------------------------------------------
def gallery(page: Path) -> str:
    """Every figure of every results page (their ``record-figures`` blocks), under each page's
    title, with the first sentence of its caption: one place to see what the runs drew."""
    out = []
    for results in sorted((DOCS / "results").glob("*.md")):
        if results.resolve() == page.resolve():
            continue
        text = results.read_text(encoding="utf-8")
        names = [m["spec"].split() for m in blocks(text) if m["spec"].split()[0] == "record-figures"]
        if not names:
            continue
        title = next((line[2:].strip() for line in text.splitlines() if line.startswith("# ")), results.stem)
        link = os.path.relpath(results, page.parent).replace(os.sep, "/")
        out.append(f"## [{title}]({link})\n")
        for words in names:
            only = next((tuple(w.split("=")[1].split(",")) for w in words[2:] if w.startswith("only=")), ())
            record = records.load_record(words[1])
            for f in record.get("figures") or []:
                if only and Path(f["file"]).stem not in only:
                    continue
                rel = os.path.relpath(records.RECORDS / words[1] / f["file"], page.parent).replace(os.sep, "/")
                caption = re.sub(r"^Figure \d+\. ", "", f["caption"])
                out.append(f"![{f['alt']}]({rel})\n\n*{_first_sentence(caption)}* (`{words[1]}`)\n")
    if not out:
        raise records.FactError("no results page embeds a record's figures")
    return "\n".join(out)


def _first_sentence(text: str) -> str:
    """Up to the first '. ' outside parentheses (a caption's "what is plotted")."""
    depth = 0
    for i, ch in enumerate(text):
        depth += (ch == "(") - (ch == ")")
        if depth == 0 and text.startswith(". ", i):
            return text[:i + 1]
    return text


# ---- the pages -------------------------------------------------------------------------------
def generate(spec: str, runs: dict[str, Path], logs: dict[str, Path], page: Path) -> str | None:
    """The new body of a block, or None to leave it as it is (a run not given)."""
    words = spec.split()
    kind, rest = words[0], words[1:]
    if kind == "command":
        return run_command(rest)
    if kind == "python":
        return run_python(page, rest == ["stdout"])
    if kind == "cli-reference":
        return cli_reference()
    if kind == "cli-flags":
        return cli_flags(rest)
    if kind == "gallery":
        return gallery(page)
    if kind == "record":
        return records.record_block(rest[0], rest[1])
    if kind == "record-figures":
        only = next((tuple(w.split("=")[1].split(",")) for w in rest[1:] if w.startswith("only=")), ())
        return records.record_figures(rest[0], page, only)
    label = rest[0]
    if label not in runs:
        return None
    run = runs[label]
    if kind == "log":
        if label not in logs:
            return None
        tail = next((int(w.split("=")[1]) for w in rest[1:] if w.startswith("tail=")), None)
        return log_block(run, logs[label], tail)
    if kind == "scale":
        return scale_block(run)
    if kind == "report-lead":
        return report_lead(run)
    if kind == "verdict":
        return verdict_block(run)
    only = next((tuple(w.split("=")[1].split(",")) for w in rest[2:] if w.startswith("only=")), ())
    return figures_block(run, label, page, rest[1], only)


def _labelled(items: list[str], what: str) -> dict[str, Path]:
    out = {}
    for item in items:
        label, sep, path = item.partition("=")
        if not sep or not Path(path).exists():
            raise SystemExit(f"{what} {item!r}: LABEL=PATH with an existing PATH")
        out[label] = Path(path)
    return out


_rel = records.shown


def check_page(page: Path, text: str) -> list[str]:
    """What is wrong with a page as it is (``--check``): a SPEC that does not parse, an empty
    generated block, a placeholder; a record block, a fact or the CLI reference that differs
    from what the records, the plan and the parser make now."""
    where = _rel(page)
    bad = [f"{where}: {why}" for m in blocks(text) if (why := check_spec(m["spec"]))]
    if bad:
        return bad
    for m in blocks(text):
        if not m["body"].strip():
            bad.append(f"{where}: the block '{m['spec']}' is empty")
    for word in BANNED:
        if word.lower() in text.lower():
            bad.append(f"{where}: says {word!r} (a placeholder where a run's output belongs)")
    for m in blocks(text):
        if m["spec"].split()[0] in CHECKED:
            try:
                body = generate(m["spec"], {}, {}, page)
            except records.FactError as exc:
                bad.append(f"{where}: {exc}")
                continue
            if body != m["body"]:
                bad.append(f"{where}: the block '{m['spec']}' differs from what it makes now (run "
                           "python scripts/docs_outputs.py)")
    errors: list[str] = []
    for m in records.FACT.finditer(text):
        try:
            value = records.fact(m["spec"])
        except records.FactError as exc:
            errors.append(f"{where}: {exc}")
            continue
        if value != m["value"]:
            errors.append(f"{where}: the fact '{m['spec']}' is {value!r} now, the page says {m['value']!r}")
    return bad + errors


def record_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="docs_outputs.py record",
                                     description="Write docs/records/NAME.json from a finished study's folder.")
    parser.add_argument("folder", metavar="FOLDER", help="the study's folder, OUT/EXPERIMENT-SCALE (its report.md)")
    parser.add_argument("name", metavar="NAME", help="the record's name, e.g. isoloss-quick")
    parser.add_argument("--load", default="", help="the load average while it ran, e.g. '0.6 before, 1.0 after' "
                                                   "(default: report.md's load at the end)")
    parser.add_argument("--commit", default="", help="the commit it ran (default: this checkout's HEAD)")
    parser.add_argument("--machine", default="", help="the machine in words (default: report.md's)")
    parser.add_argument("--date", default="", help="when the run ended, e.g. '2026-11-29 16:23 UTC' (default: "
                                                   "report.md's, which a report re-written from the records sets to "
                                                   "its own call's)")
    parser.add_argument("--force", action="store_true", help="replace an existing record of that name")
    parser.add_argument("--cpu-s", type=float, default=None, metavar="SECONDS",
                        help="the command's CPU seconds, user + system (e.g. from /usr/bin/time); the record "
                             "always has the units' own, units_cpu_s, from costs.csv")
    parser.add_argument("--csv", action="append", default=[], metavar="FILE[:COLUMN,...]",
                        help="also keep the rows of this CSV file of the folder (e.g. results.csv:model,kl), for "
                             "the facts a page quotes from it (only those columns, when given); repeatable")
    parser.add_argument("--no-figures", action="store_true",
                        help="keep none of its figures (a smoke run's: its numbers mean nothing)")
    parser.add_argument("--time", action="append", default=[], metavar="FILE",
                        help="the /usr/bin/time -v report of the command that ran the study (e.g. its log): the "
                             "record's wall time, CPU seconds and share of a core from it, not from report.md (whose "
                             "wall time is its last call's: a report re-written from the records); repeatable, for a "
                             "study run in several calls (interrupted, then resumed): their times are summed")
    parser.add_argument("--untimed", action="append", default=[], metavar="START..END",
                        help="a call of the study that /usr/bin/time did not report (e.g. killed with its session, "
                             "then resumed), as the span of ISO date-times its log and files show, e.g. "
                             "2026-11-29T13:11:23..2026-11-29T15:53:33: its wall time joins the record's, its CPU "
                             "is not known (the record's cpu_s is the timed calls'); repeatable")
    parser.add_argument("--figures", default="", metavar="STEM,...",
                        help="keep only these of its figures (their file stems, e.g. pooled-forest,hmm-headroom-dose; "
                             "default: every figure its report embeds)")
    args = parser.parse_args(argv)
    folder = Path(args.folder)
    if not (folder / "report.md").is_file():
        print(f"{folder}: no report.md (a finished study's folder, OUT/EXPERIMENT-SCALE)", file=sys.stderr)
        return 2
    try:
        timed = records.timed_calls([records.time_log(Path(f)) for f in args.time],
                                    [records.untimed_span(span) for span in args.untimed])
        about = records.About(args.load, args.commit, args.machine, args.cpu_s, tuple(args.csv), timed, args.date)
        path = records.write_record(folder, args.name, about, args.force, not args.no_figures,
                                    tuple(filter(None, args.figures.split(","))))
    except records.FactError as exc:
        print(exc, file=sys.stderr)
        return 2
    print(f"wrote {_rel(path)}; python scripts/docs_outputs.py regenerates the pages that quote it")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["record"]:
        return record_main(argv[1:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", action="append", default=[], metavar="LABEL=FOLDER",
                        help="an experiment folder whose outputs and figures fill the blocks labelled LABEL")
    parser.add_argument("--log", action="append", default=[], metavar="LABEL=FILE",
                        help="what that run printed (e.g. captured with tee)")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; fail where a page differs from its records, the plan and the CLI, "
                             "or holds an empty block or a placeholder")
    parser.add_argument("--page", action="append", default=None, metavar="FILE",
                        help="only these pages (default: every page under docs/, and the README)")
    args = parser.parse_args(argv)
    runs, logs = _labelled(args.run, "--run"), _labelled(args.log, "--log")
    bad = []
    chosen = [Path(p).resolve() for p in args.page] if args.page else pages()
    records.prefetch_plans([page.read_text(encoding="utf-8") for page in chosen])
    for page in chosen:
        text = page.read_text(encoding="utf-8")
        if args.check:
            bad += check_page(page, text)
            continue
        found = blocks(text)
        why = [f"{_rel(page)}: {w}" for m in found if (w := check_spec(m["spec"]))]
        if why:
            bad += why
            continue
        changed = text
        try:
            for m in reversed(found):
                body = generate(m["spec"], runs, logs, page)
                if body is not None:
                    changed = changed[:m.start("body")] + body + changed[m.end("body"):]
        except records.FactError as exc:
            bad.append(f"{_rel(page)}: {exc}")
            continue
        changed = records.fill_facts(changed, bad, _rel(page))
        if changed != text:
            page.write_text(changed, encoding="utf-8")
            print(f"updated {_rel(page)}")
    if bad:
        print("\n".join(bad), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
