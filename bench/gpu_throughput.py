"""Training throughput on a GPU against the planner (issue 41; run by bench/gpu_check.sh).

For the ``small`` and ``paper`` scales' transformer shapes (``experiments.common.COMMON``:
t4-384 and t3-1024 on the paper-size HMM, batch 4096) in bf16 and fp32: tokens/s, the
achieved TFLOP/s by the planner's own FLOP count (``plan.forward_flops_per_token`` × 3 per
training token of a full-length padded sentence), the MFU against the card's published
dense peak (``hardware.DEVICES``), and the peak memory (``torch.cuda.max_memory_allocated``)
against ``sameloss plan``'s estimate (``memory.training_step_bytes``), next to the
planner's assumed utilisation (``hardware.UTILISATION``). A batch that does not fit is halved
until it does (the row says so). The step is the training loop's (``mlm_loss`` under the
run's autocast, AdamW, the schedule) on batches drawn beforehand; the host's time to draw
one batch is reported beside it. Each config runs ``--seconds`` after its warm-up steps.

``--smoke``: the micro transformer on the micro HMM, a few steps, on any device (tests).
``--json FILE``: also write the rows as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

from sameloss import config as configlib
from sameloss.experiments.engine import hardware, plan
from sameloss.measures.curvature import memory
from sameloss.training import PretrainConfig
from sameloss.training import runio
from sameloss.training.data import global_batch
from sameloss.training.objectives.mlm import mlm_loss
from sameloss.training.optim import build_optimizer

# scale -> (model size, HMM size, batch): experiments/presets/common.py's reference shapes
SHAPES = {"small": ("t4-384", "paper", 4096), "paper": ("t3-1024", "paper", 4096)}
SMOKE = {"smoke": ("micro", "micro", 8)}


def card(device: str) -> tuple[str, str | None]:
    """The card's name and its row in ``hardware.DEVICES`` (None: no published peak known)."""
    if not device.startswith("cuda"):
        return "cpu", None
    name = torch.cuda.get_device_name()
    low = name.lower()
    if "h100" in low or "h200" in low:  # the H200 is an H100 die with more memory: same peaks
        return name, "h100"
    if "a100" in low:
        return name, "a100"
    return name, None


def setup(size: str, lang_size: str, batch: int, precision: str, device: str, seed: int = 0):
    cfg = configlib.load(PretrainConfig, None, [
        f"model.size={size}", "language.name=hmm", f"language.size={lang_size}", f"batch_size={batch}",
        f"device={device}", f"precision={precision}", "eval.every=0", f"seed={seed}"])
    language = runio.build_language(cfg)
    torch.manual_seed(seed)
    model = runio.init_model(cfg, language, device)
    model.train()
    optimizer, schedule = build_optimizer(cfg, model)
    return cfg, language, model, optimizer, schedule


def draw(cfg, language, step: int, device: str):
    rate = None if cfg.masking == "single" else cfg.mask_rate
    return global_batch(language, cfg.seed, step, cfg.batch_size, rate, cfg.mask_replace).to(device)


def train_steps(cfg, model, optimizer, schedule, batches, n_steps: int | None, seconds: float | None,
                device: str) -> tuple[int, float]:
    """Steps of the loop's update over ``batches`` (cycled) until ``n_steps`` or ``seconds``;
    (steps, seconds), the device synchronised at both ends."""
    autocast = runio.autocast(cfg.precision, device)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    sync()
    start, done = time.perf_counter(), 0
    while True:
        batch = batches[done % len(batches)]
        optimizer.zero_grad(set_to_none=True)
        with autocast:
            loss, _ = mlm_loss(model, batch, batch.n_targets, 1)
        loss.backward()
        if cfg.optim.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.grad_clip)
        optimizer.step()
        schedule.step()
        done += 1
        if n_steps is not None and done >= n_steps:
            break
        if seconds is not None and done % 5 == 0:
            sync()
            if time.perf_counter() - start >= seconds:
                break
    sync()
    return done, time.perf_counter() - start


def measure(scale: str, size: str, lang_size: str, batch: int, precision: str, device: str, seconds: float,
            warmup: int) -> dict:
    name, row = card(device)
    while True:
        try:
            cfg, language, model, optimizer, schedule = setup(size, lang_size, batch, precision, device)
            t0 = time.perf_counter()
            batches = [draw(cfg, language, s, device) for s in range(4)]
            draw_s = (time.perf_counter() - t0) / 4
            if device.startswith("cuda"):
                torch.cuda.reset_peak_memory_stats()
            train_steps(cfg, model, optimizer, schedule, batches, warmup, None, device)
            steps, elapsed = train_steps(cfg, model, optimizer, schedule, batches, None, seconds, device)
            break
        except torch.OutOfMemoryError:
            model = optimizer = schedule = batches = None  # free them before the smaller batch
            torch.cuda.empty_cache()
            if batch <= 1:
                raise
            print(f"  {scale} {precision}: batch {batch} does not fit; halving", flush=True)
            batch //= 2
    shape = plan.model_shape(cfg, {})
    tokens_per_step = batch * shape.max_len
    flops_per_step = 3 * plan.forward_flops_per_token(shape) * tokens_per_step
    achieved = flops_per_step * steps / elapsed
    peak = hardware.DEVICES[row]["bf16" if precision == "bf16" else "fp32"] if row else None
    out = {"scale": scale, "size": size, "precision": precision, "batch": batch, "device": name,
           "params": shape.n_params, "max_len": shape.max_len, "steps": steps, "seconds": round(elapsed, 3),
           "step_ms": 1000 * elapsed / steps, "tokens_per_s": tokens_per_step * steps / elapsed,
           "tflops": achieved / 1e12, "mfu": achieved / peak if peak else None,
           "assumed_training_util": hardware.UTILISATION[row]["training"] if row else None,
           "planner_step_floor_ms": 1000 * hardware.STEP_FLOOR_S[row] if row else None,
           "host_draw_ms": 1000 * draw_s,
           "plan_memory_gib": memory.training_step_bytes(model.config, batch) / 2**30}
    if device.startswith("cuda"):
        out["peak_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
    del model, optimizer, batches
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return out


def table(rows: list[dict]) -> str:
    head = ("| scale | size | precision | batch | step ms | tokens/s | TFLOP/s | MFU | planner's util | "
            "peak mem GiB | plan's estimate GiB | host draw ms |\n|---|---|---|---|---|---|---|---|---|---|---|---|")
    fmt = lambda v, f: "–" if v is None else format(v, f)
    lines = [head]
    for r in rows:
        lines.append(f"| {r['scale']} | {r['size']} | {r['precision']} | {r['batch']} | {r['step_ms']:.2f} | "
                     f"{r['tokens_per_s']:.3g} | {r['tflops']:.3g} | {fmt(r['mfu'], '.1%')} | "
                     f"{fmt(r['assumed_training_util'], '.0%')} | {fmt(r.get('peak_memory_gib'), '.2f')} | "
                     f"{r['plan_memory_gib']:.2f} | {r['host_draw_ms']:.1f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--seconds", type=float, default=4.0, help="timed seconds per config after the warm-up")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    ap.add_argument("--scales", default="small,paper")
    ap.add_argument("--precisions", default="bf16,fp32")
    ap.add_argument("--smoke", action="store_true", help="micro model, a few steps (any device)")
    ap.add_argument("--json", help="also write the rows here")
    a = ap.parse_args(argv)
    if a.smoke:
        shapes, a.seconds, a.warmup = SMOKE, min(a.seconds, 0.2), 1
    else:
        shapes = {s: SHAPES[s] for s in a.scales.split(",")}
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 is FP32 (the planner's fp32 peak)
    rows = []
    for scale, (size, lang_size, batch) in shapes.items():
        for precision in a.precisions.split(","):
            try:
                r = measure(scale, size, lang_size, batch, precision, a.device, a.seconds, a.warmup)
            except Exception as e:  # one config failing must not lose the others
                print(f"{scale} {precision}: FAILED {type(e).__name__}: {e}", flush=True)
                continue
            rows.append(r)
            print(json.dumps(r), flush=True)
    print(table(rows), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
