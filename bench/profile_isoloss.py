"""Where one seed of the iso-loss study spends its CPU, and the work nobody reads (issue 23 item 5).

    OMP_NUM_THREADS=1 python bench/profile_isoloss.py                 # smoke: ~1 CPU-min
    OMP_NUM_THREADS=1 python bench/profile_isoloss.py --scale tiny --seed 1   # one tiny seed, every fork
    OMP_NUM_THREADS=1 python bench/profile_isoloss.py --scale quick --shrink 4 --probe-test 5000  # ~4 CPU-min

``--shrink N`` divides every step count of the design (base, recipe, decay, stretch, the
long and short forks, ``match_every``) by N: the same runs, candidates, evaluations and
measures, 1/N of the training (and the forks run whatever the headroom gate says). ``--probe-test`` sets the probes' test set (fewer features).

Runs one seed's unit (``isoloss.seed_study``) (its base, gate, every fork at both fork points, the
size forks, and the measures of each fork's ``probe_points`` checkpoints) in a
temporary folder, deleted afterwards, with the stages timed in PROCESS CPU seconds by
``bench_planner.StageClock`` (a stage inside another is taken out of the outer one), and
counts: the exact-KL evaluations (and how many fall outside a fork's candidates: never
read), the reference representations probed (per kind), the
checkpoints measured. Quote ``uptime`` with it. Not part of the test suite.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_planner import StageClock, patched  # noqa: E402

from sameloss.threads import configure_threads  # noqa: E402


def shrunk(p, n: int, probe_test: int | None):
    """The preset with every step count divided by ``n`` (module docstring)."""
    import dataclasses

    from sameloss.experiments.recipes import isoloss

    if n > 1:
        long = next(f for f in p.forks if f.name == "long").recipe_steps
        short = next(f for f in p.forks if f.name == "short").final_steps
        s = p.schedule
        schedule = dataclasses.replace(s, recipe_steps=s.recipe_steps // n, decay_steps=s.decay_steps // n,
                                       final_steps=s.final_steps // n, match_every=max(1, s.match_every // n))
        p = dataclasses.replace(p, base_steps=p.base_steps // n, fork_points=tuple(k // n for k in p.fork_points),
                                schedule=schedule, forks=isoloss._forks(long // n, short // n if short else None))
    if n > 1:  # a shrunk base has no headroom: its forks run all the same
        p = dataclasses.replace(p, verdicts=dataclasses.replace(p.verdicts, on_no_headroom="mark"))
    if probe_test:
        p = dataclasses.replace(p, probes=dataclasses.replace(p.probes, test=probe_test))
    return p


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", default="smoke")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--shrink", type=int, default=1)
    parser.add_argument("--probe-test", type=int, default=None)
    args = parser.parse_args()
    configure_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    from sameloss.experiments.engine.core import StudySettings
    from sameloss.experiments.engine.dispatch import execute
    from sameloss.experiments.engine.declare import seed_unit
    from sameloss.experiments.engine.walk import Records, Setup
    from sameloss.experiments.recipes import isoloss
    from sameloss.measures import run as measure_run
    from sameloss.training import evaluate, runio

    p = shrunk(isoloss.PRESETS[args.scale], args.shrink, args.probe_test)
    clock, refs, evals = StageClock(), Counter(), Counter()
    original_ref, original_eval = measure_run.measure_reference, evaluate.ExactEvaluator.evaluate

    def counted_reference(kind, *a, **kw):
        refs[kind] += 1
        return original_ref(kind, *a, **kw)

    def counted_evaluate(self, *a, **kw):
        evals["exact-KL evaluations"] += 1
        return original_eval(self, *a, **kw)

    measure_run.measure_reference = clock.wrap("reference representations", counted_reference)
    evaluate.ExactEvaluator.evaluate = counted_evaluate
    print(f"load before: {os.getloadavg()[0]:.2f}", flush=True)
    tmp = tempfile.mkdtemp(prefix="profile-isoloss-")
    c0, w0 = time.process_time(), time.perf_counter()
    try:
        with patched(clock):
            unit = seed_unit(args.seed, isoloss.seed_study(p, args.seed), p.tag)
            (done,) = execute([unit], Path(tmp), StudySettings(progress=False, device="cpu"))
            if isinstance(done, Exception):  # the UserError that stopped the unit
                raise done
            records = Records(Setup(Path(tmp), 0, lambda m: None), None, {unit.name: done.value})
            out = isoloss.seed_result(records, p, args.seed)
            counts = dict(done.counts)
        cpu, wall = time.process_time() - c0, time.perf_counter() - w0
        forks = {f.name: f for f in p.forks}
        unread = read = 0
        for info in out["runs"]:
            if info.spec.group == "base":
                continue
            f = forks[info.spec.group]
            wanted = set(p.candidates(f))
            steps = set(runio.eval_history(info.path))
            read += len(steps & wanted)
            unread += len(steps - wanted)
    finally:
        measure_run.measure_reference, evaluate.ExactEvaluator.evaluate = original_ref, original_eval
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"load after: {os.getloadavg()[0]:.2f}; isoloss --scale {args.scale} (shrink {args.shrink}, probe test "
          f"{p.probes.test}), seed {args.seed}: {cpu:.1f} CPU s "
          f"({wall:.1f} s wall), {len(out['runs'])} runs")
    for stage, s in sorted(clock.seconds.items(), key=lambda kv: -kv[1]):
        print(f"  {stage:<34} {s:8.1f} CPU s  {100 * s / cpu:5.1f} %")
    rest = cpu - sum(clock.seconds.values())
    print(f"  {'rest (checkpoints, embedding, ...)':<34} {rest:8.1f} CPU s  {100 * rest / cpu:5.1f} %")
    print(f"exact-KL evaluations: {evals['exact-KL evaluations']} (forks' evaluations at their candidates: "
          f"{read}; elsewhere, never read: {unread})")
    print(f"reference representations probed: {dict(refs) or 'none'}; checkpoints measured: {counts}")
    # the unit's own cost rows (what the study's costs.csv holds), summed by stage and listed per fork
    by_stage: dict[str, float] = {}
    for r in out["cost"]:
        by_stage[r["stage"]] = by_stage.get(r["stage"], 0.0) + r["cpu_seconds"]
    print("the unit's CPU by stage (costs.csv): " + ", ".join(f"{k} {v:.0f} s" for k, v in sorted(by_stage.items()))
          + f"; total {sum(by_stage.values()):.0f} s")
    for r in sorted(out["cost"], key=lambda r: (r["stage"], r["point"], r["fork"])):
        print(f"  {r['point'] or '-':<8} {r['fork']:<11} {r['stage']:<12} {r['cpu_seconds']:8.1f} CPU s")


if __name__ == "__main__":
    main()
