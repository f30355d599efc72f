"""Benchmark: Hutch++ against Hutchinson at equal matrix-vector products.

The error of a trace estimate for the same number of products (each a Hessian-vector
product, the cost that matters) is compared as the standard deviation of the estimate
over ``--seeds`` seeds, on

* dense symmetric matrices (dimension ``--dim``) with decaying spectra — ``1/i²``,
  ``1/i``, a Hessian-like power law with a few outliers — and a flat one (where Hutch++
  cannot win: no part of the spectrum dominates);
* the Hessian of a tiny transformer's fixed-batch loss (``LossHessian``), pre-trained here
  for ``--steps`` steps on the micro HMM (skip with ``--steps 0``).

Printed: the exact trace (dense: ``trace``; model: none), each estimator's mean and sd
over seeds, and the variance ratio Hutchinson / Hutch++ (how many times more products
plain Hutchinson would need for the same error).

    python bench/bench_trace_estimators.py [--dim 1000] [--products 30 99 300] [--seeds 100] [--steps 300]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from sameloss import config as configlib
from sameloss.measures.curvature import LossHessian, MatrixOperator, hutchinson_trace, hutchpp_trace, loss_batch
from sameloss.models.derivatives import measuring
from sameloss.training import PretrainConfig, load_checkpoint, pretrain
from sameloss.training.checkpoint import complete_checkpoints


def with_spectrum(eigenvalues: torch.Tensor, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    n = eigenvalues.numel()
    Q, _ = torch.linalg.qr(torch.randn(n, n, generator=g, dtype=torch.float64))
    return (Q * eigenvalues) @ Q.T


def compare(name: str, A, exact: float | None, products: list[int], seeds: int, chunk: int) -> None:
    for m in products:
        stats = {}
        start = time.perf_counter()
        for f in (hutchinson_trace, hutchpp_trace):
            values = [f(A, m, generator=torch.Generator().manual_seed(s), chunk=chunk).estimate for s in range(seeds)]
            stats[f.__name__] = (statistics.mean(values), statistics.stdev(values))
        (mh, sh), (mp, sp) = stats["hutchinson_trace"], stats["hutchpp_trace"]
        truth = "" if exact is None else f"{exact:.5g}"
        print(f"{name:<28} {m:>8} {truth:>10} {mh:>11.5g} ± {sh:<9.3g} {mp:>11.5g} ± {sp:<9.3g} "
              f"{(sh / sp) ** 2:>9.1f}  ({time.perf_counter() - start:.0f} s)", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dim", type=int, default=1000)
    parser.add_argument("--products", type=int, nargs="+", default=[30, 99, 300])
    parser.add_argument("--seeds", type=int, default=100)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--model-seeds", type=int, default=30)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print("sd over seeds of each estimate at equal products; ratio = Var(Hutchinson) / Var(Hutch++)")
    print(f"{'operator':<28} {'products':>8} {'trace':>10} {'Hutchinson mean ± sd':>23} "
          f"{'Hutch++ mean ± sd':>23} {'var ratio':>9}")
    i = torch.arange(1, args.dim + 1, dtype=torch.float64)
    dense = {"dense, 1/i^2": 1 / i ** 2, "dense, 1/i": 1 / i,
             "dense, i^-1.5 + 3 outliers": torch.cat([torch.tensor([50.0, 30.0, 29.0], dtype=torch.float64),
                                                       10 * i[3:] ** -1.5]),
             "dense, flat (U[1, 2])": 1 + torch.rand(args.dim, generator=torch.Generator().manual_seed(0),
                                                     dtype=torch.float64)}
    for k, (name, ev) in enumerate(dense.items()):
        M = with_spectrum(ev, seed=k)
        compare(name, MatrixOperator(M), float(M.trace()), args.products, args.seeds, chunk=100)
    if args.steps:
        with tempfile.TemporaryDirectory() as tmp:
            cfg = configlib.load(PretrainConfig, None, [
                f"steps={args.steps}", "model.size=tiny", "language.name=hmm", "language.size=micro",
                "eval.every=0", "eval.n_sentences=200", "save_every=100000", "device=cpu", "name=t"])
            pretrain(cfg, Path(tmp) / "t", progress=False)
            model, language, _, _ = load_checkpoint(complete_checkpoints(Path(tmp) / "t")[-1])
        batch = loss_batch(language, 256, None, seed=0)
        with measuring(model):
            H = LossHessian(model, batch)
            print(f"(tiny transformer, {H.dim} parameters, {args.steps} steps on the micro HMM, 256 sentences)")
            compare("tiny transformer Hessian", H, None, [m for m in args.products if m <= 99], args.model_seeds,
                    chunk=33)


if __name__ == "__main__":
    main()
