"""At the same loss, does the implicit bias decide transfer? Forks of one base run at
matched exact KL and one learning rate — the algorithm, training longer and model size,
each acting from step 0 and late — few-shot probes, paired statistics with stated power.

Command

    sameloss reproduce                              (the main job: scale ``quick``; the same as
                                                     ``sameloss reproduce isoloss``)
    sameloss reproduce isoloss --scale tiny         [--out runs] [--seed N] [--fresh]
        [--launcher inprocess|local|slurm] [--workers N] [--seeds 0-7]
        [--language NAME[:SIZE][:key=value,...] ...]

    (``--seed N`` shifts the preset's seeds by N: an independent replication. Each seed's
    chain — its base run, then the forks — is one unit: ``--launcher local --workers 2``
    runs two seeds at once, ``--seeds 0-7`` only those seeds; see the README's "Running
    on a cluster".)

Runtime per scale (one thread per worker; ``--launcher local --workers N`` runs N seeds at once)

    smoke   ~2 min on a 2-core CPU (3 seeds, micro model, tens of steps; the numbers mean
            nothing)
    quick   ~15 min on 2 idle cores (``sameloss plan`` forecasts it); its design
            (``design.QUICK_PLAN``) is what ``choose_design`` buys for 25 minutes with the
            planner's costs
    tiny    a pilot of 10 seeds, then at most 48 within --budget (180 min by default)
    languages  the study across the registered languages: estimate only (``sameloss plan
            isoloss --scale languages``; about 2 h on 2 idle cores by the planner)
    small   hours on one H100, paper weeks: estimates only (``sameloss plan isoloss --scale
            small --hardware h100``)

    The measured runs, with their dates, machines and loads, and the planner's forecasts:
    ``docs/results/isoloss.md``.

Languages
    ``--language SPEC`` studies another language: ``NAME[:SIZE][:key=value,...]`` with
    ``seed=N`` (another draw of the size's shape), ``task=NAME`` (any task with a span and a
    posterior: an HMM's ``task-k``, a PCFG's ``span-k``; default ``DEFAULT_TASKS``) and any
    other key a constructor setting (``language.params``: ``HMM.random`` / ``PCFG.random``'s
    keywords over the size's own); the size defaults to ``headroom``. The language is built
    when the option is read, so a bad name, setting or task is one line before any file.
    Given several times, each language is a study of its own (its seeds in
    ``seeds/<tag>/``, its files and figures ``<tag>-*``) and the report gives each language's
    verdicts, then the replication table (``replication.replication``: per comparison the random-effects
    pooled verdict with the Hartung–Knapp–Sidik–Jonkman interval first, then each
    language's verdict and how they agree — "2 of 3 languages detect it in the paper's
    direction, 1 inconclusive" — the fixed effect, Cochran's Q, I² and τ²). A language without headroom is stopped by the gate (or marked)
    and counted as uninformative, never pooled. Each choice of languages is its own
    folder (``<out>/isoloss-<scale>-<tags>``; the HMM alone: ``isoloss-<scale>``).
    Every scale studies the HMM by default. The PCFG ``headroom`` size joins the default
    when it passes the gate at ``tiny`` (it has not yet: ``docs/results/pcfg.md``). ``--scale languages`` (``across.py``) is the study
    across the registered languages (``sameloss language search --register``: one file each in
    ``languages/registered/``, named e.g. ``hmm:search-1``, which ``--language`` also takes): their
    primary comparisons in the design ``choose_design`` fixed before the data for 180 minutes on
    2 cores from the pooled MDE (``across.LANGUAGES_PLAN``). Studies run apart (other sessions, machines) are
    combined by ``sameloss replicate FOLDER FOLDER`` (``finished_studies``: the same table,
    read from their files).

What it runs
    Language: the HMM ``headroom`` size (4 states, 8 words, length 8, emission
    concentration 1.0), task ``task-5`` (its hidden state 5, majority ≈ 38 %) — both read
    from the preset (``use``, ``task``) in one place (``_language``), or from ``--language``;
    the second language is the PCFG ``headroom`` size (6 words, 2 levels of 4 symbols,
    sentences of 2-4 words), task ``span-1`` (the symbol over the first word, majority 55 %).
    The probes read the task's span (``Task.span``: one position for an HMM state, the
    first k words for a PCFG's ``span-k``) and the oracle is the latent's true posterior
    (the HMM's hidden states; a PCFG's span symbol from inside–outside). Per seed one base run
    (AdamW, dropout 0.1, WD 0.01, constant lr after the warm-up) to ``base_steps``, and
    forks of it at each fork point k of ``fork_points``: ``late`` (k = ``base_steps``: the
    fork starts from the base's weights, optimiser moments, RNG state and step) and
    ``scratch`` (k = 0: the recipe trains from the run's initial weights — the same seed,
    so the same weights and data stream — the paper's protocol, still paired by seed).
    Every fork then trains its recipe to ``base_steps + recipe_steps`` at the constant lr,
    decays linearly over ``decay_steps`` to ``final_lr_factor`` × lr, and holds that lr
    for ``final_steps`` (its *stretch*; the preset's ``schedule``). Forks: ``adamw`` (the base continued), ``short`` /
    ``long`` (0 / 400 recipe steps: "train longer"), ``noreg`` (−dropout −WD), ``noreg-half``
    (−dropout −WD updating on the half batch SAM updates on: SAM's batch control),
    ``sam05`` / ``sam02`` (−dropout −WD +SAM ρ 0.05 / 0.02), ``adv`` (AdamW + the adversarial
    objective on the preset's task, λ 0.02), ``large`` (the base embedded function-
    preservingly into a larger shape — App. B.4 — with its Adam moments mapped,
    ``models.embed``; asserted: its exact KL at the fork equals the base's to 1e-6; from
    scratch: the large shape's own initial weights, same seed and data), and the flatness
    forks — flatness as the treatment, the loss held fixed (issue 38; not in the paper):
    ``sharp`` / ``flat`` / ``flatter`` (AdamW + λ × the Fisher trace of each step's batch
    slice, ``training.flatness``, λ −1e-4 / 2e-4 / 3e-4: ``FLATNESS_TINY``, calibrated at
    tiny to move the trace at the target KL by +27 / −26 / −32 % against ``adamw``), each
    compared with ``adamw`` and together giving the dose-response (``dose_response.dose_response``:
    the paired accuracy difference per unit of relative trace change, one line through the
    origin pooled over every seed's forks, jackknife over seeds).
    Forks per scale (the budget's choice at ``quick``/``tiny``: a 2×
    wider model costs 4× per step, and the size forks were 45 % of a seed's training
    FLOPs by ``sameloss plan``): ``small``/``paper``/``smoke`` run every fork above with
    ``large`` 2× wider and one more block; ``quick``/``tiny`` drop ``sam02``, fork ``adv``
    late only (``Fork.late_only``; its comparison is exempt from the MDE target) and make
    ``large`` two more blocks at the same width (2 → 4 blocks, 106 k → 206 k parameters).
    The flatness forks run at ``quick``/``tiny`` (their λ's scale) and, ``sharp`` only, at
    ``smoke`` (the plumbing: the penalty's steps are dear, and ``sharp`` and ``flat`` together
    made the smoke study half as long again); ``small``/``paper`` leave them out until
    calibrated (``bench/calibrate_flatness.py``): another model has another trace scale.
    ``adamw``, ``short`` and ``long`` are the base's own recipe until their decay, so their
    forks at every point are the late ones (one run each).
    Headroom gate, before any fork: in each seed's unit its base is probed beside its
    random-init encoder, the look-up table (true conditionals) and the oracle (true
    posteriors); that seed's forks run only if the trained encoder is ≥
    ``verdicts.headroom_margin`` points above the look-up table and the random-init encoder
    and as far below the oracle (primary endpoint). If any seed fails, the study gives no
    verdict (``verdicts.on_no_headroom="stop"``: the failing seeds ran no fork) or marks
    every verdict "uninformative: no headroom" (``"mark"``: every seed's forks run).
    The same loss, estimated: every fork's KL is evaluated on one shared held-out set at its
    candidates (every ``schedule.match_every`` steps of its stretch, all at the final lr
    factor); each fork is measured (trace and probes) at ``schedule.probe_points`` of them
    spread over the stretch. Per comparison and seed one target KL, from the two forks' measured KL
    ranges alone (``paired.comparison_target``: the middle of their overlap, or of the gap
    between them); each fork's accuracy and trace estimated *at* the target by the
    least-squares line of the quantity on KL through its own checkpoints
    (``paired.at_target``) — a line per seed and fork; linear because along one stretch at
    one lr KL moves by about 1e-3 nats and the quantities move smoothly with it. Each pair
    weighs by the variance its KL positions imply (the lines' leverage at the target:
    ``weighted``), the comparison's estimate the weighted mean with a random-effects (HKSJ)
    interval; a KL slope common to both forks only where the ranges touch and the slopes
    test equal. Every pair is used unless a fork's target lies more than
    ``verdicts.extrapolation_limit`` × its own measured KL range outside it (named in the
    report with its reason); the earlier rule — keep a pair only where the forks landed within
    ``kl_tolerance`` of each other — survives only as the sensitivity row beside each result
    (selecting on where a fork's KL landed conditions on a post-treatment variable). Why
    the stretch: at the end of a shared decay the forks' KLs spread, so matching there would
    compare forks at different lrs; along the stretch at the final lr KL keeps falling
    smoothly, and forks whose floors differ (SAM's sits higher) get a longer stretch
    (``Fork.final_steps``) so that the compared ranges overlap.
    Transfer: linear probes on the frozen representation at the task's position (primary)
    and on all positions concatenated (the paper's, secondary), trained on subsets of n =
    ``probes.sizes`` examples drawn per seed (the same for the seed's forks: pairs stay
    paired; another draw per seed: the intervals cover the draw) and tested on one test set:
    a converged convex probe (L-BFGS, the primary) and the paper's fixed-budget AdamW probe.
    Statistics (``paired``): per comparison and fork point the precision-weighted paired
    difference at the target across seeds (HKSJ and bootstrap 95 % intervals; the MDE at
    80 % power from the noncentral t; p raw and Holm-adjusted within each family — the
    primary family the preset's ``claims``, fixed before the data, the seeds planned for
    their power after Holm; the power of each claim as made); verdicts "detected" (in the
    paper's direction / against it: the 95 % interval excludes 0), "no effect beyond ±δ"
    (TOST at α = 0.05 per side: the 90 % interval inside ±δ; δ fixed here:
    ``verdicts.equivalence_margin`` points for accuracies, ``verdicts.trace_margin`` × the
    reference's mean trace for traces), "inconclusive", "degenerate"; the dose (the effect
    from scratch minus late, per seed); the size contrast with traces in one parameter space (the small fork's
    checkpoints embedded into the large shape); Fig. 1 as a within-seed regression of
    accuracy on trace and KL (one row per fork, seed fixed effects, cluster bootstrap over
    seeds).

Expected result (paper)
    At the same loss: training longer lowers the trace and raises accuracy (Fig. 2, 4);
    −dropout−WD raises the trace and lowers accuracy, SAM recovers both (Table 1, 2); the
    adversarial objective lowers accuracy (Table 1); larger models are flatter and
    transfer better (Fig. 3, 5); across models, flatter means better transfer (Fig. 1): a
    negative slope of accuracy on trace at fixed loss.

Deviations
    The paper trains at a constant lr and compares checkpoints at equal loss; every fork
    here ends with the same decay and stretch at the final lr (the candidates' lr), so
    "same loss" is matched at one learning rate. The AdamW probe has no validation split in
    a few-shot design: it keeps its last epoch. No few-shot fine-tuning (the probes are the
    endpoints). The size contrast is one step of a 0.1M model: two more blocks at the same
    width at ``quick``/``tiny``, 2× wider and one more block at ``smoke``/``small``/``paper``.

The package, one room each: ``design.py`` (the preset, forks, comparisons, the language
choice), ``settings.py`` (the preset's settings, grouped), ``study.py`` (the runs, the seed unit with its gate, the declaration),
``allocation.py`` (the stage after the pilot, the budget's forecast), ``analysis.py``
(estimation, differences and verdicts, orchestrated), ``report.py`` (sections and
tables, the replication table), ``figures.py`` (the three figures; ``forest_label`` names a forest row).
"""

from __future__ import annotations

# (the registry reads SUMMARY from this file: ``sameloss reproduce --help`` imports nothing)
SUMMARY = ("forks of one base run at matched KL and one lr (algorithm, longer, size; from scratch and late), "
           "few-shot probes, paired differences with power (Fig. 1)")

from .allocation import allocation_of, forecast, plan_notes  # noqa: E402
from .analysis import language_report, report, run_seeds  # noqa: E402
from .design import (COMPARISONS, EMBED_KL_TOLERANCE, ENDPOINTS, FLATNESS_TINY, HALF_BATCH,  # noqa: E402
                     MEASURED, MEASURED_RUNTIMES, NOREG, PRESETS, QUICK_BUDGET_MINUTES, QUICK_LEFT, QUICK_PLAN, TITLE, Fork, IsolossPreset, _forks, flatness_forks,
                     folder_suffix, forks_of, language_studies, regression_without, stretches,
                     with_budget, with_even, with_languages)
from .across import LANGUAGES_PLAN, languages_preset, registered_choices  # noqa: E402
from .figures import forest_label  # noqa: E402
from .language import DEFAULT_TASKS, LanguageChoice, parse_language, task_span  # noqa: E402
from .report import finished_studies, replication_section  # noqa: E402
from .study import (all_seeds, base_run, fork_run, headroom_gate, large_shape, runs, seed_result,  # noqa: E402
                    seed_study, study_seeds, units)

# the study across the registered languages (``across``): its design pinned there, its languages
# read from ``languages/registered/`` when the recipe is imported
PRESETS["languages"] = languages_preset()

__all__ = ["COMPARISONS", "LANGUAGES_PLAN", "DEFAULT_TASKS", "EMBED_KL_TOLERANCE", "ENDPOINTS", "FLATNESS_TINY", "HALF_BATCH",
           "MEASURED", "MEASURED_RUNTIMES", "NOREG", "PRESETS", "QUICK_BUDGET_MINUTES", "QUICK_LEFT", "QUICK_PLAN", "SUMMARY", "TITLE", "Fork", "IsolossPreset", "LanguageChoice", "all_seeds",
           "allocation_of", "base_run", "finished_studies", "flatness_forks", "folder_suffix", "forecast", "forest_label", "fork_run",
           "forks_of", "headroom_gate", "language_report", "language_studies", "languages_preset", "large_shape", "parse_language", "plan_notes",
           "registered_choices", "regression_without", "replication_section", "report", "run_seeds", "runs", "seed_result", "seed_study",
           "stretches", "study_seeds", "task_span", "units", "with_budget", "with_even", "with_languages"]
