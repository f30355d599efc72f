"""``sameloss corpus prepare`` and the corpus on load lose nothing and refuse bad input in
one line (issue 20): non-UTF-8 or binary text, bad options, a full disk, a kill, damaged
corpora of every kind."""

from __future__ import annotations

import hashlib
import json
import shutil
import signal

import numpy as np
import pytest

from sameloss.cli import main
from sameloss.errors import UserError
from sameloss.languages import make_language
from sameloss.languages.text import MAX_LEN, Corpus, prepare_corpus, read_documents
from sameloss.data.toy import toy_text
from helpers.datacli import error_line, leftovers, run_cli, start_cli, wait_for


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    return toy_text(tmp_path_factory.mktemp("toy"), n_corpus=200)


@pytest.fixture(scope="module")
def prepared(toy, tmp_path_factory):
    out = tmp_path_factory.mktemp("prep") / "corpus"
    prepare_corpus([toy["corpus"]], out, vocab=100, max_len=16, heldout=0.1)
    return out


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("sameloss"), err
    return err[0]


# ---- input text ----------------------------------------------------------------------------
@pytest.mark.parametrize("name, data, message", [
    ("latin1.txt", "café au lait\n".encode("latin-1"), "is not UTF-8 text (byte 0xe9 at offset 3)"),
    ("latin1.jsonl", '{"text": "café"}\n'.encode("latin-1"), "is not UTF-8 text (byte 0xe9"),
    ("random.txt", bytes(range(256)) * 4, "looks binary (a NUL byte at offset 0)"),
    ("zeros.jsonl", b"\x00" * 64, "looks binary"),
    ("junk.parquet", b"PAR1 not really", "is not a readable Parquet file"),
], ids=["latin1-text", "latin1-jsonl", "binary-text", "nul-jsonl", "junk-parquet"])
def test_non_utf8_or_binary_input_is_one_line(name, data, message, tmp_path, capsys):
    if name.endswith(".parquet"):
        try:
            import pyarrow  # noqa: F401
        except ImportError:  # without it, reading Parquet at all is the one line
            message = "needs pyarrow (pip install pyarrow)"
    (tmp_path / name).write_bytes(data)
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
        read_documents(tmp_path / name)
    assert main(["corpus", "prepare", str(tmp_path / name), "--out", str(tmp_path / "c")]) == 2
    assert message.split(" (")[0] in _one_line(capsys)
    assert not (tmp_path / "c").exists() and leftovers(tmp_path) == []


def test_a_byte_order_mark_is_not_text(tmp_path):
    (tmp_path / "bom.txt").write_bytes("\ufefffirst doc\nsecond doc\n".encode("utf-8"))
    assert read_documents(tmp_path / "bom.txt") == ["first doc", "second doc"]
    (tmp_path / "bom.jsonl").write_bytes('\ufeff{"text": "a"}\n'.encode("utf-8"))
    assert read_documents(tmp_path / "bom.jsonl") == ["a"]


# ---- options --------------------------------------------------------------------------------
def test_bad_options_are_one_line_before_any_work(toy, tmp_path, capsys):
    corpus = str(toy["corpus"])
    with pytest.raises(SystemExit) as exit_:
        main(["corpus", "prepare", corpus, "--seed", "-1", "--out", str(tmp_path / "c")])
    assert exit_.value.code == 2 and "--seed" in _one_line(capsys)
    with pytest.raises(UserError, match="--seed must be an integer >= 0"):
        prepare_corpus([corpus], tmp_path / "c", seed=-1)
    # a hazard is refused with its estimate, before anything is read or allocated
    assert main(["corpus", "prepare", corpus, "--max-len", "100000", "--out", str(tmp_path / "c")]) == 2
    line = _one_line(capsys)
    assert "--max-len 100000 is too long" in line and "37.3 GiB" in line and f"limit {MAX_LEN}" in line
    # --out an empty file: said to be a file (it is not "not empty")
    (tmp_path / "afile").write_text("")
    assert main(["corpus", "prepare", corpus, "--out", str(tmp_path / "afile")]) == 2
    assert "is a file, not a folder" in _one_line(capsys)
    # a tokenizer folder without a tokenizer: a whole sentence naming what it looked for
    (tmp_path / "tok").mkdir()
    assert main(["corpus", "prepare", corpus, "--tokenizer", str(tmp_path / "tok"), "--out", str(tmp_path / "c")]) == 2
    line = _one_line(capsys)
    assert "holds no tokenizer (none of tokenizer.json" in line and line.endswith("to train one")
    assert not (tmp_path / "c").exists()


def test_threads_option_and_an_empty_out_folder(toy, tmp_path, capsys):
    (tmp_path / "c").mkdir()
    assert main(["corpus", "prepare", str(toy["corpus"]), "--vocab", "60", "--max-len", "12", "--threads", "1",
                 "--out", str(tmp_path / "c")]) == 0
    assert Corpus(tmp_path / "c").max_len == 12 and leftovers(tmp_path) == []


# ---- full disk, kill -9 -----------------------------------------------------------------------
def test_a_full_disk_is_one_line_leaves_nothing_and_the_rerun_works(toy, tmp_path):
    args = ["corpus", "prepare", toy["corpus"], "--vocab", "60", "--max-len", "12", "--out", tmp_path / "c"]
    result = run_cli(args, fsize=2000)  # the tokenizer.json alone is larger
    assert f"cannot write {tmp_path / 'c'}: " in error_line(result)
    assert not (tmp_path / "c").exists() and leftovers(tmp_path) == []
    result = run_cli(args)
    assert result.returncode == 0, result.stderr
    assert Corpus(tmp_path / "c").n_words <= 60


STALL = """
import numpy as np, time
save = np.save
def stalled(path, *a, **k):
    save(path, *a, **k)
    time.sleep(600)
np.save = stalled
"""


def test_a_kill_after_the_folder_appeared_does_not_block_the_rerun(toy, tmp_path):
    args = ["corpus", "prepare", toy["corpus"], "--vocab", "60", "--max-len", "12", "--out", tmp_path / "c"]
    proc = start_cli(args, prelude=STALL)  # stops after writing its first shard
    try:
        wait_for(lambda: any(p.glob("train-*.npy") for p in tmp_path.glob(".c.partial-*")), "the first shard")
        assert not (tmp_path / "c").exists()  # the corpus appears only when complete
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        proc.kill()
    result = run_cli(args)
    assert result.returncode == 0, result.stderr
    assert Corpus(tmp_path / "c").n_sequences("train") > 0 and leftovers(tmp_path) == []


# ---- damaged corpora on load -----------------------------------------------------------------
def _copy(prepared, tmp_path):
    out = tmp_path / "corpus"
    shutil.copytree(prepared, out)
    return out


def _meta(folder):
    return json.loads((folder / "meta.json").read_text())


def _set_meta(folder, meta):
    (folder / "meta.json").write_text(json.dumps(meta))


def _resum(folder, name):
    """Update a shard's recorded checksum to match its (damaged) bytes."""
    meta = _meta(folder)
    for split in meta["splits"].values():
        for s in split["shards"]:
            if s["file"] == name:
                s["sha256"] = hashlib.sha256((folder / name).read_bytes()).hexdigest()
    _set_meta(folder, meta)


def _damage(case, c):
    shard = c / "train-00000.npy"
    meta = _meta(c)
    if case == "meta-garbage":
        (c / "meta.json").write_text("{garbage")
    elif case == "meta-list":
        (c / "meta.json").write_text("[1, 2, 3]")
    elif case == "meta-no-max-len":
        del meta["max_len"]
        _set_meta(c, meta)
    elif case == "meta-max-len-huge":
        meta["max_len"] = 100_000
        _set_meta(c, meta)
    elif case == "meta-shard-escapes":
        meta["splits"]["train"]["shards"][0]["file"] = "../elsewhere.npy"
        _set_meta(c, meta)
    elif case in ("shard-truncated", "shard-truncated-resummed"):
        shard.write_bytes(shard.read_bytes()[:-40])
        if case.endswith("resummed"):
            _resum(c, shard.name)
    elif case in ("shard-random", "shard-random-resummed"):
        shard.write_bytes(np.random.default_rng(0).bytes(shard.stat().st_size))
        if case.endswith("resummed"):
            _resum(c, shard.name)
    elif case == "ids-out-of-range":
        arr = np.load(shard)
        arr[1, 3] = meta["n_words"] + 7
        np.save(shard, arr)
        _resum(c, shard.name)
    elif case == "ids-nan":
        arr = np.load(shard).astype(np.float32)
        arr[0, 2] = np.nan
        np.save(shard, arr)
        _resum(c, shard.name)
    elif case == "n-words-lies":
        meta["n_words"] += 5  # the pad and [CLS] in the shards would read as words
        _set_meta(c, meta)
    elif case == "tokenizer-garbage":
        (c / "tokenizer.json").write_text("{not a tokenizer")
    elif case == "tokenizer-garbage-resummed":
        (c / "tokenizer.json").write_text('{"version": "1.0"}')
        meta["tokenizer_sha256"] = hashlib.sha256((c / "tokenizer.json").read_bytes()).hexdigest()
        _set_meta(c, meta)


DAMAGE = {
    "meta-garbage": "meta.json is damaged (not JSON",
    "meta-list": "meta.json is damaged (a JSON list, not an object)",
    "meta-no-max-len": "meta.json is damaged (no 'max_len')",
    "meta-max-len-huge": "max_len 100000 is too long",
    "meta-shard-escapes": "is not a .npy file inside the corpus folder",
    "shard-truncated": "does not match its checksum",
    "shard-truncated-resummed": "train-00000.npy is damaged (not a token array",
    "shard-random": "does not match its checksum",
    "shard-random-resummed": "train-00000.npy is damaged (not a token array",
    "ids-out-of-range": "train-00000.npy is damaged (token id",
    "ids-nan": "train-00000.npy is damaged (dtype float32, expected uint16)",
    "n-words-lies": "meta.json is damaged (n_words",
    "tokenizer-garbage": "tokenizer.json does not match its checksum",
    "tokenizer-garbage-resummed": "tokenizer.json is damaged (not a tokenizer",
}


@pytest.mark.parametrize("case", list(DAMAGE))
def test_a_damaged_corpus_is_one_line_on_load(case, prepared, tmp_path):
    c = _copy(prepared, tmp_path)
    _damage(case, c)
    with pytest.raises(UserError) as err:
        make_language("corpus", data=str(c))
    assert DAMAGE[case] in str(err.value) and "\n" not in str(err.value)


def test_pretrain_on_a_damaged_corpus_is_one_line(prepared, tmp_path, capsys):
    c = _copy(prepared, tmp_path)
    _damage("tokenizer-garbage-resummed", c)  # pretrain accepted this before
    assert main(["pretrain", "--out", str(tmp_path / "runs"), "name=r", "steps=1", "model.size=micro", "device=cpu",
                 "language.name=corpus", f"language.data={c}", "--no-progress"]) == 2
    assert "tokenizer.json is damaged" in _one_line(capsys)
    assert not (tmp_path / "runs" / "r").exists()


def test_rows_of_a_large_corpus_are_range_checked_as_read(prepared, tmp_path):
    c = _copy(prepared, tmp_path)
    _damage("ids-out-of-range", c)
    lang = Corpus(c, verify=False)  # beyond VERIFY_BYTES: no checksum, no full scan on load
    with pytest.raises(UserError, match="token id"):
        lang.split_batch("train")
