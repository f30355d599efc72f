"""``loss``: the exact held-out loss of a checkpoint — entropy + KL on a synthetic language
(the true conditionals), the held-out and training cross-entropy and their gap on a
corpus (``training.evaluate``)."""

from __future__ import annotations

from ... import resources
from ..spec import EVALUATION, MEASURES, Job, Measure, MeasureSpec, MemoryContext

COLUMNS = ("loss", "loss_std", "kl", "kl_std", "log_kl", "entropy", "n_tokens")
CORPUS_COLUMNS = ("train_loss", "train_loss_std", "gap", "kl_note")  # a corpus: no KL, and why
FORWARD_CHUNK = 1024  # sentences the evaluator runs through the model at a time


def evaluator(cache: dict, language, cfg, spec: MeasureSpec):
    """The held-out evaluator of ``cfg``'s language and masking (``loss_sentences``
    sentences), made once per call and language."""
    from ...training.evaluate import make_evaluator

    key = ("evaluator", cfg.language, cfg.masking, cfg.mask_rate)
    if key not in cache:
        rate = None if cfg.masking == "single" else cfg.mask_rate
        cache[key] = make_evaluator(language, spec.loss_sentences, rate, cfg.eval.seed, cfg.eval.n_subsets)
    return cache[key]


class Loss(Measure):
    name, order, stage, flag = "loss", 10, EVALUATION, "--loss"

    def wanted(self, spec):
        return spec.loss

    def settings(self, spec):
        return {"loss_sentences": spec.loss_sentences}

    def check(self, job: Job) -> None:
        cfg, spec = job.cfg, job.spec
        rate = None if cfg.masking == "single" else cfg.mask_rate
        resources.check(resources.evaluation_bytes(spec.loss_sentences, job.language, rate),
                        f"the held-out loss of {spec.loss_sentences} sentences", "lower the number of held-out sentences")

    def compute(self, job: Job) -> dict:
        result = evaluator(job.cache, job.language, job.cfg, job.spec).evaluate(job.model, job.spec.device)
        out = {k: result[k] for k in COLUMNS}
        if "gap" in result:
            out.update({k: result[k] for k in CORPUS_COLUMNS})
        return out

    def columns(self, spec):
        return list(COLUMNS)

    def flops(self, spec, shape):
        return spec.loss_sentences * shape.sentence_flops

    def peaks(self, spec, memory: MemoryContext):
        return {"exact KL": memory.forward_bytes(min(FORWARD_CHUNK, spec.loss_sentences))}


MEASURES.add("loss", Loss())
