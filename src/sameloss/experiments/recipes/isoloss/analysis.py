"""The iso-loss study's report, orchestrated: every seed's records read back
(``study.seed_result``), the estimation at each comparison's target KL, the paired
differences and their verdicts (``stats.paired``), flatness by assigned arm
(``stats.dose_response``), the dose and the regression of Fig. 1 within seeds; the answer
(``answer``: one sentence, then the claims decided after Holm, those undecided and those not
tested); the sections and tables they fill are ``report.py``'s and ``tables.py``'s, the
figures ``figures.py``'s. Nothing here trains or measures: it reads the engine's records."""

from __future__ import annotations

import math

from ...reports.claims import fmt
from ...reports.document import Section
from ...stats import paired
from ...stats.dose_response import dose_response
from ...stats.inference import DETECTED, DETECTED_AGAINST, EQUIVALENT
from .design import CONTROLS, ENDPOINTS, HALF_BATCH, TITLE, IsolossPreset, flatness_forks, flatness_weights, \
    language_studies, regression_without
from .figures import figures
from .report import (design_text, flatness_tables, gate_table, headroom_table, prefix_files, replication_section,
                     runtime_notes, sam_controls, size_table, verdict_table)
from .study import seed_results
from .tables import HOLM_FAMILIES, difference_tables, dose_table, margins_table, pairs_table, regression_table

# measured columns estimated at the target beside the accuracies and the trace where every row has
# them: the weight norm and the reparametrisation-invariant (adaptive) trace of the flatness arms
EXTRA_QUANTITIES = ("weight_norm_sq", "adaptive_trace")


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
    from .across import gate_selection
    from .figures import pooled_forest

    pooled_forest(records, rep, [o["tag"] for o in outcomes])
    left = p.seed_design.left
    rep.answer.append("**Not tested here:** " + ("; ".join(f"{t} ({why})" for t, why in left) if left else
                                                "none — the design planned every claim on every language") + ".")

    rep.text.append("The seeds each language ran, and what its gate admitted: "
                    + "; ".join(gate_selection(p.replicate, len(p.seeds))) + ".")
    return [rep, *leads, *sections]


def language_report(records, p: IsolossPreset) -> tuple[Section, Section, dict]:
    """One language's verdicts and study, and what the replication table reads of it."""
    where = f" — {p.choice.spec}" if p.tag else ""
    section = Section(TITLE + where)
    lead = Section("Verdicts" + where, lead=not p.tag, figures_first=True)
    # every seed's unit gated its forks on its own base; headroom.csv shows the first seed's
    results = seed_results(records, p)
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
    tests = p.tests()
    if not ok and p.verdicts.on_no_headroom == "stop":
        for res in results:
            section.runs += res["runs"]
        section.text.append(f"**No headroom: the forks were not run** (the {len(failed)} of {len(gates)} seeds whose "
                            f"base failed the gate), **and no verdict is given.** {gate_text} On this language and "
                            "task the trained encoder cannot be told apart from the references, so no verdict would "
                            "mean anything (set `on_no_headroom=\"mark\"` in the preset to run the forks anyway).")
        # the report's answer where this language is the study; else the first line of its section
        (lead.answer if lead.lead else lead.text).insert(
            0, f"**No verdict: no headroom** ({len(failed)} of {len(gates)} seeds' bases failed the gate; "
               "the headroom table below says by how much).")
        return lead, section, {"language": p.choice.spec, "tag": p.tag, "ok": False, "diffs": [], "pairs": [],
                               "tests": [str(c.key(pt)) for c, pt in tests]}
    design = p.design(headroom=ok)
    rows = [r for res in results for r in res["rows"]]
    for res in results:
        section.runs += res["runs"]
    section.rows += rows
    comparisons = {c.name: c for c in (*p.comparisons, HALF_BATCH)}
    section.text.append(design_text(p, seeds, gate_text, ok))
    accuracies = [(f"{v}_{m}_n{n}", f"probe {v} {m} n={n}") for v, m in ENDPOINTS for n in p.probes.sizes]
    quantities = [key for key, _ in accuracies] + ["trace_fisher"]
    pairs = paired.estimate_pairs(rows, tests, quantities, design)
    diffs = paired.differences(pairs, tests, accuracies, p.primary_key, design)
    points = point_names(p)
    half_tests = [(HALF_BATCH, pt) for pt in points]
    half = paired.differences(paired.estimate_pairs(rows, half_tests, [p.primary_key, "trace_fisher"], design),
                              half_tests, [(p.primary_key, "primary probe")], p.primary_key, design)
    flat = flatness(section, p, rows, design, points)
    verdict_table(lead, p, diffs, seeds, ok)
    decided(lead, p, diffs, pairs, flat)
    margins_table(section, comparisons, [str(c.key(pt)) for c, pt in tests], p.claims)
    pairs_table(section, pairs, p.primary_key)
    difference_tables(section, diffs, comparisons)
    sam_controls(section, diffs, half)
    size_table(section, p, rows, pairs, results, design)
    if len(points) >= 2:
        dose_comparisons = [c for c in p.comparisons if all((c, pt) in tests for pt in points[:2])]
        if dose_comparisons:
            dose_table(section, paired.dose(pairs, dose_comparisons, (points[0], points[1]), p.primary_key, design),
                       (points[0], points[1]))
    reg = [r for pt in points for r in paired.regression(rows, p.primary_key, pt, regression_without(p), design)]
    if reg:
        regression_table(section, reg)
    section.notes.append(HOLM_FAMILIES)
    figures(records, section, p, rows, diffs, results, seeds, lead)
    runtime_notes(section, records.launcher, results, seeds)
    return lead, section, {"language": p.choice.spec, "tag": p.tag, "ok": ok, "diffs": diffs, "pairs": pairs,
                           "tests": [str(c.key(pt)) for c, pt in tests]}


def flatness(section: Section, p: IsolossPreset, rows: list[dict], design: paired.Design,
             points: list[str]) -> dict:
    """Flatness by assigned arm (``stats.dose_response``): the trend over λ and the Wald ratio
    per fork point, the change each arm achieved — in the trace, and in the weight norm and the
    adaptive trace where the arms and AdamW measured them —; their tables
    (``report.flatness_tables``)."""
    arms = [c for c in p.comparisons if c.recipe in flatness_forks(p) and c.reference == "adamw"]
    tests = [(c, pt) for c, pt in p.tests() if c in arms]
    at = [pt for pt in points if any(pt == x for _, x in tests)]
    if not tests:
        return {"trend": [], "changes": [], "points": []}
    mine = [r for r in rows if r["fork"] in {"adamw", *flatness_forks(p)}]
    extra = [k for k in EXTRA_QUANTITIES if all(r.get(k) not in (None, "") for r in mine)]
    pairs = paired.estimate_pairs(rows, tests, [p.primary_key, "trace_fisher", *extra], design)
    margin = max(c.margin for c in arms)
    trend, changes, every = dose_response(pairs, list(dict.fromkeys(c for c, _ in tests)), at, p.primary_key,
                                          design, flatness_weights(p), margin)
    flatness_tables(section, trend, changes, every)
    return {"trend": trend, "changes": changes, "points": every}


# ---- the answer --------------------------------------------------------------------------------
# how the answer names a claim's comparison
NAMES = {"longer": "training longer", "noreg": "removing dropout and weight decay", "sam05": "SAM",
         "sam05-half": "SAM against its half-batch control", "size": "a larger model", "adv": "the adversary",
         "flat": "the flattening arm", "flatter": "the stronger flattening arm", "sharp": "the sharpening arm"}


def decided(section: Section, p: IsolossPreset, diffs: list[dict], pairs: list[dict], flat: dict) -> list[dict]:
    """The study's answer (``answer``) and ``decided.csv``: per test of the primary accuracy
    whether it is decided (a detection or a "no effect beyond ±δ" that survives Holm within its
    family), its power as made and, where undecided, the seeds the rule would plan it
    (``stats.allocation.seeds_to_decide`` at its effective SD and Holm's first step)."""
    from ...stats.allocation import ClaimSpec, seeds_to_decide

    out = []
    for r in (r for r in diffs if r["family"] == "primary"):
        test = str(paired.TestKey.of(r))
        sd = r["sd"]
        need = None
        if not r["decided"] and math.isfinite(sd) and sd > 0:
            spec = ClaimSpec(test, sd, r["margin"], r["effect"], r["comparison"] in CONTROLS)
            need = seeds_to_decide(spec, paired.HOLM_LEVEL / int(r["holm_m"]), start=max(int(r["n_used"]), 2))
        out.append({"test": test, "family": r["holm_family"], "verdict": r["verdict"], "after_holm": r["after_holm"],
                    "decided": r["decided"], "used": r["n_used"], "mean": r["mean"], "low": r["t_low"],
                    "high": r["t_high"], "margin": r["margin"], "mde": r["mde"], "power": r["power"],
                    "power_detect": r["power_detect"], "power_equivalence": r["power_equivalence"],
                    "seeds_needed": math.nan if need is None else need})
    section.files["decided.csv"] = out
    lines = answer(p, diffs, out, pairs, flat)
    if section.lead:
        section.answer += lines
    else:  # one language of several: its answer opens its own section (the pooled one opens the report)
        section.text.insert(0, "  \n".join(lines))
    return out


def _interval(r: dict) -> str:
    return f"{fmt(r['mean'], '+.2f')} [{fmt(r['t_low'], '.2f')}, {fmt(r['t_high'], '.2f')}]"


def _state(r: dict) -> str:
    """A claim's verdict after Holm in words."""
    if r["decided"] and r["verdict"] == EQUIVALENT:
        return f"no effect beyond ±{fmt(r['margin'], 'g')} point{'s' if r['margin'] != 1 else ''}"
    if r["decided"] and r["verdict"] == DETECTED:
        return "detected in the paper's direction"
    if r["decided"] and r["verdict"] == DETECTED_AGAINST:
        return "detected against the paper"
    if r["after_holm"] == "does not survive":
        return f"{r['verdict']} before Holm, not after"
    return "undecided"


def _flatness_clause(p: IsolossPreset, rows: dict, flat: dict) -> str:
    """The answer's clause on flatness as the cause: what the arms did to the trace, and
    whether transfer moved with it."""
    arms = [t for t in rows if t.split(" @ ")[0] in flatness_forks(p) and t in p.claims]
    if not arms:
        return ""
    moved = {c["fork"]: c for c in flat["changes"] if c["point"] == "late"} or \
        {c["fork"]: c for c in flat["changes"]}
    trace = ", ".join(f"{rows[t]['recipe']} {fmt(100 * moved[rows[t]['recipe']]['trace_change'], '+.0f')} %"
                      for t in arms if rows[t]["recipe"] in moved)
    arm_text = "; ".join(f"{rows[t]['recipe']} {_interval(rows[t])} points" for t in arms)
    verdicts = [rows[t] for t in arms]
    if any(r["decided"] and r["verdict"] in (DETECTED, DETECTED_AGAINST) for r in verdicts):
        which = "with" if all(r["verdict"] != DETECTED_AGAINST for r in verdicts if r["decided"]) else "against"
        move = f"and transfer moved {'with it' if which == 'with' else 'against the thesis'}"
    elif all(r["decided"] and r["verdict"] == EQUIVALENT for r in verdicts):
        margin = max(r["margin"] for r in verdicts)
        move = f"but transfer did not move beyond ±{fmt(margin, 'g')} point{'s' if margin != 1 else ''}"
    else:
        move = "and whether transfer moved with it is undecided"
    return f"the trace penalty moved flatness ({trace} trace at the target loss) {move} ({arm_text})"


def answer(p: IsolossPreset, diffs: list[dict], decided_rows: list[dict], pairs: list[dict], flat: dict) -> list[str]:
    """The study's answer (``Section.answer``): one sentence that answers the paper's question
    from this run — flatness as the cause first, then the paper's claims, the positive
    control named as such —, then the claims decided after Holm, those undecided with the
    seeds they would need, and the tests this design did not run. Never a control's null as
    the answer."""
    rows = {str(paired.TestKey.of(r)): r for r in diffs if r["family"] == "primary"}
    if any(str(x["verdict"]).startswith("uninformative") for x in decided_rows):
        return [f"**No verdict: the headroom gate failed** (every verdict of the {len(decided_rows)} comparisons is "
                "uninformative; the headroom table says by how much)."]
    claims = [t for t in rows if t in p.claims] or list(rows)
    clauses = [_flatness_clause(p, rows, flat)]
    for t in claims:
        name = t.split(" @ ")[0]
        if name in flatness_forks(p):
            continue
        r = rows[t]
        what = NAMES.get(name, name) + (" (the positive control)" if name in CONTROLS else "")
        clauses.append(f"{what}, {r['point']}: {_state(r)} ({_interval(r)} points)")
    lines = ["**Answer:** at the same pre-training loss, " + "; ".join(c for c in clauses if c) + "."]
    done = [x for x in decided_rows if x["test"] in claims and x["decided"]]
    lines.append(f"**Decided {len(done)} of {len(claims)} claims** (primary probe accuracy at one KL, after Holm over "
                 f"the {len(claims)}; δ each claim's margin):")
    for x in decided_rows:
        if x["test"] in claims:
            r = rows[x["test"]]
            power = (f"power {fmt(x['power'], '.2f')}" if x["decided"] else
                     f"needs {int(x['seeds_needed'])} seeds" if math.isfinite(x["seeds_needed"]) else
                     _why_no_pairs(r, [q["reason"] for q in pairs if str(paired.TestKey.of(q)) == x["test"]
                                       and not q["used"]]))
            lines.append(f"- {x['test']}: {_state(r)}, {_interval(r)} points, δ {fmt(r['margin'], 'g')}, "
                         f"n = {r['n_used']}, {power}")
    if p.seed_design.left:
        lines.append("**Not tested here** (the design's budget left them out; each with the seeds and minutes it "
                     "would need):")
        lines += [f"- {t}: {why}" for t, why in p.seed_design.left]
    return lines


def _why_no_pairs(r: dict, reasons: list[str]) -> str:
    """Why a comparison has fewer than two usable pairs: its unused pairs' own reasons (the
    first, and how many more), or that its forks did not run on two seeds."""
    if not r.get("n_pairs"):
        return "no pair: its forks did not run on two seeds"
    first = f": {reasons[0]}" + (f" (and {len(reasons) - 1} more)" if len(reasons) > 1 else "") if reasons else ""
    return f"{r['n_used']} of {r['n_pairs']} pairs usable{first}"


def point_names(p: IsolossPreset) -> list[str]:
    return [p.point_name(k) for k in sorted(p.fork_points, reverse=True)]
