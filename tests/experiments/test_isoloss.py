"""``sameloss reproduce isoloss --scale smoke`` end to end — the report (verdicts first), every
number of its tables against the results files, the design on disk (late forks from the
base's checkpoint, forks from scratch from the same initial weights and data, the size fork
from the embedded base at the same exact KL, candidates only on the stretch at the final
lr), every estimate at the target KL recomputed, the figures' numbers — and the pieces: the
target, the estimate at it against least squares, every pair used (named when beyond the
extrapolation limit), the sensitivity at limit 0 and with every pair, the claims' margins,
the headroom gate, the adversary's task."""

from __future__ import annotations

import csv
import dataclasses
import json
import math

import numpy as np
import pytest
import torch

from sameloss.experiments import Job, Options, reproduce
from sameloss.experiments.stats import paired
from sameloss.experiments.stats.paired import Comparison, Design, UNINFORMATIVE
from sameloss.experiments.recipes import isoloss
from sameloss.experiments.recipes.isoloss.tables import pairs_table
from sameloss.experiments.reports.document import Section
from sameloss.experiments.stats.inference import DETECTED, EQUIVALENT, INCONCLUSIVE, VERDICTS
from sameloss.training.data import global_batch
from sameloss.training.runio import build_language, eval_history, init_model

from helpers.figures import check_report_figures, read_data

from sameloss.experiments.reports.plots.series import series_style

from .test_reproduce import check_tables, run_cli
from .test_smoke_digests import assert_as_pinned


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
    # the numbers are the pinned ones (test_smoke_digests: bit for bit on the pinning machine's kind)
    assert_as_pinned("isoloss", root / "results.csv")
    # no checkpoint is probed twice (a base-recipe fork's checkpoints serve both fork points)
    assert probed and len(probed) == len(set(probed))
    report = (root / "report.md").read_text()
    for heading in ("## Runs", "**Verdicts: primary accuracy difference", "**Headroom (measured before the forks)",
                    "**The headroom gate per seed", "**Estimation at the target KL, per pair",
                    "**Paired differences (recipe − reference)", "**Secondary endpoints", "**SAM's controls",
                    "**Size contrast", "**Dose:", "**Fig. 1 within seeds", "### Claims of the paper, checked",
                    "**Margins, fixed in the preset", "**Flatness arms:", "**Flatness by assigned arm",
                    "Estimation at the target:", "Holm's correction is applied within each family",
                    "TOST, 90% interval", "noncentral t", "![Forest plot", "![Fig. 1 within seeds",
                    "![Training curves"):
        assert heading in report, heading
    # the report leads with the verdicts and their MDE (before the Runs table), then the headroom table
    assert report.index("**No verdict") < report.index("## Verdicts") < report.index("**Verdicts") \
        < report.index("| MDE |") < report.index("## Runs") \
        < report.index("**Headroom") < report.index("**Estimation") \
        < report.index("**Paired differences")
    assert check_tables(root) > 300
    # the engine's tidy tables: every tagged measure's row with its tags (what the report queried) and
    # every seed unit's CPU per part
    p = isoloss.PRESETS["smoke"]
    measured = read(root / "measured.csv")
    probes = {(r["seed"], r["point"], r["fork"], r["step"]): r for r in measured if r["role"] == "probe"}
    reported = [r for r in read(root / "results.csv") if r.get("fork_step")]
    assert reported and len(probes) == len(reported)
    for r in reported:
        assert probes[(r["seed"], r["point"], r["fork"], r["step"])][p.primary_key] == r[p.primary_key]
    assert {(r["seed"], r["of"]) for r in measured if r["role"] == "gate"} == {
        (str(s), of) for s in p.seeds for of in ("trained", "random_init", "lookup", "oracle")}
    costs = read(root / "costs.csv")
    assert {(r["seed"], r["fork"], r["stage"]) for r in costs if r["stage"] == "train+gate"} == {
        (str(s), "base", "train+gate") for s in p.seeds} and all(float(r["cpu_seconds"]) >= 0 for r in costs)
    p = isoloss.PRESETS["smoke"]
    diffs = read(root / "differences.csv")
    # smoke marks (rather than stops) when its gate fails: then every verdict says so
    passed = "passed." in report.split("Headroom gate")[1].split("\n")[0]
    assert {r["verdict"] for r in diffs} <= (set(VERDICTS) if passed else {UNINFORMATIVE})
    assert {r["family"] for r in diffs} == {"primary", "trace", "secondary"}
    primary = [r for r in diffs if r["family"] == "primary"]
    # every comparison at every fork point, the base-recipe one (longer) at the late point only
    assert sorted((r["comparison"], r["point"]) for r in primary) == sorted(
        [(c.name, "late") for c in p.comparisons] + [(c.name, "scratch") for c in p.comparisons
                                                     if c.name not in ("longer", "sharp")])  # sharp: late only
    # Holm within the primary family: the adjusted p values are Holm's of the raw ones
    from sameloss.experiments.stats.inference import holm
    assert [float(r["holm_p"]) for r in primary] == pytest.approx(holm([float(r["p_value"]) for r in primary]),
                                                                  nan_ok=True)
    headroom = [r["baseline"] for r in read(root / "headroom.csv")]
    assert [h.split(" ")[0] for h in headroom] == ["majority", "random-init", "look-up", "trained", "oracle"]

    rows = read(root / "results.csv")
    forks = {f.name: f for f in p.forks}
    at = {"late": p.forks_at(p.base_steps), "scratch": p.forks_at(0)}  # the sharpening fork: late only
    assert len(rows) == len(p.seeds) * sum(len(v) for v in at.values()) * p.schedule.probe_points
    for seed in p.seeds:
        seed_dir = root / "seeds" / f"seed{seed}" / "runs"
        for point in ("late", "scratch"):
            mine = [r for r in rows if int(r["seed"]) == seed and r["point"] == point]
            assert {r["fork"] for r in mine} == {f.name for f in at[point]}
            for f in at[point]:
                name = f.name
                run = "late" if f.base_recipe else point
                kls = {s: ev["kl"] for s, ev in eval_history(seed_dir / f"hmm-s{seed}-{run}-{name}").items()}
                # KL is evaluated where it is read: the measured checkpoints, and every candidate on
                # the first seed (the curves figure)
                assert set(kls) == set(p.candidates(f) if seed == p.seeds[0] else p.probe_steps(f)), name
                measured = sorted((r for r in mine if r["fork"] == name), key=lambda r: int(r["step"]))
                # the fork's measured checkpoints: spread over its stretch, the first and last candidates
                assert [int(r["step"]) for r in measured] == p.probe_steps(f)
                assert p.probe_steps(f)[0] == p.candidates(f)[0] and p.probe_steps(f)[-1] == p.candidates(f)[-1]
                for r in measured:
                    assert float(r["kl"]) == pytest.approx(kls[int(r["step"])], abs=1e-12)
                    # every measured checkpoint is on its stretch: the final lr factor
                    assert float(r["lr_factor"]) == pytest.approx(p.schedule.final_lr_factor)
                    assert 0 < int(r["steps_at_final_lr"]) <= p.final_steps_of(f)
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
            assert scratch.exists() == (not f.base_recipe and not f.late_only)
            if scratch.exists():
                assert '\ninit_from = "' not in (scratch / "config.toml").read_text()
        adv = (seed_dir / f"hmm-s{seed}-late-adv" / "config.toml").read_text()
        assert f'task = "{p.task}"' in adv
    # the size fork started from the base's function: the same exact KL (asserted in the study)
    notes = report[report.index("Size forks start from exactly"):]
    worst = float(notes.split("to ")[1].split(" nats")[0])
    assert worst <= 1e-6
    # every pair's estimate at its target, recomputed from the measured rows: the target from the
    # two forks' KLs alone, each fork's least-squares line through its checkpoints at the target
    pairs = read(root / "pairs.csv")
    comparisons = {c.name: c for c in p.comparisons}
    assert len(pairs) == len(p.seeds) * len(p.tests())
    for pr in pairs:
        c = comparisons[pr["comparison"]]
        of = {f: [r for r in rows if int(r["seed"]) == int(pr["seed"]) and r["point"] == pr["point"] and r["fork"] == f]
              for f in (c.recipe, c.reference)}
        kl = {f: np.array([float(r["kl"]) for r in rs]) for f, rs in of.items()}
        lo, hi = max(kl[f].min() for f in kl), min(kl[f].max() for f in kl)
        target = (lo + hi) / 2
        assert float(pr["target"]) == pytest.approx(target, abs=1e-15)
        for side, f in (("recipe", c.recipe), ("reference", c.reference)):
            assert float(pr[f"{side}_outside"]) == pytest.approx(max(0.0, kl[f].min() - target, target - kl[f].max()))
            key = c.reference_trace if side == "reference" else "trace_fisher"
            for q, col in ((p.primary_key, p.primary_key), ("trace_fisher", key)):
                y = np.array([float(r[col]) for r in of[f]])
                want = np.polyval(np.polyfit(kl[f], y, 1), target) if np.ptp(kl[f]) > 0 else y.mean()
                assert float(pr[f"{side}_{q}"]) == pytest.approx(want, rel=1e-9, abs=1e-12), (pr["test"], side, q)
        assert pr["used"] == "True"  # smoke's limit (1 nat) uses every pair
        lev = sum(1 / len(kl[f]) + (target - kl[f].mean()) ** 2 / ((kl[f] - kl[f].mean()) ** 2).sum() for f in kl)
        assert float(pr["leverage"]) == pytest.approx(lev, rel=1e-9)
    # each difference is the weighted estimate over the used pairs (from pairs.csv alone)
    from sameloss.experiments.stats.weighted import estimate, fits_of
    comparisons_all = {c.name: c for c in p.comparisons}
    for r in primary:
        mine = [dict(pr, seed=int(pr["seed"])) for pr in pairs
                if pr["comparison"] == r["comparison"] and pr["point"] == r["point"]]
        assert int(r["n_used"]) == len(mine) == len(p.seeds) == int(r["all_n"])
        want = estimate(fits_of(mine, p.primary_key, 100.0))
        assert (float(r["mean"]), float(r["t_low"]), float(r["t_high"])) == pytest.approx(
            (want.mean, want.t_low, want.t_high), nan_ok=True)
        assert r["holm_family"] in ("claims", "other comparisons")
        # each verdict reads its claim's own margin, from the paper's effects
        assert float(r["margin"]) == comparisons_all[r["comparison"]].margin
    margins = {r["test"]: r for r in read(root / "margins.csv")}
    assert float(margins["sam05 @ late"]["margin"]) == 0.6 and float(margins["longer @ late"]["margin"]) == 1.0
    assert float(margins["adv @ late"]["effect"]) == 5.5 and "Tables 1–2" in margins["adv @ late"]["source"]
    # the trace of the size contrast is compared in one parameter space
    size = {r["test"]: r for r in read(root / "size.csv")}
    late_size = next(r for r in primary if r["comparison"] == "size" and r["point"] == "late")
    trace_size = next(r for r in diffs if r["family"] == "trace" and r["comparison"] == "size" and r["point"] == "late")
    assert float(trace_size["mean"]) == pytest.approx(float(size["size @ late"]["trace_one_space"]))
    assert float(late_size["mean"]) == pytest.approx(float(size["size @ late"]["acc"]))
    # the figures (plots.py's kinds, through study.figure): each keeps the style's rules and
    # its plotted numbers (<stem>.data.csv) are the tables' numbers
    assert check_report_figures(root) == 4
    assert report.index("![Forest plot](forest.png)") < report.index("![Fig. 1 within seeds](scatter.png)") \
        < report.index("![Training curves of seed 0](curves.png)")
    forest = read_data(root / "forest.data.csv")
    trace = {(r["comparison"], r["point"]): r for r in diffs if r["family"] == "trace"}
    labels = [isoloss.forest_label(r, p) for r in primary]  # the forks' own labels, the reference named
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
    margin = sorted(float(r["x"]) for r in forest if r["kind"] == "ref-x" and r["panel"] == "0")
    assert margin == pytest.approx(sorted([-1.0, 1.0, -0.6, 0.6, 0.0]))  # 0, ± each claim's margin
    scatter = read_data(root / "scatter.data.csv")
    regression = {r["point"]: r for r in read(root / "regression.csv") if "trace" in r["coefficient"]}
    for panel, point in enumerate(("late", "scratch")):
        mine = [r for r in scatter if r["panel"] == str(panel)]
        axes = next(r for r in mine if r["kind"] == "axes")
        assert (axes["x_quantity"], axes["y_quantity"]) == (f"dtrace_{point}", f"dacc_{point}")
        pts = [r for r in mine if r["kind"] == "point"]
        # every seed's models of one size without adv, demeaned within the seed: they sum to 0
        without = set(isoloss.regression_without(p))
        assert without >= {"adv", "large", "sharp"}
        assert len(pts) == len(p.seeds) * (len(forks) - len(without))
        assert abs(sum(float(r["y"]) for r in pts)) < 1e-9 and abs(sum(float(r["x"]) for r in pts)) < 1e-6
        assert {r["series"] for r in pts} == {f.label for name, f in forks.items() if name not in without}
        fit = next(r for r in mine if r["kind"] == "fit")  # the within-seed slope, through 0
        assert fit["note"] == f"slope {float(regression[point]['estimate'])!r}, intercept 0.0"
    curves = read_data(root / "curves.data.csv")
    seed = p.seeds[0]
    runs_dir = root / "seeds" / f"seed{seed}" / "runs"
    for panel, point in enumerate(("late", "scratch")):
        mine = [r for r in curves if r["panel"] == str(panel)]
        # no strips (a fork's line on the first seed is its stretch; strips stretched the log-KL axis)
        assert not any(r["kind"] == "band-x" for r in mine)
        # one colour per series, never two in one colour, up to 20 series (issue 52: tab10 wrapped)
        assert len({series_style(i, str(i), {})["color"] for i in range(20)}) == 20
        # dotted: the lowest and highest KL of the seed's measured checkpoints (every target lies between)
        refs = sorted(float(r["y"]) for r in mine if r["kind"] == "ref-y")
        measured = [float(r["kl"]) for r in rows if r["point"] == point and int(r["seed"]) == seed]
        assert refs == pytest.approx([min(measured), max(measured)])
        targets = [float(pr["target"]) for pr in pairs if pr["point"] == point and int(pr["seed"]) == seed]
        assert all(refs[0] <= t <= refs[1] for t in targets)
        for name, f in forks.items():  # every fork's evaluated KL, exactly, in its fork point's panel
            if f not in p.forks_at(0 if point == "scratch" else p.base_steps) and not f.base_recipe:
                continue
            run = runs_dir / f"hmm-s{seed}-{'late' if f.base_recipe else point}-{name}"
            got = [(float(r["x"]), float(r["y"])) for r in mine if r["kind"] == "point" and r["series"] == f.label]
            assert got == [(float(s), ev["kl"]) for s, ev in sorted(eval_history(run).items())], name
        assert any(r["series"] == "base" for r in mine if r["kind"] == "point")
    for name in ("forest.png", "scatter.png", "curves.png"):
        assert (root / name).stat().st_size > 10_000
        assert not (root / name.replace(".png", ".csv")).exists()  # the figure's data file is its one CSV
    # the dose (scratch − late): every comparison at both points (sharp is forked late only)
    assert {r["comparison"] for r in read(root / "dose.csv")} == {c.name for c in p.comparisons} - {"longer", "sharp"}
    # flatness by assigned arm: per fork point the trend over λ (per seed the slope through AdamW's arm),
    # from the pairs' estimates, every pair (no floor on the realised trace change)
    response = {r["point"]: r for r in read(root / "flatness_trend.csv")}
    assert set(response) == {"late"} and "![Flatness as the treatment" in report  # smoke's one arm: late only
    lam = isoloss.flatness_weights(p)["sharp"] / 1e-4
    mine = [pr for pr in pairs if pr["comparison"] == "sharp" and pr["point"] == "late"]
    slopes = [100 * float(pr[f"d_{p.primary_key}"]) / lam for pr in mine]
    assert float(response["late"]["slope"]) == pytest.approx(np.mean(slopes))
    assert int(response["late"]["n_seeds"]) == len(p.seeds)
    arms = {r["fork"]: r for r in read(root / "flatness_arms.csv")}
    x = [float(pr["recipe_trace_fisher"]) / float(pr["reference_trace_fisher"]) - 1 for pr in mine]
    assert float(arms["sharp"]["trace_change"]) == pytest.approx(np.mean(x))
    dose_fig = read_data(root / "dose.data.csv")
    assert isoloss.flatness_forks(p) == ("sharp",)  # smoke: one flatness fork, the plumbing
    assert len([r for r in dose_fig if r["kind"] == "point" and r["panel"] == "0"]) == len(mine)
    sam = {r["test"] for r in read(root / "sam_controls.csv")}
    assert {"sam05 @ late: pos_lbfgs_n16", "sam05-half @ late: pos_lbfgs_n16", "half-batch @ late: pos_lbfgs_n16"} <= sam
    gate = read(root / "gate.csv")  # every seed's gate (what `sameloss replicate` reads)
    assert [int(r["seed"]) for r in gate] == list(p.seeds) and {r["ok"] for r in gate} <= {"True", "False"}
    assert len(read(root / "runtime.csv")) == len(p.seeds)

    # a second call reuses every run and measurement
    reproduce(Job("isoloss", "smoke", out=tmp_path), Options(progress=False))
    assert "0 rows measured" in (root / "report.md").read_text()


def test_without_headroom_the_study_stops_before_the_forks(tmp_path, monkeypatch):
    from sameloss.measures import run as measure_run

    smoke = isoloss.PRESETS["smoke"]
    p = dataclasses.replace(smoke, verdicts=dataclasses.replace(smoke.verdicts, headroom_margin=60.0,
                                                                on_no_headroom="stop"))
    monkeypatch.setitem(isoloss.PRESETS, "smoke", p)
    probed = []
    original = measure_run.measure_reference
    monkeypatch.setattr(measure_run, "measure_reference", lambda kind, *a, **kw: probed.append(kind)
                        or original(kind, *a, **kw))
    reproduce(Job("isoloss", "smoke", out=tmp_path), Options(progress=False))
    root = tmp_path / "isoloss-smoke"
    # the look-up and oracle representations do not depend on the seed: kept in the study's own
    # measurements.json, one row per seed's probe draw (each seed draws its own probe subsets)
    assert sorted(probed) == sorted(["lookup", "oracle", "random-init"] * len(p.seeds))
    kinds = [k.split("|")[0] for k in json.loads((root / "measurements.json").read_text())]
    assert sorted(kinds) == sorted(["lookup", "oracle"] * len(p.seeds))
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
    assert {r["ok"] for r in read(root / "gate.csv")} == {"False"}


def test_the_headroom_gate_thresholds():
    tiny = isoloss.PRESETS["tiny"]
    p = dataclasses.replace(tiny, verdicts=dataclasses.replace(tiny.verdicts, headroom_margin=5.0))
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
        cfg = isoloss.fork_run(p, 3, forks[name], 0).config()
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
    late = isoloss.fork_run(p, 3, forks["noreg"], p.base_steps).config()
    scratch = isoloss.fork_run(p, 3, forks["noreg"], 0).config()
    assert [late.lr_factor(s) for s in range(late.steps)] == [scratch.lr_factor(s) for s in range(scratch.steps)]


def test_the_adversary_follows_the_presets_task():
    p = isoloss.PRESETS["tiny"]
    other = dataclasses.replace(p, task="task-3", tasks={"hmm": ("task-3", "task-5")})
    adv = next(f for f in p.forks if f.name == "adv")
    settings = dict(isoloss.fork_run(other, 0, adv, other.base_steps).settings)
    assert settings["adversarial.task"] == "task-3" and other.fewshot(0).task == "task-3"
    assert dict(isoloss.fork_run(p, 0, adv, p.base_steps).settings)["adversarial.task"] == "task-5"


def test_the_target_is_the_middle_of_the_overlap_or_of_the_gap():
    # overlapping ranges: the middle of the overlap, both forks inside their ranges
    assert paired.comparison_target([0.010, 0.009, 0.008], [0.0095, 0.0085, 0.0070]) == pytest.approx(0.00875)
    # disjoint ranges (a SAM fork on a higher floor): the middle of the gap, each 1e-3 outside
    t = paired.comparison_target([0.012, 0.011, 0.010], [0.008, 0.007, 0.006])
    assert t == pytest.approx(0.009)
    assert paired.outside([0.012, 0.011, 0.010], t) == pytest.approx(1e-3)
    assert paired.outside([0.008, 0.007, 0.006], t) == pytest.approx(1e-3)
    assert paired.outside([0.008, 0.007, 0.006], 0.0075) == 0.0


def test_the_estimate_at_the_target_is_the_least_squares_line():
    rng = np.random.default_rng(0)
    for _ in range(20):
        kl = rng.uniform(0.004, 0.007, 4)
        y = rng.normal(0.8, 0.05, 4)
        t = rng.uniform(0.003, 0.008)
        assert paired.at_target(kl, y, t) == pytest.approx(np.polyval(np.polyfit(kl, y, 1), t), rel=1e-9)
    # exact on a line; the mean where KL does not vary (nothing to fit)
    assert paired.at_target([1.0, 2.0, 3.0], [5.0, 7.0, 9.0], 2.5) == pytest.approx(8.0)
    assert paired.at_target([0.5, 0.5, 0.5], [1.0, 2.0, 6.0], 0.9) == pytest.approx(3.0)


def _rows(effects, gaps, point="late", n=3):
    """Synthetic measured rows: per seed a reference r on KL 0.010 → 0.008 and a recipe x on
    the same stretch shifted up by ``gap``; accuracy falls 0.5 points per 1e-3 nats along both
    (so estimates at one target differ by exactly the effect), plus the effect (points) on x."""
    rows = []
    for seed, (e, gap) in enumerate(zip(effects, gaps)):
        for fork, shift, extra in (("r", 0.0, 0.0), ("x", gap, e)):
            for i, kl in enumerate(np.linspace(0.010, 0.008, n) + shift):
                acc = 0.80 - 0.5 * 1000 * (kl - 0.009) / 100 + extra / 100
                rows.append({"model": f"s{seed}-{fork}@{i}", "seed": seed, "point": point, "fork": fork, "kl": kl,
                             "acc": acc, "trace_fisher": 10.0 + (3 * (-1) ** seed * seed if fork == "x" else 0) + 100 * kl})
    return rows


DESIGN = Design(trace_margin=0.05, limit=1e-3)  # limit: 1e-3 nats outside a fork's range, the same for every fork


def test_every_pair_is_estimated_at_its_target_and_used():
    """Pairs whose KL ranges do not overlap are not dropped: each fork is estimated at the
    target (the fork's line extended), so the effect is recovered exactly; the exclusion rule
    survives only as the sensitivity beside it (limit 0)."""
    c = Comparison("x", "x", "r", +1, "x raises accuracy")
    effects = [1.0, 1.2, 0.8, 1.1, 0.9]
    gaps = [0.0, 1e-4, -5e-4, 2.5e-3, 3.5e-3]  # the last two ranges lie 0.5e-3 and 1.5e-3 apart
    pairs = paired.estimate_pairs(_rows(effects, gaps), [(c, "late")], ["acc", "trace_fisher"], DESIGN)
    assert [p["seed"] for p in pairs] == [0, 1, 2, 3, 4]
    for p, e in zip(pairs, effects):
        assert 100 * p["d_acc"] == pytest.approx(e, abs=1e-9)
    # seed 3: ranges 0.5e-3 apart, each fork 0.25e-3 outside; seed 4: 0.75e-3 each, within the 1e-3 nats limit
    assert pairs[3]["recipe_outside"] == pytest.approx(2.5e-4) and pairs[3]["reference_outside"] == pytest.approx(2.5e-4)
    assert [p["used"] for p in pairs] == [True] * 5
    assert [p["inside"] for p in pairs] == [True, True, True, False, False]
    out = paired.differences(pairs, [(c, "late")], [("acc", "acc")], "acc", DESIGN)
    acc = out[0]
    assert (acc["n_pairs"], acc["n_used"], acc["n_beyond_limit"]) == (5, 5, 0)
    # noise-free lines: no checkpoint noise to weigh (σ² = 0), every pair weighs the same
    assert acc["mean"] == pytest.approx(np.mean(effects)) and acc["verdict"] == DETECTED and acc["sigma2"] < 1e-20
    # the sensitivity: only the pairs whose target lies inside both ranges, and every pair
    assert acc["inside_n"] == 3 and acc["inside_mean"] == pytest.approx(np.mean(effects[:3]))
    assert acc["all_n"] == 5 and acc["all_mean"] == pytest.approx(acc["mean"])
    # the trace's margin is 5 % of the reference's mean trace at the targets
    trace = out[1]
    ref = np.mean([p["reference_trace_fisher"] for p in pairs])
    assert trace["margin"] == pytest.approx(0.05 * ref)


def test_a_pair_beyond_the_limit_is_named_not_silently_dropped():
    c = Comparison("x", "x", "r", +1, "")
    pairs = paired.estimate_pairs(_rows([1.0, 1.2, 0.8], [0.0, 0.0, 5e-3]), [(c, "late")], ["acc", "trace_fisher"],
                                  DESIGN)
    far = pairs[2]
    assert not far["used"] and "1.50e-03 nats outside its measured KL range (limit 1.0e-03 nats)" in far["reason"]
    out = paired.differences(pairs, [(c, "late")], [("acc", "acc")], "acc", DESIGN)
    assert (out[0]["n_used"], out[0]["n_beyond_limit"], out[0]["all_n"]) == (2, 1, 3)
    section = Section("")
    pairs_table(section, pairs, "acc")
    assert "x @ late, seed 2:" in section.notes[-1] and "estimated 1.50e-03 nats outside" in section.notes[-1]
    assert section.files["pairs.csv"] is pairs


def test_a_missing_measured_column_is_an_error_naming_it():
    c = Comparison("x", "x", "r", +1, "")
    rows = _rows([1.0, 1.2], [0.0, 0.0])
    del rows[4]["acc"]
    with pytest.raises(ValueError, match="s0-x@1 has no measured column 'acc'"):
        paired.estimate_pairs(rows, [(c, "late")], ["acc"], DESIGN)
    with pytest.raises(ValueError, match="no measured column 'trace_fisher_embedded'"):
        paired.estimate_pairs(_rows([1.0, 1.2], [0.0, 0.0]),
                              [(Comparison("x", "x", "r", +1, "", "trace_fisher_embedded"), "late")],
                              ["trace_fisher"], DESIGN)


def test_verdicts_use_the_fixed_margin_and_tost():
    c = Comparison("x", "x", "r", +1, "x raises accuracy", margin=0.35)

    def verdict(effects, design=DESIGN):
        pairs = paired.estimate_pairs(_rows(effects, [0] * len(effects)), [(c, "late")], ["acc", "trace_fisher"],
                                      design)
        return paired.differences(pairs, [(c, "late")], [("acc", "acc")], "acc", design)

    # a null shown: the 90 % interval inside ±0.35; one that only holds 0 is inconclusive
    assert verdict([0.05, -0.05, 0.02, -0.03, 0.01])[0]["verdict"] == EQUIVALENT
    assert verdict([1.0, -1.0, 0.5, -0.6, 0.1])[0]["verdict"] == INCONCLUSIVE
    # the trace's verdict never uses its own MDE as the margin: spread traces are inconclusive
    out = verdict([1.0, 1.2, 0.8, 1.1, 0.9])
    assert out[1]["margin"] == pytest.approx(0.05 * np.mean([10.9] * 5)) and out[1]["verdict"] == INCONCLUSIVE
    # no headroom: every verdict is uninformative
    blind = dataclasses.replace(DESIGN, headroom=False)
    assert {r["verdict"] for r in verdict([1.0, 1.2, 0.8], blind)} == {UNINFORMATIVE}


def test_presets_are_checked():
    p = isoloss.PRESETS["tiny"]
    assert p.languages == {"hmm": "headroom"} and p.kl_tolerance == 3e-4 and set(p.fork_points) == {0, p.base_steps}
    q = isoloss.PRESETS["quick"]
    # the main job: tiny's design cut to its plan (the forks of the planned tests, their fork points)
    assert q.seed_design.plan == isoloss.QUICK_PLAN and q.seed_design.prior_seeds == isoloss.PILOT_SEEDS
    assert q.seeds == p.seeds[:len(q.seeds)]
    assert [f for f in p.forks if f in q.forks] == list(q.forks)
    same = dataclasses.replace(q, forks=p.forks, fork_points=p.fork_points, seeds=p.seeds, seed_design=p.seed_design,
                               comparisons=p.comparisons, claims=p.claims)
    assert dataclasses.replace(q.seed_design, plan=p.seed_design.plan, left=p.seed_design.left,
                               budget_minutes=p.seed_design.budget_minutes) == p.seed_design
    assert same == p
    assert [f"{c.name} @ {pt}" for c, pt in q.tests()] == [t for t, _ in q.seed_design.plan]
    with pytest.raises(ValueError, match="fork points"):
        dataclasses.replace(p, fork_points=(p.base_steps + 1,))
    with pytest.raises(ValueError, match="final steps"):
        dataclasses.replace(p, schedule=dataclasses.replace(p.schedule, final_steps=30))
    with pytest.raises(ValueError, match="primary size"):
        dataclasses.replace(p.probes, primary_size=7)
    with pytest.raises(ValueError, match="on_no_headroom"):
        dataclasses.replace(p.verdicts, on_no_headroom="ignore")
    with pytest.raises(ValueError, match="probe_points >= 3"):
        dataclasses.replace(p.schedule, probe_points=2)
    with pytest.raises(ValueError, match="measured checkpoints"):
        dataclasses.replace(p, schedule=dataclasses.replace(p.schedule, probe_points=40))
    with pytest.raises(ValueError, match="trace_margin"):
        dataclasses.replace(p.verdicts, trace_margin=0.0)
    # a late-only fork (tiny's adversary) has no run and no comparison from scratch
    adv = {f.name: f for f in p.forks}["adv"]
    assert adv.late_only and adv not in p.forks_at(0) and adv in p.forks_at(p.base_steps)
    assert not any(r.name.endswith("scratch-adv") for r in isoloss.runs(p, "hmm", 0))
    assert any(r.name.endswith("scratch-noreg") for r in isoloss.runs(p, "hmm", 0))
    tests = {(c.name, pt) for c, pt in p.tests()}
    assert ("adv", "late") in tests and ("adv", "scratch") not in tests and ("noreg", "scratch") in tests
    assert ("size", "scratch") in tests and ("longer", "scratch") not in tests
    # the size fork: the same width, two more blocks (a 2x wider one costs 4x per step at tiny)
    large = {f.name: f for f in p.forks}["large"]
    assert (large.width_factor, large.extra_layers) == (1, 2)
    # every candidate lies on the stretch at the final lr
    for f in p.forks:
        cfg = isoloss.fork_run(p, 0, f, p.base_steps).config()
        assert all(cfg.lr_factor(s - 1) == pytest.approx(p.schedule.final_lr_factor) for s in p.candidates(f))
        assert cfg.lr_factor(p.stretch_start(f) - 2) > p.schedule.final_lr_factor
    # every claim carries its margin from the paper's effects (1 point; SAM's recovery 0.6), the positive
    # control its planned effect
    margins = {c.name: (c.margin, c.planned_effect) for c in p.comparisons}
    assert margins["longer"] == (1.0, 1.0) and margins["sam05-half"] == (0.6, 0.6) and margins["adv"] == (1.0, 5.5)
    assert p.verdicts.secondary_margin == 0.35 and p.verdicts.extrapolation_limit == 5e-4
    assert set(p.claims) == set(isoloss.CLAIMS) and all(c.margin_source for c in p.comparisons)


def _claim_row(comparison, mean, low, high, verdict, decided, margin=1.0, n=6):
    return {"comparison": comparison, "point": "late", "family": "primary", "holm_family": "claims",
            "recipe": comparison, "reference": "adamw", "mean": mean, "t_low": low, "t_high": high,
            "verdict": verdict, "decided": decided, "after_holm": "survives" if decided else "",
            "margin": margin, "effect": margin, "n_used": n, "n_pairs": n, "power": 0.9, "sd": 0.5,
            "holm_m": 4, "power_detect": 0.9, "power_equivalence": 0.85, "mde": 0.8}


def test_the_answer_is_one_sentence_then_the_claims_decided_after_holm():
    """The answer opens with the flatness treatment (what the arms did to the trace, whether
    transfer moved beyond the margin), then the paper's claims, the positive control named as
    such; then one line per claim decided after Holm, the undecided with the seeds they would
    need; a verdict that does not survive Holm is never counted as decided."""
    from sameloss.experiments.recipes.isoloss.analysis import answer, decided

    p = dataclasses.replace(isoloss.PRESETS["tiny"], claims=("longer @ late", "flat @ late", "sharp @ late",
                                                             "adv @ late"))
    diffs = [_claim_row("flat", 0.12, -0.31, 0.55, EQUIVALENT, True), _claim_row("sharp", -0.08, -0.5, 0.3,
                                                                                 EQUIVALENT, True),
             _claim_row("longer", 0.4, -0.6, 1.4, INCONCLUSIVE, False), _claim_row("adv", -4.93, -6.74, -3.11,
                                                                                   DETECTED, True)]
    diffs[1]["recipe"] = "sharp"
    flat = {"changes": [{"fork": "flat", "point": "late", "trace_change": -0.26},
                        {"fork": "sharp", "point": "late", "trace_change": 0.25}]}
    section = Section("Verdicts", lead=True)
    rows = decided(section, p, diffs, [], flat)
    first = section.answer[0]
    assert first.startswith("**Answer:** at the same pre-training loss, the trace penalty moved flatness "
                            "(flat -26 %, sharp +25 % trace at the target loss)")
    assert "but transfer did not move beyond ±1 point" in first
    assert "the adversary (the positive control), late: detected in the paper's direction (-4.93 [-6.74, -3.11]" \
        in first
    assert "training longer, late: undecided (+0.40 [-0.60, 1.40] points)" in first
    assert section.answer[1].startswith("**Decided 3 of 4 claims**")
    longer = next(x for x in rows if x["test"] == "longer @ late")
    assert not longer["decided"] and longer["seeds_needed"] > 6
    assert any(line.startswith("- longer @ late: undecided") and f"needs {longer['seeds_needed']} seeds" in line
               for line in section.answer)
    # detected before Holm but not after: not decided, said so
    diffs[3] = dict(diffs[3], decided=False, after_holm="does not survive")
    lines = answer(p, diffs, decided(Section("x", lead=True), p, diffs, [], flat), [], flat)
    assert lines[1].startswith("**Decided 2 of 4 claims**") and "before Holm, not after" in lines[0]


def test_the_flatness_arms_measure_and_report_the_rescaling_guards():
    """At tiny the flatness arms and AdamW measure the weight norms and the adaptive trace beside
    the trace (the other forks do not); their change at the target KL is in the arms' table, next
    to the trace's, so that a lower trace is not a rescaling of the weights alone."""
    from sameloss.experiments.recipes.isoloss.analysis import flatness
    from sameloss.experiments.recipes.isoloss.study import RESCALING, _arm_spec

    p = isoloss.PRESETS["tiny"]
    forks = {f.name: f for f in p.forks}
    for name in ("adamw", "flat", "sharp"):
        assert set(RESCALING) <= set(_arm_spec(p, 0, forks[name]).extra), name
    assert not set(RESCALING) & set(_arm_spec(p, 0, forks["noreg"]).extra)
    assert not _arm_spec(isoloss.PRESETS["smoke"], 0, forks["adamw"]).extra  # smoke: off (its numbers are pinned)
    rows = []
    for seed in range(4):
        for fork, scale in (("adamw", 1.0), ("flat", 0.7), ("sharp", 1.3)):
            for i, kl in enumerate((0.010, 0.009, 0.008)):
                rows.append({"seed": seed, "point": "late", "fork": fork, "kl": kl + 1e-5 * seed, "model": f"{fork}{i}",
                             "run": f"r-{fork}", "step": i, p.primary_key: 0.8, "trace_fisher": 10.0 * scale,
                             "weight_norm_sq": 50.0 * (1 + 0.01 * seed), "adaptive_trace": 4.0 * scale})
    section = Section("")
    flat = flatness(section, p, rows, p.design(), ["late"])
    arms = {c["fork"]: c for c in flat["changes"]}
    assert arms["flat"]["trace_change"] == pytest.approx(-0.3) and arms["flat"]["adaptive_trace_change"] == \
        pytest.approx(-0.3)
    assert arms["sharp"]["weight_norm_sq_change"] == pytest.approx(0.0, abs=1e-12)
    headers = [c.header for c in section.tables[0].columns]
    assert "weight norm² change (%) [95%]" in headers and "adaptive trace change (%) [95%]" in headers
