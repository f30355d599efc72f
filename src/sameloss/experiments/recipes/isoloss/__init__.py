"""At the same loss, does the implicit bias decide transfer? Forks of one base run at
matched exact KL and one learning rate — training longer, less regularisation, SAM, model
size, the adversary and a trace penalty that makes flatness itself the treatment — each
acting late or from step 0, few-shot probes, paired statistics with stated power.

Command

    sameloss reproduce                      (the main job: ``isoloss --scale quick``)
    sameloss reproduce isoloss --scale tiny [--budget MINUTES] [--launcher local --workers 2]
    sameloss reproduce isoloss --scale languages        (the registered languages, pooled)
    sameloss plan isoloss --scale SCALE                 (what a scale decides, and what it costs)

Scales: ``quick`` and ``tiny`` are designs fixed before the data by the claims-first rule
(``allocation.choose_design``) for a budget on 2 cores — 25 and 180 minutes —, ``languages``
the same rule across the registered languages, ``pilot`` the run that measured the prior
paired SDs those designs read (on seeds none of them runs), ``smoke`` the pipeline in
minutes (its numbers mean nothing), ``small``/``paper`` every fork on every seed at GPU
sizes. ``sameloss plan`` prints first which claims a scale is expected to decide, and at
what power.

Runtime: ``sameloss plan isoloss --scale SCALE`` forecasts it; each measured run, with its
date, machine and load, is in ``docs/results/isoloss.md`` (from its record in ``docs/records/``).

Expected result (paper): at the same loss, training longer lowers the trace and raises
accuracy (Fig. 2, 4); −dropout−WD raises the trace and lowers accuracy and SAM recovers both
(Tables 1, 2); the adversarial objective lowers accuracy (Table 1: the positive control);
larger models are flatter and transfer better (Fig. 3, 5); flatter means better transfer
(Fig. 1), here tested as a treatment by assigned arm.

How the study works — the forks, the same loss estimated at one target KL, the margins from
the paper's effects, the verdicts, Holm, the pooling across languages — is
``docs/explanation/isoloss.md`` and ``docs/explanation/verdicts.md``. The package, one room
each: ``design.py`` (presets, forks, comparisons and their margins, claims, priors, pinned
designs), ``settings.py`` (the preset's settings, grouped), ``language.py`` (the language
studied), ``study.py`` (the runs and units of a seed), ``allocation.py`` (the claims-first
rule, ``--budget``, ``plan``'s forecast), ``analysis.py`` (estimation, verdicts and the
answer, orchestrated), ``report.py`` and ``tables.py`` (sections and tables), ``figures.py``
(the figures), ``across.py`` (the languages scale).
"""

from __future__ import annotations

# (the registry reads SUMMARY from this file: ``sameloss reproduce --help`` imports nothing)
SUMMARY = ("forks of one base run at matched KL and one lr (longer, regularisation, SAM, size, the adversary, a "
           "flatness penalty), few-shot probes, claims decided at the paper's effect sizes (Fig. 1)")

from .allocation import choose_design, plan_notes, with_budget  # noqa: E402
from .analysis import language_report, report  # noqa: E402
from .design import (CLAIMS, COMPARISONS, CONTROLS, EMBED_KL_TOLERANCE, ENDPOINTS, FLATNESS_TINY,  # noqa: E402
                     HALF_BATCH, MEASURED, MEASURED_RUNTIMES, NOREG, PILOT_SEEDS, PRESETS, PRIOR_SDS, PRIOR_SOURCE,
                     QUICK_BUDGET_MINUTES, QUICK_LEFT, QUICK_PLAN, TINY_BUDGET_MINUTES, TINY_LEFT, TINY_PLAN, TITLE,
                     Fork, IsolossPreset, flatness_forks, flatness_weights, folder_suffix, forks_of,
                     language_studies, regression_without, stretches, with_languages)
from .across import LANGUAGES_PLAN, languages_preset, registered_choices  # noqa: E402
from .figures import forest_label  # noqa: E402
from .language import DEFAULT_TASKS, LanguageChoice, parse_language, task_span  # noqa: E402
from .report import finished_studies, replication_section  # noqa: E402
from .study import (all_seeds, base_run, fork_run, headroom_gate, large_shape, runs, seed_result,  # noqa: E402
                    seed_study, study_seeds, units)



class _Presets(dict):
    """The scales' presets, the study across the registered languages (``across``) built when it
    is first asked for: its languages are read from ``languages/registered/``, so a damaged record
    stops that scale alone, not every isoloss command."""

    def __missing__(self, scale: str):
        if scale != "languages":
            raise KeyError(scale)
        self[scale] = languages_preset()
        return self[scale]

    def __contains__(self, scale) -> bool:
        return scale == "languages" or super().__contains__(scale)

    def __iter__(self):
        return iter([*super().__iter__(), *(() if super().__contains__("languages") else ("languages",))])


PRESETS = _Presets(PRESETS)

__all__ = ["CLAIMS", "COMPARISONS", "CONTROLS", "DEFAULT_TASKS", "EMBED_KL_TOLERANCE", "ENDPOINTS", "FLATNESS_TINY",
           "HALF_BATCH", "LANGUAGES_PLAN", "MEASURED", "MEASURED_RUNTIMES", "NOREG", "PILOT_SEEDS", "PRESETS",
           "PRIOR_SDS", "PRIOR_SOURCE", "QUICK_BUDGET_MINUTES", "QUICK_LEFT", "QUICK_PLAN", "SUMMARY",
           "TINY_BUDGET_MINUTES", "TINY_LEFT", "TINY_PLAN", "TITLE", "Fork", "IsolossPreset", "LanguageChoice",
           "all_seeds", "base_run", "choose_design", "finished_studies", "flatness_forks", "flatness_weights",
           "folder_suffix", "forest_label", "fork_run", "forks_of", "headroom_gate", "language_report",
           "language_studies", "languages_preset", "large_shape", "parse_language", "plan_notes", "registered_choices",
           "regression_without", "replication_section", "report", "runs", "seed_result", "seed_study", "stretches",
           "study_seeds", "task_span", "units", "with_budget", "with_languages"]
