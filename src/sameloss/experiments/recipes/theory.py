"""The paper's theory at work: Lemma 3.2 (Hessian → Fisher as KL → 0) and Theorem 3.3
(SGD noise lowers the trace at the minimum, at rate ∝ η/B).

Command

    sameloss reproduce theory --scale tiny          [--out runs] [--seed N] [--fresh]

Runtime per scale

    smoke   ~15 s on a CPU (micro model, 30 steps; the numbers mean nothing)
    tiny    ~20 min measured on a 2-core CPU shared with other jobs (load ≈ 9; training
            6 min, measuring 8 min, SGD continuations the rest); micro PCFG, the tiny
            transformer, 2500 AdamW steps with one masked position per sentence, 8
            checkpoints measured; three SGD continuations of 1000 steps
    small   ~5 min on one H100 (planner estimate, ``sameloss plan theory --scale small --hardware
            h100``: assumed GPU utilisation and 3 ms per step of kernel launches; paper PCFG,
            t4-128, 20k steps; continuations of 10k steps)
    paper   ~4.3 h on one H100 (planner estimate, as small: t4-384, 50k steps;
            continuations of 40k steps at batch 32 / 4096)

What it runs
    (a) Lemma 3.2. One AdamW pre-training run with one masked position per sentence
    (``masking=single``: the loss whose Hessian is measured), measured at checkpoints
    from early to past convergence. At each: the exact KL; the paper's Fisher trace
    (labels sampled from the model, App. B.1); the trace of the Hessian of the loss of
    the *true* tokens by Hutchinson; and the gap tr H − tr F directly, as Hutchinson's
    trace of ``Difference(LossHessian, LossGaussNewton)`` (the measure
    ``MeasureSpec(hessian_gap=True)``; the Gauss–Newton matrix of softmax
    cross-entropy is the Fisher, so this is the residual term Σ_y (f_y − 1[y = x_t]) ∇²z_y;
    the same probes on both cancel most of the probe noise). Standard errors are over
    independent batches (each its own sentences and probes). The well-specified case:
    the same with the targets drawn from the model's own conditionals — then the two
    are the same matrix in expectation and the gap must be zero within its SE at every
    checkpoint, whatever the KL.
    (b) Theorem 3.3. From the converged checkpoint, plain SGD (no momentum, dropout,
    weight decay or warm-up) on fresh sentences at small learning rates η and small
    batch B, and with the same steps at a much larger batch; at each kept step the exact
    KL and the Fisher trace, plotted against η·steps/B. Each continuation is an ordinary
    run forked from the converged checkpoint (``init_from``, ``init_step = "restart"``: its
    own steps 1..N and data stream, ``init_optimizer = false``: SGD needs no moments).

Expected result (paper)
    Lemma 3.2: at a minimum of the population loss the Hessian equals the Fisher, so tr H
    − tr F → 0 as KL → 0 (and it is 0 in expectation whenever the labels follow the
    model). Theorem 3.3: near the minimum, SGD with label / mini-batch noise decreases the
    trace of Hessian at a rate ∝ η/B while the loss stays at its minimum, so the trace
    curves of different (η, B) collapse against η·steps/B; a large batch (≈ gradient
    flow) leaves the trace nearly unchanged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ...measures.run import MeasureSpec
from ..reports.claims import difference_claim, fmt, trend_claim, zero_claim
from ..presets.common import COMMON, Preset, Shape, base_settings, measured_runs, run_name
from ..engine.runspec import RunSpec
from ..engine.declare import Checkpoint, Measure, Unit, measured_run, tags
from ..engine.layout import run_folder
from ..reports.plots import TRACE_FISHER, Panel, XAxis, error_labels, series_plot
from ..reports.document import Claim, Column, Section, Table
from ..stats.inference import AGREES, DISAGREES, Interval, combined_t_test, diff_interval, ols_slope, verdict

TITLE = "The theory at work: Lemma 3.2 and Theorem 3.3"
SUMMARY = "Lemma 3.2 (Hessian vs Fisher as KL -> 0) and Theorem 3.3 (SGD lowers the trace at rate eta/B)"
LEMMA_FILE = "lemma.csv"
SGD_FILE = "continuations.csv"
# the continuations' data stream: the seed of the run plus this (apart from the pre-training's)
CONTINUATION_SEED = 10_007
# the columns of a Lemma 3.2 row (the measure's, less the loss's entropy and token count)
LEMMA_COLUMNS = ("model", "experiment", "language", "group", "label", "run", "step", "kl", "kl_std", "loss",
                 "loss_std", "trace_fisher", "trace_fisher_se", "trace_hessian", "trace_hessian_se", "trace_gap",
                 "trace_gap_se", "trace_hessian_model", "trace_hessian_model_se", "trace_gap_model",
                 "trace_gap_model_se", "trace_hessian_cv", "trace_hessian_cv_se", "trace_abs_gap", "trace_abs_gap_se",
                 "relative_gap", "z_gap", "z_gap_model", "measure_seconds")


@dataclass(frozen=True)
class LemmaSettings:
    """The pre-training run of (a) and the sizes of its measures."""

    steps: int
    checkpoints: tuple[int, ...]
    kl_sentences: int  # held-out sentences of the exact KL (one mask each)
    fisher_contexts: int
    fisher_labels: int
    hessian_batches: int  # independent batches (the SE is over them)
    hessian_sentences: int  # sentences per batch, one masked position each
    hessian_probes: int  # Rademacher probes per batch

    def __post_init__(self):
        if list(self.checkpoints) != sorted(set(self.checkpoints)) or self.checkpoints[-1] != self.steps:
            raise ValueError("lemma checkpoints must rise and end at the last step")
        if self.hessian_batches < 2:
            raise ValueError("the Hessian's standard error needs at least 2 batches")


@dataclass(frozen=True)
class Continuation:
    """One plain-SGD continuation from the converged checkpoint."""

    lr: float
    batch_size: int

    @property
    def name(self) -> str:
        return f"sgd-lr{self.lr:g}-b{self.batch_size}"

    @property
    def label(self) -> str:
        return f"SGD η={self.lr:g}, B={self.batch_size}"


@dataclass(frozen=True)
class SGDSettings:
    steps: int
    checkpoints: tuple[int, ...]  # kept and measured (step 0 is the start)
    runs: tuple[Continuation, ...]  # the small-batch ones first, the large batch last
    fisher_contexts: int
    fisher_labels: int
    fisher_repeats: int
    loss_sentences: int

    def __post_init__(self):
        if list(self.checkpoints) != sorted(set(self.checkpoints)) or self.checkpoints[-1] != self.steps:
            raise ValueError("continuation checkpoints must rise and end at the last step")
        if len(self.runs) < 2:
            raise ValueError("Theorem 3.3 needs at least two continuations")


@dataclass(frozen=True, kw_only=True)
class TheoryPreset(Preset):
    shape: Shape
    lemma: LemmaSettings
    sgd: SGDSettings


def _preset(scale: str, shape: Shape, lemma: LemmaSettings, sgd: SGDSettings) -> TheoryPreset:
    return TheoryPreset(**COMMON[scale].common(), use=("pcfg",), shape=shape, lemma=lemma, sgd=sgd)


PRESETS: dict[str, TheoryPreset] = {
    "smoke": _preset("smoke", Shape("micro"),
                     LemmaSettings(steps=30, checkpoints=(10, 20, 30), kl_sentences=64, fisher_contexts=32,
                                   fisher_labels=2, hessian_batches=3, hessian_sentences=16, hessian_probes=4),
                     SGDSettings(steps=10, checkpoints=(5, 10), fisher_contexts=32, fisher_labels=2,
                                 fisher_repeats=1, loss_sentences=64,
                                 runs=(Continuation(0.05, 4), Continuation(0.1, 4), Continuation(0.1, 32)))),
    "tiny": _preset("tiny", Shape("tiny"),
                    LemmaSettings(steps=2500, checkpoints=(50, 100, 200, 400, 700, 1000, 1600, 2500),
                                  kl_sentences=2000, fisher_contexts=1024, fisher_labels=4, hessian_batches=8,
                                  hessian_sentences=128, hessian_probes=8),
                    SGDSettings(steps=1000, checkpoints=(200, 400, 600, 800, 1000), fisher_contexts=1024,
                                fisher_labels=4, fisher_repeats=2, loss_sentences=2000,
                                runs=(Continuation(0.05, 16), Continuation(0.2, 16), Continuation(0.2, 256)))),
    "small": _preset("small", Shape("t4-128"),
                     LemmaSettings(steps=20000, checkpoints=(250, 500, 1000, 2000, 4000, 8000, 14000, 20000),
                                   kl_sentences=20000, fisher_contexts=10000, fisher_labels=8, hessian_batches=8,
                                   hessian_sentences=512, hessian_probes=32),
                     SGDSettings(steps=10000, checkpoints=(2000, 4000, 6000, 8000, 10000), fisher_contexts=10000,
                                 fisher_labels=8, fisher_repeats=3, loss_sentences=20000,
                                 runs=(Continuation(0.02, 32), Continuation(0.05, 32), Continuation(0.1, 32),
                                       Continuation(0.05, 4096)))),
    "paper": _preset("paper", Shape("t4-384"),
                     LemmaSettings(steps=50000, checkpoints=(500, 1000, 2000, 5000, 10000, 20000, 35000, 50000),
                                   kl_sentences=100000, fisher_contexts=10000, fisher_labels=50, hessian_batches=10,
                                   hessian_sentences=1024, hessian_probes=50),
                     SGDSettings(steps=40000, checkpoints=(5000, 10000, 20000, 30000, 40000), fisher_contexts=10000,
                                 fisher_labels=50, fisher_repeats=5, loss_sentences=100000,
                                 runs=(Continuation(0.01, 32), Continuation(0.02, 32), Continuation(0.05, 32),
                                       Continuation(0.02, 4096)))),
}


def runs(p: TheoryPreset, language: str, seed: int) -> list[RunSpec]:
    """The Lemma 3.2 run, then the plain-SGD continuations forked from its last
    checkpoint (module docstring; ``chain``), each measured at its checkpoints."""
    s = p.lemma
    common = (*base_settings(p, language, seed), *p.shape.settings(), ("masking", "single"))
    out = [RunSpec(run_name(language, p.shape.size, "adamw", "single"),
                   (*common, ("steps", s.steps), ("checkpoints", s.checkpoints)),
                   label=f"AdamW {p.shape.size}, one mask per sentence", group="lemma", measure_steps=s.checkpoints)]
    g = p.sgd
    for c in g.runs:
        out.append(RunSpec(c.name, (
            *common, ("seed", CONTINUATION_SEED + seed), ("steps", g.steps), ("batch_size", c.batch_size),
            ("checkpoints", g.checkpoints), ("init_step", "restart"),
            ("init_optimizer", False), ("model.dropout", 0.0), ("optim.name", "sgd"), ("optim.lr", c.lr),
            ("optim.momentum", 0.0), ("optim.weight_decay", 0.0), ("optim.warmup_steps", 0)),
            label=c.label, group="sgd", measure_steps=g.checkpoints))
    return out


# ---- (a) Lemma 3.2 ------------------------------------------------------------------------
def _lemma_spec(p: TheoryPreset, seed: int) -> MeasureSpec:
    s = p.lemma
    return MeasureSpec(loss=True, traces=("fisher",), hessian_gap=True, loss_sentences=s.kl_sentences,
                       n_contexts=s.fisher_contexts, n_labels=s.fisher_labels, repeats=1, n_probes=s.hessian_probes,
                       curvature_sentences=s.hessian_sentences, gap_batches=s.hessian_batches, seed=seed)


def _sgd_spec(p: TheoryPreset, seed: int) -> MeasureSpec:
    s = p.sgd
    return MeasureSpec(loss=True, traces=("fisher",), loss_sentences=s.loss_sentences, n_contexts=s.fisher_contexts,
                       n_labels=s.fisher_labels, repeats=s.fisher_repeats, seed=seed)


def chain(p: TheoryPreset, lang: str, seed: int) -> tuple:
    """A language's items, in order: the Lemma 3.2 run, measured; its last checkpoint,
    measured as the SGD continuations' start (``role="start"``); each continuation forked
    from it (tagged with its η and B), measured. Every run and measure is tagged with the
    recipe and the language (groups ``lemma`` and ``sgd``): the report asks for them so."""
    lemma, *continuations = runs(p, lang, seed)
    mspec = _sgd_spec(p, seed)
    start = Checkpoint(lemma.name)
    mine = dict(experiment="theory", language=lang)
    return (*measured_run(lemma, _lemma_spec(p, seed), **mine),
            Measure(start, mspec, tags=tags(**mine, role="start", of=lemma.name)),
            *(item for c, spec in zip(p.sgd.runs, continuations)
              for item in measured_run(spec, mspec, start, **mine, lr=c.lr, batch_size=c.batch_size)))


def units(setup, p: TheoryPreset, languages: tuple[str, ...] | None = None) -> list:
    """One unit per language: its chain (the continuations start from the Lemma run)."""
    return [Unit(f"chain {lang}", run_folder(runs(p, lang, setup.seed)[0].name), chain(p, lang, setup.seed))
            for lang in languages or p.use]


def _lemma(records, section: Section, lang: str) -> list[dict]:
    (run,) = measured_runs(records, "theory", language=lang, group="lemma")
    section.runs.append(run.info)
    return [{k: row[k] for k in LEMMA_COLUMNS} for row in run.rows]


def _lemma_report(records, section: Section, p: TheoryPreset, lang: str, rows: list[dict]) -> None:
    cols = [Column("step", "step", fmt="d"), Column("KL (nats)", "kl", "kl_std", fmt=".3g"),
            Column("tr F (model labels)", "trace_fisher", "trace_fisher_se", fmt=".4g"),
            Column("tr H (Hutchinson, true tokens)", "trace_hessian", "trace_hessian_se", fmt=".4g"),
            Column("gap tr H − tr F", "trace_gap", "trace_gap_se", fmt=".3g"),
            Column("tr F + gap", "trace_hessian_cv", "trace_hessian_cv_se", fmt=".4g"),
            Column("gap / tr F", "relative_gap", fmt=".3g"),
            Column("gap, model-sampled labels", "trace_gap_model", "trace_gap_model_se", fmt=".3g"),
            Column("t (model labels)", "z_gap_model", fmt=".2f")]
    section.tables.append(Table(f"{lang}: Lemma 3.2 along one run (± standard errors; KL ± std over 5 subsets)",
                                cols, rows, source=LEMMA_FILE))
    section.files[LEMMA_FILE] = rows

    def positive(key):  # log axes: a noisy estimate below 0 is not drawn
        return [dict(r, trace=r[key] if r[key] > 0 else float("nan"), trace_se=r[f"{key}_se"]) for r in rows]

    s = p.lemma
    dropped = sum(1 for r in rows for k in ("trace_hessian", "trace_hessian_cv", "trace_fisher", "trace_abs_gap")
                  if not r[k] > 0) + sum(1 for r in rows if not r["trace_gap_model"])
    fig = series_plot({"tr H (Hutchinson, true tokens)": positive("trace_hessian"),
                       "tr F + gap (true tokens)": positive("trace_hessian_cv"),
                       "tr F (Fisher estimator: model-sampled labels)": positive("trace_fisher"),
                       "|gap| = |tr H − tr F|, true tokens": positive("trace_abs_gap"),
                       "|gap|, model-sampled labels": [
                           dict(r, trace=abs(r["trace_gap_model"]) or float("nan"), trace_se=r["trace_gap_model_se"])
                           for r in rows]},
                      "kl", [Panel("trace", "trace", log=True)], f"{lang}: Lemma 3.2 — Hessian vs Fisher against KL",
                      x_axis=XAxis("exact KL to the true conditionals (nats)", log=True),
                      errors={"trace": f"± SE (tr F: over its {s.fisher_contexts} contexts; tr H and the gaps: over "
                                       f"{s.hessian_batches} independent batches)"})
    section.figures.append(records.figure(
        fig, f"theory-lemma-{lang}",
        shows=f"{lang}: the trace of the Hessian of the loss of the true tokens (Hutchinson, and tr F + gap), of "
              "the Fisher (the paper's estimator, labels sampled from the model) and the absolute gap between them "
              "(with the true tokens, and in the well-specified case of model-sampled labels) at each checkpoint, "
              "against the exact KL; both axes logarithmic"
              + (f"; {dropped} estimates at or below 0 cannot be drawn on the log axis" if dropped else ""),
        sample=f"{len(rows)} checkpoints of one AdamW run (seed {records.setup.seed})",
        claim="Lemma 3.2: the Hessian approaches the Fisher as KL → 0, so |tr H − tr F| shrinks with the KL; with "
              "model-sampled labels the gap is 0 in expectation"))
    kls = [float(r["kl"]) for r in rows]
    claim, _ = trend_claim("Lemma 3.2: the Hessian approaches the Fisher as the model approaches the true "
                           "conditionals, so |tr H − tr F| shrinks as KL → 0 (τ(KL, |gap|) > 0).",
                           f"{lang}, |gap| against KL over {len(rows)} checkpoints", kls,
                           [float(r["trace_abs_gap"]) for r in rows], +1, seed=records.setup.seed)
    section.claims.append(claim)
    first, last = max(rows, key=lambda r: r["kl"]), min(rows, key=lambda r: r["kl"])
    section.claims.append(difference_claim(
        "Lemma 3.2: the gap shrinks between the least and the most converged checkpoint.",
        f"{lang}, |tr H − tr F|", "trace_abs_gap", (first, f"step {first['step']}"), (last, f"step {last['step']}"),
        -1))
    section.claims.append(zero_claim(
        "Lemma 3.2 at the most converged checkpoint: tr H − tr F ≈ 0.",
        f"{lang}, gap at step {last['step']} (KL {fmt(last['kl'])} nats, tr F {fmt(last['trace_fisher'])})",
        last["trace_gap"], last["trace_gap_se"]))
    section.claims.append(_wellspecified_claim(lang, rows, p.lemma.hessian_batches))
    section.notes.append(f"{lang}: a batch's Hutchinson value of the gap is heavy-tailed (a few contexts with "
                         "large curvature dominate it), so a standard error from "
                         f"{p.lemma.hessian_batches} batches is itself noisy; the t tests and their combination "
                         "in the well-specified claim inherit that.")


def _wellspecified_claim(lang: str, rows: list[dict], n_batches: int) -> Claim:
    """Every checkpoint's gap with model-sampled labels against 0: a two-sided t test per
    checkpoint (its SE is over ``n_batches`` batches: n − 1 degrees of freedom), the count
    that pass at 5%, and Fisher's combination of their p values."""
    pvalues, pooled = combined_t_test([float(r["z_gap_model"]) for r in rows], n_batches - 1)
    inside = sum(pv > 0.05 for pv in pvalues)
    measured = (f"{lang}, gap with labels drawn from the model, at {len(rows)} checkpoints: {inside} of {len(rows)} "
                f"consistent with 0 (t test on {n_batches} batches, p > 0.05); Fisher's combined test p = "
                f"{fmt(pooled, '.2g')}.")
    return Claim("well-specified case (data from the model itself): Hessian and Fisher estimate the same matrix, "
                 "so they agree within SE at every KL [an equality: \"agrees\" = combined p > 0.05]", measured,
                 AGREES if pooled > 0.05 else DISAGREES)


# ---- (b) Theorem 3.3 ----------------------------------------------------------------------
def _sgd_continuations(records, section: Section, p: TheoryPreset, lang: str) -> dict[str, list[dict]]:
    """The plain-SGD continuations from the converged checkpoint: their rows (table and file) and
    figure in ``section``; returns each continuation's rows by label, its start first."""
    s = p.sgd
    mspec = _sgd_spec(p, records.setup.seed)
    ((_, start_row),) = records.tagged(experiment="theory", language=lang, role="start")
    series: dict[str, list[dict]] = {}
    rows = []
    for run in measured_runs(records, "theory", language=lang, group="sgd"):
        t = run.tags
        section.runs.append(run.info)
        pts = [dict(start_row, model=f"{t['run']}@0", experiment="theory", language=lang, group=t["group"],
                    label=t["label"], run=t["run"], step=0)] + run.rows
        for r in pts:
            r.update(lr=t["lr"], batch_size=t["batch_size"], x=t["lr"] * r["step"] / t["batch_size"])
        series[t["label"]] = pts
        rows += pts
    section.files[SGD_FILE] = rows
    section.tables.append(Table(f"{lang}: plain-SGD continuations from step {start_row['step']}",
                                [Column("η", "lr", fmt="g"), Column("B", "batch_size", fmt="d"),
                                 Column("step", "step", fmt="d"), Column("η·steps/B", "x", fmt=".3g"),
                                 Column("KL (nats)", "kl", "kl_std", fmt=".3g"),
                                 Column("tr F", "trace_fisher", "trace_fisher_se", fmt=".4g")],
                                rows, source=SGD_FILE))
    fig = series_plot(series, "x", [Panel("trace_fisher", TRACE_FISHER),
                                    Panel("kl", "exact KL to the true conditionals (nats)")],
                      f"{lang}: SGD from the converged model, against η·steps/B", x_axis=XAxis("η·steps/B"),
                      errors=error_labels(mspec))
    section.figures.append(records.figure(
        fig, f"theory-sgd-{lang}",
        shows=f"{lang}: (a) the trace of Hessian by the paper's estimator and (b) the exact KL (log axis) of each "
              f"plain-SGD continuation from the converged checkpoint (step {start_row['step']}), against η·steps/B "
              "(step 0: the start, shared)",
        sample=f"{len(s.runs)} continuations of {s.steps} steps, {len(s.checkpoints)} kept steps each (seed "
               f"{records.setup.seed})",
        claim="Theorem 3.3: near the minimum SGD lowers the trace at a rate ∝ η/B while the KL stays, so the trace "
              "curves fall and collapse against η·steps/B"))
    return series


def _slope_rows(p: TheoryPreset, series: dict[str, list[dict]]) -> list[dict]:
    """Per continuation, the least-squares slope of the trace against η·steps/B and its change."""
    slope_rows = []
    for c in p.sgd.runs:
        pts = series[c.label]
        iv = ols_slope([r["x"] for r in pts], [float(r["trace_fisher"]) for r in pts])
        kl0, kl1 = pts[0], pts[-1]
        slope_rows.append({"run": c.label, "lr": c.lr, "batch_size": c.batch_size, "trace_slope": iv.estimate,
                           "trace_slope_low": iv.low, "trace_slope_high": iv.high,
                           "trace_slope_se": (iv.high - iv.low) / (2 * 1.959963984540054) if math.isfinite(iv.high)
                           else float("nan"),
                           "trace_change": float(kl1["trace_fisher"]) - float(kl0["trace_fisher"]),
                           "trace_change_se": math.hypot(float(kl1["trace_fisher_se"]),
                                                         float(kl0["trace_fisher_se"])),
                           "kl_start": kl0["kl"], "kl_end": kl1["kl"], "x_end": kl1["x"]})
    return slope_rows


def _theorem_claims(section: Section, p: TheoryPreset, lang: str, slope_rows: list[dict]) -> None:
    """Theorem 3.3's claims from the slopes (each negative, equal, and the large batch's smaller change), with
    a note per continuation on whether it stayed at the minimum."""
    small = slope_rows[:-1]
    large = slope_rows[-1]
    for r in small:
        iv = Interval(r["trace_slope"], r["trace_slope_low"], r["trace_slope_high"])
        section.claims.append(Claim("Theorem 3.3: SGD noise lowers the trace at the minimum (slope < 0).",
                                    f"{lang}, {r['run']}: slope {fmt(iv.estimate)} per unit η·steps/B, 95% interval "
                                    f"[{fmt(iv.low)}, {fmt(iv.high)}].", verdict(iv, -1)))
    base = slope_rows[0]
    for other in slope_rows[1:]:
        iv = diff_interval(base["trace_slope"], base["trace_slope_se"], other["trace_slope"], other["trace_slope_se"])
        same = iv.low <= 0 <= iv.high
        section.claims.append(Claim(
            "Theorem 3.3: the rate is ∝ η/B, so the trace curves collapse against η·steps/B (equal slopes) "
            "[an equality: \"agrees\" = the interval of the difference contains 0; a wide interval cannot tell]",
            f"{lang}, slope of {other['run']} − slope of {base['run']} = {fmt(iv.estimate)}, 95% interval "
            f"[{fmt(iv.low)}, {fmt(iv.high)}] (slopes {fmt(other['trace_slope'])} and {fmt(base['trace_slope'])}).",
            AGREES if same else DISAGREES))
    ref = small[-1]
    section.claims.append(difference_claim(
        "Theorem 3.3: with the same steps, a much larger batch (≈ gradient flow) lowers the trace less than a small "
        "batch at the same η.", f"{lang}, trace change over {p.sgd.steps} steps", "trace_change",
        (large, large["run"]), (ref, ref["run"]), -1))
    for r in slope_rows:
        left = float(r["kl_end"]) - float(r["kl_start"]) > p.kl_tolerance
        section.notes.append(f"{lang}, {r['run']}: KL {fmt(r['kl_start'])} → {fmt(r['kl_end'])} nats over the "
                             "continuation" + (f" — it left the minimum (KL rose by more than the scale's tolerance "
                                               f"{p.kl_tolerance:g} nats), so the theorem's assumption fails for this "
                                               "run and its slope is not the theorem's rate." if left else
                                               " (the theorem assumes the loss stays at its minimum)."))


def _theorem(records, section: Section, p: TheoryPreset, lang: str) -> None:
    series = _sgd_continuations(records, section, p, lang)
    slope_rows = _slope_rows(p, series)
    section.files["slopes.csv"] = slope_rows
    section.tables.append(Table(f"{lang}: slope of the trace against η·steps/B (least squares over the kept steps, "
                                "95% t interval from the residuals)",
                                [Column("d tr / d(η·steps/B)", "trace_slope", ci=("trace_slope_low", "trace_slope_high"),
                                        fmt=".3g"),
                                 Column("η·steps/B at the end", "x_end", fmt=".3g"),
                                 Column("trace change", "trace_change", "trace_change_se", fmt=".3g"),
                                 Column("KL start", "kl_start", fmt=".3g"), Column("KL end", "kl_end", fmt=".3g")],
                                slope_rows, source="slopes.csv", key="run", key_header="continuation"))
    _theorem_claims(section, p, lang, slope_rows)


def report(records, p: TheoryPreset, languages: tuple[str, ...] | None = None) -> Section:
    section = Section(TITLE)
    section.text.append(
        "(a) One AdamW run with one masked position per sentence, measured from early to past convergence. "
        "tr F = the paper's estimator (labels sampled from the model); tr H = Hutchinson's trace of the Hessian of "
        "the loss of the true tokens; gap = Hutchinson's trace of Hessian − Gauss–Newton on the same batches and "
        "probes (the Gauss–Newton matrix of softmax cross-entropy is the Fisher, so this is tr H − tr F without "
        "the probe noise the two share); tr F + gap = a lower-variance estimate of tr H. Every SE is over "
        "independent batches of sentences and probes. \"Model-sampled labels\" replaces the true tokens by draws "
        "from the model's own conditionals: the well-specified case, where the gap is 0 in expectation.")
    section.text.append(
        "(b) Plain SGD continued from the last checkpoint of (a) on fresh sentences (runs forked from it, counting "
        "their own steps); tr F by the paper's estimator "
        "with the same contexts at every step (common random numbers, so differences are less noisy than the "
        "SEs suggest); step 0 is the start.")
    for lang in languages or p.use:
        rows = _lemma(records, section, lang)
        _lemma_report(records, section, p, lang, rows)
        section.rows += rows
        _theorem(records, section, p, lang)
        section.rows += section.files[SGD_FILE]
    return section
