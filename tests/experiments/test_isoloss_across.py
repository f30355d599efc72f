"""Registered languages and the study across them (issue 48): ``language search --register``
writes one record a language (the first passing draw, its gate per seed, the command),
``--language NAME`` and ``language describe NAME`` read it, and ``reproduce isoloss --scale
languages`` runs the design ``choose_design`` fixes for them — its pipeline checked here at the
smoke scale's settings on two registered languages."""

from __future__ import annotations

import csv
import dataclasses

import pytest

from sameloss.cli import main
from sameloss.experiments import Job, Options, reproduce
from sameloss.experiments.recipes import isoloss
from sameloss.experiments.recipes.isoloss import across, design
from sameloss.experiments.recipes.isoloss.settings import SeedDesign
from sameloss import found


def _cli(capsys, *args) -> tuple[int, str, str]:
    try:
        code = main(list(args))
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


SEARCH = ["language", "search", "hmm", "n_states=3..5", "concentration=0.1..0.5", "--draws", "2", "--scale", "smoke",
          "--no-progress", "--min-gap", "-100", "--train-top", "1", "--gate-seeds", "2", "--gate-pass", "1/2"]


def test_the_search_registers_its_first_passing_draw(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(found, "REGISTERED", tmp_path / "registered")
    code, out, err = _cli(capsys, *SEARCH, "--out", str(tmp_path / "s"), "--register", "hmm:test-1")
    assert code == 0 and err == ""
    passed = [line.split("--language ")[1] for line in out.splitlines() if line.startswith("    --language ")]
    assert passed and f"registered hmm:test-1 = {passed[0]}" in out
    record = found.lookup("hmm:test-1")
    assert record.spec == passed[0] and record.scale == "smoke" and record.gate_pass == 0.5
    assert record.command.startswith("sameloss language search hmm") and "--register hmm:test-1" in record.command
    # its gate is the search's own rows, to the digit
    rows = [r for r in csv.DictReader((tmp_path / "s" / "search.csv").open()) if r["stage"] == "gate"
            and r["spec"] == record.spec]
    assert [r["seed"] for r in record.gate] == [int(r["seed"]) for r in rows] == [0, 1]
    assert [r["below_oracle"] for r in record.gate] == [float(r["below_oracle"]) for r in rows]
    assert record.passed == sum(r["ok"] == "True" for r in rows)
    assert (tmp_path / "registered" / "hmm-test-1.toml").is_file()
    # the name is the spec wherever --language takes one, labelled: its folders are the name's
    choice = isoloss.parse_language("hmm:test-1")
    assert dataclasses.replace(choice, label="") == isoloss.parse_language(record.spec)
    assert choice.tag == "hmm-test-1"
    passed = tuple(r["seed"] for r in record.gate if r["ok"])
    assert across.registered_choices() == (dataclasses.replace(choice, seeds=passed),)
    # describe prints the record (gate per seed, the command), then the language's summary
    code, out, err = _cli(capsys, "language", "describe", "hmm:test-1", "--n-sentences", "64")
    assert code == 0 and f"registered  hmm:test-1 = {record.spec}" in out and record.command in out
    assert f"passed on {record.passed} of 2 seeds" in out and "tasks" in out
    seed = record.spec.split("seed=")[1].split(",")[0]
    assert f"seed {seed}, params " in out  # the language described is the record's draw
    code, _, err = _cli(capsys, "language", "describe", "hmm:test-1", "--seed", "3")
    assert code == 2 and "is a registered language" in err
    # a rerun registers the same draw again; another spec under the name is refused
    code, out, _ = _cli(capsys, *SEARCH, "--out", str(tmp_path / "s"), "--register", "hmm:test-1")
    assert code == 0 and found.lookup("hmm:test-1") == record
    other = dataclasses.replace(record, spec="hmm:headroom:seed=1,task=task-5")
    (tmp_path / "registered" / "hmm-test-1.toml").write_text(found.record_text(other))
    code, _, err = _cli(capsys, *SEARCH, "--out", str(tmp_path / "s"), "--register", "hmm:test-1")
    assert code == 2 and "already registered as hmm:headroom:seed=1" in err and found.lookup("hmm:test-1") == other


@pytest.mark.parametrize("args, words", [
    (["--register", "hmm:test-1"], "--register needs --gate-seeds"),
    (["--gate-seeds", "2", "--register", "pcfg:x"], "give hmm:LABEL"),
    (["--gate-seeds", "2", "--register", "hmm:headroom"], "is a size of hmm"),
])
def test_a_bad_registration_is_one_line_before_anything_runs(capsys, tmp_path, monkeypatch, args, words):
    monkeypatch.setattr(found, "REGISTERED", tmp_path / "registered")
    code, _, err = _cli(capsys, "language", "search", "hmm", "--scale", "smoke", "--out", str(tmp_path / "s"), *args)
    assert code == 2 and words in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "s").exists() and not (tmp_path / "registered").exists()


def _record(name: str, spec: str, failed: tuple[int, ...] = (), seeds: int = 2) -> found.Found:
    gate = tuple({"seed": s, "trained": 80.0, "lookup": 60.0, "random_init": 70.0, "oracle": 95.0,
                  "above_lookup": 20.0, "above_random_init": 10.0, "below_oracle": 15.0, "ok": s not in failed}
                 for s in range(seeds))
    return found.Found(name, spec, f"sameloss language search ... --register {name}", "smoke", 0.5, 0.0, gate)


def test_a_record_reads_back_as_written(tmp_path):
    rec = _record("pcfg:test-2", "pcfg:headroom:seed=3,emit_prob=0.25,task=span-1-sampled")
    found.write(rec, tmp_path)
    assert found.registered(tmp_path) == {"pcfg:test-2": rec}
    assert found.settings_of(rec.spec) == ("pcfg", "headroom", 3, "emit_prob=0.25")
    (c,) = across.registered_choices(tmp_path)
    assert (c.name, c.size, c.task, c.seed, c.params, c.tag) == ("pcfg", "headroom", "span-1-sampled", 3,
                                                                 "emit_prob=0.25", "pcfg-test-2")
    (tmp_path / "pcfg-test-2.toml").write_text("name = 'pcfg:test-2'\n")
    with pytest.raises(found.UserError, match="not a registered language record"):
        found.registered(tmp_path)


def test_the_languages_scale_is_the_design_the_rule_chooses():
    """The languages scale is tiny cut to the plan ``choose_design`` picks before any data for the
    headroom HMM and the registered languages — the pilot's prior SDs, the planner's costs at this
    project's CPU, 180 minutes on 2 workers, seeds per language from the stratified pooled test —;
    the registration gates' selection is stated."""
    from sameloss.experiments.engine.hardware import REFERENCE_CPU_PEAK
    from sameloss.experiments.recipes.isoloss.allocation import _unplanned, choose_design, planned_costs

    p = isoloss.PRESETS["languages"]
    choices = across.registered_choices()
    assert len(choices) >= 3 and p.replicate == (across.HEADROOM, *choices)  # the headroom HMM and every one
    assert len({c.name for c in choices}) >= 2  # two families
    full = _unplanned(isoloss.PRESETS["tiny"])
    costs = planned_costs(full, cpu_peak=REFERENCE_CPU_PEAK, workers=2)
    chosen = choose_design(full, costs, 60 * across.LANGUAGES_BUDGET_MINUTES, across.LANGUAGES_WORKERS,
                           languages=len(p.replicate))
    assert tuple(chosen.seeds.items()) == across.LANGUAGES_PLAN and tuple(chosen.left.items()) == across.LANGUAGES_LEFT
    assert chosen.wall <= 60 * across.LANGUAGES_BUDGET_MINUTES
    plan = p.seed_design.plan
    assert plan == across.LANGUAGES_PLAN and [f"{c.name} @ {pt}" for c, pt in p.tests()] == [t for t, _ in plan]
    # pooled over the languages a claim needs fewer seeds a language than one language alone
    one = choose_design(full, costs, 1e9, 2)
    assert chosen.seeds["size @ scratch"] < one.seeds["size @ scratch"]
    lines = across.gate_selection(p.replicate, 4)
    assert lines[0].startswith("hmm-headroom: no registration gate")
    assert all("of 16 passed" in line or "passed" in line for line in lines[1:])


def test_the_languages_scale_runs_end_to_end_at_smoke(tmp_path, monkeypatch, capsys):
    """The languages scale's pipeline — registered languages read from their records, each one's
    study, its verdicts, then the pooled table — on smoke's settings with one planned test."""
    reg = tmp_path / "registered"
    found.write(_record("hmm:test-a", "hmm:micro:seed=11,task=task-3"), reg)
    # its recorded gate failed on seed 0: its study runs the seeds that passed, the first 2
    found.write(_record("hmm:test-b", "hmm:micro:seed=12,task=task-3", failed=(0,), seeds=4), reg)
    p = across.languages_preset(across.registered_choices(reg), plan=(("noreg @ late", 2),), scale="smoke",
                                settings=design.SMOKE_DESIGN)
    assert {f.name for f in p.forks} == {"adamw", "noreg"} and p.seeds == (0, 1) and p.fork_points == (30,)
    monkeypatch.setitem(isoloss.PRESETS, "languages", p)
    reproduce(Job("isoloss", "languages", out=tmp_path / "runs"), Options(progress=False))
    root = tmp_path / "runs" / "isoloss-languages-hmm-test-a+hmm-test-b"
    report = (root / "report.md").read_text()
    assert report.index("## Across the languages") < report.index("## Runs") \
        < report.index("## Verdicts — hmm:micro:seed=11") < report.index("## Verdicts — hmm:micro:seed=12")
    rep = list(csv.DictReader((root / "replication.csv").open()))
    # the answer opens the report, with the languages the stratified model pooled (those with used pairs)
    assert report.index(f"**Across the languages ({rep[0]['pooled_languages']} pooled):**") \
        < report.index("## Across the languages")
    assert [r["test"] for r in rep] == ["noreg @ late"]
    for key in ("pooled", "pooled_low", "pooled_high", "pooled_df", "pooled_verdict", "interaction_p", "random",
                "hmm-test-a_verdict", "hmm-test-b_verdict", "agreement"):
        assert rep[0][key] != "", key
    for tag, seeds in (("hmm-test-a", ["seed0", "seed1"]), ("hmm-test-b", ["seed1", "seed2"])):
        assert sorted(d.name for d in (root / "seeds" / tag).iterdir()) == seeds
    # the answer sorts the claims, and says what the design left out (nothing here)
    assert "**Which claims hold:** across the languages (pooled, decided after Holm): " in report
    assert "**Not tested here:** none — the design planned every claim on every language." in report
    # the pooled forest: each language's row of the claim, then the pooled row, the numbers of replication.csv
    plotted = [r for r in csv.DictReader((root / "pooled-forest.data.csv").open()) if r["kind"] == "point"]
    labels = [r["y"] for r in plotted]
    assert labels[0].startswith("noreg @ late · hmm-test-a (") and labels[1].startswith("noreg @ late · hmm-test-b (")
    assert float(plotted[0]["x"]) == pytest.approx(float(rep[0]["hmm-test-a_mean"]))
    # the pooled row, drawn where the stratified model has an estimate (smoke's micro languages may lack headroom)
    k = int(rep[0]["pooled_languages"])
    if rep[0]["pooled"] != "nan":
        assert labels[2] == f"noreg @ late · POOLED ({k})"
        assert float(plotted[2]["x"]) == pytest.approx(float(rep[0]["pooled"]))
    else:
        assert len(labels) == 2 and rep[0]["pooled_verdict"].startswith("uninformative")
    assert "pooled-forest.png" in report
    # each language's figures are named by it: a page or gallery may show them apart from their sections
    for tag in ("hmm-test-a", "hmm-test-b"):
        assert f"![On {tag}, forest plot]({tag}-forest.png)" in report
        assert f"![On {tag}, Fig. 1 within seeds]({tag}-scatter.png)" in report


def test_the_planner_says_first_what_the_languages_scale_is_expected_to_decide(tmp_path, monkeypatch, capsys):
    reg = tmp_path / "registered"
    for name, seed in (("hmm:test-a", 11), ("hmm:test-b", 12), ("hmm:test-c", 13)):
        found.write(_record(name, f"hmm:micro:seed={seed},task=task-3"), reg)
    plan = (("noreg @ late", 2), ("sam05 @ late", 3))
    p = across.languages_preset(across.registered_choices(reg), plan=plan, scale="smoke",
                                settings={**design.SMOKE_DESIGN, "claims": ("noreg @ late", "sam05 @ late"),
                                          "seed_design": SeedDesign(prior_sds=(("noreg @ late", 0.2),),
                                                                    prior_source="a test's")})
    monkeypatch.setitem(isoloss.PRESETS, "languages", p)
    code, out, err = _cli(capsys, "plan", "isoloss", "--scale", "languages", "--cpu-peak", "100")
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert lines[0].startswith("plan: isoloss --scale languages")
    assert lines[1].startswith("Claims first: the 180-minute budget on 2 workers is expected to decide")
    assert "noreg @ late (2 seeds a language; δ 1, prior SD 0.20: power" in lines[1]


def test_the_pooled_forest_draws_each_language_then_the_pooled_estimate(tmp_path):
    """Per pooled claim each language's row then the stratified model's (a comparison reported per
    language only has none), from replication.csv's rows; the plotted numbers are the table's."""
    from sameloss.experiments.reports.document import Figure, Section
    from sameloss.experiments.reports.plots import save_figure
    from sameloss.experiments.recipes.isoloss.figures import pooled_forest
    from sameloss.experiments.stats.replication import NOT_POOLED

    legend = []

    class Records:
        def figure(self, fig, stem, *, shows, sample, claim):
            legend.extend(t.get_text() for lg in fig.legends for t in lg.get_texts())
            saved = save_figure(fig, tmp_path, stem)
            return Figure(saved.files[0], shows=shows, bars=saved.bars, sample=sample, claim=claim, data=saved.data)

    def row(test, pooled, a, b, **more):
        return {"test": test, "holm_family": "claims", "margin": 1.0, "pooled": pooled, "pooled_low": pooled - 0.5,
                "pooled_high": pooled + 0.5, "pooled_languages": 2, "pooled_verdict": "no effect beyond ±1",
                "a_mean": a, "a_low": a - 1, "a_high": a + 1, "a_used": 3,
                "b_mean": b, "b_low": b - 1, "b_high": b + 1, "b_used": 2, **more}

    section = Section("Across the languages")
    section.files["replication.csv"] = [row("size @ scratch", 0.2, 0.1, 0.4),
                                        row("adv @ late", float("nan"), -5.0, -2.0, pooled_verdict=NOT_POOLED),
                                        {**row("noreg @ late", 9.0, 9.0, 9.0), "holm_family": "others"}]
    pooled_forest(Records(), section, ["a", "b"])
    assert [f.file for f in section.figures] == ["pooled-forest.png"]
    points = [r for r in csv.DictReader((tmp_path / "pooled-forest.data.csv").open()) if r["kind"] == "point"]
    # the adversary is not pooled: its rows are each language's forest's (its size would set this plot's scale)
    assert [(r["y"], float(r["x"])) for r in points] == [
        ("size @ scratch · a (3)", 0.1), ("size @ scratch · b (2)", 0.4), ("size @ scratch · POOLED (2)", 0.2)]
    # one legend entry for ±δ, none blank for its −δ line
    assert "±δ = 1 point" in legend and "" not in legend
    assert [float(r["x_low"]) for r in points][2] == pytest.approx(-0.3)
