"""The row schema: the error column of each quantity and what its spread is over."""

from sameloss.measures.rows import format_rows
from sameloss.measures import rows


def test_each_quantity_names_its_error_column_and_spread():
    assert rows.error_column("trace_fisher") == "trace_fisher_se"
    assert rows.error_column("trace") == "trace_se"
    assert rows.error_column("probe_B") == "probe_B_std"
    assert rows.error_column("kl") == "kl_std"
    assert rows.spread_of("trace_hutchinson") is None  # already a standard error
    assert rows.error_column("adaptive_trace") == "adaptive_trace_se" and rows.spread_of("adaptive_trace") is None
    assert rows.error_column("adaptive_trace_layer0") == "adaptive_trace_layer0_se"
    assert rows.spread_of("finetune_task-5") == "seeds"
    assert rows.spread_of("lookup_C") == "seeds"
    assert rows.spread_of("loss") == "subsets"
    assert rows.is_error_column("trace_fisher_repeat_std") and not rows.is_error_column("kl")


def test_the_cli_table_merges_each_quantity_with_its_own_error_column():
    row = {"checkpoint": "c", "run": "r", "step": 3, "kl": 0.25, "kl_std": 0.125,
           "trace_fisher": 10.0, "trace_fisher_se": 0.5, "trace_fisher_repeat_std": 9.0}
    header, line = format_rows([row]).splitlines()
    assert header.split() == ["step", "kl", "trace_fisher"]
    assert "0.25 ± 0.12" in line and "10 ± 0.5" in line and "9" not in line.replace("0.5", "")
