"""What the recipes share: the settings every recipe uses at one scale, the runs they share,
and the plumbing of a report (its languages, model rows, measured columns).

Settings are frozen dataclasses checked when they are built — at import, for the presets —
so a misspelt key or an unknown size fails before anything trains; ``key=value`` config
overrides are written only where a ``RunSpec`` becomes a ``PretrainConfig`` (``core``).

A *scale* (``smoke``, ``tiny``, ``small``, ``paper``) says how big an experiment is; a
recipe's *preset* is its settings at one scale, built from ``COMMON[scale]`` (the fields
of ``Common``) and its own fields:

``device``        where to train and measure (``auto``: CUDA when present).
``languages``     language name → size of ``sameloss.languages`` (``micro`` saturates
                  on a CPU; ``paper`` has the paper's sizes).
``tasks``         language name → downstream tasks probed on every model.
``training``      settings of every run (batch, warm-up, evaluation, logging).
``reference``     the standard AdamW run (App. A.5) that ``steps``, ``sizes`` (its largest
                  model) and ``algorithms`` (its "AdamW" row) share when they run in one
                  experiment folder: model shape, steps and the checkpoints kept.
``measure``       ``measures.run.MeasureSpec`` fields: loss held-out sentences, Fisher
                  trace contexts × labels × repeats, task sizes, probe method, epochs, seeds.
``kl_tolerance``  models count as having "the same loss" when their exact KL to the true
                  conditionals (loss − entropy, nats/token) is at most this.

Scales
    smoke: the whole pipeline in seconds (micro model, a few steps, tiny measures); the
        numbers mean nothing.
    tiny: a CPU in minutes: micro languages (12-word PCFG, 4-state HMM), models of
        ~6k–110k parameters, batch 256, measures of ~10³ contexts and 2k-example tasks.
    small: one GPU in about an hour per experiment: the paper's languages, Table 4
        shapes up to d_model 384, batch 4096, the paper's measure sizes.
    paper: the paper's settings (App. A, B): batch 4096, Table 3/4 sizes up to 235M
        parameters, 10⁴ contexts × 50 labels × 5 repeats, probes of 100 AdamW epochs
        on 0.1M examples, 5 seeds. Days on one GPU.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import NamedTuple

from ... import registry
from ...measures.run import MeasureSpec
from ...models.sizes import TRANSFORMER_SIZES
from ..engine.recipe import SCALE_NAMES
from ...measures.rows import error_column
from .causal import CausalScale
from ..engine.runspec import RunInfo, RunSpec, Setting
from ..reports.document import Column

def _check(ok: bool, what: str) -> None:
    if not ok:
        raise ValueError(what)


def _check_checkpoints(checkpoints: tuple[int, ...], steps: int, what: str) -> None:
    _check(list(checkpoints) == sorted(set(checkpoints)) and all(0 < c <= steps for c in checkpoints),
           f"{what}: checkpoints {checkpoints} must rise within 1..{steps}")


@dataclass(frozen=True)
class Training:
    """Settings of every run of a scale (besides the model and the steps)."""

    batch_size: int
    warmup_steps: int
    eval_every: int
    eval_sentences: int
    log_every: int
    save_every: int

    def settings(self) -> tuple[Setting, ...]:
        return (("batch_size", self.batch_size), ("optim.warmup_steps", self.warmup_steps),
                ("eval.every", self.eval_every), ("eval.n_sentences", self.eval_sentences),
                ("log_every", self.log_every), ("save_every", self.save_every))


@dataclass(frozen=True)
class Shape:
    """A transformer: a named size of ``models.sizes`` and optional changes to its shape."""

    size: str
    d_model: int | None = None
    n_heads: int | None = None
    n_layers: int | None = None
    d_inter: int | None = None

    def __post_init__(self):
        _check(self.size in TRANSFORMER_SIZES, f"unknown model size {self.size!r}")

    def settings(self) -> tuple[Setting, ...]:
        changes = (("d_model", self.d_model), ("n_heads", self.n_heads), ("n_layers", self.n_layers),
                   ("d_inter", self.d_inter))
        return (("model.size", self.size), *((f"model.{k}", v) for k, v in changes if v is not None))


@dataclass(frozen=True)
class ReferenceRun:
    """The standard AdamW run of a scale; ``label`` names the model (its first word goes
    into run names)."""

    shape: Shape
    label: str
    steps: int
    checkpoints: tuple[int, ...]

    def __post_init__(self):
        _check_checkpoints(self.checkpoints, self.steps, f"reference run {self.label}")

    @property
    def short_label(self) -> str:
        return self.label.split(" ")[0]


@dataclass(frozen=True)
class MeasureSettings:
    """The sizes of the measures (``MeasureSpec`` fields)."""

    loss_sentences: int
    n_contexts: int
    n_labels: int
    repeats: int
    task_train: int
    task_validation: int
    task_test: int
    probe_method: str
    probe_epochs: int
    seeds: tuple[int, ...]

    def __post_init__(self):
        _check(self.probe_method in ("adamw", "lbfgs"), f"unknown probe method {self.probe_method!r}")
        _check(len(self.seeds) > 0, "measure seeds must not be empty")


@dataclass(frozen=True, kw_only=True)
class Common:
    """The settings every recipe shares at one scale (see the module docstring)."""

    device: str
    languages: dict[str, str]
    tasks: dict[str, tuple[str, ...]]
    training: Training
    reference: ReferenceRun
    measure: MeasureSettings
    kl_tolerance: float

    def __post_init__(self):
        _check(self.device in ("auto", "cpu", "cuda"), f"unknown device {self.device!r}")
        for language, size in self.languages.items():
            known = registry.languages()
            _check(language in known and size in known[language].sizes, f"unknown {language} size {size!r}")
        _check(set(self.tasks) <= set(self.languages), "tasks of a language that is not in languages")
        _check(self.kl_tolerance > 0, "kl_tolerance must be positive")

    def common(self) -> dict:
        """The shared fields, to build a recipe's preset: ``StepsPreset(**COMMON[s].common(), ...)``."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(Common)}


@dataclass(frozen=True, kw_only=True)
class Preset(Common):
    """A recipe's settings at one scale: the shared ones and the languages it runs."""

    use: tuple[str, ...]
    # the causal language (``experiments.causal``), run after ``use`` when the recipe runs by itself
    causal: CausalScale | None = None

    def __post_init__(self):
        super().__post_init__()
        _check(set(self.use) <= set(self.tasks), f"languages {self.use} need tasks")


# micro PCFG task A (2 classes) is ~98% for every model: it separates nothing, so tiny probes B and C
_TASKS_MICRO = {"pcfg": ("B", "C"), "hmm": ("task-3", "task-5")}
_TASKS_PAPER = {"pcfg": ("A", "B", "C"), "hmm": ("task-6", "task-10")}
_MEASURE_PAPER_PROBES = dict(probe_method="adamw", probe_epochs=100, seeds=(0, 1, 2, 3, 4))

COMMON: dict[str, Common] = {
    "smoke": Common(
        device="cpu",
        languages={"pcfg": "micro", "hmm": "micro"},
        tasks={"pcfg": ("B",), "hmm": ("task-5",)},
        training=Training(batch_size=32, warmup_steps=4, eval_every=0, eval_sentences=64, log_every=10,
                          save_every=1000),
        reference=ReferenceRun(Shape("micro"), label="micro", steps=24, checkpoints=(8, 12, 16, 20, 24)),
        measure=MeasureSettings(loss_sentences=64, n_contexts=16, n_labels=2, repeats=2, task_train=96,
                                task_validation=32, task_test=64, probe_method="adamw", probe_epochs=2,
                                seeds=(0, 1)),
        kl_tolerance=10.0,
    ),
    "tiny": Common(
        device="auto",
        languages={"pcfg": "micro", "hmm": "micro"},
        tasks=_TASKS_MICRO,
        training=Training(batch_size=256, warmup_steps=200, eval_every=500, eval_sentences=1000, log_every=50,
                          save_every=500),
        reference=ReferenceRun(Shape("tiny"), label="d64", steps=2500,
                               checkpoints=(1000, 1250, 1500, 1750, 2000, 2250, 2500)),
        measure=MeasureSettings(loss_sentences=2000, n_contexts=1024, n_labels=4, repeats=4, task_train=2000,
                                task_validation=500, task_test=1000, probe_method="adamw", probe_epochs=30,
                                seeds=(0, 1, 2, 3, 4)),
        kl_tolerance=0.15,
    ),
    "small": Common(
        device="auto",
        languages={"pcfg": "paper", "hmm": "paper"},
        tasks=_TASKS_PAPER,
        training=Training(batch_size=4096, warmup_steps=1000, eval_every=1000, eval_sentences=20000,
                          log_every=100, save_every=1000),
        reference=ReferenceRun(Shape("t4-384"), label="t4-384", steps=20000,
                               checkpoints=(8000, 10000, 12000, 14000, 16000, 18000, 20000)),
        measure=MeasureSettings(loss_sentences=100_000, n_contexts=10_000, n_labels=50, repeats=5,
                                task_train=20_000, task_validation=5_000, task_test=10_000,
                                **_MEASURE_PAPER_PROBES),
        kl_tolerance=0.02,
    ),
    "paper": Common(
        device="auto",
        languages={"pcfg": "paper", "hmm": "paper"},
        tasks=_TASKS_PAPER,
        training=Training(batch_size=4096, warmup_steps=1000, eval_every=2000, eval_sentences=20000,
                          log_every=100, save_every=2000),
        reference=ReferenceRun(Shape("t3-1024"), label="t3-1024 (235M in the paper)", steps=100_000,
                               checkpoints=(40_000, 50_000, 60_000, 70_000, 80_000, 90_000, 100_000)),
        measure=MeasureSettings(loss_sentences=1_000_000, n_contexts=10_000, n_labels=50, repeats=5,
                                task_train=60_000, task_validation=10_000, task_test=30_000,
                                **_MEASURE_PAPER_PROBES),
        kl_tolerance=0.012,
    ),
}
assert tuple(COMMON) == SCALE_NAMES


# ---- runs --------------------------------------------------------------------------------
def run_name(language: str, label: str, *variant: str) -> str:
    """``<language>-<first word of the label>-<variant>…``, e.g. ``pcfg-micro-noreg-sam``."""
    return "-".join([language, label.split(" ")[0].replace("/", "-"), *variant])


def base_settings(p: Common, language: str, seed: int) -> tuple[Setting, ...]:
    """The settings of every run of a scale on one language."""
    if language == "causal":  # its generator, K and T, from the preset's causal scale (prepared)
        return (*p.training.settings(), *p.causal.settings(), ("seed", seed), ("device", p.device))
    return (*p.training.settings(), ("language.name", language), ("language.size", p.languages[language]),
            ("seed", seed), ("device", p.device))


def reference_run(p: Common, language: str, seed: int, measure_steps: tuple[int, ...] = ()) -> RunSpec:
    """The standard AdamW run of a scale (App. A.5), shared by the recipes."""
    ref = p.reference
    return RunSpec(run_name(language, ref.label, "adamw"),
                   (*base_settings(p, language, seed), *ref.shape.settings(), ("steps", ref.steps),
                    ("checkpoints", ref.checkpoints)),
                   label=f"AdamW {ref.label}", group="adamw", measure_steps=measure_steps)


# ---- measures and reports ----------------------------------------------------------------
@dataclass(frozen=True)
class LanguagePart:
    """One language of a report: its tasks, a title and the measures of every model."""

    name: str
    tasks: tuple[str, ...]
    title: str  # e.g. "pcfg (micro)"
    measure: MeasureSpec


def measure_spec(p: Common, tasks: tuple[str, ...], seed: int = 0) -> MeasureSpec:
    """The measures of every model: exact loss, the paper's Fisher trace, probes."""
    return MeasureSpec(loss=True, traces=("fisher",), probe=tuple(tasks), seed=seed,
                       **dataclasses.asdict(p.measure))


def languages_of(p: Preset, seed: int, only: tuple[str, ...] | None = None) -> list[LanguagePart]:
    """The languages a report covers (``only``, else the preset's), in order."""
    return [LanguagePart(name, tuple(p.tasks[name]), f"{name} ({p.languages[name]})",
                         measure_spec(p, p.tasks[name], seed)) for name in only or p.use]


def causal_part(setup, p: Preset, only: tuple[str, ...] | None = None) -> tuple[Preset, LanguagePart] | None:
    """The causal language of a recipe that runs by itself (``only`` is None) and has
    one: the preset with its prepared generator (``setup.data``: ``engine.Setup``, once per
    call), and its report part (probe tasks are GLUE-format folders, labelled by task name)."""
    if only is not None or p.causal is None:
        return None
    from .causal import prepare_causal

    c, tasks = setup.data("causal", prepare_causal, None, p.causal)
    spec = dataclasses.replace(measure_spec(p, (), setup.seed), probe=tuple(tasks.values()))
    return dataclasses.replace(p, causal=c), LanguagePart("causal", tuple(tasks), c.title, spec)


def language_parts(setup, p: Preset, only: tuple[str, ...] | None = None) -> list[tuple[Preset, LanguagePart]]:
    """The languages a recipe covers (``languages_of``), each with the preset to run it
    with, then the causal language of a recipe that runs by itself (``causal_part``:
    prepared once per call)."""
    parts = [(p, lang) for lang in languages_of(p, setup.seed, only)]
    causal = causal_part(setup, p, only)
    if causal:
        parts.append(causal)
    return parts


def model_row(row: dict, run: dict) -> dict:
    """A measured row with the fields every recipe adds, from its run's tags (``run``:
    ``MeasuredRun.tags``); ``model`` is the unique id."""
    out = {"model": f"{run['run']}@{row['step']}", "experiment": run["experiment"], "language": run["language"],
           "group": run["group"], "label": run["label"], "run": run["run"]}
    out.update({k: v for k, v in row.items() if k != "run"})
    return out


class MeasuredRun(NamedTuple):
    """A run of a recipe as the engine trained and measured it (``measured_runs``): its tags
    (``experiment``, ``language``, ``group``, ``label``, its name ``run`` and any other the
    recipe gave it: ``declare.measured_run``), its ``core.RunInfo`` and the rows measured
    on its checkpoints, in the order declared (``declare.measured``)."""

    tags: dict
    info: RunInfo
    measured: list[dict]

    @property
    def rows(self) -> list[dict]:
        """Its measured rows as model rows (``model_row``)."""
        return [model_row(row, self.tags) for row in self.measured]


def measured_runs(records, experiment: str, **where) -> list[MeasuredRun]:
    """The runs recipe ``experiment`` declared whose tags equal ``where`` (``language=``,
    ``group=``, ...), in the order trained, each with the rows of its checkpoints: a query of
    the engine's tables (``engine.Records.runs`` and ``tagged``), never the declaration
    again."""
    return [MeasuredRun(t, info, [row for _, row in records.tagged(experiment=experiment, run=t["run"])])
            for t, info in records.runs(experiment=experiment, **where)]


def quantity_column(header: str, key: str, **fmt) -> Column:
    """A table column showing a measured quantity ± its error (``claims.error_column``)."""
    return Column(header, key, error_column(key), **fmt)


def measured_columns(tasks: tuple[str, ...], with_step: bool = True) -> list[Column]:
    """Table columns of a measured row: loss, KL, trace, one probe per task."""
    cols = [Column("step", "step", fmt="d")] if with_step else []
    cols += [quantity_column("loss", "loss", fmt=".4f"), quantity_column("KL (nats)", "kl", fmt=".3g"),
             quantity_column("tr(H) (Fisher)", "trace_fisher", fmt=".4g")]
    cols += [quantity_column(f"probe {t} (%)", f"probe_{t}", scale=100, fmt=".1f") for t in tasks]
    return cols


__all__ = ["COMMON", "Common", "LanguagePart", "MeasureSettings", "MeasuredRun", "Preset", "ReferenceRun", "Shape",
           "Training", "base_settings", "causal_part", "language_parts", "languages_of", "measure_spec",
           "measured_columns", "measured_runs", "model_row", "quantity_column", "reference_run", "run_name"]
