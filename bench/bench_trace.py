"""Benchmark: time to a 2% relative standard error, paper's (Fisher) estimator vs Hutchinson.

On one checkpoint (``--checkpoint PATH``, or a tiny transformer pre-trained here for
``--steps`` steps on the tiny PCFG), each trace estimator of
``sameloss.measures.curvature`` is run in rounds, the sample doubling every round, until
its pooled relative standard error reaches ``--target``:

* ``fisher``: ``trace_fisher`` (App. B.1), fresh contexts every round, ``--n-labels``
  labels drawn from the model per context (the paper: 50);
* ``fisher-exact``: the same with the exact expectation over the labels (``n_labels=None``);
* ``fisher-few``: the same with ``--few-labels`` labels per context (the context-to-context
  spread dominates the variance, so few labels per context are the cheaper way to it);
* ``hutchinson``: ``trace_hutchinson``, Rademacher probes on one fixed batch of
  ``--batch`` sentences at 15% masking (fresh probes every round). Its standard error
  is over probes only: it measures that batch's Hessian, which itself differs from the
  population value by the batch-to-batch spread (printed);
* ``hutchinson-fresh``: ``trace_hutchinson`` on a fresh batch of ``--fresh-batch``
  sentences with ``--fresh-probes`` probes per call, each call one i.i.d. sample — a
  standard error of the population trace, comparable with the Fisher estimator's.

The Fisher estimators and Hutchinson's do not estimate the same number unless the model
is saturated (Fisher vs Hessian) and the masking is the same (one mask per context vs
15%): the comparison is of the time each needs to pin its own quantity down to 2%.

Rounds are pooled exactly from each round's mean, standard error and count. An estimator
that has not reached the target after ``--max-seconds`` is stopped and its time to the
target extrapolated (the standard error falls as 1/√n). Each estimator is warmed up
once first (the first ``torch.func`` call pays a one-off set-up cost). Torch runs on one
thread by default (``--threads 0`` keeps torch's default): on a small shared machine
intra-op threads mostly add synchronisation for models this small.

    python bench/bench_trace.py [--checkpoint PATH] [--steps 300] [--target 0.02]
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import torch

from sameloss import config as configlib
from sameloss.measures.curvature import FisherContexts, FixedBatch, loss_batch, trace_fisher, trace_hutchinson
from sameloss.training import PretrainConfig, load_checkpoint, pretrain
from sameloss.training.checkpoint import complete_checkpoints


class Pool:
    """Pooled mean and standard error of i.i.d. samples given per-round (mean, SE, n)."""

    def __init__(self):
        self.n, self.total, self.squares = 0, 0.0, 0.0

    def add(self, mean: float, stderr: float, n: int) -> None:
        var = stderr ** 2 * n  # the round's sample variance (ddof 1)
        self.total += mean * n
        self.squares += var * (n - 1) + n * mean ** 2
        self.n += n

    @property
    def mean(self) -> float:
        return self.total / self.n

    @property
    def stderr(self) -> float:
        var = (self.squares - self.n * self.mean ** 2) / (self.n - 1)
        return math.sqrt(max(var, 0.0) / self.n)

    @property
    def relative(self) -> float:
        return abs(self.stderr / self.mean) if self.mean else float("inf")


def make_checkpoint(steps: int, out: Path) -> Path:
    cfg = configlib.load(PretrainConfig, None, [f"steps={steps}", "model.size=tiny", f"eval.every={steps}",
                                                "device=cpu", "optim.warmup_steps=30", f"save_every={steps}"])
    start = time.perf_counter()
    result = pretrain(cfg, out, progress=False)
    print(f"pre-trained {steps} steps in {time.perf_counter() - start:.0f}s: exact loss {result['loss']:.4f}, "
          f"KL {result['kl']:.4f}")
    return complete_checkpoints(out)[-1]


def run(name: str, one_round, first: int, target: float, max_seconds: float) -> dict:
    """Rounds of ``one_round(n, round) -> CurvatureResult`` until the target or the time
    budget; the sample doubles each round."""
    pool, elapsed, size, r = Pool(), 0.0, first, 0
    while True:
        res = one_round(size, r)
        elapsed += res.seconds
        pool.add(res.estimate, res.stderr, res.n_samples)
        r += 1
        print(f"  {name:16s} round {r}: n={pool.n:6d}  {pool.mean:10.4f} ± {pool.stderr:8.4f}  "
              f"(rel {pool.relative:.4f})  {elapsed:7.1f}s", flush=True)
        if pool.relative <= target or elapsed >= max_seconds:
            break
        size = pool.n  # double the total
    # the time at which the target is crossed, at this estimator's rate (SE ∝ 1/√n): a
    # fair figure also for estimators whose last doubling overshot it
    needed = elapsed * (pool.relative / target) ** 2
    return {"name": name, "estimate": pool.mean, "stderr": pool.stderr, "n": pool.n, "seconds": elapsed,
            "reached": pool.relative <= target, "seconds_to_target": needed, "n_params": res.n_params}


def fresh_batches(model, language, n: int, r: int, sentences: int, probes: int) -> SimpleNamespace:
    """``n`` Hutchinson estimates, each on its own fresh batch, as i.i.d. samples."""
    runs = [trace_hutchinson(model, language, FixedBatch(n_sentences=sentences, seed=1_000_000 * (r + 1) + i),
                             n_probes=probes, probe_chunk=probes) for i in range(n)]
    values = torch.tensor([x.estimate for x in runs], dtype=torch.float64)
    return SimpleNamespace(estimate=float(values.mean()), stderr=float(values.std() / math.sqrt(n)), n_samples=n,
                           seconds=sum(x.seconds for x in runs), n_params=runs[0].n_params)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--checkpoint", type=Path, help="a checkpoint directory (default: pre-train one)")
    ap.add_argument("--steps", type=int, default=300, help="pre-training steps when no checkpoint is given")
    ap.add_argument("--target", type=float, default=0.02, help="relative standard error to reach")
    ap.add_argument("--n-labels", type=int, default=50)
    ap.add_argument("--few-labels", type=int, default=2)
    ap.add_argument("--batch", type=int, default=256, help="Hutchinson's fixed batch (sentences)")
    ap.add_argument("--fresh-batch", type=int, default=32, help="sentences per call of hutchinson-fresh")
    ap.add_argument("--fresh-probes", type=int, default=4, help="probes per call of hutchinson-fresh")
    ap.add_argument("--max-seconds", type=float, default=240.0, help="time budget per estimator")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--only", nargs="*",
                    default=["fisher", "fisher-exact", "fisher-few", "hutchinson", "hutchinson-fresh"])
    args = ap.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)

    with tempfile.TemporaryDirectory() as tmp:
        path = args.checkpoint or make_checkpoint(args.steps, Path(tmp) / "run")
        model, language, cfg, _ = load_checkpoint(path)
    print(f"checkpoint: {path.name} ({cfg.model.kind} {cfg.model.size}, {language.name} {cfg.language.size}, "
          f"{sum(p.numel() for p in model.parameters())} parameters), torch threads {torch.get_num_threads()}")

    batch = loss_batch(language, args.batch, 0.15, seed=0)
    rounds = {
        "fisher": (lambda n, r: trace_fisher(model, language, FisherContexts(n_contexts=n, seed=100 + r),
                                             n_labels=args.n_labels), 64),
        "fisher-exact": (lambda n, r: trace_fisher(model, language, FisherContexts(n_contexts=n, seed=100 + r),
                                                   n_labels=None), 64),
        "fisher-few": (lambda n, r: trace_fisher(model, language, FisherContexts(n_contexts=n, seed=100 + r),
                                                 n_labels=args.few_labels), 64),
        "hutchinson": (lambda n, r: trace_hutchinson(model, language, FixedBatch(batch=batch, seed=100 + r),
                                                     n_probes=n, probe_chunk=8), 16),
        "hutchinson-fresh": (lambda n, r: fresh_batches(model, language, n, r, args.fresh_batch,
                                                        args.fresh_probes), 16),
    }
    results = {}
    for name in args.only:
        fn, first = rounds[name]
        fn(2, 10_000)  # warm-up
        results[name] = run(name, fn, first, args.target, args.max_seconds)

    print(f"\ntime to a {100 * args.target:g}% relative standard error "
          "(extrapolated as 1/sqrt(n) where the budget ran out):")
    for r in results.values():
        mark = "" if r["reached"] else f"  (stopped at rel {r['stderr'] / abs(r['estimate']):.3f} after "\
                                         f"{r['seconds']:.0f}s)"
        print(f"  {r['name']:16s} {r['estimate']:10.4f} ± {r['stderr']:.4f}   n={r['n']:6d}   "
              f"{r['seconds_to_target']:9.1f}s{mark}")
    for hutch in ("hutchinson", "hutchinson-fresh"):
        for name in ("fisher", "fisher-exact", "fisher-few"):
            if hutch in results and name in results:
                ratio = results[hutch]["seconds_to_target"] / results[name]["seconds_to_target"]
                print(f"  time({hutch}) / time({name}) = {ratio:.1f}")
    if "hutchinson" in results:
        # how far one batch's trace is from the population's: the spread of fixed-batch
        # estimates on other batches, less their probe noise
        runs = [trace_hutchinson(model, language, FixedBatch(n_sentences=args.batch, seed=500 + i), n_probes=48,
                                 probe_chunk=8) for i in range(8)]
        est = torch.tensor([x.estimate for x in runs], dtype=torch.float64)
        probe_var = float(torch.tensor([x.stderr ** 2 for x in runs]).mean())
        between = math.sqrt(max(float(est.var()) - probe_var, 0.0)) / float(est.mean())
        print(f"  fixed-batch Hutchinson on 8 other batches of {args.batch} (48 probes each): "
              + ", ".join(f"{x:.0f}" for x in est.tolist())
              + f"; batch-to-batch relative std, probe noise removed: {between:.3f}")


if __name__ == "__main__":
    main()
