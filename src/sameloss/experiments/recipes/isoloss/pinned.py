"""What the pilot measured and the designs pinned from it, before any study's data: written by
``scripts/isoloss_priors.py`` (the priors and the forks measured at 5 checkpoints, from the pilot's
folder) and ``scripts/isoloss_designs.py`` (the plans ``allocation.choose_design`` makes
from them at each budget; ``tests/experiments/test_allocation.py`` checks the rule still chooses
them). ``design.py`` reads them; nothing here is typed by hand."""

from __future__ import annotations

# The forks whose target must lie outside their measured KL range in many pairs (the pilot:
# scripts/isoloss_priors.py), measured at 5 checkpoints of their stretch instead of 3 — enough to
# test their line for curvature; the others at the schedule's 3
CHECKPOINTS: dict[str, int] = {'noreg': 5, 'sam05': 5}

# The pilot that measures the designs' prior paired SDs (``sameloss reproduce isoloss --scale pilot``):
# tiny's schedule, every fork of a claim and of the other comparisons (the flattening arms late only:
# from scratch they are no test of the design's), 5 checkpoints each, on seeds 900-905 — disjoint from
# every scale's seeds, so no study re-runs the seeds whose spread planned it
PILOT_SEEDS = tuple(range(900, 906))
PRIOR_SOURCE = ("the pilot (`sameloss reproduce isoloss --scale pilot`: seeds 900–905 of the HMM headroom language, "
                "every fork, 5 checkpoints each; 2026-11-29, 70 min on 2 local workers; docs/results/isoloss.md)")
# that pilot's effective paired SDs of the primary accuracy (points) at the target KL
PRIOR_SDS = (
    ('longer @ late', 0.384),  # n = 6, estimate +0.16 [-0.24, 0.56]
    ('noreg @ late', 0.133),  # n = 6, estimate +0.13 [-0.01, 0.27]
    ('sam05 @ late', 0.292),  # n = 6, estimate -0.23 [-0.54, 0.08]
    ('sam05-half @ late', 0.053),  # n = 6, estimate -0.02 [-0.07, 0.04]
    ('adv @ late', 2.609),  # n = 6, estimate -7.79 [-10.53, -5.05]
    ('size @ late', 0.305),  # n = 6, estimate +0.01 [-0.31, 0.33]
    ('flat @ late', 0.161),  # n = 6, estimate +0.04 [-0.13, 0.21]
    ('flatter @ late', 0.232),  # n = 6, estimate +0.05 [-0.20, 0.29]
    ('sharp @ late', 0.098),  # n = 6, estimate -0.06 [-0.17, 0.04]
    ('noreg @ scratch', 0.380),  # n = 6, estimate +0.00 [-0.40, 0.40]
    ('sam05 @ scratch', 0.343),  # n = 4, estimate -0.69 [-1.24, -0.15]
    ('sam05-half @ scratch', 0.259),  # n = 6, estimate -0.25 [-0.52, 0.02]
    ('size @ scratch', 0.466),  # n = 6, estimate +0.24 [-0.25, 0.73]
)

# The main job's and tiny's designs (``QUICK_BUDGET_MINUTES``, ``TINY_BUDGET_MINUTES`` in design.py)
QUICK_PLAN: tuple[tuple[str, int], ...] = (
    ('noreg @ late', 4),
    ('adv @ late', 6),
    ('flat @ late', 4),
    ('flatter @ late', 4),
    ('sharp @ late', 3),
    ('noreg @ scratch', 5),
)
QUICK_LEFT: tuple[tuple[str, str], ...] = (
    ('longer @ late', '6 seeds, +7 min: beyond the budget'),
    ('sam05-half @ scratch', '6 seeds, +10 min: beyond the budget'),
    ('size @ scratch', '6 seeds, +11 min: beyond the budget'),
)
TINY_PLAN: tuple[tuple[str, int], ...] = (
    ('longer @ late', 6),
    ('noreg @ late', 4),
    ('sam05 @ late', 7),
    ('sam05-half @ late', 3),
    ('adv @ late', 7),
    ('size @ late', 5),
    ('flat @ late', 4),
    ('flatter @ late', 4),
    ('sharp @ late', 3),
    ('noreg @ scratch', 6),
    ('sam05 @ scratch', 8),
    ('sam05-half @ scratch', 6),
    ('size @ scratch', 7),
)
TINY_LEFT: tuple[tuple[str, str], ...] = ()
