"""Reproduce the paper's results, one recipe per result: ``sameloss reproduce``, ``plan`` and
``replicate`` (what each writes and how to run it: docs/tour.md; where every part lives:
docs/reference/layout.md).

``reproduce(Job(experiment, scale), Options())`` runs one recipe at one scale: its study
declared (the recipe's ``units``), run stage by stage by the one engine through a launcher,
and reported from what the engine recorded. One sub-package a part: ``engine/`` (the job and
its options, what a recipe is and declares, the walk, the ``Study``, the launchers, the
plan), ``stats/`` (estimates, tests, power, pooling), ``reports/`` (the report, its tables
and figures), ``presets/`` (what recipes share), ``recipes/`` (one per result; plugins add
more: ``sameloss.registry``), ``search/`` (``sameloss language search``). This ``__init__``
only re-exports.
"""

from __future__ import annotations

from .engine.orchestrate import (ACROSS_SCALE, DEFAULT_EXPERIMENT, DEFAULT_SCALE, MAIN_SCALE, Job, Options, experiments,
    main_job, reproduce)
from .engine.recipe import SCALE_NAMES

__all__ = ["ACROSS_SCALE", "DEFAULT_EXPERIMENT", "DEFAULT_SCALE", "Job", "MAIN_SCALE", "Options", "SCALE_NAMES", "experiments",
           "main_job", "reproduce"]
