"""``trace``: the trace of the Hessian by each estimator of ``spec.traces`` — ``fisher``
(the paper's, App. B.1), ``hutchinson`` and ``hutchpp`` (on the loss of a fixed batch with
its true tokens) — optionally per block of parameters (``trace_by="block"``)."""

from __future__ import annotations

from dataclasses import replace

from ... import resources
from ..spec import MEASURES, TRACE, TRACES, Job, Measure, MemoryContext
from ._hessian import curvature_batch, hessian_product_flops, planned_peak


class Traces(Measure):
    name, order, stage, flag = "trace", 20, TRACE, "--trace"

    def wanted(self, spec):
        return bool(spec.traces)

    def settings(self, spec):
        return {k: getattr(spec, k) for k in ("traces", "trace_by", "n_contexts", "n_labels", "repeats", "n_probes",
                                               "curvature_sentences", "micro_batch", "params", "seed")}

    def validate(self, spec):
        from ...errors import UserError

        bad = [t for t in spec.traces if t not in TRACES]
        if bad:
            raise UserError(f"unknown trace estimator {bad[0]!r}; choose from {', '.join(TRACES)}")
        if spec.trace_by not in (None, "block"):
            raise UserError(f"--trace-by must be 'block', got {spec.trace_by!r}")
        if spec.trace_by and not (spec.traces or {"adaptive_trace", "weight_norms"} & set(spec.extra)):
            raise UserError("--trace-by block needs a --trace estimator (or --adaptive-trace, --weight-norms) to split")
        if "hutchpp" in spec.traces and spec.n_probes < 3:
            raise UserError(f"Hutch++ needs at least 3 products (--probes), got {spec.n_probes}")

    def check(self, job: Job) -> None:
        n = job.spec.n_contexts
        resources.check(resources.sentences_bytes(n, job.language), f"--contexts {n}", "lower --contexts")

    def compute(self, job: Job) -> dict:
        from .. import curvature

        spec, model, language = job.spec, job.model, job.language
        by_block = spec.trace_by == "block"
        row: dict = {}
        for name in spec.traces:
            if name == "fisher":
                contexts = curvature.FisherContexts(params=spec.params, n_contexts=spec.n_contexts, seed=spec.seed)
                r = curvature.trace_fisher(model, language, contexts, n_labels=spec.n_labels, repeats=spec.repeats,
                                           by_block=by_block)
            else:
                # one masked position per sentence, as the Fisher estimator's contexts: near
                # saturation the two then estimate the same trace
                fixed = curvature_batch(job, f"trace_{name}", {"n_probes": spec.n_probes, "by_block": by_block})
                r = curvature.trace_hutchinson(model, language, replace(fixed, mask_rate=None), n_probes=spec.n_probes,
                                               estimator=name, by_block=by_block)
            row[f"trace_{name}"] = r.estimate
            row[f"trace_{name}_se"] = r.stderr
            if "repeat_std" in r.extra:
                row[f"trace_{name}_repeat_std"] = r.extra["repeat_std"]
            for block, value in r.extra.get("blocks", {}).items():  # trace_fisher_layer0, ..._se
                row[f"trace_{name}_{block}"] = value["estimate"]
                row[f"trace_{name}_{block}_se"] = value["stderr"]
            row["n_params_measured"] = r.n_params
        return row

    def columns(self, spec):
        out = []
        for name in spec.traces:
            out += [f"trace_{name}", f"trace_{name}_se"] + ([f"trace_{name}_repeat_std"] if name == "fisher" else [])
        return out + ["n_params_measured"]

    def flops(self, spec, shape):
        total = 0.0
        for name in spec.traces:
            if name == "fisher":
                # a forward over the contexts and one backward per distinct label drawn: at
                # most n_labels, at most the vocabulary (the worst case; a trained model's
                # peaked conditionals repeat labels)
                contexts = spec.n_contexts * spec.repeats
                total += contexts * shape.sentence_flops * (1 + 2 * min(spec.n_labels, shape.vocab))
            else:
                total += spec.n_probes * hessian_product_flops(spec, shape)
        return total

    def peaks(self, spec, memory: MemoryContext):
        from ..curvature.memory import peak_bytes

        out = {}
        for name in spec.traces:
            if name == "fisher":
                out["trace fisher"] = peak_bytes("trace_fisher", memory.model_config, {"n_labels": spec.n_labels}).bytes
            else:
                out.update(planned_peak(f"trace {name}", f"trace_{name}", spec, memory, {"n_probes": spec.n_probes}))
        return out


MEASURES.add("trace", Traces())
