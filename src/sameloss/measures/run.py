"""Measure checkpoints: one row of numbers per checkpoint (``sameloss measure``).

``MeasureSpec`` says what to compute; ``measure_checkpoint`` turns one checkpoint into a
flat dict (loss, KL, traces, Lemma 3.2's Hessian − Fisher gap, eigenvalue, sharpness,
probe / fine-tune / look-up-table accuracies, few-shot probes and count regressions on
views of the representation, each with its error) through ``measure_model``, which takes any loaded model
mapping token ids to logits; ``measure_hf_folder`` does the same for a Hugging Face
masked-LM folder on a sameloss language or a prepared corpus (``sameloss.hf.adapter``); ``measure_path`` does
every checkpoint of a run (or one checkpoint, or an HF folder) and ``write_rows`` saves them as CSV or JSON (``check_output`` first, so
a bad output path fails before any measuring).

A damaged checkpoint of a run is skipped and reported (``measure_path(..., skipped=[])``):
the rows of the others are kept.

The look-up-table baseline does not depend on the checkpoint (it probes the true
conditionals), so it is computed once per language and repeated in every row;
``measure_lookup_table`` measures it alone, and ``measure_reference`` gives the few-shot
probes of the reference representations (random-init encoder, look-up table, oracle:
``representations.py``) a study compares its models with.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from .. import files, resources
from ..errors import UserError
from ..progress import progress_bar
from ..training.checkpoint import CorruptCheckpoint, step_dirs
from ..training.data import step_generator
from ..training.evaluate import make_evaluator
from ..training.runio import load_checkpoint
from . import curvature
from .fewshot import CountRegression, FewShot, count_regression, fewshot_probes
from .finetune import finetune
from .glue import glue_label, glue_task_data, is_glue
from .lookup import lookup_table_probe
from .probe import linear_probe
from .representations import model_representation, reference_representation
from .tasks import get_task, make_task_data


TRACES = ("fisher", "hutchinson", "hutchpp")  # the trace estimators of ``--trace``


@dataclass(frozen=True)
class MeasureSpec:
    loss: bool = False
    traces: tuple[str, ...] = ()  # "fisher", "hutchinson", "hutchpp"
    trace_by: str | None = None  # "block": each trace also per block (embedding, layer<i>, head)
    top_eig: bool = False
    sharpness: bool = False
    probe: tuple[str, ...] = ()  # task names
    finetune: tuple[str, ...] = ()
    lookup: tuple[str, ...] = ()
    hessian_gap: bool = False  # Lemma 3.2: tr H − tr F by Hutchinson, true and model-drawn tokens
    fewshot: FewShot | None = None  # few-shot probes on views of the representation
    count_regression: CountRegression | None = None  # min-norm count heads (Dyck's Theorem 5.1)
    # sizes (paper defaults in comments; these defaults suit a CPU)
    loss_sentences: int = 2000  # paper: 10^6
    n_contexts: int = 1000  # paper: 10^4
    n_labels: int = 50  # paper: 50
    repeats: int = 5  # paper: 5
    n_probes: int = 100  # Hessian-vector products of Hutchinson / Hutch++
    lanczos_basis: int = 20  # vectors the top-eigenvalue Lanczos keeps (bounded memory)
    curvature_sentences: int = 1024  # the fixed batch of Hutchinson, eigenvalue, sharpness; the gap's batches
    micro_batch: int | None = None  # Hessian graphs held for at most this many sentences (memory)
    gap_batches: int = 8  # independent batches of the gap (its standard error is over them)
    params: str | None = None
    rho: float = 0.05
    task_train: int = 2000  # paper: 0.1M examples in all
    task_validation: int = 500
    task_test: int = 1000
    probe_method: str = "lbfgs"
    probe_epochs: int = 50  # paper: 100 (AdamW)
    finetune_epochs: int = 10
    finetune_lr: float = 1e-4  # paper (App. A.5)
    finetune_warmup: int = 200  # paper
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    seed: int = 0
    device: str = "cpu"
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        if not (math.isfinite(self.rho) and self.rho > 0):
            raise UserError(f"the SAM radius rho must be a finite number > 0, got {self.rho}")
        bad = [t for t in self.traces if t not in TRACES]
        if bad:
            raise UserError(f"unknown trace estimator {bad[0]!r}; choose from {', '.join(TRACES)}")
        if self.trace_by not in (None, "block"):
            raise UserError(f"--trace-by must be 'block', got {self.trace_by!r}")
        if self.trace_by and not self.traces:
            raise UserError("--trace-by block needs a --trace estimator to split")
        if "hutchpp" in self.traces and self.n_probes < 3:
            raise UserError(f"Hutch++ needs at least 3 products (--probes), got {self.n_probes}")
        if not (self.loss or self.traces or self.top_eig or self.sharpness or self.probe or self.finetune
                or self.lookup or self.hessian_gap or self.fewshot or self.count_regression):
            raise UserError("nothing to measure: pass --loss, --trace, --top-eig, --sharpness, --probe, "
                            "--finetune or --lookup-table")


def checkpoints_of(path: str | Path) -> list[Path]:
    """A checkpoint directory itself, or every checkpoint folder (``step_*``) of a run
    directory."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"no such run or checkpoint: {path}")
    if (path / "meta.json").exists():
        return [path]
    found = step_dirs(path)
    if not found:
        raise UserError(f"{path} holds no checkpoint (expected a run folder, a checkpoints/step_* folder "
                        "or a Hugging Face masked-LM folder with a config.json)")
    return found


def measure_checkpoint(path: Path, spec: MeasureSpec, cache: dict | None = None) -> dict:
    model, language, cfg, meta = load_checkpoint(path, spec.device)
    row: dict = {"checkpoint": str(path), "run": cfg.name, "step": meta["step"]}
    return measure_model(model, language, cfg, spec, cache, row)


def measure_hf_folder(path: str | Path, spec: MeasureSpec, language_config: str | Path | None = None,
                      overrides: tuple[str, ...] = (), cache: dict | None = None) -> dict:
    """One row for a Hugging Face masked-LM folder measured on a sameloss language, or
    on a corpus (``language.name=corpus language.data=DIR``: held-out cross-entropy,
    curvature, GLUE tasks with the tokenizer's [CLS]; see ``hf.adapter``).

    The language (and the masking and held-out set of ``--loss``) come from a
    ``PretrainConfig`` TOML (``language_config``; default: the ``sameloss.toml`` an
    exported folder carries) with ``overrides`` (``language.*``, ``masking``,
    ``mask_rate``, ``eval.*``) applied."""
    from .. import config as configlib
    from ..hf.adapter import hf_row_info, language_config_of, load_hf_folder
    from ..training.config import PretrainConfig
    from ..training.runio import build_language

    bad = [o for o in overrides if not o.split("=", 1)[0].strip().startswith(HF_OVERRIDE_PREFIXES)]
    if bad:
        raise UserError(f"override {bad[0]!r} does not apply to measuring a Hugging Face folder; "
                        "give language.*, masking, mask_rate or eval.* settings")
    language_config = language_config if language_config is not None else language_config_of(path)
    if language_config is None and not any(o.strip().startswith("language.") for o in overrides):
        raise UserError(f"say which language to measure {path} on: --language-config FILE (a pretrain config) "
                        "or language.name=NAME [language.size=SIZE ...]")
    cfg = configlib.load(PretrainConfig, language_config, list(overrides) + [f"device={spec.device}"])
    language = build_language(cfg)
    model = load_hf_folder(path, language, spec.device)
    row: dict = {"checkpoint": str(path), **hf_row_info(path), "step": None, "language": language.name}
    return measure_model(model, language, cfg, spec, cache, row)


# config keys that say what an HF folder is measured on
HF_OVERRIDE_PREFIXES = ("language.", "masking", "mask_rate", "eval.")


def measure_model(model, language, cfg, spec: MeasureSpec, cache: dict | None = None, row: dict | None = None
                  ) -> dict:
    """The measures of ``spec`` on a loaded ``model`` (anything mapping sameloss token ids
    to logits, with ``features`` for probes), added to ``row``."""
    cache = {} if cache is None else cache
    if spec.lookup and not getattr(language, "exact", True):
        raise UserError("the look-up table is not defined for a corpus (it needs the true conditionals)")
    resources.check_measure(spec, cfg, language, model)  # before any measure allocates
    row = {**(row or {}), "parameters": sum(p.numel() for p in model.parameters())}
    if spec.loss:
        result = _evaluator(cache, language, cfg, spec).evaluate(model, spec.device)
        row.update({k: result[k] for k in ("loss", "loss_std", "kl", "kl_std", "log_kl", "entropy", "n_tokens")})
        if "gap" in result:  # a corpus: the train/held-out gap, and why KL is missing
            row.update({k: result[k] for k in ("train_loss", "train_loss_std", "gap", "kl_note")})
    by_block = spec.trace_by == "block"
    for name in spec.traces:
        if name == "fisher":
            r = curvature.trace_fisher(model, language, n_contexts=spec.n_contexts, n_labels=spec.n_labels,
                                       params=spec.params, seed=spec.seed, repeats=spec.repeats, by_block=by_block)
        else:
            # one masked position per sentence, as the Fisher estimator's contexts: near
            # saturation the two then estimate the same trace
            r = curvature.trace_hutchinson(model, language, n_probes=spec.n_probes, params=spec.params,
                                           n_sentences=spec.curvature_sentences, mask_rate=None, seed=spec.seed,
                                           estimator=name, by_block=by_block, micro_batch=spec.micro_batch)
        row[f"trace_{name}"] = r.estimate
        row[f"trace_{name}_se"] = r.stderr
        if "repeat_std" in r.extra:
            row[f"trace_{name}_repeat_std"] = r.extra["repeat_std"]
        for block, value in r.extra.get("blocks", {}).items():  # trace_fisher_layer0, ..._se
            row[f"trace_{name}_{block}"] = value["estimate"]
            row[f"trace_{name}_{block}_se"] = value["stderr"]
        row["n_params_measured"] = r.n_params
    if spec.hessian_gap:
        _put_gap(row, curvature.trace_hessian_gap(model, language, n_batches=spec.gap_batches,
                                                  n_sentences=spec.curvature_sentences, n_probes=spec.n_probes,
                                                  params=spec.params, seed=spec.seed))
    if spec.top_eig:
        r = curvature.top_eigenvalue(model, language, params=spec.params, n_sentences=spec.curvature_sentences,
                                     seed=spec.seed, basis_size=spec.lanczos_basis, micro_batch=spec.micro_batch)
        row["top_eigenvalue"] = r.estimate
    if spec.sharpness:
        r = curvature.sam_sharpness(model, language, rho=spec.rho, params=spec.params,
                                    n_sentences=spec.curvature_sentences, seed=spec.seed)
        row["sam_sharpness"] = r.estimate
    # the paper's fine-tuning reads the CLS token of models pre-trained with one (a corpus)
    pooling = "cls" if getattr(language, "uses_cls", False) else "mean"
    for kind, tasks in (("probe", spec.probe), ("finetune", spec.finetune), ("lookup", spec.lookup)):
        for task in tasks:
            data = _task_data(cache, language, cfg, task, spec)
            if kind == "probe":
                r = linear_probe(model, data, method=spec.probe_method, seeds=spec.seeds, epochs=spec.probe_epochs)
            elif kind == "finetune":
                r = finetune(model, data, seeds=spec.seeds, epochs=spec.finetune_epochs, pooling=pooling,
                             lr=spec.finetune_lr, warmup_steps=spec.finetune_warmup)
            else:
                r = _lookup_probe(cache, language, cfg, task, spec)
            _put_downstream(row, kind, task, r)
    if spec.fewshot is not None:
        data = _fewshot_data(cache, language, cfg, spec.fewshot)
        row.update(fewshot_probes(model_representation(model, data.train.tokens),
                                  model_representation(model, data.test.tokens), data.train.labels,
                                  data.test.labels, data.n_classes, spec.fewshot))
    if spec.count_regression is not None:
        d = spec.count_regression
        data = make_task_data(language, d.task, d.pool, 0, d.n_test, seed=spec.seed)
        generator = step_generator(spec.seed, 0, stream=STREAM_COUNT_DRAWS)
        row.update(count_regression(model_representation(model, data.train.tokens),
                                    model_representation(model, data.test.tokens), data.train.labels,
                                    data.test.labels, data.n_classes, d, generator))
    return row


# the draws of the count regression's training examples (apart from training, evaluation
# and the curvature measures' streams)
STREAM_COUNT_DRAWS = 21


def _put_gap(row: dict, gap: dict) -> None:
    """Lemma 3.2's columns: the Hutchinson traces and gaps (± SE over batches), and with
    the Fisher trace in the row, ``tr F + gap`` (a lower-variance ``tr H``), the relative
    gap and the gaps' t statistics."""
    for name, r in gap.items():
        row[name] = r.estimate
        row[f"{name}_se"] = r.stderr
    if "trace_fisher" in row:
        row["trace_hessian_cv"] = row["trace_fisher"] + row["trace_gap"]
        row["trace_hessian_cv_se"] = math.hypot(row["trace_fisher_se"], row["trace_gap_se"])
        row["relative_gap"] = row["trace_gap"] / row["trace_fisher"]
    row["trace_abs_gap"] = abs(row["trace_gap"])
    row["trace_abs_gap_se"] = row["trace_gap_se"]
    row["z_gap"] = row["trace_gap"] / row["trace_gap_se"]
    row["z_gap_model"] = row["trace_gap_model"] / row["trace_gap_model_se"]


def _fewshot_data(cache, language, cfg, design: FewShot):
    # keyed by the whole language config: two languages of one name (another size, seed or
    # params) share a cache in a study of several languages and must not share task data
    key = ("fewshot", cfg.language if cfg is not None else language.name, design)
    if key not in cache:
        cache[key] = make_task_data(language, design.task, n_train=design.pool, n_validation=0, n_test=design.test,
                                    seed=design.seed)
    return cache[key]


def measure_reference(kind: str, language, cfg, spec: MeasureSpec, cache: dict | None = None) -> dict:
    """The few-shot probes of ``spec.fewshot`` on a reference representation
    (``representations.REFERENCES``: ``random-init`` — ``cfg``'s model freshly initialised
    from its seed —, ``lookup``, ``oracle``), and the task's majority rate on the test set
    (``fewshot_majority``): the headroom a trained model is placed in."""
    if spec.fewshot is None:
        raise UserError("a reference representation is measured by few-shot probes: give the spec a fewshot design")
    cache = {} if cache is None else cache
    data = _fewshot_data(cache, language, cfg, spec.fewshot)
    task = get_task(language, spec.fewshot.task)
    pool_h, test_h = (reference_representation(kind, language, cfg, split.tokens, spec.device, task=task)
                      for split in (data.train, data.test))
    row = fewshot_probes(pool_h, test_h, data.train.labels, data.test.labels, data.n_classes, spec.fewshot)
    row["fewshot_majority"] = data.majority()[1]
    return row


def _put_downstream(row: dict, kind: str, task: str, r) -> None:
    """A probe / fine-tune / look-up-table result as the row's ``<kind>_<task>`` columns
    (``measures.rows``: the mean, its ``_std`` over seeds) and the task's majority rate."""
    name = glue_label(task)
    row[f"{kind}_{name}"] = r.mean
    row[f"{kind}_{name}_std"] = r.std
    row[f"{name}_majority"] = r.majority_rate


def measure_lookup_table(language, cfg, spec: MeasureSpec, cache: dict | None = None) -> dict:
    """The look-up table (App. A.5) of a run's language; it needs no checkpoint. With
    ``spec.loss``: its loss on the run's held-out set, the entropy of the true conditionals
    (KL 0, ± std over the same subsets as a model's loss); per task of ``spec.lookup``: a
    probe on the true conditionals, as ``measure_checkpoint``'s ``lookup_<task>`` columns."""
    cache = {} if cache is None else cache
    if not getattr(language, "exact", True):
        raise UserError("the look-up table is not defined for a corpus (it needs the true conditionals)")
    row: dict = {"step": None, "parameters": None}
    if spec.loss:
        evaluator = _evaluator(cache, language, cfg, spec)
        ent = evaluator.entropy
        subsets = [float(ent[evaluator.subset == k].mean()) for k in range(evaluator.n_subsets)]
        mean = float(ent.mean())
        row.update(loss=mean, loss_std=_std(subsets), kl=0.0, kl_std=0.0, entropy=mean, n_tokens=int(ent.numel()))
    for task in spec.lookup:
        _put_downstream(row, "lookup", task, _lookup_probe(cache, language, cfg, task, spec))
    return row


def _evaluator(cache, language, cfg, spec):
    key = ("evaluator", cfg.language, cfg.masking, cfg.mask_rate)
    if key not in cache:
        rate = None if cfg.masking == "single" else cfg.mask_rate
        cache[key] = make_evaluator(language, spec.loss_sentences, rate, cfg.eval.seed, cfg.eval.n_subsets)
    return cache[key]


def _lookup_probe(cache, language, cfg, task, spec):
    key = ("lookup", cfg.language, task)
    if not getattr(language, "exact", True):
        raise UserError("the look-up table is not defined for a corpus (it needs the true conditionals)")
    if key not in cache:
        data = _task_data(cache, language, cfg, task, spec)
        cache[key] = lookup_table_probe(language, data, method=spec.probe_method, seeds=spec.seeds,
                                        epochs=spec.probe_epochs, device=spec.device)
    return cache[key]


def _std(values: list[float]) -> float:
    n = len(values)
    if n < 2:
        return float("nan")
    m = sum(values) / n
    return math.sqrt(sum((v - m) ** 2 for v in values) / (n - 1))


def _task_data(cache, language, cfg, task, spec):
    key = ("task", cfg.language, task)
    if key not in cache and is_glue(task):
        cache[key] = glue_task_data(language, task, seed=spec.seed, n_train=spec.task_train,
                                    n_validation=spec.task_validation)
    elif key not in cache:
        cache[key] = make_task_data(language, task, spec.task_train, spec.task_validation, spec.task_test,
                                    seed=spec.seed)
    return cache[key]


def measure_path(path: str | Path, spec: MeasureSpec, progress: bool = True,
                 skipped: list[str] | None = None, language_config: str | Path | None = None,
                 overrides: tuple[str, ...] = ()) -> list[dict]:
    """Rows of a checkpoint, of every checkpoint of a run, or of a Hugging Face
    masked-LM folder (``language_config`` / ``overrides``: what to measure it on; they
    apply to such a folder only — a checkpoint's language is in its config). With
    ``skipped`` (a list), a damaged checkpoint of a run is left out and its problem
    appended there; without it, or when no checkpoint can be read,
    ``CorruptCheckpoint``/``UserError`` is raised (one line per damaged checkpoint)."""
    from ..hf.adapter import is_hf_folder

    if is_hf_folder(path):
        return [measure_hf_folder(path, spec, language_config, tuple(overrides))]
    if language_config is not None or overrides:
        raise UserError(f"language settings (--language-config, KEY=VALUE) apply to Hugging Face folders only; "
                        f"{path} is measured on the language in its own config")
    found = checkpoints_of(path)
    cache: dict = {}
    rows, problems = [], []
    for ckpt in progress_bar(found, desc="measuring", unit="checkpoint", disable=not progress or len(found) < 2):
        try:
            if not (ckpt / "meta.json").exists():
                raise CorruptCheckpoint(ckpt / "meta.json", "missing (not a complete checkpoint)")
            rows.append(measure_checkpoint(ckpt, spec, cache))
        except CorruptCheckpoint as exc:
            if skipped is None or len(found) == 1:
                raise
            problems.append(f"{exc} (checkpoint skipped)")
    if not rows:
        raise UserError("\n".join(problems))
    if skipped is not None:
        skipped.extend(problems)
    return rows


def check_output(out: str | Path, force: bool = False) -> Path:
    """Fail now (``UserError``) if ``write_rows`` could not or must not write ``out``: it is
    a folder or a symbolic link, a file sameloss did not write (unless ``force``:
    ``files.check_output``), or its folder cannot be created or written."""
    out = Path(out)
    files.check_output(out, force)
    if out.exists() and not os.access(out, os.W_OK):
        raise UserError(f"--out {out} is read-only")
    parent = out.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise UserError(f"--out {out}: {parent} is not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UserError(f"--out {out}: cannot write in {parent} (permission denied)")
    return out


def write_rows(rows: list[dict], out: str | Path, force: bool = False) -> bool:
    """CSV (``.csv``) or JSON (anything else), written atomically (``files.write_output``:
    an interrupted write never replaces earlier results, and an existing file is replaced
    only when sameloss wrote it, or with ``force``); returns whether a file was replaced."""
    out = check_output(out, force)
    if out.suffix == ".csv":
        columns = list(dict.fromkeys(k for row in rows for k in row))
        buffer = io.StringIO(newline="")
        writer = csv.DictWriter(buffer, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
        text = buffer.getvalue()
    else:
        text = json.dumps(rows, indent=2)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise files.write_error(out, exc) from None
    return files.write_output(out, text, force)
