"""Benchmark: the flatness penalty's cost per training step against plain training.

The design of the tiny isoloss study (``PRESETS["tiny"]`` of ``experiments/recipes/isoloss.py``:
its base run's config — the HMM ``headroom`` language, the ``tiny`` transformer, batch
256, AdamW) on the CPU, one training step (``step.train_step``: batch, forward, backward,
optimiser) timed with and without ``flatness.weight``, for each estimator:

* ``plain``: no penalty (λ = 0);
* ``fisher K=2``: the default — 2 labels drawn from the model per masked position of the
  slice's ``--sentences`` sentences;
* ``fisher exact``: every label (``flatness.labels=0``: the vocabulary's 11 backward passes
  per position);
* ``hutchinson``: one Rademacher probe per step (``flatness.probes=1``);
* ``fisher K=2, whole batch``: the slice is the whole batch of 256 sentences.

Each variant trains its own run from the same initial weights; the variants take turns,
``--steps`` steps each per round for ``--rounds`` rounds, so that a change of the
machine's load hits all of them alike, and the ratio to ``plain`` is taken within each
round (its median over rounds is printed, with the median time per step). The first
steps of each variant (one-off ``torch.func`` set-up) are not timed. The load average is
printed with the result: on a shared machine the absolute times move with it, the ratios
much less.

    python bench/bench_flatness.py [--steps 20] [--rounds 3] [--sentences 32] [--threads 1]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from sameloss.experiments.recipes.isoloss import PRESETS, base_run
from sameloss.training import member, runfolder, runio
from sameloss.training.config import FlatnessConfig
from sameloss.training.step import Members, train_step


def make_run(cfg, run_dir: Path) -> Members:
    """A stack of the one member of ``cfg`` built as ``pretrain`` builds it (the same seed: the
    same initial weights for every variant), in a folder of its own, without a tracker."""
    shared = member.Shared(runio.build_language(cfg), torch.device("cpu"))
    return Members([member.build(0, cfg, run_dir, runfolder.Plan("train", "trained", ""), shared)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20, help="steps per variant per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sentences", type=int, default=FlatnessConfig.sentences, help="the penalty's slice")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (0: torch's default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    base = dataclasses.replace(base_run(PRESETS["tiny"], 0).config(), device="cpu")
    s = args.sentences
    variants = {
        "plain": FlatnessConfig(),
        f"fisher K=2, {s} sentences": FlatnessConfig(weight=0.01, measure="fisher", sentences=s, labels=2),
        f"fisher exact, {s} sentences": FlatnessConfig(weight=0.01, measure="fisher", sentences=s, labels=0),
        f"hutchinson 1 probe, {s} sentences": FlatnessConfig(weight=0.01, measure="hutchinson", sentences=s, probes=1),
        "fisher K=2, whole batch": FlatnessConfig(weight=0.01, measure="fisher", sentences=base.batch_size, labels=2),
    }
    with tempfile.TemporaryDirectory() as tmp:
        runs = {name: make_run(dataclasses.replace(base, flatness=f), Path(tmp) / f"v{i}")
                for i, (name, f) in enumerate(variants.items())}
        step = {name: 1 for name in runs}
        for name, run in runs.items():  # warm-up, not timed
            for _ in range(2):
                train_step(run, step[name])
                step[name] += 1
        per_step: dict[str, list[float]] = {name: [] for name in runs}
        for _ in range(args.rounds):
            for name, run in runs.items():
                t0 = time.perf_counter()
                for _ in range(args.steps):
                    train_step(run, step[name])
                    step[name] += 1
                per_step[name].append((time.perf_counter() - t0) / args.steps)
    m = runio.init_model(base, runio.build_language(base)).config
    print(f"tiny isoloss design: {base.language.name} {base.language.size}, transformer {base.model.size} "
          f"(d {m.d_model}, {m.n_layers} layers), batch {base.batch_size}, {base.optim.name}; "
          f"{args.rounds} rounds × {args.steps} steps per variant, {torch.get_num_threads()} thread(s); "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"{'variant':40s} {'ms/step':>9s} {'× plain':>8s}")
    for name, times in per_step.items():
        ratio = statistics.median(t / p for t, p in zip(times, per_step["plain"]))
        print(f"{name:40s} {1000 * statistics.median(times):9.1f} {ratio:8.2f}")


if __name__ == "__main__":
    main()
