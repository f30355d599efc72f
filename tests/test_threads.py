"""--threads and OMP_NUM_THREADS: one policy for every compute command (issue 10, item 8)."""

from __future__ import annotations

import pytest
import torch

from sameloss import threads
from sameloss.cli import build_parser, main
from sameloss.errors import UserError

# every compute command, with the arguments it needs to parse
COMMANDS = [
    ["pretrain"],
    ["measure", "runs/x"],
    ["embed", "runs/x/checkpoints/step_1", "--out", "big"],
    ["language", "describe", "hmm"],
    ["reproduce", "figure1"],
]


@pytest.fixture
def torch_threads(monkeypatch):
    """Start each test at 2 threads with OMP_NUM_THREADS unset; restore the session's count."""
    before = torch.get_num_threads()
    monkeypatch.delenv(threads.ENV, raising=False)
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c[:2]))
def test_every_compute_command_takes_threads(command):
    assert build_parser().parse_args([*command, "--threads", "3"]).threads == 3
    assert build_parser().parse_args(command).threads is None


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c[:2]))
@pytest.mark.parametrize("value", ["0", "x", "-1", "1.5"])
def test_bad_threads_is_one_line_and_exit_code_2(command, value, capsys):
    with pytest.raises(SystemExit) as exc:
        main([*command, "--threads", value])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert "--threads" in err and repr(value) in err


def test_threads_flag_sets_torch_threads(torch_threads, capsys):
    assert main(["pretrain", "--print-config", "--threads", "1"]) == 0
    assert torch.get_num_threads() == 1
    assert main(["pretrain", "--print-config", "--threads", "2"]) == 0
    assert torch.get_num_threads() == 2


def test_default_is_one_thread(torch_threads, capsys):
    assert main(["pretrain", "--print-config"]) == 0
    assert torch.get_num_threads() == threads.DEFAULT_THREADS == 1


def test_omp_num_threads_is_honoured_and_the_flag_wins(torch_threads, monkeypatch, capsys):
    torch.set_num_threads(1)
    monkeypatch.setenv(threads.ENV, "2")
    assert main(["pretrain", "--print-config"]) == 0
    assert torch.get_num_threads() == 2
    assert main(["pretrain", "--print-config", "--threads", "1"]) == 0
    assert torch.get_num_threads() == 1
    monkeypatch.setenv(threads.ENV, "2,1")  # OpenMP's per-nesting-level list: the outer level counts
    assert main(["pretrain", "--print-config"]) == 0
    assert torch.get_num_threads() == 2


@pytest.mark.parametrize("value", ["x", "0", "-2"])
def test_bad_omp_num_threads_is_one_line_and_exit_code_2(torch_threads, monkeypatch, capsys, value):
    monkeypatch.setenv(threads.ENV, value)
    assert main(["pretrain", "--print-config"]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [
        f"sameloss: error: OMP_NUM_THREADS={value!r} is not a whole number of threads >= 1 "
        "(unset it or pass --threads N)"]
    assert torch.get_num_threads() == 2  # nothing changed


def test_blank_omp_num_threads_means_unset():
    assert threads.threads_from_env({threads.ENV: "  "}) is None
    assert threads.threads_from_env({}) is None
    assert threads.threads_from_env({threads.ENV: "3"}) == 3


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2", True])
def test_configure_threads_rejects_non_positive_integers(torch_threads, bad):
    with pytest.raises(UserError, match="--threads must be a whole number >= 1"):
        threads.configure_threads(bad)
    assert torch.get_num_threads() == 2


def test_interop_threads_already_fixed_is_not_an_error(torch_threads, monkeypatch):
    """torch refuses set_num_interop_threads after parallel work started or a first call:
    configure_threads still sets the intra-op threads, and tries the inter-op call once."""
    calls = []

    def refuse(n):
        calls.append(n)
        raise RuntimeError("Error: cannot set number of interop threads after parallel work has started")

    monkeypatch.setattr(threads, "_interop_tried", False)
    monkeypatch.setattr(torch, "set_num_interop_threads", refuse)
    assert threads.configure_threads(1) == 1
    assert threads.configure_threads(2) == 2
    assert torch.get_num_threads() == 2
    assert calls == [1]


def test_children_started_under_for_children_start_with_the_parents_thread_count(monkeypatch):
    """A spawned worker (``launch.Local``'s) is a fresh interpreter: libgomp reads
    OMP_NUM_THREADS when it imports torch, which otherwise starts at one thread per core
    (2 here) and collapses beside a busy process (issue 20, item 14)."""
    import os
    import subprocess
    import sys

    monkeypatch.delenv(threads.ENV, raising=False)
    script = "import os, torch; print(torch.get_num_threads(), os.environ.get('OMP_NUM_THREADS'))"
    with threads.for_children(1):
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["1", "1"]
    assert threads.ENV not in os.environ  # restored


@pytest.mark.parametrize("value, code", [("abc", 2), ("0", 2), (" ", 0), ("99999999999", 2)])
def test_a_bad_omp_num_threads_gives_our_line_only_not_libgomps(value, code):
    """libgomp parses OMP_NUM_THREADS when torch is imported and printed its own two lines
    before ours; the variable is now checked before torch is imported (a blank one means
    unset and is removed)."""
    import subprocess
    import sys

    from helpers.processes import ENV

    done = subprocess.run([sys.executable, "-m", "sameloss.cli", "language", "describe", "hmm", "--size", "micro",
                           "--n-sentences", "8"], env={**ENV, threads.ENV: value}, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == code
    lines = done.stderr.strip().splitlines()
    assert lines == ([] if code == 0 else [lines[0]]) and "libgomp" not in done.stderr, done.stderr
    if code:
        assert lines[0].startswith(f"sameloss: error: OMP_NUM_THREADS={value!r}")


def test_threads_flag_replaces_a_bad_omp_num_threads_for_this_process_and_its_children():
    import subprocess
    import sys

    from helpers.processes import ENV

    script = ("import os, sys\nfrom sameloss.cli import main\n"
              "code = main(['language', 'describe', 'hmm', '--size', 'micro', '--n-sentences', '8', '--threads', '1'])\n"
              "import torch\nprint(os.environ['OMP_NUM_THREADS'], torch.get_num_threads(), code)\n")
    done = subprocess.run([sys.executable, "-c", script], env={**ENV, threads.ENV: "abc"}, capture_output=True,
                          text=True, timeout=300)
    assert done.stderr == "" and done.stdout.strip().splitlines()[-1] == "1 1 0", done.stderr
