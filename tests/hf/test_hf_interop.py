"""Hugging Face interop: ``sameloss export`` and ``sameloss measure HF_FOLDER``."""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from sameloss.cli import main  # noqa: E402
from sameloss.hf.adapter import load_hf_folder  # noqa: E402
from sameloss.hf.export import check_exportable  # noqa: E402
from sameloss.hf.vocab import UNK_LOGIT  # noqa: E402
from sameloss.languages import make_language  # noqa: E402
from sameloss.measures.curvature import FisherContexts, trace_fisher  # noqa: E402
from sameloss.models import build_model  # noqa: E402
from sameloss.training.evaluate import ExactEvaluator  # noqa: E402
from sameloss.training.runio import load_checkpoint  # noqa: E402

NO_TOKEN_TYPE = "^(?!.*token_type)"  # BERT's token-type embedding, which sameloss models do not have
TRACE = ["--trace", "fisher", "--contexts", "48", "--labels", "8", "--seed", "3"]


def rows_of(capsys) -> list[dict]:
    return json.loads(capsys.readouterr().out)


@pytest.fixture(scope="module")
def exported(checkpoint, tmp_path_factory):
    """The session checkpoint measured (loss, Fisher trace → a CSV) and exported with
    that CSV: ``(folder, row of the checkpoint)``."""
    root = tmp_path_factory.mktemp("hf_export")
    table = root / "measures.csv"
    assert main(["measure", str(checkpoint), "--loss", *TRACE, "--out", str(table), "--no-progress"]) == 0
    with table.open() as f:
        (row,) = list(csv.DictReader(f))
    assert main(["export", str(checkpoint), "--out", str(root / "hf"), "--measures", str(table)]) == 0
    return root / "hf", row


def test_export_round_trip_through_transformers_alone(exported, checkpoint, tmp_path):
    """The folder loads with sameloss unimportable; its tokenizer writes the language's
    sentences as sameloss ids, and its logits on a padded batch equal the checkpoint's."""
    folder, _ = exported
    model, language, _, _ = load_checkpoint(checkpoint)
    g = torch.Generator().manual_seed(0)
    tokens = language.sample(6, g).tokens
    lengths = torch.tensor([language.max_len, 3, 7, 1, 5, 10]).clamp(max=language.max_len)
    tokens[torch.rand(tokens.shape, generator=g) < 0.2] = language.mask_id
    tokens[torch.arange(tokens.shape[1])[None, :] >= lengths[:, None]] = language.pad_id
    texts = [language.decode(row) for row in tokens]
    script = (
        "import sys, json, torch\n"
        "sys.modules['sameloss'] = None  # any import of sameloss fails\n"
        "from transformers import AutoModelForMaskedLM, AutoTokenizer\n"
        "folder, texts, out = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]\n"
        "tok = AutoTokenizer.from_pretrained(folder)\n"
        "model = AutoModelForMaskedLM.from_pretrained(folder).eval()\n"
        "batch = tok(texts, padding=True, return_tensors='pt')\n"
        "with torch.no_grad():\n"
        "    logits = model(**batch).logits\n"
        "torch.save({'ids': batch['input_ids'], 'logits': logits, 'class': type(model).__name__}, out)\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = tmp_path / "theirs.pt"
    done = subprocess.run([sys.executable, "-c", script, str(folder), json.dumps(texts), str(out)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    theirs = torch.load(out)
    assert theirs["class"] == "BertForMaskedLM"
    width = int(lengths.max())
    assert torch.equal(theirs["ids"], tokens[:, :width])
    with torch.no_grad():
        ours = model(tokens[:, :width])
    real = tokens[:, :width] != language.pad_id
    V = language.vocab_size  # then the tokenizer's [UNK], after the language's ids: never predicted
    assert theirs["logits"].shape[-1] == V + 1 and bool((theirs["logits"][..., V] == UNK_LOGIT).all())
    torch.testing.assert_close(theirs["logits"][real][:, :V], ours[real], rtol=0, atol=1e-5)


def test_adapter_of_an_exported_folder_is_the_checkpoints_function(exported, checkpoint):
    folder, _ = exported
    model, language, _, _ = load_checkpoint(checkpoint)
    adapter = load_hf_folder(folder, language)
    tokens = language.sample(16, torch.Generator().manual_seed(1)).tokens
    tokens[3, 5:] = language.pad_id
    tokens[:, 2] = language.mask_id
    with torch.no_grad():
        torch.testing.assert_close(adapter(tokens), model(tokens), rtol=0, atol=1e-5)
        torch.testing.assert_close(adapter.features(tokens), model.features(tokens), rtol=0, atol=1e-5)
    assert adapter.d_features == model.d_features and adapter.config.pad_id == language.pad_id


def test_fisher_trace_and_loss_through_the_folder_equal_the_checkpoints(exported, checkpoint, capsys):
    """Same seed, same contexts and labels: the trace over the parameters both have is
    the checkpoint's; BERT's extra token-type embedding only adds to it."""
    folder, row = exported
    assert main(["measure", str(folder), "--loss", *TRACE, "--params", NO_TOKEN_TYPE, "--json", "--no-progress"]) == 0
    (hf_row,) = rows_of(capsys)
    d_model = load_checkpoint(checkpoint).model.config.d_model
    # and the [UNK] row: its embedding and output bias (both with zero gradient: never seen,
    # never predicted, so the trace is the same)
    assert hf_row["n_params_measured"] == int(row["n_params_measured"]) + d_model + 1
    assert hf_row["trace_fisher"] == pytest.approx(float(row["trace_fisher"]), rel=1e-5)
    for key in ("loss", "kl", "entropy"):  # the language comes from the folder's sameloss.toml
        assert hf_row[key] == pytest.approx(float(row[key]), rel=1e-6, abs=1e-9)
    assert main(["measure", str(folder), *TRACE, "--json", "--no-progress"]) == 0
    (everything,) = rows_of(capsys)
    assert everything["n_params_measured"] > hf_row["n_params_measured"]
    assert everything["trace_fisher"] > hf_row["trace_fisher"]


def test_model_card_states_language_entropy_kl_and_the_measured_trace(exported, checkpoint):
    folder, row = exported
    card = (folder / "README.md").read_text()
    meta = json.loads((checkpoint / "meta.json").read_text())
    assert "`hmm`" in card
    assert f"{meta['eval']['entropy']:.6g}" in card and f"{meta['eval']['kl']:.6g}" in card
    assert f"`trace_fisher` = {float(row['trace_fisher']):.6g}" in card
    assert (folder / "sameloss.toml").read_text().count("[language]") == 1


def random_bert_folder(folder, language, missing: str | None = None):
    """A random ``BertForMaskedLM`` with a word-level tokenizer whose ids are NOT the
    language's: specials first, words reversed, and extra words the language lacks."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import BertConfig, BertForMaskedLM, PreTrainedTokenizerFast

    specials = ["[UNK]", "[SEP]", "[PAD]", "[CLS]", "[MASK]"]
    names = specials + [w for w in reversed(language.words) if w != missing] + ["extra0", "extra1"]
    vocab = {w: i for i, w in enumerate(names)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", sep_token="[SEP]", pad_token="[PAD]",
                                   cls_token="[CLS]", mask_token="[MASK]")
    fast.save_pretrained(str(folder))
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=len(vocab), hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=32, max_position_embeddings=32, pad_token_id=vocab["[PAD]"])
    from transformers.utils import logging

    logging.disable_progress_bar()  # its bar would be read as the command's stderr
    try:
        BertForMaskedLM(cfg).save_pretrained(str(folder))
    finally:
        logging.enable_progress_bar()
    return vocab


def test_a_random_bert_is_measurable_end_to_end(tmp_path, capsys):
    language = make_language("hmm", preset="micro")
    vocab = random_bert_folder(tmp_path / "bert", language)
    out = tmp_path / "rows.csv"
    assert main(["measure", str(tmp_path / "bert"), "language.name=hmm", "language.size=micro", "--loss",
                 *TRACE, "--top-eig", "--probe", "task-3", "--finetune", "task-3", "--finetune-epochs", "1",
                 "--seeds", "1", "--task-size", "100", "--out", str(out), "--json", "--no-progress"]) == 0
    (row,) = rows_of(capsys)
    assert out.is_file() and row["architecture"] == "BertForMaskedLM" and row["language"] == "hmm"
    assert row["trace_fisher"] > 0 and row["top_eigenvalue"] > 0
    assert 0 <= row["probe_task-3"] <= 1 and 0 <= row["finetune_task-3"] <= 1
    # the KL again, straight through transformers: sentences as text, the tokenizer's ids,
    # the logit columns of the language's words and specials
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tmp_path / "bert"))
    bert = AutoModelForMaskedLM.from_pretrained(str(tmp_path / "bert")).eval().double()
    evaluator = ExactEvaluator(language, 2000, 0.15, 1_000_003, 5)  # measure's and the default config's
    batch = tok([language.decode(r) for r in evaluator.batch.inputs], return_tensors="pt", padding=True)
    with torch.no_grad():
        logits = bert(**batch).logits[evaluator.batch.masked]
    columns = [vocab[w] for w in language.words] + [vocab[s] for s in ("[PAD]", "[MASK]", "[CLS]")]
    logq = torch.log_softmax(logits[:, columns], dim=-1)[:, : language.n_words]
    kl = float((-(evaluator.true * logq).sum(dim=1) - evaluator.entropy).mean())
    assert row["kl"] == pytest.approx(kl, rel=1e-5)
    assert row["loss"] == pytest.approx(row["entropy"] + row["kl"], rel=1e-12)
    assert math.isfinite(row["loss"])


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("sameloss: error: "), err
    return err


def test_a_vocabulary_that_cannot_express_the_language_is_one_line(tmp_path, capsys):
    language = make_language("hmm", preset="micro")
    random_bert_folder(tmp_path / "bert", language, missing="w3")
    assert main(["measure", str(tmp_path / "bert"), "language.name=hmm", "language.size=micro", "--loss"]) == 2
    assert "'w3'" in one_error_line(capsys)


def test_measure_needs_a_language_for_a_foreign_folder_and_none_for_a_checkpoint(tmp_path, checkpoint, capsys):
    language = make_language("hmm", preset="micro")
    random_bert_folder(tmp_path / "bert", language)
    assert main(["measure", str(tmp_path / "bert"), "--loss"]) == 2
    assert "language.name=" in one_error_line(capsys)
    assert main(["measure", str(tmp_path / "bert"), "language.name=hmm", "steps=3", "--loss"]) == 2
    assert "steps=3" in one_error_line(capsys)
    assert main(["measure", str(checkpoint), "language.name=pcfg", "--loss"]) == 2
    assert "Hugging Face folders only" in one_error_line(capsys)
    (tmp_path / "neither").mkdir()
    (tmp_path / "neither" / "notes.txt").write_text("x")
    assert main(["measure", str(tmp_path / "neither"), "--loss"]) == 2
    assert "Hugging Face" in one_error_line(capsys)


def test_export_refuses_an_existing_out_and_leaves_it_alone(checkpoint, tmp_path, capsys):
    out = tmp_path / "taken"
    out.mkdir()
    (out / "mine.txt").write_text("keep me")
    assert main(["export", str(checkpoint), "--out", str(out)]) == 2
    assert "already exists" in one_error_line(capsys)
    assert [p.name for p in out.iterdir()] == ["mine.txt"] and (out / "mine.txt").read_text() == "keep me"


def test_export_never_writes_into_a_run_or_checkpoint(checkpoint, capsys):
    for out in (checkpoint.parent.parent / "hf", checkpoint / "hf"):
        assert main(["export", str(checkpoint), "--out", str(out)]) == 2
        assert "inside the sameloss run or checkpoint" in one_error_line(capsys)
        assert not out.exists()


@pytest.mark.parametrize("kind, norm, reason", [("transformer", "pre", "pre-LN"), ("lstm", None, "LSTM")])
def test_pre_ln_and_lstm_are_refused_naming_why(kind, norm, reason):
    from sameloss.errors import UserError

    extra = {"norm": norm} if norm else {}
    model = build_model(kind, "micro", 11, 8, **extra)
    with pytest.raises(UserError, match=reason):
        check_exportable(model)
    check_exportable(build_model("transformer", "micro", 11, 8))  # post-LN passes


def test_export_of_a_run_folder_takes_its_newest_checkpoint(checkpoint, tmp_path, capsys):
    assert main(["export", str(checkpoint.parent.parent), "--out", str(tmp_path / "hf")]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "hf")
    assert f"`{checkpoint}`" in (tmp_path / "hf" / "README.md").read_text()


def foreign_folder(folder, language, kind: str) -> dict:
    """A random RoBERTa, DeBERTa-v2 or DistilBERT masked LM with RoBERTa-style specials first."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import (DistilBertConfig, DistilBertForMaskedLM, PreTrainedTokenizerFast, RobertaConfig,
                              RobertaForMaskedLM)
    from transformers.utils import logging

    names = ["<s>", "<pad>", "</s>", "<unk>", "<mask>", "extra"] + list(language.words)
    vocab = {w: i for i, w in enumerate(names)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                            sep_token="</s>", pad_token="<pad>", cls_token="<s>",
                            mask_token="<mask>").save_pretrained(str(folder))
    torch.manual_seed(1)
    if kind == "roberta":  # position ids start after the pad id: 2 + max_len positions needed
        model = RobertaForMaskedLM(RobertaConfig(vocab_size=len(vocab), hidden_size=16, num_hidden_layers=1,
                                                 num_attention_heads=2, intermediate_size=32,
                                                 max_position_embeddings=language.max_len + 2, pad_token_id=1))
    elif kind == "deberta":
        from transformers import DebertaV2Config, DebertaV2ForMaskedLM

        model = DebertaV2ForMaskedLM(DebertaV2Config(vocab_size=len(vocab), hidden_size=16, num_hidden_layers=1,
                                                     num_attention_heads=2, intermediate_size=32,
                                                     max_position_embeddings=language.max_len, pad_token_id=1))
    else:
        model = DistilBertForMaskedLM(DistilBertConfig(vocab_size=len(vocab), dim=16, n_layers=1, n_heads=2,
                                                       hidden_dim=32, max_position_embeddings=language.max_len,
                                                       pad_token_id=1))
    logging.disable_progress_bar()
    try:
        model.save_pretrained(str(folder))
    finally:
        logging.enable_progress_bar()
    return vocab


@pytest.mark.parametrize("kind, mask_form", [("roberta", "4d"), ("distilbert", "4d"), ("deberta", "2d")])
def test_other_architectures_through_the_adapter(kind, mask_form, tmp_path):
    """Logits are the model's own, at the language's rows, on padded text (DeBERTa
    misreads the 4-D additive mask, so it gets the 2-D one); the Fisher trace's vmap
    engine agrees with plain autograd on these architectures."""
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    language = make_language("pcfg", preset="micro")  # sentences of different lengths: padding
    vocab = foreign_folder(tmp_path / kind, language, kind)
    adapter = load_hf_folder(tmp_path / kind, language)
    assert adapter.mask_form == mask_form and adapter.vmap_safe
    tokens = language.sample(8, torch.Generator().manual_seed(2)).tokens
    tokens[:, 0] = language.mask_id
    assert (tokens == language.pad_id).any()
    tok = AutoTokenizer.from_pretrained(str(tmp_path / kind))
    hf = AutoModelForMaskedLM.from_pretrained(str(tmp_path / kind)).eval()
    texts = [language.decode(r).replace("[MASK]", "<mask>") for r in tokens]
    batch = tok(texts, add_special_tokens=False, padding=True, return_tensors="pt")
    assert (batch["input_ids"] == vocab["<mask>"]).sum() == 8
    columns = [vocab[w] for w in language.words] + [vocab[s] for s in ("<pad>", "<mask>", "<s>")]
    with torch.no_grad():
        theirs = hf(**batch).logits[..., columns]
        ours = adapter(tokens[:, : batch["input_ids"].shape[1]])
    real = batch["attention_mask"].bool()
    torch.testing.assert_close(ours[real], theirs[real], rtol=0, atol=1e-5)
    fast = trace_fisher(adapter, language, FisherContexts(n_contexts=12, seed=1), n_labels=4)
    slow = trace_fisher(adapter, language, FisherContexts(n_contexts=12, seed=1, engine="autograd"), n_labels=4)
    assert fast.estimate == pytest.approx(slow.estimate, rel=1e-4) and fast.estimate > 0


def test_a_model_that_torch_func_cannot_batch_is_measured_with_autograd():
    from torch import nn

    from sameloss.models.derivatives import resolve_engine

    model = nn.Linear(2, 2)
    assert resolve_engine(model, "auto") == "func"
    model.vmap_safe = False
    assert resolve_engine(model, "auto") == "autograd" and resolve_engine(model, "func") == "func"


def test_a_checkpoint_without_an_evaluation_gets_it_computed_as_training_did(checkpoint, tmp_path):
    from sameloss.hf.export import _evaluation

    model, language, cfg, meta = load_checkpoint(checkpoint)
    computed = _evaluation(model, language, cfg, {"step": meta["step"]}, tmp_path / "checkpoints" / "step_1")
    assert computed["source"] == "computed at export"
    for key in ("entropy", "kl", "loss"):
        assert computed[key] == pytest.approx(meta["eval"][key], rel=1e-9)
