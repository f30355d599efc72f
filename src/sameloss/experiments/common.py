"""Settings shared by the recipes of one preset, and the runs they share.

Each recipe's ``PRESETS`` dict is ``{**COMMON[name], <its own keys>}``; the keys here:

``device``        where to train and measure (``auto``: CUDA when present).
``languages``     language name → preset of ``sameloss.languages`` (``micro`` saturates
                  on a CPU; ``paper`` has the paper's sizes).
``tasks``         language name → downstream tasks probed on every model.
``train``         config overrides of every run (batch, warm-up, evaluation, logging).
``reference``     the standard AdamW run (App. A.5) that ``steps``, ``sizes`` (its largest
                  model) and ``algorithms`` (its "AdamW" row) share when they run in one
                  experiment folder: model size overrides, steps and the checkpoints kept.
``measure``       ``measures.run.MeasureSpec`` fields: loss held-out sentences, Fisher
                  trace contexts × labels × repeats, task sizes, probe method, epochs, seeds.
``kl_tolerance``  models count as having "the same loss" when their exact KL to the true
                  conditionals (loss − entropy, nats/token) is at most this.

Presets
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

from ..measures.run import MeasureSpec
from . import PRESET_NAMES
from .core import RunSpec

# micro PCFG task A (2 classes) is ~98% for every model: it separates nothing, so tiny probes B and C
_TASKS_MICRO = {"pcfg": ("B", "C"), "hmm": ("task-3", "task-5")}
_TASKS_PAPER = {"pcfg": ("A", "B", "C"), "hmm": ("task-6", "task-10")}

COMMON: dict[str, dict] = {
    "smoke": dict(
        device="cpu",
        languages={"pcfg": "micro", "hmm": "micro"},
        tasks={"pcfg": ("B",), "hmm": ("task-5",)},
        train=["batch_size=32", "optim.warmup_steps=4", "eval.every=0", "eval.n_sentences=64",
               "log_every=10", "save_every=1000"],
        reference=dict(model=["model.size=micro"], label="micro", steps=24, checkpoints=(8, 12, 16, 20, 24)),
        measure=dict(loss_sentences=64, n_contexts=16, n_labels=2, repeats=2, task_train=96,
                     task_validation=32, task_test=64, probe_method="adamw", probe_epochs=2, seeds=(0, 1)),
        kl_tolerance=10.0,
    ),
    "tiny": dict(
        device="auto",
        languages={"pcfg": "micro", "hmm": "micro"},
        tasks=_TASKS_MICRO,
        train=["batch_size=256", "optim.warmup_steps=200", "eval.every=500", "eval.n_sentences=1000",
               "log_every=50", "save_every=500"],
        reference=dict(model=["model.size=tiny"], label="d64", steps=2500,
                       checkpoints=(1000, 1250, 1500, 1750, 2000, 2250, 2500)),
        measure=dict(loss_sentences=2000, n_contexts=1024, n_labels=4, repeats=4, task_train=2000,
                     task_validation=500, task_test=1000, probe_method="adamw", probe_epochs=30,
                     seeds=(0, 1, 2, 3, 4)),
        kl_tolerance=0.15,
    ),
    "small": dict(
        device="auto",
        languages={"pcfg": "paper", "hmm": "paper"},
        tasks=_TASKS_PAPER,
        train=["batch_size=4096", "optim.warmup_steps=1000", "eval.every=1000", "eval.n_sentences=20000",
               "log_every=100", "save_every=1000"],
        reference=dict(model=["model.size=t4-384"], label="t4-384", steps=20000,
                       checkpoints=(8000, 10000, 12000, 14000, 16000, 18000, 20000)),
        measure=dict(loss_sentences=100_000, n_contexts=10_000, n_labels=50, repeats=5, task_train=20_000,
                     task_validation=5_000, task_test=10_000, probe_method="adamw", probe_epochs=100,
                     seeds=(0, 1, 2, 3, 4)),
        kl_tolerance=0.02,
    ),
    "paper": dict(
        device="auto",
        languages={"pcfg": "paper", "hmm": "paper"},
        tasks=_TASKS_PAPER,
        train=["batch_size=4096", "optim.warmup_steps=1000", "eval.every=2000", "eval.n_sentences=20000",
               "log_every=100", "save_every=2000"],
        reference=dict(model=["model.size=t3-1024"], label="t3-1024 (235M in the paper)", steps=100_000,
                       checkpoints=(40_000, 50_000, 60_000, 70_000, 80_000, 90_000, 100_000)),
        measure=dict(loss_sentences=1_000_000, n_contexts=10_000, n_labels=50, repeats=5, task_train=60_000,
                     task_validation=10_000, task_test=30_000, probe_method="adamw", probe_epochs=100,
                     seeds=(0, 1, 2, 3, 4)),
        kl_tolerance=0.012,
    ),
}


__all__ = ["COMMON", "PRESET_NAMES", "base_overrides", "experiment_dir_name", "language_overrides",
           "measure_spec", "reference_run"]


def measure_spec(p: dict, tasks: tuple[str, ...], seed: int = 0) -> MeasureSpec:
    """The measures of every model: exact loss, the paper's Fisher trace, probes."""
    return MeasureSpec(loss=True, traces=("fisher",), probe=tuple(tasks), seed=seed, **p["measure"])


def language_overrides(p: dict, language: str) -> list[str]:
    return [f"language.name={language}", f"language.preset={p['languages'][language]}"]


def base_overrides(p: dict, language: str, seed: int) -> list[str]:
    return [*p["train"], *language_overrides(p, language), f"seed={seed}", f"device={p['device']}"]


def reference_run(p: dict, language: str, seed: int, measure_steps: tuple[int, ...] = ()) -> RunSpec:
    """The standard AdamW run of a preset (App. A.5), shared by the recipes."""
    ref = p["reference"]
    checkpoints = "checkpoints=[" + ",".join(str(s) for s in ref["checkpoints"]) + "]"
    name = f"{language}-{_slug(ref['label'])}-adamw"
    return RunSpec(name=name, overrides=(*base_overrides(p, language, seed), *ref["model"],
                                         f"steps={ref['steps']}", checkpoints),
                   label=f"AdamW {ref['label']}", group="adamw", measure_steps=measure_steps)


def _slug(label: str) -> str:
    return label.split(" ")[0].replace("/", "-")


def experiment_dir_name(experiment: str, preset: str, seed: int) -> str:
    return f"{experiment}-{preset}" + (f"-seed{seed}" if seed else "")
