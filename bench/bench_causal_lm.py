"""Benchmark: fast exact causal-LM conditionals vs the plain no-cache computation.

Builds a random GPT-2 (default: 2 layers, d=128, GPT-2's 50257-token vocabulary), saves
it as an HF folder, loads it as ``CausalLM`` (K allowed tokens, length T) and computes
the single-mask conditionals of every position of sampled sentences two ways:

* ``conditionals`` — one pass for the prefix terms and the prefix KV caches, then per
  position the K continuations on the cached prefix, through the K head rows only;
* ``conditionals_reference`` — the plain computation: each of the T·K candidate
  sentences scored independently from scratch (no cache, full-vocabulary logits).

It checks that both agree, and prints sentences/s, the speed-up and the FLOPs per
sentence of each (counted by ``torch.utils.flop_counter``: matrix products and
attention; element-wise work is not counted).

    pip install 'sameloss[hf]'
    python bench/bench_causal_lm.py [--k 64] [--length 12] [--n 64] [--n-plain 4] [--threads 1]
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch
from torch.utils.flop_counter import FlopCounterMode

from sameloss.languages.lm_generated import CausalLM


def best_time(fn, repeats: int):
    best, out = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return best, out


def flops(fn) -> int:
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", type=int, default=64)
    ap.add_argument("--length", type=int, default=12)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--n", type=int, default=64, help="sentences for the fast method")
    ap.add_argument("--n-plain", type=int, default=4, help="sentences for the plain method (slow)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (0: torch's default)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    import transformers

    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=args.vocab, n_positions=max(64, args.length + 1),
                                     n_embd=args.d_model, n_layer=args.layers, n_head=args.heads)
    with tempfile.TemporaryDirectory() as folder:
        transformers.GPT2LMHeadModel(config).save_pretrained(folder)
        lm = CausalLM.from_pretrained(folder, k=args.k, length=args.length, tokens=list(range(100, 100 + args.k)),
                                      device=args.device, dtype=args.dtype)
    gen = torch.Generator().manual_seed(0)
    tokens = lm.sample(args.n, gen).tokens
    every = torch.ones_like(tokens, dtype=torch.bool)
    none = torch.zeros_like(every)
    few, few_q = tokens[:args.n_plain], every[:args.n_plain]

    fast_s, fast = best_time(lambda: lm.conditionals(tokens, none, every), args.repeats)
    plain_s, plain = best_time(lambda: lm.conditionals_reference(few, few_q), 1)
    diff = float((fast[:few_q.sum()] - plain).abs().max())
    fast_flops = flops(lambda: lm.conditionals(tokens[:args.n_plain], none[:args.n_plain], few_q)) / args.n_plain
    plain_flops = flops(lambda: lm.conditionals_reference(few, few_q)) / args.n_plain

    fast_rate, plain_rate = args.n / fast_s, args.n_plain / plain_s
    print(f"generator: random GPT-2, {args.layers} layers, d={args.d_model}, vocab {args.vocab}; "
          f"K={args.k}, T={args.length}; {args.device} {args.dtype}, {torch.get_num_threads()} thread(s)")
    print(f"all T single-mask conditionals per sentence; max |fast - plain| = {diff:.2e}")
    print(f"{'method':<34}{'sentences/s':>12}{'GFLOP/sentence':>16}")
    print(f"{'fast (prefix cache, K-row head)':<34}{fast_rate:>12.2f}{fast_flops / 1e9:>16.3f}")
    print(f"{'plain (no cache, full logits)':<34}{plain_rate:>12.3f}{plain_flops / 1e9:>16.3f}")
    print(f"speed-up {fast_rate / plain_rate:.1f}x, FLOP ratio {plain_flops / fast_flops:.1f}x")


if __name__ == "__main__":
    main()
