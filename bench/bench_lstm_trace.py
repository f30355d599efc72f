"""Benchmark: the paper's trace estimator on LSTM MLMs, vectorised (the LSTM unrolled,
``torch.func``) against the plain autograd loop over contexts on the packed kernel (the
path LSTMs took before ``LSTMMLM.unrolled``).

For each shape, ``trace_fisher`` on ``--contexts`` contexts × ``--labels`` labels of the
micro HMM with a freshly initialised model; both paths compute the same values (the same label
draws: the two estimates printed agree to float rounding), the ratio of their times is the speed-up. One torch thread.

    python bench/bench_lstm_trace.py [--contexts 128] [--labels 4]
"""

from __future__ import annotations

import argparse
import time

import torch

from sameloss.languages import make_language
from sameloss.measures.curvature import FisherContexts, sample_contexts, select_parameters, trace_fisher
from sameloss.measures.curvature.base import STREAM_DRAWS
from sameloss.measures.curvature.fisher import _draw_labels, _fisher_values_autograd
from sameloss.models import LSTMConfig, LSTMMLM
from sameloss.training.data import step_generator

SHAPES = [(16, 16, 1), (32, 32, 2), (64, 64, 2)]  # d_model, d_hidden, layers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", type=int, default=128)
    parser.add_argument("--labels", type=int, default=4)
    args = parser.parse_args()
    torch.set_num_threads(1)
    language = make_language("hmm", "micro")
    for d_model, d_hidden, layers in SHAPES:
        torch.manual_seed(0)
        model = LSTMMLM(LSTMConfig(vocab_size=language.vocab_size, max_len=language.max_len, d_model=d_model,
                                   d_hidden=d_hidden, n_layers=layers, pad_id=language.pad_id))
        model.eval()
        ctx = sample_contexts(language, args.contexts, seed=0)
        trace_fisher(model, language, FisherContexts(batch=ctx.rows(0, 2)), n_labels=args.labels)  # warm-up
        start = time.perf_counter()
        fast = trace_fisher(model, language, FisherContexts(batch=ctx, seed=0), n_labels=args.labels)
        t_fast = time.perf_counter() - start
        # the old path: packed kernel, one backward per context and label
        gen = step_generator(0, 0, stream=STREAM_DRAWS)  # the same label draws as trace_fisher's
        with torch.no_grad():
            probs = torch.softmax(model(ctx.inputs)[ctx.masked].double(), -1)
        labels, weights = _draw_labels(probs, args.labels, gen)
        start = time.perf_counter()
        values = _fisher_values_autograd(model, select_parameters(model), ctx.inputs,
                                         ctx.masked.long().argmax(1), labels, weights)
        t_slow = time.perf_counter() - start
        n = sum(p.numel() for p in model.parameters())
        print(f"h{d_hidden}-l{layers} ({n} params): vectorised {t_fast:.2f} s, autograd loop {t_slow:.2f} s, "
              f"speed-up {t_slow / t_fast:.1f}x (estimates {fast.estimate:.6g} and {float(values.mean()):.6g})")


if __name__ == "__main__":
    main()
