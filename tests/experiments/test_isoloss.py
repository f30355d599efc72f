"""``sameloss reproduce isoloss --scale smoke`` end to end — the report (verdicts first), every
number of its tables against the results files, the design on disk (late forks from the
base's checkpoint, forks from scratch from the same initial weights and data, the size fork
from the embedded base at the same exact KL, candidates only on the stretch at the final
lr), the selection rule recomputed, the figures' numbers — and the pieces: the matching
rule, the exclusion of pairs outside the tolerance, the headroom gate, the along-fork slope,
the adversary's task."""

from __future__ import annotations

import csv
import dataclasses
import json
import math

import numpy as np
import pytest
import torch

from sameloss.experiments import reproduce
from sameloss.experiments import paired
from sameloss.experiments.paired import Comparison, Design, UNINFORMATIVE, choose_target, nearest_candidate
from sameloss.experiments.recipes import isoloss
from sameloss.experiments.report import Section
from sameloss.experiments.stats import DETECTED, EQUIVALENT, INCONCLUSIVE, VERDICTS
from sameloss.training.data import global_batch
from sameloss.training.runio import build_language, eval_history, init_model

from helpers.figures import check_report_figures, read_data

from .test_reproduce import check_tables, run_cli


def read(path):
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def test_isoloss_smoke_end_to_end(tmp_path, monkeypatch):
    from sameloss.measures import run as measure_run

    probed = []  # every checkpoint whose few-shot probes are computed
    original = measure_run.measure_checkpoint
    monkeypatch.setattr(measure_run, "measure_checkpoint", lambda path, spec, *a, **kw: (
        probed.append(str(path)) if spec.fewshot is not None else None) or original(path, spec, *a, **kw))
    # the main job, at smoke, in this process (the probes are counted here; without --launcher the main job
    # runs its seeds on local workers, as .ci/run does)
    run_cli(["--scale", "smoke", "--out", str(tmp_path), "--no-progress", "--launcher", "inprocess"])
    root = tmp_path / "isoloss-smoke"
    # no checkpoint is probed twice (the slope reuses a selected checkpoint's probes; issue 23 item 5)
    assert probed and len(probed) == len(set(probed))
    report = (root / "report.md").read_text()
    for heading in ("## Runs", "**Verdicts: primary accuracy difference", "**Headroom (measured before the forks)",
                    "**Selection: the iso-loss checkpoint", "**Paired differences (recipe − reference)",
                    "**Secondary endpoints", "**SAM's controls", "**Size contrast", "**Dose:",
                    "**The KL tolerance by its consequence", "**Fig. 1 within seeds", "### Claims of the paper, checked",
                    "KL tolerance by consequence", "![Forest plot", "![Fig. 1 within seeds", "![Training curves"):
        assert heading in report, heading
    # the report leads with the verdicts and their MDE (before the Runs table), then the headroom table
    assert report.index("## Verdicts") < report.index("**Verdicts") < report.index("| MDE |") < report.index("## Runs") \
        < report.index("**Headroom") < report.index("**Selection") \
        < report.index("**Paired differences")
    assert check_tables(root) > 300
    p = isoloss.PRESETS["smoke"]
    diffs = read(root / "differences.csv")
    # smoke marks (rather than stops) when its gate fails: then every verdict says so
    passed = "passed." in report.split("Headroom gate")[1].split("\n")[0]
    assert {r["verdict"] for r in diffs} <= (set(VERDICTS) if passed else {UNINFORMATIVE})
    assert {r["family"] for r in diffs} == {"primary", "trace", "secondary"}
    primary = [r for r in diffs if r["family"] == "primary"]
    # every comparison at every fork point, the base-recipe one (longer) at the late point only
    assert sorted((r["comparison"], r["point"]) for r in primary) == sorted(
        [(c.name, "late") for c in p.comparisons] + [(c.name, "scratch") for c in p.comparisons if c.name != "longer"])
    # Holm within the primary family: the adjusted p values are Holm's of the raw ones
    from sameloss.experiments.stats import holm
    assert [float(r["holm_p"]) for r in primary] == pytest.approx(holm([float(r["p_value"]) for r in primary]),
                                                                  nan_ok=True)
    headroom = [r["baseline"] for r in read(root / "headroom.csv")]
    assert [h.split(" ")[0] for h in headroom] == ["majority", "random-init", "look-up", "trained", "oracle"]

    rows = read(root / "results.csv")
    forks = {f.name: f for f in p.forks}
    assert len(rows) == len(p.seeds) * len(forks) * 2
    for seed in p.seeds:
        seed_dir = root / "seeds" / f"seed{seed}" / "runs"
        for point in ("late", "scratch"):
            mine = {r["fork"]: r for r in rows if int(r["seed"]) == seed and r["point"] == point}
            assert set(mine) == set(forks)
            kls, candidates = {}, {}
            for name, f in forks.items():
                run = "late" if f.base_recipe else point
                kls[name] = {s: ev["kl"] for s, ev in eval_history(seed_dir / f"hmm-s{seed}-{run}-{name}").items()}
                candidates[name] = p.candidates(f)
                # KL is evaluated at the candidates (and the AdamW fork's slope checkpoints) and nowhere else
                extra = set(p.slope_steps(f)) if name == "adamw" else set()
                assert set(kls[name]) == set(candidates[name]) | extra, name
            pairs = [(c.recipe, c.reference) for c, pt in p.tests() if pt == point]
            target = choose_target(kls, candidates, pairs, p.kl_tolerance)
            for name, r in mine.items():
                step = int(r["step"])
                assert step == nearest_candidate(kls[name], candidates[name], target)
                assert float(r["kl_target"]) == pytest.approx(target, abs=1e-12)
                assert float(r["kl_match"]) == pytest.approx(kls[name][step], abs=1e-12)
                assert float(r["dkl"]) == pytest.approx(kls[name][step] - target, abs=1e-12)
                # every selected checkpoint is on its stretch: the final lr factor
                assert float(r["lr_factor"]) == pytest.approx(p.final_lr_factor)
                assert 0 < int(r["steps_at_final_lr"]) <= p.final_steps_of(forks[name])
        # late forks start from the base's checkpoint, forks from scratch from nothing, and
        # the base recipe's forks exist once (their late runs serve every point)
        for name, f in forks.items():
            late = (seed_dir / f"hmm-s{seed}-late-{name}" / "config.toml").read_text()
            if f.resized:  # from the base embedded with its optimiser moments
                assert (f"embedded/hmm-s{seed}-base-step{p.base_steps}-into-w2+1-optimizer/checkpoints/"
                        f"step_{p.base_steps:07d}") in late
            else:
                assert f"hmm-s{seed}-base/checkpoints/step_{p.base_steps:07d}" in late
            assert "final_steps = " in late and "at_checkpoints = true" in late
            scratch = seed_dir / f"hmm-s{seed}-scratch-{name}"
            assert scratch.exists() != f.base_recipe
            if scratch.exists():
                assert '\ninit_from = "' not in (scratch / "config.toml").read_text()
        adv = (seed_dir / f"hmm-s{seed}-late-adv" / "config.toml").read_text()
        assert f'task = "{p.task}"' in adv
    # the size fork started from the base's function: the same exact KL (asserted in the study)
    notes = report[report.index("Size forks start from exactly"):]
    worst = float(notes.split("to ")[1].split(" nats")[0])
    assert worst <= 1e-6
    # the trace of the size contrast is compared in one parameter space
    size = {r["test"]: r for r in read(root / "size.csv")}
    late_size = next(r for r in primary if r["comparison"] == "size" and r["point"] == "late")
    trace_size = next(r for r in diffs if r["family"] == "trace" and r["comparison"] == "size" and r["point"] == "late")
    assert float(trace_size["mean"]) == pytest.approx(float(size["size @ late"]["trace_one_space"]))
    assert float(late_size["mean"]) == pytest.approx(float(size["size @ late"]["acc"]))
    # the figures (plots.py's kinds, through study.figure): each keeps the style's rules and
    # its plotted numbers (<stem>.data.csv) are the tables' numbers
    assert check_report_figures(root) == 3
    assert report.index("![Forest plot](forest.png)") < report.index("![Fig. 1 within seeds](scatter.png)") \
        < report.index("![Training curves of seed 0](curves.png)")
    forest = read_data(root / "forest.data.csv")
    trace = {(r["comparison"], r["point"]): r for r in diffs if r["family"] == "trace"}
    labels = [f"{r['comparison']} @ {r['point']} (n={r['n_kept']})" for r in primary]
    for panel, of in (("0", lambda r: r), ("1", lambda r: trace[(r["comparison"], r["point"])])):
        points = [r for r in forest if r["kind"] == "point" and r["panel"] == panel]
        assert [r["y"] for r in points] == labels  # one row per comparison and fork point, in the table's order
        for got, want in zip(points, (of(r) for r in primary)):
            assert float(got["x"]) == pytest.approx(float(want["mean"]))
            for end, of_want in (("x_low", "t_low"), ("x_high", "t_high")):  # no interval (n < 2, sd 0): no bar
                expected = float(want[of_want])
                assert (float(got[end]) if got[end] else math.nan) == pytest.approx(expected, nan_ok=True)
        mdes = {}
        for r in forest:
            if r["kind"] == "mde" and r["panel"] == panel:
                mdes.setdefault(r["y"], []).append(float(r["x"]))
        for label, want in zip(labels, (of(r) for r in primary)):  # the MDE marked at ± the row's
            if math.isfinite(float(want["mde"])) and label in mdes:
                assert sorted(mdes[label]) == pytest.approx([-float(want["mde"]), float(want["mde"])])
        assert sum(bool(v) for v in mdes.values()) >= 1
    margin = sorted(float(r["x"]) for r in forest if r["kind"] == "ref-x" and r["panel"] == "0" and "δ" in r["series"])
    assert margin == pytest.approx([-p.equivalence_margin, p.equivalence_margin])
    scatter = read_data(root / "scatter.data.csv")
    regression = {r["point"]: r for r in read(root / "regression.csv") if "trace" in r["coefficient"]}
    for panel, point in enumerate(("late", "scratch")):
        mine = [r for r in scatter if r["panel"] == str(panel)]
        axes = next(r for r in mine if r["kind"] == "axes")
        assert (axes["x_quantity"], axes["y_quantity"]) == (f"dtrace_{point}", f"dacc_{point}")
        pts = [r for r in mine if r["kind"] == "point"]
        # every seed's models of one size without adv, demeaned within the seed: they sum to 0
        assert len(pts) == len(p.seeds) * (len(forks) - 2)
        assert abs(sum(float(r["y"]) for r in pts)) < 1e-9 and abs(sum(float(r["x"]) for r in pts)) < 1e-6
        assert {r["series"] for r in pts} == set(forks) - {"adv", "large"}
        fit = next(r for r in mine if r["kind"] == "fit")  # the within-seed slope, through 0
        assert fit["note"] == f"slope {float(regression[point]['estimate'])!r}, intercept 0.0"
    curves = read_data(root / "curves.data.csv")
    seed = p.seeds[0]
    runs_dir = root / "seeds" / f"seed{seed}" / "runs"
    for panel, point in enumerate(("late", "scratch")):
        mine = [r for r in curves if r["panel"] == str(panel)]
        band = next(r for r in mine if r["kind"] == "band-x")  # the matching window, shaded
        assert (float(band["x_low"]), float(band["x_high"])) == \
            (min(p.stretch_start(f) for f in p.forks), max(p.fork_end(f) for f in p.forks))
        target = next(r for r in mine if r["kind"] == "ref-y")
        want = next(r for r in rows if r["point"] == point and int(r["seed"]) == seed)["kl_target"]
        assert float(target["y"]) == pytest.approx(float(want))
        for name, f in forks.items():  # every fork's evaluated KL, exactly, in its fork point's panel
            run = runs_dir / f"hmm-s{seed}-{'late' if f.base_recipe else point}-{name}"
            got = [(float(r["x"]), float(r["y"])) for r in mine if r["kind"] == "point" and r["series"] == name]
            assert got == [(float(s), ev["kl"]) for s, ev in sorted(eval_history(run).items())], name
        assert any(r["series"] == "base" for r in mine if r["kind"] == "point")
    for name in ("forest.png", "scatter.png", "curves.png"):
        assert (root / name).stat().st_size > 10_000
        assert not (root / name.replace(".png", ".csv")).exists()  # the figure's data file is its one CSV
    assert {r["comparison"] for r in read(root / "dose.csv")} == {c.name for c in p.comparisons} - {"longer"}
    sam = {r["test"] for r in read(root / "sam_controls.csv")}
    assert {"sam05 @ late: pos_lbfgs_n16", "sam05-half @ late: pos_lbfgs_n16", "half-batch @ late: pos_lbfgs_n16"} <= sam
    slope = read(root / "slope.csv")
    assert {int(r["seed"]) for r in slope} == set(p.seeds[:p.slope_seeds])
    assert len(read(root / "runtime.csv")) == len(p.seeds)

    # a second call reuses every run and measurement
    reproduce("isoloss", "smoke", out=tmp_path, progress=False)
    assert "0 rows measured" in (root / "report.md").read_text()


def test_without_headroom_the_study_stops_before_the_forks(tmp_path, monkeypatch):
    from sameloss.measures import run as measure_run

    p = dataclasses.replace(isoloss.PRESETS["smoke"], headroom_margin=60.0, on_no_headroom="stop")
    monkeypatch.setitem(isoloss.PRESETS, "smoke", p)
    probed = []
    original = measure_run.measure_reference
    monkeypatch.setattr(measure_run, "measure_reference", lambda kind, *a, **kw: probed.append(kind)
                        or original(kind, *a, **kw))
    reproduce("isoloss", "smoke", out=tmp_path, progress=False)
    root = tmp_path / "isoloss-smoke"
    # the look-up and oracle references do not depend on the seed: probed once for the study
    # (in its own measurements.json), the random-init encoder once per seed (issue 23 item 5)
    assert sorted(probed) == sorted(["lookup", "oracle"] + ["random-init"] * len(p.seeds))
    kinds = [k.split("|")[0] for k in json.loads((root / "measurements.json").read_text())]
    assert sorted(kinds) == ["lookup", "oracle"]
    for seed in p.seeds:
        seed_rows = json.loads((root / "seeds" / f"seed{seed}" / "measurements.json").read_text())
        assert not [k for k in seed_rows if k.split("|")[0] in ("lookup", "oracle")]
    report = (root / "report.md").read_text()
    assert "No headroom: the forks were not run" in report and "FAILED" in report
    assert report.index("**No verdict: no headroom**") < report.index("## Runs")  # said first
    # every seed's unit gates its own base: each trained its base and no fork
    for seed in p.seeds:
        runs = sorted(d.name for d in (root / "seeds" / f"seed{seed}" / "runs").iterdir())
        assert runs == [f"hmm-s{seed}-base"]
    assert (root / "headroom.csv").exists() and not (root / "differences.csv").exists()


def test_the_headroom_gate_thresholds():
    p = dataclasses.replace(isoloss.PRESETS["tiny"], headroom_margin=5.0)
    key = p.primary_key

    def row(x):
        return {key: x / 100}

    assert isoloss.headroom_gate(p, 0, row(88.9), row(65.2), row(70.1), row(96.7))[0]
    assert not isoloss.headroom_gate(p, 0, row(74.0), row(65.2), row(70.1), row(96.7))[0]  # too near the look-up
    assert not isoloss.headroom_gate(p, 0, row(92.0), row(65.2), row(70.1), row(96.7))[0]  # too near the oracle
    assert not isoloss.headroom_gate(p, 0, row(85.8), row(65.2), row(86.9), row(98.6))[0]  # issue 22's language


def test_forks_from_scratch_share_the_initial_weights_and_the_data_stream():
    p = isoloss.PRESETS["smoke"]
    base = isoloss.base_run(p, 3).config()
    forks = {f.name: f for f in p.forks}
    for name in ("noreg", "sam05", "adv"):
        cfg = isoloss.fork_run(p, 3, forks[name], 0, None).config()
        assert cfg.init_from is None and cfg.seed == base.seed
        language = build_language(cfg)
        torch.manual_seed(cfg.seed)
        a = init_model(cfg, language, "cpu").state_dict()
        torch.manual_seed(base.seed)
        b = init_model(base, language, "cpu").state_dict()
        assert all(torch.equal(a[k], b[k]) for k in a)
        for step in (1, 7, 31):
            x = global_batch(language, cfg.seed, step, cfg.batch_size, cfg.mask_rate)
            y = global_batch(language, base.seed, step, base.batch_size, base.mask_rate)
            assert torch.equal(x.inputs, y.inputs) and torch.equal(x.masked, y.masked)
    # from scratch the recipe acts on every step: the same schedule as the late fork's
    late = isoloss.fork_run(p, 3, forks["noreg"], p.base_steps, None).config()
    scratch = isoloss.fork_run(p, 3, forks["noreg"], 0, None).config()
    assert [late.lr_factor(s) for s in range(late.steps)] == [scratch.lr_factor(s) for s in range(scratch.steps)]


def test_the_adversary_follows_the_presets_task():
    p = isoloss.PRESETS["tiny"]
    other = dataclasses.replace(p, task="task-3", tasks={"hmm": ("task-3", "task-5")})
    adv = next(f for f in p.forks if f.name == "adv")
    settings = dict(isoloss.fork_run(other, 0, adv, other.base_steps, None).settings)
    assert settings["adversarial.task"] == "task-3" and other.fewshot().task == "task-3"
    assert dict(isoloss.fork_run(p, 0, adv, p.base_steps, None).settings)["adversarial.task"] == "task-5"


def test_the_target_leaves_the_fewest_pairs_outside_and_then_the_smallest_gap():
    kls = {"a": {1: 0.0100, 2: 0.0095, 3: 0.0090, 4: 0.0085},
           "b": {1: 0.0098, 2: 0.0094, 3: 0.0089, 4: 0.0084},
           "c": {1: 0.0120, 2: 0.0118, 3: 0.0116, 4: 0.0115}}  # c sits on a higher floor
    cand = {k: [1, 2, 3, 4] for k in kls}
    # c comes nearest a at c's bottom and a's top (1.5e-3); then b as near a as it can (b's top)
    t = choose_target(kls, cand, [("a", "b"), ("c", "a")], tolerance=2e-3)
    at = {k: kls[k][nearest_candidate(kls[k], cand[k], t)] for k in kls}
    assert (at["a"], at["b"], at["c"]) == (0.0100, 0.0098, 0.0115)
    # with a tight tolerance c − a cannot be matched: a − b stays matched, not sacrificed
    t = choose_target(kls, cand, [("a", "b"), ("c", "a")], tolerance=3e-4)
    at = {k: kls[k][nearest_candidate(kls[k], cand[k], t)] for k in kls}
    assert abs(at["a"] - at["b"]) <= 1e-4 + 1e-12
    # exhaustive check against a fine grid of targets: nothing beats the chosen one
    grid = np.linspace(0.008, 0.013, 2001)

    def cost(target):  # the fewest pairs outside, then their gaps within, largest first
        sel = {k: kls[k][nearest_candidate(kls[k], cand[k], target)] for k in kls}
        gaps = sorted([abs(sel["a"] - sel["b"]), abs(sel["c"] - sel["a"])], reverse=True)
        inside = [g for g in gaps if g <= 3e-4]
        return (len(gaps) - len(inside), inside, gaps)
    assert cost(t) == min(cost(x) for x in grid)
    assert nearest_candidate({10: 0.5, 20: 0.7}, [10, 20], 0.6) == 20  # a tie: the later


def _rows(diffs, dkls, point="late"):
    """Synthetic model rows: per seed a reference r and a recipe x with the given accuracy
    difference (points) and ΔKL."""
    rows = []
    for seed, (d, dkl) in enumerate(zip(diffs, dkls)):
        for fork, acc, kl in (("r", 0.5, 0.01), ("x", 0.5 + d / 100, 0.01 + dkl)):
            rows.append({"seed": seed, "point": point, "fork": fork, "kl_match": kl, "acc": acc,
                         "trace_fisher": 10.0 + (seed if fork == "x" else 0)})
    return rows


def test_pairs_outside_the_tolerance_are_excluded_and_counted():
    c = Comparison("x", "x", "r", +1, "x raises accuracy")
    diffs = [1.0, 1.2, 0.8, 1.1, 50.0]
    dkls = [1e-4, -1e-4, 0.0, 2e-4, 5e-3]  # the last pair is not at the same loss
    out = paired.differences(Section(""), _rows(diffs, dkls), [(c, "late")], [("acc", "acc")], "acc",
                             Design(3e-4, 0.35))
    acc = out[0]
    assert (acc["n_pairs"], acc["n_kept"], acc["n_excluded"]) == (5, 4, 1)
    assert acc["mean"] == pytest.approx(np.mean(diffs[:4])) and acc["verdict"] == DETECTED
    assert acc["max_abs_dkl"] == pytest.approx(2e-4) and acc["max_abs_dkl_all"] == pytest.approx(5e-3)
    # a null shown: the interval inside ±δ; one that only holds 0 is inconclusive
    out = paired.differences(Section(""), _rows([0.05, -0.05, 0.02, -0.03, 0.01], [0] * 5), [(c, "late")],
                             [("acc", "acc")], "acc", Design(3e-4, 0.35))
    assert out[0]["verdict"] == EQUIVALENT
    out = paired.differences(Section(""), _rows([1.0, -1.0, 0.5, -0.6, 0.1], [0] * 5), [(c, "late")],
                             [("acc", "acc")], "acc", Design(3e-4, 0.35))
    assert out[0]["verdict"] == INCONCLUSIVE
    # no headroom: every verdict is uninformative
    out = paired.differences(Section(""), _rows(diffs, dkls), [(c, "late")], [("acc", "acc")], "acc",
                             Design(3e-4, 0.35, headroom=False))
    assert {r["verdict"] for r in out} == {UNINFORMATIVE}


def test_the_along_fork_slope_is_within_seeds_and_keeps_its_sign():
    rng = np.random.default_rng(0)
    rows = []
    for seed in range(6):
        offset = rng.normal(0, 5)  # seeds differ in level, not in slope
        for kl in (0.012, 0.009, 0.007, 0.006, 0.005):
            rows.append({"seed": seed, "kl_match": kl, "acc": (50 + offset + 0.15 * 1000 * kl) / 100})
    s = paired.along_fork_slope(rows, "acc")
    assert s.estimate == pytest.approx(0.15, abs=1e-9) and s.n_seeds == 6 and s.n_models == 30
    flipped = [dict(r, acc=(100 - 100 * r["acc"]) / 100) for r in rows]
    assert paired.along_fork_slope(flipped, "acc").estimate == pytest.approx(-0.15, abs=1e-9)
    # the consequence check covers every kept pair: one pair at the edge of the tolerance
    c = Comparison("x", "x", "r", +1, "")
    section = Section("")
    mrows = _rows([1.0, 1.2, 0.8, 1.1], [1e-4, -1e-4, 0.0, 3e-4])
    diffs = paired.differences(section, mrows, [(c, "late")], [("acc", "acc")], "acc", Design(3e-4, 0.35))
    out = paired.tolerance_check(section, mrows, diffs, [(c, "late")], "acc", paired.Slope(0.15, 0.1, 0.2, 6, 30),
                                 Design(3e-4, 0.35))
    assert out[0]["worst_pair"] == pytest.approx(0.2 * 0.3)
    assert out[0]["bias"] == pytest.approx(0.15 * 1000 * np.mean([1e-4, -1e-4, 0.0, 3e-4]))
    assert out[0]["corrected"] == pytest.approx(np.mean(np.array([1.0, 1.2, 0.8, 1.1])
                                                        - 0.15 * 1000 * np.array([1e-4, -1e-4, 0.0, 3e-4])))
    # a comparison with no pair kept is named as such, not as a failed check (tiny's SAM from scratch)
    section = Section("")
    far = _rows([1.0, 1.2, 0.8], [2e-3, -2e-3, 1e-3])
    diffs = paired.differences(section, far, [(c, "late")], [("acc", "acc")], "acc", Design(3e-4, 0.35))
    out = paired.tolerance_check(section, far, diffs, [(c, "late")], "acc", paired.Slope(0.15, 0.1, 0.2, 6, 30),
                                 Design(3e-4, 0.35))
    assert out[0]["n_kept"] == 0 and not out[0]["ok"]
    assert "No pair was kept for: x @ late" in section.notes[-1] and "NOT within" not in section.notes[-1]


def test_presets_are_checked():
    p = isoloss.PRESETS["tiny"]
    assert p.languages == {"hmm": "headroom"} and p.kl_tolerance == 3e-4 and set(p.fork_points) == {0, p.base_steps}
    q = isoloss.PRESETS["quick"]
    assert dataclasses.replace(q, seeds=p.seeds, slope_seeds=p.slope_seeds) == p  # the same design, fewer seeds
    # quick's units are tiny's first ones exactly (its runtime is theirs): the first seeds, all slope seeds
    assert q.seeds == p.seeds[:len(q.seeds)] and q.slope_seeds == len(q.seeds) <= p.slope_seeds
    with pytest.raises(ValueError, match="fork points"):
        dataclasses.replace(p, fork_points=(p.base_steps + 1,))
    with pytest.raises(ValueError, match="final steps"):
        dataclasses.replace(p, final_steps=30)
    with pytest.raises(ValueError, match="primary size"):
        dataclasses.replace(p, primary_size=7)
    with pytest.raises(ValueError, match="on_no_headroom"):
        dataclasses.replace(p, on_no_headroom="ignore")
    # a late-only fork (tiny's adversary) has no run and no comparison from scratch
    adv = {f.name: f for f in p.forks}["adv"]
    assert adv.late_only and adv not in p.forks_at(0) and adv in p.forks_at(p.base_steps)
    assert not any(r.name.endswith("scratch-adv") for r in isoloss.runs(p, "hmm", 0, "base"))
    assert any(r.name.endswith("scratch-noreg") for r in isoloss.runs(p, "hmm", 0, "base"))
    tests = {(c.name, pt) for c, pt in p.tests()}
    assert ("adv", "late") in tests and ("adv", "scratch") not in tests and ("noreg", "scratch") in tests
    assert ("size", "scratch") in tests and ("longer", "scratch") not in tests
    # the size fork: the same width, two more blocks (a 2x wider one costs 4x per step at tiny)
    large = {f.name: f for f in p.forks}["large"]
    assert (large.width_factor, large.extra_layers) == (1, 2)
    # every candidate lies on the stretch at the final lr
    for f in p.forks:
        cfg = isoloss.fork_run(p, 0, f, p.base_steps, None).config()
        assert all(cfg.lr_factor(s - 1) == pytest.approx(p.final_lr_factor) for s in p.candidates(f))
        assert cfg.lr_factor(p.stretch_start(f) - 2) > p.final_lr_factor
    assert not math.isnan(p.equivalence_margin)
