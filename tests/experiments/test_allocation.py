"""Seeds where the answer is open (issue 35): the seeds an MDE target needs against brute
force, the plan from a pilot (exempt, degenerate and capped comparisons), a budget's cut, and
an adaptive isoloss study end to end — its pilot first (also when a shard asks for a later
seed), later seeds running only the forks still short, the plan kept in allocation.json."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from sameloss.cli import main
from sameloss.errors import UserError
from sameloss.experiments import Job, Options, reproduce
from sameloss.experiments.stats.allocation import afford, allocate, needed_seeds, pooled_forecast
from sameloss.experiments.recipes import isoloss
from sameloss.experiments.stats.pooling import pooled_mde
from sameloss.experiments.stats.inference import minimum_detectable_effect, stein_mde

from .test_isoloss import read


@pytest.mark.parametrize("sd", [0.1, 0.3, 0.5, 0.9, 1.7])
@pytest.mark.parametrize("start", [2, 6])
def test_needed_seeds_is_the_fewest_that_reach_the_target(sd, start):
    n = needed_seeds(sd, 0.35, start=start)
    brute = next(k for k in range(start, 2000) if minimum_detectable_effect(sd, k) <= 0.35)
    assert n == brute
    # planned for Stein's two-stage test (the spread is the pilot's, on its k − 1 degrees of freedom)
    stein = needed_seeds(sd, 0.35, start=start, pilot=start)
    assert stein == next(k for k in range(start, 5000) if stein_mde(sd, k, start) <= 0.35) >= n
    assert needed_seeds(math.nan, 0.35) is None and needed_seeds(0.0, 0.35) is None
    assert needed_seeds(50.0, 0.35, limit=100) is None  # beyond the limit: not reachable


def test_the_plan_from_the_pilot():
    sds = {"a @ late": 0.3, "b @ late": 0.8, "adv @ late": 2.0, "c @ late": 0.0, "d @ late": math.nan,
           "e @ scratch": 5.0, "f @ late": 0.3}
    family = ("a @ late", "b @ late", "adv @ late", "c @ late", "d @ late", "e @ scratch")
    alloc = allocate(sds, pilot=6, cap=40, target=0.35, exempt=("adv",), family=family)
    # planned for the power after Holm: Stein's test at α/m, m = the family's 6 tests (adv counted)
    assert alloc.level == pytest.approx(1 - 0.05 / 6)
    assert alloc.planned["a @ late"] == needed_seeds(0.3, 0.35, 6, level=1 - 0.05 / 6, pilot=6) == 20
    assert needed_seeds(0.3, 0.35, 6, pilot=6) == 9  # at α = 0.05 it would have planned 9
    assert alloc.planned["f @ late"] == 6 and alloc.needed["f @ late"] is None  # not a claim: the pilot's seeds
    assert alloc.planned["b @ late"] == 40 and alloc.needed["b @ late"] > 40  # capped at the study's seeds
    assert alloc.planned["adv @ late"] == 6 and alloc.needed["adv @ late"] is None  # exempt: the pilot only
    assert alloc.planned["c @ late"] == 6 and alloc.planned["d @ late"] == 6  # no spread / no pairs: nothing to plan
    assert alloc.planned["e @ scratch"] == 40
    # seed i (0-based) runs the tests planned beyond it
    assert set(alloc.active(6)) == {"a @ late", "b @ late", "e @ scratch"}
    assert set(alloc.active(20)) == {"b @ late", "e @ scratch"} and alloc.active(40) == []
    assert alloc.seeds == 40


def test_a_budget_cuts_the_later_seeds():
    alloc = allocate({"a @ late": 0.3, "b @ late": 0.8}, pilot=4, cap=40, target=0.35, alpha=0.1)
    cost = {"a @ late": 10.0, "b @ late": 30.0}

    def seed_cost(tests):
        return 5.0 + sum(cost[t] for t in tests)

    # unlimited: as planned
    assert afford(alloc, seed_cost, 100.0, 1e9, 2).planned == alloc.planned
    # 100 s of pilot, then each later seed costs (5 + 10 + 30) / 2 = 22.5 s wall while both run
    assert alloc.planned["a @ late"] > 7
    cut = afford(alloc, seed_cost, 100.0, 100.0 + 3 * 22.5, 2)
    assert cut.planned == {"a @ late": 7, "b @ late": 7} and "buys 7 seeds" in cut.budget_note
    spent = 100.0 + sum(seed_cost(alloc.active(i)) / 2 for i in range(4, 7))
    assert spent <= 100.0 + 3 * 22.5 < spent + seed_cost(alloc.active(7)) / 2
    # a budget the pilot already spends: the pilot's seeds only
    assert set(afford(alloc, seed_cost, 100.0, 50.0, 2).planned.values()) == {4}


def _adaptive(p):
    """smoke with three seeds, a pilot of two, and every comparison exempt but −dropout−WD
    (whose target of 0.01 points it cannot reach: it gets every seed), the claims its two tests."""
    seeds = dataclasses.replace(p.seed_design, pilot_seeds=2, mde_target=0.01,
                                exempt=tuple(c.name for c in p.comparisons if c.name != "noreg"))
    return dataclasses.replace(p, seeds=(0, 1, 2), seed_design=seeds, claims=("noreg @ late", "noreg @ scratch"))


def test_an_adaptive_study_runs_its_pilot_then_only_the_forks_still_short(tmp_path, monkeypatch):
    monkeypatch.setitem(isoloss.PRESETS, "smoke", _adaptive(isoloss.PRESETS["smoke"]))
    # the pilot's spread, as measured, but never 0 for −dropout−WD (at smoke its differences can
    # all be equal, and a test without spread has nothing to plan with: it would stay at the pilot)
    from sameloss.experiments.recipes.isoloss import allocation as iso_allocation

    measured = iso_allocation._pilot_sds
    monkeypatch.setattr(iso_allocation, "_pilot_sds", lambda p, pilot: {
        t: (sd if not t.startswith("noreg @") or sd > 0 else 1.0) for t, sd in measured(p, pilot).items()})
    # allocation.json is written once a call: the pilot's spread and cost with the plan from them
    from sameloss import files

    written, real_write = [], files.atomic_write_json
    monkeypatch.setattr(files, "atomic_write_json", lambda path, *a, **k: (
        written.append(path.name) if str(path).endswith("allocation.json") else None, real_write(path, *a, **k))[1])
    # a shard asking for a later seed runs the pilot first (the plan needs it)
    assert reproduce(Job("isoloss", "smoke", out=tmp_path), Options(progress=False, seeds=[2])).name == "isoloss-smoke"
    assert written == ["allocation.json"]
    root = tmp_path / "isoloss-smoke"
    for seed in (0, 1):
        assert (root / "seeds" / f"seed{seed}" / "runs" / f"hmm-s{seed}-scratch-sam05").exists()
    # seed 2 ran its base and the forks −dropout−WD is compared with, nothing else
    assert sorted(d.name for d in (root / "seeds" / "seed2" / "runs").iterdir() if d.is_dir()) == \
        ["hmm-s2-base", "hmm-s2-late-adamw", "hmm-s2-late-noreg", "hmm-s2-scratch-noreg"]
    saved = json.loads((root / "allocation.json").read_text())
    assert saved["allocation"]["pilot"] == 2 and saved["allocation"]["planned"]["noreg @ late"] == 3
    assert saved["key"]["pilot"] == 2 and set(saved["sds"]) == {f"{c.name} @ {pt}" for c, pt in
                                                                  isoloss.PRESETS["smoke"].tests()}
    # the report (reuses every seed): the plan with each comparison's seeds, the tests on them
    reproduce(Job("isoloss", "smoke", out=tmp_path), Options(progress=False))
    report = (root / "report.md").read_text()
    assert "Seeds where the answer is open: a pilot of 2 seeds" in report
    assert report.split("\n")[2].startswith(("**Decided ", "**No verdict"))  # the answer opens the report
    allocation = {r["test"]: r for r in read(root / "allocation.csv")}
    diffs = {f"{r['comparison']} @ {r['point']}": r for r in read(root / "differences.csv")
             if r["family"] == "primary"}
    for test, row in allocation.items():
        want = 3 if test.startswith("noreg @") else 2
        assert int(row["planned"]) == want == int(row["used"]) == int(diffs[test]["n_used"]), test
    assert {int(r["seed"]) for r in read(root / "gate.csv")} == {0, 1, 2}


def test_the_claims_a_budget_decides_against_brute_force():
    """``plan_claims``: the largest family whose plan fits, each claim's seeds the fewest that
    reach the target after Holm over it, and leaving out a claim lowers the others' seeds."""
    import itertools

    from sameloss.experiments.stats.allocation import fork_seed_cost, plan_claims, plan_cost
    from sameloss.experiments.stats.inference import t_test_power

    sds = {"a": 0.3, "b": 0.5, "c": 0.9, "d": math.nan}
    forks = {"a": ("x", "r"), "b": ("y", "r"), "c": ("z", "r"), "d": ("w", "r")}
    cost = fork_seed_cost({"x": 10.0, "y": 10.0, "z": 20.0, "w": 5.0, "r": 5.0}, forks, base=3.0)
    assert cost(["a", "b"]) == 3.0 + 10 + 10 + 5  # the shared reference paid once
    for budget in (200.0, 800.0, 3000.0, 1e6):
        plan = plan_claims(sds, cost, budget, 0.35, cap=200)
        m = len(plan.family)
        for t, n in plan.seeds.items():  # the fewest seeds reaching 80 % at α/m
            assert n == next(k for k in range(2, 201) if minimum_detectable_effect(
                sds[t], k, level=1 - 0.05 / m) <= 0.35)
            assert plan.power[t] == pytest.approx(t_test_power(0.35 * math.sqrt(n) / sds[t], n - 1, 1 - 0.05 / m))
        assert plan.cost == pytest.approx(plan_cost(plan.seeds, cost)) and (plan.cost <= budget or not plan.family)
        assert "d" in plan.left_out and plan.left_out["d"] is None  # no prior spread: nothing to plan
        # no larger family would have fitted (brute force over the subsets)
        for size in range(m + 1, 4):
            for sub in itertools.combinations("abc", size):
                need = {t: next((k for k in range(2, 201) if minimum_detectable_effect(
                    sds[t], k, level=1 - 0.05 / size) <= 0.35), None) for t in sub}
                assert None in need.values() or plan_cost(need, cost) > budget, (budget, sub)
    big, small = plan_claims(sds, cost, 1e6, 0.35, cap=200), plan_claims(sds, cost, 800.0, 0.35, cap=200)
    assert len(small.family) < len(big.family) and all(small.seeds[t] <= big.seeds[t] for t in small.family)


def test_budget_and_even_are_isolosss_and_checked(tmp_path, capsys):
    with pytest.raises(UserError, match="no pilot"):
        isoloss.with_budget(isoloss.PRESETS["quick"], 30)
    tiny = isoloss.PRESETS["tiny"]
    assert isoloss.with_budget(tiny, 30).seed_design.budget_minutes == 30
    even = isoloss.with_even(tiny)
    assert even.seed_design.pilot_seeds == 0 and len(even.seeds) == tiny.seed_design.even_seeds
    assert isoloss.folder_suffix(even) == "-even"
    for args, words in ((["reproduce", "steps", "--scale", "smoke", "--budget", "5"], "--budget: steps"),
                        (["reproduce", "isoloss", "--scale", "smoke", "--budget", "-5"], "--budget"),
                        (["reproduce", "isoloss", "--scale", "tiny", "--even", "--budget", "5"], "takes no --budget")):
        try:  # argparse's own refusals exit; sameloss's return 2
            code = main([*args, "--out", str(tmp_path)])
        except SystemExit as e:
            code = e.code
        assert code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and words in err[0], err
    assert not any(tmp_path.iterdir())  # nothing written


def test_the_pooled_forecast_plans_languages_and_seeds_from_one_languages_sds():
    """A study across languages: per test the pooled MDE at each τ, and per number of languages
    the fewest seeds that reach the target on the test with the largest SD (issue 36)."""
    sds = {"noreg @ late": 0.5, "size @ late": 0.3, "adv @ late": 9.0}
    text = pooled_forecast(list(sds), sds, 5, 4, 0.35, "measured", exempt=("adv",), taus=(0.0, 0.1))
    assert "adv @ late" not in text  # exempt from the plan
    row = next(line for line in text.splitlines() if line.startswith("noreg @ late"))
    assert row.split()[-2:] == [f"{pooled_mde(0.5, 0.0, 5, 4):.2f}", f"{pooled_mde(0.5, 0.1, 5, 4):.2f}"]
    # for 5 languages at τ = 0 the fewest seeds m with pooled_mde(0.5, 0, 5, m) <= 0.35
    m = next(m for m in range(2, 201) if pooled_mde(0.5, 0.0, 5, m) <= 0.35)
    assert pooled_mde(0.5, 0.0, 5, m - 1) > 0.35 and f"5 languages: τ=0: {m}," in text
    assert "on noreg @ late (the largest prior SD)" in text
    # τ larger than the target's reach: no number of seeds suffices for 3 languages
    assert "3 languages: τ=0: " in pooled_forecast(["a @ late"], {"a @ late": 0.5}, 3, 4, 0.35, "m", taus=(0.0, 1.0))
    assert "τ=1: >200" in pooled_forecast(["a @ late"], {"a @ late": 0.5}, 3, 4, 0.35, "m", taus=(0.0, 1.0))
    # no prior SDs: one line saying so, not a table of blanks
    assert "no prior paired SDs" in pooled_forecast(list(sds), {}, 5, 4, 0.35, "none")


def test_an_unreadable_recorded_allocation_is_one_line_naming_the_file(tmp_path):
    from sameloss.experiments.engine.walk import Setup
    from sameloss.experiments.recipes.isoloss.allocation import _allocation_key, recorded_allocation

    p = isoloss.PRESETS["tiny"]
    (tmp_path / "allocation.json").write_text(json.dumps({"key": _allocation_key(p), "sds": {}, "costs": [],
                                                          "pilot_wall": 0.0, "allocation": {"pilot": 3}}))
    with pytest.raises(UserError, match="allocation.json: its allocation cannot be read"):
        recorded_allocation(Setup(tmp_path, 0, print), p)
