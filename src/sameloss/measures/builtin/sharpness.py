"""``sharpness``: SAM's one-step sharpness ``L(θ + ρ g/‖g‖) − L(θ)`` on the curvature batch."""

from __future__ import annotations

from ..spec import MEASURES, TRACE, Job, Measure, MemoryContext, check_finite_positive


class Sharpness(Measure):
    name, order, stage, flag = "sharpness", 50, TRACE, "--sharpness"

    def wanted(self, spec):
        return spec.sharpness

    def settings(self, spec):
        return {k: getattr(spec, k) for k in ("rho", "curvature_sentences", "params", "seed")}

    def validate(self, spec):  # checked whether asked or not: a spec holds no impossible setting
        check_finite_positive(spec.rho, f"the SAM radius rho must be a finite number > 0, got {spec.rho}")

    def compute(self, job: Job) -> dict:
        from .. import curvature

        spec = job.spec
        r = curvature.sam_sharpness(job.model, job.language, rho=spec.rho, params=spec.params,
                                    n_sentences=spec.curvature_sentences, seed=spec.seed)
        return {"sam_sharpness": r.estimate}

    def columns(self, spec):
        return ["sam_sharpness"]

    def flops(self, spec, shape):
        return 2 * spec.curvature_sentences * 3 * shape.sentence_flops  # two forward and backward passes

    def peaks(self, spec, memory: MemoryContext):
        from ..curvature.memory import peak_bytes

        return {"sam sharpness": peak_bytes("sam_sharpness", memory.model_config,
                                            {"n_sentences": spec.curvature_sentences}).bytes}


MEASURES.add("sharpness", Sharpness())
