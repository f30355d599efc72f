"""Pre-training algorithms at the same loss (paper Tables 1 and 2; App. A.5).

Command

    sameloss reproduce algorithms --scale tiny      [--out runs] [--seed N] [--fresh]

Runtime per scale

    smoke   ~10 s on a CPU (micro model, 24 steps; the numbers mean nothing)
    tiny    ~9 min on a 2-core CPU (PCFG micro language, the "tiny" transformer, 2500 steps
            per algorithm; the adversarial objective costs ~1.6 AdamW steps per step)
    small   ~70 min on one H100 (planner estimate, ``sameloss plan algorithms --scale small
            --hardware h100``: assumed GPU utilisation; paper PCFG, t4-384, batch 4096, 20k
            steps each)
    paper   ~54 h on one H100 (planner estimate, as small: t3-1024, the shape of the paper's
            235M model, 100k steps each; at batch 4096 a step needs ~138 GiB in float32:
            more than one H100 holds)

What it runs (PCFG; the paper's Table 1 is on the PCFG and BookCorpus)
    * AdamW — the standard recipe (dropout 0.1, weight decay 0.01);
    * adversarial — AdamW on L_MLM − λ·(validation loss of a closed-form downstream head),
      the paper's meta-learning adversary, aimed at one task (``adversarial.task``). The
      paper does not give λ; 0.05 keeps the tiny model's KL near AdamW's (0.099 vs 0.088
      after 1000 steps) while λ = 1 raises it ninefold — check the KL column at other
      scales;
    * −dropout−WD — AdamW without dropout and weight decay;
    * −dropout−WD+SAM — the same with SAM (ρ = 0.05, batch split in halves);
    * look-up table — no training: a probe on the true conditionals (its loss is the
      entropy, KL 0, and it has no parameters, hence no trace).
    Per model: exact loss, KL, trace of Hessian, probe accuracy on every task (± std over
    seeds).

Expected result (paper)
    At (almost) the same loss: AdamW probes better than the adversarial model (Table 1:
    89.9 vs 83.1 task A, 49.2 vs 42.3 task B) whose trace is about twice as large (Table 2:
    8.0 vs 19.3), and better than the look-up table (71.2 / 39.7); removing dropout and
    weight decay lowers accuracy and raises the trace, SAM recovers both (Table 2,
    BookCorpus).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..reports.claims import POINTS, difference_claim, fmt
from ..presets.common import (COMMON, LanguagePart, Preset, base_settings, languages_of, measured_columns,
    measured_runs, reference_run, run_name)
from ..engine.runspec import RunSpec
from ..engine.declare import Measure, Reference, run_unit, tags
from ..reports.plots import TRACE_FISHER, Panel, dots_plot, error_labels, majority_ref
from ..reports.document import Column, Section, Table

TITLE = "Pre-training algorithms at the same loss (Tables 1–2)"
SUMMARY = "AdamW, adversarial, -dropout-WD, +SAM, look-up table (Tables 1, 2)"


@dataclass(frozen=True)
class Adversarial:
    """The adversarial objective (``adversarial.*`` of the config) against one task."""

    weight: float
    task: str
    batch_size: int
    pool_size: int


@dataclass(frozen=True, kw_only=True)
class AlgorithmsPreset(Preset):
    adversarial: Adversarial
    sam_rho: float

    def __post_init__(self):
        super().__post_init__()
        for language in self.use:  # the figure shows the adversary's task
            if self.adversarial.task not in self.tasks[language]:
                raise ValueError(f"adversarial task {self.adversarial.task!r} is not probed on {language}")


PRESETS: dict[str, AlgorithmsPreset] = {
    scale: AlgorithmsPreset(**COMMON[scale].common(), use=("pcfg",), sam_rho=0.05,
                            adversarial=Adversarial(weight=0.05, task="B", batch_size=batch, pool_size=pool))
    for scale, batch, pool in (("smoke", 32, 256), ("tiny", 128, 10_000), ("small", 512, 100_000),
                               ("paper", 512, 100_000))
}


@dataclass(frozen=True)
class Comparison:
    """Two algorithms compared at the same loss: the paper expects ``b - a`` to have the
    sign ``accuracy_sign`` in probe accuracy and ``trace_sign`` in the trace of Hessian."""

    a: str  # group of the first model
    b: str
    a_name: str
    b_name: str
    accuracy_sign: int
    trace_sign: int
    accuracy_claim: str
    trace_claim: str


COMPARISONS = (
    Comparison("adamw", "adversarial", "AdamW", "adversarial", -1, +1,
               "AdamW transfers better than the adversarial algorithm at the same loss (Table 1: 89.9 vs 83.1 "
               "task A, 49.2 vs 42.3 task B; Table 2 task C 55.7 vs 50.2).",
               "the adversarial model is sharper than AdamW (Table 2: trace 19.34 vs 8.01)."),
    Comparison("adamw", "noreg", "AdamW", "−dropout−WD", -1, +1,
               "removing dropout and weight decay hurts downstream accuracy at the same loss (Tables 1–2, "
               "BookCorpus).",
               "removing dropout and weight decay raises the trace of Hessian (Table 2: 24.55 → 34.91)."),
    Comparison("noreg", "sam", "−dropout−WD", "−dropout−WD+SAM", +1, -1,
               "SAM recovers the downstream accuracy lost without dropout and weight decay (Tables 1–2).",
               "SAM lowers the trace of Hessian of the model without dropout and weight decay (Table 2: 34.91 → "
               "22.15)."),
)


def runs(p: AlgorithmsPreset, language: str, seed: int) -> list[RunSpec]:
    """AdamW (the reference run), adversarial, −dropout−WD and −dropout−WD+SAM, each
    measured at its last checkpoint."""
    ref = reference_run(p, language, seed)
    base = (*base_settings(p, language, seed), *p.reference.shape.settings(), ("steps", p.reference.steps))
    adv = p.adversarial
    noreg = (("model.dropout", 0.0), ("optim.weight_decay", 0.0))
    name = p.reference.label
    return [
        RunSpec(ref.name, ref.settings, "AdamW", "adamw"),
        RunSpec(run_name(language, name, "adversarial"),
                (*base, ("adversarial.weight", adv.weight), ("adversarial.task", adv.task),
                 ("adversarial.batch_size", adv.batch_size), ("adversarial.pool_size", adv.pool_size)),
                f"adversarial (λ={adv.weight:g}, task {adv.task})", "adversarial"),
        RunSpec(run_name(language, name, "noreg"), (*base, *noreg), "−dropout−WD", "noreg"),
        RunSpec(run_name(language, name, "noreg", "sam"), (*base, *noreg, ("sam.rho", p.sam_rho)),
                f"−dropout−WD+SAM (ρ={p.sam_rho:g})", "sam"),
    ]


def lookup(last: RunSpec, lang: LanguagePart) -> Measure:
    """The look-up table of the language (a probe per task on the true conditionals),
    measured after the ``last`` run (``role="lookup"``)."""
    return Measure(Reference("lookup-table", last.name), dataclasses.replace(lang.measure, lookup=lang.tasks),
                   tags=tags(experiment="algorithms", language=lang.name, role="lookup", of=last.name))


def units(setup, p: AlgorithmsPreset, languages: tuple[str, ...] | None = None) -> list:
    """One unit per run: trained, then its last checkpoint measured; the last one measures
    the look-up table too. Tagged with the recipe and the language: the report asks for them so."""
    out = []
    for lang in languages_of(p, setup.seed, languages):
        *specs, last = runs(p, lang.name, setup.seed)
        mine = dict(experiment="algorithms", language=lang.name)
        out += [run_unit(spec, lang.measure, **mine) for spec in specs]
        out.append(run_unit(last, lang.measure, lookup(last, lang), **mine))
    return out


def report(records, p: AlgorithmsPreset, languages: tuple[str, ...] | None = None) -> Section:
    section = Section(TITLE)
    section.text.append(
        "Each row is the last checkpoint of one algorithm (same model shape and steps), plus the look-up "
        "table (a probe on the true conditionals: loss = entropy, no trace).")
    for lang in languages_of(p, records.setup.seed, languages):
        rows: dict[str, dict] = {}  # group → row
        for run in measured_runs(records, "algorithms", language=lang.name):
            section.runs.append(run.info)
            (row,) = run.rows
            rows[run.tags["group"]] = dict(row, algorithm=run.tags["label"])
        ((_, table),) = records.tagged(experiment="algorithms", language=lang.name, role="lookup")
        rows["lookup"] = _lookup_row(table, lang)
        section.rows += list(rows.values())
        cols = [Column("parameters", "parameters", fmt="d")] + measured_columns(lang.tasks, with_step=False)
        section.tables.append(Table(f"{lang.title}: algorithms", cols, list(rows.values())))
        _figure(records, section, lang, list(rows.values()), p.adversarial.task)
        _claims(section, p, lang, rows)
    return section


def _lookup_row(measured: dict, lang: LanguagePart) -> dict:
    """The look-up table's row, its probes shown as ``probe_<task>`` (the column every
    model's probe is in)."""
    row = {"model": f"{lang.name}-lookup-table", "experiment": "algorithms", "language": lang.name,
           "group": "lookup", "label": "look-up table", "run": "", "algorithm": "look-up table"}
    for key, value in measured.items():
        row[f"probe_{key[len('lookup_'):]}" if key.startswith("lookup_") else key] = value
    return row


def _figure(records, section: Section, lang: LanguagePart, rows: list[dict], main: str) -> None:
    """A dot with its interval per algorithm and quantity (never a bar: the accuracies'
    zero is no baseline, and a zoomed axis then exaggerates nothing)."""
    panels = [Panel("kl", "exact KL to the true conditionals (nats)"), Panel("trace_fisher", TRACE_FISHER)]
    panels += [Panel(f"probe_{t}", f"probe accuracy, task {t}", refs=majority_ref(rows, t)) for t in lang.tasks]
    fig = dots_plot(rows, "algorithm", panels, f"{lang.title}: algorithms", errors=error_labels(lang.measure),
                    missing={"trace_fisher": "no parameters: no trace"})
    last = "abcdefghij"[1 + len(lang.tasks)]
    probes = "(c)" if last == "c" else f"(c–{last})"
    section.figures.append(records.figure(
        fig, f"algorithms-{lang.name}",
        shows=f"{lang.title}: the last checkpoint of each pre-training algorithm and the look-up table (a probe on "
              "the true conditionals): (a) the exact KL (log axis; the look-up table's is 0, named at the axis's "
              "start), (b) the trace of Hessian by the paper's estimator (the look-up table has none), "
              f"{probes} linear-probe accuracy per task (dotted: the majority class); the adversary aims at task "
              f"{main}",
        sample=f"{len(rows) - 1} models, one run each (seed {records.setup.seed}), and the look-up table; each probe "
               f"trained with {len(lang.measure.seeds)} seeds",
        claim="at (almost) the same loss AdamW transfers better than the adversarial objective and the look-up "
              "table, and is flatter than the adversarial model; without dropout and weight decay accuracy falls "
              "and the trace rises, SAM recovers both (Tables 1–2)"))


def _claims(section: Section, p: AlgorithmsPreset, lang: LanguagePart, rows: dict[str, dict]) -> None:
    tol = p.kl_tolerance
    n_seeds = len(p.measure.seeds)
    for c in COMPARISONS:
        a, b = rows[c.a], rows[c.b]
        if not (float(a["kl"]) <= tol and float(b["kl"]) <= tol):
            section.notes.append(
                f"{lang.title}: {c.a_name} (KL {fmt(float(a['kl']))}) and {c.b_name} (KL {fmt(float(b['kl']))}) are "
                f"not both within the KL tolerance {tol:g} nats; their comparison below is not at the same loss.")
        for task in lang.tasks:
            section.claims.append(difference_claim(c.accuracy_claim, f"{lang.title}, probe accuracy task {task}",
                                                   f"probe_{task}", (a, c.a_name), (b, c.b_name), c.accuracy_sign,
                                                   POINTS, n_seeds=n_seeds))
        section.claims.append(difference_claim(c.trace_claim, f"{lang.title}, trace of Hessian", "trace_fisher",
                                               (a, c.a_name), (b, c.b_name), c.trace_sign))
    for task in lang.tasks:
        section.claims.append(difference_claim(
            "AdamW transfers better than the look-up table that outputs the true conditionals (Table 1: "
            "89.9 vs 71.2 task A, 49.2 vs 39.7 task B).", f"{lang.title}, probe accuracy task {task}",
            f"probe_{task}", (rows["lookup"], "look-up table"), (rows["adamw"], "AdamW"), +1, POINTS,
            n_seeds=n_seeds))
