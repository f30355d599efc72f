"""The iso-loss study's sections and tables (``analysis.py`` fills them): the design in
words, the verdicts, the headroom and the gate of every seed, SAM's controls, the size
contrast, the regression, the runtime; the replication table of several languages, and
``finished_studies``, which reads it back from finished study folders."""

from __future__ import annotations

import csv
import dataclasses
import math
from pathlib import Path

import numpy as np

from ....errors import UserError
from ...stats import paired
from ...reports.claims import fmt
from ...reports.document import Column, Section, Table
from .design import EMBED_KL_TOLERANCE, IsolossPreset
from .language import parse_language

def replication_section(outcomes: list[dict]) -> Section:
    """The replication table of the languages' ``outcomes`` (``_language_report``'s, or
    ``finished_studies``' read back from study folders), with what it means."""
    rep = Section("Replication across languages", lead=True)
    rep.text.append(
        f"{len(outcomes)} languages: " + "; ".join(
            f"{o['language']} ({'headroom gate passed' if o['ok'] else 'NO HEADROOM: its verdicts are uninformative'})"
            for o in outcomes) + ". Per comparison the replication verdict gives the pooled verdict first (the claim "
        "about languages), then how each language agrees (\"2 of 3 languages detect it in the paper's direction, 1 "
        "inconclusive\"; a language without headroom, or whose differences have no spread, is said so), "
        "\"contradicted\" where detections point both ways; \"uninformative\" with fewer than two languages with "
        "headroom and an estimate. The pooled estimate is over the languages with headroom, each with its standard error sd/√n of "
        "its used pairs: random effects (DerSimonian–Laird τ²) with the Hartung–Knapp–Sidik–Jonkman t interval on "
        "k − 1 degrees of freedom (a normal interval is anti-conservative with few languages), beside the "
        "fixed-effect estimate; I² is the share of the spread between languages beyond chance. With fewer than two "
        "languages with headroom nothing is pooled.")
    from ...stats.replication import replication

    replication(rep, outcomes)
    return rep


def _tag_of(spec: str) -> str:
    """The tag a study of several languages gives the language ``spec`` (``hmm-headroom``);
    the spec itself where this installation cannot build it (a plugin's language gone)."""
    try:
        return parse_language(spec).tag
    except UserError:
        return spec


def finished_studies(folder: str | Path, label: str | None = None) -> list[dict]:
    """What the replication table reads of a finished ``reproduce isoloss`` folder, per
    language: one language (``differences.csv``) or several (``<tag>-differences.csv``).
    Whether a language had headroom is read from its gate table (``gate.csv``: every seed's
    gate), never inferred from a missing file: a language whose study stopped at the gate
    (or marked every verdict uninformative) is there, without headroom; a study whose seeds
    all passed but whose differences are missing is an error. ``label`` names a
    one-language folder (default: the language its ``results.csv`` names, else the
    folder's name). ``UserError`` (one line) for a folder that is no finished study."""
    folder = Path(folder)
    if not folder.is_dir():
        raise UserError(f"{folder}: no such study folder")
    if not (folder / "report.md").is_file():
        raise UserError(f"{folder}: not a finished isoloss study (no report.md: run `sameloss reproduce isoloss` "
                        "to its end, or without --seeds)")

    def rows(path: Path) -> list[dict]:
        try:
            with path.open(newline="") as f:
                return list(csv.DictReader(f))
        except (OSError, UnicodeDecodeError, csv.Error) as exc:
            raise UserError(f"{path}: cannot be read ({exc})") from None

    tags = sorted({path.name[:-len("-headroom.csv")] for path in folder.glob("*-headroom.csv")})
    if not tags and not (folder / "headroom.csv").is_file():
        raise UserError(f"{folder}: not an isoloss study folder (no headroom.csv; is it another experiment's?)")
    if tags and label is not None:
        raise UserError(f"{folder}: a study of {len(tags)} languages is named by its own tags ({', '.join(tags)}); "
                        "give it without LABEL=")
    if not tags:
        results = folder / "results.csv"
        named = {r.get("language") for r in rows(results)} - {None, ""} if results.is_file() else set()
        tags = [label or (_tag_of(named.pop()) if len(named) == 1 else folder.name)]
        files = {tags[0]: folder / "differences.csv"}
    else:
        files = {tag: folder / f"{tag}-differences.csv" for tag in tags}
    out = []
    needed = {"family", "comparison", "point", "n_used", "mean", "sd", "t_low", "t_high", "verdict"}
    for tag, path in files.items():
        gate_path = path.with_name(path.name.replace("differences.csv", "gate.csv"))
        if not gate_path.is_file():
            raise UserError(f"{folder}: no {gate_path.name} (the headroom gate of every seed): a study from an "
                            "earlier version of sameloss or an unfinished one; rerun it to its end")
        gates = rows(gate_path)
        if not gates or "ok" not in gates[0]:
            raise UserError(f"{gate_path}: not an isoloss gate table (no seeds, or no 'ok' column)")
        ok = all(g["ok"] == "True" for g in gates)
        if ok and not path.is_file():
            raise UserError(f"{folder}: every seed passed the headroom gate but {path.name} is missing: the study "
                            "is incomplete or the file was removed; rerun it to its end")
        diffs = rows(path) if path.is_file() else []
        if diffs and not needed <= set(diffs[0]):
            raise UserError(f"{path}: lacks the columns {', '.join(sorted(needed - set(diffs[0])))}: not an isoloss "
                            "differences table (or one from an earlier version: rerun the study)")
        primary = [r for r in diffs if r["family"] == "primary"]
        out.append({"language": tag, "tag": tag, "ok": ok, "diffs": diffs,
                    "tests": list(dict.fromkeys(f"{r['comparison']} @ {r['point']}" for r in primary)),
                    "folder": str(folder)})
    return out


def prefix_files(tag: str, *sections: Section) -> None:
    """A language's CSV files named ``<tag>-<file>`` (the tables that read them too)."""
    for section in sections:
        renamed = {name: f"{tag}-{name}" for name in section.files}
        section.files = {renamed[k]: v for k, v in section.files.items()}
        for t in section.tables:
            t.source = renamed.get(t.source, t.source)


def _plan_text(p: IsolossPreset) -> str:
    return ", ".join(f"{t} on {n} seeds" for t, n in p.seed_design.plan)


def design_text(p: IsolossPreset, seeds: list[int], gate_text: str, ok: bool) -> str:
    """The design in words: what was run, how the same loss is estimated, the verdicts' rules."""
    language, size, task = p.use[0], p.languages[p.use[0]], p.task
    f = {x.name: x for x in p.forks}
    points = ", ".join(f"{p.point_name(k)} (step {k})" for k in sorted(p.fork_points, reverse=True))
    own_recipe = [x for x in p.forks if x.recipe_steps is not None]
    longer = [x for x in p.forks if x.final_steps is not None]
    sched, probes, v = p.schedule, p.probes, p.verdicts
    return (
        f"Language {p.choice.spec} ({language}, size {size}), task {task} (its latent over positions "
        f"{p.span[0] + 1}–{p.span[1]}); {len(seeds)} seeds; forks: {', '.join(f)}"
        + (f" (this design's: the tests it plans, {_plan_text(p)})" if p.seed_design.plan else "") + "; "
        f"base run {p.base_steps} steps (AdamW, constant lr after the warm-up). Fork points: {points}. Every fork "
        f"trains its recipe up to step {p.base_steps + sched.recipe_steps}"
        + "".join(f"{', ' if i else ' ('}{x.name}: {p.base_steps + p.recipe_steps_of(x)}"
                  for i, x in enumerate(own_recipe)) + (")" if own_recipe else "")
        + f", decays the lr linearly over {sched.decay_steps} steps to "
        f"{sched.final_lr_factor:g} × lr and holds it for {sched.final_steps} steps"
        + "".join(f"{', ' if i else ' ('}{x.name}: {p.final_steps_of(x)}" for i, x in enumerate(longer))
        + (")" if longer else "") + ": its *stretch*. "
        f"**The same loss, estimated**: exact KL on one shared held-out set of {p.eval_sentences} sentences at "
        f"each fork's measured checkpoints — {sched.probe_points} spread over its stretch (lr factor "
        f"{sched.final_lr_factor:g} for all), first and last included, where its trace and probes are measured too — "
        f"and, on the first seed only (the curves figure), every {sched.match_every} steps of each stretch. Per "
        "comparison and seed one target KL, from the two forks' measured KL ranges alone (the middle of their "
        "overlap, or of the gap between them); each fork's accuracy and trace estimated at the target by the "
        "least-squares line through its own checkpoints. Each pair weighs by what its KL positions imply: its "
        "difference's variance is τ² + σ²·L, L the lines' leverage at the target (from the KLs alone), σ² the "
        "checkpoint noise about the lines (their residuals), τ² the spread over seeds (DerSimonian–Laird); the "
        "comparison's estimate is the weighted mean with the Hartung–Knapp–Sidik–Jonkman t interval on n − 1 "
        "degrees of freedom (equal leverages: the paired t test); where every pair's ranges touch (a gap at most "
        f"{v.borrow_gap:g} × the smaller range) and a test of equal KL slopes does not reject at {v.slope_level:g}, "
        "the KL slope common to both forks is pooled over the comparison's forks. Every pair is used "
        f"unless a fork's target lies more than {v.extrapolation_limit:g} × its own measured KL range outside that "
        "range (such a pair is named with its reason); the sensitivity row beside each result uses only the pairs whose ranges lie "
        f"within {p.kl_tolerance:g} nats of each other (the earlier exclusion rule). Probes: the same "
        f"{probes.pool}-example pool and {probes.test}-example test set for every model, the training subsets drawn "
        "per seed (the same for the seed's forks). **Primary endpoint**: probe at the task's position, converged "
        f"L-BFGS (l2 {probes.l2:g}), n = {probes.primary_size}, mean over "
        f"{probes.primary_subsets} subsets; accuracies in %. Verdicts: "
        "\"detected\" when the two-sided 95% t interval excludes 0; \"no effect beyond ±δ (TOST, 90% interval)\" when "
        "both one-sided tests at α = 0.05 reject an effect of ±δ (the 90% t interval inside ±δ), with δ fixed in the "
        f"preset: {v.equivalence_margin:g} points for accuracies, {100 * v.trace_margin:g} % of the reference fork's "
        "mean trace for traces; else \"inconclusive\". MDE: the true difference the two-sided test detects with 80% "
        "power, from the noncentral t: MDE = λ*·sd/√n, λ* solving P(|T′(n−1, λ*)| > t(0.975, n−1)) = 0.8. "
        f"{paired.HOLM_FAMILIES} {gate_text}"
        + "".join(f" {x.label} is forked late only ("
                  + ("from scratch a sharpening penalty runs away from every target KL"
                     if dict(x.settings).get("flatness.weight", 0) < 0 else "this scale's budget") + ")."
                  for x in p.forks if x.late_only)
        + ("" if ok else " **Every verdict is marked uninformative.**"))


def verdict_table(section: Section, p: IsolossPreset, diffs: list[dict], seeds: list[int], ok: bool) -> None:
    """The verdicts first: the primary accuracy and the trace of every comparison at every
    fork point, with their MDE and Holm-adjusted p, and the exclusion sensitivity beside."""
    v = p.verdicts
    section.notes.append(
        f"{len(seeds)} seeds; per comparison and fork point the precision-weighted paired difference (recipe − "
        "reference) at the target KL, every pair used unless a fork's target lies beyond the extrapolation limit "
        f"({v.extrapolation_limit:g} × its measured KL range outside it), its 95% HKSJ interval and its minimum "
        "detectable effect (MDE, 80% power, noncentral t): \"detected\" when the interval excludes 0, \"no effect "
        "beyond ±δ (TOST, 90% interval)\" when the 90% interval lies inside ±δ (δ fixed in the preset: "
        f"{v.equivalence_margin:g} points for accuracies, {100 * v.trace_margin:g} % of the reference's trace for "
        "traces), else \"inconclusive\"; Holm within the primary family — the claims fixed before the data: "
        f"{', '.join(p.claims) or 'every comparison'} — and within the other comparisons (and the traces), with "
        "each claim's power against δ after Holm. Beside it the "
        f"sensitivity: only the pairs whose forks' KL ranges lie within {p.kl_tolerance:g} nats of each other. The "
        "design, the headroom gate and every table follow the Runs table."
        + ("" if ok else " **The headroom gate failed: every verdict is marked uninformative.**"))
    rows = [r for r in diffs if r["family"] == "primary"]
    trace = {(r["comparison"], r["point"]): r for r in diffs if r["family"] == "trace"}
    out = []
    for r in rows:
        t = trace[(r["comparison"], r["point"])]
        out.append({"test": f"{r['comparison']} @ {r['point']}", "claim": f"{r['recipe']} − {r['reference']}",
                    "sign": "+" if r["expected_sign"] > 0 else "−", "mean": r["mean"], "t_low": r["t_low"],
                    "t_high": r["t_high"], "mde": r["mde"], "holm_p": r["holm_p"], "verdict": r["verdict"],
                    "after_holm": r["after_holm"], "used": r["n_used"], "of": r["n_pairs"],
                    "trace": t["mean"], "trace_low": t["t_low"], "trace_high": t["t_high"],
                    "trace_margin": t["margin"], "trace_verdict": t["verdict"], "family": r["holm_family"],
                    "power": r["power"], "extrapolation": r["extrapolation"], "tol_n": r["tol_n"],
                    "tol_mean": r["tol_mean"], "tol_low": r["tol_low"], "tol_high": r["tol_high"],
                    "tol_verdict": r["tol_verdict"]})
    section.files["verdicts.csv"] = out
    section.tables.append(Table(
        "Verdicts: primary accuracy difference at the target KL (points; paper's sign of the accuracy effect) and "
        "trace difference per comparison and fork point, with the MDE at 80% power, the Holm family (the claims "
        "fixed before the data, or the other comparisons), the Holm-adjusted p, the power against δ after Holm and "
        "the share of the estimate's variance that is extrapolation; the sensitivity beside: only the pairs within "
        "the KL tolerance",
        [Column("recipe − reference", "claim", text=True), Column("paper", "sign", text=True),
         Column("pairs used", "used", fmt="d"), Column("of", "of", fmt="d"),
         Column("accuracy [95%]", "mean", ci=("t_low", "t_high"), fmt=".2f"), Column("MDE", "mde", fmt=".2f"),
         Column("family", "family", text=True), Column("p Holm", "holm_p", fmt=".2g"),
         Column("power after Holm", "power", fmt=".2f"), Column("extrapolation", "extrapolation", fmt=".2f"),
         Column("verdict", "verdict", text=True), Column("after Holm", "after_holm", text=True),
         Column("trace [95%]", "trace", ci=("trace_low", "trace_high"), fmt=".3g"),
         Column("trace δ", "trace_margin", fmt=".3g"), Column("trace verdict", "trace_verdict", text=True),
         Column("within tolerance", "tol_n", fmt="d"),
         Column("their accuracy [95%]", "tol_mean", ci=("tol_low", "tol_high"), fmt=".2f"),
         Column("their verdict", "tol_verdict", text=True)],
        out, source="verdicts.csv", key="test", key_header="comparison @ fork point",
        terminal=("pairs used", "accuracy [95%]", "MDE", "family", "power after Holm", "verdict", "after Holm",
                  "trace verdict")))


def headroom_table(section: Section, p: IsolossPreset, gate: dict) -> list[dict]:
    keys = p.fewshot(gate["seed"]).columns()
    columns = [c for key in keys for c in (key, f"{key}_std")]

    def pick(d: dict) -> dict:
        return {k: float(d[k]) for k in columns}

    majority = gate["lookup"]["fewshot_majority"]
    table_rows = [{"baseline": "majority class", **{k: majority for k in keys}},
                  {"baseline": f"random-init encoder (seed {gate['seed']})", **pick(gate["random_init"])},
                  {"baseline": "look-up table (true conditionals)", **pick(gate["lookup"])},
                  {"baseline": f"trained base (seed {gate['seed']}, step {p.base_steps})", **pick(gate["trained"])},
                  {"baseline": "oracle (true posteriors of the task's latent)", **pick(gate["oracle"])}]
    cols = []
    for view, method, what in (("pos", "lbfgs", "position, L-BFGS"), ("all", "adamw", "all positions, AdamW")):
        for n in p.probes.sizes:
            cols.append(Column(f"{what} n={n} (%)", f"{view}_{method}_n{n}", scale=100, fmt=".1f"))
    section.tables.append(Table(
        "Headroom (measured before the forks): probe accuracy of the baselines and the trained base (at the task's "
        "position: converged L-BFGS probe; all positions: the paper's AdamW probe)", cols,
        table_rows, source="headroom.csv", key="baseline", key_header="representation"))
    section.files["headroom.csv"] = table_rows
    return table_rows


def gate_table(section: Section, p: IsolossPreset, gates: list[dict]) -> None:
    """Every seed's gate (``gate.csv``: what ``sameloss replicate`` reads to know whether a
    study had headroom): the primary endpoint of its base and its references, and whether it
    passed."""
    key, m = p.primary_key, p.verdicts.headroom_margin
    out = [{"seed": g["seed"], "trained": float(g["trained"][key]), "random_init": float(g["random_init"][key]),
            "lookup": float(g["lookup"][key]), "oracle": float(g["oracle"][key]), "ok": bool(g["ok"])}
           for g in gates]
    section.files["gate.csv"] = out
    section.tables.append(Table(
        f"The headroom gate per seed (primary endpoint, %; the gate asks ≥ {m:g} points above the "
        f"look-up table and the random-init encoder and ≥ {m:g} below the oracle)",
        [Column("trained base", "trained", scale=100, fmt=".1f"), Column("random-init", "random_init", scale=100,
                                                                          fmt=".1f"),
         Column("look-up table", "lookup", scale=100, fmt=".1f"), Column("oracle", "oracle", scale=100, fmt=".1f"),
         Column("passed", "ok", text=True)],
        out, source="gate.csv", key="seed", key_header="seed"))


def sam_controls(section: Section, diffs: list[dict], half: list[dict]) -> None:
    """SAM against both of its references: −dropout−WD on the full batch and on SAM's half."""
    keep = [r for r in diffs if r["family"] in ("primary", "trace") and r["comparison"] in ("sam05", "sam05-half")]
    keep += [r for r in half if r["family"] in ("primary", "trace")]
    section.files["sam_controls.csv"] = keep
    section.tables.append(Table(
        "SAM's controls: SAM ρ 0.05 against −dropout−WD on the full batch and on the same half batch SAM updates "
        "on, and the half batch's own effect (primary accuracy in points; trace), at the target KL",
        [Column("pairs used", "n_used", fmt="d"), Column("mean [t 95%]", "mean", ci=("t_low", "t_high"), fmt=".3g"),
         Column("MDE", "mde", fmt=".3g"), Column("verdict", "verdict", text=True),
         Column("within tolerance", "tol_n", fmt="d"),
         Column("their mean [t 95%]", "tol_mean", ci=("tol_low", "tol_high"), fmt=".3g")],
        keep, source="sam_controls.csv", key="test", key_header="comparison @ fork point: quantity"))


def size_table(section: Section, p: IsolossPreset, rows: list[dict], pairs: list[dict], results: list[dict],
               design: paired.Design) -> None:
    """The size contrast at the target KL: accuracy, both traces in the large model's
    parameter space, and each model's trace in its own (each the weighted estimate of
    ``paired.differences``, ``design``'s: the verdict table's numbers)."""
    from ...stats.weighted import estimate, fits_of

    def weighted(ps: list[dict], key: str, scale: float):
        return estimate(fits_of(ps, key, scale, design.pilot), design.slope_level, stein=bool(design.pilot))

    size = [c for c in p.comparisons if {f.name: f for f in p.forks}[c.recipe].resized]
    points = [p.point_name(k) for k in sorted(p.fork_points, reverse=True)]
    tests = [(c, pt) for c in size for pt in points if (c, pt) in p.tests()]
    # each model's own space: the reference's own trace, estimated at the same targets
    own_tests = [(dataclasses.replace(c, reference_trace="trace_fisher"), pt) for c, pt in tests]
    own = paired.estimate_pairs(rows, own_tests, ["trace_fisher"], design)
    out = []
    for c, pt in tests:
        used = [q for q in pairs if q["comparison"] == c.name and q["point"] == pt and q["used"]]
        used_own = {q["seed"] for q in used}
        mine = [q for q in own if q["comparison"] == c.name and q["point"] == pt and q["seed"] in used_own]
        a = weighted(used, p.primary_key, 100.0)
        t1 = weighted(used, "trace_fisher", 1.0)
        t0 = weighted(mine, "trace_fisher", 1.0)
        out.append({"test": f"{c.name} @ {pt}", "n_used": a.n, "acc": a.mean, "acc_low": a.t_low,
                    "acc_high": a.t_high, "acc_mde": a.mde, "trace_one_space": t1.mean,
                    "trace_one_space_low": t1.t_low, "trace_one_space_high": t1.t_high,
                    "trace_own": t0.mean, "trace_own_low": t0.t_low, "trace_own_high": t0.t_high,
                    "large_trace": _mean(q["recipe_trace_fisher"] for q in used),
                    "small_trace": _mean(q["reference_trace_fisher"] for q in mine),
                    "small_trace_embedded": _mean(q["reference_trace_fisher"] for q in used)})
    checks = [e for res in results for e in res["embedded_kl"]]
    section.files["size.csv"] = out
    section.tables.append(Table(
        "Size contrast (large − small at the target KL, every pair used unless beyond the limit; the weighted "
        "estimates with their HKSJ 95% intervals): primary accuracy (points), the trace in one parameter space (the small model embedded into the large shape, App. B.4) and "
        "in each model's own; the mean traces at the target",
        [Column("pairs used", "n_used", fmt="d"), Column("accuracy [95%]", "acc", ci=("acc_low", "acc_high"),
                                                          fmt=".3g"),
         Column("MDE", "acc_mde", fmt=".3g"),
         Column("trace, one space [95%]", "trace_one_space", ci=("trace_one_space_low", "trace_one_space_high"),
                fmt=".3g"),
         Column("trace, own spaces [95%]", "trace_own", ci=("trace_own_low", "trace_own_high"), fmt=".3g"),
         Column("large", "large_trace", fmt=".4g"), Column("small", "small_trace", fmt=".4g"),
         Column("small embedded", "small_trace_embedded", fmt=".4g")],
        out, source="size.csv", key="test", key_header="comparison @ fork point"))
    if checks:
        worst = max(abs(e["kl_large"] - e["kl_small"]) for e in checks)
        section.notes.append(f"Size forks start from exactly the base's function: over {len(checks)} seeds the "
                             f"embedded model's exact KL equals the base checkpoint's to {worst:.1e} nats "
                             f"(asserted ≤ {EMBED_KL_TOLERANCE:g}).")


def _mean(values) -> float:
    v = list(values)
    return float(np.mean(v)) if v else math.nan


def regression_table(section: Section, reg: list[dict]) -> None:
    section.files["regression.csv"] = reg
    section.tables.append(Table(
        "Fig. 1 within seeds: primary accuracy (pts) regressed on trace and KL with seed fixed effects, per fork "
        "point, one row per fork (the mean of its measured checkpoints), one model size, without the adversarial "
        "fork (cluster bootstrap over seeds, 95%; MDE from the noncentral t on seeds − 1 degrees of freedom; no "
        "equivalence margin is set for a slope)",
        [Column("estimate [95%]", "estimate", ci=("low", "high"), fmt=".3g"), Column("MDE 80%", "mde", fmt=".3g"),
         Column("models", "n_models", fmt="d"), Column("verdict", "verdict", text=True)], reg,
        source="regression.csv", key="coefficient", key_header="coefficient"))


def runtime_notes(section: Section, launcher, results: list[dict], seeds: list[int]) -> None:
    """Each seed's wall and CPU seconds (``runtime.csv``; its CPU per fork and stage is the
    engine's ``costs.csv``, what a budget's cost model reads), and how many seeds ran at once."""
    rows = [{"seed": s, "seconds": res["seconds"], "cpu_seconds": res["cpu_seconds"]} for s, res in zip(seeds, results)]
    section.files["runtime.csv"] = rows
    cpu = [r["cpu_seconds"] for r in rows]
    section.notes.append(f"Runtime per seed (CPU of the call that computed the seed: seeds/*/cost.json): CPU "
                         f"{fmt(float(np.mean(cpu)))} s on average "
                         f"(min {fmt(min(cpu))}, max {fmt(max(cpu))}; runtime.csv; per fork point, fork and stage: costs.csv); "
                         f"{_workers_text(launcher)}.")


def _workers_text(launcher) -> str:
    """How many seeds ran at once (what a timing depends on)."""
    if launcher.name == "inprocess":
        return "one seed at a time in this process (--launcher inprocess)"
    n = launcher.workers
    return (f"{n} seeds at a time" if n else "all seeds at once (the launcher's default)") + \
        f" (--launcher {launcher.name})"
