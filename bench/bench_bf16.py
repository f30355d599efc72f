"""Benchmark: bf16 (autocast) against fp32 training, the step time and the exact KL reached.

1. Step time. One training step of the tiny transformer (``model.size=tiny``, the
   default language: the tiny PCFG) — forward, backward, AdamW — timed in fp32 and under
   ``precision=bf16`` (``torch.autocast`` to bfloat16 on this device) at each ``--batch``.
   The batches are drawn first (data generation is not timed); fp32 and bf16 steps
   alternate, ``--reps`` of each after ``--warmup``, and the medians are compared: the
   ratio fp32 / bf16 is the speed-up. (Issue 26 measured 1.3× at batch 256 and 1.5× at
   4096 on this CPU.)
2. KL. ``sameloss pretrain`` runs of ``--kl-steps`` steps on ``--kl-language`` in fp32
   and bf16 for each of ``--seeds`` seeds: the exact held-out KL of each, and the
   bf16 − fp32 difference per seed against the spread over seeds.

    python bench/bench_bf16.py [--batch 256 4096] [--reps 20] [--seeds 3] [--kl-steps 600] [--device cpu]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from sameloss import config as configlib
from sameloss.training import PretrainConfig, pretrain, runio
from sameloss.training.data import global_batch
from sameloss.training.objectives.mlm import mlm_loss
from sameloss.training.optim import build_optimizer


def step_times(batch_size: int, reps: int, warmup: int, device: torch.device) -> dict[str, list[float]]:
    cfg = configlib.load(PretrainConfig, None, [f"batch_size={batch_size}", "model.size=tiny", "device=cpu"])
    language = runio.build_language(cfg)
    torch.manual_seed(0)
    models = {p: runio.init_model(cfg, language, device) for p in ("fp32", "bf16")}
    optims = {p: build_optimizer(cfg, m)[0] for p, m in models.items()}
    batches = [global_batch(language, 0, s, batch_size, cfg.mask_rate).to(device) for s in range(warmup + reps)]
    times: dict[str, list[float]] = {"fp32": [], "bf16": []}
    for i, batch in enumerate(batches):
        for precision in ("fp32", "bf16"):
            model, opt = models[precision], optims[precision]
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            with runio.autocast(precision, device):
                loss, _ = mlm_loss(model, batch, batch.n_targets, 1)
            loss.backward()
            opt.step()
            if device.type == "cuda":
                torch.cuda.synchronize()
            if i >= warmup:
                times[precision].append(time.perf_counter() - start)
    return times


def kl_runs(seeds: int, steps: int, language: str, size: str, out: Path) -> dict[str, list[float]]:
    kls: dict[str, list[float]] = {"fp32": [], "bf16": []}
    for seed in range(seeds):
        for precision in ("fp32", "bf16"):
            cfg = configlib.load(PretrainConfig, None, [
                f"name={precision}-{seed}", f"seed={seed}", f"steps={steps}", "model.size=tiny",
                f"language.name={language}", f"language.size={size}", "eval.every=0", "eval.n_sentences=2000",
                "save_every=100000", "log_every=100", f"optim.warmup_steps={steps // 10}",
                f"optim.decay_steps={steps // 5}", "device=cpu", f"precision={precision}"])
            start = time.perf_counter()
            kls[precision].append(pretrain(cfg, out / cfg.name, progress=False)["kl"])
            print(f"  seed {seed} {precision}: KL {kls[precision][-1]:.5f} ({time.perf_counter() - start:.0f} s)",
                  flush=True)
    return kls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[256, 4096])
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--kl-steps", type=int, default=600)
    parser.add_argument("--kl-language", default="hmm")
    parser.add_argument("--kl-size", default="micro")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = runio.resolve_device(args.device)
    print(f"device {device}, {torch.get_num_threads()} thread(s), torch {torch.__version__}")
    print("\nstep time of the tiny transformer (forward + backward + AdamW), median of "
          f"{args.reps} alternating steps")
    print(f"{'batch':>6} {'fp32 ms':>9} {'bf16 ms':>9} {'fp32/bf16':>10}")
    for b in args.batch:
        t = step_times(b, args.reps, args.warmup, device)
        fp32, bf16 = statistics.median(t["fp32"]), statistics.median(t["bf16"])
        print(f"{b:>6} {1e3 * fp32:>9.1f} {1e3 * bf16:>9.1f} {fp32 / bf16:>9.2f}x", flush=True)
    if args.seeds:
        print(f"\nexact held-out KL after {args.kl_steps} steps (tiny transformer, {args.kl_language} "
              f"{args.kl_size}, batch 256)")
        with tempfile.TemporaryDirectory() as tmp:
            kls = kl_runs(args.seeds, args.kl_steps, args.kl_language, args.kl_size, Path(tmp))
        print(f"{'seed':>5} {'fp32 KL':>10} {'bf16 KL':>10} {'bf16-fp32':>10}")
        for s in range(args.seeds):
            print(f"{s:>5} {kls['fp32'][s]:>10.5f} {kls['bf16'][s]:>10.5f} {kls['bf16'][s] - kls['fp32'][s]:>+10.5f}")
        for p in ("fp32", "bf16"):
            values = kls[p]
            spread = max(values) - min(values)
            sd = statistics.stdev(values) if len(values) > 1 else float("nan")
            print(f"{p}: mean {statistics.mean(values):.5f}, sd over seeds {sd:.5f}, range {spread:.5f}")
        diffs = [b - a for a, b in zip(kls["fp32"], kls["bf16"])]
        if len(diffs) > 1:
            print(f"paired bf16 - fp32: mean {statistics.mean(diffs):+.5f}, sd {statistics.stdev(diffs):.5f}")


if __name__ == "__main__":
    main()
