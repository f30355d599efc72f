"""A run folder belongs to one process at a time, and its files look like any other's
(issue 20, items 3 and 15)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sameloss import files
from sameloss.cli import main
from sameloss.training.checkpoint import complete_checkpoints
from helpers.processes import ENV, Holder, error_lines

TINY = ["batch_size=8", "model.size=micro", "language.name=hmm", "language.size=micro", "eval.every=0",
        "eval.n_sentences=16", "optim.warmup_steps=1", "device=cpu", "--no-progress"]


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("sameloss: error: "), err
    return err[0]


@pytest.mark.parametrize("flags", [[], ["--resume"], ["--fresh"]])
def test_a_second_pretrain_on_a_locked_run_is_one_line_naming_the_holder(tmp_path, capsys, flags):
    out = tmp_path / "runs"
    with Holder(out / "r", tmp_path / "scratch") as holder:
        assert main(["pretrain", "name=r", "--out", str(out), *TINY, "steps=2", *flags]) == 2
        line = one_error_line(capsys)
        assert f"pid {holder.pid}" in line and f"{out / 'r'} is in use by another sameloss process" in line
        assert not (out / "r").exists()
    assert not out.exists()  # the folder the lock made is gone again: nothing left behind


def test_two_real_pretrains_of_one_run_never_interleave(tmp_path, capsys):
    """The first process trains (its lock file names it); a second one with the same name
    — resuming, or with other settings and --fresh — is refused and changes nothing; the
    first one's log has each step once."""
    out = tmp_path / "runs"
    run = out / "r"
    first = subprocess.Popen([sys.executable, "-m", "sameloss.cli", "pretrain", "name=r", "--out", str(out), *TINY,
                              "steps=100000", "log_every=1", "save_every=5"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        for _ in range(12000):  # a safety net (120 s), not a timing assertion
            if complete_checkpoints(run) or first.poll() is not None:
                break
            time.sleep(0.01)
        assert complete_checkpoints(run), first.stderr.read() if first.poll() is not None else ""
        assert files.lock_path(run).read_text().splitlines()[0] == str(first.pid)
        config = (run / "config.toml").read_bytes()
        for flags in (["--resume"], ["--fresh", "optim.lr=0.05"], ["optim.lr=0.05"]):
            assert main(["pretrain", "name=r", "--out", str(out), *TINY, "steps=100000", "log_every=1", *flags]) == 2
            line = one_error_line(capsys)
            assert f"pid {first.pid}" in line, line
            assert (run / "config.toml").read_bytes() == config
    finally:
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=120)
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == sorted(set(steps))  # every step logged once
    assert not files.lock_path(run).exists()


def test_every_file_of_a_run_has_the_mode_the_umask_gives(tmp_path):
    """config.toml, summary.json and model.safetensors were 0600 beside 0644 files."""
    old = os.umask(0o022)
    try:
        assert main(["pretrain", "name=r", "--out", str(tmp_path), *TINY, "steps=2", "checkpoints=[1]"]) == 0
    finally:
        os.umask(old)
    modes = {str(p.relative_to(tmp_path)): p.stat().st_mode & 0o777 for p in (tmp_path / "r").rglob("*")}
    assert {k for k, m in modes.items() if (tmp_path / k).is_file() and m != 0o644} == set(), modes
    assert {k for k, m in modes.items() if (tmp_path / k).is_dir() and m != 0o755} == set(), modes
    assert any(k.endswith("model.safetensors") for k in modes) and "r/summary.json" in modes


def test_a_full_disk_during_embed_is_one_line_naming_the_target_and_leaves_nothing(checkpoint, tmp_path):
    from helpers.processes import run_cli

    out = tmp_path / "big"
    done = run_cli(["embed", str(checkpoint), "--out", str(out), "--width-factor", "2"], file_size_limit=8192)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert f"cannot write {out}" in done.stderr and "partial" not in done.stderr
    assert list(tmp_path.iterdir()) == []
    assert main(["embed", str(checkpoint), "--out", str(out), "--width-factor", "2"]) == 0
