"""``sameloss reproduce figure1 --scale smoke`` end to end in a temporary folder: the
report's structure, every number of its tables against the results files, reuse of
finished runs and measured rows, resume of an interrupted run, ``--fresh``."""

from __future__ import annotations

import argparse
import csv
import json
import math
import re
from pathlib import Path

import pytest

from helpers.figures import check_journal_files, check_report_figures, read_data

from sameloss.errors import UserError
from sameloss.experiments import Job, Options, reproduce
from sameloss.experiments.cli import add_reproduce_parser

NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")
MARKER = re.compile(r"<!-- table source=(\S+) key=(\S+) columns=(\S*) -->")
COLUMN = re.compile(r"^(?P<key>[^±\[\]*!]+)(?:±(?P<err>[^\[\]*]+))?(?:\[(?P<lo>[^,]+),(?P<hi>[^\]]+)\])?"
                    r"(?:\*(?P<scale>[0-9.eE+-]+))?(?P<text>!text)?$")


def run_cli(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    commands = parser.add_subparsers(dest="command")
    add_reproduce_parser(commands)
    args = parser.parse_args(["reproduce", *argv])
    args.run(args)


def half_ulp(text: str) -> float:
    """Half a unit in the last printed digit of a number."""
    mantissa, _, exponent = text.lower().partition("e")
    decimals = len(mantissa.split(".")[1]) if "." in mantissa else 0
    return 0.5 * 10.0 ** (-decimals) * 10.0 ** (int(exponent) if exponent else 0)


def close(printed: str, value: str, scale: float) -> bool:
    v = float(value) * scale
    return abs(float(printed) - v) <= half_ulp(printed) * (1 + 1e-9) + 1e-12


def parse_tables(report: str):
    """Yield (source, key, column specs, rows of cells) for every marked table."""
    lines = report.splitlines()
    for i, line in enumerate(lines):
        m = MARKER.fullmatch(line.strip())
        if not m:
            continue
        source, key, columns = m.group(1), m.group(2), [c for c in m.group(3).split(",") if c]
        # the spec separates columns with commas, and [low,high] contains one: rejoin those
        specs, buf = [], ""
        for part in columns:
            buf = f"{buf},{part}" if buf else part
            if buf.count("[") == buf.count("]"):
                specs.append(buf)
                buf = ""
        header = [c.strip() for c in lines[i + 1].strip().strip("|").split("|")]
        assert len(header) == len(specs) + 1, (header, specs)
        assert set(lines[i + 2].replace("|", "").strip()) == {"-"}
        rows = []
        for row_line in lines[i + 3:]:
            if not row_line.startswith("|"):
                break
            rows.append([c.strip() for c in row_line.strip().strip("|").split("|")])
        yield source, key, specs, rows


def check_tables(root: Path) -> int:
    """Every number in every table equals (to its printed precision) the value in its
    results file; returns how many numbers were checked."""
    report = (root / "report.md").read_text()
    checked = 0
    tables = list(parse_tables(report))
    assert tables
    for source, key, specs, rows in tables:
        with (root / source).open(newline="") as f:
            data = {r[key]: r for r in csv.DictReader(f)}
        assert rows, f"empty table from {source}"
        for cells in rows:
            assert cells[0] in data, f"{cells[0]!r} is not a {key} of {source}"
            row = data[cells[0]]
            for spec, cell in zip(specs, cells[1:]):
                m = COLUMN.match(spec)
                assert m, spec
                if m.group("text"):
                    assert cell == (row[m.group("key")] or "–")
                    continue
                scale = float(m.group("scale") or 1)
                keys = [m.group("key")] + ([m.group("err")] if m.group("err") else []) + \
                    ([m.group("lo"), m.group("hi")] if m.group("lo") else [])
                if cell == "–":
                    assert row[keys[0]] in ("", "nan", "None") or not math.isfinite(float(row[keys[0]]))
                    continue
                numbers = NUMBER.findall(cell)
                if len(numbers) == 1 < len(keys):  # an undefined error or interval is left out of the cell
                    assert all(row[k] in ("", "nan", "None") for k in keys[1:]), (cell, keys)
                    keys = keys[:1]
                assert len(numbers) == len(keys), (cell, keys)
                for printed, k in zip(numbers, keys):
                    assert close(printed, row[k], scale), f"{source} {cells[0]} {k}: printed {printed}, file {row[k]}"
                    checked += 1
    return checked


def test_figure1_smoke_end_to_end(tmp_path):
    run_cli(["figure1", "--scale", "smoke", "--out", str(tmp_path), "--no-progress"])
    root = tmp_path / "figure1-smoke"
    report = (root / "report.md").read_text()

    # structure: the three experiments, figure 1, claims, figures that exist
    for heading in ("# Figure 1: loss, flatness and downstream accuracy — scale `smoke`", "## Runs",
                    "## Training past convergence", "## Model size at the same loss",
                    "## Pre-training algorithms at the same loss", "## Figure 1: loss, flatness",
                    "### Claims of the paper, checked"):
        assert heading in report, heading
    assert "Command: `sameloss reproduce figure1 --scale smoke`" in report
    figures = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", report)
    assert {"steps-pcfg.png", "sizes-pcfg.png", "algorithms-pcfg.png", "figure1-pcfg.png"} <= set(figures)
    # every figure: its data file keeps the rules of plots.py, its caption says what the bars are
    assert check_report_figures(root) == len(figures)
    figure1_panels = [r for r in read_data(root / "figure1-pcfg.data.csv") if r["kind"] == "axes"]
    assert [(a["x_quantity"], a["x_scale"], a["y_quantity"]) for a in figure1_panels] == [
        ("kl", "log", "probe_B"), ("trace_fisher", "linear", "probe_B"), ("kl", "log", "trace_fisher")]
    # the look-up table's KL of 0 is named at the start of the log axis, not drawn as an invisible bar
    algorithms = read_data(root / "algorithms-pcfg.data.csv")
    assert [(r["kind"], r["panel"], r["x"]) for r in algorithms if r["y"] == "look-up table" and r["panel"] == "0"] \
        == [("offaxis", "0", "0.0")]
    claims = re.findall(r"\*\*Direction:\*\* ([^.]+)\.", report)
    assert len(claims) >= 10
    assert set(claims) <= {"agrees", "disagrees", "agrees in direction, but the interval includes 0",
                           "disagrees in direction, but the interval includes 0", "cannot be judged"}
    assert "Kendall τ" in report and "Spearman ρ" in report

    # every number in the tables comes from results.csv / correlations.csv / runs.csv
    assert check_tables(root) > 100

    # results: one row per model, with the measures
    with (root / "results.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    models = [r["model"] for r in rows]
    assert len(models) == len(set(models))
    assert {"pcfg-micro-adamw@12", "pcfg-micro-sgd@24", "pcfg-d8-adamw@24", "pcfg-micro-adversarial@24",
            "pcfg-micro-noreg@24", "pcfg-micro-noreg-sam@24", "pcfg-lookup-table"} <= set(models)
    for r in rows:
        assert float(r["loss"]) > 0 and r["probe_B"] != ""
        if r["model"] != "pcfg-lookup-table":
            assert float(r["trace_fisher"]) > 0
    shared = next(r for r in rows if r["model"] == "pcfg-micro-adamw@24")
    assert shared["experiment"] == "steps+sizes+algorithms"
    d8 = next(r for r in rows if r["model"] == "pcfg-d8-adamw@24")
    assert float(d8["embedded_loss"]) == pytest.approx(float(d8["loss"]), abs=1e-6)  # the function is kept

    # every run's folder is complete
    runs = sorted(p.name for p in (root / "runs").iterdir())
    assert len(runs) == 6
    for name in runs:
        for f in ("config.toml", "metrics.jsonl", "summary.json", "checkpoints"):
            assert (root / "runs" / name / f).exists(), (name, f)

    # a second call reuses every run and every measured row, and writes the same numbers
    before = (root / "results.csv").read_text()
    run_cli(["figure1", "--preset", "smoke", "--out", str(tmp_path), "--no-progress"])
    report2 = (root / "report.md").read_text()
    assert "6 runs (6 reused from an earlier call), 0 rows measured" in report2
    assert _drop_seconds(before) == _drop_seconds((root / "results.csv").read_text())

    # an interrupted run (checkpoints, no summary.json) is resumed, not retrained
    (root / "runs" / "pcfg-micro-noreg" / "summary.json").unlink()
    reproduce(Job("figure1", "smoke", out=tmp_path), Options(progress=False))
    with (root / "runs.csv").open(newline="") as f:
        status = {r["run"]: r["status"] for r in csv.DictReader(f)}
    assert status["pcfg-micro-noreg"] == "resumed"
    assert {s for n, s in status.items() if n != "pcfg-micro-noreg"} == {"reused"}

    # --fresh redoes everything
    run_cli(["figure1", "--preset", "smoke", "--out", str(tmp_path), "--no-progress", "--fresh"])
    with (root / "runs.csv").open(newline="") as f:
        assert {r["status"] for r in csv.DictReader(f)} == {"trained"}
    cache = json.loads((root / "measurements.json").read_text())
    assert len(cache) >= 12


def _drop_seconds(text: str) -> str:
    """results.csv without the measure_seconds column (timings differ between calls)."""
    rows = list(csv.reader(text.splitlines()))
    if "measure_seconds" not in rows[0]:
        return text
    i = rows[0].index("measure_seconds")
    return "\n".join(",".join(r[:i] + r[i + 1:]) for r in rows)


def test_steps_smoke_report_figures_keep_the_style(steps_smoke):
    """The steps recipe on its own (the session's ``reproduce steps --scale smoke``): each
    language's figure and its runs' training curves, every data file read back against the
    rules of plots.py, every caption saying what its bars are."""
    root = steps_smoke / "steps-smoke"
    figures = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", (root / "report.md").read_text())
    assert {"steps-pcfg.png", "steps-pcfg-curves.png"} <= set(figures)
    assert check_report_figures(root) == len(figures)
    curves = read_data(root / "steps-pcfg-curves.data.csv")
    assert [(a["y_quantity"], a["y_scale"]) for a in curves if a["kind"] == "axes"] == [
        ("train_loss", "linear"), ("kl", "log"), ("lr", "linear")]


def test_changed_config_of_a_finished_run_is_refused(tmp_path):
    reproduce(Job("sizes", "smoke", out=tmp_path), Options(progress=False))
    cfg = tmp_path / "sizes-smoke" / "runs" / "pcfg-d8-adamw" / "config.toml"
    cfg.write_text(cfg.read_text().replace("batch_size = 32", "batch_size = 16"))
    with pytest.raises(UserError, match="another config.*--fresh"):
        reproduce(Job("sizes", "smoke", out=tmp_path), Options(progress=False))


def test_unknown_experiment_or_scale():
    with pytest.raises(UserError, match="unknown experiment"):
        reproduce(Job("figure9", "smoke"))
    with pytest.raises(UserError, match="unknown scale"):
        reproduce(Job("steps", "huge"))


def test_the_cli_lists_every_recipe_and_scale():
    from sameloss import registry
    from sameloss.experiments import ACROSS_SCALE, MAIN_SCALE, SCALE_NAMES, experiments
    from sameloss.experiments.engine.orchestrate import PILOT_SCALE

    assert set(experiments()) == {"steps", "sizes", "algorithms", "figure1", "isoloss", "text", "theory", "dyck"}
    for name in experiments():
        recipe = registry.recipe(name)
        assert experiments()[name] == recipe.SUMMARY, name  # read from the file as the module says
        assert set(SCALE_NAMES) <= set(recipe.PRESETS) <= {*SCALE_NAMES, MAIN_SCALE, ACROSS_SCALE, PILOT_SCALE}, name
        doc = recipe.__doc__
        assert "sameloss reproduce" in doc and "Runtime" in doc and "Expected result" in doc, name
    parser = argparse.ArgumentParser()
    add_reproduce_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["reproduce"])
    assert (args.experiment, args.scale, args.out, args.seed, args.fresh) == (None, None, "runs", 0, False)
    # no experiment is the main job: the iso-loss study at its quick scale; a named one runs at tiny
    from sameloss.experiments import main_job
    assert main_job(args.experiment, args.scale, gpu=False) == ("isoloss", "quick")
    # where a GPU is present the main job is the whole tiny design; a scale given is kept
    assert main_job(None, None, gpu=True) == ("isoloss", "tiny") and main_job(None, "quick", gpu=True)[1] == "quick"
    assert main_job("figure1", None) == ("figure1", "tiny") and main_job(None, "smoke") == ("isoloss", "smoke")
    assert "quick" in registry.recipe("isoloss").PRESETS
    # --preset, the old name of --scale, still works (.ci/run and earlier commands use it)
    assert parser.parse_args(["reproduce", "sizes", "--preset", "smoke"]).scale == "smoke"


def test_a_smoke_study_is_journal_ready_and_ends_with_its_answer(tmp_path, capsys):
    """dyck at the smoke scale as PDF and SVG at a column's width: every PDF it writes embeds
    TrueType fonts only and is 3.25 in wide, every SVG holds its words as <text> with the
    smoke caveat among them; the study prints its answer (its claims) at the end, leaves no
    lock file; a re-run as PNG removes the PDFs and SVGs it wrote (issue 39)."""
    run_cli(["dyck", "--scale", "smoke", "--out", str(tmp_path), "--no-progress", "--format", "pdf,svg",
             "--figure-width", "column"])
    root = tmp_path / "dyck-smoke"
    out = capsys.readouterr().out
    assert "== Claims of the paper, checked ==" in out and "Direction:" in out
    stems = sorted(p.stem for p in root.glob("*.pdf"))
    assert stems and sorted(p.stem for p in root.glob("*.svg")) == stems
    for stem in stems:
        check_journal_files(root, stem, 3.25, must_say=("Caveat: smoke scale",))
    assert not list(tmp_path.rglob("*.lock"))  # no lock file left after a successful run
    (root / "notes.svg").write_text("<svg xmlns='http://www.w3.org/2000/svg'/>")  # a user's
    run_cli(["dyck", "--scale", "smoke", "--out", str(tmp_path), "--no-progress"])
    assert not list(root.glob("dyck-*.pdf")) and not list(root.glob("dyck-*.svg"))
    assert sorted(p.stem for p in root.glob("*.png")) == stems and (root / "notes.svg").exists()
    assert not list(tmp_path.rglob("*.lock"))


def test_the_terminal_answer_is_the_verdict_table_or_no_verdict():
    from sameloss.experiments.reports.document import GLOSSARY_LINE, Claim, Column, Section, Table, terminal_summary

    lead = Section("Verdicts", lead=True)
    lead.tables.append(Table("Verdicts: primary accuracy", [Column("accuracy [95%]", "mean", ci=("lo", "hi"), fmt=".2f"),
                                                            Column("hidden", "x"), Column("verdict", "v", text=True)],
                             [{"test": "noreg @ late", "mean": 0.13, "lo": -0.01, "hi": 0.28, "x": 1, "v": "detected"}],
                             key="test", key_header="comparison", terminal=("accuracy [95%]", "verdict")))
    text = terminal_summary([lead, Section("Runs")])
    assert text.splitlines()[:2] == ["== Verdicts ==", ""]
    assert "noreg @ late  0.13 [-0.01, 0.28]  detected" in text and "hidden" not in text
    # the title names the columns shown, not those it leaves to report.md
    assert text.splitlines()[2] == ("Verdicts (the columns shown here: accuracy [95%], verdict; report.md has every "
                                    "column)")
    assert text.endswith("\n\n" + GLOSSARY_LINE)  # the answer's words are defined in the glossary
    stopped = Section("Verdicts", lead=True, text=["**No verdict: no headroom** (2 of 3 seeds' bases failed).",
                                                   "Headroom per seed:"],
                      tables=[Table("Headroom", [Column("x", "x")], [], key="seed")])
    assert terminal_summary([stopped]).endswith("No verdict: no headroom (2 of 3 seeds' bases failed).\n\n"
                                                "Headroom per seed:\n\n" + GLOSSARY_LINE)
    claims = Section("Algorithms", claims=[Claim("SAM is flatter (Table 2)", "−1.2 [−2, −0.4].", "agrees")])
    assert "Direction: agrees." in terminal_summary([claims])


def test_a_report_prints_no_empty_table():
    """A table without rows (a quick design with no size comparison: its size contrast) is left
    out of report.md: a header and nothing under it is nothing to read."""
    from sameloss.experiments.reports.document import Column, Section, Table

    section = Section("Verdicts", tables=[Table("Size contrast", [Column("n", "n")], [], key="test"),
                                          Table("Verdicts", [Column("n", "n")], [{"test": "adv @ late", "n": 4}],
                                                key="test")])
    text = section.markdown()
    assert "Size contrast" not in text and "**Verdicts**" in text and "| adv @ late | 4 |" in text
