"""The iso-loss study's report, orchestrated: every seed's records read back
(``study.seed_result``), the estimation at each comparison's target KL, the paired
differences and their verdicts (``paired``), the dose and the regression of Fig. 1 within
seeds; the sections and tables they fill are ``report.py``'s, the figures
``figures.py``'s. Nothing here trains or measures: it reads the engine's records."""

from __future__ import annotations

import math

from ...stats import paired
from ...stats.allocation import Allocation
from ...reports.claims import fmt
from ...reports.document import Section
from .allocation import recorded_allocation
from .design import ENDPOINTS, HALF_BATCH, TITLE, IsolossPreset, flatness_forks, language_studies, regression_without
from .figures import figures
from .report import (design_text, gate_table, headroom_table, prefix_files, regression_table, replication_section,
                     runtime_notes, sam_controls, size_table, verdict_table)
from .study import seed_results, study_seeds


def report(records, p: IsolossPreset) -> list[Section]:
    """Two sections: the verdicts with their MDE (``lead``: before the Runs table) and the
    study (design, headroom, selection, every table and figure). On several languages: each
    language's verdicts, then the replication table that pools them, then each language's
    study, their files and figures named by the language's tag."""
    if not p.replicate:
        lead, section, _ = language_report(records, p)
        return [lead, section]
    leads, sections, outcomes = [], [], []
    for q in language_studies(p):
        lead, section, outcome = language_report(records, q)
        prefix_files(q.tag, lead, section)
        leads.append(lead)
        sections.append(section)
        outcomes.append(outcome)
    rep = replication_section(outcomes)
    rep.text[-1] += (" Each language's verdicts are above it; each language's design and tables follow, under "
                     "its name.")
    return [*leads, rep, *sections]


def run_seeds(records, p: IsolossPreset) -> tuple[list[dict], Allocation | None]:
    """Every seed's result of one language's study, in seed order (the seeds whose units
    ran), and the allocation an adaptive study's later stage planned its seeds by (as it
    recorded it: ``allocation.json``)."""
    results = seed_results(records, p)
    return results, (recorded_allocation(records.setup, p) if p.seed_design.pilot_seeds else None)


def language_report(records, p: IsolossPreset) -> tuple[Section, Section, dict]:
    """One language's verdicts and study, and what the replication table reads of it."""
    where = f" — {p.choice.spec}" if p.tag else ""
    section = Section(TITLE + where)
    lead = Section("Verdicts" + where, lead=True, figures_first=True)
    # every seed's unit gated its forks on its own base; headroom.csv shows the first seed's
    results, alloc = run_seeds(records, p)
    seeds = [res["gate"]["seed"] for res in results]
    gates = [res["gate"] for res in results]
    ok = all(g["ok"] for g in gates)
    failed = [g for g in gates if not g["ok"]]
    gate_text = gates[0]["text"] if ok else " ".join(g["text"] for g in failed)
    if ok and len(gates) > 1:
        gate_text += (f" (passed on all {len(gates)} seeds' bases; gate.csv: each seed's; headroom.csv: seed "
                      f"{seeds[0]}'s)")
    headroom_table(section, p, gates[0])
    gate_table(section, p, gates)
    if not ok and p.verdicts.on_no_headroom == "stop":
        for res in results:
            section.runs += res["runs"]
        section.text.append(f"**No headroom: the forks were not run** (the {len(failed)} of {len(gates)} seeds whose "
                            f"base failed the gate), **and no verdict is given.** {gate_text} On this language and "
                            "task the trained encoder cannot be told apart from the references, so no verdict would "
                            "mean anything (set `on_no_headroom=\"mark\"` in the preset to run the forks anyway).")
        lead.text.append(f"**No verdict: no headroom** ({len(failed)} of {len(gates)} seeds' bases failed the gate; "
                         "the headroom table below says by how much).")
        return lead, section, {"language": p.choice.spec, "tag": p.tag, "ok": False, "diffs": [],
                               "tests": [f"{c.name} @ {pt}" for c, pt in p.tests()]}
    pilot = tuple(study_seeds(records.setup, p)[:p.seed_design.pilot_seeds]) if alloc is not None else ()
    design = p.design(headroom=ok, pilot=pilot)
    rows = [r for res in results for r in res["rows"]]
    for res in results:
        section.runs += res["runs"]
    section.rows += rows
    comparisons = {c.name: c for c in (*p.comparisons, HALF_BATCH)}
    tests = p.tests()
    section.text.append(design_text(p, seeds, gate_text, ok))
    accuracies = [(f"{v}_{m}_n{n}", f"probe {v} {m} n={n}") for v, m in ENDPOINTS for n in p.probes.sizes]
    quantities = [key for key, _ in accuracies] + ["trace_fisher"]
    pairs = paired.estimate_pairs(rows, tests, quantities, design)
    diffs = paired.differences(pairs, tests, accuracies, p.primary_key, design)
    half_tests = [(HALF_BATCH, pt) for pt in point_names(p)]
    half = paired.differences(paired.estimate_pairs(rows, half_tests, [p.primary_key, "trace_fisher"], design),
                              half_tests, [(p.primary_key, "primary probe")], p.primary_key, design)
    verdict_table(lead, p, diffs, seeds, ok)
    decided(lead, p, diffs, pairs)
    if alloc is not None:
        from ...stats.allocation import allocation_table

        allocation_table(section, alloc, {f"{r['comparison']} @ {r['point']}": r["n_used"] for r in diffs
                                          if r["family"] == "primary"}, "allocation.csv")
    paired.pairs_table(section, pairs, p.primary_key)
    paired.difference_tables(section, diffs, comparisons)
    sam_controls(section, diffs, half)
    size_table(section, p, rows, pairs, results, design)
    points = point_names(p)
    if len(points) >= 2:
        dose_comparisons = [c for c in p.comparisons if all((c, pt) in tests for pt in points[:2])]
        paired.dose(section, pairs, dose_comparisons, (points[0], points[1]), p.primary_key, design)
    flat = [c for c in p.comparisons if c.recipe in flatness_forks(p) and c.reference == "adamw"]
    if flat:  # flatness as the treatment: accuracy per unit of relative trace change, within seeds
        from ...stats.dose_response import dose_response

        dose_response(section, pairs, flat, [pt for pt in points if all((c, pt) in tests for c in flat)],
                      p.primary_key, design)
    reg = []
    for pt in points:
        reg += paired.regression(section, rows, p.primary_key, pt, regression_without(p), design)
    regression_table(section, reg)
    section.notes.append(paired.HOLM_FAMILIES)
    figures(records, section, p, rows, diffs, results, seeds, lead)
    runtime_notes(section, records.launcher, results, seeds)
    return lead, section, {"language": p.choice.spec, "tag": p.tag, "ok": ok, "diffs": diffs,
                           "tests": [f"{c.name} @ {pt}" for c, pt in tests]}


def decided(section: Section, p: IsolossPreset, diffs: list[dict], pairs: list[dict] = ()) -> list[dict]:
    """The study's answer: per comparison and fork point whether the primary test decided
    (detected, or no effect beyond ±δ), the power of its claim as made (against δ after Holm
    within its family) and, where undecided, how many more seeds its MDE target needs at
    Holm's first step of its family (``allocation.needed_seeds``) at its effective SD."""
    from ...stats.allocation import needed_seeds
    from ...stats.inference import DETECTED, DETECTED_AGAINST, EQUIVALENT

    out = []
    for r in diffs:
        if r["family"] != "primary":
            continue
        decided = r["verdict"] in (DETECTED, DETECTED_AGAINST, EQUIVALENT)
        stein = int(r["pilot_pairs"]) or None  # Stein's test: its spread is the pilot's pairs'
        need = None if decided else needed_seeds(r["sd"], p.seed_design.mde_target, start=max(int(r["n_used"]), 2),
                                                 level=1 - paired.HOLM_LEVEL / int(r["holm_m"]), pilot=stein)
        out.append({"test": f"{r['comparison']} @ {r['point']}", "decided": decided, "verdict": r["verdict"],
                    "family": r["holm_family"], "used": r["n_used"], "mde": r["mde"], "power": r["power"],
                    "more_seeds": math.nan if decided or need is None else max(0, need - int(r["n_used"]))})
    section.files["decided.csv"] = out
    section.answer += answer(p, diffs, out, pairs)
    return out


def answer(p: IsolossPreset, diffs: list[dict], decided_rows: list[dict], pairs: list[dict] = ()) -> list[str]:
    """The study's answer in at most three lines (``Section.answer``): what was decided and
    which way (primary accuracy, with the interval and whether it survives Holm), what is
    open and what it would take, and what a planned design left to the full study."""
    from ...stats.inference import DETECTED, EQUIVALENT

    rows = {f"{r['comparison']} @ {r['point']}": r for r in diffs if r["family"] == "primary"}
    done, open_ = [], []
    for x in decided_rows:
        r = rows[x["test"]]
        interval = f"{fmt(r['mean'])} [{fmt(r['t_low'])}, {fmt(r['t_high'])}] points, n = {r['n_used']}"
        if x["decided"]:
            word = (f"no effect beyond ±{p.verdicts.equivalence_margin:g}" if x["verdict"] == EQUIVALENT
                    else "detected, paper's direction" if x["verdict"] == DETECTED else "detected against the paper")
            holm = f"; Holm: {r['after_holm']}" if r.get("after_holm") else ""
            done.append(f"{x['test']} {word} ({interval}{holm})")
        else:
            why = [q["reason"] for q in pairs if f"{q['comparison']} @ {q['point']}" == x["test"] and not q["used"]]
            open_.append(f"{x['test']} ({_more(x) if r['n_used'] >= 2 else _why_no_pairs(r, why)})")
    if any(str(x["verdict"]).startswith("uninformative") for x in decided_rows):
        return [f"**No verdict: the headroom gate failed** (every verdict of the {len(decided_rows)} comparisons is "
                "uninformative; the headroom table says by how much)."]
    lines = [f"**Decided {len(done)} of {len(decided_rows)}** (primary probe accuracy at one KL): "
             + ("; ".join(done) or "none") + "."]
    if open_:
        lines.append(f"**Open** (seeds for an MDE of {p.seed_design.mde_target:g} points after Holm within its family, "
                     "at the measured effective spread): "
                     + "; ".join(open_) + ".")
    if p.seed_design.left:
        lines.append("**Left to the full study** (`sameloss reproduce isoloss --scale tiny`): "
                     + "; ".join(f"{t} ({why})" for t, why in p.seed_design.left) + ".")
    return lines


def _why_no_pairs(r: dict, reasons: list[str]) -> str:
    """Why a comparison has fewer than two usable pairs: its unused pairs' own reasons (the
    first, and how many more), or that its forks did not run on two seeds."""
    if not r.get("n_pairs"):
        return "no pair: its forks did not run on two seeds"
    first = f": {reasons[0]}" + (f" (and {len(reasons) - 1} more)" if len(reasons) > 1 else "") if reasons else ""
    return f"{r['n_used']} of {r['n_pairs']} pairs usable{first}"


def _more(x: dict) -> str:
    if math.isfinite(x["more_seeds"]):
        return f"MDE {fmt(x['mde'])} with {x['used']} seeds; {int(x['more_seeds'])} more seeds"
    if not math.isfinite(x["mde"]):
        return f"{x['used']} pairs without spread or too few: no MDE"
    return f"MDE {fmt(x['mde'])} with {x['used']} seeds; more than 10,000 seeds"


def point_names(p: IsolossPreset) -> list[str]:
    return [p.point_name(k) for k in sorted(p.fork_points, reverse=True)]
