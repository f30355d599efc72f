"""The folder primitives every writer shares (``sameloss.files``): the lock that keeps two
processes out of one folder, the atomic folder build, file modes under the umask."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sameloss import files, storage
from sameloss.errors import UserError

HOLDER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from sameloss import files
    with files.folder_lock(sys.argv[1]):
        Path(sys.argv[2]).write_text("held")
        while not Path(sys.argv[3]).exists():
            time.sleep(0.01)
""")


def _start_holder(tmp_path: Path, folder: Path):
    ready, release = tmp_path / "ready", tmp_path / "release"
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(folder), str(ready), str(release)],
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    # a safety net for a broken child, not a timing assertion
    for _ in range(3000):
        if ready.exists() or proc.poll() is not None:
            break
        import time
        time.sleep(0.01)
    assert ready.exists(), "the holder process did not take the lock"
    return proc, release


def test_a_second_process_is_refused_with_the_holders_pid(tmp_path):
    folder = tmp_path / "runs" / "base"
    proc, release = _start_holder(tmp_path, folder)
    try:
        with pytest.raises(UserError) as err:
            with files.folder_lock(folder):
                pass
        msg = str(err.value)
        assert f"pid {proc.pid}" in msg and str(folder) in msg and "\n" not in msg
    finally:
        release.write_text("go")
        proc.wait()
    # released: the lock file is gone and the lock can be taken
    assert not files.lock_path(folder).exists()
    with files.folder_lock(folder):
        pass


def test_a_lock_left_by_a_killed_process_is_taken_over(tmp_path):
    folder = tmp_path / "exp"
    proc, _ = _start_holder(tmp_path, folder)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert files.lock_path(folder).exists()  # the stale file stays behind...
    with files.folder_lock(folder):  # ...but its holder is gone: no error
        assert f"{os.getpid()}" == files.lock_path(folder).read_text().splitlines()[0]


def test_the_lock_is_reentrant_within_one_process_and_lives_beside_the_folder(tmp_path):
    folder = tmp_path / "a"
    with files.folder_lock(folder) as path:
        assert path == tmp_path / ".a.lock" and not folder.exists()
        with files.folder_lock(folder):
            assert files.holds_lock(folder)
        assert files.holds_lock(folder) and path.exists()
    assert not files.holds_lock(folder) and not path.exists()


def test_a_reentrant_lock_is_held_until_its_last_holder_ends_in_any_order(tmp_path):
    """Two Studies of one folder in one process (the second re-entrant), the first closed
    first: the second still holds the lock (it was released under it, and the second's end
    raised KeyError from a garbage-collector finalizer)."""
    folder = tmp_path / "a"
    outer, inner = files.folder_lock(folder), files.folder_lock(folder)
    path = outer.__enter__()
    inner.__enter__()
    outer.__exit__(None, None, None)
    assert files.holds_lock(folder) and path.exists()
    inner.__exit__(None, None, None)
    assert not files.holds_lock(folder) and not path.exists() and not tmp_path.joinpath("a").exists()


def _add_ones(path: str, times: int) -> None:
    for _ in range(times):
        with files.update_lock(path):
            value = int(Path(path).read_text())
            Path(path).write_text(str(value + 1))


def test_the_update_lock_serialises_writers_and_leaves_no_lock_file(tmp_path):
    """Four processes each add 1 fifty times under the lock: none is lost (the lock file is
    removed by each last holder, and a waiter that locked the removed file starts again),
    and no ``.<name>.lock`` stays behind (issue 39)."""
    import multiprocessing

    counter = tmp_path / "measurements.json"
    counter.write_text("0")
    ctx = multiprocessing.get_context("fork")
    workers = [ctx.Process(target=_add_ones, args=(str(counter), 50)) for _ in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
    assert [w.exitcode for w in workers] == [0, 0, 0, 0]
    assert counter.read_text() == "200"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["measurements.json"]


def test_building_renames_into_place_only_at_the_end(tmp_path):
    target = tmp_path / "corpus"
    with files.building(target) as tmp:
        assert not target.exists() and tmp.parent == tmp_path and tmp.name.startswith(".corpus.partial-")
        (tmp / "shard.npy").write_bytes(b"x")
    assert (target / "shard.npy").read_bytes() == b"x"
    assert not (target / files.PARTIAL_MARKER).exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus"]  # no partial, no lock file left


def test_a_failed_build_leaves_nothing_and_a_full_disk_is_one_line(tmp_path):
    target = tmp_path / "out"
    with pytest.raises(RuntimeError):
        with files.building(target) as tmp:
            (tmp / "half").write_text("half")
            raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(UserError) as err:
        with files.building(target) as tmp:
            raise OSError(errno.ENOSPC, "No space left on device")
    assert str(err.value) == f"cannot write {target}: No space left on device"
    assert list(tmp_path.iterdir()) == []


def test_a_disk_too_full_for_the_marker_leaves_no_partial_folder(tmp_path, monkeypatch):
    def full(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "write_text", full)  # the marker is the first file a build writes
    with pytest.raises(UserError, match="No space left on device"):
        with files.building(tmp_path / "out"):
            pass
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("exc, reason", [
    # safetensors (SafetensorError) and tokenizers (Exception) carry Rust's io::Error text
    (Exception("Error while serializing: I/O error: File too large (os error 27)"), "File too large"),
    (Exception("No space left on device (os error 28)"), "No space left on device"),
    # numpy's np.save to a path after a short write: an OSError without an errno
    (OSError("7008 requested and 936 written"), "only 936 of 7008 bytes were written"),
])
def test_a_full_disk_reported_without_an_errno_is_one_line_too(exc, reason, tmp_path):
    target = tmp_path / "out"
    with pytest.raises(UserError) as err:
        with files.building(target):
            raise exc
    assert str(err.value).startswith(f"cannot write {target}: {reason}")
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(UserError, match=reason):
        with storage.storage_errors(target):
            raise exc
    with pytest.raises(Exception, match="os error 2"):  # not a storage error: not ours to word
        with files.building(target):
            raise Exception("No such file or directory (os error 2)")


def test_building_refuses_a_folder_that_holds_anything_and_replaces_only_when_asked(tmp_path):
    target = tmp_path / "out"
    target.mkdir()
    (target / "thesis.tex").write_text("mine")
    with pytest.raises(UserError, match="already exists and is not empty"):
        with files.building(target):
            pass
    assert (target / "thesis.tex").read_text() == "mine"
    with files.building(target, replace=True) as tmp:  # the caller proved it is its own
        (tmp / "new").write_text("new")
    assert sorted(p.name for p in target.iterdir()) == ["new"]
    empty = tmp_path / "empty"
    empty.mkdir()
    with files.building(empty) as tmp:
        (tmp / "f").write_text("f")
    assert (empty / "f").exists()


def test_an_interrupted_build_does_not_block_the_rerun_and_only_marked_partials_go(tmp_path):
    target = tmp_path / "out"
    stale = tmp_path / ".out.partial-killed"
    stale.mkdir()
    (stale / files.PARTIAL_MARKER).write_text("x")
    (stale / "half.npy").write_text("half")
    users = tmp_path / ".out.partial-users"  # looks alike but carries no marker
    users.mkdir()
    (users / "notes").write_text("mine")
    with files.building(target) as tmp:
        (tmp / "done").write_text("ok")
    assert not stale.exists() and (users / "notes").read_text() == "mine" and (target / "done").exists()


def test_written_files_and_built_folders_honour_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        files.atomic_write_text(tmp_path / "config.toml", "a = 1\n")
        assert (tmp_path / "config.toml").stat().st_mode & 0o777 == 0o644
        with files.building(tmp_path / "built") as tmp:
            pass
        assert (tmp_path / "built").stat().st_mode & 0o777 == 0o755
    finally:
        os.umask(old)


def test_a_storage_error_hidden_in_a_library_error_is_recognised(tmp_path):
    """safetensors and tokenizers (Rust) put "(os error N)" in their own exception types;
    torch's writer raises a RuntimeError whose context is the OSError."""
    rust = Exception("Error while serializing: I/O error: No space left on device (os error 28)")
    assert storage.storage_reason(rust) == "No space left on device"
    try:
        try:
            raise OSError(errno.EFBIG, "File too large")
        except OSError:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")
    except RuntimeError as exc:
        torch_like = exc
    assert storage.storage_reason(torch_like) == "File too large"
    assert storage.storage_reason(RuntimeError("shape mismatch (os error 2)")) is None  # ENOENT: not storage
    assert storage.storage_reason(ValueError("bad")) is None
    with pytest.raises(UserError) as err:
        with storage.storage_errors(tmp_path / "x"):
            raise rust
    assert str(err.value) == f"cannot write {tmp_path / 'x'}: No space left on device"
    with pytest.raises(UserError, match="File too large"):
        with files.building(tmp_path / "built"):
            raise torch_like
    assert list(tmp_path.iterdir()) == []


def test_the_lock_removes_the_empty_folders_it_made_and_keeps_any_other(tmp_path):
    with files.folder_lock(tmp_path / "a" / "b" / "run"):
        assert (tmp_path / "a" / "b").is_dir()
    assert list(tmp_path.iterdir()) == []  # a refused command leaves no empty runs/ behind
    with files.folder_lock(tmp_path / "a" / "b" / "run"):
        (tmp_path / "a" / "b" / "run").mkdir()
    assert (tmp_path / "a" / "b" / "run").is_dir()  # what the block wrote stays, with its parents
    (tmp_path / "c").mkdir()
    with files.folder_lock(tmp_path / "c" / "run"):
        pass
    assert (tmp_path / "c").is_dir()  # it existed before: never removed


def test_an_error_naming_the_temporary_folder_names_the_target(tmp_path):
    target = tmp_path / "out"
    with pytest.raises(UserError) as err:
        with files.building(target) as tmp:
            raise UserError(f"cannot write {tmp / 'checkpoints'}: No space left on device")
    assert str(err.value) == f"cannot write {target / 'checkpoints'}: No space left on device"


# ---- a file a user names (--out FILE), issue 40 ------------------------------------------
def test_an_out_file_is_replaced_only_when_sameloss_wrote_it_and_a_link_never(tmp_path):
    out = tmp_path / "rows.csv"
    assert files.write_output(out, "a\n1\n") is False
    assert files.is_own_output(out) and files.write_output(out, "a\n2\n") is True  # its own: replaced
    assert out.read_text() == "a\n2\n"
    with open(out, "a") as f:  # a user's edit makes it theirs
        f.write("3\n")
    with pytest.raises(UserError, match=r"rows.csv exists and was not written by sameloss; not replacing it .*--force"):
        files.write_output(out, "a\n4\n")
    assert out.read_text() == "a\n2\n3\n"
    assert files.write_output(out, "a\n4\n", force=True) is True and files.is_own_output(out)
    mine = tmp_path / "notes.txt"
    mine.write_text("my notes")
    link = tmp_path / "link.csv"
    link.symlink_to(mine)
    for force in (False, True):
        with pytest.raises(UserError, match="link.csv is a symbolic link; sameloss never replaces a link"):
            files.write_output(link, "x", force=force)
    assert link.is_symlink() and mine.read_text() == "my notes" and not files.is_own_output(mine)
    with pytest.raises(UserError, match="is a folder"):
        files.check_output(tmp_path, force=True)


def test_the_list_of_outputs_is_appended_once_per_content_and_a_failed_write_leaves_none(tmp_path, monkeypatch):
    out = tmp_path / "a" / "r.json"
    out.parent.mkdir()
    files.write_output(out, "[]")
    files.write_output(out, "[]")
    lines = (out.parent / files.OUTPUTS).read_text().splitlines()
    assert lines[0].startswith("#") and len(lines) == 2 and lines[1].endswith("  r.json")

    def full(*args):
        raise OSError(errno.ENOSPC, "No space left on device")

    fresh = tmp_path / "b" / "r.json"
    fresh.parent.mkdir()
    monkeypatch.setattr(os, "replace", full)
    with pytest.raises(UserError, match="cannot write .*r.json: No space left on device"):
        files.write_output(fresh, "[]")
    assert list(fresh.parent.iterdir()) == []


def test_foreign_in_run_names_what_sameloss_did_not_write(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints" / "step_0000002").mkdir(parents=True)
    (run / "checkpoints" / ".tmp-step_0000004-77").mkdir()
    (run / "tb").mkdir()
    (run / "tb" / "events").write_text("x")
    for name in (files.RUN_MARKER, "config.toml", "metrics.jsonl", "summary.json", ".tmp-summary.json-ab12"):
        (run / name).write_text("x")
    for name in files.CHECKPOINT_FILES:
        (run / "checkpoints" / "step_0000002" / name).write_text("x")
    files.write_output(run / "m.csv", "a\n")
    assert files.foreign_in_run(run) == []
    (run / "notes.txt").write_text("mine")
    (run / "checkpoints" / "step_0000002" / "plot.png").write_text("mine")
    (run / "checkpoints" / "best").mkdir()
    (run / "m.csv").write_text("edited")
    assert files.foreign_in_run(run) == ["checkpoints/best", "checkpoints/step_0000002/plot.png", "m.csv",
                                         "notes.txt"]
