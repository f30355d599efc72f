"""The engine's records as tidy tables: a tagged measure's row and a tagged run are found by their
tags (``engine.Records.rows`` / ``tagged`` / ``runs``), and the measured and cost tables carry them."""

from sameloss.errors import UserError
from sameloss.experiments.engine.declare import Checkpoint, CostPart, Embedded, Measure, Unit, tags
from sameloss.experiments.engine.walk import Records, Setup, UnitRecord, walk
from sameloss.measures.run import MeasureSpec


def _records(tmp_path):
    a = UnitRecord("seed 0", "seeds/seed0", seed=0, runs={"r0": "info-r0", "r0-fork": "info-fork"},
                   cpu={CostPart("", "base", "train+gate"): 2.0, CostPart("late", "sam", "train"): 3.0})
    a.measured = [(dict(tags(seed=0, role="gate", of="trained")), {"acc": 0.5, "seed": 99}),
                  (dict(tags(seed=0, role="probe", fork="sam", step=10)), {"acc": 0.7}),
                  (dict(tags(seed=0, role="probe", fork="sam", step=20)), {"acc": 0.8})]
    a.trained = [{**dict(tags(seed=0, role="base")), "run": "r0"}, {**dict(tags(seed=0, role="fork")), "run": "r0-fork"}]
    b = UnitRecord("seed 1", "seeds/seed1", seed=1, runs={"r1": "info-r1"})
    b.measured = [(dict(tags(seed=1, role="probe", fork="sam", step=10)), {"acc": 0.6})]
    b.trained = [{**dict(tags(seed=1, role="base")), "run": "r1"}]
    return Records(Setup(tmp_path, 7, print, workers=3), None, {"seed 0": a, "seed 1": b})


def test_rows_and_runs_are_found_by_their_tags(tmp_path):
    records = _records(tmp_path)
    assert [r["acc"] for r in records.rows(role="probe", fork="sam")] == [0.7, 0.8, 0.6]  # as walked
    assert [r["acc"] for r in records.rows(role="probe", step=10)] == [0.7, 0.6]
    assert records.rows(role="probe", fork="adamw") == [] and records.rows(missing_tag=1) == []
    (gate,) = records.rows(role="gate")
    assert gate["seed"] == 0 and gate["of"] == "trained"  # a tag wins over a value of its name
    ((t, values),) = records.tagged(role="gate")
    assert values == {"acc": 0.5, "seed": 99} and t == {"seed": 0, "role": "gate", "of": "trained"}
    assert [info for _, info in records.runs(role="base")] == ["info-r0", "info-r1"]
    assert [t["run"] for t, _ in records.runs(seed=0)] == ["r0", "r0-fork"]
    # what the units were declared with: its ``setup``, held, not forwarded member by member
    assert (records.setup.seed, records.setup.workers, records.setup.planning) == (7, 3, False)
    assert not any(hasattr(records, name) for name in ("seed", "root", "workers", "planning", "log", "data"))


def test_the_tidy_tables_carry_each_row_its_unit_and_tags(tmp_path):
    records = _records(tmp_path)
    measured = records.measured_rows()
    assert len(measured) == 4 and measured[0] == {"unit": "seed 0", "seed": 0, "role": "gate", "of": "trained",
                                                  "acc": 0.5}
    assert records.cost_rows() == [
        {"unit": "seed 0", "seed": 0, "point": "", "fork": "base", "stage": "train+gate", "cpu_seconds": 2.0},
        {"unit": "seed 0", "seed": 0, "point": "late", "fork": "sam", "stage": "train", "cpu_seconds": 3.0}]


def test_an_optional_measure_not_made_is_found_by_its_tags_with_why(tmp_path):
    class Actor:  # an embedded shape that cannot hold the model: the one thing it cannot make
        def bar(self, items, record):
            return items

        def measure(self, m, record):
            if isinstance(m.of, Embedded):
                raise UserError("micro cannot hold it")
            return {"loss": 1.0}

    spec = MeasureSpec(loss=True)
    unit = Unit("run r", "runs/r", (
        Measure(Checkpoint("r"), spec, tags=tags(run="r", step=None)),
        Measure(Embedded(Checkpoint("r"), "micro"), spec, optional=True, tags=tags(role="embedded", of="r"))))
    records = Records(Setup(tmp_path, 0, print), None, {"run r": walk(unit, Actor())})
    assert records.skipped(role="embedded", of="r") == [({"role": "embedded", "of": "r"}, "micro cannot hold it")]
    assert records.tagged(role="embedded") == [] and records.skipped(run="r") == []
    assert records.rows(run="r") == [{"loss": 1.0, "run": "r", "step": None}]


def test_a_runs_measures_are_tagged_with_their_step_and_the_last_checkpoints_with_none_of_its_own():
    # a tag wins over a value of its name (Records.rows): a "step" tag of None on the measure of
    # a run's last checkpoint would hide the step its row measured, in rows() and measured.csv
    from sameloss.experiments.engine.runspec import RunSpec
    from sameloss.experiments.engine.declare import measured

    mspec = MeasureSpec(loss=True)
    stepped = measured(RunSpec("r", (), measure_steps=(4, 8)), mspec, language="hmm")
    assert [dict(m.tags) for m in stepped] == [{"language": "hmm", "run": "r", "step": 4},
                                               {"language": "hmm", "run": "r", "step": 8}]
    (last,) = measured(RunSpec("r", ()), mspec, language="hmm")
    assert last.of == Checkpoint("r", None) and dict(last.tags) == {"language": "hmm", "run": "r"}
    record = UnitRecord("run r", "runs/r")
    record.measured = [(dict(last.tags), {"step": 12, "loss": 1.5})]
    records = Records(Setup(".", 0, print), None, {"run r": record})
    assert records.rows(run="r") == [{"step": 12, "loss": 1.5, "language": "hmm", "run": "r"}]
