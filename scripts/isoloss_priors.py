"""The prior paired SDs the isoloss designs plan from, and the forks that must read their line
outside their range, measured by the pilot (``sameloss reproduce isoloss --scale pilot``):

    python scripts/isoloss_priors.py runs/isoloss-pilot        # prints the literals design.py pins

The pilot measures every fork at 5 checkpoints of its stretch. Per fork: the share of its pairs
(over every comparison it is in) whose target lies outside its measured KL range, and how far —
a fork that extrapolates in more than ``--share`` of its pairs gets 5 checkpoints in the designs
(``CHECKPOINTS``), the others 3. Then each test's effective SD of the primary accuracy (the
weighted estimate's standard error × √n, ``stats.paired.differences``) with every fork read at
the checkpoints the designs give it (3 of the pilot's 5: the first, middle and last), so the
prior is the spread the design's own estimate will have.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import math
from pathlib import Path

from sameloss.experiments.recipes import isoloss
from sameloss.experiments.recipes.isoloss.design import ENDPOINTS
from sameloss.experiments.stats import paired


def rows_of(folder: Path) -> list[dict]:
    with (folder / "results.csv").open(newline="") as f:
        rows = [r for r in csv.DictReader(f) if r.get("fork_step")]
    for r in rows:
        r["seed"] = int(r["seed"])
    return rows


def thinned(rows: list[dict], keep: dict[str, int]) -> list[dict]:
    """Each fork's checkpoints cut to ``keep[fork]`` (3: the first, middle and last of 5)."""
    out = []
    by: dict[tuple, list[dict]] = {}
    for r in rows:
        by.setdefault((r["seed"], r["point"], r["fork"]), []).append(r)
    for (_, _, fork), mine in by.items():
        mine = sorted(mine, key=lambda r: int(r["step"]))
        if keep.get(fork, 3) >= len(mine):
            out += mine
        else:
            picks = sorted({round(i * (len(mine) - 1) / (keep.get(fork, 3) - 1)) for i in range(keep.get(fork, 3))})
            out += [mine[i] for i in picks]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--share", type=float, default=0.25, help="a fork extrapolating in more than this share of its "
                                                              "pairs gets 5 checkpoints (default 0.25)")
    args = ap.parse_args()
    p = isoloss.PRESETS["pilot"]
    rows = rows_of(args.folder)
    seeds = sorted({r["seed"] for r in rows})
    design = dataclasses.replace(p.design(), limit=math.inf)
    tests = p.tests()
    pairs = paired.estimate_pairs(rows, tests, [p.primary_key, "trace_fisher"], design)
    outside: dict[str, list[float]] = {}
    for q in pairs:
        for side in ("recipe", "reference"):
            outside.setdefault(q[side], []).append(float(q[f"{side}_outside"]))
    print(f"# the pilot: {args.folder}, seeds {', '.join(map(str, seeds))}")
    keep = {}
    for fork, far in sorted(outside.items()):
        share = sum(x > 0 for x in far) / len(far)
        keep[fork] = 5 if share > args.share else 3
        print(f"#   {fork:<12} outside its range in {share:.0%} of {len(far)} pairs, at most {max(far):.1e} nats"
              f" -> {keep[fork]} checkpoints")
    print(f"CHECKPOINTS = {dict(sorted((f, 5) for f, n in keep.items() if n == 5))!r}")
    accuracies = [(f"{v}_{m}_n{n}", "") for v, m in ENDPOINTS for n in p.probes.sizes if f"{v}_{m}_n{n}" ==
                  p.primary_key]
    thin = thinned(rows, keep)
    design = p.design()
    diffs = paired.differences(paired.estimate_pairs(thin, tests, [p.primary_key, "trace_fisher"], design), tests,
                               accuracies, p.primary_key, design, n_boot=0)
    print("PRIOR_SDS = (")
    for r in diffs:
        if r["quantity"] == p.primary_key and math.isfinite(r["sd"]):
            print(f"    ({r['comparison'] + ' @ ' + r['point']!r}, {r['sd']:.3f}),  # n = {r['n_used']}, "
                  f"estimate {r['mean']:+.2f} [{r['t_low']:.2f}, {r['t_high']:.2f}]")
    print(")")


if __name__ == "__main__":
    main()
