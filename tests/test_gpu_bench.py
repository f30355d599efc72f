"""bench/gpu_throughput.py's smoke form on the CPU: its rows are the planner's FLOP count over
the timed steps (bench/gpu_check.sh reads them on a GPU)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


def test_throughput_smoke_rows_follow_the_planner(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    import gpu_throughput
    from sameloss.experiments.engine import plan

    out = tmp_path / "rows.json"
    assert gpu_throughput.main(["--smoke", "--device", "cpu", "--precisions", "fp32", "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())
    assert row["precision"] == "fp32" and row["steps"] >= 1 and row["mfu"] is None  # no published CPU peak
    cfg, *_ = gpu_throughput.setup("micro", "micro", 8, "fp32", "cpu")
    per_step = 3 * plan.forward_flops_per_token(plan.model_shape(cfg, {})) * 8 * row["max_len"]
    assert row["tflops"] * 1e12 == pytest.approx(per_step * row["steps"] / row["seconds"], rel=1e-2)
    assert row["tokens_per_s"] == pytest.approx(8 * row["max_len"] * row["steps"] / row["seconds"], rel=1e-2)
    assert row["plan_memory_gib"] > 0
    sys.modules.pop("gpu_throughput", None)


def test_ensemble_bench_smoke_rows(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    import bench_ensemble

    out = tmp_path / "rows.json"
    assert bench_ensemble.main(["--smoke", "--device", "cpu", "--strategy", "vmap", "--dropout", "0.1",
                                "--json", str(out)]) == 0
    got = json.loads(out.read_text())
    assert [r["S"] for r in got["rows"]] == ["one", "one, global-RNG dropout", 1, 2]
    assert all(r["per_member_s"] > 0 and r["mfu"] is None for r in got["rows"]) and got["draw_seconds"] > 0
    sys.modules.pop("bench_ensemble", None)
