"""``count_regression``: minimum-norm least-squares heads for a signed count on views of
the representation (Dyck's Theorem 5.1; ``measures.fewshot.count_regression``)."""

from __future__ import annotations

from ..spec import MEASURES, PROBES, Job, Measure, MemoryContext
from .downstream import FEATURE_CHUNK

# the draws of the count regression's training examples (apart from training, evaluation
# and the curvature measures' streams)
STREAM_COUNT_DRAWS = 21


class CountRegressionHeads(Measure):
    name, order, stage = "count_regression", 100, PROBES

    def wanted(self, spec):
        return spec.count_regression is not None

    def settings(self, spec):
        return spec.count_regression

    def compute(self, job: Job) -> dict:
        from ...training.data import step_generator
        from ..fewshot import count_regression
        from ..representations import model_representation
        from ..tasks import make_task_data

        d, seed = job.spec.count_regression, job.spec.seed
        data = make_task_data(job.language, d.task, d.pool, 0, d.n_test, seed=seed)
        generator = step_generator(seed, 0, stream=STREAM_COUNT_DRAWS)
        return count_regression(model_representation(job.model, data.train.tokens),
                                model_representation(job.model, data.test.tokens), data.train.labels,
                                data.test.labels, data.n_classes, d, generator)

    def columns(self, spec):
        d = spec.count_regression
        return [f"down_{what}_{view}_{n}{suffix}" for n in d.n_train for view, _ in d.views for what in ("mse", "acc")
                for suffix in ("", "_std", "_se")] + ["target_variance"]

    def flops(self, spec, shape):
        return (spec.count_regression.pool + spec.count_regression.n_test) * shape.sentence_flops

    def peaks(self, spec, memory: MemoryContext):
        return {"probe features": memory.forward_bytes(FEATURE_CHUNK)}


MEASURES.add("count_regression", CountRegressionHeads())
