"""The planner's estimate against the measured time, per stage (issue 26 item 3).

    OMP_NUM_THREADS=1 python bench/bench_planner.py algorithms --scale tiny   # ~10 min of CPU
    OMP_NUM_THREADS=1 python bench/bench_planner.py dyck --scale tiny         # ~3 min

Plans the recipe on this CPU (``experiments.plan``: FLOPs per stage, this machine's float32
matmul peak measured now, the stated utilisation table), then runs it
(``reproduce`` into a temporary folder, deleted afterwards) with each stage's functions
wrapped by a timer of PROCESS CPU TIME (``time.process_time``), not wall time: the machine
is shared, and CPU time is what the planner's FLOPs divided by a per-core rate predicts
(one torch thread). Stages, as the planner counts them: ``training`` = ``pretrain`` minus
the evaluations inside it; ``exact-KL evaluation`` = ``ExactEvaluator.evaluate`` (during
training and the measured ``loss``); ``trace`` = the curvature estimators
(``measures.curvature``); ``probes`` = linear probes, fine-tuning, few-shot and count
regressions with the features they extract. What the planner leaves out is timed apart:
building the held-out set and its exact conditionals, the task data, the rest (start-up,
checkpoints, the report).

The peak is measured before and after the run and the larger one used (one reading can be
low on a shared machine). Prints, per stage: planned FLOPs, estimated seconds, measured CPU seconds, their ratio,
and the utilisation the measurement implies (FLOPs / (CPU s × peak)) — the number that
``UTILISATION["cpu"]`` in ``experiments/engine/hardware.py`` states. Quote ``uptime`` with it. Not part
of the test suite.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
import time

from sameloss.experiments.engine import hardware
from sameloss.experiments.engine import plan as planner
from sameloss.threads import configure_threads


class StageClock:
    """CPU seconds per stage; a stage timed inside another is taken out of the outer one."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self.stack: list[list] = []

    def wrap(self, stage: str, fn):
        def timed(*args, **kwargs):
            start = time.process_time()
            self.stack.append([stage, 0.0])
            try:
                return fn(*args, **kwargs)
            finally:
                _, inner = self.stack.pop()
                spent = time.process_time() - start
                self.seconds[stage] = self.seconds.get(stage, 0.0) + spent - inner
                if self.stack:
                    self.stack[-1][1] += spent
        return timed


@contextlib.contextmanager
def patched(clock: StageClock):
    from sameloss.experiments.engine import core
    from sameloss.measures import curvature, run as measure_run
    from sameloss.training import evaluate, member

    targets = [(core, "pretrain", "training"), (evaluate.ExactEvaluator, "evaluate", "exact-KL evaluation"),
               (evaluate.ExactEvaluator, "__init__", "held-out set (not planned)"),
               (member, "make_evaluator", "held-out set (not planned)"),
               (measure_run, "make_evaluator", "held-out set (not planned)")]
    for name in ("trace_fisher", "trace_hutchinson", "trace_hessian_gap", "top_eigenvalue", "sam_sharpness"):
        targets.append((curvature, name, "trace"))
    for name in ("linear_probe", "finetune", "fewshot_probes", "count_regression", "model_representation",
                 "_lookup_probe"):
        targets.append((measure_run, name, "probes"))
    for name in ("_task_data", "_fewshot_data", "make_task_data"):
        targets.append((measure_run, name, "task data (not planned)"))
    saved = []
    for owner, name, stage in targets:
        if hasattr(owner, name):
            original = getattr(owner, name)
            saved.append((owner, name, original))
            setattr(owner, name, clock.wrap(stage, original))
    try:
        yield
    finally:
        for owner, name, original in reversed(saved):
            setattr(owner, name, original)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("experiment")
    parser.add_argument("--scale", default="tiny")
    args = parser.parse_args()
    configure_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    peak = hardware.measure_cpu_peak()
    plan = planner.dry_plan(args.experiment, args.scale, "unused")
    est = planner.estimate(plan, "cpu", cpu_peak=peak, memory=False)
    print(f"load before: {os.getloadavg()[0]:.1f}; cpu float32 matmul peak {peak / 1e9:.1f} GFLOP/s (1 thread)",
          flush=True)

    from sameloss.experiments import Job, Options, reproduce

    clock = StageClock()
    tmp = tempfile.mkdtemp(prefix="bench-planner-")
    start_cpu, start_wall = time.process_time(), time.perf_counter()
    try:
        with patched(clock):
            reproduce(Job(args.experiment, args.scale, out=tmp), Options(progress=False))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    total_cpu, wall = time.process_time() - start_cpu, time.perf_counter() - start_wall
    # the peak again: a busy sibling core or a clock change makes one reading low (seen: 54
    # against 100 GFLOP/s minutes apart); the core's rate is the larger of the two
    after = hardware.measure_cpu_peak()
    print(f"cpu peak before {peak / 1e9:.1f}, after {after / 1e9:.1f} GFLOP/s: using the larger")
    peak = max(peak, after)
    est = planner.estimate(plan, "cpu", cpu_peak=peak, memory=False)
    print(f"load after: {os.getloadavg()[0]:.1f}; {args.experiment} --scale {args.scale}: {total_cpu:.0f} CPU s "
          f"({wall:.0f} s wall)")
    print(f"{'stage':<28} {'FLOPs':>10} {'estimate s':>10} {'measured CPU s':>14} {'est/meas':>9} "
          f"{'stated util':>11} {'implied util':>12}")
    util = hardware.UTILISATION["cpu"]
    for stage in planner.STAGES:
        flops, seconds = est.stages[stage]["flops"], est.stages[stage]["seconds"]
        measured = clock.seconds.get(stage, 0.0)
        ratio = seconds / measured if measured else float("nan")
        implied = flops / (measured * peak) if measured else float("nan")
        print(f"{stage:<28} {flops:>10.3g} {seconds:>10.1f} {measured:>14.1f} {ratio:>9.2f} {util[stage]:>11.0%} "
              f"{implied:>12.1%}")
    other = [s for s in clock.seconds if s not in planner.STAGES]
    for stage in other:
        print(f"{stage:<28} {'':>10} {'':>10} {clock.seconds[stage]:>14.1f}")
    rest = total_cpu - sum(clock.seconds.values())
    print(f"{'rest (start-up, report, ...)':<28} {'':>10} {'':>10} {rest:>14.1f}")
    print(f"{'total':<28} {'':>10} {est.seconds:>10.1f} {total_cpu:>14.1f} {est.seconds / total_cpu:>9.2f}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
