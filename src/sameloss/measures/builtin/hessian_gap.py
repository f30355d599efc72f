"""``hessian_gap``: Lemma 3.2's ``tr H − tr F`` by Hutchinson over independent batches,
with the true tokens and with tokens drawn from the model (where it is 0 in
expectation); with the Fisher trace in the row also ``tr F + gap`` (a lower-variance
``tr H``), the relative gap and the gaps' t statistics."""

from __future__ import annotations

import math

from ..spec import MEASURES, TRACE, Job, Measure, MemoryContext
from ._hessian import hessian_product_flops

GAP_TRACES = ("trace_hessian", "trace_gap", "trace_hessian_model", "trace_gap_model")


class HessianGap(Measure):
    name, order, stage = "hessian_gap", 30, TRACE

    def wanted(self, spec):
        return spec.hessian_gap

    def settings(self, spec):
        return {k: getattr(spec, k) for k in ("gap_batches", "curvature_sentences", "n_probes", "params", "seed")}

    def compute(self, job: Job) -> dict:
        from .. import curvature

        spec = job.spec
        gap = curvature.trace_hessian_gap(job.model, job.language, n_batches=spec.gap_batches,
                                          n_sentences=spec.curvature_sentences, n_probes=spec.n_probes,
                                          params=spec.params, seed=spec.seed)
        row: dict = {}
        for name, r in gap.items():
            row[name] = r.estimate
            row[f"{name}_se"] = r.stderr
        if "trace_fisher" in job.row:  # the traces are measured first (``order``)
            fisher, fisher_se = job.row["trace_fisher"], job.row["trace_fisher_se"]
            row["trace_hessian_cv"] = fisher + row["trace_gap"]
            row["trace_hessian_cv_se"] = math.hypot(fisher_se, row["trace_gap_se"])
            row["relative_gap"] = row["trace_gap"] / fisher
        row["trace_abs_gap"] = abs(row["trace_gap"])
        row["trace_abs_gap_se"] = row["trace_gap_se"]
        row["z_gap"] = row["trace_gap"] / row["trace_gap_se"]
        row["z_gap_model"] = row["trace_gap_model"] / row["trace_gap_model_se"]
        return row

    def columns(self, spec):
        out = [c for name in GAP_TRACES for c in (name, f"{name}_se")]
        if "fisher" in spec.traces:
            out += ["trace_hessian_cv", "trace_hessian_cv_se", "relative_gap"]
        return out + ["trace_abs_gap", "trace_abs_gap_se", "z_gap", "z_gap_model"]

    def flops(self, spec, shape):
        # true and model-drawn tokens: twice the products of Hutchinson, batch after batch
        return 2 * spec.gap_batches * spec.n_probes * hessian_product_flops(spec, shape)

    def peaks(self, spec, memory: MemoryContext):
        from ..curvature.memory import peak_bytes

        return {"hessian gap": peak_bytes("trace_hutchinson", memory.model_config, {
            "n_sentences": spec.curvature_sentences, "n_probes": spec.n_probes}).bytes}


MEASURES.add("hessian_gap", HessianGap())
