"""The converters from the packages' file formats, on small files written in those formats."""

from __future__ import annotations

import gzip
import struct
import zlib

from sameloss.data import convert
from sameloss.measures.glue import read_glue_tsv


def test_bible_chapters_joins_wrapped_verses():
    text = ("\nGenesis 1\n\n  1 In the beginning God created\nthe heaven.\n  2 And the earth.\n\n"
            "1 Kings 2\n\n  1 Now the days of David\n  2 I go the way\nof all the earth.\n")
    assert convert.bible_chapters(text) == ["In the beginning God created the heaven. And the earth.",
                                             "Now the days of David I go the way of all the earth."]


def _chars(s: bytes) -> bytes:
    return struct.pack(">ii", 0x00040009, len(s)) + s


def _xdr_strings(strings) -> bytes:
    out = b"X\n" + struct.pack(">iii", 2, 0x030500, 0x020300) + struct.pack(">ii", 16, len(strings))
    for s in strings:
        out += struct.pack(">ii", 0x00040009, -1) if s is None else _chars(s.encode())
    return out


def test_r_lazyload_reader_on_a_written_database():
    books = {"emma": ["EMMA", "", "Emma Woodhouse, handsome,", "clever, and rich.", None, "Second."],
             "persuasion": ["Sir Walter Elliot"]}
    rdb, pairs = b"", []
    for name, lines in books.items():
        raw = _xdr_strings(lines)
        entry = struct.pack(">i", len(raw)) + zlib.compress(raw)
        pairs.append((len(rdb), len(entry)))
        rdb += entry
    index = (b"X\n" + struct.pack(">iii", 2, 0x030500, 0x020300) + struct.pack(">ii", 19 | 512, 3)
             + struct.pack(">ii", 19 | 512, len(books))
             + b"".join(struct.pack(">iiii", 13, 2, off, n) for off, n in pairs)
             + struct.pack(">ii", 1026, 1) + _chars(b"names") + struct.pack(">ii", 16, len(books))
             + b"".join(_chars(n.encode()) for n in books) + struct.pack(">i", 254))
    got = convert.read_r_lazyload(gzip.compress(index), rdb)
    assert got == books
    assert convert.austen_paragraphs(got["emma"]) == ["EMMA", "Emma Woodhouse, handsome, clever, and rich.", "Second."]


def test_wordnet_fortunes_rt_orange_converters():
    data = ("  1 This software and database is being provided\n"
            "00001740 02 r 01 a_cappella 0 000 | without musical accompaniment; \"they performed a cappella\"  \n"
            "00001837 02 r 03 AD 0 A.D. 0 anno_Domini 0 000 | in the Christian era; used before dates  \n")
    assert convert.wordnet_glosses(data) == [("a cappella", "without musical accompaniment"),
                                              ("AD", "in the Christian era")]
    assert convert.fortunes_split("A fool\nand his money.\n%\nSecond one.\n%\n") == ["A fool and his money.",
                                                                                       "Second one."]
    gt = "1\t2.27\tThe Rock is  destined.\r\n2\t-0.6\tToo tepid\r\n3\t0.0\tNeutral.\r\n"
    assert convert.rt_sentences(gt) == [("The Rock is destined.", 1), ("Too tepid", 0)]
    tab = "Category\tText\nd\tstring\nclass\t\nearn\tprofits  up\nacq\tbuys firm\n"
    assert convert.orange_tab(tab) == (["earn", "acq"], ["profits up", "buys firm"])


def test_written_tsvs_are_valid_glue(tmp_path):
    rows = [(f"sentence {i}\twith tab", i % 2) for i in range(50)]
    convert.write_sst2(tmp_path / "s", rows)
    train, dev = (read_glue_tsv(tmp_path / "s" / f, "sst2") for f in ("train.tsv", "dev.tsv"))
    assert len(train[1]) == 45 and len(dev[1]) == 5
    assert sorted(t[0] for t in train[0] + dev[0]) == sorted(s.replace("\t", " ") for s, _ in rows)
    pairs = [(f"word{i}", f"definition {i}") for i in range(40)]
    convert.write_pairs(tmp_path / "p", pairs, n=40)
    (texts, labels) = read_glue_tsv(tmp_path / "p" / "train.tsv", "rte")
    defs = dict(pairs)
    assert all((defs[a] == b) == (y == 0) for (a, b), y in zip(texts, labels))
    assert 0 < sum(labels) < len(labels)

