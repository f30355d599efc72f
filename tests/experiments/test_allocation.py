"""The claims-first design rule of every scale: the seeds that decide a claim against brute
force and simulation, the plan of a budget against brute force over the claims it could keep,
``--budget`` choosing again by the same rule, and a study's seeds disjoint from the pilot's."""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np
import pytest

from sameloss.cli import main
from sameloss.experiments.recipes import isoloss
from sameloss.experiments.stats.allocation import ClaimSpec, decide_power, plan_design, seeds_to_decide
from sameloss.experiments.stats.inference import paired_difference, t_test_power, tost_power


@pytest.mark.parametrize("sd", [0.3, 0.55, 0.9])
@pytest.mark.parametrize("languages", [1, 3])
def test_seeds_to_decide_is_the_fewest_that_decide_either_way(sd, languages):
    c = ClaimSpec("x @ late", sd, margin=1.0, effect=1.0)
    alpha = 0.05 / 5
    n = seeds_to_decide(c, alpha, languages, start=3)

    def ok(k):
        se, df = sd / math.sqrt(languages * k), languages * (k - 1)
        return t_test_power(1.0 / se, df, 1 - alpha) >= 0.8 and tost_power(1.0, se, df, alpha) >= 0.8

    assert n == next(k for k in range(3, 500) if ok(k))
    # a positive control is planned to detect its effect only
    control = ClaimSpec("adv @ late", 2.2, margin=1.0, effect=5.5, control=True)
    k = seeds_to_decide(control, alpha, start=2)
    assert decide_power(control, k, alpha)[0] >= 0.8 > decide_power(control, k - 1, alpha)[0]
    # a comparison not pooled across languages is planned per language
    unpooled = dataclasses.replace(c, pooled=False)
    assert seeds_to_decide(unpooled, alpha, languages) == seeds_to_decide(c, alpha, 1)
    assert seeds_to_decide(ClaimSpec("y @ late", math.nan, 1.0, 1.0), alpha) is None
    assert seeds_to_decide(ClaimSpec("z @ late", 50.0, 1.0, 1.0), alpha, cap=40) is None


def test_the_planned_power_is_what_simulated_studies_decide():
    """The power a claim is planned with (detect at δ; TOST at 0) against simulated paired
    studies at its seeds through the study's own verdict arithmetic."""
    rng = np.random.default_rng(0)
    c = ClaimSpec("x @ late", 0.6, margin=1.0, effect=1.0)
    alpha = 0.05 / 4
    n = seeds_to_decide(c, alpha)
    detect, null = decide_power(c, n, alpha)
    hits_detect = hits_null = 0
    for _ in range(3000):
        hit = paired_difference(rng.normal(1.0, 0.6, n), n_boot=0)
        hits_detect += hit.p_value <= alpha
        hits_null += paired_difference(rng.normal(0.0, 0.6, n), n_boot=0).tost_p(1.0) <= alpha
    assert hits_detect / 3000 == pytest.approx(detect, abs=0.03)
    assert hits_null / 3000 == pytest.approx(null, abs=0.06)  # TOST's power with the SD taken as known


def _costs():
    """Seconds per seed by test: a base and the forks each test adds (x and y share one)."""
    forks = {"a @ late": ("x",), "b @ late": ("x", "y"), "c @ scratch": ("z",), "d @ late": ("w",)}
    price = {"x": 10.0, "y": 10.0, "z": 40.0, "w": 5.0}

    def wall(plan: dict[str, int]) -> float:  # one worker: the sum over seeds
        seeds = max(plan.values(), default=0)
        return sum(3.0 + sum(price[f] for f in {f for t, n in plan.items() if n > i for f in forks[t]})
                   for i in range(seeds))
    return wall


def test_a_budgets_plan_keeps_the_claims_that_fit_against_brute_force():
    """``plan_design``: the claims it keeps are planned the seeds that decide them at α/m over
    the kept, its wall fits the budget, and no larger set of claims would; the others get the
    budget left; a claim left out names its seeds and minutes."""
    wall = _costs()
    claims = [ClaimSpec("a @ late", 0.5, 1.0, 1.0), ClaimSpec("b @ late", 0.8, 1.0, 1.0),
              ClaimSpec("c @ scratch", 0.7, 1.0, 1.0), ClaimSpec("e @ late", math.nan, 1.0, 1.0)]
    others = [ClaimSpec("d @ late", 0.3, 1.0, 1.0)]
    for budget in (200.0, 600.0, 1500.0, 1e6):
        plan = plan_design(claims, others, wall, budget)
        kept = set(plan.claims)
        assert plan.wall <= budget or not kept
        for t in kept:
            c = next(x for x in claims if x.test == t)
            assert plan.seeds[t] == seeds_to_decide(c, 0.05 / len(kept))
        assert plan.left["e @ late"] == "no prior paired SD to plan with"
        finite = [c for c in claims if math.isfinite(c.sd)]
        for size in range(len(kept) + 1, len(finite) + 1):  # no larger family fits
            for sub in itertools.combinations(finite, size):
                need = {c.test: seeds_to_decide(c, 0.05 / size) for c in sub}
                assert wall(need) > budget, (budget, [c.test for c in sub])
        for t, why in plan.left.items():
            if t != "e @ late":
                assert "seeds" in why and "min" in why and "beyond the budget" in why
    big = plan_design(claims, others, wall, 1e6)
    assert set(big.claims) == {"a @ late", "b @ late", "c @ scratch"} and "d @ late" in big.seeds


def test_the_scales_designs_are_what_the_rule_chooses_on_seeds_the_pilot_did_not_run():
    """quick and tiny: the pinned plans are ``choose_design``'s at their budgets with the
    planner's costs at this project's CPU; every scale's seeds are disjoint from the pilot's,
    whose spread planned them."""
    from sameloss.experiments.engine.hardware import REFERENCE_CPU_PEAK
    from sameloss.experiments.recipes.isoloss.allocation import _unplanned, choose_design, planned_costs

    full = _unplanned(isoloss.PRESETS["tiny"])
    costs = planned_costs(full, "cpu", REFERENCE_CPU_PEAK, 2)
    for plan, left, minutes in ((isoloss.QUICK_PLAN, isoloss.QUICK_LEFT, isoloss.QUICK_BUDGET_MINUTES),
                                (isoloss.TINY_PLAN, isoloss.TINY_LEFT, isoloss.TINY_BUDGET_MINUTES)):
        chosen = choose_design(full, costs, 60 * minutes, 2)
        assert tuple(chosen.seeds.items()) == plan and tuple(chosen.left.items()) == left
    for scale in ("quick", "tiny", "languages", "smoke"):
        p = isoloss.PRESETS[scale]
        assert not set(p.seeds) & set(isoloss.PILOT_SEEDS), scale
    with pytest.raises(ValueError, match="disjoint"):
        dataclasses.replace(isoloss.PRESETS["quick"], seeds=(0, 900))


def test_budget_chooses_again_and_is_isolosss(tmp_path, capsys):
    """``--budget`` re-plans quick's design by the same rule (its own folder); another recipe,
    or the languages scale, refuses it in one line."""
    p = isoloss.with_budget(isoloss.PRESETS["quick"], 12.0)
    assert p.seed_design.budget_minutes == 12.0 and p.seed_design.rebudgeted
    assert isoloss.folder_suffix(p) == "-budget12" and set(p.claims) <= set(isoloss.CLAIMS)
    assert dict(p.seed_design.plan) != dict(isoloss.QUICK_PLAN)
    assert main(["plan", "steps", "--scale", "smoke", "--budget", "10"]) == 2
    assert "--budget" in capsys.readouterr().err
    assert main(["plan", "isoloss", "--scale", "languages", "--budget", "10"]) == 2
    assert "keeps its pinned design" in capsys.readouterr().err
