"""``sameloss export``: a checkpoint as a Hugging Face folder that needs no sameloss.

The folder holds ``config.json`` + ``model.safetensors`` (a ``BertForMaskedLM``: the
post-LN transformer maps one to one onto BERT, see ``hf/bert.py``), a word-level
tokenizer whose ids are the language's (``vocab.save_tokenizer``), ``sameloss.toml`` (the
run's resolved config: the recipe, and how to rebuild the language) and a model card
``README.md`` with the language, its entropy, the model's exact KL and the measured trace
of Hessian when a measures file of the run has it.

Pre-LN transformers and LSTMs are refused: BERT is post-LN, and Hugging Face has no
masked-LM class of either shape that would load without custom code.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import NamedTuple

from .. import config as configlib
from .. import files
from ..errors import UserError
from ..models.transformer import TransformerMLM
from ..libraries import quiet_transformers


def check_exportable(model) -> None:
    """``UserError`` (one line, naming why) unless ``model`` is a post-LN transformer
    with BERT's MLM head."""
    if not isinstance(model, TransformerMLM):
        raise UserError(f"cannot export a {type(model).__name__}: only post-LN transformers have a Hugging Face "
                        "equivalent (BertForMaskedLM); an LSTM masked LM has none")
    if model.config.norm != "post":
        raise UserError("cannot export a pre-LN transformer: BertForMaskedLM is post-LN and Hugging Face has no "
                        "pre-LN masked-LM class that loads without custom code")
    if not model.config.mlm_head_transform:
        raise UserError("cannot export a transformer without the MLM head transform: BertForMaskedLM always has it")


def _load(path: Path):
    """``(model, language, config, meta, checkpoint dir)`` of a checkpoint or of a run's
    newest complete one."""
    from ..training.checkpoint import complete_checkpoints
    from ..training.runio import load_checkpoint

    if not path.is_dir():
        raise UserError(f"no such run or checkpoint: {path}")
    if (path / "meta.json").exists():
        ckpt = path
    else:
        found = complete_checkpoints(path)
        if not found:
            raise UserError(f"{path} holds no complete checkpoint (expected a run folder or a checkpoints/step_* "
                            "folder)")
        ckpt = found[-1]
    model, language, cfg, meta = load_checkpoint(ckpt, "cpu")
    return model, language, cfg, meta, ckpt


def export_checkpoint(path: str | Path, out: str | Path, measures: str | Path | None = None) -> Path:
    """Write a checkpoint as a Hugging Face folder (``BertForMaskedLM``, word-level tokenizer,
    ``sameloss.toml``, model card) that transformers loads without sameloss.

    Args:
        path: a checkpoint folder, or a run folder (its newest checkpoint).
        out: the new folder; it must not exist.
        measures: a ``sameloss measure --out`` file to take the trace from (default: any
            such file inside the run folder that has a row of this checkpoint).

    Returns:
        ``out``.
    """
    out = Path(out)
    if out.exists() or out.is_symlink():
        raise UserError(f"{out} already exists; export writes a new folder (choose another --out)")
    model, language, cfg, meta, ckpt = _load(Path(path))
    run_dir = ckpt.parent.parent
    inside = _run_folder_holding(out)
    if inside is not None:
        raise UserError(f"{out} is inside the sameloss run or checkpoint {inside}; export into a folder of its own")
    check_exportable(model)
    try:
        import tokenizers  # noqa: F401
        import transformers
    except ImportError:
        raise UserError("sameloss export needs the transformers and tokenizers packages") from None
    from .bert import to_hf_bert
    from .vocab import add_unk_row, save_corpus_tokenizer, save_tokenizer

    evaluation = _evaluation(model, language, cfg, meta, ckpt)
    trace = _measured_trace(ckpt, run_dir, measures)
    # built under a marked temporary sibling and renamed into place at the end (the folder's
    # lock held meanwhile): a full disk or a kill leaves nothing under --out, and a full
    # disk is one line (also when safetensors or tokenizers report it as their own error)
    with files.building(out, what="export") as tmp:
        hf = to_hf_bert(model.float())
        corpus = not getattr(language, "exact", True)
        if not corpus:
            add_unk_row(hf, language)  # the tokenizer's [UNK], after the language's ids
        hf.config.architectures = ["BertForMaskedLM"]
        with quiet_transformers(transformers):  # a shard-writing bar for one small file is noise
            hf.save_pretrained(str(tmp))
        for written in tmp.iterdir():  # safetensors writes 0600; the others follow the umask
            if written.is_file():
                files.honour_umask(written)
        if corpus:  # the corpus's own tokenizer, its text split as in training
            save_corpus_tokenizer(language, tmp, language.max_len)
        else:
            save_tokenizer(language, tmp, language.max_len)
        (tmp / "sameloss.toml").write_text(f"# sameloss config of the run {cfg.name} this model was exported from\n"
                                           + configlib.to_toml(cfg))
        (tmp / "README.md").write_text(model_card(model, language, cfg, meta, ckpt, evaluation, trace))
    return out


def _run_folder_holding(path: Path) -> Path | None:
    """The sameloss folder ``path`` would be written into, if any: a run
    (``files.is_run_dir``, or any folder with a ``checkpoints/`` of step folders), an
    ``embed`` output or a checkpoint."""
    from ..files import is_embedded_dir, is_run_dir
    from ..training.checkpoint import step_dirs

    for folder in path.resolve().parents:
        if (is_run_dir(folder) or is_embedded_dir(folder) or (folder / "meta.json").is_file()
                or ((folder / "checkpoints").is_dir() and step_dirs(folder))):
            return folder
    return None


def _evaluation(model, language, cfg, meta: dict, ckpt: Path) -> dict:
    """The exact held-out evaluation at this checkpoint: from its meta, else the run's
    summary when it is of the same step, else computed as training does."""
    from ..training.evaluate import make_evaluator

    if meta.get("eval") and "kl" in meta["eval"]:
        return {**meta["eval"], "source": "checkpoint meta.json"}
    summary = ckpt.parent.parent / "summary.json"
    if summary.is_file():
        try:
            data = json.loads(summary.read_text(encoding="utf-8"))
        except (OSError, ValueError):  # a damaged summary: the evaluation is computed instead
            data = {}
        data = data if isinstance(data, dict) else {}
        if data.get("step") == meta.get("step") and data.get("eval") and "kl" in data["eval"]:
            return {**data["eval"], "source": "run summary.json"}
    rate = None if cfg.masking == "single" else cfg.mask_rate
    # exact on a synthetic language, the held-out cross-entropy on a corpus (as training)
    evaluator = make_evaluator(language, cfg.eval.n_sentences, rate, cfg.eval.seed, cfg.eval.n_subsets)
    return {**evaluator.evaluate(model, "cpu"), "source": "computed at export"}


def _measured_trace(ckpt: Path, run_dir: Path, measures: str | Path | None) -> dict | None:
    """The trace columns of this checkpoint's row in a measures file (CSV or JSON)."""
    if measures is not None:
        measures = Path(measures)
        if not measures.is_file():
            raise UserError(f"measures file not found: {measures}")
        rows = _rows(measures)
        if rows is None:
            raise UserError(f"--measures {measures} is not a file written by `sameloss measure --out` (a CSV with "
                            "a header, or a JSON list of rows)")
        found = _trace_of(rows, ckpt.resolve(), measures)
        if found is None:
            raise UserError(f"--measures {measures} has no row with a trace of Hessian for the checkpoint {ckpt}")
        return found
    elif not (run_dir / "checkpoints").is_dir():
        return None  # a lone checkpoint: no run folder to look in
    else:
        candidates = sorted(p for p in run_dir.rglob("*") if p.suffix in (".csv", ".json") and p.is_file()
                            and "checkpoints" not in p.relative_to(run_dir).parts and p.name != "summary.json")
    target = ckpt.resolve()
    for file in candidates:
        found = _trace_of(_rows(file) or [], target, file)
        if found is not None:
            return found
    return None


def _trace_of(rows: list[dict], target: Path, file: Path) -> dict | None:
    """The trace columns of the row of checkpoint ``target`` among ``rows``."""
    for row in rows:
        where = row.get("checkpoint")
        if not where or Path(str(where)).resolve() != target:
            continue
        found = {k: row[k] for k in row if k.startswith("trace_") and row[k] not in (None, "")}
        if found:
            found["file"] = str(file)
            found["n_params_measured"] = row.get("n_params_measured")
            return found
    return None


def _rows(file: Path) -> list[dict] | None:
    """The rows of a ``sameloss measure --out`` file (CSV or JSON); None if it is not one
    (unreadable, not UTF-8, not a CSV with a ``checkpoint`` column or a JSON list of rows)."""
    try:
        text = file.read_text(encoding="utf-8")
        if file.suffix == ".csv":
            rows = list(csv.DictReader(text.splitlines()))
            return rows if rows and "checkpoint" in rows[0] else None
        data = json.loads(text)
    except (OSError, UnicodeDecodeError, ValueError, csv.Error):
        return None
    if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
        return None
    return data


def _number(value, digits: int = 6) -> str:
    try:
        return f"{float(value):.{digits}g}"
    except (TypeError, ValueError):
        return str(value)


def _trace_text(trace: dict | None) -> str:
    if not trace:
        return "not measured (run `sameloss measure THIS_FOLDER --trace fisher`)"
    parts = []
    for name in ("fisher", "hutchinson", "hutchpp"):
        if f"trace_{name}" in trace:
            se = trace.get(f"trace_{name}_se")
            parts.append(f"`trace_{name}` = {_number(trace[f'trace_{name}'])}"
                         + (f" ± {_number(se, 2)}" if se not in (None, "") else ""))
    return (f"{'; '.join(parts)} over {trace.get('n_params_measured') or 'all'} parameters "
            f"(from `{trace['file']}`; measured on the sameloss checkpoint)")


class _CardParts(NamedTuple):
    """What a model card says differently for a corpus and for a synthetic language."""

    what: str  # what the model was pre-trained on
    tags: str
    data_lines: list[str]  # the data's section
    loss_line: str
    example: str  # the tokenizer call of the usage example
    output: str  # what the logits are over
    use_note: str


def _corpus_parts(language, cfg, evaluation: dict) -> _CardParts:
    """A corpus's card: the held-out cross-entropy and the train/held-out gap; no entropy, no KL."""
    from .vocab import SPECIAL_TOKENS

    lc = cfg.language
    sep = language.words[language.sep_id]
    data_lines = [
        "## Corpus",
        "",
        f"- `{lc.data}`: {language.n_words} tokens of its tokenizer ({language.meta.get('tokenizer', '?')}) + "
        f"sameloss's {', '.join(SPECIAL_TOKENS)}; sequences of {language.max_len} tokens, each starting with "
        f"[CLS], documents separated by `{sep}`.",
        "- Rebuild the run: `sameloss.toml` here is its resolved config (`language.data` names the corpus "
        "folder; `sameloss pretrain --config sameloss.toml`).",
        "- No entropy and no KL: real text has no known true conditionals, so the loss does not split into "
        "entropy + KL; the held-out cross-entropy and the train/held-out gap are reported instead.",
    ]
    gap = evaluation.get("gap")
    loss_line = (f"- Held-out cross-entropy {_number(evaluation.get('loss'))}"
                 + (f" ± {_number(evaluation.get('loss_std'), 2)}" if evaluation.get("loss_std") is not None
                    else "")
                 + f" nats/token over {evaluation.get('n_tokens')} masked tokens"
                 + (f"; on a subset of the training sequences {_number(evaluation.get('train_loss'))} (gap "
                    f"{_number(gap, 3)})" if gap is not None else "")
                 + f" ({evaluation.get('source')}).")
    return _CardParts(
        what=(f"a real-text corpus (`{lc.data}`, prepared by `sameloss corpus prepare`), where no exact "
              "masked-token conditionals exist"),
        tags="[sameloss, real-text, masked-lm]",
        data_lines=data_lines,
        loss_line=loss_line,
        example="tok([\"a text [MASK] as the corpus has it\"], return_tensors=\"pt\", padding=True)",
        output=f"over the tokenizer's {language.n_words} tokens, then [PAD] [MASK] [CLS]",
        use_note=(f"The tokenizer is the corpus's own: it splits a text as training did and writes it as "
                  f"`[CLS] text {sep}` (a pair: `[CLS] a {sep} b {sep}`), padding on the right with an attention "
                  "mask. The token-type embedding is zero (sameloss models have none). `sameloss measure FOLDER` "
                  "measures this folder on its corpus again (read from `sameloss.toml`)."))


def _language_parts(language, cfg, evaluation: dict, masking: str) -> _CardParts:
    """A synthetic language's card: its entropy and the model's exact KL."""
    from .vocab import SPECIAL_TOKENS, UNK_TOKEN, word_tokens

    lc = cfg.language
    std = evaluation.get("kl_std")
    source = f"grammar file {lc.grammar}" if lc.grammar else f"size {lc.size}" + (
        f", seed {lc.seed}" if lc.seed is not None else "") + (f", params {lc.params}" if lc.params else "")
    words = word_tokens(language)
    shown = " ".join(words[:12]) + (" …" if len(words) > 12 else "")
    data_lines = [
        "## Language",
        "",
        f"- `{language.name}` ({source}): {language.n_words} words + {len(SPECIAL_TOKENS)} special tokens "
        f"({', '.join(SPECIAL_TOKENS)}), sentences up to {language.max_len} tokens.",
        f"- Words: {shown}",
        "- Rebuild it: `sameloss.toml` here is the run's resolved config; its `[language]` table is the "
        "language (`sameloss language describe` with those settings, or "
        "`sameloss pretrain --config sameloss.toml` for the whole recipe).",
        f"- Entropy of the true conditionals (the optimal loss, {masking}): "
        f"{_number(evaluation.get('entropy'))} nats/token.",
    ]
    loss_line = (f"- Exact held-out loss {_number(evaluation.get('loss'))} = entropy + KL, "
                 f"KL(p ‖ model) = {_number(evaluation.get('kl'))}"
                 + (f" ± {_number(std, 2)}" if std is not None else "")
                 + f" nats/token over {evaluation.get('n_tokens')} masked tokens ({evaluation.get('source')}).")
    return _CardParts(
        what="a synthetic language whose masked-token conditionals are known exactly",
        tags="[sameloss, synthetic-language, masked-lm]",
        data_lines=data_lines,
        loss_line=loss_line,
        example=f"tok([\"{' '.join(words[:3])} [MASK]\"], return_tensors=\"pt\", padding=True)",
        output=f"over the words, then [PAD] [MASK] [CLS] (and {UNK_TOKEN}, never predicted)",
        use_note=("Sentences are whitespace-separated words; a word outside the language becomes "
                  f"{UNK_TOKEN}. The tokenizer adds no [CLS]/[SEP] (the model was trained on bare sentences) "
                  "and pads on the right with an attention mask. The token-type embedding is zero (sameloss "
                  "models have none). `sameloss measure FOLDER` measures this folder on its language again "
                  "(read from `sameloss.toml`)."))


def model_card(model, language, cfg, meta: dict, ckpt: Path, evaluation: dict, trace: dict | None) -> str:
    """The ``README.md`` of an exported folder: for a synthetic language its entropy and
    the model's exact KL; for a corpus (no exact conditionals) the held-out cross-entropy
    and the train/held-out gap, and no entropy or KL at all."""
    mc = model.config
    step = meta.get("step")
    masking = "one masked position per sentence" if cfg.masking == "single" else f"{cfg.mask_rate:.0%} masking"
    if not getattr(language, "exact", True):
        what, tags, data_lines, loss_line, example, output, use_note = _corpus_parts(language, cfg, evaluation)
    else:
        what, tags, data_lines, loss_line, example, output, use_note = _language_parts(language, cfg, evaluation,
                                                                                         masking)
    lines = [
        "---",
        "library_name: transformers",
        "pipeline_tag: fill-mask",
        f"tags: {tags}",
        "---",
        "",
        f"# {cfg.name} (sameloss, step {step})",
        "",
        f"A `BertForMaskedLM` exported by `sameloss export` from `{ckpt}`: a post-LN transformer "
        f"({mc.n_layers} layer{'s' if mc.n_layers > 1 else ''}, d_model {mc.d_model}, {mc.n_heads} heads, MLP {mc.d_inter}, "
        f"{model.num_parameters()} parameters) pre-trained by masked language modelling on {what}.",
        "",
        *data_lines,
        "",
        "## This model",
        "",
        loss_line,
        f"- Trace of Hessian: {_trace_text(trace)}.",
        f"- Recipe: {cfg.steps} steps, batch {cfg.batch_size}, {masking}, {cfg.optim.name} lr {cfg.optim.lr}, "
        f"weight decay {cfg.optim.weight_decay}, dropout {cfg.model.dropout}, seed {cfg.seed}"
        + (f", SAM rho {cfg.sam.rho}" if cfg.sam.rho > 0 else "") + " (all of it in `sameloss.toml`).",
        "",
        "## Use",
        "",
        "```python",
        "from transformers import AutoModelForMaskedLM, AutoTokenizer",
        "tok = AutoTokenizer.from_pretrained(FOLDER)",
        "model = AutoModelForMaskedLM.from_pretrained(FOLDER)",
        f"batch = {example}",
        f"logits = model(**batch).logits  # {output}",
        "```",
        "",
        use_note,
        "",
    ]
    return "\n".join(lines)
