"""Training throughput of our TransformerMLM against Hugging Face's BertForMaskedLM.

    python bench/bench_transformer_vs_hf.py                 # tiny and t3-128, ~1 minute on 2 cores
    python bench/bench_transformer_vs_hf.py --sizes t3-256 --steps 5

Both models have the same shape and start from the same weights (ours copied into BERT by
``sameloss.hf.bert``, which uses BERT's default SDPA attention); both run the same
random batches (right-padded sentences of random length, 15% of tokens masked) in
training mode (dropout 0.1) with the same loss and the same AdamW. One step is forward +
backward + optimiser step. Throughput counts every position of the padded batch
(``batch × length`` tokens per step). The two models alternate step by step so that a busy
machine slows both alike; the table reports tokens / median step time.

Needs ``transformers`` (``pip install transformers``). Not part of the test suite.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from sameloss.models import build_model
from sameloss.hf.bert import to_hf_bert

N_WORDS = 200
VOCAB = N_WORDS + 3
PAD, MASK = N_WORDS, N_WORDS + 1


def make_batches(n_batches: int, batch: int, length: int, min_len: int, seed: int):
    """(inputs, targets, masked) triples of random padded sentences."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n_batches):
        tokens = torch.randint(0, N_WORDS, (batch, length), generator=g)
        lengths = torch.randint(min_len, length + 1, (batch,), generator=g)
        lengths[0] = length
        real = torch.arange(length)[None, :] < lengths[:, None]
        tokens[~real] = PAD
        masked = (torch.rand(batch, length, generator=g) < 0.15) & real
        masked[:, 0] |= ~masked.any(dim=1)
        inputs = tokens.masked_fill(masked, MASK)
        out.append((inputs, tokens, masked))
    return out


def step_fn(model, hf: bool):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.98), weight_decay=0.01)

    def step(inputs, targets, masked):
        if hf:
            logits = model(input_ids=inputs, attention_mask=(inputs != PAD).long()).logits
        else:
            logits = model(inputs)
        loss = F.cross_entropy(logits[masked], targets[masked])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss.item()

    return step


def bench(size: str, batch: int, length: int, steps: int, rounds: int, min_len: int) -> dict:
    torch.manual_seed(0)
    ours = build_model("transformer", size, VOCAB, length + 1)
    theirs = to_hf_bert(ours)
    ours.train()
    theirs.train()
    batches = make_batches(steps, batch, length, min_len, seed=1)
    run = {"ours": step_fn(ours, hf=False), "hf": step_fn(theirs, hf=True)}
    for name in run:  # warm-up: allocator, kernels, optimiser state
        for b in batches[:2]:
            run[name](*b)
    seconds: dict[str, list[float]] = {"ours": [], "hf": []}
    for _ in range(rounds):
        for b in batches:
            for name in run:  # alternate step by step: background load hits both alike
                start = time.perf_counter()
                run[name](*b)
                seconds[name].append(time.perf_counter() - start)
    tokens = batch * length
    med = {k: tokens / statistics.median(v) for k, v in seconds.items()}
    return {
        "size": size,
        "params": ours.num_parameters(),
        "ours": med["ours"],
        "hf": med["hf"],
        "ratio": med["ours"] / med["hf"],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", nargs="+", default=["tiny", "t3-128"])
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--length", type=int, default=32)
    p.add_argument("--min-len", type=int, default=2, help="shortest sentence (1..length); length = no padding")
    p.add_argument("--steps", type=int, default=10, help="steps per round")
    p.add_argument("--rounds", type=int, default=3, help="passes over the steps")
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, batch {args.batch} × "
        f"length {args.length} (sentences {args.min_len}..{args.length} tokens), "
        f"{args.steps} steps × {args.rounds} rounds; tokens/s = padded positions per second"
    )
    print(f"{'size':>8} {'params':>10} {'ours tok/s':>12} {'HF tok/s':>12} {'ours/HF':>8}")
    for size in args.sizes:
        r = bench(size, args.batch, args.length, args.steps, args.rounds, args.min_len)
        print(f"{r['size']:>8} {r['params']:>10,d} {r['ours']:>12,.0f} {r['hf']:>12,.0f} {r['ratio']:>8.2f}")


if __name__ == "__main__":
    main()
