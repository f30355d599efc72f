"""Benchmark: batched forward–backward (sameloss) vs hmmlearn vs a per-sentence loop.

Builds the paper-size HMM (100 states, 200 words, length 16), samples sentences and
times hidden-state posteriors three ways on the same sequences:

* sameloss ``HMM.posteriors`` (and all-position ``conditionals``), batched in torch;
* ``hmmlearn.hmm.CategoricalHMM.predict_proba`` with the same matrices, one call with
  ``lengths=`` (hmmlearn loops over sequences in Python and runs each in C++), for both
  of its implementations ("scaling" and "log"), keeping the faster as the baseline; one
  call per sentence is also timed (on a subset) and is slower;
* a straightforward numpy forward–backward looping over sentences, for context.

It checks that all posteriors agree and prints sentences/s and the speed-up. Torch runs
on one thread by default, like hmmlearn and the loop (``--threads 0`` keeps torch's
default; on a small shared machine several threads can be much slower).

    pip install hmmlearn
    python bench/bench_hmm.py [--n 4096] [--repeats 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np
import torch

from sameloss.languages.hmm import HMM


def best_time(fn, repeats: int):
    """Best wall time of ``repeats`` calls (the least disturbed run) and the last result."""
    best, out = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return best, out


def reference_posteriors(hmm: HMM, tokens: np.ndarray) -> np.ndarray:
    """Textbook scaled forward–backward, one sentence at a time (numpy)."""
    pi, A, E = (m.numpy() for m in (hmm.initial, hmm.transition, hmm.emission))
    n, T = tokens.shape
    out = np.empty((n, T, hmm.n_states))
    for i in range(n):
        x = tokens[i]
        alpha = np.empty((T, hmm.n_states))
        a = pi * E[:, x[0]]
        alpha[0] = a / a.sum()
        for t in range(1, T):
            a = (alpha[t - 1] @ A) * E[:, x[t]]
            alpha[t] = a / a.sum()
        b = np.ones(hmm.n_states)
        out[i, T - 1] = alpha[T - 1]
        for t in range(T - 2, -1, -1):
            b = A @ (E[:, x[t + 1]] * b)
            b /= b.sum()
            g = alpha[t] * b
            out[i, t] = g / g.sum()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=4096, help="sentences")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--reference-n", type=int, default=512,
                        help="sentences for the slow per-sentence timings")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (default 1: hmmlearn and the numpy loop use one core; "
                             "0 keeps torch's default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    from hmmlearn.hmm import CategoricalHMM

    hmm = HMM.preset("paper")
    batch = hmm.sample(args.n, torch.Generator().manual_seed(0))
    tokens = batch.tokens
    n, T = tokens.shape
    print(f"paper HMM: {hmm.n_states} states, {hmm.n_words} words, length {T}; "
          f"{n} sentences; torch {torch.__version__}, {torch.get_num_threads()} threads")

    nothing = torch.zeros_like(tokens, dtype=torch.bool)
    everything = torch.ones_like(nothing)
    hmm.posteriors(tokens[:64])  # warm-up
    t_post, ours = best_time(lambda: hmm.posteriors(tokens), args.repeats)
    t_cond, cond = best_time(lambda: hmm.conditionals(tokens, nothing, everything), args.repeats)
    ours = ours.numpy()

    X = tokens.reshape(-1, 1).numpy()
    lengths = [T] * n
    hl_times, hl_post, models = {}, {}, {}
    for impl in ("scaling", "log"):
        model = CategoricalHMM(n_components=hmm.n_states, n_features=hmm.n_words,
                               init_params="", params="", implementation=impl)
        model.startprob_ = hmm.initial.numpy()
        model.transmat_ = hmm.transition.numpy()
        model.emissionprob_ = hmm.emission.numpy()
        models[impl] = model
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model.predict_proba(X[: 64 * T], lengths[:64])  # warm-up
            hl_times[impl], p = best_time(lambda: model.predict_proba(X, lengths), args.repeats)
        hl_post[impl] = p.reshape(n, T, hmm.n_states)
    impl = min(hl_times, key=hl_times.get)
    m = min(args.reference_n, n)
    # one predict_proba call per sentence instead of lengths= (on a subset; slower)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t_each, _ = best_time(lambda: [models[impl].predict_proba(X[i * T:(i + 1) * T]) for i in range(m)], 1)
    t_ref, ref = best_time(lambda: reference_posteriors(hmm, tokens[:m].numpy()), 1)

    print("max |posterior difference|:")
    for name, p in hl_post.items():
        print(f"  sameloss vs hmmlearn ({name}): {np.abs(ours - p).max():.2e}")
    print(f"  sameloss vs numpy loop:        {np.abs(ours[:m] - ref).max():.2e}")
    print(f"  conditionals rows sum to 1:    {float((cond.sum(1) - 1).abs().max()):.2e}")

    rows = [
        ("sameloss posteriors (batched)", n / t_post),
        ("sameloss conditionals, all positions", n / t_cond),
        *[(f"hmmlearn predict_proba ({name}, lengths=)", n / v) for name, v in hl_times.items()],
        (f"hmmlearn predict_proba ({impl}, per sentence)", m / t_each),
        (f"numpy per-sentence loop ({m} sentences)", m / t_ref),
    ]
    print("throughput (sentences/s, best of %d):" % args.repeats)
    for name, r in rows:
        print(f"  {name:<46s} {r:>12,.0f}")
    t_hl = hl_times[impl]
    print(f"speed-up over hmmlearn ({impl}, its faster): posteriors {t_hl / t_post:.1f}x, "
          f"conditionals {t_hl / t_cond:.1f}x")


if __name__ == "__main__":
    main()
