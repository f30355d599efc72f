"""The page "Studies from Python" (docs/how-to/python.md) runs as written (issue 62): plan,
reproduce at the smoke scale on two languages, its differences in pandas, and the replication
table of its languages — a renamed function or a changed signature fails here."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

PAGE = Path(__file__).resolve().parents[1] / "docs" / "how-to" / "python.md"


def test_the_python_page_plans_runs_reads_and_replicates(tmp_path, monkeypatch):
    pytest.importorskip("pandas")
    from sameloss import progress

    code = "\n".join(re.findall(r"```python\n(.*?)```", PAGE.read_text(encoding="utf-8"), flags=re.S))
    for call in ("plan_text(", "reproduce(", "pd.read_csv(", "finished_studies(", "replication_section("):
        assert call in code, call
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(progress, "_DATA_ON_STDOUT", [False])  # the page sets it; the test process keeps its own
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        exec(compile(code, str(PAGE), "exec"), {"__name__": "__python_page__"})
    text = out.getvalue()
    folder = tmp_path / "runs" / "isoloss-smoke-hmm-headroom+pcfg-headroom"
    assert (folder / "report.md").exists()
    assert sorted(p.name for p in folder.glob("*differences.csv")) == [
        "hmm-headroom-differences.csv", "pcfg-headroom-differences.csv"]
    assert text.startswith("plan: isoloss --scale smoke on cpu")
    assert "no headroom" in text  # the smoke scale's gate: no verdict on either language
    assert "['hmm-headroom', 'pcfg-headroom']" in text and "run hmm-headroom-s0-base" not in text  # notes: stderr
    # the page shows what the code printed (scripts/docs_outputs.py), not a typed output
    shown = PAGE.read_text(encoding="utf-8").split("<!-- generated: python stdout -->")[1]
    assert "plan: isoloss --scale smoke on cpu" in shown and "['hmm-headroom', 'pcfg-headroom']" in shown
