"""``fewshot``: the few-shot probes of a design (``measures.fewshot.FewShot``: one pool, the
same training subsets and test set for every model) on the model's final hidden states,
per view of the representation and method; ``measure_reference`` runs the same probes on
a reference representation (``measures.representations``)."""

from __future__ import annotations

from ..spec import MEASURES, PROBES, Job, Measure, MemoryContext
from .downstream import FEATURE_CHUNK


def fewshot_data(cache: dict, language, cfg, design):
    """The design's pool and test set (``tasks.make_task_data``), made once per call."""
    from ..tasks import make_task_data

    # keyed by the whole language config: two languages of one name (another size, seed or
    # params) share a cache in a study of several languages and must not share task data
    key = ("fewshot", cfg.language if cfg is not None else language.name, design)
    if key not in cache:
        cache[key] = make_task_data(language, design.task, n_train=design.pool, n_validation=0, n_test=design.test,
                                    seed=design.seed)
    return cache[key]


class FewShotProbes(Measure):
    name, order, stage = "fewshot", 90, PROBES

    def wanted(self, spec):
        return spec.fewshot is not None

    def settings(self, spec):
        return spec.fewshot

    def compute(self, job: Job) -> dict:
        from ..fewshot import fewshot_probes
        from ..representations import model_representation

        design = job.spec.fewshot
        data = fewshot_data(job.cache, job.language, job.cfg, design)
        return fewshot_probes(model_representation(job.model, data.train.tokens),
                              model_representation(job.model, data.test.tokens), data.train.labels,
                              data.test.labels, data.n_classes, design)

    def columns(self, spec):
        design, out = spec.fewshot, []
        for view, method in design.endpoints:
            for n in design.sizes:
                key = f"{view}_{method}_n{n}"
                out += [key, f"{key}_std", f"{key}_subsets"] + ([f"{key}_grad"] if method == "lbfgs" else [])
        return out

    def flops(self, spec, shape):
        return (spec.fewshot.pool + spec.fewshot.test) * shape.sentence_flops  # the features

    def peaks(self, spec, memory: MemoryContext):
        return {"probe features": memory.forward_bytes(FEATURE_CHUNK)}


MEASURES.add("fewshot", FewShotProbes())
