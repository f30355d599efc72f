"""The cost of an isoloss study: runs × steps × measured seconds per step (issue 25).

    python bench/bench_cost.py --scale small              # ~10 minutes on a 2-core CPU
    python bench/bench_cost.py --scale tiny --steps 20    # the same method on a scale that was run

Lists the runs of the study (per seed: the base run and its forks, ``recipes/isoloss/study.py``)
with their steps, sorts them by what a step costs (plain AdamW; SAM, two half-batch passes;
the adversarial objective, a closed-form head per step) and times ``--steps`` steps of one
run of each kind here, exactly as ``sameloss pretrain`` trains (its own ``steps_per_s`` in
``metrics.jsonl``, one record per step, the first step left out as warm-up; a fork timed
from scratch: a step costs the same). The sheet: steps per kind, seconds per step, the
training time of one seed and of the study, and the study's wall time with W workers
(seeds are units: W seeds at once). Not counted: building the language and the held-out
set, the evaluations every ``eval.every`` steps, checkpoints and every measurement (on the
``tiny`` scale these made ~60 % of a seed's 2.6 minutes). Quote ``uptime`` with the
numbers: on a shared machine they move with its load. Not part of the test suite.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from sameloss import config as configlib
from sameloss.experiments.recipes import isoloss
from sameloss.threads import configure_threads
from sameloss.training import PretrainConfig, pretrain

# what a run's step costs: settings that add work per step
KINDS = (("adversarial", lambda s: s.get("adversarial.weight", 0) > 0),
         ("sam", lambda s: s.get("sam.rho", 0) > 0),
         ("adamw", lambda s: True))
# settings a timing run replaces: no fork start, no evaluation, no checkpoint to write
TIMING = {"init_from", "checkpoints", "steps", "eval.every", "eval.n_sentences", "log_every", "save_every",
          "optim.decay_steps", "optim.final_lr_factor"}


def kind_of(settings: dict) -> str:
    return next(name for name, test in KINDS if test(settings))


def seconds_per_step(spec, steps: int, folder: Path) -> float:
    """The mean seconds per step of ``spec`` over ``steps`` steps after one warm-up step."""
    overrides = [o for (key, _), o in zip(spec.settings, spec.overrides) if key not in TIMING]
    overrides += [f"steps={steps + 1}", "eval.every=0", "eval.n_sentences=16", "log_every=1",
                  f"save_every={10 * (steps + 1)}", "checkpoints=[]", f"name={spec.name}"]
    cfg = configlib.load(PretrainConfig, None, overrides)
    pretrain(cfg, folder / spec.name, progress=False)
    records = [json.loads(line) for line in (folder / spec.name / "metrics.jsonl").read_text().splitlines()]
    return statistics.mean(1.0 / r["steps_per_s"] for r in records if r["step"] > 1)


def hours(seconds: float) -> str:
    return f"{seconds / 3600:,.1f} h" if seconds >= 3600 else f"{seconds / 60:,.1f} min"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", default="small", choices=list(isoloss.PRESETS))
    parser.add_argument("--steps", type=int, default=3, help="timed steps per kind of run (default 3)")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 8], help="worker counts of the sheet")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: the threads policy)")
    args = parser.parse_args(argv)
    threads = configure_threads(args.threads)
    p = isoloss.PRESETS[args.scale]
    runs = isoloss.runs(p, p.use[0], 0)  # one seed's
    kinds = {spec.name: kind_of(dict(spec.settings)) for spec in runs}
    steps = {spec.name: dict(spec.settings)["steps"] - (p.base_steps if spec.group != "base" else 0) for spec in runs}
    load = os.getloadavg()
    print(f"isoloss --scale {args.scale}: {len(p.seeds)} seeds x {len(runs)} runs = {len(p.seeds) * len(runs)} runs; "
          f"model {dict(runs[0].settings)['model.size']}, batch {dict(runs[0].settings)['batch_size']}; "
          f"{threads} torch thread(s), {os.cpu_count()} CPU cores, load average {load[0]:.2f} {load[1]:.2f} at start")
    cost = {}
    with tempfile.TemporaryDirectory() as tmp:
        for kind in dict.fromkeys(kinds.values()):
            spec = next(s for s in runs if kinds[s.name] == kind)
            start = time.perf_counter()
            cost[kind] = seconds_per_step(spec, args.steps, Path(tmp))
            print(f"  timed {kind:<11} ({spec.name}): {cost[kind]:.3g} s/step "
                  f"(x{cost[kind] / cost['adamw']:.2f} of AdamW's) in {time.perf_counter() - start:.0f} s", flush=True)
    print(f"\n{'run':<16}{'kind':<13}{'steps':>8}{'s/step':>10}{'training':>12}")
    per_seed = 0.0
    for spec in runs:
        t = steps[spec.name] * cost[kinds[spec.name]]
        per_seed += t
        print(f"{spec.name:<16}{kinds[spec.name]:<13}{steps[spec.name]:>8}{cost[kinds[spec.name]]:>10.3g}{hours(t):>12}")
    total_steps = len(p.seeds) * sum(steps.values())
    print(f"\none seed: {sum(steps.values()):,} steps, {hours(per_seed)} of training; the study: {total_steps:,} steps, "
          f"{hours(per_seed * len(p.seeds))} of training")
    for w in args.workers:
        waves = -(-len(p.seeds) // w)  # seeds are units: w at once
        print(f"  wall time with {w} worker(s) of this speed: {hours(waves * per_seed)} ({waves} wave(s) of seeds)")
    load = os.getloadavg()
    print(f"load average at the end: {load[0]:.2f} {load[1]:.2f}", file=sys.stderr)


if __name__ == "__main__":
    main()
