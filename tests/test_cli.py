"""The sameloss command: output, exit codes, one-line errors, no overwritten results."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sameloss.cli import main

ANCHOR = Path(__file__).resolve().parents[2] / "shared" / "anchors" / "rule_deep_mlm.txt"


def run(*args):
    return subprocess.run([sys.executable, "-m", "sameloss.cli", *args], capture_output=True, text=True)


def test_describe_prints_the_summary(capsys):
    assert main(["language", "describe", "hmm", "--preset", "micro", "--n-sentences", "300"]) == 0
    out = capsys.readouterr().out
    assert "vocabulary  8 words + 3 special tokens" in out
    assert "nats/token" in out and "task-3" in out
    assert main(["language", "describe", "pcfg", "--size", "headroom", "--n-sentences", "300"]) == 0
    out = capsys.readouterr().out
    assert "pcfg (size headroom)" in out and "span-1" in out and "max_len 4" in out


def test_describe_json_for_the_released_grammar(capsys):
    if not ANCHOR.exists():
        pytest.skip("shared/anchors not beside the checkout")
    assert main(["language", "describe", "pcfg", "--grammar", str(ANCHOR), "--n-sentences", "200", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["n_words"] == 200 and summary["nonterminals"] == 50
    assert 4.0 < summary["entropy"]["mean"] < 5.0
    assert any("A1_9" in note for note in summary["notes"])


@pytest.mark.parametrize("args, message", [
    (["language", "describe", "pcfg", "--preset", "huge"], "sameloss: error: unknown PCFG size 'huge'"),
    (["language", "describe", "pcfg", "--grammar", "/nonexistent.txt"], "grammar file not found"),
    (["pretrain", "steps=oops"], "config key 'steps': expected int, got 'oops'"),
    (["pretrain", "bogus"], "override 'bogus' is not of the form key=value"),
    (["measure", "/nonexistent"], "nothing to measure"),
    (["measure", "/nonexistent", "--loss"], "no such run or checkpoint"),
])
def test_bad_input_is_one_line_and_exit_code_2(args, message):
    result = run(*args)
    assert result.returncode == 2
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_malformed_grammar_names_file_and_line(tmp_path):
    grammar = tmp_path / "g.txt"
    grammar.write_text("S A B 0.5\nA a 1.0\nB b 1.0\n")
    result = run("language", "describe", "pcfg", "--grammar", str(grammar))
    assert result.returncode == 2
    assert result.stderr.strip() == f"sameloss: error: {grammar}:1: the rules of 'S' sum to 0.5, not 1 (non-normalised grammar)"


def test_pretrain_then_measure_and_never_overwrite(tmp_path, capsys):
    out = tmp_path / "runs"
    args = ["pretrain", "name=t", "steps=6", "batch_size=16", "model.size=micro", "language.preset=micro",
            "eval.n_sentences=50", "eval.every=3", "checkpoints=[3]", "--out", str(out), "--no-progress"]
    assert main(args) == 0
    assert "exact held-out loss" in capsys.readouterr().out
    before = (out / "t" / "metrics.jsonl").read_text()
    assert main(args) == 2  # the run folder holds results: refused
    assert "already holds a run" in capsys.readouterr().err
    assert (out / "t" / "metrics.jsonl").read_text() == before
    table = tmp_path / "m.csv"
    assert main(["measure", str(out / "t"), "--loss", "--trace", "fisher", "--contexts", "20", "--labels", "3",
                 "--probe", "A", "--task-size", "60", "--seeds", "2", "--out", str(table), "--no-progress"]) == 0
    lines = table.read_text().splitlines()
    assert len(lines) == 3  # header + checkpoints 3 and 6
    assert "trace_fisher" in lines[0] and "probe_A" in lines[0]


def test_print_config_lists_every_key_with_the_overrides(capsys):
    assert main(["pretrain", "--print-config", "steps=10", "sam.rho=0.05"]) == 0
    text = capsys.readouterr().out
    import tomllib
    data = tomllib.loads(text)
    assert data["steps"] == 10 and data["sam"]["rho"] == 0.05
    assert {"language", "model", "optim", "eval", "sam", "adversarial"} <= set(data)
