"""Regenerate every command output and run figure the documentation shows (issue 50): nothing
a page shows as printed by sameloss is typed by hand.

A page marks each generated block with two HTML comments (invisible on the site):

    <!-- generated: SPEC -->
    ...replaced by this script...
    <!-- end generated -->

SPEC is one of

    command ARGS...          run ``sameloss ARGS...`` now and show what it prints (stdout and
                             stderr, as a terminal shows them)
    python                   run the page's ``python`` code blocks (all of them, in order, as one
                             script in a scratch folder) and show what they print
    log LABEL [tail=N]       the printed output of a run, from the log given by ``--log LABEL=FILE``
                             (its last N lines); the run's --out folder is shown as ``runs``
    scale LABEL              a note saying which command, scale and date the run's outputs came from
    report-lead LABEL        report.md of the run, from its first section to its first table (its answer)
    verdict LABEL            the run's first decided comparison (verdicts.csv), in one sentence
    figures LABEL DIR [only=STEM,...]
                             the run's figures (the PNG/SVG report.md embeds; only= those stems)
                             copied to DIR (relative to the page) as LABEL-NAME, embedded with
                             report.md's captions

A LABEL names a run folder given on the command line (``--run LABEL=FOLDER``, an experiment
folder such as ``runs/isoloss-quick``); blocks of a label not given are left as they are, so
the command outputs can be refreshed without a run. Usage, from the repository root:

    python scripts/docs_outputs.py                                  # the command outputs only
    sameloss reproduce --out /tmp/q --no-progress 2>&1 | tee /tmp/q.log
    python scripts/docs_outputs.py --run tutorial=/tmp/q/isoloss-quick --log tutorial=/tmp/q.log

``--check`` regenerates nothing and fails if a block's SPEC does not parse.
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

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
BLOCK = re.compile(r"(<!-- generated: (?P<spec>.*?) -->\n)(?P<body>.*?)(<!-- end generated -->)", re.S)
SPECS = ("command", "python", "log", "scale", "report-lead", "verdict", "figures")
FIGURE = re.compile(r"^!\[(?P<alt>[^\]]*)\]\((?P<file>[^)]+\.(?:png|svg))\)\s*$")
CAPTION = re.compile(r"^\*\*Figure (?P<n>\d+)\.\*\* (?P<text>.*)$")
LINK = re.compile(r"\[([^\]]*)\]\((?![a-z]+://)[^)]*\)")


def pages() -> list[Path]:
    return sorted(DOCS.rglob("*.md"))


def blocks(text: str) -> list[re.Match]:
    return list(BLOCK.finditer(text))


def check_spec(spec: str) -> str | None:
    """Why a SPEC does not parse, or None."""
    words = spec.split()
    if not words or words[0] not in SPECS:
        return f"unknown generator {words[0] if words else ''!r}; one of {', '.join(SPECS)}"
    if words[0] not in ("command", "python") and len(words) < 2:
        return f"{words[0]} needs a run LABEL"
    if words[0] == "figures" and (len(words) not in (3, 4) or len(words) == 4 and not words[3].startswith("only=")):
        return "figures LABEL DIR [only=STEM,...]"
    return None


# ---- the generators -------------------------------------------------------------------------
def _run(argv: list[str], what: str) -> str:
    """What ``argv`` prints, run as a user would (one thread; a fresh scratch folder as the
    working directory, so that nothing lands in the checkout)."""
    import tempfile

    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src") + os.pathsep
           + os.environ.get("PYTHONPATH", "")}
    with tempfile.TemporaryDirectory(prefix="sameloss-docs-") as scratch:
        done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=scratch)
    if done.returncode:
        raise SystemExit(f"{what} failed ({done.returncode}): {done.stderr.strip()}")
    return fence(done.stdout + done.stderr)


def run_command(args: list[str]) -> str:
    return _run([sys.executable, "-m", "sameloss.cli", *args], f"sameloss {' '.join(args)}")


def python_blocks(text: str) -> str:
    """A page's ``python`` code blocks, in order, as one script."""
    return "\n".join(re.findall(r"```python\n(.*?)```", text, flags=re.S))


def run_python(page: Path) -> str:
    return _run([sys.executable, "-c", python_blocks(page.read_text(encoding="utf-8"))],
                f"the python blocks of {page.relative_to(ROOT)}")


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
    """report.md's answer: from its first section heading (the header above it is the run's
    command and timings) to its first table, each paragraph wrapped to 100 columns."""
    import textwrap

    lines = (run / "report.md").read_text(encoding="utf-8").splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("## ")), 0)
    end = next((i for i, line in enumerate(lines) if i > start and line.startswith(("<!-- table", "|", "!["))),
               len(lines))
    paragraphs = "\n".join(lines[start:end]).strip().split("\n\n")
    return fence("\n\n".join(textwrap.fill(p, 100) if not p.startswith("#") else p for p in paragraphs), "markdown")


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


# ---- the pages -------------------------------------------------------------------------------
def generate(spec: str, runs: dict[str, Path], logs: dict[str, Path], page: Path) -> str | None:
    """The new body of a block, or None to leave it as it is (a run not given)."""
    words = spec.split()
    kind, rest = words[0], words[1:]
    if kind == "command":
        return run_command(rest)
    if kind == "python":
        return run_python(page)
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", action="append", default=[], metavar="LABEL=FOLDER",
                        help="an experiment folder whose outputs and figures fill the blocks labelled LABEL")
    parser.add_argument("--log", action="append", default=[], metavar="LABEL=FILE",
                        help="what that run printed (e.g. captured with tee)")
    parser.add_argument("--check", action="store_true", help="only check that every block's SPEC parses")
    parser.add_argument("--page", action="append", default=None, metavar="FILE",
                        help="only these pages (default: every page under docs/)")
    args = parser.parse_args(argv)
    runs, logs = _labelled(args.run, "--run"), _labelled(args.log, "--log")
    bad = []
    for page in [Path(p).resolve() for p in args.page] if args.page else pages():
        text = page.read_text(encoding="utf-8")
        found = blocks(text)
        bad += [f"{page.relative_to(ROOT)}: {why}" for m in found if (why := check_spec(m["spec"]))]
        if args.check or bad or not found:
            continue
        changed = text
        for m in reversed(found):
            body = generate(m["spec"], runs, logs, page)
            if body is not None:
                changed = changed[:m.start("body")] + body + changed[m.end("body"):]
        if changed != text:
            page.write_text(changed, encoding="utf-8")
            print(f"updated {page.relative_to(ROOT)}")
    if bad:
        print("\n".join(bad), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
