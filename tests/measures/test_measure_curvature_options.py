"""``sameloss measure`` with the curvature options of issue 26: Hutch++, per-block
traces, the Lanczos basis."""

from __future__ import annotations

import json

import pytest

from sameloss.cli import main
from sameloss.errors import UserError
from sameloss.measures.run import MeasureSpec


def test_measure_hutchpp_by_block_and_a_small_lanczos_basis(checkpoint, capsys):
    assert main(["measure", str(checkpoint), "--trace", "hutchpp", "--trace", "fisher", "--trace-by", "block",
                 "--probes", "9", "--contexts", "12", "--labels", "3", "--top-eig", "--lanczos-basis", "4",
                 "--micro-batch", "300",
                 "--json", "--no-progress"]) == 0
    row, = json.loads(capsys.readouterr().out)
    for name in ("hutchpp", "fisher"):
        blocks = {k: v for k, v in row.items() if k.startswith(f"trace_{name}_") and not k.endswith(("_se", "_std"))}
        assert set(blocks) == {f"trace_{name}_{b}" for b in ("embedding", "layer0", "head")}
        assert sum(blocks.values()) == pytest.approx(row[f"trace_{name}"], rel=1e-9)
        assert all(row[f"{k}_se"] is not None for k in blocks)
    assert row["top_eigenvalue"] > 0


def test_measure_spec_refuses_bad_curvature_options():
    with pytest.raises(UserError, match="unknown trace estimator 'lanczos'"):
        MeasureSpec(traces=("lanczos",))
    with pytest.raises(UserError, match="--trace-by block needs a --trace"):
        MeasureSpec(loss=True, trace_by="block")
    with pytest.raises(UserError, match="at least 3 products"):
        MeasureSpec(traces=("hutchpp",), n_probes=2)
