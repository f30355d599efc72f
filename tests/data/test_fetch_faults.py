"""``sameloss data fetch`` loses nothing (issue 20): it removes only what its manifest
lists, takes a lock on its target, leaves nothing half-written on a full disk, resolves
relative cache paths, leaves no child behind when killed, and reports progress."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sameloss import files
from sameloss.data import fetch as data_fetch
from sameloss.cli import main
from sameloss.errors import UserError
from helpers.datacli import alive, error_line, fake_vader as _fake_vader, leftovers, run_cli, start_cli, wait_for

FAKE_PIP = textwrap.dedent("""\
    #!{python}
    # stands in for "python -m pip download ... -d DIR REQ": copies $FAKE_SOURCE into DIR
    import os, shutil, sys, time
    args = sys.argv[1:]
    dest = args[args.index("-d") + 1]
    if os.environ.get("FAKE_PID"):
        open(os.environ["FAKE_PID"], "w").write(str(os.getpid()))
    print("Collecting " + args[-1], flush=True)
    time.sleep(float(os.environ.get("FAKE_SLEEP", "0")))
    shutil.copyfile(os.environ["FAKE_SOURCE"], os.path.join(dest, os.path.basename(os.environ["FAKE_SOURCE"])))
    """)
SDIST = "vaderSentiment-3.3.2.tar.gz"


@pytest.fixture
def fake_pip(tmp_path, monkeypatch):
    """``sys.executable`` replaced by a fake whose ``-m pip download`` copies a fake
    vaderSentiment sdist (no network), pinned by its checksum; and the same as a prelude
    for a child process."""
    source = tmp_path / "registry"
    source.mkdir()
    _fake_vader(source)
    script = tmp_path / "fake-python"
    script.write_text(FAKE_PIP.format(python=sys.executable))
    script.chmod(0o755)
    pinned = {SDIST: files.sha256_of(source / SDIST)}
    monkeypatch.setenv("FAKE_SOURCE", str(source / SDIST))
    monkeypatch.setattr(data_fetch, "PINNED", pinned)
    monkeypatch.setattr(sys, "executable", str(script))
    return (f"import sys\nsys.executable = {str(script)!r}\n"
            f"from sameloss.data import fetch\nfetch.PINNED = {pinned!r}\n")


def _fetched(cache: Path, monkeypatch) -> Path:
    downloads = cache / "downloads"
    downloads.mkdir(parents=True)
    _fake_vader(downloads)
    monkeypatch.setattr(data_fetch, "PINNED", {})
    return data_fetch.fetch("rt-sst2", cache)[0]


def test_a_file_the_manifest_does_not_list_is_never_removed(tmp_path, monkeypatch):
    out = _fetched(tmp_path / "cache", monkeypatch)
    # a user's file beside the manifest while an output was edited: refused, nothing touched
    (out / "notes.txt").write_text("mine")
    (out / "text.txt").write_text("edited\n")
    with pytest.raises(UserError, match="notes.txt is not a file 'sameloss data fetch' wrote") as err:
        data_fetch.fetch("rt-sst2", tmp_path / "cache")
    assert "\n" not in str(err.value)
    assert (out / "notes.txt").read_text() == "mine" and (out / "text.txt").read_text() == "edited\n"
    (out / "notes.txt").unlink()
    (out / "sst2" / "mine").mkdir()  # a folder of the user's inside an output folder: the same
    with pytest.raises(UserError, match="mine is not a file"):
        data_fetch.fetch("rt-sst2", tmp_path / "cache")
    assert (out / "sst2" / "mine").is_dir()
    (out / "sst2" / "mine").rmdir()
    # only listed files left: the edited one is rebuilt (and a missing one)
    (out / "sst2" / "dev.tsv").unlink()
    assert data_fetch.fetch("rt-sst2", tmp_path / "cache")[2] is False
    assert (out / "text.txt").read_text().count("\n") == 40 and (out / "sst2" / "dev.tsv").is_file()
    assert leftovers(tmp_path / "cache") == []


def test_a_folder_named_like_the_old_temporary_build_is_left_alone(tmp_path, monkeypatch):
    legacy = tmp_path / "cache" / "rt-sst2.partial"
    legacy.mkdir(parents=True)
    (legacy / "draft.txt").write_text("mine")
    _fetched(tmp_path / "cache", monkeypatch)
    assert (legacy / "draft.txt").read_text() == "mine"


@pytest.mark.parametrize("case", ["garbage", "list", "no-files", "escape"])
def test_a_damaged_manifest_is_one_line_and_nothing_is_removed(case, tmp_path, monkeypatch, capsys):
    out = _fetched(tmp_path / "cache", monkeypatch)
    text = {"garbage": "{not json", "list": "[1, 2]", "no-files": '{"name": "rt-sst2"}',
            "escape": json.dumps({"files": {"../downloads/x": "0" * 64}})}[case]
    (out / "manifest.json").write_text(text)
    before = sorted(p.name for p in out.rglob("*"))
    assert main(["data", "fetch", "rt-sst2", "--cache", str(tmp_path / "cache")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "manifest.json is damaged" in err[0]
    assert sorted(p.name for p in out.rglob("*")) == before


def test_cache_or_downloads_that_are_files_are_one_line(tmp_path, monkeypatch, capsys):
    (tmp_path / "afile").write_text("x")
    assert main(["data", "fetch", "rt-sst2", "--cache", str(tmp_path / "afile")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is not a folder" in err[0]
    monkeypatch.setenv("SAMELOSS_DATA", str(tmp_path / "afile"))
    assert main(["data", "fetch", "rt-sst2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "$SAMELOSS_DATA" in err[0]
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "downloads").write_text("x")
    assert main(["data", "fetch", "rt-sst2", "--cache", str(tmp_path / "cache")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "downloads is not a folder" in err[0]
    assert (tmp_path / "afile").read_text() == "x" and (tmp_path / "cache" / "downloads").read_text() == "x"


@pytest.mark.parametrize("how", ["--cache", "SAMELOSS_DATA"])
def test_a_relative_cache_is_resolved_before_the_downloader_runs_elsewhere(how, tmp_path, monkeypatch, fake_pip,
                                                                          capsys):
    monkeypatch.chdir(tmp_path)
    if how == "--cache":
        args = ["data", "fetch", "rt-sst2", "--cache", "relcache"]
    else:
        monkeypatch.setenv("SAMELOSS_DATA", "relcache")
        args = ["data", "fetch", "rt-sst2"]
    assert main(args) == 0, capsys.readouterr().err
    assert (tmp_path / "relcache" / "downloads" / SDIST).is_file()
    assert sorted(p.name for p in (tmp_path / "relcache" / "downloads").iterdir()) == [SDIST]
    assert (tmp_path / "relcache" / "rt-sst2" / "manifest.json").is_file()


def test_progress_lines_while_a_download_runs(tmp_path, monkeypatch, fake_pip, capsys):
    monkeypatch.setenv("FAKE_SLEEP", "1")
    monkeypatch.setenv("SAMELOSS_PROGRESS_SECONDS", "0.2")
    assert main(["data", "fetch", "rt-sst2", "--cache", str(tmp_path / "cache")]) == 0
    out = capsys.readouterr()
    assert out.err == ""
    lines = out.out.splitlines()
    assert "rt-sst2: downloading vaderSentiment==3.3.2 (pip download)" in lines
    ticks = [line for line in lines if "pip download vaderSentiment==3.3.2:" in line]
    assert ticks and all("(Collecting vaderSentiment==3.3.2)" in line for line in ticks)


HOLDER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from sameloss import files
    with files.folder_lock(sys.argv[1]):
        Path(sys.argv[2]).write_text("held")
        while not Path(sys.argv[3]).exists():
            time.sleep(0.01)
""")


def test_a_second_fetch_into_one_target_gets_one_line(tmp_path, monkeypatch):
    downloads = tmp_path / "cache" / "downloads"
    downloads.mkdir(parents=True)
    _fake_vader(downloads)
    ready, release = tmp_path / "ready", tmp_path / "release"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path / "cache" / "rt-sst2"), str(ready),
                               str(release)], env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        wait_for(lambda: ready.exists() or holder.poll() is not None, "the holder")
        result = run_cli(["data", "fetch", "rt-sst2", "--cache", tmp_path / "cache"],
                         prelude="from sameloss.data import fetch\nfetch.PINNED = {}\n")
        line = error_line(result)
        assert "is in use by another sameloss process" in line and f"pid {holder.pid}" in line
        assert not (tmp_path / "cache" / "rt-sst2").exists()
    finally:
        release.write_text("go")
        holder.wait()


def test_a_full_disk_leaves_nothing_and_the_rerun_works(tmp_path, fake_pip):
    cache = tmp_path / "cache"
    # the download fails part-way: no truncated package is kept (the rerun would refuse it)
    result = run_cli(["data", "fetch", "rt-sst2", "--cache", cache], prelude=fake_pip, fsize=200)
    assert "pip download vaderSentiment==3.3.2 failed" in error_line(result)
    assert sorted(p.name for p in (cache / "downloads").iterdir()) == []
    assert not (cache / "rt-sst2").exists() and leftovers(cache) == []
    # the download fits, the conversion does not (text.txt is larger than the fake sdist)
    fits = Path(os.environ["FAKE_SOURCE"]).stat().st_size
    result = run_cli(["data", "fetch", "rt-sst2", "--cache", cache], prelude=fake_pip, fsize=fits)
    assert "cannot write" in error_line(result) and "rt-sst2" in error_line(result)
    assert not (cache / "rt-sst2").exists() and leftovers(cache) == [] and leftovers(cache / "downloads") == []
    # space again: the rerun works
    result = run_cli(["data", "fetch", "rt-sst2", "--cache", cache], prelude=fake_pip)
    assert result.returncode == 0, result.stderr
    assert (cache / "rt-sst2" / "manifest.json").is_file()


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_a_killed_fetch_leaves_no_downloader_behind(sig, tmp_path, fake_pip):
    pid_file = tmp_path / "child.pid"
    proc = start_cli(["data", "fetch", "rt-sst2", "--cache", tmp_path / "cache"], prelude=fake_pip,
                     env={"FAKE_PID": str(pid_file), "FAKE_SLEEP": "600"})
    try:
        wait_for(lambda: pid_file.exists() and pid_file.read_text(), "the downloader to start")
        child = int(pid_file.read_text())
        assert alive(child)
        proc.send_signal(sig)
        proc.communicate(timeout=60)
        wait_for(lambda: not alive(child), "the downloader to end with the fetch", seconds=60)
    finally:
        proc.kill()
        proc.wait()
    assert not (tmp_path / "cache" / "rt-sst2").exists()


# ---- an unpack cut short (issue 40) -------------------------------------------------------
def _fake_fortunes(downloads: Path) -> Path:
    """A small stand-in for Debian's fortunes package (one fortune file with its .dat and
    a link, as the real one has), built with dpkg-deb, in ``downloads``."""
    pkg = downloads.parent / "pkg"
    games = pkg / "usr" / "share" / "games" / "fortunes"
    games.mkdir(parents=True)
    (games / "art").write_text("a fortune\n%\nanother\none\n%\n")
    (games / "art.dat").write_bytes(b"\0" * 24)
    (games / "art.u8").symlink_to("art")
    (pkg / "DEBIAN").mkdir()
    (pkg / "DEBIAN" / "control").write_text("Package: fortunes\nVersion: 1.0\nArchitecture: all\n"
                                            "Maintainer: t <t@example.org>\nDescription: test\n")
    deb = downloads / "fortunes_1.0_all.deb"
    subprocess.run(["dpkg-deb", "--build", "--root-owner-group", str(pkg), str(deb)], check=True,
                   capture_output=True)
    return downloads / "fortunes_1.0_all"


@pytest.mark.skipif(subprocess.run(["which", "dpkg-deb"], capture_output=True).returncode != 0,
                    reason="needs dpkg-deb")
@pytest.mark.parametrize("cut", ["empty", "a-file-missing", "a-file-short"])
def test_an_unpack_cut_short_is_unpacked_again(tmp_path, cut):
    downloads = tmp_path / "cache" / "downloads"
    downloads.mkdir(parents=True)
    unpacked = _fake_fortunes(downloads)
    assert (data_fetch.fetch("fortunes", tmp_path / "cache")[0] / "text.txt").read_text() == "a fortune\nanother one\n"
    shutil.rmtree(tmp_path / "cache" / "fortunes")
    art = unpacked / "usr" / "share" / "games" / "fortunes" / "art"
    if cut == "empty":  # the case: an empty folder left by an interrupted unpack
        shutil.rmtree(unpacked)
        unpacked.mkdir()
    elif cut == "a-file-missing":
        art.unlink()
    else:
        art.write_text("a fortune\n")
    lines = []
    out, _, cached = data_fetch.fetch("fortunes", tmp_path / "cache", log=lines.append)
    assert not cached and (out / "text.txt").read_text() == "a fortune\nanother one\n"
    assert any("unpacking fortunes_1.0_all.deb" in line for line in lines), lines
    assert art.read_text() == "a fortune\n%\nanother\none\n%\n" and leftovers(downloads) == []


@pytest.mark.skipif(subprocess.run(["which", "dpkg-deb"], capture_output=True).returncode != 0,
                    reason="needs dpkg-deb")
def test_a_users_file_in_an_unpacked_package_is_named_in_one_line_and_kept(tmp_path, capsys):
    downloads = tmp_path / "cache" / "downloads"
    downloads.mkdir(parents=True)
    unpacked = _fake_fortunes(downloads)
    assert main(["data", "fetch", "fortunes", "--cache", str(tmp_path / "cache")]) == 0
    shutil.rmtree(tmp_path / "cache" / "fortunes")
    (unpacked / "usr" / "notes.txt").write_text("mine")
    capsys.readouterr()
    assert main(["data", "fetch", "fortunes", "--cache", str(tmp_path / "cache")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{unpacked / 'usr' / 'notes.txt'} is not a file of fortunes_1.0_all.deb" in err[0]
    assert (unpacked / "usr" / "notes.txt").read_text() == "mine"
