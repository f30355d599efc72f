"""Reproduce the paper's results, one recipe per result (``sameloss reproduce``).

``reproduce(experiment, scale)`` trains the runs of a recipe (or reuses / resumes them),
measures their checkpoints (cached), and writes ``<out>/<experiment>-<scale>/``:
``report.md`` (what was run, tables with error bars, figures, and for each claim of the
paper what this run measured and whether the direction agrees), ``results.csv`` (one
row per model), ``runs.csv``, the figures (``*.png``, 200 dpi, or PDF / SVG) each with
``<figure>.data.csv`` (its plotted numbers) and the run folders under ``runs/``.

Recipes: one module each in ``recipes/``, found from its file (``sameloss.registry``;
plugins add more), each checked when loaded against what a recipe is (``recipe.py``: its
attributes and optional hooks, declared once): ``steps`` (Fig. 2/4), ``sizes`` (Fig.
3/5), ``algorithms`` (Tables 1–2), ``figure1`` (Fig. 1: all of them together, with rank
correlations), ``isoloss`` (the decisive test: forks of one base run at matched KL, paired statistics with stated power),
``text`` (real text), ``theory`` (Lemma 3.2, Theorem 3.3), ``dyck`` (Theorem 5.1).
Scales: ``smoke`` (the pipeline only: seconds to minutes on a CPU, its numbers mean nothing),
``tiny`` (the CPU scale: minutes to hours), ``small`` and ``paper`` (GPU); ``sameloss plan``
forecasts each. A recipe's settings at one scale are its preset (``PRESETS[scale]``, typed:
``presets/common.py``).

Where things are, one sub-package a part: ``engine/`` (``orchestrate.py``: ``reproduce``,
the job, its options, the shard and the dry run; ``recipe.py``: what a recipe is;
``declare.py`` / ``walk.py``: the study as data, and its one engine; ``core.py``: the
``Study`` under the engine; ``plan.py``: its cost), ``stats/`` (estimates, tests, power,
pooling), ``reports/`` (the report, its tables and figures), ``presets/`` (what recipes
share), ``recipes/`` (one per result), ``search/`` (``sameloss language search``). This
``__init__`` only re-exports.

Declarations, the engine and launchers: a recipe's ``units(setup, preset)`` declares its
study (``engine/declare.py``: the parts that can run apart — one run, or a seed's chain —, each a
list of runs, forks, embeddings, measures and gates, and the stages declared from earlier
results); the engine (``engine/walk.py``) runs them through a launcher (``engine/launch.py``: in this
process — the default —, in local worker processes sharing the GPUs, or as a Slurm job array),
and the recipe's ``report(records, preset)`` is written from what they trained and
measured (``engine.Records``: it trains and measures nothing). ``sameloss plan`` walks the
same declaration (``engine/plan.py``). ``seeds=[...]`` runs only those seeds' units of a study
that has them (isoloss) and writes no report: shards of one study, in any number of
processes at once; a later call without ``seeds`` reuses every finished seed, runs the
missing ones, and reports.

Locks (``files.folder_lock``): the process that writes the experiment's own files
(report, ``results.csv``) holds the experiment folder; every unit holds its own folder
(``seeds/seed<N>`` or ``runs/<run>``), so shards on different seeds run at once and two
on the same seed cannot.
"""

from __future__ import annotations

from .engine.orchestrate import (ACROSS_SCALE, DEFAULT_EXPERIMENT, DEFAULT_SCALE, MAIN_SCALE, experiments, main_job,
    reproduce, reproduce_command)
from .engine.recipe import SCALE_NAMES

__all__ = ["ACROSS_SCALE", "DEFAULT_EXPERIMENT", "DEFAULT_SCALE", "MAIN_SCALE", "SCALE_NAMES", "experiments", "main_job", "reproduce",
           "reproduce_command"]
