"""Benchmark: the peak device memory of every curvature measure at the paper's sizes, from
``measures.curvature.memory.peak_bytes`` (the measures' own code on the meta device), and a
check of that estimate against a real run's memory.

1. Table. Each measure at ``--sizes`` (Table 3 transformers with the paper's PCFG
   vocabulary, 203 tokens, and 32 positions), at ``sameloss measure``'s defaults (Hessian
   measures: 1024 sentences, 8 probes per product chunk; Lanczos: 100 products; Fisher:
   blocks of 256 contexts, 50 labels, per-sample gradients in 128 MB chunks):
   ``defaults``, and ``micro_batch=64`` = the Hessian measures holding the graph of 64
   sentences at a time (``measure --micro-batch 64``). Per-block traces (``--trace-by block``) need
   the same memory as the total (per-block sums of a few numbers per probe).
2. Check. ``trace_hutchinson`` run for real on the CPU at ``--check-size`` with
   ``--check-sentences`` sentences in a fresh process: the growth of its peak resident
   memory against the estimate (the process also holds the allocator's slack).

    python bench/bench_curvature_memory.py [--sizes t3-256 t3-768 t3-1024] [--check-size tiny]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

CHECK = r"""
import json, resource, sys, torch
from sameloss.measures.curvature import FixedBatch, trace_hutchinson
from sameloss.measures.curvature.memory import stand_in_batch
from sameloss.models import TransformerMLM, transformer_config
torch.set_num_threads(1)
size, n = sys.argv[1], int(sys.argv[2])
cfg = transformer_config(size, 203, 32, dropout=0.0, attn_dropout=0.0)
model = TransformerMLM(cfg)
batch = stand_in_batch(cfg, n)
batch.inputs.random_(0, 200)
trace_hutchinson(model, None, FixedBatch(batch=stand_in_batch(cfg, 2)), n_probes=1)  # one-off set-up
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
trace_hutchinson(model, None, FixedBatch(batch=batch), n_probes=8, probe_chunk=8)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"growth": after - before}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", nargs="+", default=["t3-256", "t3-768", "t3-1024"])
    parser.add_argument("--check-size", default="tiny")
    parser.add_argument("--check-sentences", type=int, default=256)
    args = parser.parse_args()

    from sameloss.measures.curvature.memory import memory_table, peak_bytes
    from sameloss.models import transformer_config

    cfg = transformer_config(args.check_size, 203, 32, dropout=0.0, attn_dropout=0.0)
    est = peak_bytes("trace_hutchinson", cfg, {"n_sentences": args.check_sentences, "n_probes": 8})
    out = subprocess.run([sys.executable, "-c", CHECK, args.check_size, str(args.check_sentences)],
                         capture_output=True, text=True, check=True)
    growth = json.loads(out.stdout.strip().splitlines()[-1])["growth"]
    print(f"check: trace_hutchinson, {args.check_size}, {args.check_sentences} sentences, 8 probes on the CPU: "
          f"estimated working memory {est.parts['working'] / 2**20:.0f} MiB, peak resident memory grew by "
          f"{growth / 2**20:.0f} MiB")
    print(f"\n{'size':<8} {'params':>7} {'measure':<17} {'variant':<22} {'peak GiB':>9}   parts (GiB)")
    for size in args.sizes:
        start = time.perf_counter()
        for row in memory_table((size,)):
            parts = ", ".join(f"{k} {v:.2f}" for k, v in row["parts_gib"].items())
            print(f"{row['size']:<8} {row['n_params'] / 1e6:>6.1f}M {row['measure']:<17} {row['variant']:<22} "
                  f"{row['gib']:>9.2f}   {parts}", flush=True)
        print(f"({size}: worked out in {time.perf_counter() - start:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
