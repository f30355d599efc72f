"""The text ``sameloss plan`` prints (``plan_text``): the runs, the peak memory per measure
and the time per stage of an ``experiments.plan.Estimate``, with where each number comes
from."""

from __future__ import annotations

from ...errors import UserError
from ..engine.hardware import (DEVICES, ENSEMBLE_SOURCE, STAGES, STEP_FLOOR_S, UTILISATION, UTILISATION_SOURCE,
    device_memory)
from ..engine.plan import Estimate, dry_plan, estimate


def _si(x: float, unit: str = "") -> str:
    for factor, prefix in ((1e18, "E"), (1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= factor:
            return f"{x / factor:.3g} {prefix}{unit}"
    return f"{x:.3g} {unit}"


def _bytes(b: int | None) -> str:
    if b is None:
        return "-"
    return f"{b / 2**30:.2f} GiB" if b >= 2**30 else f"{b / 2**20:.1f} MiB"


def _duration(s: float) -> str:
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    if s < 3 * 86400:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.1f} days"


def format_plan(e: Estimate, runs: bool = False, forecast: str = "", ceiling: str = "") -> str:
    """The text ``sameloss plan`` prints: the summary first (wall time, totals, the budget's
    forecast), then the time per stage, the hardware, the peak memory per measure and what
    the utilisations rest on; one row per run only with ``runs``.

    Args:
        e: the estimate (``plan.estimate``).
        runs: list every run (``--runs``).
        forecast: the recipe's budget forecast, shown first ("" for none).
        ceiling: what the planned runs are when a forecast cuts them to a budget (the wall
            time and totals below are then that ceiling's, said so).

    Returns:
        the text, lines joined.
    """
    p = e.plan
    lines = [f"plan: {p.experiment} --scale {p.scale} on {e.device}"
             + (f" ({e.workers} workers)" if e.workers > 1 else "") + " — nothing is run or written"]
    if forecast:
        lines += [forecast, ""]
    workers = f"{e.workers} workers, its units shared out longest first" if e.workers > 1 else "one worker"
    lines.append(f"wall time{f' of {ceiling}' if ceiling else ''}: ~{_duration(e.wall)} on {workers} "
                 f"({_duration(e.seconds)} of work in all)")
    total_steps = sum(r["steps"] for r in e.runs)
    lines.append(f"runs: {len(e.runs)}, {total_steps} training steps, {_si(e.stages['training']['flops'], 'FLOP')} "
                 f"of training; {len(e.measures)} measured checkpoints or references")
    lines += ["", *_stage_table(e), "", *_hardware(e), *_memory(e), "", _utilisation_note(e)]
    if e.ensemble:
        lines.append(_ensemble_line(e))
    if runs:
        lines += ["", *_run_rows(e)]
    else:
        lines.append(f"(--runs lists the {len(e.runs)} runs: model, steps, FLOPs, peak memory)")
    return "\n".join(lines)


def _stage_table(e: Estimate) -> list[str]:
    util = dict(UTILISATION[e.device])
    if STEP_FLOOR_S[e.device]:  # training's share as the step floor leaves it, not the assumed one
        util["training"] = e.training_utilisation()
    lines = [f"{'stage':<22} {'FLOPs':>12} {'utilisation':>11} {'time':>10}"]
    for s in STAGES:
        lines.append(f"{s:<22} {_si(e.stages[s]['flops']):>12} {_percent(util[s]):>11} "
                     f"{_duration(e.stages[s]['seconds']):>10}")
    lines.append(f"{'total':<22} {_si(sum(v['flops'] for v in e.stages.values())):>12} {'':>11} "
                 f"{_duration(e.seconds):>10}")
    bound = [r for r in e.runs if r["launch_bound"]]
    if bound:
        floor = STEP_FLOOR_S[e.device]
        lines.append(f"training is launch-bound: {len(bound)} of {len(e.runs)} runs take the {floor * 1e3:g} ms a "
                     f"step costs one process whatever its FLOPs (kernel launches; measured on an H100), so the card "
                     f"computes {_percent(e.training_utilisation())} of the time. About {e.fill()} models per launch "
                     "would fill it: an ensemble of that many members trained as one computation; worker processes "
                     "sharing the card help less (8 gave 5.5x one's steps/s, measured)")
    return lines


def _percent(x: float) -> str:
    return f"{x:.0%}" if x >= 0.01 else f"{x:.2%}" if x >= 1e-4 else f"{x:.1e}"


def _hardware(e: Estimate) -> list[str]:
    if e.device == "cpu":
        return [f"hardware: this CPU, float32 matmul peak {_si(e.peak['fp32'], 'FLOP/s')} per worker (measured now "
                "with the threads each worker runs; --cpu-peak overrides)"]
    return [f"hardware: {e.device}, published dense peaks bf16 {_si(e.peak['bf16'], 'FLOP/s')} (training), fp32 "
            f"{_si(e.peak['fp32'], 'FLOP/s')} (evaluation, traces, probes); memory "
            f"{_bytes(int(DEVICES[e.device]['memory']))}"]


def _memory(e: Estimate) -> list[str]:
    lines = []
    limit = device_memory(e.device)
    over = [r for r in e.runs if (r["peak_bytes"] or 0) > limit]
    if over:
        lines.append(f"warning: {len(over)} run(s) need more than the device's {_bytes(limit)} at their batch (largest "
                     f"{_bytes(max(r['peak_bytes'] for r in over))}, float32 activations; bf16 autocast about halves "
                     "those): split the batch over devices or lower batch_size")
    lines.append("peak memory per measure (one checkpoint; the largest model measured with each):")
    worst: dict[str, tuple[int, str]] = {}
    for ms in e.measures:
        for what, b in ms["peaks"].items():
            if what not in worst or b > worst[what][0]:
                worst[what] = (b, ms["model"])
    for what, (b, model) in worst.items():
        lines.append(f"  {what:<16} {_bytes(b):>12}  ({model})")
    if not worst:
        lines.append("  (none)")
    return lines


def _utilisation_note(e: Estimate) -> str:
    floor = STEP_FLOOR_S[e.device]
    return (f"utilisation: {UTILISATION_SOURCE[e.device]}"
            + (f"; a training step takes at least {floor * 1e3:g} ms (per process; measured on an H100 with the tiny "
               "model)" if floor else "")
            + ". Not counted: data generation, the exact conditionals, element-wise work, start-up; memory leaves "
              "out the allocator's slack (budget 1.5x).")


def _run_rows(e: Estimate) -> list[str]:
    lines = [f"{'run':<34} {'model':<8} {'params':>8} {'steps':>7} {'batch':>6} {'train FLOPs':>12} "
             f"{'evals':>5} {'peak memory':>12}"]
    for r in e.runs:
        name = f"{r['study']}/{r['run']}" if r["study"] else r["run"]
        lines.append(f"{name:<34} {r['model']:<8} {_si(r['parameters']):>8} {r['steps']:>7} {r['batch']:>6} "
                     f"{_si(r['flops']):>12} {r['evaluations']:>5} {_bytes(r['peak_bytes']):>12}")
    return lines


def _ensemble_line(e: Estimate) -> str:
    """What ``--ensemble N`` does to the estimate, and how an ensemble step is priced."""
    sizes = [r["members"] for r in e.runs]
    batched = sum(1 for s in sizes if s > 1)
    head = (f"ensembles (--ensemble {e.ensemble}): {batched} of {len(sizes)} runs train in ensembles "
            f"(largest {max(sizes, default=1)} members; runs of one model shape and first step, as the engine "
            "asks for them together)")
    if e.device == "cpu":
        return head + "; on the CPU members train one by one (the loop strategy): each costs what one model does."
    return head + f"; {ENSEMBLE_SOURCE}."


def plan_text(job, device: str, workers: int = 1, cpu_peak: float | None = None, ensemble: int | None = None,
              runs: bool = False) -> str:
    """What ``sameloss plan`` prints for ``reproduce EXPERIMENT --scale SCALE``.

    Args:
        job: what ``reproduce`` would run (``orchestrate.Job``: the recipe at its scale, and the
            ``--out``, ``--seed``, ``--language``, ``--budget`` — ``None``: the scale's own —
            and ``--dropout-draws`` it would get).
        device: the hardware: ``cpu`` (this machine), ``h100`` or ``a100``.
        workers: processes or GPUs the study's units are shared out to.
        cpu_peak: the CPU's float32 peak in FLOP/s (``None``: measured now).
        ensemble: the ``--ensemble`` reproduce would get (runs trained as ensembles of at most
            this many members; ``None``: one at a time).
        runs: list every run.

    Returns:
        the text; nothing is trained or written.
    """
    if device not in UTILISATION:
        raise UserError(f"unknown device {device!r}; choose from {', '.join(UTILISATION)}")
    languages = list(job.languages) or None
    e = estimate(dry_plan(job.experiment, job.scale, job.out, job.seed, languages, budget=job.budget,
                          dropout_draws=job.dropout_draws), device, workers, cpu_peak, ensemble=ensemble)
    recipe = job.recipe
    notes = recipe.hook("plan_notes")  # what the recipe adds: isoloss's budget forecast, pooled MDEs
    extra, ceiling = ([], "") if notes is None else notes(recipe.preset(job.scale, languages, job.budget), device,
                                                          workers, cpu_peak)
    missing = missing_launcher_note(job.experiment, device, workers)
    return format_plan(e, runs, "\n\n".join(([missing] if missing else []) + extra), ceiling)


def missing_launcher_note(experiment: str, device: str, workers: int) -> str:
    """What a plan says when it forecasts one worker only because submitit, which runs the main
    job's seeds on local workers, is not installed (``launch.main_job_options``): the
    forecast would otherwise be read as the machine's."""
    import importlib.util
    import os

    import torch

    from ..engine.launch import default_workers
    from ..engine.orchestrate import DEFAULT_EXPERIMENT

    if experiment != DEFAULT_EXPERIMENT or device != "cpu" or workers != 1:
        return ""
    could = default_workers(torch.get_num_threads(), 0, os.cpu_count())
    if could <= 1 or importlib.util.find_spec("submitit") is not None:
        return ""
    return (f"note: submitit is not installed, so `sameloss reproduce` would run {experiment}'s seeds one after "
            f"another and this forecast is for one worker; with it (pip install submitit) they run on {could} local "
            f"workers at once: `sameloss plan --workers {could}` forecasts that")
