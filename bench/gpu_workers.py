"""Seeds per minute of the isoloss tiny preset on one GPU with k worker processes sharing it
(issue 41; run by bench/gpu_check.sh).

A whole ``reproduce isoloss`` per k takes too long, so this is a time-boxed proxy: k
processes each train the preset's model and batch (the ``tiny`` transformer on the micro
HMM, batch 256: ``experiments.common.COMMON["tiny"]``) with the training loop's step
(``gpu_throughput.train_steps``) for the same wall-clock window, all starting together
after their warm-up; the aggregate steps/s, divided by the training steps the planner counts
for one seed of the tiny preset (every fork: ``plan.dry_plan`` of isoloss with two seeds,
halved), gives seeds per minute. Training only: the measures (exact KL, traces, probes)
are not in it, so it is an upper bound on the real rate, and the real run's wall time is
the check.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_throughput import draw, setup, train_steps  # noqa: E402


def steps_per_seed() -> float:
    """Training steps of one seed of the isoloss tiny preset, every fork (the planner's runs)."""
    from sameloss.experiments.engine.plan import dry_plan
    from sameloss.experiments.recipes.isoloss import PRESETS

    p = PRESETS["tiny"]
    one = dataclasses.replace(p, seeds=p.seeds[:2], replicate=(),
                              seed_design=dataclasses.replace(p.seed_design, plan=(), left=()))
    planned = dry_plan("isoloss", "tiny", preset=one)
    return sum(r.config.steps - r.start_step for r in planned.runs) / len(one.seeds)


def child(a) -> None:
    cfg, language, model, optimizer, schedule = setup(a.size, a.lang_size, a.batch, "auto", a.device, seed=a.rank)
    batches = [draw(cfg, language, s, a.device) for s in range(4)]
    train_steps(cfg, model, optimizer, schedule, batches, a.warmup, None, a.device)
    ready_late = max(0.0, time.time() - a.start_at)  # > 0: this worker missed the common start
    while time.time() < a.start_at:  # all k start together
        time.sleep(0.005)
    steps, seconds = train_steps(cfg, model, optimizer, schedule, batches, None, a.seconds, a.device)
    print(json.dumps({"rank": a.rank, "steps": steps, "seconds": seconds, "ready_late_s": ready_late}), flush=True)


def run_k(k: int, a) -> dict:
    start_at = time.time() + a.startup
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--device", a.device, "--seconds", str(a.seconds),
           "--warmup", str(a.warmup), "--start-at", str(start_at), "--size", a.size, "--lang-size", a.lang_size,
           "--batch", str(a.batch)]
    procs = [subprocess.Popen(cmd + ["--rank", str(i)], stdout=subprocess.PIPE, text=True) for i in range(k)]
    results = []
    for p in procs:
        out, _ = p.communicate(timeout=a.startup + a.seconds + 120)
        results += [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    late = max((r["ready_late_s"] for r in results), default=0.0)
    rate = sum(r["steps"] / r["seconds"] for r in results)
    return {"k": k, "finished": len(results), "steps_per_s": rate, "per_worker": results,
            "missed_start_by_s": late}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--ks", default="1,2,4,8")
    ap.add_argument("--seconds", type=float, default=8.0, help="the shared timed window")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--startup", type=float, default=25.0, help="seconds allowed for the k processes to start")
    ap.add_argument("--size", default="tiny")
    ap.add_argument("--lang-size", default="micro")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--smoke", action="store_true", help="micro model, k = 1, 2, a short window (any device)")
    ap.add_argument("--json")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--start-at", type=float, default=0.0, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        child(a)
        return 0
    if a.smoke:
        a.ks, a.seconds, a.warmup, a.size, a.batch, a.startup = "1,2", 0.5, 1, "micro", 8, 20.0
    per_seed = steps_per_seed()
    print(f"isoloss tiny preset: {per_seed:.0f} training steps per seed (the planner's runs, every fork)", flush=True)
    rows = []
    for k in (int(x) for x in a.ks.split(",")):
        try:
            r = run_k(k, a)
        except Exception as e:  # a k that fails or hangs must not lose the others
            print(f"k={k}: FAILED {type(e).__name__}: {e}", flush=True)
            continue
        r["seeds_per_min"] = 60 * r["steps_per_s"] / per_seed
        rows.append(r)
        print(json.dumps({x: r[x] for x in ("k", "finished", "steps_per_s", "seeds_per_min", "missed_start_by_s")}),
              flush=True)
    print("| workers k | finished | steps/s (all) | seeds/min (training only) |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['k']} | {r['finished']}/{r['k']} | {r['steps_per_s']:.1f} | {r['seeds_per_min']:.2f} |")
    if rows:
        best = max(rows, key=lambda r: r["seeds_per_min"])
        print(f"best k = {best['k']}", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"steps_per_seed": per_seed, "rows": rows}, f, indent=1)
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
