"""``sameloss plan``: its FLOP count against torch's counter, every recipe planned at smoke
and tiny without a file written, one-line errors, and a --help that imports no torch."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from sameloss import registry
from sameloss.cli import main
from sameloss.experiments.engine import hardware
from sameloss.experiments.engine import plan as planner
from sameloss.training.config import FLATNESS_SIGNS_FORWARDS
from sameloss.models import build_model


@pytest.mark.parametrize("size,vocab,max_len", [("tiny", 203, 32), ("micro", 40, 12)])
def test_forward_and_training_flops_match_torch_counter(size, vocab, max_len):
    model = build_model("transformer", size, vocab, max_len, dropout=0.0)
    c = model.config
    shape = planner.ModelShape("transformer", vocab, max_len, c.d_model, c.n_layers, c.d_inter,
                               mlm_head_transform=c.mlm_head_transform)
    batch = 8
    tokens = torch.randint(0, vocab - 3, (batch, max_len))
    with FlopCounterMode(display=False) as counter:
        model(tokens)
    forward = counter.get_total_flops()
    counted = planner.forward_flops_per_token(shape) * batch * max_len
    # torch counts the same matmuls (measured: equal to the FLOP on tiny and micro)
    assert abs(counted - forward) / forward < 0.01, (counted, forward)
    with FlopCounterMode(display=False) as counter:
        model(tokens).logsumexp(-1).sum().backward()
    step = counter.get_total_flops()
    # a step is 3x the forward: the backward's two products per matmul
    assert abs(3 * counted - step) / step < 0.01, (3 * counted, step)


def _files(folder):
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.mark.parametrize("scale", ["smoke", "tiny"])
def test_every_recipe_is_planned_and_nothing_is_written(scale, tmp_path, monkeypatch, capsys):
    cwd, out = tmp_path / "cwd", tmp_path / "out"
    cwd.mkdir()
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    monkeypatch.chdir(cwd)
    for name in registry.recipes():
        assert main(["plan", name, "--scale", scale, "--hardware", "cpu", "--cpu-peak", "50",
                     "--out", str(out)]) == 0, name
        text = capsys.readouterr().out
        assert f"plan: {name} --scale {scale} on cpu" in text
        for stage in planner.STAGES:
            assert f"\n{stage} " in text, (name, stage)
        assert "runs: " in text and "peak memory" in text
        assert "50 GFLOP/s" in text
    assert _files(cwd) == []
    assert _files(out) == ["keep.txt"]


def test_plan_accepts_every_scale_reproduce_accepts(capsys):
    """``quick`` (the main job's scale, isoloss's only) is planned like the others; a recipe
    without it is refused in one line, as ``reproduce`` refuses it."""
    assert main(["plan", "isoloss", "--scale", "quick", "--hardware", "h100", "--out", "unused"]) == 0
    assert "plan: isoloss --scale quick on h100" in capsys.readouterr().out
    assert not os.path.exists("unused")
    assert main(["plan", "dyck", "--scale", "quick", "--hardware", "h100"]) == 2
    assert capsys.readouterr().err.strip().endswith("unknown scale 'quick'; choose from smoke, tiny, small, paper")


def test_plan_counts_the_recipes_runs_and_steps():
    from sameloss.experiments.recipes import steps

    p = steps.PRESETS["tiny"]
    plan = planner.dry_plan("steps", "tiny", "unused")
    assert not os.path.exists("unused")
    specs = [spec for q, lang in _parts(p) for spec in steps.runs(q, lang, 0)]
    assert [r.name for r in plan.runs] == [spec.name for spec in specs]
    # every run's measured checkpoints, each once
    assert [m.run for m in plan.measures] == [s.name for s in specs for _ in (s.measure_steps or (0,))]
    e = planner.estimate(plan, "h100", workers=2, memory=False)
    one = planner.estimate(plan, "h100", workers=1, memory=False)
    assert e.seconds == pytest.approx(one.seconds)
    assert one.wall == pytest.approx(one.seconds)
    assert one.seconds / 2 * (1 - 1e-9) <= e.wall < one.seconds
    flops = sum(planner.training_flops(r.config, planner.model_shape(r.config, {}), r.start_step)[1]
                for r in plan.runs)
    assert e.stages["training"]["flops"] == pytest.approx(flops)


def _parts(p):
    from sameloss.experiments.presets.common import language_parts
    from sameloss.experiments.engine.walk import Setup

    return [(q, lang.name) for q, lang in language_parts(Setup("unused", 0, print, planning=True), p, None)]


def test_continued_fork_counts_only_its_own_steps():
    plan = planner.dry_plan("isoloss", "smoke", "unused")
    base = next(r for r in plan.runs if r.name.endswith("-base"))
    forks = [r for r in plan.runs if r.study == base.study and r is not base]
    late = [r for r in forks if "-late-" in r.name]
    scratch = [r for r in forks if "-scratch-" in r.name]
    assert late and scratch and len(late) + len(scratch) == len(forks)
    assert all(r.start_step == base.config.steps for r in late) and all(r.start_step == 0 for r in scratch)
    m = planner.model_shape(base.config, {})
    steps, _ = planner.training_flops(late[0].config, m, late[0].start_step)
    assert steps == late[0].config.steps - base.config.steps
    # a fork evaluates its KL at its kept checkpoints and its end only (eval.at_checkpoints)
    for r in forks:
        kept = {s for s in r.config.checkpoint_steps() if s > r.start_step}
        assert planner.training_evaluations(r.config, r.start_step) == len(kept)


def test_a_flatness_penalty_adds_its_measured_cost_per_step():
    from sameloss.experiments.recipes.isoloss import PRESETS, base_run

    cfg = base_run(PRESETS["tiny"], 0).config()
    m = planner.model_shape(cfg, {})
    plain = planner.training_flops(cfg, m)[1]
    # the treatments the planner sums: every config field that declares its cost
    assert [type(t).__name__ for t in cfg.treatments()] == ["SAMConfig", "AdversarialConfig", "FlatnessConfig"]

    def ratio(**flatness):
        penalised = dataclasses.replace(cfg, flatness=dataclasses.replace(cfg.flatness, **{"weight": 1e-4, **flatness}))
        return planner.training_flops(penalised, m)[1] / plain

    # the signs estimator (the default): FLATNESS_SIGNS_FORWARDS forwards per sentence of the
    # slice, whatever the label count (every label rides on one backward)
    signs = 1 + FLATNESS_SIGNS_FORWARDS * 32 / (3 * 256)
    assert ratio() == pytest.approx(signs, rel=1e-9)
    assert ratio(labels=0) == pytest.approx(signs, rel=1e-9)
    # the Fisher estimator, bench/bench_flatness.py's ratios on this design (batch 256, 32
    # sentences): 2.31, 8.19, 10.8
    assert ratio(estimator="fisher") == pytest.approx(2.31, abs=0.01)
    assert ratio(estimator="fisher", labels=0) == pytest.approx(1 + 15.7 * m.vocab * 32 / (3 * 256), rel=1e-9)
    assert ratio(estimator="fisher", measure="hutchinson") == pytest.approx(10.77, abs=0.01)
    assert ratio(weight=0.0) == 1.0


def test_size_fork_is_planned_at_the_embedded_shape():
    """The late size fork starts from the base embedded 2x wider with one more block: the
    plan trains and measures that shape, not the small one (the planner's walk, as the engine's)."""
    plan = planner.dry_plan("isoloss", "smoke", "unused")
    base = next(r for r in plan.runs if r.name.endswith("-base"))
    small = planner.model_shape(base.config, {})
    large = next(r for r in plan.runs if r.name.endswith("-late-large"))
    big = planner.model_shape(large.config, {})
    assert (big.d_model, big.n_layers) == (2 * small.d_model, small.n_layers + 1)
    embedded = [ms for ms in plan.measures if ms.embedded_into]
    assert embedded and all(planner.model_shape(ms.config, {}).d_model == big.d_model for ms in embedded)


def _cli(*args):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "sameloss.cli", *args], capture_output=True, text=True, env=env)


@pytest.mark.parametrize("args", [("nope", "--scale", "tiny", "--hardware", "cpu"),
                                  ("steps", "--scale", "huge", "--hardware", "cpu"),
                                  ("steps", "--scale", "tiny", "--hardware", "tpu"),
                                  ("steps", "--scale", "tiny", "--hardware", "cpu", "--workers", "0"),
                                  ("steps", "--scale", "tiny", "--hardware", "cpu", "--cpu-peak", "-1")])
def test_bad_input_is_one_line_and_exit_2(args):
    r = _cli("plan", *args)
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_help_names_the_options_and_imports_no_torch():
    code = ("import sys\nfrom sameloss.cli import main\n"
            "try:\n    main(['plan', '--help'])\nexcept SystemExit:\n    pass\n"
            "print('TORCH' if 'torch' in sys.modules else 'NOTORCH')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0
    assert r.stdout.strip().endswith("NOTORCH")
    for word in ("--scale", "--hardware", "--workers", "--runs", "--cpu-peak", "h100", "a100", "utilisation"):
        assert word in r.stdout, word


def test_a_gated_study_is_planned_with_its_forks():
    """quick stops a seed's forks when its headroom gate fails (on_no_headroom="stop"); the
    plan measures nothing, so it assumes the gate passes and lists every seed's forks."""
    from sameloss.experiments.recipes import isoloss

    from sameloss.experiments.recipes.isoloss.allocation import _unplanned

    p = dataclasses.replace(_unplanned(isoloss.PRESETS["tiny"]), seeds=tuple(range(4)))
    assert p.verdicts.on_no_headroom == "stop" and p.verdicts.headroom_margin > 0
    plan = planner.dry_plan("isoloss", "tiny", "unused", preset=p)
    bases = [r for r in plan.runs if r.name.endswith("-base")]
    assert len(bases) == 4
    late = len(p.forks)  # every fork at the late point (the size fork trained on its embedded start)
    scratch = sum(1 for f in p.forks_at(0) if not f.base_recipe)
    # tiny's forks: no sam02, the adversary and the sharpening fork late only; 3 flatness forks
    assert (late, scratch) == (11, 6)
    assert len(plan.runs) == 4 * (1 + late + scratch)
    # the main job's plan: seed i runs the forks of the tests planned more than i seeds
    q = isoloss.PRESETS["quick"]
    quick = planner.dry_plan("isoloss", "quick", "unused")
    per_seed = [sum(1 for r in quick.runs if f"-s{s}-" in r.name and not r.name.endswith("-base"))
                for s in q.seeds]
    # one run per (fork point, fork) the seed's tests need; AdamW's scratch entry is its late run
    runs = [{x for x in isoloss.forks_of(q, q.planned_tests(i)) if x != ("scratch", "adamw")} for i in range(len(q.seeds))]
    assert per_seed == [len(r) for r in runs]


def test_the_summary_comes_first_and_the_runs_only_with_runs(capsys):
    """Wall time and totals lead; the run rows come only with ``--runs`` (issue 50)."""
    args = ["plan", "steps", "--scale", "smoke", "--hardware", "cpu", "--cpu-peak", "50"]
    assert main(args) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith("wall time: ~") and lines[2].startswith("runs: ")
    assert not any(line.startswith("run ") for line in lines)
    n = int(lines[2].split()[1].rstrip(","))
    assert lines[-1] == f"(--runs lists the {n} runs: model, steps, FLOPs, peak memory)"
    assert main(args + ["--runs"]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("run "))
    assert len(lines) - header - 1 == n  # one row per run, at the end


def test_bare_plan_plans_the_main_job(monkeypatch, capsys):
    """``sameloss plan`` is ``plan isoloss --scale quick`` on the workers ``reproduce`` would use;
    the old ``--device`` still works, with a note naming ``--hardware``."""
    monkeypatch.setattr("sameloss.experiments.cli._plan_workers", lambda experiment, hardware: 2)
    assert main(["plan", "--cpu-peak", "50"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("plan: isoloss --scale quick on cpu (2 workers)")
    assert main(["plan", "isoloss", "--device", "h100"]) == 0
    captured = capsys.readouterr()  # the note: stdout, or stderr where stdout holds data (progress.say)
    assert "note: --device is now --hardware" in captured.out + captured.err
    assert "plan: isoloss --scale quick on h100 (2 workers)" in captured.out


def test_plan_names_a_missing_submitit_instead_of_forecasting_one_worker_silently(monkeypatch, capsys):
    """Without submitit, ``reproduce`` runs the main job's seeds one after another, so ``plan``
    forecasts one worker: it says so and why, and how to get the machine's workers (issue 62)."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "submitit" else real(name, *a))
    monkeypatch.setattr("os.cpu_count", lambda: 4)
    assert main(["plan", "--scale", "smoke", "--cpu-peak", "50"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "plan: isoloss --scale smoke on cpu — nothing is run or written"
    assert lines[1].startswith("note: submitit is not installed, so `sameloss reproduce` would run isoloss's seeds "
                               "one after another and this forecast is for one worker")
    assert lines[1].endswith("`sameloss plan --workers 4` forecasts that")
    assert main(["plan", "--scale", "smoke", "--cpu-peak", "50", "--workers", "2"]) == 0
    assert "submitit" not in capsys.readouterr().out  # a forecast for the workers asked for says nothing of it
    monkeypatch.setattr(importlib.util, "find_spec", real)
    from sameloss.experiments.reports.plan import missing_launcher_note

    assert missing_launcher_note("isoloss", "cpu", 1) == ""  # installed: nothing to say (here, 1 means asked for)
    assert missing_launcher_note("steps", "cpu", 1) == ""


def test_a_launch_bound_gpu_step_is_said_with_what_would_fill_the_card():
    """On an H100 the tiny model's step takes the 8.7 ms floor: the stage's utilisation is what
    the floor leaves (far below the assumed 25 %), and the plan says how many models per launch
    would fill the card: the floor over one step's FLOP time (checked by hand here)."""
    from sameloss.experiments.reports.plan import format_plan

    e = planner.estimate(planner.dry_plan("isoloss", "smoke", "unused"), "h100", memory=False)
    assert all(r["launch_bound"] for r in e.runs)
    flops = e.stages["training"]["flops"]
    assert e.training_utilisation() == pytest.approx(flops / (e.stages["training"]["seconds"] * 989.5e12))
    assert e.training_utilisation() < 0.01
    rate = 989.5e12 * hardware.UTILISATION["h100"]["training"]
    per_step = sorted(r["flops"] / r["steps"] / rate for r in e.runs)
    assert e.fill() == int(8.7e-3 / per_step[len(per_step) // 2]) > 100
    text = format_plan(e)
    assert f"training is launch-bound: {len(e.runs)} of {len(e.runs)} runs" in text
    assert f"About {e.fill()} models per launch would fill it" in text
    assert "25%" not in text.split("training is launch-bound")[0]  # the table shows what the floor leaves
    cpu = planner.estimate(planner.dry_plan("isoloss", "smoke", "unused"), "cpu", cpu_peak=50e9, memory=False)
    assert not any(r["launch_bound"] for r in cpu.runs) and "launch-bound" not in format_plan(cpu)


def test_the_plan_says_first_which_claims_a_design_is_expected_to_decide(capsys):
    """``sameloss plan isoloss --scale tiny``: first the claims the design is expected to decide,
    each with its seeds, margin, prior SD and planned power after Holm; a claim without a prior SD
    is said to have none; a design's seed prices its late run where a scratch entry reads it."""
    from sameloss.experiments.engine.declare import CostPart
    from sameloss.experiments.recipes import isoloss
    from sameloss.experiments.recipes.isoloss import allocation

    assert main(["plan", "isoloss", "--scale", "tiny", "--cpu-peak", "50"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith("Claims first: the 180-minute budget on 2 workers is expected to decide")
    for test, n in isoloss.TINY_PLAN:
        if test in isoloss.PRESETS["tiny"].claims:
            assert f"{test} (" in lines[1] and f"{n} seeds" in lines[1]
    p = isoloss.PRESETS["tiny"]
    without = [t for t in p.claims if not t.startswith("adv")][:1]
    p = dataclasses.replace(p, seed_design=dataclasses.replace(
        p.seed_design, prior_sds=tuple(x for x in p.seed_design.prior_sds if x[0] not in without)))
    assert all("no prior SD" in x for x in allocation.decided_forecast(p) if x.startswith(without[0]))
    costs = allocation.planned_costs(allocation._unplanned(p), "cpu", 50e9, 2)
    scratch_only = ["noreg @ scratch"]  # noreg against adamw from scratch: adamw's entry there is its late run
    assert CostPart("scratch", "adamw", "train") not in costs and costs[CostPart("late", "adamw", "train")] > 0
    full = allocation._unplanned(p)
    assert allocation.seed_cost(full, costs, scratch_only) > allocation.seed_cost(full, {
        k: v for k, v in costs.items() if k != CostPart("late", "adamw", "train")}, scratch_only)


def test_the_devices_numbers_are_one_calibration_record_each_with_its_source():
    """What the planner knows of a device is read from ``engine/calibration.toml`` (no number
    measured on a machine lives in code): every device's peaks and stage shares, the step
    floors and the ensemble step come from it, and each carries where it comes from."""
    import tomllib

    record = tomllib.loads(hardware.CALIBRATION.read_text())
    assert hardware.UTILISATION == {d: {s: shares[s] for s in hardware.STAGES}
                                    for d, shares in record["utilisation"].items()}
    assert set(hardware.UTILISATION) == set(hardware.STEP_FLOOR_S) == {"cpu", *hardware.DEVICES}
    assert hardware.DEVICES["h100"]["bf16"] == record["devices"]["h100"]["bf16"]
    assert hardware.ENSEMBLE_STEP_S["h100"] == (record["ensemble_step"]["h100"]["fixed"],
                                                record["ensemble_step"]["h100"]["per_member"])
    assert hardware.REFERENCE_CPU_PEAK == record["reference_cpu"]["peak"]
    for section in (*record["devices"].values(), *record["utilisation"].values(), record["step_floor"],
                    record["reference_cpu"], record["workers_per_gpu"]):
        assert section["source"].strip()
    assert record["ensemble_step_source"]["text"] == hardware.ENSEMBLE_SOURCE
    from sameloss.experiments.engine.launch import WORKERS_PER_GPU
    assert WORKERS_PER_GPU == record["workers_per_gpu"]["value"]
