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
from sameloss.experiments import plan as planner
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
        assert main(["plan", name, "--scale", scale, "--device", "cpu", "--cpu-peak", "50",
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
    assert main(["plan", "isoloss", "--scale", "quick", "--device", "h100", "--out", "unused"]) == 0
    assert "plan: isoloss --scale quick on h100" in capsys.readouterr().out
    assert not os.path.exists("unused")
    assert main(["plan", "dyck", "--scale", "quick", "--device", "h100"]) == 2
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
    from sameloss.experiments.common import language_parts
    from sameloss.experiments.engine import Setup

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

    def ratio(**flatness):
        penalised = dataclasses.replace(cfg, flatness=dataclasses.replace(cfg.flatness, **{"weight": 1e-4, **flatness}))
        return planner.training_flops(penalised, m)[1] / plain

    # bench/bench_flatness.py's ratios on this design (batch 256, 32 sentences): 2.31, 8.19, 10.8
    assert ratio() == pytest.approx(2.31, abs=0.01)
    assert ratio(labels=0) == pytest.approx(1 + 15.7 * m.vocab * 32 / (3 * 256), rel=1e-9)
    assert ratio(measure="hutchinson") == pytest.approx(10.77, abs=0.01)
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


@pytest.mark.parametrize("args", [("nope", "--scale", "tiny", "--device", "cpu"),
                                  ("steps", "--scale", "huge", "--device", "cpu"),
                                  ("steps", "--scale", "tiny", "--device", "tpu"),
                                  ("steps", "--scale", "tiny", "--device", "cpu", "--workers", "0"),
                                  ("steps", "--scale", "tiny", "--device", "cpu", "--cpu-peak", "-1")])
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
    for word in ("--scale", "--device", "--workers", "--cpu-peak", "h100", "a100", "utilisation"):
        assert word in r.stdout, word


def test_a_gated_study_is_planned_with_its_forks():
    """quick stops a seed's forks when its headroom gate fails (on_no_headroom="stop"); the
    plan measures nothing, so it assumes the gate passes and lists every seed's forks."""
    from sameloss.experiments.recipes import isoloss

    p = isoloss.PRESETS["tiny"]
    assert p.on_no_headroom == "stop" and p.headroom_margin > 0
    plan = planner.dry_plan("isoloss", "tiny", "unused", preset=isoloss.with_even(p))
    bases = [r for r in plan.runs if r.name.endswith("-base")]
    assert len(bases) == p.even_seeds
    late = len(p.forks)  # every fork at the late point (the size fork trained on its embedded start)
    scratch = sum(1 for f in p.forks_at(0) if not f.base_recipe)
    # tiny's forks: no sam02, the adversary and the sharpening fork late only; 3 flatness forks
    assert (late, scratch) == (11, 6)
    assert len(plan.runs) == p.even_seeds * (1 + late + scratch)
    # the main job's plan: seed i runs the forks of the tests planned more than i seeds
    q = isoloss.PRESETS["quick"]
    quick = planner.dry_plan("isoloss", "quick", "unused")
    per_seed = [sum(1 for r in quick.runs if f"-s{s}-" in r.name and not r.name.endswith("-base"))
                for s in q.seeds]
    assert per_seed == [len({f for _, f in isoloss.forks_of(q, q.planned_tests(i))}) for i in range(len(q.seeds))]
