"""Measures plug in (issue 37, item 2): a measure is one registered object, and the runner,
the planner and the resource check all find it there — a toy measure registered in this
test alone is measured, planned and checked with no other edit. The built-in measures
write the columns they declare, and a Hessian measure's default micro-batch fits the
device's memory limit."""

from __future__ import annotations

import pytest

from sameloss import resources
from sameloss.errors import UserError
from sameloss.experiments.engine import plan as planner
from sameloss.experiments.reports.plan import format_plan
from sameloss.measures.builtin._hessian import curvature_micro_batch
from sameloss.measures.curvature.memory import ALLOCATOR_SLACK, peak_bytes
from sameloss.measures.run import measure_model
from sameloss.measures.spec import MEASURES, TRACE, Job, Measure, MeasureSpec, measures_of
from sameloss.training.runio import load_checkpoint


class WeightNorm(Measure):
    """A throw-away measure: ``scale`` × the squared norm of the weights."""

    name, order, stage = "toy", 55, TRACE

    def check(self, job):
        if self.settings(job.spec)["scale"] > 100:
            raise UserError("toy: a scale over 100 needs more memory than there is")

    def compute(self, job):
        norm = sum(float(p.detach().pow(2).sum()) for p in job.model.parameters())
        return {"toy_norm": self.settings(job.spec)["scale"] * norm}

    def columns(self, spec):
        return ["toy_norm"]

    def flops(self, spec, shape):
        return self.settings(spec)["scale"] * shape.sentence_flops

    def peaks(self, spec, memory):
        return {"toy": 7 * memory.shape.n_params}


@pytest.fixture(scope="module")
def loaded(checkpoint):
    return load_checkpoint(checkpoint)


def test_a_measure_registered_in_a_test_is_measured_planned_and_checked(loaded):
    model, language, cfg, _ = loaded
    with MEASURES.added(WeightNorm()) as toy:
        spec = MeasureSpec(loss=True, loss_sentences=32, extra={"toy": {"scale": 2.0}})
        assert measures_of(spec) == [MEASURES["loss"], toy]
        # measured: its column in the row, after the loss (its order)
        row = measure_model(model, language, cfg, spec)
        norm = sum(float(p.detach().pow(2).sum()) for p in model.parameters())
        assert row["toy_norm"] == pytest.approx(2 * norm) and list(row).index("toy_norm") > list(row).index("kl")
        # planned: its FLOPs in its stage, its memory in the peaks, through the estimate itself
        shape = planner.model_shape(cfg, {})
        plan = planner.Plan("toy", "smoke", planner.Path("runs"))
        plan.measures.append(planner.PlannedMeasure(cfg.name, cfg, spec))
        e = planner.estimate(plan, "cpu", cpu_peak=1e9)
        loss_only = planner.measure_flops(MeasureSpec(loss=True, loss_sentences=32), shape)
        assert e.stages["trace"]["flops"] == 2 * shape.sentence_flops + loss_only["trace"]
        assert e.measures[0]["peaks"]["toy"] == 7 * shape.n_params and "exact KL" in e.measures[0]["peaks"]
        assert "toy" in format_plan(e)
        # checked: its refusal comes before any measure runs
        with pytest.raises(UserError, match="toy: a scale over 100"):
            measure_model(model, language, cfg, MeasureSpec(loss=True, extra={"toy": {"scale": 1e3}}))
    with pytest.raises(UserError, match="unknown measure 'toy'; choose from"):
        MeasureSpec(extra={"toy": {"scale": 2.0}})


def test_each_builtin_measure_writes_the_columns_it_declares(loaded):
    from sameloss.measures.fewshot import FewShot, View

    model, language, cfg, _ = loaded
    design = FewShot("task-5", (("all", View()),), sizes=(8,), subsets=(2,), pool=16, test=16,
                     endpoints=(("all", "lbfgs"),))
    spec = MeasureSpec(loss=True, traces=("fisher",), hessian_gap=True, top_eig=True, sharpness=True,
                       probe=("task-5",), lookup=("task-5",), fewshot=design, loss_sentences=16, n_contexts=4,
                       n_labels=2, repeats=2, n_probes=3, lanczos_basis=3, curvature_sentences=8, gap_batches=2,
                       task_train=16, task_validation=8, task_test=8, seeds=(0,), probe_epochs=1,
                       extra={"adaptive_trace": {}, "weight_norms": {}})
    cache: dict = {}
    for measure in measures_of(spec):
        job = Job(model, language, cfg, spec, cache, {"trace_fisher": 1.0, "trace_fisher_se": 0.1})
        got = measure.compute(job)
        assert set(got) == set(measure.columns(spec)), measure.name


def test_the_default_micro_batch_fits_the_device_limit(loaded, monkeypatch):
    model, language, cfg, _ = loaded
    spec = MeasureSpec(top_eig=True, curvature_sentences=32, lanczos_basis=3)
    settings = {"basis_size": 3}
    whole_batch, limited = {}, {}  # the caches of two calls: the choice is made once per call
    assert curvature_micro_batch(Job(model, language, cfg, spec, whole_batch, {}), "top_eigenvalue", settings) is None
    # a limit the whole batch (and half of it) does not fit, but a quarter of it does
    need = peak_bytes("top_eigenvalue", model.config, {**settings, "n_sentences": 32, "micro_batch": 8}).bytes
    monkeypatch.setenv(resources.LIMIT_ENV, str(int(ALLOCATOR_SLACK * need) + 1))
    assert curvature_micro_batch(Job(model, language, cfg, spec, limited, {}), "top_eigenvalue", settings) == 8
    # the planner sizes it to the planned device the same way, and says so
    shape = planner.model_shape(cfg, {})
    assert planner.measure_peaks(cfg, shape, spec, limit=int(ALLOCATOR_SLACK * need) + 1) == \
        {"top eigenvalue (micro-batch 8)": need}
    # an explicit micro-batch is kept
    given = MeasureSpec(top_eig=True, curvature_sentences=32, lanczos_basis=3, micro_batch=4)
    assert curvature_micro_batch(Job(model, language, cfg, given, {}, {}), "top_eigenvalue", settings) == 4
    # and the measure runs with the one it picked: the same eigenvalue, to rounding
    picked = measure_model(model, language, cfg, spec, cache=limited)["top_eigenvalue"]
    monkeypatch.delenv(resources.LIMIT_ENV)
    whole = measure_model(model, language, cfg, spec, cache=whole_batch)["top_eigenvalue"]
    assert picked == pytest.approx(whole, rel=1e-4)
