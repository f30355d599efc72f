"""Larger models at the same loss (paper Fig. 3 and Fig. 5; App. B.3–B.4).

Command
    sameloss reproduce sizes --preset tiny          [--out runs] [--seed N] [--fresh]

Runtime
    smoke   ~10 s on a CPU (two micro shapes, 24 steps; the numbers mean nothing)
    tiny    ~8 min on a 2-core CPU (PCFG and HMM micro languages; d_model 16/32/64
            transformers of 1/2/2 layers, 4k/27k/106k parameters, 2500 AdamW steps each)
    small   ~3–4 h on one H100 (estimate, not measured: paper languages, Table 4 shapes
            t4-128, t4-192, t4-384, batch 4096, 20k steps each)
    paper   ~2 days on one H100 (estimate, not measured: Table 4 shapes t4-128 … t4-960,
            embedded into t4-1920 for the trace, 100k steps each)

What it runs
    Models of 3–5 sizes trained with the standard AdamW recipe for the same number of steps.
    Per size, at its last checkpoint: exact loss and KL, trace of Hessian of the model
    itself, trace of Hessian of its function-preserving embedding into the largest shape
    (``models.embed``, App. B.4 — the paper's fair comparison: all sizes as parameter
    configurations of one architecture), probe accuracy on every task.

Expected result (paper)
    Among sizes with (almost) the same loss, larger models have a smaller trace of Hessian
    (19.8 → 12.6 on the PCFG in the embedded view) and higher probe accuracy (+6.9% PCFG,
    +4.5% HMM). The report compares the largest size with each smaller size that is within
    the preset's KL tolerance, and gives Kendall's tau of accuracy vs parameters.

Caveat
    The embedding preserves the function but not the trace of Hessian in general (see
    ``models/embed.py``: groups of replicated parameters scale by 1/(α² m)); the report
    gives both views.
"""

from __future__ import annotations

from ..claims import difference_claim, fmt
from ..common import COMMON, base_overrides, measure_spec, reference_run
from ..core import Context, RunSpec
from ..plots import series_figure
from ..report import Column, Section, Table
from .steps import measured_columns, train_and_measure

TITLE = "Model size at the same loss (Fig. 3, Fig. 5)"


def _shape(d_model: int, n_heads: int, n_layers: int, d_inter: int, base: str) -> list[str]:
    return [f"model.size={base}", f"model.d_model={d_model}", f"model.n_heads={n_heads}",
            f"model.n_layers={n_layers}", f"model.d_inter={d_inter}"]


PRESETS: dict[str, dict] = {
    "smoke": {**COMMON["smoke"], "use": ("pcfg",), "embed_into": "micro",
              "sizes": [dict(label="d8", model=_shape(8, 1, 1, 16, "micro"), steps=24), "reference"]},
    "tiny": {**COMMON["tiny"], "use": ("pcfg", "hmm"), "embed_into": "tiny",
             "sizes": [dict(label="d16", model=_shape(16, 1, 1, 64, "tiny"), steps=2500),
                       dict(label="d32", model=_shape(32, 2, 2, 128, "tiny"), steps=2500),
                       "reference"]},
    "small": {**COMMON["small"], "use": ("pcfg", "hmm"), "embed_into": "t4-384",
              "sizes": [dict(label="t4-128", model=["model.size=t4-128"], steps=20000),
                        dict(label="t4-192", model=["model.size=t4-192"], steps=20000),
                        "reference"]},
    "paper": {**COMMON["paper"], "use": ("pcfg", "hmm"), "embed_into": "t4-1920",
              "sizes": [dict(label=n, model=[f"model.size={n}"], steps=100_000)
                        for n in ("t4-128", "t4-192", "t4-320", "t4-640", "t4-960")]},
}


def size_runs(p: dict, language: str, seed: int) -> list[RunSpec]:
    out = []
    for s in p["sizes"]:
        if s == "reference":
            spec = reference_run(p, language, seed)
            out.append(RunSpec(spec.name, spec.overrides, p["reference"]["label"].split(" ")[0], "size"))
            continue
        out.append(RunSpec(name=f"{language}-{s['label']}-adamw",
                           overrides=(*base_overrides(p, language, seed), *s["model"], f"steps={s['steps']}"),
                           label=s["label"], group="size"))
    return out


def collect(ctx: Context, p: dict, seed: int = 0, languages: tuple[str, ...] | None = None) -> Section:
    section = Section(TITLE)
    into = p["embed_into"]
    section.text.append(
        f"Each row is the last checkpoint of one size. tr(H) own = trace of Hessian of the model itself; "
        f"tr(H) embedded = of its function-preserving embedding into the `{into}` shape (App. B.4), with the "
        "loss of the embedded model as a check that the function is unchanged. The embedding keeps the function "
        "but not the trace: a group of parameters replicated m times and scaled by α has its Fisher trace "
        "multiplied by 1/(α²m) (`models/embed.py`), so a small model's embedded trace is usually below its own.")
    n_seeds = len(p["measure"]["seeds"])
    for language in languages or p["use"]:
        tasks = tuple(p["tasks"][language])
        mspec = measure_spec(p, tasks, seed)
        espec = measure_spec(p, (), seed)  # loss + trace of the embedded model
        rows = []
        for spec in size_runs(p, language, seed):
            info, ((ck, row),) = train_and_measure(ctx, spec, mspec, "sizes", language)
            section.runs.append(info)
            row["size"] = spec.label
            try:
                emb = ctx.embed(ck, into)
            except Exception as exc:  # noqa: BLE001 - reported, not fatal
                from ...errors import UserError
                if not isinstance(exc, UserError):
                    raise
                section.notes.append(f"{language} {spec.label}: no embedded view ({exc}).")
            else:
                ctx.log(f"measure {ctx.rel(emb)} (embedded into {into})")
                e = ctx.measure(emb, espec)
                row.update(trace_embedded=e.get("trace_fisher"), trace_embedded_se=e.get("trace_fisher_se"),
                           embedded_loss=e.get("loss"), embedded_parameters=e.get("parameters"))
            rows.append(row)
        section.rows += rows
        lang = f"{language} ({p['languages'][language]})"
        cols = [Column("parameters", "parameters", fmt="d")] + measured_columns(tasks, with_step=False)
        cols.insert(4, Column(f"tr(H) embedded in {into}", "trace_embedded", "trace_embedded_se", fmt=".4g"))
        cols.insert(5, Column("loss of embedded", "embedded_loss", fmt=".4f"))
        section.tables.append(Table(f"{lang}: sizes", cols, rows))
        fig = f"sizes-{language}.png"
        main = tasks[min(1, len(tasks) - 1)]
        own = [dict(r, trace=r.get("trace_fisher"), trace_se=r.get("trace_fisher_se")) for r in rows]
        # (the embedded model computes the same function: only its trace is plotted)
        embedded = [dict(parameters=r["parameters"], trace=r.get("trace_embedded"),
                         trace_se=r.get("trace_embedded_se")) for r in rows]
        series_figure(ctx.root / fig, {"own parameters": own, f"embedded in {into}": embedded}, "parameters",
                      [("kl", "KL (nats)", 1.0, True), ("trace", "trace of Hessian (Fisher)", 1.0, False),
                       (f"probe_{main}", f"probe accuracy task {main} (%)", 100.0, False)],
                      f"{lang}: model sizes", logx=True)
        section.figures.append((fig, f"{lang}: KL, trace of Hessian (own and embedded) and probe accuracy "
                                     f"(task {main}) against the number of parameters"))
        largest = max(rows, key=lambda r: r["parameters"])
        tol = p["kl_tolerance"]
        for r in rows:
            if r is largest:
                continue
            if not (float(r["kl"]) <= tol and float(largest["kl"]) <= tol):
                section.notes.append(
                    f"{lang}: {r['size']} (KL {fmt(float(r['kl']))}) and {largest['size']} (KL "
                    f"{fmt(float(largest['kl']))}) are not both within the KL tolerance {tol:g} nats: their "
                    "comparison is not at the same loss and is left out of the claims.")
                continue
            a, b = f"{r['size']}", f"{largest['size']}"
            for key, what in (("trace_embedded", f"trace of Hessian embedded in {into}"),
                              ("trace_fisher", "trace of Hessian, own parameters")):
                if r.get(key) is None or largest.get(key) is None:
                    continue
                section.claims.append(difference_claim(
                    "at the same loss, larger models are flatter (Fig. 5: trace 19.8 → 12.6 on the PCFG, in "
                    "the embedded view).", f"{lang}, {what}", key, r, largest, a, b, -1))
            for task in tasks:
                section.claims.append(difference_claim(
                    "at the same loss, larger models transfer better (Fig. 3: +6.9% PCFG, +4.5% HMM).",
                    f"{lang}, probe accuracy task {task}", f"probe_{task}", r, largest, a, b, +1, scale=100,
                    unit=" pts", n_seeds=n_seeds))
    return section
