"""The study across languages: ``sameloss reproduce isoloss --scale languages`` runs the claims
on the headroom HMM and every registered language (``found``: the languages ``sameloss language
search --register`` found, one file each in ``languages/registered/``) and pools them by the
pre-registered stratified fixed-effects model (``stats.replication``).

Its design was fixed before any data by the rule of every scale (``allocation.choose_design``:
claims first, each planned to be decided with 80 % power after Holm over the claims, at its
margin, pooled over the languages), from the pilot's prior paired SDs (assumed the same on
every language), the planner's cost of a seed (every language trains the same model on the
same schedule) and a budget of ``LANGUAGES_BUDGET_MINUTES`` on 2 workers; a test checks that the
rule still chooses ``LANGUAGES_PLAN`` (registering another language re-pins it). ``sameloss plan
isoloss --scale languages`` prints what it is expected to decide and what it costs.
"""

from __future__ import annotations

import dataclasses

from .design import TINY_DESIGN, IsolossPreset, _preset, planned
from .language import DEFAULT_TASKS, LanguageChoice

LANGUAGES_BUDGET_MINUTES = 180.0
LANGUAGES_WORKERS = 2
# ``choose_design(tiny, planned_costs(...), 180 min, 2 workers, languages=4)``, pinned before any
# data (tests/experiments/test_isoloss_across.py checks it): per test the seeds each language
# runs; the tests it leaves out, with what each would need
LANGUAGES_PLAN: tuple[tuple[str, int], ...] = (
    ('longer @ late', 3),
    ('noreg @ late', 3),
    ('sam05 @ late', 3),
    ('sam05-half @ late', 3),
    ('adv @ late', 7),
    ('size @ late', 3),
    ('flat @ late', 3),
    ('flatter @ late', 3),
    ('sharp @ late', 3),
    ('noreg @ scratch', 3),
    ('sam05 @ scratch', 3),
    ('sam05-half @ scratch', 3),
    ('size @ scratch', 3),
)
LANGUAGES_LEFT: tuple[tuple[str, str], ...] = ()
# the headroom HMM (the main job's language) joins the registered ones; its seeds are the study's
HEADROOM = LanguageChoice("hmm", "headroom", DEFAULT_TASKS["hmm"])


def registered_choices(folder=None) -> tuple[LanguageChoice, ...]:
    """The registered languages as the study names them (each labelled with its name: its folders
    and files are ``hmm-search-1``'s; its seeds those whose base passed its recorded gate: a study
    stops a language any of whose seeds fails the gate, and the gate's seeds are the study's),
    read from their records without building them."""
    from ....found import registered, settings_of, task_of

    out = []
    for found in registered(folder).values():
        name, size, seed, params = settings_of(found.spec)
        task = task_of(found.spec) or DEFAULT_TASKS.get(name)
        passed = tuple(int(r["seed"]) for r in found.gate if r["ok"])
        out.append(LanguageChoice(name, size, task, seed, params, found.name, passed))
    return tuple(out)


def gate_selection(choices: tuple[LanguageChoice, ...], seeds: int) -> list[str]:
    """What the registration gates admitted, stated: per registered language the seeds its
    recorded gate passed and those the study runs (the first ``seeds`` of them)."""
    from ....found import registered

    found = {f.name: f for f in registered().values()}
    out = []
    for c in choices:
        if c.label in found:
            gate = found[c.label].gate
            failed = [int(r["seed"]) for r in gate if not r["ok"]]
            out.append(f"{c.label}: its registration gated seeds {min(int(r['seed']) for r in gate)}–"
                       f"{max(int(r['seed']) for r in gate)}, {len(gate) - len(failed)} of {len(gate)} passed"
                       + (f" (not {', '.join(map(str, failed))})" if failed else "")
                       + f"; the study runs the first {min(seeds, len(c.seeds))}: {', '.join(map(str, c.seeds[:seeds]))}")
        else:
            out.append(f"{c.tag}: no registration gate; the study's own gate on each of its seeds")
    return out


def across(p: IsolossPreset, choices: tuple[LanguageChoice, ...]) -> IsolossPreset:
    """``p`` on every language of ``choices``: a study of each, pooled (one: its own study)."""
    if len(choices) >= 2:
        return dataclasses.replace(p, replicate=choices)
    return p.on(choices[0], choices[0].tag) if choices else p


def languages_preset(choices: tuple[LanguageChoice, ...] | None = None, plan: tuple = LANGUAGES_PLAN,
                     left: tuple = LANGUAGES_LEFT, scale: str = "tiny", settings: dict | None = None) -> IsolossPreset:
    """The languages scale: tiny's design cut to ``plan`` on the headroom HMM and every registered
    language (``choices``, ``scale`` and ``settings``: another set or scale, e.g. smoke's for a
    check of the pipeline)."""
    choices = (HEADROOM, *registered_choices()) if choices is None else choices
    settings = TINY_DESIGN if settings is None else settings
    p = planned(scale, settings, plan, left, LANGUAGES_BUDGET_MINUTES) if plan else _preset(scale, **settings)
    return across(p, choices)


__all__ = ["HEADROOM", "LANGUAGES_BUDGET_MINUTES", "LANGUAGES_LEFT", "LANGUAGES_PLAN", "LANGUAGES_WORKERS", "across",
           "gate_selection", "languages_preset", "registered_choices"]
