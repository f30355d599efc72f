"""``sameloss reproduce isoloss --scale smoke`` end to end: the report's sections, every number
of its tables against the results files, the fork design (same base, same data, iso-loss
selection on the shared lr decay), reuse on a second call; the iso-loss selection rule."""

from __future__ import annotations

import csv
import json

import pytest

from sameloss.experiments import reproduce
from sameloss.experiments.recipes import isoloss
from sameloss.experiments.stats import DEGENERATE, DETECTED, DETECTED_AGAINST, NONE_LARGER
from sameloss.training.runio import eval_history

from .test_reproduce import check_tables, run_cli


def read(path):
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def test_isoloss_smoke_end_to_end(tmp_path):
    run_cli(["isoloss", "--scale", "smoke", "--out", str(tmp_path), "--no-progress"])
    root = tmp_path / "isoloss-smoke"
    report = (root / "report.md").read_text()
    for heading in ("## Runs", "**Headroom: probe accuracy", "**Every model: the iso-loss checkpoint",
                    "**Paired differences (recipe − reference)", "**Secondary endpoints", "**Fig. 1 within seeds",
                    "### Claims of the paper, checked", "KL tolerance by consequence"):
        assert heading in report, heading
    # the headroom table comes first, in the order majority … oracle
    assert report.index("**Headroom") < report.index("**Every model") < report.index("**Paired differences")
    assert check_tables(root) > 150
    p = isoloss.PRESETS["smoke"]
    verdicts = {r["verdict"] for r in read(root / "differences.csv")} | \
        {r["verdict"] for r in read(root / "regression.csv")}
    assert verdicts <= {DETECTED, DETECTED_AGAINST, NONE_LARGER, DEGENERATE}
    headroom = [r["baseline"] for r in read(root / "headroom.csv")]
    assert [h.split(" ")[0] for h in headroom] == ["majority", "random-init", "look-up", "trained", "oracle"]

    rows = read(root / "results.csv")
    assert len(rows) == len(p.seeds) * len(p.forks)
    forks = {f.name: f for f in p.forks}
    for seed in p.seeds:
        mine = {r["fork"]: r for r in rows if int(r["seed"]) == seed}
        assert set(mine) == set(forks)
        seed_dir = root / "seeds" / f"seed{seed}" / "runs"
        kls = {name: {step: ev["kl"] for step, ev in eval_history(seed_dir / f"hmm-s{seed}-{name}").items()}
               for name in forks}
        # the target: the lowest KL every fork reaches among its candidates (decay's end)
        windows = {name: range(p.fork_steps(f) - p.decay_steps + p.match_from, p.fork_steps(f) + 1, p.match_every)
                   for name, f in forks.items()}
        target = max(min(kls[name][s] for s in windows[name]) for name in forks)
        for name, r in mine.items():
            assert float(r["kl_target"]) == pytest.approx(target, abs=1e-12)
            assert float(r["dkl"]) == pytest.approx(float(r["kl_match"]) - target, abs=1e-12)
            step = int(r["step"])
            assert step in windows[name] and float(r["kl_match"]) == pytest.approx(kls[name][step], abs=1e-12)
            within = [s for s in windows[name] if abs(kls[name][s] - target) <= p.kl_tolerance / 2]
            assert step == (max(within) if within else min(windows[name], key=lambda s: (abs(kls[name][s] - target), -s)))
            # every fork starts from the base's checkpoint and ends with the shared decay
            cfg = (seed_dir / f"hmm-s{seed}-{name}" / "config.toml").read_text()
            assert f"hmm-s{seed}-base/checkpoints/step_{p.base_steps:07d}" in cfg
            assert f"decay_steps = {p.decay_steps}" in cfg
            assert int(r["into_decay"]) == step - (p.fork_steps(forks[name]) - p.decay_steps)
        assert int(mine["long"]["extra_steps"]) - int(mine["long"]["into_decay"]) == p.recipe_steps_of(forks["long"])
        assert int(mine["short"]["extra_steps"]) == int(mine["short"]["into_decay"])
        # accuracies are the mean over the same subsets for every model
        subsets = json.loads((root / "seeds" / f"seed{seed}" / "measurements.json").read_text())
        assert any(k.startswith("random-init|") for k in subsets)

    # a second call reuses every run and measurement
    reproduce("isoloss", "smoke", out=tmp_path, progress=False)
    assert "0 rows measured" in (root / "report.md").read_text()


def test_select_iso_loss_takes_the_latest_within_tolerance_else_the_nearest():
    kls = {10: 0.012, 20: 0.0101, 30: 0.0099, 40: 0.0095}
    assert isoloss.select_iso_loss(kls, [10, 20, 30, 40], 0.0100, 2e-4) == 30
    assert isoloss.select_iso_loss(kls, [10, 20, 30, 40], 0.0100, 6e-4) == 40
    assert isoloss.select_iso_loss(kls, [10, 20], 0.0100, 5e-5) == 20
    assert isoloss.select_iso_loss({1: 0.5, 2: 0.7}, [1, 2], 0.6, 0.01) == 2  # a tie: the later


def test_the_target_is_the_lowest_kl_every_fork_reaches():
    kls = {"a": {1: 0.012, 2: 0.009, 3: 0.008}, "b": {1: 0.011, 2: 0.0095, 3: 0.0093}}
    assert isoloss.iso_loss_target(kls, {"a": [1, 2, 3], "b": [1, 2, 3]}) == 0.0093
    assert isoloss.iso_loss_target(kls, {"a": [1], "b": [1, 2, 3]}) == 0.012


def test_presets_are_checked():
    p = isoloss.PRESETS["tiny"]
    assert p.languages == {"hmm": "headroom"} and p.kl_tolerance == 3e-4
    import dataclasses
    with pytest.raises(ValueError, match="match_from"):
        dataclasses.replace(p, match_from=500)
    with pytest.raises(ValueError, match="match_from"):
        dataclasses.replace(p, match_from=0)
    with pytest.raises(ValueError, match="multiples"):
        dataclasses.replace(p, recipe_steps=105)
    with pytest.raises(ValueError, match="primary size"):
        dataclasses.replace(p, primary_size=7)
