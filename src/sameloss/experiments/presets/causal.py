"""The causal language in the recipes (``reproduce steps`` / ``sizes``: the paper's OPT panels).

A recipe's preset may carry a ``CausalScale``; its report then adds the causal language
after the others (only when the recipe runs by itself: ``figure1`` passes its own
languages and is unchanged). ``prepare_causal(study, c)`` builds, once per machine, in
the data cache (``$SAMELOSS_DATA``, default ``~/.cache/sameloss/data``, as ``sameloss data
fetch``) under ``causal/<settings>-<fingerprint>/``. Both pieces are pure functions of
the scale's settings and the seed, and the run configs name them by absolute path: kept
outside the experiment folder, that path stays valid when an experiment folder is copied
or moved (its runs are then reused or resumed, not refused for "another config").

* the generator —
  ``random``: a byte-level BPE trained on the toy text (``data.toy.toy_text``, written
  offline) and an *untrained* GPT-2-style model of ``generator_size`` with a fixed seed
  (``causal-lm train`` with 0 steps): no download, no training;
  ``train``: the same tokenizer and model trained for ``train_steps`` on that text
  (``causal-lm train``);
  ``path``: the folder named by the environment variable ``SAMELOSS_CAUSAL_GENERATOR``
  (e.g. a downloaded OPT-125M: the paper's generator), used where it is;
* the downstream task, an SST-2-format TSV folder: ``SAMELOSS_CAUSAL_SST2=DIR`` (a GLUE
  SST-2 folder, re-tokenised with the generator's tokenizer: ``measures.glue``) if set,
  else a stand-in written from the language itself — sentences of the language, decoded
  to text with the generator's tokenizer (only those whose re-tokenisation gives the
  same K-token sentence back, so none is dropped), labelled 1 when the first word is
  among the K/2 most frequent allowed tokens. The stand-in checks the pipeline (text →
  generator tokenizer → K-token vocabulary → probe), not a claim about sentiment.

Every run trains with ``masking=single`` (the causal language's exact conditionals take
one masked position per sentence).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from ...errors import UserError
from ...files import atomic_write_text
from ...storage import storage_errors

GENERATOR_ENV = "SAMELOSS_CAUSAL_GENERATOR"
SST2_ENV = "SAMELOSS_CAUSAL_SST2"
GENERATORS = ("random", "train", "path")
TASK = "sst2"


@dataclass(frozen=True)
class CausalScale:
    """The causal language at one scale: its generator, K allowed tokens, length T and
    the stand-in task's size. ``generator_path``: set by ``prepare_causal``."""

    generator: str  # random | train | path
    k: int
    length: int
    generator_size: str = "micro"  # random / train: a size of languages.lm_train.GENERATOR_SIZES
    bpe_vocab: int = 300
    train_steps: int = 0
    task_train: int = 96
    task_dev: int = 48
    generator_path: str | None = None

    def __post_init__(self):
        if self.generator not in GENERATORS:
            raise ValueError(f"unknown causal generator {self.generator!r}; choose from {', '.join(GENERATORS)}")
        if self.k < 2 or self.length < 1:
            raise ValueError("causal scale needs k >= 2 and length >= 1")

    @property
    def title(self) -> str:
        return f"causal (K={self.k}, T={self.length}, {self.generator} generator)"

    def settings(self) -> tuple:
        if self.generator_path is None:
            raise ValueError("prepare_causal sets the generator path first")
        return (("language.name", "causal"), ("language.generator", self.generator_path), ("language.k", self.k),
                ("language.length", self.length), ("masking", "single"))


# per scale (smoke: K≈16, T≈6, an untrained micro GPT-2 — the numbers mean nothing; tiny:
# a tiny GPT-2 trained 300 steps on the toy text; small / paper: the paper's K and T on
# the generator of $SAMELOSS_CAUSAL_GENERATOR, an OPT-125M for the paper's data)
CAUSAL = {
    "smoke": CausalScale("random", k=16, length=6),
    "tiny": CausalScale("train", k=32, length=8, generator_size="tiny", bpe_vocab=1000, train_steps=300,
                        task_train=1000, task_dev=500),
    "small": CausalScale("path", k=2000, length=24, task_train=20_000, task_dev=5_000),
    "paper": CausalScale("path", k=2000, length=24, task_train=60_000, task_dev=10_000),
}


def prepare_causal(study, c: CausalScale) -> tuple[CausalScale, dict[str, str]]:
    """The scale with its generator path, and ``{task label: glue:sst2=DIR}``, built in the
    data cache when missing (a full disk: one line naming the file, or the cache's folder)."""
    from ...data.fetch import default_cache

    fields = {k: v for k, v in asdict(c).items() if k != "generator_path"}
    tag = hashlib.sha1(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:10]
    folder = default_cache() / "causal" / f"{c.generator}-{c.generator_size}-k{c.k}-len{c.length}-{tag}"
    with storage_errors(folder):  # a write below that names no file of its own: the data cache's folder
        return _prepared(study, c, folder)


def _prepared(study, c: CausalScale, folder: Path) -> tuple[CausalScale, dict[str, str]]:
    from ...data.toy import toy_text

    folder.mkdir(parents=True, exist_ok=True)
    if c.generator == "path":
        value = os.environ.get(GENERATOR_ENV)
        if not value:
            raise UserError(f"this scale's causal language needs a generator: set {GENERATOR_ENV}=DIR (a local "
                            "Hugging Face causal LM folder, e.g. a downloaded OPT-125M)")
        generator = Path(value).expanduser().resolve()
        if not (generator / "config.json").is_file():
            raise UserError(f"{GENERATOR_ENV}={value}: no config.json there (not a Hugging Face model folder)")
    else:
        generator = folder / "generator"
        if not (generator / "config.json").is_file():
            from ...languages.lm_train import GeneratorTraining, train_generator

            partial = folder / f"generator.partial-{os.getpid()}"
            if partial.exists():
                shutil.rmtree(partial)  # an interrupted build of this process id
            toy = toy_text(folder / "toy", seed=0, n_corpus=400, n_train=8, n_dev=8)
            steps = c.train_steps if c.generator == "train" else 0
            study.log(f"building the causal generator ({c.generator}, {c.generator_size}, {steps} steps) in {folder}")
            train_generator([toy["corpus"]], partial,
                            GeneratorTraining(vocab=c.bpe_vocab, size=c.generator_size, steps=steps, seed=0),
                            log=study.log)
            _publish(partial, generator)
    c = replace(c, generator_path=str(generator.resolve()))
    sst2 = os.environ.get(SST2_ENV)
    if sst2:
        task_dir = Path(sst2).expanduser().resolve()
    else:
        task_dir = folder / f"sst2-standin-seed{study.seed}"
        if not (task_dir / "dev.tsv").is_file():
            _write_standin(c, task_dir, study.seed)
    return c, {TASK: f"glue:{TASK}={task_dir}"}


def _write_standin(c: CausalScale, out: Path, seed: int) -> None:
    """The stand-in SST-2-format task (module docstring), from seeded samples."""
    import torch

    from ...languages.lm_generated import CausalLM
    from ...measures.glue import encode_causal

    lm = CausalLM.from_pretrained(c.generator_path, k=c.k, length=c.length)
    need = c.task_train + c.task_dev
    gen = torch.Generator().manual_seed(seed)
    texts: list[str] = []
    labels: list[int] = []
    for _ in range(20):  # a few rounds of samples: most sentences survive the round trip
        tokens = lm.sample(4 * need, gen).tokens
        words = lm.tokens[tokens].tolist()  # generator ids
        decoded = lm.tokenizer().batch_decode(words)
        back, kept = encode_causal(lm, [(t,) for t in decoded])
        same = kept & (back == tokens).all(dim=1)
        for i in same.nonzero(as_tuple=True)[0].tolist():
            if "\t" in decoded[i] or "\n" in decoded[i] or decoded[i] != decoded[i].strip():
                continue  # a TSV cell keeps neither tabs, newlines nor (GLUE's reader) edge spaces
            texts.append(decoded[i])
            labels.append(int(int(tokens[i, 0]) < c.k // 2))
        if len(texts) >= need:
            break
    if len(texts) < 3:
        raise UserError(f"the causal stand-in task: only {len(texts)} sentences of the language survive "
                        f"decoding and re-tokenising; set {SST2_ENV}=DIR to use a real SST-2 folder")
    texts, labels = texts[:need], labels[:need]
    n_train = max(2, min(c.task_train, len(texts) - 1))
    partial = out.with_name(f"{out.name}.partial-{os.getpid()}")
    if partial.exists():
        shutil.rmtree(partial)
    partial.mkdir(parents=True)
    for name, lo, hi in (("train.tsv", 0, n_train), ("dev.tsv", n_train, len(texts))):
        rows = "".join(f"{t}\t{y}\n" for t, y in zip(texts[lo:hi], labels[lo:hi]))
        atomic_write_text(partial / name, "sentence\tlabel\n" + rows)
    _publish(partial, out)


def _publish(partial: Path, out: Path) -> None:
    """Rename a finished build into place; another process that finished first wins
    (the builds are deterministic, so both are the same)."""
    try:
        partial.rename(out)
    except OSError:
        if not out.exists():
            raise
        shutil.rmtree(partial)
