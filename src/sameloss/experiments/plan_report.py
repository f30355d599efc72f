"""The text ``sameloss plan`` prints (``plan_text``): the runs, the peak memory per measure
and the time per stage of an ``experiments.plan.Estimate``, with where each number comes
from."""

from __future__ import annotations

from pathlib import Path

from .. import registry
from ..errors import UserError
from .plan import DEVICES, ENSEMBLE_SOURCE, STAGES, STEP_FLOOR_S, UTILISATION, UTILISATION_SOURCE, Estimate, \
    device_memory, dry_plan, estimate


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


def format_plan(e: Estimate) -> str:
    p = e.plan
    lines = [f"plan: {p.experiment} --scale {p.scale} on {e.device}"
             + (f" ({e.workers} workers)" if e.workers > 1 else "") + " — nothing is run or written"]
    if e.device == "cpu":
        lines.append(f"device: this CPU, float32 matmul peak {_si(e.peak['fp32'], 'FLOP/s')} (measured now with "
                     "the threads torch uses; --cpu-peak overrides)")
    else:
        lines.append(f"device: {e.device}, published dense peaks bf16 {_si(e.peak['bf16'], 'FLOP/s')} (training), "
                     f"fp32 {_si(e.peak['fp32'], 'FLOP/s')} (evaluation, traces, probes); memory "
                     f"{_bytes(int(DEVICES[e.device]['memory']))}")
    total_steps = sum(r["steps"] for r in e.runs)
    lines.append(f"runs: {len(e.runs)}, {total_steps} training steps, {_si(e.stages['training']['flops'], 'FLOP')} "
                 f"of training; {len(e.measures)} measured checkpoints or references")
    lines.append("")
    lines.append(f"{'run':<34} {'model':<8} {'params':>8} {'steps':>7} {'batch':>6} {'train FLOPs':>12} "
                 f"{'evals':>5} {'peak memory':>12}")
    for r in e.runs:
        name = f"{r['study']}/{r['run']}" if r["study"] else r["run"]
        lines.append(f"{name:<34} {r['model']:<8} {_si(r['parameters']):>8} {r['steps']:>7} {r['batch']:>6} "
                     f"{_si(r['flops']):>12} {r['evaluations']:>5} {_bytes(r['peak_bytes']):>12}")
    limit = device_memory(e.device)
    over = [r for r in e.runs if (r["peak_bytes"] or 0) > limit]
    if over:
        lines.append(f"warning: {len(over)} run(s) need more than the device's {_bytes(limit)} at their batch (largest "
                     f"{_bytes(max(r['peak_bytes'] for r in over))}, float32 activations; bf16 autocast about halves "
                     "those): split the batch over devices or lower batch_size")
    lines.append("")
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
    lines.append("")
    util = UTILISATION[e.device]
    lines.append(f"{'stage':<22} {'FLOPs':>12} {'utilisation':>11} {'time':>10}")
    for s in STAGES:
        lines.append(f"{s:<22} {_si(e.stages[s]['flops']):>12} {util[s]:>10.0%} "
                     f"{_duration(e.stages[s]['seconds']):>10}")
    lines.append(f"{'total':<22} {_si(sum(v['flops'] for v in e.stages.values())):>12} {'':>11} "
                 f"{_duration(e.seconds):>10}")
    if e.workers > 1:
        lines.append(f"wall time with {e.workers} workers (units shared out, longest first): {_duration(e.wall)}")
    lines.append("")
    floor = STEP_FLOOR_S[e.device]
    lines.append(f"utilisation: {UTILISATION_SOURCE[e.device]}"
                 + (f"; a training step takes at least {floor * 1e3:g} ms (per process; measured on an H100 with the tiny model)" if floor else "")
                 + ". Not counted: data generation, the exact "
                 "conditionals, element-wise work, start-up; memory leaves out the allocator's slack (budget 1.5x).")
    if e.ensemble:
        lines.append(_ensemble_line(e))
    return "\n".join(lines)


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


def plan_text(experiment: str, scale: str, device: str, workers: int = 1, cpu_peak: float | None = None,
              out: str | Path = "runs", seed: int = 0, languages: list[str] | None = None,
              budget: float | None = None, ensemble: int | None = None, dropout_draws: str = "global") -> str:
    if device not in UTILISATION:
        raise UserError(f"unknown device {device!r}; choose from {', '.join(UTILISATION)}")
    text = format_plan(estimate(dry_plan(experiment, scale, out, seed, languages, budget=budget,
                                         dropout_draws=dropout_draws), device, workers, cpu_peak, ensemble=ensemble))
    recipe = registry.recipe(experiment)
    forecast = getattr(recipe, "forecast", None)
    if not (budget is not None and forecast is not None) and len(languages or ()) < 2:
        return text
    from . import on_budget, on_languages

    p = on_budget(recipe, experiment, on_languages(recipe, experiment, recipe.PRESETS[scale], languages), budget)
    if budget is not None and forecast is not None:
        text += "\n\n" + forecast(p, device, workers, cpu_peak)
    if len(getattr(p, "replicate", ())) > 1 and hasattr(p, "tests"):  # a study across languages: its pooled MDEs
        from .allocation import pooled_forecast

        text += "\n\n" + pooled_forecast([f"{c.name} @ {pt}" for c, pt in p.tests()], dict(p.prior_sds),
                                          len(p.replicate), len(p.seeds), p.mde_target,
                                          getattr(recipe, "PRIOR_SOURCE", "the preset's") if p.prior_sds else "none",
                                          p.exempt)
    return text
