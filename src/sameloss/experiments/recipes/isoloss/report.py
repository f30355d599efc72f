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
from .tables import HOLM_FAMILIES
from .language import parse_language

def replication_section(outcomes: list[dict]) -> Section:
    """The study across languages (``outcomes``: ``language_report``'s, or ``finished_studies``'
    read back from study folders): the pooled answer first, then the replication table
    (``stats.replication``), with what its analysis is."""
    from ...stats.replication import NOT_POOLED, replication

    rep = Section("Across the languages", lead=True)
    out = replication(outcomes)
    names = [o["language"] for o in outcomes]
    gated = [o["language"] for o in outcomes if not o["ok"]]
    rep.text.append(
        f"{len(outcomes)} languages: {', '.join(names)}"
        + (f" ({', '.join(gated)} without headroom: uninformative, not pooled)" if gated else "") + ". The primary "
        "analysis, fixed before the data, is a one-stage stratified fixed-effects model over the seed pairs: each "
        "language a stratum with its own mean, every pair weighted as within its language (by its KL positions), "
        "the common effect the weighted mean over every pair, its scale pooled from the residuals about each "
        "language's own mean, t on Σn − k degrees of freedom; its claim is about these languages, not a population "
        "of languages. Beside it the language × treatment interaction (F test: do the languages' effects differ?) "
        "and, as a secondary, random effects with the Hartung–Knapp–Sidik–Jonkman interval truncated at max(1, q*). "
        "A comparison whose effect is the language's own (the adversary: its objective is aimed at each "
        "language's task) is reported per language only. Holm over the pooled claims; a pooled verdict is "
        "*decided* when it survives it.")
    rep.answer += _pooled_answer(out, NOT_POOLED)
    _replication_table(rep, outcomes, out)
    return rep


def _pooled_answer(out: list[dict], not_pooled: str) -> list[str]:
    """The answer across languages: which claims hold across the languages (pooled and
    decided), which hold on some (per language), which are undecided."""
    claims = [r for r in out if r["holm_family"] == "claims"] or out
    lines = []
    held = [r for r in claims if r.get("pooled_decided")]
    pooled = max((int(r.get('pooled_languages') or 0) for r in out), default=0)  # languages with pairs to pool
    lines.append(f"**Across the languages ({pooled} pooled):** "
                 f"{len(held)} of {len(claims)} claims decided after Holm (the stratified fixed-effects model):")
    for r in claims:
        if r["pooled_verdict"] == not_pooled:
            lines.append(f"- {r['test']}: per language only — {r['agreement']}")
            continue
        state = (r["pooled_verdict"] + (" (survives Holm)" if r.get("pooled_decided") else
                                        f" ({r.get('pooled_after_holm') or 'undecided'})"))
        lines.append(f"- {r['test']}: {state}, {fmt(r.get('pooled'), '+.2f')} [{fmt(r.get('pooled_low'), '.2f')}, "
                     f"{fmt(r.get('pooled_high'), '.2f')}] points, δ {fmt(r.get('margin'), 'g')}; interaction p "
                     f"{fmt(r.get('interaction_p'), '.2g')}; per language: {r['agreement']}")
    lines.append(_which_hold(claims, not_pooled))
    return lines


def _which_hold(claims: list[dict], not_pooled: str) -> str:
    """One sentence sorting the claims: those that hold across the languages (the pooled verdict
    decided after Holm), those decided on some languages only (a language's own verdict, or a
    comparison reported per language), and those undecided everywhere."""
    from ...stats.inference import DETECTED, DETECTED_AGAINST, EQUIVALENT

    def decided_somewhere(r: dict) -> bool:  # a language's own verdict (its ``<tag>_verdict`` cell) is decided
        return any(str(v).startswith((DETECTED, DETECTED_AGAINST, EQUIVALENT)) for k, v in r.items()
                   if k.endswith("_verdict") and k != "pooled_verdict")

    across = [f"{r['test']} ({r['pooled_verdict']})" for r in claims if r.get("pooled_decided")]
    some, undecided = [], []
    for r in claims:
        if r.get("pooled_decided"):
            continue
        if decided_somewhere(r):
            some.append(f"{r['test']} ({'per language only, ' if r['pooled_verdict'] == not_pooled else ''}"
                        f"{r['agreement']})")
        else:
            undecided.append(r["test"])
    return ("**Which claims hold:** across the languages (pooled, decided after Holm): "
            + ("; ".join(across) or "none") + ". On some languages, not pooled or not decided pooled: "
            + ("; ".join(some) or "none") + ". Undecided on every language and pooled: "
            + (", ".join(undecided) or "none") + ".")


def _replication_table(section: Section, studies: list[dict], out: list[dict]) -> None:
    section.files["replication.csv"] = out
    columns = [Column("pooled verdict (stratified FE)", "pooled_verdict", text=True),
               Column("pooled [95%]", "pooled", ci=("pooled_low", "pooled_high"), fmt=".2f"),
               Column("δ", "margin", fmt=".2f"), Column("df", "pooled_df", fmt=".0f"),
               Column("after Holm", "pooled_after_holm", text=True), Column("power", "pooled_power", fmt=".2f"),
               Column("interaction p", "interaction_p", fmt=".2g")]
    for s in studies:
        columns += [Column(f"{s['tag']} [95%]", f"{s['tag']}_mean", ci=(f"{s['tag']}_low", f"{s['tag']}_high"),
                           fmt=".2f"),
                    Column(f"{s['tag']} verdict", f"{s['tag']}_verdict", text=True)]
    columns += [Column("agreement", "agreement", text=True),
                Column("random effects [95%] (secondary)", "random", ci=("random_low", "random_high"), fmt=".2f"),
                Column("τ²", "tau2", fmt=".2g")]
    section.tables.append(Table(
        "Across the languages, per comparison and fork point (primary accuracy, points): the pooled verdict of the "
        "stratified fixed-effects model over the seed pairs (language a stratum; t on Σn − k), Holm over the pooled "
        "claims and the power of each pooled verdict as made after it (a detection's against δ, a \"no effect\"'s "
        "TOST power at 0), the language × treatment interaction; then each language's estimate and verdict, how "
        "they agree, and random effects (truncated HKSJ) as the secondary", columns, out, source="replication.csv",
        key="test", key_header="comparison @ fork point",
        terminal=("pooled verdict (stratified FE)", "pooled [95%]", "δ", "after Holm", "interaction p")))


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
    needed = {"family", "comparison", "point", "n_used", "mean", "sd", "t_low", "t_high", "verdict", "margin",
              "expected_sign", "holm_family", "pooled", "quantity"}
    for tag, path in files.items():
        gate_path = path.with_name(path.name.replace("differences.csv", "gate.csv"))
        if not gate_path.is_file():
            raise UserError(f"{folder}: no {gate_path.name} (the headroom gate of every seed): a study from an "
                            "earlier version of sameloss or an unfinished one; rerun it to its end")
        gates = rows(gate_path)
        if not gates or "ok" not in gates[0]:
            raise UserError(f"{gate_path}: not an isoloss gate table (no seeds, or no 'ok' column)")
        ok = all(g["ok"] == "True" for g in gates)
        if ok and not path.exists():
            raise UserError(f"{folder}: every seed passed the headroom gate but {path.name} is missing: the study "
                            "is incomplete or the file was removed; rerun it to its end")
        diffs = rows(path) if path.exists() else []
        if ok and not diffs:
            raise UserError(f"{path}: empty — every seed passed the headroom gate, so the study wrote its differences "
                            "there; rerun it to its end")
        if diffs and not needed <= set(diffs[0]):
            raise UserError(f"{path}: lacks the columns {', '.join(sorted(needed - set(diffs[0])))}: not an isoloss "
                            "differences table (or one from an earlier version: rerun the study)")
        if any(None in r.values() or None in r for r in diffs):
            raise UserError(f"{path}: a row is cut short (the file was truncated); rerun the study to its end")
        pairs_path = path.with_name(path.name.replace("differences.csv", "pairs.csv"))
        pairs = rows(pairs_path) if ok and pairs_path.exists() else []
        if ok and (not pairs or any(None in r.values() or None in r for r in pairs)):
            raise UserError(f"{pairs_path}: missing, empty or cut short (the pooled analysis reads every pair); "
                            "rerun the study to its end")
        primary = [r for r in diffs if r["family"] == "primary"]
        out.append({"language": tag, "tag": tag, "ok": ok, "diffs": diffs, "pairs": pairs,
                    "tests": list(dict.fromkeys(str(paired.TestKey.of(r)) for r in primary)),
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
    five = [x.name for x in p.forks if p.checkpoints_of(x) != p.schedule.probe_points]
    sched, probes, v, d = p.schedule, p.probes, p.verdicts, p.seed_design
    return (
        f"Language {p.choice.spec} ({language}, size {size}), task {task} (its latent over positions "
        f"{p.span[0] + 1}–{p.span[1]}); {len(seeds)} seeds ({', '.join(map(str, seeds))}); forks: {', '.join(f)}"
        + (f" (the design's, fixed before the data by the claims-first rule for {d.budget_minutes:g} minutes on "
           f"{d.workers} workers: {_plan_text(p)}; planned from the prior paired SDs of {d.prior_source}, seeds "
           f"{min(d.prior_seeds)}–{max(d.prior_seeds)}, none of them this study's)" if d.plan and d.prior_seeds else
           f" (the design's: {_plan_text(p)})" if d.plan else "") + "; "
        f"base run {p.base_steps} steps (AdamW, constant lr after the warm-up). Fork points: {points}. Every fork "
        f"trains its recipe up to step {p.base_steps + sched.recipe_steps}"
        + "".join(f"{', ' if i else ' ('}{x.name}: {p.base_steps + p.recipe_steps_of(x)}"
                  for i, x in enumerate(own_recipe)) + (")" if own_recipe else "")
        + f", decays the lr linearly over {sched.decay_steps} steps to "
        f"{sched.final_lr_factor:g} × lr and holds it for {sched.final_steps} steps"
        + "".join(f"{', ' if i else ' ('}{x.name}: {p.final_steps_of(x)}" for i, x in enumerate(longer))
        + (")" if longer else "") + ": its *stretch*. "
        f"**The same loss, estimated**: exact KL on one shared held-out set of {p.eval_sentences} sentences at "
        f"each fork's measured checkpoints — {sched.probe_points} spread over its stretch"
        + (f" ({', '.join(five)}: {p.checkpoints_of(f[five[0]])}, enough to test its line for curvature)" if five
           else "") + f" (lr factor {sched.final_lr_factor:g} for all), first and last included, where its trace and "
        f"probes are measured too — and, on the first seed only (the curves figure), every {sched.match_every} steps "
        "of each stretch. Per comparison and seed one target KL, from the two forks' measured KL ranges alone (the "
        "middle of their overlap, or of the gap between them); each fork's accuracy and trace estimated at the "
        "target by the least-squares line through its own checkpoints (a line per fork: the one model, fixed "
        "before the data). Each pair weighs by what its KL positions imply: its difference's variance is τ² + σ²·L, "
        "L the lines' leverage at the target (from the KLs alone), σ² the checkpoint noise about the lines (their "
        "residuals), τ² the spread over seeds (DerSimonian–Laird); the comparison's estimate is the weighted mean "
        "with the Hartung–Knapp–Sidik–Jonkman t interval on n − 1 degrees of freedom (equal leverages: the paired "
        f"t test). Every pair is used unless a fork's target lies more than {v.extrapolation_limit:.1e} nats outside "
        "its own measured KL range (one limit for every fork, fixed before the data; such a pair is named with its "
        "reason), and every estimate is shown beside it at limit 0 and with every pair. Probes: the same "
        f"{probes.pool}-example pool and {probes.test}-example test set for every model, the training subsets drawn "
        "per seed (the same for the seed's forks). **Primary endpoint**: probe at the task's position, converged "
        f"L-BFGS (l2 {probes.l2:g}), n = {probes.primary_size}, mean over {probes.primary_subsets} subsets; "
        "accuracies in points. **Verdicts**, each against its claim's margin δ (its smallest effect of interest, "
        "from the effects the paper reports for the mechanism, fixed in the preset: the margins table): "
        "\"detected\" when the two-sided 95% t interval excludes 0; \"no effect beyond ±δ (TOST, 90% interval)\" "
        "when both one-sided tests at α = 0.05 reject an effect of ±δ; else \"inconclusive\"; the traces' δ is "
        f"{100 * v.trace_margin:g} % of the reference fork's mean trace; beside each accuracy the secondary reading "
        f"at ±{v.secondary_margin:g} points. MDE: the true difference the two-sided test detects with 80% power, "
        "from the noncentral t. "
        f"{HOLM_FAMILIES} {gate_text}"
        + "".join(f" {x.label} is forked late only ("
                  + ("from scratch a sharpening penalty runs away from every target KL"
                     if dict(x.settings).get("flatness.weight", 0) < 0 else "this scale's budget") + ")."
                  for x in p.forks if x.late_only)
        + ("" if ok else " **Every verdict is marked uninformative.**"))


def verdict_table(section: Section, p: IsolossPreset, diffs: list[dict], seeds: list[int], ok: bool) -> None:
    """The verdicts first: the primary accuracy and the trace of every comparison at every
    fork point, with the claim's margin, the MDE, the Holm-adjusted p and the power of the
    verdict as made, and the exclusion sensitivity beside."""
    v = p.verdicts
    section.notes.append(
        f"{len(seeds)} seeds; per comparison and fork point the precision-weighted paired difference (recipe − "
        "reference) at the target KL over the pairs whose forks' targets lie at most "
        f"{v.extrapolation_limit:.1e} nats outside their measured KL ranges, its 95% HKSJ interval and its MDE (80% "
        "power, noncentral t): \"detected\" when the interval excludes 0, \"no effect beyond ±δ (TOST, 90% "
        "interval)\" when the 90% interval lies inside ±δ, δ the claim's margin (from the paper's effects, fixed "
        "in the preset), else \"inconclusive\"; Holm within the claims — "
        f"{', '.join(p.claims) or 'every comparison'} — and within the other comparisons (and the traces); a verdict "
        "is decided when it survives Holm, and its power is the power of the verdict as made after Holm (a "
        "detection's against δ, a \"no effect\"'s TOST power at 0). Beside it the same estimate with every pair "
        "(no extrapolation limit). The design, the headroom gate and every table follow the Runs table."
        + ("" if ok else " **The headroom gate failed: every verdict is marked uninformative.**"))
    rows = [r for r in diffs if r["family"] == "primary"]
    trace = {(r["comparison"], r["point"]): r for r in diffs if r["family"] == "trace"}
    out = []
    for r in rows:
        t = trace[(r["comparison"], r["point"])]
        out.append({"test": str(paired.TestKey.of(r)), "claim": f"{r['recipe']} − {r['reference']}",
                    "sign": "+" if r["expected_sign"] > 0 else "−", "mean": r["mean"], "t_low": r["t_low"],
                    "t_high": r["t_high"], "margin": r["margin"], "mde": r["mde"], "holm_p": r["holm_p"],
                    "verdict": r["verdict"], "after_holm": r["after_holm"], "decided": r["decided"],
                    "used": r["n_used"], "of": r["n_pairs"], "trace": t["mean"], "trace_low": t["t_low"],
                    "trace_high": t["t_high"], "trace_margin": t["margin"], "trace_verdict": t["verdict"],
                    "family": r["holm_family"], "power": r["power"], "secondary": r["secondary_verdict"],
                    "all_n": r["all_n"], "all_mean": r["all_mean"], "all_low": r["all_low"],
                    "all_high": r["all_high"], "all_verdict": r["all_verdict"]})
    section.files["verdicts.csv"] = out
    section.tables.append(Table(
        "Verdicts: primary accuracy difference at the target KL (points; the paper's sign of the accuracy effect) and "
        "trace difference per comparison and fork point, against each claim's margin δ, with the MDE at 80% power, "
        "the Holm family, the Holm-adjusted p, whether the verdict survives Holm and its power as made; the "
        f"secondary reading at ±{v.secondary_margin:g}; beside it the estimate with every pair (no limit)",
        [Column("recipe − reference", "claim", text=True), Column("paper", "sign", text=True),
         Column("pairs used", "used", fmt="d"), Column("of", "of", fmt="d"),
         Column("accuracy [95%]", "mean", ci=("t_low", "t_high"), fmt=".2f"), Column("δ", "margin", fmt=".2f"),
         Column("MDE", "mde", fmt=".2f"), Column("family", "family", text=True),
         Column("p Holm", "holm_p", fmt=".2g"), Column("verdict", "verdict", text=True),
         Column("after Holm", "after_holm", text=True), Column("power", "power", fmt=".2f"),
         Column(f"±{v.secondary_margin:g} reading", "secondary", text=True),
         Column("trace [95%]", "trace", ci=("trace_low", "trace_high"), fmt=".3g"),
         Column("trace δ", "trace_margin", fmt=".3g"), Column("trace verdict", "trace_verdict", text=True),
         Column("every pair", "all_n", fmt="d"),
         Column("their accuracy [95%]", "all_mean", ci=("all_low", "all_high"), fmt=".2f"),
         Column("their verdict", "all_verdict", text=True)],
        out, source="verdicts.csv", key="test", key_header="comparison @ fork point",
        terminal=("pairs used", "accuracy [95%]", "δ", "verdict", "after Holm", "power", "trace verdict")))


def flatness_tables(section: Section, trend: list[dict], changes: list[dict], points: list[dict]) -> None:
    """Flatness by assigned arm (``stats.dose_response``): what each arm did to the trace (and
    to the weight norm and the adaptive trace where measured), the trend over λ with the Wald
    ratio, and the per-pair points of the exploratory figure."""
    section.files["flatness_arms.csv"] = changes
    section.files["flatness_trend.csv"] = trend
    section.files["dose_points.csv"] = points
    has = {k for c in changes for k in c}
    columns = [Column("λ (1e-4)", "lam", fmt=".2g"),
               Column("trace change (%) [95%]", "trace_change", ci=("trace_low", "trace_high"), scale=100, fmt=".1f")]
    if "weight_norm_sq_change" in has:
        columns.append(Column("weight norm² change (%) [95%]", "weight_norm_sq_change",
                              ci=("weight_norm_sq_low", "weight_norm_sq_high"), scale=100, fmt=".1f"))
    if "adaptive_trace_change" in has:
        columns.append(Column("adaptive trace change (%) [95%]", "adaptive_trace_change",
                              ci=("adaptive_trace_low", "adaptive_trace_high"), scale=100, fmt=".1f"))
    section.tables.append(Table(
        "Flatness arms: what each penalty weight λ did at the target KL, relative to AdamW (arm ÷ AdamW − 1, mean "
        "over seeds, 95% t interval): the trace of the Hessian — and, where measured, the squared weight norm and "
        "the adaptive (reparametrisation-invariant) trace tr(|w| H |w|), so that a lower trace is not a rescaling "
        "of the weights alone", columns, changes, source="flatness_arms.csv", key="test",
        key_header="arm @ fork point"))
    section.tables.append(Table(
        "Flatness by assigned arm: the trend of the primary difference (arm − AdamW, points) over λ (per 1e-4), per "
        "seed the slope through AdamW's own arm, t over seeds; its margin is the claims' δ at the strongest arm; "
        "the paper's direction positive (a flatter arm transfers better); Holm over the fork points. Beside it the "
        "effect of the trace itself with λ as the instrument (2SLS: the accuracy trend over the relative trace "
        "change's trend, points per unit of relative trace change, Fieller's 95% interval; unbounded where the "
        "trace's trend is not distinguishable from 0)",
        [Column("seeds", "n_seeds", fmt="d"), Column("arms", "arms", text=True),
         Column("trend [95%]", "slope", ci=("low", "high"), fmt=".2f"), Column("δ per λ", "margin", fmt=".2f"),
         Column("p Holm", "holm_p", fmt=".2g"), Column("verdict", "verdict", text=True),
         Column("after Holm", "after_holm", text=True),
         Column("trace change per λ (%)", "trace_trend", scale=100, fmt=".1f"),
         Column("accuracy per unit trace (Wald) [95%]", "wald", ci=("wald_low", "wald_high"), fmt=".2f"),
         Column("its interval", "wald_interval", text=True)],
        trend, source="flatness_trend.csv", key="test", key_header="test"))


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
        [Column("pairs used", "n_used", fmt="d"), Column("mean [t 95%]", "mean", ci=("t_low", "t_high"), fmt=".2f"),
         Column("MDE", "mde", fmt=".2f"), Column("verdict", "verdict", text=True),
         Column("every pair", "all_n", fmt="d"),
         Column("their mean [t 95%]", "all_mean", ci=("all_low", "all_high"), fmt=".2f")],
        keep, source="sam_controls.csv", key="test", key_header="comparison @ fork point: quantity"))


def size_table(section: Section, p: IsolossPreset, rows: list[dict], pairs: list[dict], results: list[dict],
               design: paired.Design) -> None:
    """The size contrast at the target KL: accuracy, both traces in the large model's
    parameter space, and each model's trace in its own (each the weighted estimate of
    ``paired.differences``, ``design``'s: the verdict table's numbers)."""
    from ...stats.weighted import estimate, fits_of

    def weighted(ps: list[dict], key: str, scale: float):
        return estimate(fits_of(ps, key, scale))

    size = [c for c in p.comparisons if {f.name: f for f in p.forks}[c.recipe].resized]
    points = [p.point_name(k) for k in sorted(p.fork_points, reverse=True)]
    tests = [(c, pt) for c in size for pt in points if (c, pt) in p.tests()]
    # each model's own space: the reference's own trace, estimated at the same targets
    own_tests = [(dataclasses.replace(c, reference_trace="trace_fisher"), pt) for c, pt in tests]
    own = paired.estimate_pairs(rows, own_tests, ["trace_fisher"], design)
    out = []
    for c, pt in tests:
        used = paired.used_pairs(pairs, c, pt)
        used_own = {q["seed"] for q in used}
        mine = [q for q in own if q["comparison"] == c.name and q["point"] == pt and q["seed"] in used_own]
        a = weighted(used, p.primary_key, 100.0)
        t1 = weighted(used, "trace_fisher", 1.0)
        t0 = weighted(mine, "trace_fisher", 1.0)
        out.append({"test": str(c.key(pt)), "n_used": a.n, "acc": a.mean, "acc_low": a.t_low,
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
