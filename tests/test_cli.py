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
                 "--probe", "A", "--task-size", "60", "--probe-seeds", "2", "--out", str(table), "--no-progress"]) == 0
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


def _parsers():
    """Every (sub)command's parser, with its command words."""
    import argparse

    from sameloss.cli import build_parser

    def walk(parser, words):
        yield words, parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    yield from walk(sub, words + [name])

    return list(walk(build_parser(), ["sameloss"]))


def test_one_grammar_every_flag_has_help_and_every_help_ends_with_examples():
    """Issue 50: a flag without help, or a command whose --help shows no example, fails here;
    the examples are commands this CLI takes."""
    import argparse
    import shlex

    from sameloss.cli import build_parser

    parser = build_parser()
    for words, sub in _parsers():
        missing = [a.option_strings or a.dest for a in sub._actions
                   if a.help is None and not isinstance(a, argparse._SubParsersAction)]
        assert missing == [], (words, missing)
        text = sub.format_help()
        tail = text[text.rindex("examples:"):].splitlines()[1:]
        assert 1 <= len(tail) <= 2, (words, tail)
        for line in tail:
            example = shlex.split(line.split("#")[0])
            assert example[0] == "sameloss" and example[1:len(words)] == words[1:], (words, line)
            parser.parse_args(example[1:])  # SystemExit (a failure) if the CLI refuses it


def test_a_flag_name_means_one_thing_across_commands():
    """--device is auto/cpu/cuda wherever it is shown (plan's hardware is --hardware); --seeds
    is reproduce's list of study seeds only (measure's repeats are --probe-seeds)."""
    import argparse

    meanings: dict[str, set] = {}
    for words, sub in _parsers():
        for a in sub._actions:
            if a.help == argparse.SUPPRESS:
                continue  # a deprecated spelling
            for flag in a.option_strings:
                if flag in ("--device", "--seeds"):
                    meanings.setdefault(flag, set()).add((tuple(a.choices or ()) if flag == "--device" else a.metavar))
    assert meanings["--device"] == {("auto", "cpu", "cuda")}
    assert meanings["--seeds"] == {"LIST"}


def test_reproduce_isoloss_is_the_main_job_and_the_old_spellings_still_work(capsys):
    """`sameloss reproduce` and `sameloss reproduce isoloss` have the same defaults (quick, local
    workers); another experiment runs at tiny in this process."""
    from sameloss.cli import build_parser
    from sameloss.experiments import main_job

    parser = build_parser()
    for argv in (["reproduce"], ["reproduce", "isoloss"]):
        args = parser.parse_args(argv)
        assert main_job(args.experiment, args.scale) == ("isoloss", "quick")
    from sameloss.experiments import cli as experiments_cli

    def launcher(argv):
        args = parser.parse_args(argv)
        return experiments_cli._launch_options(args, experiments_cli._given(args)).launcher

    assert launcher(["reproduce", "isoloss"]) == launcher(["reproduce"])
    args = parser.parse_args(["reproduce", "steps"])
    assert main_job(args.experiment, args.scale) == ("steps", "tiny")
    assert launcher(["reproduce", "steps"]) == "inprocess"
    args = parser.parse_args(["measure", "runs/x", "--seeds", "3"])
    # the note waits until the command knows whether stdout holds --json data (then it goes to
    # stderr: tests/text/test_glue.py parses such a command's stdout)
    assert args.probe_seeds == 3 and args.deprecation_notes == ["note: --seeds is now --probe-seeds"]


def test_describe_defaults_to_the_size_the_study_uses(capsys):
    assert main(["language", "describe", "hmm", "--n-sentences", "200"]) == 0
    assert "hmm (size headroom)" in capsys.readouterr().out
    assert main(["language", "describe", "dyck", "--n-sentences", "50"]) == 0  # dyck has no headroom size
    assert "(size tiny)" in capsys.readouterr().out


def test_describe_takes_family_colon_size_as_language_writes_it(capsys):
    """``language describe hmm:headroom`` is ``hmm --size headroom`` (the spelling of
    ``--language`` and of the registered languages); a size the family lacks, or two sizes,
    is one line naming them (issue 62)."""
    assert main(["language", "describe", "hmm:micro", "--n-sentences", "200"]) == 0
    colon = capsys.readouterr().out
    assert main(["language", "describe", "hmm", "--size", "micro", "--n-sentences", "200"]) == 0
    assert colon == capsys.readouterr().out and "hmm (size micro)" in colon
    result = run("language", "describe", "hmm:huge")
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "hmm has no size 'huge' (its sizes: " in result.stderr
    result = run("language", "describe", "hmm:micro", "--size", "tiny")
    assert result.returncode == 2 and "hmm:micro and --size tiny name two sizes" in result.stderr


@pytest.mark.parametrize("args, hint", [
    (["reproduc"], "did you mean 'reproduce'?"),
    (["reproduce", "--sead", "3"], "unrecognized arguments: --sead; did you mean --seed?"),
    (["plan", "--scale", "tinny"], "did you mean 'tiny'?"),
    (["language", "describ", "hmm"], "did you mean 'describe'?"),
    (["language", "describe", "hmn"], "did you mean 'hmm'?"),
    (["pretrain", "--fresch"], "did you mean --fresh?"),
])
def test_a_misspelt_command_option_or_choice_suggests_the_close_one(args, hint):
    """One line and exit 2, naming the closest spelling (difflib) — for an option, before
    argparse takes its value for a positional and complains of that instead (issue 62)."""
    result = run(*args)
    assert result.returncode == 2, result.stderr
    assert hint in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_help_lists_the_commands_by_group_the_studies_first():
    """``sameloss --help`` lists every command once, under its group, the main job's first."""
    from sameloss.cli import COMMAND_GROUPS, build_parser

    text = build_parser().format_help()
    listed = [name for _, names in COMMAND_GROUPS for name in names]
    assert listed[0] == "reproduce"
    at = [text.index(f"\n    {name} ") for name in listed]
    assert at == sorted(at)  # in the groups' order
    heads = [text.index(f"\n  {title}:\n") for title, _ in COMMAND_GROUPS]
    assert heads == sorted(heads) and heads[0] < at[0]
