"""``sameloss language search`` (issue 36): ranges, draws, the three stages at the smoke scale, the
folder it owns, and that its gate is the isoloss study's own to the digit."""

from __future__ import annotations

import csv
import json

import pytest

from sameloss.cli import main
from sameloss.errors import UserError
from sameloss.experiments.search import screen as search
from sameloss.experiments.engine.core import Study, StudySettings
from sameloss.experiments.recipes import isoloss


def _cli(capsys, *args) -> tuple[int, str, str]:
    try:
        code = main(["language", "search", *args])
    except SystemExit as exc:  # argparse's usage errors
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("args, words", [
    (["hmm", "colour=1..2"], "hmm takes no 'colour'"),
    (["hmm", "n_states=4..8", "n_states=5"], "n_states is given twice"),
    (["hmm", "n_states=4.5..8"], "n_states is an integer setting"),
    (["hmm", "concentration=0.5..0.1"], "the low end 0.5 is above the high end 0.1"),
    (["hmm", "n_states=..8"], "a range needs both ends"),
    (["hmm", "n_states"], "is not KEY=LO..HI"),
    (["hmm", "concentration=a..b"], "is not a number"),
    (["hmm", "seed=-3..2"], "seed must be a non-negative integer"),
    (["hmm", "n_states=0", "--draws", "2"], "none of the 2 draws can be studied; the first: HMM n_states must be a positive integer"),
    (["hmm", "--task", "task-99"], "none of the"),
    (["hmm", "--scale", "huge"], "isoloss has no such scale"),
    (["hmm", "--size", "giant"], "hmm has no such size"),
    (["dyck"], "invalid choice"),
])
def test_a_bad_range_or_key_is_one_line_and_exit_2(capsys, tmp_path, args, words):
    code, out, err = _cli(capsys, *args, "--out", str(tmp_path / "s"))
    assert code == 2 and words in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "s").exists()  # refused before anything is written


def test_draws_are_reproducible_within_their_ranges_and_distinct():
    ranges = search.parse_settings("hmm", ["n_states=4..8", "concentration=0.1..0.5", "length=8"])
    a = search.draws("hmm", "headroom", "task-5", ranges, 30, seed=1)
    assert a == search.draws("hmm", "headroom", "task-5", ranges, 30, seed=1)
    assert a != search.draws("hmm", "headroom", "task-5", ranges, 30, seed=2)
    assert len({c.spec for c in a}) == len(a) == 30
    for c in a:
        params = dict(item.split("=") for item in c.params.split(","))
        assert 4 <= int(params["n_states"]) <= 8 and params["length"] == "8"
        assert 0.1 <= float(params["concentration"]) <= 0.5 and len(params["concentration"]) <= 5  # 3 digits
        assert 0 <= c.seed <= 999 and c.task == "task-5"
        assert isoloss.parse_language(c.spec) == c  # each draw is a --language spec
    # everything fixed: one language, however many draws
    one = search.draws("hmm", "headroom", "task-5", search.parse_settings("hmm", ["seed=3", "n_states=4"]), 5, 0)
    assert [c.spec for c in one] == ["hmm:headroom:seed=3,n_states=4,task=task-5"]


SMOKE = ["hmm", "n_states=3..5", "concentration=0.1..0.5", "--draws", "3", "--scale", "smoke", "--no-progress",
         "--min-gap", "-100", "--train-top", "2"]


def test_the_search_screens_trains_gates_and_reuses_at_smoke(capsys, tmp_path):
    out_dir = tmp_path / "search"
    code, out, err = _cli(capsys, *SMOKE, "--gate-seeds", "2", "--gate-pass", "1/2", "--out", str(out_dir))
    assert code == 0 and err == ""
    assert out.count("\nscreened ") == 3 and out.count("\ntraining ") == 2
    table = out[out.index("Screen:"):]
    rows = list(csv.DictReader((out_dir / "search.csv").open()))
    gated = [r for r in rows if r["stage"] == "gate"]
    # each draw that passed on seed 0 is gated on seeds 0 and 1 (the smoke gate's margin is 0: most pass)
    assert len(gated) == 2 * sum(r["ok"] == "True" for r in rows if r["stage"] == "train") >= 2
    assert table.count("| `hmm:headroom:seed=") == 3 + 2 + len(gated)  # screened, trained, gated
    assert [r["stage"] for r in rows].count("screen") == 3 and [r["stage"] for r in rows].count("train") == 2
    trained = [r for r in rows if r["stage"] == "train"]
    # the shortlist is the first promising draws, in drawing order; each trained row has its fork's KL
    assert [r["spec"] for r in trained] == [r["spec"] for r in rows if r["stage"] == "screen"][:2]
    assert all(float(r["fork_min_kl"]) <= float(r["base_kl"]) for r in trained)
    passed = [r["spec"] for r in rows if r["stage"] == "gate" and r["ok"] == "True"]
    for spec in {r["spec"] for r in rows if r["stage"] == "gate"}:
        listed = f"    --language {spec}" in out
        assert listed == (passed.count(spec) >= 1)  # ≥ 1/2 of 2 seeds
    assert json.loads((out_dir / "search.json").read_text())["scale"] == "smoke"
    costs = json.loads((out_dir / "costs.json").read_text())  # tidy rows: stage, draw, detail, CPU
    assert len(costs) == 3 + 2 + len([r for r in rows if r["stage"] == "gate" and r["seed"] != "0"])
    assert [c["stage"] for c in costs].count("screen") == 3 and all(c["cpu_s"] > 0 for c in costs)
    assert sorted(str(c["detail"]) for c in costs if c["stage"] == "gate") == sorted(
        r["seed"] for r in rows if r["stage"] == "gate" and r["seed"] != "0")
    # a rerun (another search over the folder) reuses every run and measurement: nothing trains
    code, again, _ = _cli(capsys, *SMOKE, "--gate-seeds", "2", "--gate-pass", "1/2", "--out", str(out_dir))
    assert code == 0 and ": training " not in again and again[again.index("Screen:"):] == table
    # the folder is the search's: another scale is refused, and so is a folder it did not make
    code, _, err = _cli(capsys, "hmm", "n_states=3..5", "--draws", "3", "--no-progress", "--out", str(out_dir))
    assert code == 2 and "holds a search at scale 'smoke', not 'tiny'" in err
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("mine")
    code, _, err = _cli(capsys, *SMOKE, "--out", str(tmp_path / "mine"))
    assert code == 2 and "not a language search folder" in err
    assert sorted(p.name for p in (tmp_path / "mine").iterdir()) == ["notes.txt"]


def test_the_search_says_plainly_when_no_draw_passes(capsys, tmp_path):
    code, out, _ = _cli(capsys, "hmm", "n_states=3", "--draws", "2", "--scale", "smoke", "--no-progress",
                        "--min-gap", "1000", "--out", str(tmp_path / "s"))
    assert code == 0 and "No draw passes the headroom gate on seed 0" in out and "(no draw reached a gap" in out
    code, out, _ = _cli(capsys, "hmm", "n_states=3", "--draws", "2", "--scale", "smoke", "--no-progress",
                        "--screen-only", "--out", str(tmp_path / "s"))
    assert code == 0 and "(--screen-only: nothing trained)" in out and "training " not in out


def test_the_search_gate_is_the_study_gate_to_the_digit(tmp_path):
    """The search measures the study's primary endpoint alone (one probe size, one method);
    its numbers are those the study's declared headroom gate reads (every size and method),
    walked by the engine on the same study."""
    from sameloss.experiments.engine.declare import Run, seed_unit
    from sameloss.experiments.engine.walk import Execute, walk
    from sameloss.experiments.recipes.isoloss.study import BASE_COST, gate_measures, headroom_gate

    choice = isoloss.parse_language("hmm:headroom:seed=5,n_states=4")
    design = search.SearchDesign(scale="smoke")
    p = search._preset(choice, "smoke")
    with Study(tmp_path / "study", StudySettings(progress=False)) as study:
        row = search.gate(study, choice, design, 1)
        reads = gate_measures(p, 1)
        record = walk(seed_unit(1, (Run(isoloss.base_run(p, 1), None, BASE_COST), *reads)), Execute(study))
    trained, random_init, lookup, oracle = (record.row(m) for m in reads)
    ok, _ = headroom_gate(p, 1, trained, random_init, lookup, oracle)
    key = p.primary_key
    assert row["trained"] == 100 * trained[key] and row["oracle"] == 100 * oracle[key]
    assert row["lookup"] == 100 * lookup[key] and row["random_init"] == 100 * random_init[key]
    assert row["ok"] == ok


def test_a_family_without_a_random_constructor_is_refused():
    with pytest.raises(UserError, match="no random constructor"):
        search.family_params("dyck")


def test_the_search_costs_are_tidy_rows_and_another_layout_is_not_read(tmp_path):
    from sameloss.experiments.search.screen import COSTS_FILE, Costs

    path = tmp_path / COSTS_FILE
    Costs(tmp_path)("screen", "hmm:headroom:seed=1", "10x2000", {"cpu_s": 4.5})  # a first cost: kept, as rows
    assert json.loads(path.read_text()) == [
        {"stage": "screen", "spec": "hmm:headroom:seed=1", "detail": "10x2000", "cpu_s": 4.5}]
    costs = Costs(tmp_path)
    assert costs("screen", "hmm:headroom:seed=1", "10x2000", {"cpu_s": 0.1}) == {"cpu_s": 4.5}  # read back
    costs("gate", "hmm:headroom:seed=1", 4, {"cpu_s": 7.0})
    assert Costs(tmp_path)("gate", "hmm:headroom:seed=1", 4, {"cpu_s": 0.0}) == {"cpu_s": 7.0}
    # joined keys (a layout no release wrote) are not read: this call's costs are kept instead
    path.write_text(json.dumps({"screen|hmm:headroom:seed=1|10x2000": 4.5}))
    assert Costs(tmp_path)("screen", "hmm:headroom:seed=1", "10x2000", {"cpu_s": 0.3}) == {"cpu_s": 0.3}
    assert json.loads(path.read_text()) == [
        {"stage": "screen", "spec": "hmm:headroom:seed=1", "detail": "10x2000", "cpu_s": 0.3}]
