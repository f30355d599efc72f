"""Loss, flatness and downstream accuracy of every model (paper Fig. 1; §4).

Command

    sameloss reproduce figure1 --scale tiny         [--out runs] [--seed N] [--fresh]

Runtime per scale (it runs the PCFG parts of ``steps``, ``sizes`` and ``algorithms`` in one folder;
runs they share — the AdamW reference run — are trained once)

    smoke   ~10 s on a CPU (the whole pipeline; the numbers mean nothing)
    tiny    ~14 min on a 2-core CPU: measured 847 s (train 723 s, measure 121 s) with one
            torch thread on an otherwise idle machine; 7 pre-training runs of 2500 steps on
            the micro PCFG, 23 measured checkpoints
    small   ~3.3 h on one H100 (planner estimate, ``sameloss plan figure1 --scale small --hardware
            h100``: assumed GPU utilisation; 7 runs of 20k steps, ~30 checkpoints)
    paper   ~5.5 days on one H100 (planner estimate, as small: 10 runs of 100k steps; at
            batch 4096 the t3-1024 runs need more memory than one H100 holds)

What it computes
    All models of the three experiments on the PCFG — checkpoints past convergence (AdamW,
    SGD), sizes, algorithms (the look-up table has no trace and is left out) — in three
    panels: loss vs probe accuracy, trace of Hessian vs probe accuracy, loss vs trace
    (task B, as the paper's Fig. 1). Among the models whose KL to the true conditionals is
    within the scale's tolerance ("the same loss"), Kendall's tau and Spearman's rho of
    loss → accuracy and of trace → accuracy, each with a 95% bootstrap interval over
    models, and the paired-bootstrap difference |τ(trace, acc)| − |τ(loss, acc)|.

Expected result (paper)
    Near the optimal loss, the trace of Hessian ranks the models' downstream accuracy
    (strong negative correlation) while the loss does not (Fig. 1: losses 3.204–3.208,
    optimum 3.196).

Measured at tiny (seed 0)
    Not shown: among the 11 models with KL ≤ 0.15, τ(trace, accuracy B) = +0.09 [−0.51,
    0.67], τ(loss, accuracy B) = −0.35 [−0.84, 0.27]: the tolerance is loose and the models
    are independent runs. The powered test at matched KL (forks of one base run, paired over
    seeds, with minimum detectable effects) is ``sameloss reproduce isoloss``; see docs/results/tiny.md.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from ..reports.claims import fmt
from ..presets.common import COMMON, Preset, measure_spec, quantity_column
from ... import registry
from ..engine.runspec import RunSpec
from ..reports.plots import TRACE_FISHER, XY, Encoding, Ref, error_labels, majority_ref, scatter_plot
from ..reports.document import Claim, Column, Section, Table, merge_rows
from ..stats.inference import Interval, bootstrap_ci, kendall_tau, spearman_rho, verdict

TITLE = "Figure 1: loss, flatness and downstream accuracy"
SUMMARY = "all of the above together: loss/trace vs accuracy, rank correlations (Fig. 1)"
PARTS = ("steps", "sizes", "algorithms")  # the recipes whose models Figure 1 puts together


@dataclass(frozen=True, kw_only=True)
class Figure1Preset(Preset):
    task: str  # the probe task of the correlations (the paper's Fig. 1: task B)
    n_boot: int  # bootstrap resamples of the models
    steps: Preset  # the presets of the parts at this scale
    sizes: Preset
    algorithms: Preset

    def __post_init__(self):
        super().__post_init__()
        for language in self.use:
            if self.task not in self.tasks[language]:
                raise ValueError(f"figure-1 task {self.task!r} is not probed on {language}")

    def parts(self) -> list[tuple[object, Preset]]:
        """Each part's recipe (through the core's registry) and preset."""
        return [(registry.recipe(name), getattr(self, name)) for name in PARTS]


PRESETS: dict[str, Figure1Preset] = {
    scale: Figure1Preset(**COMMON[scale].common(), use=("pcfg",), task="B", n_boot=2000,
                         steps=registry.recipe("steps").PRESETS[scale],
                         # Figure 1 is the transformers': the LSTM family stays in `sizes`
                         sizes=dataclasses.replace(registry.recipe("sizes").PRESETS[scale], lstms=(), lstm_use=()),
                         algorithms=registry.recipe("algorithms").PRESETS[scale])
    for scale in COMMON
}


def runs(p: Figure1Preset, language: str, seed: int) -> list[RunSpec]:
    """The runs of ``steps``, ``sizes`` and ``algorithms`` (a run they share, once)."""
    out = {}
    for part, preset in p.parts():
        for spec in part.runs(preset, language, seed):
            out.setdefault(spec.name, spec)
    return list(out.values())


def units(setup, p: Figure1Preset, languages: tuple[str, ...] | None = None) -> list:
    """The units of ``steps``, ``sizes`` and ``algorithms`` (a run they share is one unit:
    ``declare.merge_units``, when the engine runs them)."""
    return [u for part, preset in p.parts() for u in part.units(setup, preset, languages or p.use)]


def _abs_diff(stat):
    def f(x1, y1, x2, y2):
        return abs(stat(x2, y2)) - abs(stat(x1, y1))
    return f


def correlation_rows(models: list[dict], task: str, n_boot: int, seed: int) -> list[dict]:
    acc = np.array([float(m[f"probe_{task}"]) for m in models])
    out = []
    for x_key, name in (("loss", "loss → accuracy"), ("trace_fisher", "trace → accuracy")):
        x = np.array([float(m[x_key]) for m in models])
        row = {"pair": name, "x": x_key, "y": f"probe_{task}", "n": len(models)}
        for stat_name, stat in (("kendall_tau", kendall_tau), ("spearman_rho", spearman_rho)):
            iv = bootstrap_ci(stat, x, acc, n_boot=n_boot, seed=seed)
            row[stat_name] = iv.estimate
            row[f"{stat_name}_low"] = iv.low
            row[f"{stat_name}_high"] = iv.high
        out.append(row)
    return out


def report(records, p: Figure1Preset, languages: tuple[str, ...] | None = None) -> list[Section]:
    use = languages or p.use
    parts = [part.report(records, preset, use) for part, preset in p.parts()]
    section = Section(TITLE)
    all_rows = merge_rows([r for s in parts for r in s.rows])
    for language in use:
        models = [r for r in all_rows if r["language"] == language and r.get("trace_fisher") is not None
                  and r.get(f"probe_{p.task}") is not None]
        same = [r for r in models if float(r["kl"]) <= p.kl_tolerance]
        _models_text_figure_table(records, section, p, language, models, same)
        if len(same) < 3:
            section.notes.append(f"{language}: fewer than 3 models within the tolerance; no correlations.")
            continue
        _correlations(section, p, language, same, records.setup.seed)
    return [*parts, section]


def _models_text_figure_table(records, section: Section, p: Figure1Preset, language: str,
                              models: list[dict], same: list[dict]) -> None:
    """Every model with a trace: how many are "the same loss", the scatter figure, and the
    table of those within the tolerance."""
    task, tol = p.task, p.kl_tolerance
    entropy = float(np.mean([float(r["entropy"]) for r in models])) if models else float("nan")
    section.text.append(
        f"{language}: {len(models)} models with a trace (every measured checkpoint of the runs above; the "
        f"look-up table has none). The optimum (entropy of the true conditionals) is {fmt(entropy, '.4f')} "
        f"nats; {len(same)} models have KL ≤ {tol:g} nats (loss within {tol:g} of the optimum) and are "
        f"\"the same loss\" for the correlations. Filled markers: within the tolerance; hollow: outside.")
    kl_label = f"exact KL (nats; loss = {fmt(entropy, '.4f')} + KL)"
    tolerance = Ref(tol, f"same-loss tolerance (KL = {tol:g} nats)", axis="x")
    accuracy = f"probe accuracy, task {task}"
    fig = scatter_plot(
        models, [XY("kl", kl_label, f"probe_{task}", accuracy, refs=(tolerance, *majority_ref(models, task))),
                 XY("trace_fisher", TRACE_FISHER, f"probe_{task}", accuracy, refs=majority_ref(models, task)),
                 XY("kl", kl_label, "trace_fisher", TRACE_FISHER, refs=(tolerance,))],
        f"{language}: every model",
        encoding=Encoding(colour_by="parameters", marker_by=_recipe_name, hollow=lambda r: float(r["kl"]) > tol,
                          hollow_label=f"KL > {tol:g} nats (not the same loss)",
                          join_by=lambda r: str(r.get("run") or r["model"])),
        errors=error_labels(_measure_spec(p, language, records.setup.seed)))
    runs = {r.get("run") for r in models}
    section.figures.append(records.figure(
        fig, f"figure1-{language}",
        shows=f"{language}, task {task}, every model with a trace (cf. the paper's Fig. 1, whose x axis is the "
              "loss): (a) probe accuracy against the exact KL to the true conditionals (log axis: loss = entropy "
              "+ KL, the optimum at KL → 0), (b) probe accuracy against the trace of Hessian by the paper's "
              "estimator, (c) the trace against the KL; colour = model size, marker = training recipe, a run's "
              "checkpoints joined in step order; hollow markers lie outside the same-loss tolerance (dashed)",
        sample=f"{len(models)} models from {len(runs)} runs (seed {records.setup.seed}), {len(same)} within the "
               f"tolerance; each probe trained with {len(p.measure.seeds)} seeds",
        claim="among models of almost the same loss, the trace of Hessian ranks downstream accuracy and the loss "
              "does not (Fig. 1; the rank correlations are in the table below)"))
    cols = [Column("parameters", "parameters", fmt="d"), Column("step", "step", fmt="d"),
            quantity_column("KL (nats)", "kl", fmt=".3g"), quantity_column("loss", "loss", fmt=".4f"),
            quantity_column("tr(H)", "trace_fisher", fmt=".4g"),
            quantity_column(f"probe {task} (%)", f"probe_{task}", scale=100, fmt=".1f")]
    section.tables.append(Table(f"{language}: the models within the KL tolerance ({len(same)} of "
                                f"{len(models)})", cols, sorted(same, key=lambda r: float(r["trace_fisher"]))))


def _correlations(section: Section, p: Figure1Preset, language: str, same: list[dict], seed: int) -> None:
    """Rank correlations of loss and of trace with accuracy (a table, correlations.csv) and
    the two claims of Fig. 1."""
    task, tol = p.task, p.kl_tolerance
    corr = correlation_rows(same, task, p.n_boot, seed)
    for c in corr:
        c["language"] = language
        c["pair"] = f"{language}: {c['pair']}"
    section.files.setdefault("correlations.csv", []).extend(corr)
    section.tables.append(Table(
        f"{language}: rank correlations with probe accuracy (task {task}) among the {len(same)} models with "
        f"KL ≤ {tol:g}, 95% bootstrap intervals ({p.n_boot} resamples of the models)",
        [Column("n", "n", fmt="d"),
         Column("Kendall τ", "kendall_tau", ci=("kendall_tau_low", "kendall_tau_high"), fmt=".3f"),
         Column("Spearman ρ", "spearman_rho", ci=("spearman_rho_low", "spearman_rho_high"), fmt=".3f")],
        corr, source="correlations.csv", key="pair", key_header="pair"))
    loss_c, trace_c = corr
    iv_trace = Interval(trace_c["kendall_tau"], trace_c["kendall_tau_low"], trace_c["kendall_tau_high"])
    iv_loss = Interval(loss_c["kendall_tau"], loss_c["kendall_tau_low"], loss_c["kendall_tau_high"])
    section.claims.append(Claim(
        "among models with the same near-optimal loss, a smaller trace of Hessian goes with higher "
        "downstream accuracy (Fig. 1 right, §4).",
        f"{language}, task {task}: Kendall τ(trace, accuracy) = {fmt(iv_trace.estimate)}, 95% bootstrap "
        f"interval [{fmt(iv_trace.low)}, {fmt(iv_trace.high)}] over {len(same)} models; Spearman ρ = "
        f"{fmt(trace_c['spearman_rho'])} [{fmt(trace_c['spearman_rho_low'])}, "
        f"{fmt(trace_c['spearman_rho_high'])}].", verdict(iv_trace, -1)))
    x_loss = np.array([float(r["loss"]) for r in same])
    x_trace = np.array([float(r["trace_fisher"]) for r in same])
    acc = np.array([float(r[f"probe_{task}"]) for r in same])
    diff = bootstrap_ci(_abs_diff(kendall_tau), x_loss, acc, x_trace, acc, n_boot=p.n_boot, seed=seed)
    section.claims.append(Claim(
        "the trace of Hessian correlates with downstream accuracy much better than the pre-training loss "
        "does, among models of almost the same loss (Fig. 1).",
        f"{language}, task {task}: |τ(trace, accuracy)| − |τ(loss, accuracy)| = {fmt(diff.estimate)}, 95% "
        f"paired-bootstrap interval [{fmt(diff.low)}, {fmt(diff.high)}] (τ(loss, accuracy) = "
        f"{fmt(iv_loss.estimate)} [{fmt(iv_loss.low)}, {fmt(iv_loss.high)}]).", verdict(diff, +1)))


# a model row's group (the first when runs are shared: "adamw+size") → its training recipe
RECIPES = {"adamw": "AdamW", "size": "AdamW", "sgd": "SGD", "adversarial": "adversarial", "noreg": "−dropout−WD",
           "sam": "−dropout−WD+SAM", "lstm": "AdamW (LSTM)"}


def _recipe_name(r: dict) -> str:
    """The marker of a model: its training recipe (its size is its colour, as in the paper)."""
    group = str(r.get("group") or "").split("+")[0]
    return RECIPES.get(group, group or "other")


def _measure_spec(p: Figure1Preset, language: str, seed: int):
    """The measures of the figure's models (their counts word the error bars)."""
    return measure_spec(p, p.tasks[language], seed)
