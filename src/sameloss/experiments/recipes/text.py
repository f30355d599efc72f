"""Real text: pre-training algorithms at the same loss (paper Tables 1–2, BookCorpus rows).

Command

    sameloss reproduce text --scale tiny      [--out runs] [--seed N] [--fresh]

Runtime per scale

    smoke   ~10 s on a CPU (a generated toy corpus and toy GLUE TSVs the recipe writes itself;
            the numbers mean nothing)
    tiny    14 min on a shared 2-core CPU (measured; table in docs/results/text.md): the offline books (KJV + Jane
            Austen, fetched on the first call, BookCorpus stand-ins), WordPiece 2000, length
            64, the "tiny" transformer, 800 steps of batch 32 per algorithm; fine-tuned (4
            epochs, lr 3e-4, 30 warm-up steps, 3 seeds) on the Rotten Tomatoes SST-2 stand-in
            and the WordNet word–definition pair task (an RTE/QNLI stand-in), 1000 training
            examples each
    small   ~3 h on one H100 (planner estimate, ``sameloss plan text --scale small --hardware
            h100``: assumed GPU utilisation): BookCorpus from the Hugging Face hub
            (needs ``datasets`` and the hub), WordPiece 30522, length 128, t4-384, batch 512,
            20k steps each; GLUE SST-2 / QNLI / RTE from the hub
    paper   ~43 h on one H100 (planner estimate, as small): as small with t3-1024 (the paper's
            235M shape), 100k steps each; the paper's batch is 4096 (App. A.2)

What it runs
    * AdamW — the standard recipe (dropout 0.1, weight decay 0.01);
    * −dropout−WD — AdamW without dropout and weight decay;
    * −dropout−WD+SAM — the same with SAM (ρ = 0.05).
    Same corpus, shape and steps; BERT's 80/10/10 masking at 15 %. Per model: held-out
    masked-token cross-entropy (and the train/held-out gap of finite data), the paper's
    Fisher trace of Hessian, and fine-tuning accuracy on each GLUE-format task (the CLS
    token, AdamW 1e-4, 200 warm-up steps; dev accuracy ± std over seeds). There is no KL and
    no look-up table on real text: the true conditionals are unknown.

Expected result (paper)
    At about the same pre-training loss, removing dropout and weight decay lowers
    downstream accuracy and raises the trace of Hessian, and SAM recovers both (Tables 1–2,
    BookCorpus: SST-2 90.8 / 89.5 / 90.1, trace 24.55 / 34.91 / 22.15).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from ...errors import UserError
from ...files import atomic_write_text, atomic_writer
from ...measures.glue import glue_label
from ...measures.run import MeasureSpec
from ..reports.claims import POINTS, difference_claim, fmt
from ..presets.common import Shape, measured_runs, quantity_column
from ..engine.runspec import RunSpec
from ..engine.declare import run_unit
from ..reports.plots import TRACE_FISHER, Panel, dots_plot, error_labels, majority_ref
from ..reports.document import Column, Section, Table

TITLE = "Real text: pre-training algorithms at the same loss (Tables 1–2, BookCorpus rows)"
SUMMARY = "real text: AdamW, -dropout-WD, +SAM on a corpus; held-out loss, trace, GLUE fine-tuning (Tables 1, 2)"

HUB_CORPORA = {"bookcorpus": "bookcorpus/bookcorpus", "openwebtext": "Skylion007/openwebtext"}
HUB_GLUE = "nyu-mll/glue"


@dataclass(frozen=True)
class TextTask:
    """A GLUE-format task: ``label`` names its column; ``source`` is ``toy`` (the generated
    TSVs), a ``data fetch`` set (``rt-sst2``, ``wordnet``, ...) or ``hub``; ``folder`` is the
    sub-folder of that set holding train.tsv / dev.tsv; ``glue`` its format."""

    label: str
    source: str
    folder: str
    glue: str


@dataclass(frozen=True, kw_only=True)
class TextCorpus:
    """The pre-training corpus and its tokenizer: ``sources`` are ``toy``, ``data fetch`` names
    or ``hub:bookcorpus`` / ``hub:openwebtext`` (``hub_documents`` documents read from a hub
    corpus; 0: all), tokenized by ``tokenizer`` to a vocabulary of ``vocab`` in sequences of
    ``max_len`` (``languages.text.prepare_corpus``)."""

    sources: tuple[str, ...]
    tokenizer: str
    vocab: int
    max_len: int
    hub_documents: int = 0

    def __post_init__(self):
        if not self.sources:
            raise ValueError("a text corpus needs sources")
        if self.max_len < 8:
            raise ValueError("max_len must be >= 8")


@dataclass(frozen=True, kw_only=True)
class Pretraining:
    """Every algorithm's run: the model's ``shape``, ``steps`` of ``batch_size`` sequences at AdamW
    ``lr`` after ``warmup_steps``, ``eval_sentences`` held-out sentences at the end, and the SAM
    run's ``sam_rho``."""

    shape: Shape
    steps: int
    batch_size: int
    warmup_steps: int
    lr: float
    eval_sentences: int
    sam_rho: float

    def __post_init__(self):
        if self.steps < 1:
            raise ValueError("steps must be >= 1")


@dataclass(frozen=True, kw_only=True)
class Finetuning:
    """How each model is fine-tuned on every task (``MeasureSpec``'s ``finetune_*`` and ``seeds``):
    ``train_rows`` / ``dev_rows`` rows kept of each task's train / dev split (a seeded sample;
    None: all), ``epochs``, AdamW ``lr`` after ``warmup_steps``, once per seed of ``seeds``. The
    defaults are the paper's recipe (App. A.5): AdamW 1e-4, 200 warm-up steps."""

    train_rows: int | None
    dev_rows: int | None
    epochs: int
    seeds: tuple[int, ...]
    lr: float = 1e-4
    warmup_steps: int = 200

    def __post_init__(self):
        if not self.seeds:
            raise ValueError("fine-tuning needs seeds")


@dataclass(frozen=True, kw_only=True)
class TextMeasures:
    """The sizes of the other measures (``MeasureSpec`` fields): ``loss_sentences`` held-out
    sentences of the loss; the Fisher trace's ``n_contexts``, ``n_labels`` and ``repeats``."""

    loss_sentences: int
    n_contexts: int
    n_labels: int
    repeats: int


@dataclass(frozen=True, kw_only=True)
class TextPreset:
    """The recipe at one scale: the ``device``, the ``corpus`` pre-trained on, the GLUE-format
    ``tasks`` fine-tuned on, each algorithm's ``pretrain`` run, the ``finetune`` recipe, the
    other ``measure`` sizes, and ``loss_tolerance``: "same loss" is held-out cross-entropies
    within this (nats)."""

    device: str
    corpus: TextCorpus
    tasks: tuple[TextTask, ...]
    pretrain: Pretraining
    finetune: Finetuning
    measure: TextMeasures
    loss_tolerance: float = 0.05

    def __post_init__(self):
        if not self.tasks:
            raise ValueError("a text preset needs tasks")


_TINY_TASKS = (TextTask("sst2", "rt-sst2", "sst2", "sst2"), TextTask("wordnet", "wordnet", "rte", "rte"))
_HUB_TASKS = (TextTask("sst2", "hub", "sst2", "sst2"), TextTask("qnli", "hub", "qnli", "qnli"),
              TextTask("rte", "hub", "rte", "rte"))
# the paper's fine-tuning (App. A.5: 10 epochs, the defaults' lr and warm-up) on every row, 5 seeds
_PAPER_FINETUNE = Finetuning(train_rows=None, dev_rows=None, epochs=10, seeds=(0, 1, 2, 3, 4))

PRESETS: dict[str, TextPreset] = {
    "smoke": TextPreset(
        device="cpu",
        corpus=TextCorpus(sources=("toy",), tokenizer="wordpiece", vocab=120, max_len=24),
        tasks=(TextTask("sst2", "toy", "sst2", "sst2"), TextTask("pairs", "toy", "rte", "rte")),
        pretrain=Pretraining(shape=Shape("micro"), steps=40, batch_size=32, warmup_steps=5, lr=3e-3,
                             eval_sentences=32, sam_rho=0.05),
        finetune=Finetuning(train_rows=None, dev_rows=None, epochs=2, seeds=(0, 1)),
        measure=TextMeasures(loss_sentences=32, n_contexts=16, n_labels=2, repeats=2)),
    "tiny": TextPreset(
        device="auto",
        corpus=TextCorpus(sources=("kjv", "austen"), tokenizer="wordpiece", vocab=2000, max_len=64),
        tasks=_TINY_TASKS,
        pretrain=Pretraining(shape=Shape("tiny"), steps=800, batch_size=32, warmup_steps=80, lr=1e-3,
                             eval_sentences=300, sam_rho=0.05),
        # a 2-core budget; fine-tuning runs ~100 steps per seed, so the paper's 200 warm-up
        # steps at 1e-4 would never reach the rate: 30 warm-up steps at 3e-4 instead
        finetune=Finetuning(train_rows=1000, dev_rows=500, epochs=4, seeds=(0, 1, 2), lr=3e-4, warmup_steps=30),
        measure=TextMeasures(loss_sentences=500, n_contexts=128, n_labels=4, repeats=2)),
    "small": TextPreset(
        device="auto",
        corpus=TextCorpus(sources=("hub:bookcorpus",), tokenizer="wordpiece", vocab=30522, max_len=128,
                          hub_documents=5_000_000),
        tasks=_HUB_TASKS,
        pretrain=Pretraining(shape=Shape("t4-384"), steps=20_000, batch_size=512, warmup_steps=2000, lr=1e-3,
                             eval_sentences=5000, sam_rho=0.05),
        finetune=_PAPER_FINETUNE,
        measure=TextMeasures(loss_sentences=20_000, n_contexts=10_000, n_labels=50, repeats=5),
        loss_tolerance=0.02),
    "paper": TextPreset(
        device="auto",
        corpus=TextCorpus(sources=("hub:bookcorpus",), tokenizer="wordpiece", vocab=30522, max_len=128),
        tasks=_HUB_TASKS,
        pretrain=Pretraining(shape=Shape("t3-1024"), steps=100_000, batch_size=512, warmup_steps=5000, lr=1e-3,
                             eval_sentences=20_000, sam_rho=0.05),
        finetune=_PAPER_FINETUNE,
        measure=TextMeasures(loss_sentences=100_000, n_contexts=10_000, n_labels=50, repeats=5),
        loss_tolerance=0.012),
}


# ---- data ---------------------------------------------------------------------------------
def _hub():
    try:
        import datasets
    except ImportError:
        raise UserError("this scale reads BookCorpus / GLUE from the Hugging Face hub: install 'datasets' and make "
                        "sure the hub is reachable (or use --scale tiny, which runs offline)") from None
    return datasets


def _hub_corpus(name: str, out: Path, limit: int) -> Path:
    """A hub corpus as JSONL (``limit`` documents; 0: all). Not exercised offline."""
    path = out / f"{name}.jsonl"
    if path.exists():
        return path
    ds = _hub().load_dataset(HUB_CORPORA[name], split="train", streaming=True)
    with atomic_writer(path) as f:
        for i, record in enumerate(ds):
            if limit and i >= limit:
                break
            f.write(json.dumps({"text": record["text"]}) + "\n")
    return path


def _hub_glue(task: str, out: Path) -> Path:
    """GLUE ``task`` from the hub as train.tsv / dev.tsv. Not exercised offline."""
    from ...measures.glue import GLUE_COLUMNS
    folder = out / task
    if (folder / "dev.tsv").exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    columns = (*GLUE_COLUMNS[task], "label")
    for split, name in (("train", "train.tsv"), ("validation", "dev.tsv")):
        ds = _hub().load_dataset(HUB_GLUE, task, split=split)
        with (folder / name).open("w", encoding="utf-8") as f:
            f.write("\t".join(columns) + "\n")
            for r in ds:
                f.write("\t".join(" ".join(str(r[c]).split()) for c in columns) + "\n")
    return folder


def _sample_tsv(src: Path, dst: Path, n: int | None, seed: int) -> None:
    lines = src.read_text(encoding="utf-8").splitlines()
    header, rows = lines[0], [r for r in lines[1:] if r.strip()]
    if n is not None and n < len(rows):
        rows = random.Random(seed).sample(rows, n)
    atomic_write_text(dst, "\n".join([header, *rows]) + "\n")


def prepare_data(setup, p: TextPreset) -> tuple[Path, dict[str, str]]:
    """The prepared corpus folder and ``{task label: glue:NAME=DIR}``, under
    ``<experiment>/data/`` (reused when already there)."""
    from ...languages.text import META, prepare_corpus
    from ...data.fetch import default_cache, fetch
    from ...data.toy import toy_text

    data = setup.root / "data"
    data.mkdir(parents=True, exist_ok=True)
    toy = toy_text(data / "toy", seed=setup.seed, n_corpus=400, n_train=240, n_dev=60) \
        if "toy" in p.corpus.sources or any(t.source == "toy" for t in p.tasks) else None
    files = []
    for source in p.corpus.sources:
        if source == "toy":
            files.append(toy["corpus"])
        elif source.startswith("hub:"):
            files.append(_hub_corpus(source[4:], data, p.corpus.hub_documents))
        else:
            setup.log(f"data fetch {source}")
            files.append(fetch(source, default_cache())[0] / "text.txt")
    corpus = data / "corpus"
    if not (corpus / META).exists():
        setup.log(f"preparing the corpus from {', '.join(f.name for f in files)}")
        if corpus.exists():
            import shutil
            shutil.rmtree(corpus)  # an interrupted preparation of ours
        prepare_corpus(files, corpus, tokenizer=p.corpus.tokenizer, vocab=p.corpus.vocab, max_len=p.corpus.max_len,
                       seed=setup.seed)
    tasks = {}
    for t in p.tasks:
        if t.source == "toy":
            src = toy[t.folder]
        elif t.source == "hub":
            src = _hub_glue(t.folder, data / "glue")
        else:
            src = fetch(t.source, default_cache())[0] / t.folder
        dst = data / "tasks" / t.label
        if not (dst / "dev.tsv").exists():
            dst.mkdir(parents=True, exist_ok=True)
            _sample_tsv(src / "train.tsv", dst / "train.tsv", p.finetune.train_rows, setup.seed)
            _sample_tsv(src / "dev.tsv", dst / "dev.tsv", p.finetune.dev_rows, setup.seed)
        tasks[t.label] = f"glue:{t.glue}={dst.resolve()}"
    return corpus.resolve(), tasks


# ---- runs and report ---------------------------------------------------------------------
def runs(p: TextPreset, corpus: Path, seed: int) -> list[RunSpec]:
    """AdamW, −dropout−WD and −dropout−WD+SAM on the prepared corpus."""
    t = p.pretrain
    base = (("language.name", "corpus"), ("language.data", str(corpus)), ("seed", seed), ("device", p.device),
            ("steps", t.steps), ("batch_size", t.batch_size), ("optim.warmup_steps", t.warmup_steps),
            ("optim.lr", t.lr), ("eval.every", 0), ("eval.n_sentences", t.eval_sentences),
            ("log_every", max(1, t.steps // 20)), ("save_every", t.steps), ("mask_replace", "bert"),
            *t.shape.settings())
    noreg = (("model.dropout", 0.0), ("optim.weight_decay", 0.0))
    name = f"corpus-{t.shape.size}"
    return [RunSpec(f"{name}-adamw", base, "AdamW", "adamw"),
            RunSpec(f"{name}-noreg", (*base, *noreg), "−dropout−WD", "noreg"),
            RunSpec(f"{name}-noreg-sam", (*base, *noreg, ("sam.rho", t.sam_rho)),
                    f"−dropout−WD+SAM (ρ={t.sam_rho:g})", "sam")]


def measure_spec(p: TextPreset, tasks: dict[str, str], seed: int) -> MeasureSpec:
    m, f = p.measure, p.finetune
    return MeasureSpec(loss=True, traces=("fisher",), finetune=tuple(tasks.values()), loss_sentences=m.loss_sentences,
                       n_contexts=m.n_contexts, n_labels=m.n_labels, repeats=m.repeats, finetune_epochs=f.epochs,
                       finetune_lr=f.lr, finetune_warmup=f.warmup_steps, seeds=f.seeds, seed=seed)


def _figure(records, section: Section, p: TextPreset, rows: list[dict], tasks: dict[str, str],
            mspec: MeasureSpec) -> None:
    """A dot with its interval per algorithm: held-out loss, trace, fine-tuning accuracy per task."""
    panels = [Panel("loss", "held-out cross-entropy (nats)"), Panel("trace_fisher", TRACE_FISHER)]
    for label, spec in tasks.items():
        task = glue_label(spec)
        panels.append(Panel(f"finetune_{task}", f"fine-tuning accuracy, {label}", refs=majority_ref(rows, task)))
    fig = dots_plot(rows, "algorithm", panels, "Real text: algorithms", errors=error_labels(mspec))
    section.figures.append(records.figure(
        fig, "text-algorithms",
        shows=f"{', '.join(p.corpus.sources)}: for each pre-training algorithm, (a) the held-out masked-token "
              "cross-entropy (the optimum is unknown on real text: there is no KL), (b) the trace of Hessian by "
              "the paper's estimator, then the fine-tuning dev accuracy per task (dotted: the majority class)",
        sample=f"{len(rows)} models, the last checkpoint of one run each (seed {records.setup.seed}); each fine-tuned "
               f"with {len(mspec.seeds)} seeds",
        claim="at about the same loss, removing dropout and weight decay lowers fine-tuning accuracy and raises "
              "the trace, and SAM recovers both (Tables 1–2, BookCorpus rows)"))


COMPARISONS = (
    ("adamw", "noreg", "AdamW", "−dropout−WD", -1, +1,
     "removing dropout and weight decay hurts fine-tuning accuracy at the same loss (Table 1, BookCorpus: SST-2 "
     "90.8 → 89.5).",
     "removing dropout and weight decay raises the trace of Hessian (Table 2: 24.55 → 34.91)."),
    ("noreg", "sam", "−dropout−WD", "−dropout−WD+SAM", +1, -1,
     "SAM recovers the fine-tuning accuracy lost without dropout and weight decay (Table 1: SST-2 89.5 → 90.1).",
     "SAM lowers the trace of Hessian (Table 2: 34.91 → 22.15)."),
)


def planned_data(setup, p: TextPreset) -> tuple[Path, dict[str, str]]:
    """What ``prepare_data`` would give, for ``sameloss plan``: the folders it would write,
    nothing fetched or prepared; the corpus' vocabulary and length are the preset's (the
    tokenizer's target size: a small corpus may end with fewer words)."""
    data = setup.root / "data"
    corpus = data / "corpus"
    setup.language_shapes[str(corpus)] = (p.corpus.vocab, p.corpus.max_len)
    return corpus, {t.label: f"glue:{t.glue}={data / 'tasks' / t.label}" for t in p.tasks}


def units(setup, p: TextPreset) -> list:
    """One unit per run (after the corpus and tasks are prepared, ``prepare_data``):
    trained, then measured with fine-tuning; tagged with the recipe and the language (the
    report asks for them so)."""
    corpus, tasks = setup.data("text", prepare_data, planned_data, p)
    mspec = measure_spec(p, tasks, setup.seed)
    return [run_unit(spec, mspec, experiment="text", language="corpus") for spec in runs(p, corpus, setup.seed)]


def report(records, p: TextPreset) -> Section:
    section = Section(TITLE)
    corpus, tasks = records.setup.data("text", prepare_data, planned_data, p)
    meta = json.loads((corpus / "meta.json").read_text())
    train = meta["splits"]["train"]
    section.text.append(
        f"Corpus: {', '.join(p.corpus.sources)} — {train['documents']} training documents, {train['tokens']} tokens "
        f"in {train['sequences']} sequences of {meta['max_len']}, vocabulary {meta['n_words']} ({meta['tokenizer']}); "
        f"held out: {meta['splits']['heldout']['documents']} documents. Tasks: "
        + ", ".join(f"{k} ({v.split('=')[0][5:]} format)" for k, v in tasks.items())
        + ". Loss is the held-out masked-token cross-entropy; there is no KL on real text.")
    mspec = measure_spec(p, tasks, records.setup.seed)
    rows: dict[str, dict] = {}
    for run in measured_runs(records, "text", language="corpus"):
        section.runs.append(run.info)
        (row,) = run.rows
        epochs = p.pretrain.steps * p.pretrain.batch_size / train["sequences"]
        rows[run.tags["group"]] = dict(row, algorithm=run.tags["label"], epochs=epochs)
    section.rows += list(rows.values())
    cols = [Column("epochs", "epochs", fmt=".2f"), quantity_column("held-out loss", "loss", fmt=".4f"),
            quantity_column("train loss", "train_loss", fmt=".4f"), Column("gap", "gap", fmt=".4f"),
            quantity_column("tr(H) (Fisher)", "trace_fisher", fmt=".4g")]
    # measured rows name a GLUE task by its format (finetune_rte); the table by the task's label
    keys = {label: f"finetune_{glue_label(spec)}" for label, spec in tasks.items()}
    cols += [quantity_column(f"fine-tune {k} (%)", keys[k], scale=100, fmt=".1f") for k in tasks]
    section.tables.append(Table("Real text: algorithms", cols, list(rows.values())))
    _figure(records, section, p, list(rows.values()), tasks, mspec)
    losses = [float(r["loss"]) for r in rows.values()]
    if max(losses) - min(losses) > p.loss_tolerance:
        section.notes.append(
            f"The held-out losses span {fmt(min(losses))}–{fmt(max(losses))} nats, more than the tolerance "
            f"{p.loss_tolerance:g}: the comparisons below are not at the same loss.")
    n_seeds = len(p.finetune.seeds)
    for a_key, b_key, a_name, b_name, acc_sign, trace_sign, acc_claim, trace_claim in COMPARISONS:
        a, b = rows[a_key], rows[b_key]
        for k in tasks:
            section.claims.append(difference_claim(acc_claim, f"fine-tuning accuracy {k}", keys[k], (a, a_name),
                                                   (b, b_name), acc_sign, POINTS, n_seeds=n_seeds))
        section.claims.append(difference_claim(trace_claim, "trace of Hessian", "trace_fisher", (a, a_name),
                                               (b, b_name), trace_sign))
    return section
