"""Measure checkpoints: one row of numbers per checkpoint (``sameloss measure``).

``MeasureSpec`` (``spec.py``) says what to compute; ``measure_model`` runs every measure it
asks for (``spec.measures_of``: the registered measures, ``builtin/``) on any loaded model
mapping token ids to logits, after each measure's memory check, and merges their columns
into one flat row (loss, KL, traces, Lemma 3.2's Hessian − Fisher gap, eigenvalue,
sharpness, probe / fine-tune / look-up-table accuracies, few-shot probes and count
regressions on views of the representation, each with its error). ``measure_checkpoint``
loads a checkpoint for it; ``measure_hf_folder`` does the same for a Hugging Face
masked-LM folder on a sameloss language or a prepared corpus (``sameloss.hf.adapter``);
``measure_path`` does every checkpoint of a run (or one checkpoint, or an HF folder) and
``write_rows`` saves them as CSV or JSON (``check_output`` first, so a bad output path
fails before any measuring).

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
from pathlib import Path

from .. import files, storage
from ..errors import UserError
from ..progress import progress_bar
from ..training.checkpoint import CorruptCheckpoint, step_dirs
from ..training.runio import load_checkpoint
from .builtin.downstream import downstream_columns, lookup_probe
from .builtin.fewshot import fewshot_data
from .builtin.loss import evaluator
from .fewshot import fewshot_probes
from .representations import reference_representation
from .spec import TRACES, Job, MeasureSpec, measures_of
from .tasks import get_task

__all__ = ["MeasureSpec", "TRACES", "check_output", "checkpoints_of", "measure_checkpoint", "measure_hf_folder",
           "measure_lookup_table", "measure_model", "measure_path", "measure_reference", "write_rows"]


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
    """Measure one checkpoint on the language it was trained on.

    Args:
        path: the checkpoint folder.
        spec: what to measure.
        cache: shared across calls (the held-out evaluator, task data: built once per language).

    Returns:
        the row: ``checkpoint``, ``run``, ``step`` and the measured columns.
    """
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
    to logits, with ``features`` for probes), added to ``row``: every measure's memory
    check first (nothing is allocated before all pass), then each measure in row order."""
    cache = {} if cache is None else cache
    check_measure(spec, cfg, language, model, cache)  # before any measure allocates
    job = Job(model, language, cfg, spec, cache, {**(row or {}), "parameters": sum(p.numel() for p in model.parameters())})
    for measure in measures_of(spec):
        job.row.update(measure.compute(job))
    return job.row


def measure_reference(kind: str, language, cfg, spec: MeasureSpec, cache: dict | None = None) -> dict:
    """The few-shot probes of ``spec.fewshot`` on a reference representation
    (``representations.REFERENCES``: ``random-init`` — ``cfg``'s model freshly initialised
    from its seed —, ``lookup``, ``oracle``), and the task's majority rate on the test set
    (``fewshot_majority``): the headroom a trained model is placed in."""
    if spec.fewshot is None:
        raise UserError("a reference representation is measured by few-shot probes: give the spec a fewshot design")
    cache = {} if cache is None else cache
    data = fewshot_data(cache, language, cfg, spec.fewshot)
    task = get_task(language, spec.fewshot.task)
    pool_h, test_h = (reference_representation(kind, language, cfg, split.tokens, spec.device, task=task)
                      for split in (data.train, data.test))
    row = fewshot_probes(pool_h, test_h, data.train.labels, data.test.labels, data.n_classes, spec.fewshot)
    row["fewshot_majority"] = data.majority()[1]
    return row


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
        held_out = evaluator(cache, language, cfg, spec)
        ent = held_out.entropy
        subsets = [float(ent[held_out.subset == k].mean()) for k in range(held_out.n_subsets)]
        mean = float(ent.mean())
        row.update(loss=mean, loss_std=_std(subsets), kl=0.0, kl_std=0.0, entropy=mean, n_tokens=int(ent.numel()))
    for task in spec.lookup:
        row.update(downstream_columns("lookup", task, lookup_probe(cache, language, cfg, task, spec)))
    return row


def _std(values: list[float]) -> float:
    n = len(values)
    if n < 2:
        return float("nan")
    m = sum(values) / n
    return math.sqrt(sum((v - m) ** 2 for v in values) / (n - 1))


def measure_path(path: str | Path, spec: MeasureSpec, progress: bool = True,
                 skipped: list[str] | None = None, language_config: str | Path | None = None,
                 overrides: tuple[str, ...] = ()) -> list[dict]:
    """Measure a checkpoint, every checkpoint of a run, or a Hugging Face masked-LM folder.

    Args:
        path: a checkpoint folder, a run folder or a Hugging Face folder.
        spec: what to measure and at which sizes.
        progress: show progress bars.
        skipped: a list: a damaged checkpoint of a run is left out and its problem appended
            here; without it, or when no checkpoint can be read, ``CorruptCheckpoint`` /
            ``UserError`` is raised (one line per damaged checkpoint).
        language_config: a Hugging Face folder only: a pretrain config TOML whose
            ``[language]`` says what to measure it on (a checkpoint's language is in its config).
        overrides: a Hugging Face folder only: ``language.*`` ``key=value`` settings.

    Returns:
        one row (a dict of the measured columns, ``step`` and ``checkpoint`` first) per
        checkpoint, in step order.
    """
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
        raise storage.write_error(out, exc) from None
    return files.write_output(out, text, force)


def check_measure(spec, cfg, language, model, cache: dict | None = None) -> None:
    """Refuse a ``measure`` whose sampled sentences, task data or features cannot fit: the
    memory check of every measure ``spec`` asks for (``Measure.check``; the measures'
    registry, ``measures.spec``), before any of them allocates."""
    job = Job(model, language, cfg, spec, {} if cache is None else cache, {})
    for measure in measures_of(spec):
        measure.check(job)

