"""``sameloss reproduce isoloss --scale smoke`` end to end: the report's sections, every number
of its tables against the results files, the fork design (same base, same data, iso-loss
selection), reuse on a second call; the iso-loss selection rule."""

from __future__ import annotations

import csv
import json

import pytest

from sameloss.experiments import reproduce
from sameloss.experiments.recipes import isoloss
from sameloss.experiments.stats import DETECTED, DETECTED_AGAINST, NONE_LARGER

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
    assert verdicts <= {DETECTED, DETECTED_AGAINST, NONE_LARGER}
    headroom = [r["baseline"] for r in read(root / "headroom.csv")]
    assert [h.split(" ")[0] for h in headroom] == ["majority", "random-init", "look-up", "trained", "oracle"]

    rows = read(root / "results.csv")
    assert len(rows) == len(p.seeds) * (1 + len(p.forks))
    for seed in p.seeds:
        mine = {r["fork"]: r for r in rows if int(r["seed"]) == seed}
        assert set(mine) == {"base", *(f.name for f in p.forks)}
        ref = float(mine["adamw"]["kl_match"])
        assert int(mine["adamw"]["extra_steps"]) == p.extra_steps and int(mine["base"]["extra_steps"]) == 0
        seed_dir = root / "seeds" / f"seed{seed}" / "runs"
        for name, r in mine.items():
            assert float(r["dkl"]) == pytest.approx(float(r["kl_match"]) - ref, abs=1e-12)
            if name in ("base", "adamw"):
                continue
            # the chosen checkpoint is the candidate whose KL is nearest the reference's
            kls = isoloss._eval_kls(seed_dir / f"hmm-s{seed}-{name}")
            window = range(p.base_steps + p.match_from, p.base_steps + p.match_to + 1, p.match_every)
            assert int(r["step"]) == min(window, key=lambda s: (abs(kls[s] - ref), s))
            # every fork starts from the base's checkpoint
            cfg = (seed_dir / f"hmm-s{seed}-{name}" / "config.toml").read_text()
            assert f"hmm-s{seed}-base/checkpoints/step_{p.base_steps:07d}" in cfg
        # accuracies are the mean over the same subsets for every model
        subsets = json.loads((root / "seeds" / f"seed{seed}" / "measurements.json").read_text())
        assert any(k.startswith("fewshot|") for k in subsets)

    # a second call reuses every run and measurement
    reproduce("isoloss", "smoke", out=tmp_path, progress=False)
    assert "0 rows measured" in (root / "report.md").read_text()


def test_select_iso_loss_takes_the_nearest_and_the_earliest_of_ties():
    kls = {10: 0.012, 20: 0.0101, 30: 0.0099, 40: 0.0095}
    assert isoloss.select_iso_loss(kls, [10, 20, 30, 40], 0.0100) == 20
    assert isoloss.select_iso_loss(kls, [30, 40], 0.0100) == 30
    assert isoloss.select_iso_loss({1: 0.5, 2: 0.7}, [1, 2], 0.6) == 1


def test_presets_are_checked():
    p = isoloss.PRESETS["tiny"]
    assert p.languages == {"hmm": "headroom"} and p.kl_tolerance == 3e-4
    import dataclasses
    with pytest.raises(ValueError, match="match_from"):
        dataclasses.replace(p, match_from=500)
    with pytest.raises(ValueError, match="primary size"):
        dataclasses.replace(p, primary_size=7)
