"""Calibration of the isoloss study's flatness forks' λ: how far ``flatness.weight`` moves
the Fisher trace at the target KL against the AdamW fork, and what it costs in KL.

One seed's late fork of an existing tiny isoloss study (``--study``: its folder, whose
``seeds/<seed>/runs/<prefix>-base`` and ``...-late-adamw`` runs and ``measurements.json``
it reads, writing nothing there) is trained with ``flatness.weight = λ`` exactly like the
study's forks (``fork_run``: 100 steps at the constant lr, 200 of decay to 0.05×, then
``--stretch`` steps at the final lr, KL on the shared held-out set every 20 steps); its
Fisher trace is measured with the study's own settings at its three probe steps; the
comparison with the AdamW fork is the study's own (``paired.comparison_target`` and
``at_target``: both forks' lines through their checkpoints read at the middle of their
KL ranges' overlap, or of the gap between them).

    python bench/calibrate_flatness.py --study /work/results34/isoloss-tiny --weight 2e-4

Measured (seed 0 of the tiny study, late fork, 300-step stretch; the AdamW fork's
600-step stretch: KL 0.00463–0.00544, trace 92.9–93.2; ~80 CPU-s of training per λ on a
loaded 2-core machine; the extrapolation limit is 1e-3 nats):

    =========================  =======================  ==============  ========  =========
    λ (measure)                fork's KL range          target KL       outside   trace Δ
    =========================  =======================  ==============  ========  =========
    −2e-4 (fisher)             0.00526–0.00587          0.00535         0         +50 %
    −1e-4 (fisher)             0.00479–0.00534          0.00506         0         +27 %
    +1e-4 (fisher)             0.00522–0.00573          0.00533         0         −17 %
    +1.5e-4 (fisher)           0.00537–0.00587          0.00541         0         −22 %
    +2e-4 (fisher)             0.00552–0.00602          0.00548         4e-5      −26 %
    +3e-4 (fisher)             0.00584–0.00633          0.00564         2e-4      −32 %
    +1e-3 (fisher)             0.00821–0.00879          0.00683         1.4e-3    −55 %
    −1e-4 (hutchinson)         0.00524–0.00578          0.00534         0         +23 %
    +1.5e-4 (hutchinson)       0.00656–0.00738          0.00600         5.6e-4    −14 %
    +3e-3 (fisher, blocks)     0.00564–0.00612          0.00554         1e-4      −3 %
    =========================  =======================  ==============  ========  =========

Sharpening is cheap in KL (λ = −1e-4 ends *below* AdamW's KL); flattening costs KL: the
penalty trades loss for trace, so a flatter fork's KL range moves up away from AdamW's
and beyond λ ≈ 5e-4 the target lies further outside it than the study's extrapolation
limit (λ = 1e-3: −55 % but 1.4e-3 nats outside; a pair that far is not used). The
Fisher estimator moves the trace more per unit of KL than Hutchinson's (whose single
probe is noisy), and the trace is the embedding's (87 of 93): penalising the blocks'
trace alone barely moves the total.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import resource
import sys
from pathlib import Path

import torch

from sameloss.experiments.engine.walk import with_start
from sameloss.experiments.stats.paired import at_target, comparison_target, outside
from sameloss.experiments.recipes.isoloss import PRESETS, Fork, fork_run
from sameloss.experiments.recipes.isoloss.study import _run_prefix, _trace_spec
from sameloss.measures.run import measure_checkpoint
from sameloss.training import pretrain
from sameloss.training.checkpoint import checkpoint_dir


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _kls(run: Path) -> dict[int, float]:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["eval"]["kl"] for r in rows if "eval" in r}


def _adamw(study: Path, seed: int, prefix: str) -> tuple[list[float], list[float]]:
    """The AdamW fork's KLs and traces at its measured checkpoints (the study's own measurements,
    or measured here with the study's settings where the study has not measured them yet)."""
    p = PRESETS["tiny"]
    run = f"runs/{prefix}-s{seed}-late-adamw/checkpoints/step_"
    path = study / "seeds" / f"seed{seed}" / "measurements.json"
    measured = json.loads(path.read_text()) if path.exists() else {}
    traces = {int(k.split("step_")[1].split("|")[0]): v["trace_fisher"] for k, v in measured.items()
              if run in k and isinstance(v, dict) and "trace_fisher" in v}
    run_dir = study / "seeds" / f"seed{seed}" / "runs" / f"{prefix}-s{seed}-late-adamw"
    if not traces:
        tspec = _trace_spec(p, seed)
        traces = {s: measure_checkpoint(checkpoint_dir(run_dir, s), tspec)["trace_fisher"]
                  for s in p.probe_steps(p.forks[0])}
    kls = _kls(run_dir)
    steps = sorted(traces)
    return [kls[s] for s in steps], [traces[s] for s in steps]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--study", type=Path, required=True, help="a tiny isoloss study's folder (read only)")
    ap.add_argument("--weight", type=float, default=None, help="flatness.weight (λ; < 0 sharpens) of a fork to train")
    ap.add_argument("--estimator", default="signs", choices=("signs", "per-example"),
                    help="flatness.estimator of the fork trained (the study's default: signs)")
    ap.add_argument("--existing", default=None, metavar="FORK",
                    help="read the study's own late fork FORK (e.g. flat) instead of training one")
    ap.add_argument("--measure", default="fisher", choices=("fisher", "hutchinson"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--stretch", type=int, default=None, help="steps at the final lr (default: the preset's)")
    ap.add_argument("--out", type=Path, default=Path("calibration"), help="where the fork is trained")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    p = PRESETS["tiny"]
    prefix = _run_prefix(p)
    base = args.study / "seeds" / f"seed{args.seed}" / "runs" / f"{prefix}-s{args.seed}-base"
    if not base.is_dir():
        sys.exit(f"error: no base run {base}")
    if args.existing is not None:  # the study's own fork: its run and its measured traces
        fork = {f.name: f for f in p.forks}[args.existing]
        run_dir = args.study / "seeds" / f"seed{args.seed}" / "runs" / f"{prefix}-s{args.seed}-late-{fork.name}"
        args.weight = dict(fork.settings)["flatness.weight"]
        train_cpu = float("nan")
    else:
        if args.weight is None:
            sys.exit("error: give --weight (a fork to train) or --existing FORK")
        fork = Fork(f"{args.measure}{args.weight:g}", f"flatness λ {args.weight:g}",
                    (("flatness.weight", args.weight), ("flatness.measure", args.measure),
                     ("flatness.estimator", args.estimator)), final_steps=args.stretch)
        spec = with_start(fork_run(p, args.seed, fork, p.base_steps), checkpoint_dir(base, p.base_steps))
        run_dir = args.out / fork.name
        c0 = _cpu()
        pretrain(spec.config(), run_dir, progress=False, fresh=True)
        train_cpu = _cpu() - c0
    kls = _kls(run_dir)
    steps = p.probe_steps(fork)
    tspec = _trace_spec(p, args.seed)
    traces = [measure_checkpoint(checkpoint_dir(run_dir, s), tspec)["trace_fisher"] for s in steps]
    fork_kl = [kls[s] for s in steps]
    ref_kl, ref_trace = _adamw(args.study, args.seed, prefix)
    target = comparison_target(fork_kl, ref_kl)
    a, b = at_target(fork_kl, traces, target), at_target(ref_kl, ref_trace, target)
    out = {"weight": args.weight, "measure": args.measure, "existing": args.existing, "seed": args.seed, "train_cpu_s": round(train_cpu, 1),
           "fork_kl": [min(fork_kl), max(fork_kl)], "adamw_kl": [min(ref_kl), max(ref_kl)], "target": target,
           "outside": max(outside(fork_kl, target), outside(ref_kl, target)), "trace": a, "adamw_trace": b,
           "relative_change": a / b - 1}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
