"""The extension guide (docs/how-to/extend.md) runs as written (issue 49, item 5): its Python
blocks, in order, in a fresh folder and a fresh interpreter — a block headed by a file name
(```` ```python title="myrecipe.py" ````) is written as that file first, the others run as one
script. A renamed class, a changed signature or a declaration the engine no longer takes
fails here, not in a reader's hands. A fresh interpreter: the page registers a measure, a
recipe and a language, which must not leak into the other tests."""

from __future__ import annotations

import csv
import os
import re
import subprocess
import sys
from pathlib import Path

PAGE = Path(__file__).resolve().parents[1] / "docs" / "how-to" / "extend.md"
BLOCK = re.compile(r'^```python(?: title="([^"]+)")?\n(.*?)^```$', flags=re.S | re.M)


def page_blocks() -> tuple[dict[str, str], str]:
    """The page's files (by title) and its script (the untitled blocks, in order)."""
    files, script = {}, []
    for title, code in BLOCK.findall(PAGE.read_text(encoding="utf-8")):
        if title:
            files[title] = code
        else:
            script.append(code)
    return files, "\n".join(script)


def test_the_page_has_a_block_for_each_extension():
    files, script = page_blocks()
    assert {"mymeasure.py", "myrecipe.py", "myobjective.py"} <= set(files)
    for call in ("Fork(", "Comparison(", "measure_path(", "reproduce(", "dry_plan(", "train_ensemble("):
        assert call in script, call
    # the names the page used to give, which no longer exist
    text = PAGE.read_text(encoding="utf-8")
    for gone in ("core.run_unit", "study.seed_units", "report(study", "`runs`"):
        assert gone not in text, gone


def test_the_extension_guide_runs_as_written(tmp_path):
    files, script = page_blocks()
    for name, code in files.items():
        (tmp_path / name).write_text(code, encoding="utf-8")
    (tmp_path / "page.py").write_text(script, encoding="utf-8")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), *sys.path]), OMP_NUM_THREADS="1")
    env.pop("SAMELOSS_PLUGINS", None)
    done = subprocess.run([sys.executable, "page.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    # the fork: planned at every fork point of every smoke seed, with its own setting
    forked = re.search(r"^(\d+) runs of the new fork, e\.g\. \S+-sam10 with SAM ρ 0\.1$", out, flags=re.M)
    assert forked and int(forked.group(1)) > 0, out
    assert "new tests: sam10 @ late, sam10 @ scratch" in out
    # the measure: its column in a measured row
    norm = re.search(r"squared norm of the blocks' weights (\d+\.\d)", out)
    assert norm and float(norm.group(1)) > 0, out
    # the recipe: its report, its rows (with the new measure's column) and its plan
    root = tmp_path / "runs" / "myrecipe-smoke"
    report = (root / "report.md").read_text(encoding="utf-8")
    assert "# Regularisation after convergence" in report and "The base and its fork" in report
    rows = list(csv.DictReader((root / "results.csv").open(newline="")))
    assert [r["model"] for r in rows] == ["base-s0", "noreg-s0"]
    assert all(float(r["weight_norm"]) > 0 and float(r["trace_fisher"]) > 0 for r in rows)
    assert "init_from" in (root / "runs" / "noreg-s0" / "config.toml").read_text()  # forked, not from scratch
    assert re.search(r"^planned: 2 runs, \S+ FLOPs of evaluation$", out, flags=re.M), out
    # the language
    assert re.search(r"^toy: 3 words, tasks ", out, flags=re.M), out
    # the training objective: logged alone; in a loop ensemble its member equals the run alone
    # (the same config but its name), bit for bit; under vmap to float32 rounding; λ matters
    alone = re.search(r"^alone: matrix_l2 (\S+), KL (\S+)$", out, flags=re.M)
    loop = re.search(r"^loop: matrix_l2 (\S+) and (\S+), KL (\S+)$", out, flags=re.M)
    vmap = re.search(r"^vmap: matrix_l2 (\S+) and (\S+), KL (\S+)$", out, flags=re.M)
    assert alone and loop and vmap, out
    assert (loop.group(1), loop.group(3)) == alone.groups() and float(loop.group(2)) < float(loop.group(1))
    assert abs(float(vmap.group(3)) - float(alone.group(2))) <= 1e-4 * float(alone.group(2))
    assert abs(float(vmap.group(1)) - float(alone.group(1))) <= 1e-3 * float(alone.group(1))
