"""Bad settings and configs are one line and leave nothing; `--print-config` round-trips;
progress in a log file is plain lines (issue 10).

Every case goes through ``sameloss.cli.main`` as a user would and checks the exit code,
that the error is one line naming the problem, and that the files around are unchanged.
"""

from __future__ import annotations

import pytest

from sameloss import config as configlib
from sameloss.cli import main
from sameloss.training import PretrainConfig

from helpers.safety import TINY, one_error_line


@pytest.mark.parametrize("override, message", [
    ("optim.lr=nan", "finite"), ("optim.lr=inf", "finite"), ("optim.lr=-inf", "finite"),
    ("log_every=0", "log_every must be >= 1"), ("save_every=0", "save_every must be >= 1"),
    ("eval.n_sentences=0", "eval.n_sentences must be >= 1"), ("eval.n_subsets=0", "eval.n_subsets must be in"),
    ("eval.every=-1", "eval.every must be >= 0"), ("language.seed=-1", "language.seed must be >= 0"),
    ("model.dropout=nan", "finite"),
])
def test_bad_settings_are_one_line_and_leave_nothing(tmp_path, capsys, override, message):
    out = tmp_path / "out"
    assert main(["pretrain", "name=r", "--out", str(out), *TINY, "steps=2", override, "--no-progress"]) == 2
    assert message in one_error_line(capsys)
    assert not out.exists()


@pytest.mark.parametrize("kind", ["folder", "binary"])
def test_a_config_that_is_not_a_toml_file_is_one_line(tmp_path, capsys, kind):
    path = tmp_path / "cfg"
    if kind == "folder":
        path.mkdir()
    else:
        path.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe\x00\x00")
    assert main(["pretrain", "--config", str(path), "--out", str(tmp_path / "out")]) == 2
    assert str(path) in one_error_line(capsys)
    assert not (tmp_path / "out").exists()


def test_describe_refuses_a_negative_seed(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["language", "describe", "hmm", "--preset", "micro", "--seed", "-1"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "expected an integer >= 0" in err[0]


def test_print_config_shows_unset_keys_and_loads_back(tmp_path, capsys):
    assert main(["pretrain", "--print-config", "steps=10", "model.d_model=32"]) == 0
    text = capsys.readouterr().out
    assert "# seed = None (unset)" in text and "# d_hidden = None (unset)" in text
    assert "# grad_clip = None (unset)" in text and "d_model = 32" in text
    path = tmp_path / "c.toml"
    path.write_text(text)
    assert configlib.load(PretrainConfig, path) == configlib.load(PretrainConfig, None, ["steps=10",
                                                                                        "model.d_model=32"])


def test_progress_in_a_log_file_is_plain_lines_on_stdout(tmp_path, capsys, monkeypatch):
    """Written to a file, progress is plain lines, on stdout: stderr holds only an error's
    one line (issue 40)."""
    monkeypatch.setenv("SAMELOSS_PROGRESS_SECONDS", "0")
    assert main(["pretrain", "name=r", "--out", str(tmp_path), *TINY, "steps=5", "log_every=1"]) == 0
    captured = capsys.readouterr()
    assert "\r" not in captured.out and captured.err == ""
    lines = [line for line in captured.out.strip().splitlines() if line.startswith("r: ")]
    assert lines[0].startswith("r: 1/5 steps (20%)") and lines[-1].startswith("r: 5/5 steps (100%)")
    assert "loss=" in lines[-1]


def test_headings_and_progress_go_to_stderr_only_on_a_terminal(monkeypatch):
    import io
    import sys

    from sameloss import progress

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    assert progress.stream() is sys.stdout  # pytest's capture: not a terminal
    monkeypatch.setattr(sys, "stderr", Terminal())
    assert progress.stream() is sys.stderr
    bar = progress.progress_bar(total=3, desc="x")
    assert type(bar).__module__.startswith("tqdm")  # a live bar there
    bar.close()
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    progress.data_on_stdout(True)  # --json: stdout is the data's
    try:
        assert progress.stream() is sys.stderr
    finally:
        progress.data_on_stdout(False)

