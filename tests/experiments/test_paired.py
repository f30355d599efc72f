"""The dose-response estimator of the flatness forks (``paired.dose_response``) on
synthetic pairs with a known slope."""

from __future__ import annotations

import numpy as np
import pytest

from sameloss.experiments import paired
from sameloss.experiments.paired import Comparison, Design, dose_points, dose_response, within_seed_slopes
from sameloss.experiments.report import Section
from sameloss.experiments.stats import DETECTED, DETECTED_AGAINST

FLAT = [Comparison(name, name, "adamw", +1, "") for name in ("flat", "sharp", "flatter")]
DESIGN = Design(margin=0.35, trace_margin=0.05, limit=1e-3, tolerance=3e-4)


def _pairs(slope, seeds, noise, rng, point="late", changes=(-0.25, 0.27, -0.32)):
    """Pairs as ``estimate_pairs`` writes them: the reference's trace varies by seed, each
    fork's relative change by seed and fork around ``changes``, the accuracy difference
    (a fraction) = slope × change / 100 + noise (points / 100)."""
    out = []
    for seed in seeds:
        ref = 90 + 5 * rng.standard_normal()
        for c, change in zip(FLAT, changes):
            x = change + 0.03 * rng.standard_normal()
            y = slope * x + noise * rng.standard_normal()
            out.append({"comparison": c.name, "point": point, "seed": seed, "used": True,
                        "recipe_trace_fisher": ref * (1 + x), "reference_trace_fisher": ref, "d_acc": y / 100})
    return out


def test_each_seed_slope_is_the_line_through_the_origin():
    pts = [{"seed": 0, "x": -0.2, "y": 1.0}, {"seed": 0, "x": 0.3, "y": -0.5}, {"seed": 1, "x": 0.0, "y": 2.0}]
    # seed 0: Σxy / Σx² = (−0.2 − 0.15) / (0.04 + 0.09); seed 1 did not move the trace: no slope
    assert within_seed_slopes(pts) == {0: pytest.approx(-0.35 / 0.13, rel=1e-12)}


def test_noise_free_pairs_give_the_slope_exactly():
    pairs = _pairs(-3.0, range(4), 0.0, np.random.default_rng(0))
    pts = dose_points(pairs, FLAT, "late", "acc")
    assert len(pts) == 12 and pts[0]["y"] == pytest.approx(-3.0 * pts[0]["x"])
    row, = dose_response(None, pairs, FLAT, ["late"], "acc", DESIGN, n_boot=0)
    assert row["slope"] == pytest.approx(-3.0, rel=1e-9) and row["n_seeds"] == 4


def test_the_interval_covers_a_known_slope_and_detects_its_sign():
    rng = np.random.default_rng(1)
    covered = 0
    for trial in range(40):
        pairs = _pairs(-4.0, range(8), 0.4, rng) + _pairs(4.0, range(8), 0.4, rng, point="scratch")
        late, scratch = dose_response(None, pairs, FLAT, ["late", "scratch"], "acc", DESIGN, n_boot=0)
        covered += late["t_low"] <= -4.0 <= late["t_high"]
        assert late["verdict"] == DETECTED and scratch["verdict"] == DETECTED_AGAINST
        assert late["holm_p"] >= late["p_value"]  # Holm over the two fork points
    assert 34 <= covered <= 40  # a 95 % interval: 38 of 40 expected


def test_unused_pairs_are_left_out_and_the_section_gets_its_table():
    pairs = _pairs(-2.0, range(3), 0.1, np.random.default_rng(2))
    pairs[0]["used"] = False
    pairs[0]["d_acc"] = 1e6  # would dominate its seed's slope if read
    section = Section("x")
    row, = dose_response(section, pairs, FLAT, ["late"], "acc", DESIGN)
    assert row["n_pairs"] == 8 and abs(row["slope"] + 2.0) < 1.0
    assert row["margin"] == pytest.approx(0.35 / paired.DOSE_TRACE_CHANGE)
    assert section.files["dose_response.csv"] == [row] and len(section.files["dose_points.csv"]) == 8
    assert "Dose-response" in section.tables[0].markdown()
    assert len(section.claims) == 1 and "points per unit of relative trace change" in section.claims[0].measured
