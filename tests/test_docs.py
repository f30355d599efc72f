"""The documentation site's reference and generated outputs (issue 50): every public module
is in the API reference, and every output a page shows as printed by sameloss is a block
that ``scripts/docs_outputs.py`` fills."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "sameloss"


def _script():
    spec = importlib.util.spec_from_file_location("docs_outputs", ROOT / "scripts" / "docs_outputs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_public_module_is_in_the_api_reference():
    documented = set()
    for page in (ROOT / "docs" / "reference" / "api").glob("*.md"):
        documented |= set(re.findall(r"^::: (\S+)$", page.read_text(encoding="utf-8"), flags=re.M))
    modules = set()
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        parts = parts[:-1] if parts[-1] == "__init__" else parts
        if not any(p.startswith("_") for p in parts):
            modules.add(".".join(parts))
    assert sorted(modules - documented) == []
    assert sorted(documented - modules) == []  # no page names a module that is gone


def test_generated_blocks_parse_and_the_tutorial_shows_only_generated_output():
    docs = _script()
    pages = {p.relative_to(ROOT).as_posix(): p.read_text(encoding="utf-8") for p in docs.pages()}
    specs = [m["spec"] for text in pages.values() for m in docs.blocks(text)]
    assert [s for s in specs if docs.check_spec(s)] == []
    assert docs.main(["--check"]) == 0
    tutorial = pages["docs/tutorial/index.md"]
    # every ```text / ```markdown block of the tutorial is inside a generated block
    outside = docs.BLOCK.sub("", tutorial)
    assert "```text" not in outside and "```markdown" not in outside
    for kind in ("command --version", "command plan", "log tutorial", "report-lead tutorial", "figures tutorial img"):
        assert kind in specs, kind


def test_a_command_block_is_what_the_command_prints(tmp_path):
    """The generator runs the command and fences what it printed (here: the version)."""
    from sameloss import __version__

    docs = _script()
    assert docs.run_command(["--version"]) == f"```text\nsameloss {__version__}\n```\n"


def test_figures_are_copied_with_their_captions(tmp_path):
    docs = _script()
    run = tmp_path / "run"
    run.mkdir()
    (run / "forest.png").write_bytes(b"\x89PNG fake")
    (run / "report.md").write_text("# R\n\n![Forest plot](forest.png)  \n**Figure 1.** Forest plot: the caption.\n\n"
                                   "![Missing](gone.png)  \n**Figure 2.** not there.\n", encoding="utf-8")
    page = tmp_path / "docs" / "page.md"
    page.parent.mkdir()
    text = docs.figures_block(run, "tiny", page, "img")
    assert (tmp_path / "docs" / "img" / "tiny-forest.png").read_bytes() == b"\x89PNG fake"
    assert text == "![Forest plot](img/tiny-forest.png)\n\n*Figure 1. Forest plot: the caption.*\n"


def test_the_docstring_examples_run():
    """Every ``Example:`` (``>>>``) of a docstring gives what it shows: the API reference
    renders them, so a stale one would mislead a reader."""
    import doctest
    import importlib

    failed, ran = [], 0
    for path in sorted(PACKAGE.rglob("*.py")):
        if ">>> " not in path.read_text(encoding="utf-8"):
            continue
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        module = importlib.import_module(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
        result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
        ran += result.attempted
        if result.failed:
            failed.append(module.__name__)
    assert ran > 0 and failed == []


# ---- records and the facts made from them (issue 62) ----------------------------------------
def _records(tmp_path, monkeypatch):
    """The scripts with their records in ``tmp_path/records`` (the committed ones left alone)."""
    docs = _script()
    records = docs.records
    monkeypatch.setattr(records, "RECORDS", tmp_path / "records")
    records.load_record.cache_clear()
    (tmp_path / "records").mkdir()
    return docs, records


def _write_record(records, name, **fields):
    import json

    record = {"name": name, "command": "sameloss reproduce", "commit": "abc1234", "machine": "a 2-core CPU",
              "load": "0.5 before", "date": "2026-11-29", "source": "a test", **fields}
    (records.RECORDS / f"{name}.json").write_text(json.dumps(record), encoding="utf-8")
    records.load_record.cache_clear()


def test_a_fact_is_read_from_its_record_and_a_drift_fails_the_check(tmp_path, monkeypatch):
    docs, records = _records(tmp_path, monkeypatch)
    _write_record(records, "quick", wall_min=14.94, verdicts=[
        {"test": "adv @ late", "mean": -4.93, "t_low": -6.74, "t_high": -3.11}])
    page = tmp_path / "page.md"
    text = ("It took <!-- fact quick wall_min .1f -->15.0<!-- /fact --> min; the adversary "
            "<!-- fact quick verdicts[adv @ late] ci.1f -->x<!-- /fact --> points.\n")
    page.write_text(text, encoding="utf-8")
    problems = docs.check_page(page, text)
    assert any("'quick wall_min .1f' is '14.9' now, the page says '15.0'" in p for p in problems), problems
    assert docs.main(["--page", str(page)]) == 0  # regenerated from the record
    text = page.read_text(encoding="utf-8")
    assert "-->14.9<!--" in text and "-->−4.9 [−6.7, −3.1]<!--" in text
    assert docs.check_page(page, text) == []
    # a record that is gone, or a path it does not have, is named
    bad = text.replace("quick wall_min", "quick wall_max")
    assert any("no 'wall_max'" in p for p in docs.check_page(page, bad))


def test_the_check_fails_on_a_placeholder_an_empty_block_and_a_stale_record_block(tmp_path, monkeypatch):
    docs, records = _records(tmp_path, monkeypatch)
    _write_record(records, "run1", wall_min=3.0, verdicts=[{"test": "noreg @ late", "used": 5, "of": 5, "mean": 0.01,
                                                           "t_low": -0.23, "t_high": 0.24, "mde": 0.32, "holm_p": 1.0,
                                                           "verdict": "no effect", "after_holm": "survives"}])
    page = tmp_path / "page.md"
    text = ("<!-- generated: figures tiny img -->\n*Not inserted yet: no folder.*\n<!-- end generated -->\n\n"
            "<!-- generated: command --version -->\n<!-- end generated -->\n\n"
            "<!-- generated: record run1 verdicts -->\n| stale |\n<!-- end generated -->\n"
            "The languages study: not run: estimate only.\n")
    problems = docs.check_page(page, text)
    assert any("'Not inserted yet'" in p for p in problems)
    assert any("'not run:'" in p for p in problems)
    assert any("the block 'command --version' is empty" in p for p in problems)
    assert any("the block 'record run1 verdicts' differs" in p for p in problems)
    table = records.record_block("run1", "verdicts")
    assert "| noreg @ late | 5/5 | 0.01 [−0.23, 0.24] | 0.32 | 1.000 | no effect | survives |" in table


def _study(folder, report: str):
    """A finished study's folder as ``docs_outputs.py record`` reads it: its report.md."""
    folder.mkdir()
    (folder / "report.md").write_text(report, encoding="utf-8")
    return folder


def test_a_record_is_written_from_a_finished_study(tmp_path, monkeypatch):
    """``docs_outputs.py record FOLDER NAME``: the report's command, date, machine and wall time,
    the units' CPU seconds, the verdicts, what was decided, the figures (copied beside it)."""
    import json

    docs, records = _records(tmp_path, monkeypatch)
    study = _study(tmp_path / "isoloss-quick",
        "# Iso-loss — scale `quick`\n\n**Decided 1 of 2**.  \nRuntime: 2.0 min on 2 local worker(s) (scale quick; load "
        "average 1.5 at the end).\n\nCommand: `sameloss reproduce isoloss --scale quick` — written 2026-11-29 08:00 "
        "UTC on x86_64, 2 CPU cores, torch 2.13.0+cpu (1 threads).\n\nWall time of this call: 120 s (training 90 s).\n\n"
        "## Verdicts\n\n![Forest plot](forest.png)  \n**Figure 1.** Forest plot: the [data](forest.data.csv).\n")
    (study / "forest.png").write_bytes(b"\x89PNG fake")
    (study / "verdicts.csv").write_text("test,mean,t_low,t_high,verdict,used\nadv @ late,-4.93,-6.74,-3.11,"
                                        "detected,4\nnoreg @ late,0.01,nan,nan,inconclusive,1\n", encoding="utf-8")
    (study / "decided.csv").write_text("test,decided\nadv @ late,True\nnoreg @ late,False\n", encoding="utf-8")
    (study / "costs.csv").write_text("unit,cpu_seconds\nseed 0,10.5\nseed 1,20.0\n", encoding="utf-8")
    assert docs.main(["record", str(study), "quick", "--load", "0.4 before", "--commit", "abc1234"]) == 0
    record = json.loads((records.RECORDS / "quick.json").read_text(encoding="utf-8"))
    assert {k: record[k] for k in ("command", "commit", "load", "date", "wall_min", "units_cpu_s", "decided",
                                   "planned")} == {
        "command": "sameloss reproduce isoloss --scale quick", "commit": "abc1234", "load": "0.4 before",
        "date": "2026-11-29 08:00 UTC", "wall_min": 2.0, "units_cpu_s": 30, "decided": 1, "planned": 2}
    assert record["machine"] == "x86_64, 2 CPU cores, torch 2.13.0+cpu (1 threads)"
    assert record["verdicts"][0] == {"test": "adv @ late", "mean": -4.93, "t_low": -6.74, "t_high": -3.11,
                                     "verdict": "detected", "used": 4}
    assert record["verdicts"][1]["t_low"] is None  # NaN: no interval
    assert record["figures"] == [{"file": "forest.png", "alt": "Forest plot",
                                  "caption": "Figure 1. Forest plot: the data."}]
    assert (records.RECORDS / "quick" / "forest.png").read_bytes() == b"\x89PNG fake"
    assert docs.main(["record", str(study), "quick"]) == 2  # an existing record is replaced only with --force
    # --time: the wall time and CPU of the command that ran it, from /usr/bin/time -v's report
    (tmp_path / "time.log").write_text(
        "[28/28 done]\n\tCommand being timed: \"sameloss reproduce\"\n\tUser time (seconds): 9000.50\n"
        "\tSystem time (seconds): 120.25\n\tPercent of CPU this job got: 190%\n"
        "\tElapsed (wall clock) time (h:mm:ss or m:ss): 2:40:05\n", encoding="utf-8")
    assert docs.main(["record", str(study), "quick", "--force", "--time", str(tmp_path / "time.log")]) == 0
    record = json.loads((records.RECORDS / "quick.json").read_text(encoding="utf-8"))
    assert {k: record[k] for k in ("wall", "wall_min", "cpu_s", "cpu_system_s", "cpu_percent")} == {
        "wall": "2:40:05", "wall_min": 160.1, "cpu_s": 9121, "cpu_system_s": 120, "cpu_percent": 190}
    # a study run in two calls (the first killed with its session, untimed; then resumed): summed walls,
    # the timed call's CPU and its share of a core
    (tmp_path / "time2.log").write_text(
        "\tUser time (seconds): 1000.0\n\tSystem time (seconds): 20.0\n\tPercent of CPU this job got: 170%\n"
        "\tElapsed (wall clock) time (h:mm:ss or m:ss): 10:00.40\n", encoding="utf-8")
    assert docs.main(["record", str(study), "quick", "--force", "--time", str(tmp_path / "time2.log"),
                      "--untimed", "2026-11-29T13:11:23..2026-11-29T15:53:33"]) == 0
    record = json.loads((records.RECORDS / "quick.json").read_text(encoding="utf-8"))
    assert {k: record[k] for k in ("wall", "wall_min", "calls", "timed_wall_min", "untimed_wall_min", "cpu_s",
                                   "cpu_percent")} == {
        "wall": "2:52:10", "wall_min": 172.2, "calls": 2, "timed_wall_min": 10.0, "untimed_wall_min": 162.2,
        "cpu_s": 1020, "cpu_percent": 170}
    assert docs.main(["record", str(study), "quick", "--force", "--time", str(tmp_path / "time.log"),
                      "--time", str(tmp_path / "time2.log")]) == 0  # two timed calls: walls and CPU summed
    record = json.loads((records.RECORDS / "quick.json").read_text(encoding="utf-8"))
    assert (record["wall_min"], record["cpu_s"], record["untimed_wall_min"]) == (170.1, 10141, 0.0)
    # --date: when the run ended, not when its report was re-written from the records
    assert docs.main(["record", str(study), "quick", "--force", "--date", "2026-11-29 07:55 UTC"]) == 0
    assert json.loads((records.RECORDS / "quick.json").read_text(encoding="utf-8"))["date"] == "2026-11-29 07:55 UTC"
    for span in ("2026-11-29T15:00..2026-11-29T14:00", "yesterday..today"):
        assert docs.main(["record", str(study), "quick", "--force", "--untimed", span]) == 2
    assert docs.main(["record", str(study), "quick", "--force", "--time", str(tmp_path / "nothing.log")]) == 2
    assert docs.main(["record", str(study), "quick", "--force", "--time", str(study / "report.md")]) == 2
    # --figures keeps only the figures named; one the report does not embed is named, and nothing written
    assert docs.main(["record", str(study), "quick2", "--figures", "curves"]) == 2
    assert not (records.RECORDS / "quick2.json").exists()
    page = tmp_path / "docs" / "page.md"
    page.parent.mkdir()
    assert records.record_figures("quick", page) == ("![Forest plot](../records/quick/forest.png)\n\n"
                                                    "*Figure 1. Forest plot: the data.*\n")
    # a record that keeps some of its report's figures: the page numbers them as it shows them
    (records.RECORDS / "some").mkdir()
    for stem in ("a", "b"):
        (records.RECORDS / "some" / f"{stem}.png").write_bytes(b"\x89PNG fake")
    _write_record(records, "some", figures=[{"file": "a.png", "alt": "A", "caption": "Figure 3. A: one."},
                                            {"file": "b.png", "alt": "B", "caption": "Figure 8. B: Figure 8. two."}])
    assert records.record_figures("some", page) == ("![A](../records/some/a.png)\n\n*Figure 1. A: one.*\n\n"
                                                   "![B](../records/some/b.png)\n\n*Figure 2. B: Figure 8. two.*\n")


def test_a_record_of_a_study_across_languages_keeps_its_stratified_pooled_rows(tmp_path, monkeypatch):
    """A languages study's record: per comparison the stratified model's estimate, verdict after
    Holm, power and interaction p, each language's cell; its claims decided pooled; the answer's
    sorting of the claims and the gates' selection; the table the results page shows."""
    import json

    docs, records = _records(tmp_path, monkeypatch)
    study = _study(tmp_path / "isoloss-languages",
        "# Iso-loss\n\n**Which claims hold:** across the languages (pooled, decided after Holm): size @ scratch "
        "(no effect beyond ±1). On some languages: none. Undecided on every language and pooled: none.  \n"
        "**Not tested here:** none — the design planned every claim on every language.\n\n"
        "Command: `sameloss reproduce isoloss --scale languages` — written 2026-11-29 16:00 UTC on x86_64.\n\n"
        "The seeds each language ran, and what its gate admitted: hmm-a: seeds 0, 1; hmm-b: seeds 1, 2.\n")
    head = ("test,holm_family,pooled,pooled_low,pooled_high,pooled_df,margin,pooled_verdict,pooled_after_holm,"
            "pooled_decided,pooled_power,interaction_p,pooled_languages,agreement,random,random_low,random_high,"
            "tau2,hmm-a_mean,hmm-a_low,hmm-a_high,hmm-a_verdict,hmm-a_used,hmm-b_mean,hmm-b_low,hmm-b_high,"
            "hmm-b_verdict,hmm-b_used\n")
    (study / "replication.csv").write_text(
        head + "size @ scratch,claims,0.1,-0.2,0.4,4,1.0,no effect beyond ±1,survives,True,0.93,0.5,2,"
        "2 of 2 languages show no effect beyond ±δ,0.1,-0.5,0.7,0,0.2,-0.3,0.7,no effect beyond ±1,3,0.0,-0.6,0.6,"
        "no effect beyond ±1,3\n"
        "noreg @ late,others,0.3,-0.9,1.5,4,1.0,inconclusive,undecided,False,nan,0.04,2,2 of 2 languages "
        "inconclusive,0.3,-2,2.6,0.1,0.8,-1,2.6,inconclusive,3,-0.2,-1.5,1.1,inconclusive: n small,3\n",
        encoding="utf-8")
    assert docs.main(["record", str(study), "langs", "--commit", "abc1234"]) == 0
    record = json.loads((records.RECORDS / "langs.json").read_text(encoding="utf-8"))
    assert record["pooling"] == "stratified" and [g["name"] for g in record["languages"]] == ["hmm-a", "hmm-b"]
    assert (record["decided"], record["planned"], record["decided_tests"]) == (1, 1, ["size @ scratch"])
    first = record["pooled"][0]
    assert (first["mean"], first["t_low"], first["df"], first["after_holm"], first["power"]) == (0.1, -0.2, 4,
                                                                                                 "survives", 0.93)
    assert record["pooled"][1]["power"] is None  # NaN: no power for an undecided verdict
    assert record["which_hold"].startswith("across the languages (pooled, decided after Holm): size @ scratch")
    assert record["which_hold"].endswith("pooled: none.")  # not the report line's Markdown break
    assert record["gate_selection"] == "hmm-a: seeds 0, 1; hmm-b: seeds 1, 2."
    table = records.record_block("langs", "pooled")
    assert ("| size @ scratch (claim) | 0.10 [−0.20, 0.40] | 1 | no effect beyond ±1 | survives | 0.93 | 0.5 | "
            "0.20 [−0.30, 0.70] (no effect beyond ±1) | 0.00 [−0.60, 0.60] (no effect beyond ±1) |") in table
    assert "| noreg @ late | 0.30 [−0.90, 1.50] | 1 | inconclusive | undecided | – | 0.04 |" in table


def test_the_report_lead_is_the_answer_above_the_header(tmp_path):
    """The tutorial's "the report's top is its answer": the lines between the title and the
    header that names the command, not the first section."""
    docs = _script()
    (tmp_path / "report.md").write_text(
        "# Iso-loss — scale `quick`\n\n**Decided 3 of 4** (primary probe accuracy): adv @ late detected.  \n"
        "Runtime: 14.9 min.\n\nCommand: `sameloss reproduce` — written 2026-11-28 01:47 UTC on x86_64.\n\n"
        "## Verdicts\n\n| a |\n", encoding="utf-8")
    assert docs.report_lead(tmp_path) == ("```markdown\n**Decided 3 of 4** (primary probe accuracy): adv @ late "
                                          "detected.\nRuntime: 14.9 min.\n```\n")


def test_what_plan_quotes_as_measured_is_the_main_jobs_record():
    """``sameloss plan`` prints the main job's measured runtime beside its forecast
    (``design.MEASURED_RUNTIMES``): it is the record's, not a number of its own; and the
    reference peak the docs' plan facts use is the planner's."""
    docs = _script()
    from sameloss.experiments.engine.hardware import REFERENCE_CPU_PEAK
    from sameloss.experiments.recipes.isoloss.design import MEASURED_RUNTIMES

    record = docs.records.load_record("isoloss-quick")
    text = MEASURED_RUNTIMES["quick"]
    assert f"{record['wall_min']:.1f} min" in text and record["date"].split()[0] in text
    assert f"decided {record['decided']} of its {record['planned']}" in text
    assert docs.records.PLAN_PEAK_GFLOPS * 1e9 == REFERENCE_CPU_PEAK


def test_every_committed_record_says_where_it_came_from():
    docs = _script()
    names = docs.records.all_records()
    assert "isoloss-quick" in names
    for name in names:
        import json

        record = json.loads(docs.records.record_path(name).read_text(encoding="utf-8"))
        assert docs.records.check_record(record, name) is None, name
        for figure in record.get("figures") or []:
            assert (docs.records.RECORDS / name / figure["file"]).exists(), (name, figure["file"])
