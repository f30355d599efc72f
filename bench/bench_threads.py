"""Training steps/s by torch thread count, alone and beside busy processes (issue 10, item 8).

    python bench/bench_threads.py                     # ~2 minutes on a 2-core CPU
    python bench/bench_threads.py --steps 100 --competitors 1 2 --max-seconds 8

Trains the tiny transformer on the micro PCFG exactly as ``sameloss pretrain`` does
(``reproduce --scale tiny``'s reference run: batch 256, AdamW, a fresh batch sampled
every step; no evaluation, logging or checkpoints), under three thread settings:

- ``policy``: what ``sameloss.threads.configure_threads(None)`` picks (``$OMP_NUM_THREADS``
  if set, else the default),
- ``torch``: torch's own default (one thread per core, read before anything changes it),
- ``1``: one thread,

each with 0, 1 and 2 competing processes (pure-Python busy loops, niced by ``--nice``, the
way another user's background job would run). Per load, the three settings alternate for
``--rounds`` rounds so that drift in the machine's load hits them alike; each round of a
setting runs one warm-up step, then ``--steps / --rounds`` steps or stops after
``--max-seconds / --rounds`` (a collapsed setting would otherwise take minutes). A
setting's steps/s is the median over its rounds. Ratios are printed from this one run.
"0 busy" means none of ours: on a shared machine, report ``uptime`` with the numbers.
Not part of the test suite.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

import torch

TORCH_DEFAULT = torch.get_num_threads()  # before anything below changes it

from sameloss import config as configlib  # noqa: E402
from sameloss.threads import configure_threads  # noqa: E402
from sameloss.training import PretrainConfig  # noqa: E402
from sameloss.training.data import global_batch  # noqa: E402
from sameloss.training.objectives.mlm import mlm_loss  # noqa: E402
from sameloss.training.optim import build_optimizer  # noqa: E402
from sameloss.training.runio import build_language, init_model  # noqa: E402

BUSY = "while True: pass"


def trainer(size: str, language: str, batch: int):
    cfg = configlib.load(PretrainConfig, None, [
        f"language.name={language}", "language.size=micro", f"model.size={size}", f"batch_size={batch}",
        "device=cpu", "optim.warmup_steps=200"])
    lang = build_language(cfg)
    torch.manual_seed(cfg.seed)
    model = init_model(cfg, lang)
    optimizer, schedule = build_optimizer(cfg, model)
    model.train()
    rate = None if cfg.masking == "single" else cfg.mask_rate
    counter = [0]

    def step():
        counter[0] += 1
        full = global_batch(lang, cfg.seed, counter[0], cfg.batch_size, rate)
        optimizer.zero_grad(set_to_none=True)
        loss, _ = mlm_loss(model, full, full.n_targets, 1)
        loss.backward()
        optimizer.step()
        schedule.step()

    return step


def steps_per_s(step, threads: int, steps: int, max_seconds: float) -> tuple[float, int]:
    torch.set_num_threads(threads)
    step()  # warm-up after a change of thread count
    done, start = 0, time.perf_counter()
    while done < steps:
        step()
        done += 1
        if time.perf_counter() - start > max_seconds:
            break
    return done / (time.perf_counter() - start), done


def start_competitors(n: int, nice: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", BUSY], preexec_fn=lambda: os.nice(nice)) for _ in range(n)]


def stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        p.terminate()
    for p in procs:
        p.wait()


def load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=150,
                    help="timed steps per setting and load, split over the rounds (default 150)")
    ap.add_argument("--max-seconds", type=float, default=6.0,
                    help="cap per setting and load, split over the rounds (default 6)")
    ap.add_argument("--rounds", type=int, default=3, help="alternations of the settings per load (default 3)")
    ap.add_argument("--competitors", type=int, nargs="+", default=[0, 1, 2],
                    help="numbers of busy processes to run beside training (default 0 1 2)")
    ap.add_argument("--nice", type=int, default=10, help="niceness of the busy processes (default 10)")
    ap.add_argument("--size", default="tiny", help="model size (default tiny)")
    ap.add_argument("--language", default="pcfg", help="micro language (default pcfg)")
    ap.add_argument("--batch", type=int, default=256, help="batch size (default 256, the tiny scale's)")
    args = ap.parse_args()

    policy = configure_threads(None)
    settings = {"policy": policy, "torch": TORCH_DEFAULT, "1": 1}
    print(f"torch {torch.__version__}, {os.cpu_count()} CPU cores, OMP_NUM_THREADS="
          f"{os.environ.get('OMP_NUM_THREADS', '(unset)')}; threads: policy {policy}, torch default "
          f"{TORCH_DEFAULT}; {args.size} transformer, micro {args.language}, batch {args.batch}; {load()}")
    step = trainer(args.size, args.language, args.batch)
    results: dict[tuple[str, int], float] = {}
    for n in args.competitors:
        procs = start_competitors(n, args.nice)
        try:
            time.sleep(0.5 if n else 0)
            rates: dict[str, list[float]] = {name: [] for name in settings}
            counts = dict.fromkeys(settings, 0)
            for _ in range(args.rounds):  # settings alternate: the machine's drift hits them alike
                for name, threads in settings.items():
                    rate, done = steps_per_s(step, threads, args.steps // args.rounds,
                                             args.max_seconds / args.rounds)
                    rates[name].append(rate)
                    counts[name] += done
            for name, threads in settings.items():
                results[name, n] = statistics.median(rates[name])
                print(f"  {n} busy (nice {args.nice})  {name:>6} ({threads} thr)  {results[name, n]:8.2f} steps/s  "
                      f"(median of {args.rounds} rounds: {' '.join(f'{r:.1f}' for r in rates[name])}; "
                      f"{counts[name]} steps)", flush=True)
            print(f"  {load()}")
        finally:
            stop(procs)

    print("\nsteps/s             " + "".join(f"{n} busy".rjust(11) for n in args.competitors))
    for name, threads in settings.items():
        print(f"{name:>6} ({threads} thr)    " + "".join(f"{results[name, n]:11.2f}" for n in args.competitors))
    print("\nratios (same run)")
    for n in args.competitors:
        print(f"  {n} busy: policy / torch default = {results['policy', n] / results['torch', n]:.2f}, "
              f"1 thread / torch default = {results['1', n] / results['torch', n]:.2f}")
    for name in settings:
        if 0 in args.competitors:
            drops = ", ".join(f"{n} busy {results[name, 0] / results[name, n]:.1f}x"
                              for n in args.competitors if n)
            print(f"  slowdown of {name:>6} against itself alone: {drops}")


if __name__ == "__main__":
    main()
