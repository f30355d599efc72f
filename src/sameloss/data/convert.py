"""Converters from the packages' own file formats (a Debian bible, R's lazy-load data,
WordNet's data files, fortune files, the vaderSentiment ratings, Orange's .tab) to text and
GLUE-format TSVs. Pure functions of bytes and text, so each is tested on small files in the
same format; ``data.fetch`` calls them on what it downloaded."""

from __future__ import annotations

import gzip
import re
import struct
import random
import zlib
from pathlib import Path


DEV_FRACTION = 0.1  # the share of a set's rows that write_sst2/write_pairs put in dev.tsv


def bible_chapters(text: str) -> list[str]:
    """The output of ``bible gen1:1-rev22:21`` (chapter headings, verses ``  N text`` with
    wrapped continuation lines) as one string per chapter."""
    chapters, verses = [], []
    for line in text.splitlines():
        if not line.strip():
            continue
        m = re.match(r"^\s+\d+\s+(.*)$", line)
        if m:
            verses.append(m.group(1).strip())
        elif re.match(r"^(\d )?[A-Z][A-Za-z ]+ \d+$", line.strip()):  # "Genesis 1", "1 Kings 3"
            if verses:
                chapters.append(" ".join(verses))
            verses = []
        elif verses:
            verses[-1] += " " + line.strip()
    if verses:
        chapters.append(" ".join(verses))
    return chapters


def _r_strings(data: bytes) -> list[str | None]:
    """A character vector from R's XDR serialization (``serialize(x, NULL)``, version 2 or 3)."""
    if data[:2] != b"X\n":
        raise ValueError("not an XDR R serialization")
    pos = 2
    version = struct.unpack(">i", data[pos:pos + 4])[0]
    pos += 12
    if version == 3:
        n = struct.unpack(">i", data[pos:pos + 4])[0]
        pos += 4 + n
    flags = struct.unpack(">i", data[pos:pos + 4])[0]
    if flags & 0xFF != 16:  # STRSXP
        raise ValueError(f"R object of type {flags & 0xFF} is not a character vector")
    length = struct.unpack(">i", data[pos + 4:pos + 8])[0]
    pos += 8
    out: list[str | None] = []
    for _ in range(length):
        _, n = struct.unpack(">ii", data[pos:pos + 8])
        pos += 8
        if n == -1:
            out.append(None)  # NA_character_
        else:
            out.append(data[pos:pos + n].decode("utf-8", "replace"))
            pos += n
    return out


def _r_index(data: bytes) -> dict[str, tuple[int, int]]:
    """``variables`` of an R lazy-load index (``.rdx``): name → (offset, length) in the ``.rdb``."""
    # the index is a named list; its "variables" element is a named list of int pairs. Read
    # the int pairs and the names in order (the layout R writes), not a general parser.
    pairs = [struct.unpack(">ii", data[m.end():m.end() + 8])
             for m in re.finditer(re.escape(struct.pack(">ii", 13, 2)), data)]
    names_at = data.find(b"\x00\x00\x00\x05names")
    if names_at < 0:
        raise ValueError("no names in the R index")
    pos = names_at + 9 + 4  # "names", then the STRSXP flags
    n = struct.unpack(">i", data[pos:pos + 4])[0]
    pos += 4
    names = []
    for _ in range(n):
        _, length = struct.unpack(">ii", data[pos:pos + 8])
        names.append(data[pos + 8:pos + 8 + length].decode())
        pos += 8 + length
    return dict(zip(names, pairs[:n]))


def read_r_lazyload(rdx: bytes, rdb: bytes) -> dict[str, list[str | None]]:
    """The character vectors of an R package's lazy-load data base (``Rdata.rdx`` gzip'd
    index + ``Rdata.rdb``, zlib-compressed entries behind a 4-byte length)."""
    index = _r_index(gzip.decompress(rdx) if rdx[:2] == b"\x1f\x8b" else zlib.decompress(rdx[4:]))
    out = {}
    for name, (offset, length) in index.items():
        entry = rdb[offset:offset + length]
        out[name] = _r_strings(zlib.decompress(entry[4:]))
    return out


def austen_paragraphs(lines: list[str | None]) -> list[str]:
    """A novel's lines (blank lines between paragraphs) as one string per paragraph."""
    paragraphs, current = [], []
    for line in lines:
        if line is None or not line.strip():
            if current:
                paragraphs.append(" ".join(current))
            current = []
        else:
            current.append(line.strip())
    if current:
        paragraphs.append(" ".join(current))
    return paragraphs


def wordnet_glosses(data_file: str) -> list[tuple[str, str]]:
    """``(first word, definition)`` of every synset in a WordNet ``data.*`` file (license
    lines start with two spaces; the gloss follows ``|``; examples in quotes are dropped)."""
    out = []
    for line in data_file.splitlines():
        if line.startswith("  ") or "|" not in line:
            continue
        head, gloss = line.split("|", 1)
        fields = head.split()
        word = fields[4].replace("_", " ")
        definition = gloss.split(";")[0].strip().strip('"').strip()
        if definition:
            out.append((word, definition))
    return out


def fortunes_split(text: str) -> list[str]:
    """Fortunes (separated by lines holding only ``%``) as one line each."""
    return [" ".join(chunk.split()) for chunk in re.split(r"(?m)^%\s*$", text) if chunk.strip()]


def rt_sentences(ground_truth: str) -> list[tuple[str, int]]:
    """``(sentence, label)`` from vaderSentiment's ``movieReviewSnippets_GroundTruth.txt``
    (``id<TAB>mean rating<TAB>sentence``): label 1 if the mean rating is > 0, 0 if < 0."""
    out = []
    for line in ground_truth.splitlines():
        parts = line.split("\t")
        if len(parts) < 3:
            continue
        score = float(parts[1])
        if score != 0:
            out.append((" ".join(parts[2].split()), int(score > 0)))
    return out


def orange_tab(text: str) -> tuple[list[str], list[str]]:
    """``(classes, texts)`` of an Orange ``.tab`` file with columns ``Category``, ``Text``
    (three header lines: names, types, roles)."""
    lines = text.split("\n")
    header = lines[0].split("\t")
    if "Category" not in header or "Text" not in header:
        raise ValueError(f"unexpected Orange table columns {header}")
    ci, ti = header.index("Category"), header.index("Text")
    classes, texts = [], []
    for line in lines[3:]:
        parts = line.split("\t")
        if len(parts) > max(ci, ti) and parts[ti].strip():
            classes.append(parts[ci])
            texts.append(" ".join(parts[ti].split()))
    return classes, texts


def _clean(text: str) -> str:
    return " ".join(text.replace("\t", " ").split())


def write_sst2(folder: Path, rows: list[tuple[str, int]], seed: int = 0,
               dev: list[tuple[str, int]] | None = None) -> None:
    """``train.tsv`` and ``dev.tsv`` (header ``sentence<TAB>label``); without ``dev``, a
    seeded ``DEV_FRACTION`` of ``rows`` is the dev split."""
    folder.mkdir(parents=True, exist_ok=True)
    if dev is None:
        order = list(range(len(rows)))
        random.Random(seed).shuffle(order)
        n_dev = max(1, round(DEV_FRACTION * len(rows)))
        dev_idx = set(order[:n_dev])
        dev = [r for i, r in enumerate(rows) if i in dev_idx]
        rows = [r for i, r in enumerate(rows) if i not in dev_idx]
    for name, split in (("train.tsv", rows), ("dev.tsv", dev)):
        with (folder / name).open("w", encoding="utf-8", newline="") as f:
            f.write("sentence\tlabel\n")
            f.writelines(f"{_clean(s)}\t{y}\n" for s, y in split)


def write_pairs(folder: Path, pairs: list[tuple[str, str]], seed: int = 0, n: int = 20_000) -> None:
    """An RTE-format matching task from ``(a, b)`` pairs: label 0 (entailment) when ``b``
    belongs to ``a``, 1 when ``b`` is another pair's (drawn at random); ``n`` examples."""
    rng = random.Random(seed)
    picks = rng.sample(range(len(pairs)), min(n, len(pairs)))
    rows = []
    for i in picks:
        a, b = pairs[i]
        if rng.random() < 0.5:
            rows.append((a, b, 0))
        else:
            j = rng.randrange(len(pairs))
            while pairs[j][1] == b:
                j = rng.randrange(len(pairs))
            rows.append((a, pairs[j][1], 1))
    n_dev = max(1, round(DEV_FRACTION * len(rows)))
    folder.mkdir(parents=True, exist_ok=True)
    for name, split in (("train.tsv", rows[n_dev:]), ("dev.tsv", rows[:n_dev])):
        with (folder / name).open("w", encoding="utf-8", newline="") as f:
            f.write("sentence1\tsentence2\tlabel\n")
            f.writelines(f"{_clean(a)}\t{_clean(b)}\t{y}\n" for a, b, y in split)


def write_lines(path: Path, docs: list[str]) -> None:
    path.write_text("".join(_clean(d) + "\n" for d in docs if d.strip()), encoding="utf-8")
