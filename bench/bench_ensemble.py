"""Per-member step time of an ensemble (``training.ensemble``) against S, beside one model
(issue 47): the no-regression check on the CPU and the GPU's ensemble MFU (issue 51).

The model and batch are the isoloss tiny preset's (the ``tiny`` transformer on the micro HMM,
batch 256, AdamW). One model (a stack of one member, as ``pretrain`` trains it) and an
ensemble of S members (seeds 0..S−1) step with the one step, ``step.train_step``. Both draw
their batches on the host inside the step, as training does. On the CPU the time is this process's
CPU time (one thread: the work itself, not the other processes of a shared machine); on a GPU
the synchronised wall time. Rounds interleave the two paths (one model's k steps, then the
ensemble's k steps, for every S), so what comes and goes falls on both; the table gives per S
the median over rounds of the per-member step time and of its ratio to one model's (< 1: the
ensemble is cheaper per member).

``--strategy``: the ensemble's ``vmap`` (one batched pass) or ``loop`` (member by member,
the update stacked); default the device's. ``--dropout 0.1``: under ``vmap`` both paths draw
keyed masks (``dropout_draws = keyed``, what a batched pass needs), and the one-model row with
the global RNG's dropout (what every recipe's runs use now) is timed beside them; under
``loop`` both draw from the global RNG. On CUDA the device is synchronised around each timing,
and the table adds the ensemble's TFLOP/s by the planner's FLOP count (3 × the forward pass
per token of a full-length sentence) and its MFU against ``hardware.DEVICES``' bf16 peak, and
seeds per minute (the planner's training steps of one isoloss tiny seed, every fork: training
only, no measures). Measure time against S is not here: batching the measures is another
issue's (``measures/``).

``--smoke``: the micro transformer, batch 8, S = 1, 2 (tests and the GPU script's dry run).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from sameloss import config as configlib
from sameloss.training import PretrainConfig, ensemble, member, runfolder, runio
from sameloss.training.step import Stack, make, train_step


def config(size: str, batch: int, seed: int, dropout: float, draws: str, device: str) -> PretrainConfig:
    return configlib.load(PretrainConfig, None, [
        f"name=m{seed}", f"seed={seed}", f"model.size={size}", "language.name=hmm", "language.size=micro",
        f"batch_size={batch}", f"device={device}", "eval.every=0", "eval.n_sentences=16", "steps=100000",
        "log_every=100000", "save_every=100000", f"model.dropout={dropout}", f"dropout_draws={draws}"])


def members(cfgs: list[PretrainConfig], root: Path, strategy: str = "loop") -> Stack:
    """A stack of the members of ``cfgs``, built as a training call builds them (run folders under ``root``)."""
    shared = member.Shared(runio.build_language(cfgs[0]), runio.resolve_device(cfgs[0].device))
    plan = runfolder.Plan("train", "trained", "")
    return make([member.build(i, c, root / c.name, plan, shared) for i, c in enumerate(cfgs)], strategy)


def timed(fn, k: int, device: str) -> float:
    """Seconds per call of ``fn``: wall time on a GPU (synchronised), this process's CPU time
    on the CPU (with one thread, the work itself: on a shared machine the wall clock also
    counts the other processes)."""
    cuda = device.startswith("cuda")
    clock = time.perf_counter if cuda else time.process_time
    if cuda:
        torch.cuda.synchronize()
    start = clock()
    for _ in range(k):
        fn()
    if cuda:
        torch.cuda.synchronize()
    return (clock() - start) / k


class Paths:
    """One model and ensembles of each size, built once, stepped on demand."""

    def __init__(self, a, root: Path):
        draws = "keyed" if a.dropout > 0 and a.strategy == "vmap" else "global"
        self.device, self.step = a.device, 1
        self.one = members([config(a.size, a.batch, 0, a.dropout, draws, a.device)], root / "one")
        self.glob = None
        if a.dropout > 0:  # the recipes' runs now: global-RNG dropout, one model
            self.glob = members([config(a.size, a.batch, 0, a.dropout, "global", a.device)], root / "glob")
        self.ens = {s: members([config(a.size, a.batch, i, a.dropout, draws, a.device) for i in range(s)],
                               root / f"s{s}", a.strategy) for s in a.sizes}

    def one_step(self, one: Stack) -> None:
        self.step += 1
        train_step(one, self.step)

    def ens_step(self, s: int) -> None:
        self.step += 1
        train_step(self.ens[s], self.step)


def _draw_seconds(one: Stack, n: int = 20) -> float:
    """CPU seconds to draw one member's batch of a step."""
    from sameloss.training.data import global_batch

    m = one.members[0]
    cfg = m.cfg
    start = time.process_time()
    for step in range(n):
        global_batch(m.language, cfg.seed, step + 1, cfg.batch_size, m.rate, cfg.mask_replace)
    return (time.process_time() - start) / n


def flops_per_member_step(cfg: PretrainConfig) -> float:
    from sameloss.experiments.engine import plan

    m = plan.model_shape(cfg, {})
    return 3 * plan.forward_flops_per_token(m) * m.max_len * cfg.batch_size


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--sizes", default="1,4,16,64")
    ap.add_argument("--steps", type=int, default=2, help="steps per timing")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--size", default="tiny")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--dropout", type=float, default=0.0,
                    help="> 0: dropout on both paths (keyed under vmap, the global RNG's under loop)")
    ap.add_argument("--strategy", choices=ensemble.STRATEGIES, default=None,
                    help="the ensemble's (default: the device's, ensemble.default_strategy)")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    if a.smoke:
        a.sizes, a.steps, a.rounds, a.size, a.batch = "1,2", 1, 1, "micro", 8
    a.sizes = [int(s) for s in a.sizes.split(",")]
    a.strategy = a.strategy or ensemble.default_strategy(a.device)
    load = os.getloadavg()
    print(f"device {a.device}, torch {torch.__version__}, {torch.get_num_threads()} threads, load {load[0]:.2f}; "
          f"{a.size} batch {a.batch}, dropout {a.dropout}, strategy {a.strategy}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        paths = Paths(a, Path(tmp))
        for s in a.sizes:  # warm-up: the first vmap of a shape traces
            paths.ens_step(s)
        paths.one_step(paths.one)
        one, glob, per = [], [], {s: [] for s in a.sizes}
        for r in range(a.rounds):
            for s in a.sizes:
                t1 = timed(lambda: paths.one_step(paths.one), a.steps, a.device)
                ts = timed(lambda: paths.ens_step(s), a.steps, a.device) / s
                one.append(t1)
                per[s].append((ts, ts / t1))
            if paths.glob is not None:
                glob.append(timed(lambda: paths.one_step(paths.glob), a.steps, a.device))
            print(f"round {r + 1}: one {one[-1] * 1e3:.1f} ms; " + ", ".join(
                f"S={s} {per[s][-1][0] * 1e3:.1f} ms ({per[s][-1][1]:.2f}×)" for s in a.sizes), flush=True)
        flops = flops_per_member_step(paths.one.members[0].cfg)
        draw = _draw_seconds(paths.one)
    rows = _rows(a, one, glob, per, flops)
    _table(a, rows, os.getloadavg())
    print(f"host: drawing one member's batch (data.global_batch) takes {draw * 1e3:.2f} ms of CPU — inside every "
          "step above; a GPU ensemble's loop draws them ahead in worker processes (training/ensemble_data.py)",
          flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps({"device": a.device, "strategy": a.strategy, "load_before": load,
                                            "rows": rows, "draw_seconds": draw}, indent=1))
    return 0


def _rows(a, one, glob, per, flops) -> list[dict]:
    from sameloss.experiments.engine import hardware

    peak = None
    if a.device.startswith("cuda"):
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from gpu_throughput import card

        key = card(a.device)[1]
        peak = hardware.DEVICES[key]["bf16"] if key else None
    per_seed = _steps_per_seed() if not a.smoke else None
    base = statistics.median(one)  # every round's and size's one-model timing
    rows = [{"S": "one", "per_member_s": base, "ratio": 1.0, "ratio_of_medians": 1.0}]
    if glob:
        rows.append({"S": "one, global-RNG dropout", "per_member_s": statistics.median(glob),
                     "ratio": statistics.median(glob) / base, "ratio_of_medians": statistics.median(glob) / base})
    for s, values in per.items():
        t = statistics.median(v[0] for v in values)
        rows.append({"S": s, "per_member_s": t, "ratio": statistics.median(v[1] for v in values),
                     "ratio_of_medians": t / base})
    for r in rows:
        r["tflops"] = flops / r["per_member_s"] / 1e12
        r["mfu"] = r["tflops"] * 1e12 / peak if peak else None
        r["seeds_per_min"] = 60 / (r["per_member_s"] * per_seed) if per_seed else None
    return rows


def _steps_per_seed() -> float | None:
    try:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from gpu_workers import steps_per_seed

        return steps_per_seed()
    except Exception:  # noqa: BLE001 (a figure beside the table, not the table)
        return None


def _table(a, rows, load_after) -> None:
    print("| S | per-member step | vs one model (median of paired ratios) | vs one model (ratio of medians) | "
          "TFLOP/s | MFU | seeds/min (training) |\n|---|---|---|---|---|---|---|")
    for r in rows:
        mfu = f"{100 * r['mfu']:.1f} %" if r["mfu"] is not None else "–"
        spm = f"{r['seeds_per_min']:.2f}" if r["seeds_per_min"] else "–"
        print(f"| {r['S']} | {r['per_member_s'] * 1e3:.1f} ms | {r['ratio']:.3f}× | {r['ratio_of_medians']:.3f}× | "
              f"{r['tflops']:.4f} | {mfu} | {spm} |")
    print(f"load average after: {load_after[0]:.2f}; uptime: "
          + subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(), flush=True)


if __name__ == "__main__":
    sys.exit(main())
