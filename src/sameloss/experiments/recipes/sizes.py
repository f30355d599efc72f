"""Larger models at the same loss (paper Fig. 3 and Fig. 5; App. B.3–B.4).

Command

    sameloss reproduce sizes --scale tiny           [--out runs] [--seed N] [--fresh]

Runtime per scale

    smoke   ~15 s on a CPU (two micro transformers and two micro LSTMs, 24 steps; the
            numbers mean nothing)
    tiny    ~8 min on a 2-core CPU for the transformers (PCFG and HMM micro languages;
            d_model 16/32/64 transformers of 1/2/2 layers, 4k/27k/106k parameters, 2500
            AdamW steps each) plus ~6 min for the LSTMs (estimate from the step times: HMM
            only, d_hidden 8/16/32 with 1/1/2 layers, 1500 steps, ~0.02/0.04/0.13 s a step)
    small   ~3–4 h on one H100 (estimate, not measured: paper languages, Table 4 shapes
            t4-128, t4-192, t4-384, batch 4096, 20k steps each; LSTMs h128-l4, h256-l6,
            h512-l8 on the HMM, 20k steps each: ~+2 h)
    paper   ~2 days on one H100 (estimate, not measured: Table 4 shapes t4-128 … t4-960,
            embedded into t4-1920 for the trace, 100k steps each; the paper's LSTMs
            h128-l4 … h1024-l16 on the HMM: ~+1 day)

What it runs
    Models of 3–5 sizes trained with the standard AdamW recipe for the same number of steps.
    Per size, at its last checkpoint: exact loss and KL, trace of Hessian of the model
    itself, trace of Hessian of its function-preserving embedding into the largest shape
    (``models.embed``, App. B.4 — the paper's fair comparison: all sizes as parameter
    configurations of one architecture), probe accuracy on every task.
    The paper's LSTM family (bidirectional, d_hidden 128…1024, 4…16 layers; App. A.4,
    scaled down below ``small``) on the HMM: the same measures, the trace of the model
    itself only (the embedding is for transformers), compared within the family.

Expected result (paper)
    Among sizes with (almost) the same loss, larger models have a smaller trace of Hessian
    (19.8 → 12.6 on the PCFG in the embedded view) and higher probe accuracy (+6.9% PCFG,
    +4.5% HMM). The report compares the largest size with each smaller size that is within
    the scale's KL tolerance, and gives Kendall's tau of accuracy vs parameters.

The causal language (the paper's OPT panels; ``experiments/causal.py``)
    Run by itself, the recipe adds the causal language after the others with the same
    transformer sizes, trained with ``masking=single``: smoke an untrained micro GPT-2
    generator built with a fixed seed into the data cache (K=16, T=6; +~5 s); tiny a tiny GPT-2
    trained 300 steps on the offline toy text (K=32, T=8; runtime not measured yet —
    estimate +~10 min on a 2-core CPU); small/paper the OPT-shape generator of
    ``$SAMELOSS_CAUSAL_GENERATOR`` (K=2000, T=24; estimate, not measured: +~1 h / +~1 day
    on one H100, the exact loss costing K continuations per held-out sentence). Probed on
    an SST-2-format task (a stand-in written from the language, or
    ``$SAMELOSS_CAUSAL_SST2``). ``figure1`` leaves it out.

Caveat
    The embedding preserves the function but not the trace of Hessian in general (see
    ``models/embed.py``: groups of replicated parameters scale by 1/(α² m)); the report
    gives both views.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ...models.sizes import LSTM_SIZES, TRANSFORMER_SIZES
from ...measures.rows import error_column
from ..reports.claims import POINTS, difference_claim, fmt
from ..presets.causal import CAUSAL
from ..presets.common import (COMMON, LanguagePart, MeasuredRun, Preset, Shape, base_settings, language_parts,
    measured_columns, measured_runs, quantity_column, reference_run, run_name)
from ..engine.runspec import RunSpec
from ..engine.declare import Checkpoint, Embedded, Measure, run_unit, tags
from ..reports.plots import TRACE_FISHER, Panel, Ref, XAxis, error_labels, majority_ref, series_plot
from ..reports.document import Column, Section, Table

TITLE = "Model size at the same loss (Fig. 3, Fig. 5)"
SUMMARY = "model sizes at the same loss, trace also in the embedded view (Fig. 3, 5)"


@dataclass(frozen=True)
class SizeRun:
    """One model size, trained with the standard AdamW recipe."""

    label: str
    shape: Shape
    steps: int


@dataclass(frozen=True)
class LSTMRun:
    """One bidirectional LSTM of the paper's family (App. A.4), trained with the standard
    AdamW recipe; ``size`` a named LSTM size of ``models.sizes`` (``h<d_hidden>-l<layers>``)
    with optional changes to its shape."""

    label: str
    size: str
    steps: int
    d_model: int | None = None
    d_hidden: int | None = None
    n_layers: int | None = None

    def __post_init__(self):
        if self.size not in LSTM_SIZES:
            raise ValueError(f"unknown LSTM size {self.size!r}")

    def settings(self) -> tuple:
        changes = (("d_model", self.d_model), ("d_hidden", self.d_hidden), ("n_layers", self.n_layers))
        return (("model.kind", "lstm"), ("model.size", self.size),
                *((f"model.{k}", v) for k, v in changes if v is not None), ("steps", self.steps))


@dataclass(frozen=True, kw_only=True)
class SizesPreset(Preset):
    sizes: tuple[SizeRun, ...]  # smallest first
    with_reference: bool  # the reference run is the largest size (shared with steps and algorithms)
    embed_into: str  # the transformer shape every size is embedded into (App. B.4)
    lstms: tuple[LSTMRun, ...] = ()  # smallest first; the paper's LSTM family
    lstm_use: tuple[str, ...] = ()  # the languages the LSTMs run on

    def __post_init__(self):
        super().__post_init__()
        if self.embed_into not in TRANSFORMER_SIZES:
            raise ValueError(f"unknown model size {self.embed_into!r} to embed into")
        if not set(self.lstm_use) <= set(self.use):
            raise ValueError(f"LSTM languages {self.lstm_use} must be among {self.use}")


def _shape(d_model: int, n_heads: int, n_layers: int, d_inter: int, base: str) -> Shape:
    return Shape(base, d_model=d_model, n_heads=n_heads, n_layers=n_layers, d_inter=d_inter)


PRESETS: dict[str, SizesPreset] = {
    "smoke": SizesPreset(**COMMON["smoke"].common(), use=("pcfg",), embed_into="micro", with_reference=True,
                         sizes=(SizeRun("d8", _shape(8, 1, 1, 16, "micro"), steps=24),),
                         lstms=(LSTMRun("lstm-h4", "micro", steps=24, d_model=8, d_hidden=4),
                                LSTMRun("lstm-h8", "micro", steps=24)), lstm_use=("pcfg",),
                         causal=CAUSAL["smoke"]),
    # the paper's LSTM family (d_hidden 128…1024, 4…16 layers) scaled down: a 2-core CPU
    # trains the tiny LSTM (h64, 2 layers) at ~0.4 s a step, so tiny stops at h32
    "tiny": SizesPreset(**COMMON["tiny"].common(), use=("pcfg", "hmm"), embed_into="tiny", with_reference=True,
                        sizes=(SizeRun("d16", _shape(16, 1, 1, 64, "tiny"), steps=2500),
                               SizeRun("d32", _shape(32, 2, 2, 128, "tiny"), steps=2500)),
                        lstms=(LSTMRun("lstm-h8-l1", "micro", steps=1500, d_model=8, d_hidden=8, n_layers=1),
                               LSTMRun("lstm-h16-l1", "micro", steps=1500, d_model=16, d_hidden=16, n_layers=1),
                               LSTMRun("lstm-h32-l2", "micro", steps=1500, d_model=32, d_hidden=32, n_layers=2)),
                        lstm_use=("hmm",), causal=CAUSAL["tiny"]),
    "small": SizesPreset(**COMMON["small"].common(), use=("pcfg", "hmm"), embed_into="t4-384", with_reference=True,
                         sizes=(SizeRun("t4-128", Shape("t4-128"), steps=20000),
                                SizeRun("t4-192", Shape("t4-192"), steps=20000)),
                         lstms=tuple(LSTMRun(n, n, steps=20000) for n in ("h128-l4", "h256-l6", "h512-l8")),
                         lstm_use=("hmm",), causal=CAUSAL["small"]),
    "paper": SizesPreset(**COMMON["paper"].common(), use=("pcfg", "hmm"), embed_into="t4-1920",
                         with_reference=False,
                         sizes=tuple(SizeRun(n, Shape(n), steps=100_000)
                                     for n in ("t4-128", "t4-192", "t4-320", "t4-640", "t4-960")),
                         lstms=tuple(LSTMRun(n, n, steps=100_000)
                                     for n in ("h128-l4", "h256-l6", "h512-l8", "h768-l12", "h1024-l16")),
                         lstm_use=("hmm",), causal=CAUSAL["paper"]),
}


def lstm_runs(p: SizesPreset, language: str, seed: int) -> list[RunSpec]:
    """One run per LSTM size (none on a language outside ``p.lstm_use``)."""
    if language not in p.lstm_use:
        return []
    return [RunSpec(run_name(language, s.label, "adamw"), (*base_settings(p, language, seed), *s.settings()),
                    label=s.label, group="lstm") for s in p.lstms]


def runs(p: SizesPreset, language: str, seed: int) -> list[RunSpec]:
    """One run per transformer size, each measured at its last checkpoint (the LSTMs:
    ``lstm_runs``)."""
    out = [RunSpec(run_name(language, s.label, "adamw"),
                   (*base_settings(p, language, seed), *s.shape.settings(), ("steps", s.steps)),
                   label=s.label, group="size") for s in p.sizes]
    if p.with_reference:
        ref = reference_run(p, language, seed)
        out.append(RunSpec(ref.name, ref.settings, p.reference.short_label, "size"))
    return out


def embedded(spec: RunSpec, lang: LanguagePart, into: str) -> Measure:
    """The loss and trace of a run's last checkpoint embedded into the shape ``into`` (App.
    B.4; a shape that cannot hold the model is skipped with its reason), ``role="embedded"``."""
    return Measure(Embedded(Checkpoint(spec.name), into), dataclasses.replace(lang.measure, probe=()), optional=True,
                   tags=tags(experiment="sizes", language=lang.name, role="embedded", of=spec.name))


def units(setup, p: SizesPreset, languages: tuple[str, ...] | None = None) -> list:
    """One unit per run: a transformer trained, measured, embedded into the largest shape
    and measured there; an LSTM trained and measured. Tagged with the recipe and the
    language (the groups ``size`` and ``lstm`` tell the families apart): the report asks for them so."""
    out = []
    for q, lang in language_parts(setup, p, languages):
        mine = dict(experiment="sizes", language=lang.name)
        out += [run_unit(spec, lang.measure, embedded(spec, lang, p.embed_into), **mine)
                for spec in runs(q, lang.name, setup.seed)]
        out += [run_unit(spec, lang.measure, **mine) for spec in lstm_runs(q, lang.name, setup.seed)]
    return out


def report(records, p: SizesPreset, languages: tuple[str, ...] | None = None) -> Section:
    section = Section(TITLE)
    into = p.embed_into
    section.text.append(
        f"Each row is the last checkpoint of one size. tr(H) own = trace of Hessian of the model itself; "
        f"tr(H) embedded = of its function-preserving embedding into the `{into}` shape (App. B.4), with the "
        "loss of the embedded model as a check that the function is unchanged. The embedding keeps the function "
        "but not the trace: a group of parameters replicated m times and scaled by α has its Fisher trace "
        "multiplied by 1/(α²m) (`models/embed.py`), so a small model's embedded trace is usually below its own.")
    for q, lang in language_parts(records.setup, p, languages):
        sizes = measured_runs(records, "sizes", language=lang.name, group="size")
        rows = [_size_row(records, section, run, lang) for run in _smallest_first(sizes)]
        section.rows += rows
        cols = [Column("parameters", "parameters", fmt="d")] + measured_columns(lang.tasks, with_step=False)
        cols.insert(4, quantity_column(f"tr(H) embedded in {into}", "trace_embedded", fmt=".4g"))
        cols.insert(5, Column("loss of embedded", "embedded_loss", fmt=".4f"))
        section.tables.append(Table(f"{lang.title}: sizes", cols, rows))
        _figure(records, section, q, lang, rows, into)
        _claims(section, q, lang, rows)
        _lstms(records, section, q, lang)
    return section


def _lstms(records, section: Section, p: SizesPreset, lang: LanguagePart) -> None:
    """The LSTM family on one language: own trace and probes (no embedded view: App. B.4's
    embedding is for transformers)."""
    lstms = measured_runs(records, "sizes", language=lang.name, group="lstm")
    if not lstms:
        return
    rows = []
    for run in lstms:
        section.runs.append(run.info)
        (row,) = run.rows
        rows.append(dict(row, size=run.tags["label"]))
    section.rows += rows
    cols = [Column("parameters", "parameters", fmt="d")] + measured_columns(lang.tasks, with_step=False)
    section.tables.append(Table(f"{lang.title}: bidirectional LSTMs", cols, rows))
    main = lang.tasks[min(1, len(lang.tasks) - 1)]
    tol = p.kl_tolerance
    fig = series_plot({"bidirectional LSTM": rows}, "parameters", [
        Panel("kl", "exact KL to the true conditionals (nats)",
              refs=(Ref(tol, f"same-loss tolerance (KL = {tol:g} nats)"),)),
        Panel("trace_fisher", TRACE_FISHER),
        Panel(f"probe_{main}", f"probe accuracy, task {main}", refs=majority_ref(rows, main))],
        f"{lang.title}: LSTM sizes", x_axis=XAxis("parameters", log=True, refs=_saturation(rows, tol)),
        errors=error_labels(lang.measure))
    section.figures.append(records.figure(
        fig, f"sizes-{lang.name}-lstm",
        shows=f"{lang.title}: (a) the exact KL (log axis), (b) the trace of Hessian by the paper's estimator (of "
              f"the LSTM itself: the embedding is for transformers), (c) linear-probe accuracy on task {main}, "
              f"against the number of parameters (log axis); {_saturation_text(rows, tol)}",
        sample=_size_sample(records, rows, lang, "LSTM sizes"),
        claim="at the same loss, larger models are flatter and transfer better (Figs. 3 and 5, the LSTM family)"))
    _claims(section, p, lang, rows, family="LSTM ")


def _smallest_first(runs: list[MeasuredRun]) -> list[MeasuredRun]:
    """The sizes in the order declared, smallest first (``SizesPreset.sizes``, then the
    reference run, the largest) — not in the order trained: in ``figure1`` the reference
    run, shared with ``steps``, is trained first."""
    return sorted(runs, key=lambda run: run.measured[0]["parameters"])


def _size_row(records, section: Section, run: MeasuredRun, lang: LanguagePart) -> dict:
    """The last checkpoint's row, with the loss and trace of its embedding (``embedded``)."""
    section.runs.append(run.info)
    (row,) = run.rows
    row["size"] = run.tags["label"]
    embedding = dict(experiment="sizes", language=lang.name, role="embedded", of=run.tags["run"])
    skipped = records.skipped(**embedding)
    if skipped:  # reported, not fatal
        ((_, why),) = skipped
        section.notes.append(f"{lang.name} {row['size']}: no embedded view ({why}).")
        return row
    ((_, e),) = records.tagged(**embedding)  # loss + trace of the embedded model
    row.update({"trace_embedded": e.get("trace_fisher"),
                error_column("trace_embedded"): e.get(error_column("trace_fisher")),
                "embedded_loss": e.get("loss"), "embedded_parameters": e.get("parameters")})
    return row


def _saturation(rows: list[dict], tol: float) -> tuple[Ref, ...]:
    """A dashed line at the smallest size whose KL is within the tolerance (Fig. 3's); none
    when no size is, or the smallest size already is (the paper's HMM panel)."""
    within = [r for r in rows if float(r["kl"]) <= tol]
    if not within:
        return ()
    smallest = min(within, key=lambda r: r["parameters"])
    if smallest["parameters"] == min(r["parameters"] for r in rows):
        return ()
    return (Ref(float(smallest["parameters"]), f"smallest size with KL ≤ {tol:g} (the loss saturates)", axis="x"),)


def _saturation_text(rows: list[dict], tol: float) -> str:
    if _saturation(rows, tol):
        return f"the dashed vertical line marks the smallest size whose KL is within the tolerance {tol:g} nats (the " \
               "loss saturates; the paper's Fig. 3)"
    if any(float(r["kl"]) <= tol for r in rows):
        return f"the smallest size is already within the tolerance {tol:g} nats (no saturation line)"
    return f"no size reaches KL ≤ {tol:g} nats (the tolerance, dashed in (a))"


def _size_sample(records, rows: list[dict], lang: LanguagePart, what: str) -> str:
    return (f"{len(rows)} {what}, the last checkpoint of one run each (seed {records.setup.seed}); "
            f"each probe trained with {len(lang.measure.seeds)} seeds")


def _figure(records, section: Section, p: SizesPreset, lang: LanguagePart, rows: list[dict], into: str) -> None:
    main = lang.tasks[min(1, len(lang.tasks) - 1)]
    tol = p.kl_tolerance
    own = [dict(r, trace=r.get("trace_fisher"), trace_se=r.get("trace_fisher_se")) for r in rows]
    # (the embedded model computes the same function: only its trace is plotted)
    embedded = [dict(parameters=r["parameters"], trace=r.get("trace_embedded"),
                     trace_se=r.get("trace_embedded_se")) for r in rows]
    errors = error_labels(lang.measure)
    errors["trace"] = errors["trace_fisher"]
    embedded_name = f"embedded in {into} (App. B.4)"
    fig = series_plot({"the model itself": own, embedded_name: embedded}, "parameters", [
        Panel("kl", "exact KL to the true conditionals (nats)",
              refs=(Ref(tol, f"same-loss tolerance (KL = {tol:g} nats)"),)),
        Panel("trace", TRACE_FISHER),
        Panel(f"probe_{main}", f"probe accuracy, task {main}", refs=majority_ref(rows, main))],
        f"{lang.title}: model sizes", x_axis=XAxis("parameters", log=True, refs=_saturation(rows, tol)),
        errors=errors, styles={embedded_name: {"filled": False, "marker": "s"}})
    section.figures.append(records.figure(
        fig, f"sizes-{lang.name}",
        shows=f"{lang.title}: (a) the exact KL to the true conditionals (log axis), (b) the trace of Hessian by the "
              f"paper's estimator, of the model itself (filled) and of its function-preserving embedding into the "
              f"`{into}` shape (hollow), (c) linear-probe accuracy on task {main}, against the number of parameters "
              f"(log axis); {_saturation_text(rows, tol)}",
        sample=_size_sample(records, rows, lang, "transformer sizes"),
        claim="at the same loss, larger models are flatter (Fig. 5, embedded view) and transfer better (Fig. 3)"))


def _claims(section: Section, p: SizesPreset, lang: LanguagePart, rows: list[dict], family: str = "") -> None:
    """The largest size against each smaller one (of one model family), where both are
    within the KL tolerance."""
    largest = max(rows, key=lambda r: r["parameters"])
    tol = p.kl_tolerance
    for r in rows:
        if r is largest:
            continue
        if not (float(r["kl"]) <= tol and float(largest["kl"]) <= tol):
            section.notes.append(
                f"{lang.title}: {family}{r['size']} (KL {fmt(float(r['kl']))}) and {largest['size']} (KL "
                f"{fmt(float(largest['kl']))}) are not both within the KL tolerance {tol:g} nats: their "
                "comparison is not at the same loss and is left out of the claims.")
            continue
        a, b = f"{r['size']}", f"{largest['size']}"
        for key, what in (("trace_embedded", f"trace of Hessian embedded in {p.embed_into}"),
                          ("trace_fisher", "trace of Hessian, own parameters")):
            if r.get(key) is None or largest.get(key) is None:
                continue
            section.claims.append(difference_claim(
                "at the same loss, larger models are flatter (Fig. 5: trace 19.8 → 12.6 on the PCFG, in "
                "the embedded view).", f"{lang.title}, {family}{what}", key, (r, a), (largest, b), -1))
        for task in lang.tasks:
            section.claims.append(difference_claim(
                "at the same loss, larger models transfer better (Fig. 3: +6.9% PCFG, +4.5% HMM).",
                f"{lang.title}, {family}probe accuracy task {task}", f"probe_{task}", (r, a), (largest, b), +1,
                POINTS, n_seeds=len(p.measure.seeds)))
