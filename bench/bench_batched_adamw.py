"""Why ``measures/batched_heads.py`` writes its AdamW step out by hand (``_adamw_update``): the
same update through torch's own functional Adam (``torch.optim.adam.adam``, the decoupled weight
decay on the weight columns, as torch's AdamW applies it) gives the same bits, and costs more per
fit.

The few-shot heads of the isoloss study's AdamW endpoints (``pos`` and ``all`` views) step
hundreds of times on small tensors, so a step's Python overhead is a share of its time; both
variants run ``batched_heads.adamw_heads`` on the same groups (synthetic Gaussian features of
``--width`` dimensions, 4 classes, the study's subset sizes), interleaved, in this process's CPU
time with one thread; the table gives the median over rounds of each one's seconds and of their
ratio, and whether the fitted heads are equal bit for bit.

    python bench/bench_batched_adamw.py
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
from torch.optim.adam import adam

from sameloss.measures import batched_heads
from sameloss.measures.batched_heads import HeadGroup, adamw_heads
from sameloss.measures.heads import HeadTraining

HAND = batched_heads._adamw_update


def torch_adam_update(theta, grad, m, v, step, lr, decay) -> None:
    """``batched_heads._adamw_update`` through ``torch.optim.adam.adam``: AdamW's decoupled
    decay on the weight columns as torch applies it, then torch's Adam step."""
    theta[:, :, :-1].mul_(decay[0])
    adam([theta], [grad], [m], [v], [], [torch.tensor(float(step - 1))], foreach=False, amsgrad=False, beta1=0.9,
         beta2=0.999, lr=lr, weight_decay=0.0, eps=1e-8, maximize=False)


def groups(width: int, sizes: list[tuple[int, int]]) -> list[HeadGroup]:
    gen = torch.Generator().manual_seed(0)
    means = torch.randn(4, width, generator=gen)
    out = []
    for n, k in sizes:
        y = torch.randint(0, 4, (k, n), generator=gen)
        x = means[y] + torch.randn(k, n, width, generator=gen)
        out.append(HeadGroup((x - x.mean(1, keepdim=True)) / x.std(1, keepdim=True), y, seed=n))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--width", type=int, default=64, help="feature dimensions (the tiny model's d_model)")
    ap.add_argument("--epochs", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=7)
    a = ap.parse_args()
    torch.set_num_threads(1)
    sizes = [(50, 20), (200, 20), (1000, 10)]
    gs, how = groups(a.width, sizes), HeadTraining("adamw", epochs=a.epochs, batch_size=32)
    fitted, seconds = {}, {"by hand": [], "torch.optim.adam.adam": []}
    for r in range(a.rounds):
        for name, update in (("by hand", HAND), ("torch.optim.adam.adam", torch_adam_update))[:: 1 if r % 2 else -1]:
            batched_heads._adamw_update = update
            start = time.process_time()
            fitted[name] = adamw_heads(gs, 4, how)
            seconds[name].append(time.process_time() - start)
    batched_heads._adamw_update = HAND
    same = all(torch.equal(a_.W, b_.W) and torch.equal(a_.b, b_.b)
               for a_, b_ in zip(fitted["by hand"], fitted["torch.optim.adam.adam"]))
    ratio = statistics.median(t / h for t, h in zip(seconds["torch.optim.adam.adam"], seconds["by hand"]))
    print(f"heads: {sizes} (n, k), width {a.width}, {a.epochs} epochs, batch 32; {a.rounds} rounds, one thread; "
          f"load average {os.getloadavg()[0]:.2f}")
    for name, times in seconds.items():
        print(f"{name:24s} {statistics.median(times):.3f} s")
    print(f"torch / by hand: {ratio:.2f}× (median of paired ratios); the same bits: {same}")


if __name__ == "__main__":
    main()
