"""The study across languages (issue 48): ``sameloss reproduce isoloss --scale languages`` runs
the primary comparisons on every registered language (``found``: the languages
``sameloss language search --register`` found, one file each in ``languages/registered/``) and
pools them (``replication``: per comparison the HKSJ random-effects estimate, its interval, MDE,
τ², I² and each language's agreement).

Its design was fixed before any data, as quick's was: ``allocation.choose_design`` with tiny's
prior paired SDs (``TINY_PRIOR_SDS``), the planner's cost of a seed (``planned_costs``, the tiny
HMM's: every registered language trains the same model on the same schedule), a budget of
``LANGUAGES_BUDGET_MINUTES`` on 2 workers, and for each test the fewest seeds per language whose
pooled MDE (``pooling.pooled_mde``, spread ``LANGUAGES_TAU`` between languages) reaches the MDE
target; a test checks that the rule still chooses ``LANGUAGES_PLAN`` for the registered
languages (registering another re-pins it). ``sameloss plan isoloss --scale languages`` prices it.
"""

from __future__ import annotations

import dataclasses

from .design import TINY_DESIGN, IsolossPreset, _preset, planned
from .language import DEFAULT_TASKS, LanguageChoice

LANGUAGES_BUDGET_MINUTES = 180.0
LANGUAGES_WORKERS = 2
# the spread of the true effects between languages the design plans its pooled MDE at: none (the
# report's τ² says how far that held; at τ = 0.1 point no number of seeds reaches 0.35 on 3 languages:
# the pooled MDE of the HKSJ test on 2 degrees of freedom stays above 0.31)
LANGUAGES_TAU = 0.0
# ``choose_design(PRESETS["tiny"], planned_costs(...), 180 min, 2 workers, SeedRule(languages=3, tau=0))``,
# pinned before any data (tests/experiments/test_isoloss_across.py checks it): per test the seeds
# each language runs; the tests it leaves out, with what they would need
LANGUAGES_PLAN = (("noreg @ late", 4), ("sam05 @ late", 3), ("sam05-half @ late", 3), ("adv @ late", 4),
                  ("size @ late", 10), ("sam05-half @ scratch", 14))
LANGUAGES_LEFT = (
    ("longer @ late", "27 seeds a language × 3 languages (prior SD 0.549): beyond the budget"),
    ("flat @ late", "no prior paired SD to plan with (the full study's pilot measures it)"),
    ("flatter @ late", "no prior paired SD to plan with (the full study's pilot measures it)"),
    ("sharp @ late", "no prior paired SD to plan with (the full study's pilot measures it)"),
    ("noreg @ scratch", "48 seeds a language × 3 languages (prior SD 0.736): beyond the budget"),
    ("sam05 @ scratch", "19 seeds a language × 3 languages (prior SD 0.455): beyond the budget"),
    ("size @ scratch", "39 seeds a language × 3 languages (prior SD 0.669): beyond the budget"),
    ("flat @ scratch", "no prior paired SD to plan with (the full study's pilot measures it)"),
    ("flatter @ scratch", "no prior paired SD to plan with (the full study's pilot measures it)"),
)


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


def across(p: IsolossPreset, choices: tuple[LanguageChoice, ...]) -> IsolossPreset:
    """``p`` on every language of ``choices``: a study of each, pooled (one: its own study)."""
    if len(choices) >= 2:
        return dataclasses.replace(p, replicate=choices)
    return p.on(choices[0], choices[0].tag) if choices else p


def languages_preset(choices: tuple[LanguageChoice, ...] | None = None, plan: tuple = LANGUAGES_PLAN,
                     left: tuple = LANGUAGES_LEFT, scale: str = "tiny", settings: dict | None = None) -> IsolossPreset:
    """The languages scale: tiny's design cut to ``plan`` on every registered language (``choices``,
    ``scale`` and ``settings``: another set or scale, e.g. smoke's for a check of the pipeline)."""
    choices = registered_choices() if choices is None else choices
    p = planned(scale, TINY_DESIGN if settings is None else settings, plan, left) if plan else \
        _preset(scale, **(TINY_DESIGN if settings is None else settings))
    return across(p, choices)


__all__ = ["LANGUAGES_BUDGET_MINUTES", "LANGUAGES_LEFT", "LANGUAGES_PLAN", "LANGUAGES_TAU", "LANGUAGES_WORKERS",
           "across", "languages_preset", "registered_choices"]
