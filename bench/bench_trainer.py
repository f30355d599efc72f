"""The trainer's step in two code trees, timed in the same run: the no-regression check of issue 61
(one trainer: ``pretrain`` the ensemble of one, one step, two back-ends, torch's optimisers).

    python bench/bench_trainer.py --baseline /path/to/main/src

Each tree (``--baseline``'s ``src``, and this checkout's) runs in a worker process of its own
(``--worker``, with that tree first on ``PYTHONPATH``), which builds every path once and then
times ``--steps`` steps of one path when asked, in its own CPU time (one thread: the work
itself, not the other processes of a shared machine). Rounds interleave the trees and the
paths (each round: every path, the two trees in alternating order), so what comes and goes
on the machine falls on both; the table gives per path the median per-member step time of each
tree and the median of the paired ratios (this tree / the baseline: < 1 is faster).

Paths (the tiny transformer on the micro HMM, batch 256, AdamW, the isoloss tiny design's
shape; ``--smoke``: the micro transformer, batch 8):

* ``one`` — a run alone, dropout 0.1 from the global RNG (every recipe's runs);
* ``one, SAM`` — a run alone with SAM (ρ 0.05, no dropout: the isoloss fork's);
* ``one, SGD clip`` — SGD with momentum and gradient clipping;
* ``loop S`` — an ensemble of S members (seeds 0..S−1), member by member (the CPU's default);
* ``vmap S`` — the same members at once under ``vmap`` (keyed dropout 0.1).

A tree's trainer is recognised by its modules: ``training.step`` (this one's) or
``training.ensemble_step`` (the trainer before issue 61: ``loop._step``, ``step_members``).
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


def _configs(a) -> dict[str, list[list[str]]]:
    """Each path's members, as config overrides."""
    def cfg(seed, *extra):
        return [f"name=m{seed}", f"seed={seed}", f"model.size={a['size']}", "language.name=hmm",
                "language.size=micro", f"batch_size={a['batch']}", "device=cpu", "eval.every=0",
                "eval.n_sentences=16", "steps=100000", "log_every=100000", "save_every=100000", *extra]

    paths = {"one": [cfg(0, "model.dropout=0.1")],
             "one, SAM": [cfg(0, "model.dropout=0", "sam.rho=0.05")],
             "one, SGD clip": [cfg(0, "model.dropout=0", "optim.name=sgd", "optim.momentum=0.9", "optim.lr=0.05",
                                   "optim.grad_clip=1.0")]}
    for s in a["sizes"]:
        paths[f"loop {s}"] = [cfg(i, "model.dropout=0.1") for i in range(s)]
        paths[f"vmap {s}"] = [cfg(i, "model.dropout=0.1", "dropout_draws=keyed") for i in range(s)]
    return paths


def _build(name: str, overrides: list[list[str]], root: Path):
    """``step(k)``: one step of path ``name`` in this process's tree."""
    import importlib.util

    from sameloss import config as configlib
    from sameloss.training import PretrainConfig

    cfgs = [configlib.load(PretrainConfig, None, o) for o in overrides]
    strategy = "vmap" if name.startswith("vmap") else "loop"
    if importlib.util.find_spec("sameloss.training.step") is not None:  # this tree: the one trainer
        from sameloss.training import member, runfolder, runio
        from sameloss.training.step import make
        from sameloss.training.step import train_step

        shared = member.Shared(runio.build_language(cfgs[0]), runio.resolve_device("cpu"))
        plan = runfolder.Plan("train", "trained", "")
        stack = make([member.build(i, c, root / c.name, plan, shared) for i, c in enumerate(cfgs)], strategy)
        return lambda k: train_step(stack, k)
    from sameloss.training import ensemble, loop  # the trainer before issue 61
    from sameloss.training.ensemble_step import step_members

    dirs = [root / c.name for c in cfgs]
    results: list = [None] * len(cfgs)
    plans = [ensemble.runfolder.plan(d, c, "new") for d, c in zip(dirs, cfgs)]
    found = ensemble._members(cfgs, dirs, plans, results, "none")
    lp = ensemble._Loop(found, results, False, None, strategy)
    lp._restack(found, 1)
    if name.startswith("one"):
        run = lp.active[0].run
        return lambda k: loop._step(run, k)
    return lambda k: step_members(lp.st, lp.template, lp.active, k, False, lp.strategy)


def worker() -> None:
    """Build the paths asked on stdin's first line, then time steps of one path per line."""
    import torch

    torch.set_num_threads(1)
    a = json.loads(sys.stdin.readline())
    with tempfile.TemporaryDirectory() as tmp:
        steps = {name: _build(name, cfgs, Path(tmp) / f"p{i}") for i, (name, cfgs) in enumerate(_configs(a).items())
                 if name in a.get("paths", [name])}
        counter = {name: 1 for name in steps}
        for name, step in steps.items():  # warm-up, not timed (the first vmap of a shape traces)
            for _ in range(2):
                step(counter[name])
                counter[name] += 1
        print(json.dumps({"ready": True}), flush=True)
        for line in sys.stdin:
            ask = json.loads(line)
            name, start = ask["path"], time.process_time()
            for _ in range(ask["steps"]):
                steps[name](counter[name])
                counter[name] += 1
            print(json.dumps({"seconds": (time.process_time() - start) / ask["steps"]}), flush=True)


class Tree:
    """A worker process on one code tree."""

    def __init__(self, src: str, a: dict):
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([src, os.environ.get("PYTHONPATH", "")]),
                   OMP_NUM_THREADS="1")
        self.proc = subprocess.Popen([sys.executable, __file__, "--worker"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, env=env, text=True)
        self.ask(a)

    def ask(self, message: dict) -> dict:
        self.proc.stdin.write(json.dumps(message) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit("a worker stopped (its error is above)")
        return json.loads(line)

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", help="the src folder of the tree to compare with (e.g. a checkout of main)")
    ap.add_argument("--sizes", default="4,16")
    ap.add_argument("--steps", type=int, default=3, help="steps per timing")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--size", default="tiny")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--paths", help="comma-separated paths to time (default: every one)")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--json")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        worker()
        return 0
    if not a.baseline:
        ap.error("--baseline SRC is required (the tree to compare with)")
    if a.smoke:
        a.sizes, a.steps, a.rounds, a.size, a.batch = "2", 1, 1, "micro", 8
    spec = {"size": a.size, "batch": a.batch, "sizes": [int(s) for s in a.sizes.split(",")]}
    here = str(Path(__file__).resolve().parents[1] / "src")
    load = os.getloadavg()
    print(f"baseline {a.baseline}, this tree {here}; {a.size} batch {a.batch}, {a.rounds} rounds × {a.steps} steps, "
          f"one thread per tree; load {load[0]:.2f}", flush=True)
    trees = {"baseline": Tree(a.baseline, spec), "this": Tree(here, spec)}
    wanted = a.paths.split(",") if a.paths else list(_configs(spec))
    spec["paths"] = wanted
    times: dict[str, dict[str, list[float]]] = {p: {"baseline": [], "this": []} for p in wanted}
    for r in range(a.rounds):
        for name in times:
            order = ("baseline", "this") if r % 2 == 0 else ("this", "baseline")
            for tree in order:
                times[name][tree].append(trees[tree].ask({"path": name, "steps": a.steps})["seconds"])
        print(f"round {r + 1} done", flush=True)
    for t in trees.values():
        t.close()
    rows = []
    print("| path | baseline ms per member-step | this tree | this / baseline (median of paired ratios) |\n"
          "|---|---|---|---|")
    for name, per in times.items():
        members = 1 if name.startswith("one") else int(name.split()[1])
        old, new = (statistics.median(per[t]) / members for t in ("baseline", "this"))
        ratio = statistics.median(n / o for n, o in zip(per["this"], per["baseline"]))
        rows.append({"path": name, "baseline_s": old, "this_s": new, "ratio": ratio})
        print(f"| {name} | {old * 1e3:.1f} | {new * 1e3:.1f} | {ratio:.3f} |")
    after = os.getloadavg()
    print(f"load average after: {after[0]:.2f}; uptime: "
          + subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(), flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps({"load_before": load, "load_after": after, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
