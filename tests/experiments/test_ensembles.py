"""The engine's ensembles (``reproduce --ensemble N``, ``experiments/ensembles.py``): units
walked in lockstep, their runs trained together; a recipe's results are the same numbers."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from sameloss.errors import UserError
from sameloss.experiments import Job, Options, reproduce
from sameloss.experiments.engine.declare import Checkpoint, Measure, Run, Unit
from sameloss.experiments.engine.dispatch import chunks, unit_outcomes
from sameloss.experiments.engine.ensembles import parse_ensemble
from sameloss.experiments.engine.launch import Outcome
from sameloss.experiments.engine.runspec import RunSpec
from sameloss.experiments.engine.walk import walk_units
from sameloss.measures.run import MeasureSpec

sys.path.insert(0, str(Path(__file__).parent))
from test_smoke_digests import results_digest  # noqa: E402


def test_the_flag():
    assert parse_ensemble("off") is None and parse_ensemble("8") == 8
    for bad in ("1", "0", "many"):
        with pytest.raises(ValueError, match="--ensemble"):
            parse_ensemble(bad)


def test_shares_and_their_outcomes():
    units = [Unit(f"u{i}", f"f{i}") for i in range(5)]
    shares = chunks(units, 2)
    assert [[u.name for u in s] for s in shares] == [["u0", "u2", "u4"], ["u1", "u3"]]
    assert chunks(units, 9) == [[u] for u in units] and chunks(units, 1) == [units]
    r0, r4 = object(), object()  # a unit's result, or its error's line
    outcomes = [Outcome([r0, "u2: refused", r4], None, {"pid": 1}), Outcome(None, "killed", {})]
    got = unit_outcomes(shares, outcomes)
    assert got["u0"].value is r0 and got["u2"].error == "u2: refused" and got["u4"].value is r4
    assert got["u1"].error == got["u3"].error == "killed"


class Actor:
    """Measures name their checkpoint; a run's info is its name."""

    def __init__(self, log: list):
        self.log = log

    def bar(self, items, record):
        return items

    def measure(self, m, record):
        self.log.append(f"measure {m.of.run}")
        return {"of": m.of.run}

    def gate(self, gate, rows):
        return True, ""


def _unit(name: str, runs: tuple[str, ...]) -> Unit:
    items = []
    for r in runs:  # two runs asked together, then their measures
        items.append(Run(RunSpec(r, ())))
    items += [Measure(Checkpoint(r), MeasureSpec(loss=True)) for r in runs]
    items.append(Run(RunSpec(f"{name}-late", ())))
    return Unit(name, name, tuple(items))


def test_units_walk_in_lockstep_and_a_failed_run_stops_only_its_unit():
    log: list = []
    units = [_unit("a", ("a1", "a2")), _unit("b", ("b1", "b2")), _unit("c", ("c1",))]
    actors = [Actor(log) for _ in units]
    batches = []

    def train(requests):
        names = [run.name for _, run, _ in requests]
        batches.append(names)
        return [(UserError(f"{n} diverged") if n == "b2" else n, 1.0, 2.0) for n in names]

    records = walk_units(units, actors, train)
    # every unit's first group together; then (after their measures) their late runs together
    assert batches == [["a1", "a2", "b1", "b2", "c1"], ["a-late", "c-late"]]
    assert log == ["measure a1", "measure a2", "measure c1"]
    assert isinstance(records[1], UserError) and "b2 diverged" in str(records[1])
    assert records[0].runs == {"a1": "a1", "a2": "a2", "a-late": "a-late"}
    assert records[0].rows and records[2].runs["c-late"] == "c-late"
    assert records[0].seconds >= 6.0  # its share of every training it was in


def _records(run: Path) -> list[dict]:
    timing = {"tokens_per_s", "steps_per_s"}
    return [{k: v for k, v in json.loads(line).items() if k not in timing}
            for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_a_recipe_with_ensembles_gives_the_same_results(tmp_path, capsys):
    from sameloss.experiments.engine.launch import LaunchOptions

    reproduce(Job("algorithms", "smoke", out=tmp_path / "one"), Options(progress=False))
    reproduce(Job("algorithms", "smoke", out=tmp_path / "ens"), Options(progress=False, ensemble=8))
    assert "ensemble of 2 runs (loop)" in capsys.readouterr().out
    # two local workers, each walking its share of the units together
    reproduce(Job("algorithms", "smoke", out=tmp_path / "local"),
              Options(progress=False, ensemble=8, launch=LaunchOptions("local", 2)))
    assert "units together: done" in capsys.readouterr().out
    one = tmp_path / "one" / "algorithms-smoke"
    runs = sorted(p.name for p in (one / "runs").iterdir())
    for other in ("ens", "local"):
        got = tmp_path / other / "algorithms-smoke"
        assert results_digest(got / "results.csv") == results_digest(one / "results.csv")
        assert runs == sorted(p.name for p in (got / "runs").iterdir())
        for run in runs:
            assert _records(got / "runs" / run) == _records(one / "runs" / run)


def test_the_planner_prices_an_ensemble_step_against_the_launch_floor():
    from sameloss.experiments.engine.hardware import DEVICES, ENSEMBLE_STEP_S, STEP_FLOOR_S, UTILISATION
    from sameloss.experiments.engine.plan import dry_plan, estimate
    from sameloss.experiments.reports.plan import format_plan

    plan = dry_plan("isoloss", "smoke", dropout_draws="keyed")
    assert plan.root.name == "isoloss-smoke-keyed" and all(r.config.dropout_draws == "keyed" for r in plan.runs)
    alone = estimate(plan, "h100", memory=False)
    together = estimate(plan, "h100", memory=False, ensemble=64)
    members = [r["members"] for r in together.runs]
    assert max(members) == 3 * 4  # a late fork of the base's recipe (adamw, short, long, noreg) of every seed
    rate = DEVICES["h100"]["bf16"] * UTILISATION["h100"]["training"]
    a, b = ENSEMBLE_STEP_S["h100"]  # the measured a + b × S of an S-member step; one model alone: its floor
    expected = sum(max(r["flops"] / rate, r["steps"] * (a / m + b if m > 1 else STEP_FLOOR_S["h100"]))
                   for r, m in zip(alone.runs, members))
    assert together.stages["training"]["seconds"] == pytest.approx(expected)
    # measured: 12 members step at 3.6 ms each against one model's 8.7 ms floor; smaller groups gain less
    assert together.stages["training"]["seconds"] < alone.stages["training"]["seconds"] / 1.2
    assert "ensembles (--ensemble 64)" in format_plan(together) and "launch floor" in format_plan(together)
    # on the CPU members train one by one: one model's cost each
    cpu = [estimate(plan, "cpu", cpu_peak=1e10, memory=False, ensemble=e).stages["training"]["seconds"]
           for e in (None, 64)]
    assert cpu[0] == cpu[1]
    # runs with the global RNG's dropout do not batch on a GPU
    assert max(r["members"] for r in estimate(dry_plan("isoloss", "smoke"), "h100", memory=False,
                                              ensemble=64).runs) < 12
