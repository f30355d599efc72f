"""The Python quickstart (docs/quickstart.md) runs as written (issue 50, item 3): its code
blocks, in order, as one script in a fresh folder — a renamed function or a changed
signature fails here, not on a newcomer's machine."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

from sameloss.experiments.stats.inference import VERDICTS

PAGE = Path(__file__).resolve().parents[1] / "docs" / "quickstart.md"


def test_the_quickstart_runs_and_compares(tmp_path, monkeypatch):
    code = "\n".join(re.findall(r"```python\n(.*?)```", PAGE.read_text(encoding="utf-8"), flags=re.S))
    assert "pretrain(" in code and "measure_path(" in code and "paired_difference(" in code
    monkeypatch.chdir(tmp_path)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, str(PAGE), "exec"), {"__name__": "__quickstart__"})
    text = out.getvalue()
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == sorted(
        f"{r}-s{s}" for r in ("adamw", "noreg") for s in range(3))
    last = text.strip().splitlines()[-1]
    assert last.startswith("noreg − adamw: ") and any(last.endswith(v) for v in VERDICTS), last
    # the page shows what the code printed (scripts/docs_outputs.py), not a typed output
    shown = PAGE.read_text(encoding="utf-8").split("<!-- generated: python -->")[1]
    assert "noreg − adamw: " in shown and "tasks: task-3" in shown
