"""``top_eig``: the largest eigenvalue of the Hessian of the curvature batch's loss, by
thick-restart Lanczos in bounded memory (``lanczos_basis`` vectors)."""

from __future__ import annotations

from ..spec import MEASURES, TRACE, Job, Measure, MemoryContext
from ._hessian import curvature_batch, hessian_product_flops, planned_peak

LANCZOS_PRODUCTS = 100  # curvature.top_eigenvalue's default max_iter


class TopEigenvalue(Measure):
    name, order, stage, flag = "top_eig", 40, TRACE, "--top-eig"

    def wanted(self, spec):
        return spec.top_eig

    def settings(self, spec):
        return {k: getattr(spec, k) for k in ("lanczos_basis", "curvature_sentences", "micro_batch", "params", "seed")}

    def compute(self, job: Job) -> dict:
        from .. import curvature

        spec = job.spec
        fixed = curvature_batch(job, "top_eigenvalue", {"basis_size": spec.lanczos_basis})
        r = curvature.top_eigenvalue(job.model, job.language, fixed, basis_size=spec.lanczos_basis)
        return {"top_eigenvalue": r.estimate}

    def columns(self, spec):
        return ["top_eigenvalue"]

    def flops(self, spec, shape):
        return LANCZOS_PRODUCTS * hessian_product_flops(spec, shape)

    def peaks(self, spec, memory: MemoryContext):
        return planned_peak("top eigenvalue", "top_eigenvalue", spec, memory, {"basis_size": spec.lanczos_basis})


MEASURES.add("top_eig", TopEigenvalue())
