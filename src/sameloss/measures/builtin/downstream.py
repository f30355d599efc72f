"""The downstream measures on a task's labelled sentences, one registered measure each:
``probe`` (a linear probe on the frozen model's features), ``finetune`` (the whole model
fine-tuned; a corpus model reads its CLS token) and ``lookup`` (the look-up-table
baseline: a probe on the true conditionals, App. A.5; it needs no checkpoint, so it is
computed once per language and repeated in every row). Each writes ``<kind>_<task>``,
its ``_std`` over seeds and the task's ``<task>_majority`` rate."""

from __future__ import annotations

from ... import resources
from ...errors import UserError
from ..spec import MEASURES, PROBES, Job, Measure, MeasureSpec, MemoryContext

PROBE_ITERATIONS = 500  # linear_probe's L-BFGS max_iter
FEATURE_CHUNK = 512  # sentences whose features are computed at a time


def task_data(cache: dict, language, cfg, task: str, spec: MeasureSpec):
    """A task's train / validation / test sentences (a GLUE task: its files), made once
    per call and language."""
    from ..glue import glue_task_data, is_glue
    from ..tasks import make_task_data

    key = ("task", cfg.language, task)
    if key not in cache and is_glue(task):
        cache[key] = glue_task_data(language, task, seed=spec.seed, n_train=spec.task_train,
                                    n_validation=spec.task_validation)
    elif key not in cache:
        cache[key] = make_task_data(language, task, spec.task_train, spec.task_validation, spec.task_test,
                                    seed=spec.seed)
    return cache[key]


def _settings(spec: MeasureSpec):
    """The probe settings a measure spec asks for (its method, seeds and AdamW epochs)."""
    from ..probe import ProbeSettings

    return ProbeSettings.of(spec.probe_method, seeds=spec.seeds, epochs=spec.probe_epochs)


def lookup_probe(cache: dict, language, cfg, task: str, spec: MeasureSpec):
    """The look-up table's probe of ``task`` (once per call and language)."""
    from ..lookup import lookup_table_probe

    if not getattr(language, "exact", True):
        raise UserError("the look-up table is not defined for a corpus (it needs the true conditionals)")
    key = ("lookup", cfg.language, task)
    if key not in cache:
        data = task_data(cache, language, cfg, task, spec)
        cache[key] = lookup_table_probe(language, data, _settings(spec), device=spec.device)
    return cache[key]


def downstream_columns(kind: str, task: str, result) -> dict:
    """A probe / fine-tune / look-up-table result as ``<kind>_<task>`` (the mean), its
    ``_std`` over seeds (``measures.rows``) and the task's majority rate."""
    from ..glue import glue_label

    name = glue_label(task)
    return {f"{kind}_{name}": result.mean, f"{kind}_{name}_std": result.std, f"{name}_majority": result.majority_rate}


def probe_flops(spec: MeasureSpec, shape) -> int:
    """One task's probe: every task sentence's features, then the linear heads' L-BFGS
    iterations on them (a head reads every position's features)."""
    examples = spec.task_train + spec.task_validation + spec.task_test
    head = shape.max_len * shape.d_model
    return examples * shape.sentence_flops + len(spec.seeds) * PROBE_ITERATIONS * 2 * 3 * spec.task_train * head


class Downstream(Measure):
    """What the three share: the tasks of ``spec.<field>``, their data, columns, FLOPs."""

    stage = PROBES
    field = ""
    bytes_per_feature = resources.PROBE_BYTES_PER_FEATURE

    def wanted(self, spec):
        return bool(getattr(spec, self.field))

    def tasks(self, spec) -> tuple[str, ...]:
        return getattr(spec, self.field)

    def settings(self, spec):
        return {k: getattr(spec, k) for k in (self.field, "task_train", "task_validation", "task_test", "probe_method",
                                               "probe_epochs", "finetune_epochs", "finetune_lr", "finetune_warmup",
                                               "seeds", "seed")}

    def width(self, job: Job) -> int:
        """The features per position the task data holds (a model's hidden state)."""
        model = job.model
        return getattr(model, "d_features", 0) or getattr(getattr(model, "config", None), "d_model", 0) or 0

    def check(self, job: Job) -> None:
        spec, language = job.spec, job.language
        if not [t for t in self.tasks(spec) if not t.startswith("glue:")]:
            return  # a GLUE task's size is its files'
        n = spec.task_train + spec.task_validation + spec.task_test
        width = self.width(job)
        resources.check(n * language.max_len * (resources.TASK_BYTES_PER_TOKEN + width * self.bytes_per_feature),
                        f"--task-size {spec.task_train} ({n} examples of {language.max_len} tokens per task, "
                        f"features of width {width})", "lower --task-size")

    def compute(self, job: Job) -> dict:
        row: dict = {}
        for task in self.tasks(job.spec):
            row.update(downstream_columns(self.name, task, self.result(job, task)))
        return row

    def result(self, job: Job, task: str):
        raise NotImplementedError

    def columns(self, spec):
        from ..glue import glue_label

        return [c for t in self.tasks(spec) for c in (f"{self.name}_{glue_label(t)}", f"{self.name}_{glue_label(t)}_std",
                                                        f"{glue_label(t)}_majority")]

    def examples(self, spec) -> int:
        return spec.task_train + spec.task_validation + spec.task_test

    def peaks(self, spec, memory: MemoryContext):
        return {"probe features": memory.forward_bytes(FEATURE_CHUNK)}


class Probe(Downstream):
    name, order, flag, field = "probe", 60, "--probe", "probe"

    def result(self, job: Job, task: str):
        from ..probe import linear_probe

        spec = job.spec
        data = task_data(job.cache, job.language, job.cfg, task, spec)
        return linear_probe(job.model, data, _settings(spec))

    def flops(self, spec, shape):
        return len(spec.probe) * probe_flops(spec, shape)


class Finetune(Downstream):
    name, order, flag, field = "finetune", 70, "--finetune", "finetune"
    bytes_per_feature = resources.FINETUNE_BYTES_PER_FEATURE

    def result(self, job: Job, task: str):
        from ..finetune import FinetuneSettings, finetune

        spec = job.spec
        # the paper's fine-tuning reads the CLS token of models pre-trained with one (a corpus)
        pooling = "cls" if getattr(job.language, "uses_cls", False) else "mean"
        data = task_data(job.cache, job.language, job.cfg, task, spec)
        settings = FinetuneSettings(pooling=pooling, epochs=spec.finetune_epochs, lr=spec.finetune_lr,
                                    warmup_steps=spec.finetune_warmup)
        return finetune(job.model, data, settings, seeds=spec.seeds)

    def flops(self, spec, shape):
        # the task sentences' features, then the epochs of training steps per seed
        per_task = (self.examples(spec) * shape.sentence_flops
                    + len(spec.seeds) * spec.finetune_epochs * spec.task_train * 3 * shape.sentence_flops)
        return len(spec.finetune) * per_task


class LookupTable(Downstream):
    name, order, flag, field = "lookup", 80, "--lookup-table", "lookup"

    def width(self, job: Job) -> int:
        return job.language.n_words  # the true conditionals: one feature per word and position

    def check(self, job: Job) -> None:
        if not getattr(job.language, "exact", True):
            raise UserError("the look-up table is not defined for a corpus (it needs the true conditionals)")
        super().check(job)

    def result(self, job: Job, task: str):
        return lookup_probe(job.cache, job.language, job.cfg, task, job.spec)

    def flops(self, spec, shape):
        return len(spec.lookup) * probe_flops(spec, shape)


for _measure in (Probe(), Finetune(), LookupTable()):
    MEASURES.add(_measure.name, _measure)
