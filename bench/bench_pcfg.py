"""Exact PCFG conditionals on the released grammar: batched chart vs a plain reference.

    python bench/bench_pcfg.py [--grammar ../shared/anchors/rule_deep_mlm.txt] [--n 8192]

Times ``PCFG.conditionals`` at every position of every sentence (each position's
conditional given all the other words — the look-up-table / entropy workload) and a
straightforward per-sentence inside–outside (NumPy, loops over spans and splits, the
rule tensor contracted densely with einsum) on a subset of the same sentences, checks
they agree, and prints sentences/s and the ratio. Target: >= 2,000 sentences/s on 2 cores.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch

from sameloss.languages.pcfg import PCFG

DEFAULT_GRAMMAR = Path(__file__).resolve().parents[2] / "shared" / "anchors" / "rule_deep_mlm.txt"


def reference_conditionals(lang: PCFG, sentence: list[int]) -> np.ndarray:
    """``[n, W]`` P(x_t = w | other words) for one sentence, by textbook inside–outside."""
    g = lang.grammar
    n_sym = g.n_nonterminals
    rules = np.zeros((n_sym, n_sym, n_sym))
    np.add.at(rules, (g.rule_parent.numpy(), g.rule_left.numpy(), g.rule_right.numpy()), g.rule_prob.numpy())
    emission = g.emission.numpy()
    n = len(sentence)
    inside = np.zeros((n, n + 1, n_sym))
    for i, w in enumerate(sentence):
        inside[i, i + 1] = emission[:, w]
    for length in range(2, n + 1):
        for i in range(n - length + 1):
            j = i + length
            for k in range(i + 1, j):
                inside[i, j] += np.einsum("abc,b,c->a", rules, inside[i, k], inside[k, j])
    outside = np.zeros_like(inside)
    outside[0, n] = g.start.numpy()
    for length in range(n, 1, -1):
        for i in range(n - length + 1):
            j = i + length
            for k in range(i + 1, j):
                outside[i, k] += np.einsum("abc,a,c->b", rules, outside[i, j], inside[k, j])
                outside[k, j] += np.einsum("abc,a,b->c", rules, outside[i, j], inside[i, k])
    cond = outside[np.arange(n), np.arange(1, n + 1)] @ emission
    return cond / cond.sum(axis=1, keepdims=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grammar", default=str(DEFAULT_GRAMMAR))
    parser.add_argument("--n", type=int, default=8192, help="sentences for the batched timing")
    parser.add_argument("--n-reference", type=int, default=100, help="sentences for the reference timing")
    parser.add_argument("--batch", type=int, default=4096, help="sentences per conditionals() call")
    args = parser.parse_args()

    lang = PCFG.from_file(args.grammar)
    batch = lang.sample(args.n, torch.Generator().manual_seed(0))
    tokens = batch.tokens
    query = tokens != lang.pad_id
    none_masked = torch.zeros_like(query)
    print(f"grammar {args.grammar}: {lang.grammar.n_nonterminals} symbols, {lang.grammar.n_rules} binary rules, "
          f"{lang.n_words} words; {args.n} sentences, mean length {batch.lengths.double().mean():.2f}; "
          f"torch threads {torch.get_num_threads()}")

    lang.conditionals(tokens[:256], none_masked[:256], query[:256])  # warm-up
    start = time.perf_counter()
    out = [lang.conditionals(tokens[i:i + args.batch], none_masked[i:i + args.batch], query[i:i + args.batch])
           for i in range(0, args.n, args.batch)]
    batched_s = time.perf_counter() - start
    ours = torch.cat(out)
    batched_rate = args.n / batched_s

    m = args.n_reference
    start = time.perf_counter()
    ref = [reference_conditionals(lang, tokens[i, : batch.lengths[i]].tolist()) for i in range(m)]
    reference_s = time.perf_counter() - start
    reference_rate = m / reference_s
    n_rows = int(batch.lengths[:m].sum())
    diff = np.abs(ours[:n_rows].numpy() - np.concatenate(ref)).max()

    print(f"batched   {batched_rate:10.1f} sentences/s  ({args.n} sentences, all positions, {batched_s:.2f} s)")
    print(f"reference {reference_rate:10.1f} sentences/s  ({m} sentences, {reference_s:.2f} s)")
    print(f"ratio     {batched_rate / reference_rate:10.1f}x   max |difference| {diff:.2e}")
    print(f"target    >= 2000 sentences/s: {'met' if batched_rate >= 2000 else 'NOT met'}")


if __name__ == "__main__":
    main()
