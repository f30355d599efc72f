"""``export`` and ``measure`` of Hugging Face folders, issue 20: a full disk is one line and
leaves nothing (item 4); a bad ``--measures`` file is one line (item 8); only our line on
stderr (item 10); exported tokenizers have ``[UNK]`` (item 11); a corpus run gets a card and
a tokenizer fit for real text (item 12)."""

from __future__ import annotations

import csv
import errno
import json
import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from helpers.processes import ENV, error_lines, run_cli  # noqa: E402
from sameloss import files  # noqa: E402
from sameloss.cli import main  # noqa: E402
from sameloss.data.toy import toy_text  # noqa: E402
from sameloss.training.checkpoint import complete_checkpoints  # noqa: E402
from sameloss.training.runio import load_checkpoint  # noqa: E402


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("sameloss: error: "), err
    return err[0]


@pytest.fixture(scope="module")
def exported(checkpoint, tmp_path_factory):
    out = tmp_path_factory.mktemp("export_safety") / "hf"
    assert main(["export", str(checkpoint), "--out", str(out)]) == 0
    return out


# ---------------------------------------------------------------------------- item 11: [UNK]


def test_the_exported_tokenizer_writes_an_unknown_word_as_unk(exported, checkpoint):
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    language = load_checkpoint(checkpoint).language
    tok = AutoTokenizer.from_pretrained(str(exported))
    ids = tok(f"{language.words[0]} neverseen {language.words[1]} [MASK]")["input_ids"]
    unk = language.vocab_size  # after the language's words and specials: their ids unchanged
    assert ids == [0, unk, 1, language.mask_id] and tok.unk_token_id == unk
    model = AutoModelForMaskedLM.from_pretrained(str(exported)).eval()
    with torch.no_grad():
        probs = model(**tok(["neverseen w1 [MASK]"], return_tensors="pt")).logits.softmax(-1)
    assert bool((probs[..., unk] == 0).all())  # never predicted


def test_measuring_an_export_on_a_language_it_cannot_express_is_one_line(exported, capsys):
    """It crashed on "Missing [UNK] token" instead of the promised one-line error."""
    assert main(["measure", str(exported), "--loss", "language.name=pcfg", "language.size=tiny"]) == 2  # 24 words
    line = one_error_line(capsys)
    assert "the tokenizer cannot express the pcfg language" in line and "is not one token" in line


# ---------------------------------------------------------------------------- item 10: only our line


def test_measuring_an_hf_folder_prints_no_torch_warning(exported):
    done = run_cli(["measure", str(exported), "--loss", "--trace", "fisher", "--contexts", "16", "--labels", "2",
                    "--no-progress"])
    assert done.returncode == 0 and done.stderr == "", done.stderr


def test_an_unknown_model_type_is_our_one_line_only(exported, tmp_path):
    folder = tmp_path / "odd"
    folder.mkdir()
    for f in exported.iterdir():
        (folder / f.name).write_bytes(f.read_bytes())
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "model_type": "not-a-model"}))
    done = run_cli(["measure", str(folder), "--loss"])
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == error_lines(done.stderr) and len(error_lines(done.stderr)) == 1, \
        done.stderr
    assert "cannot load a Hugging Face masked LM" in done.stderr


# ---------------------------------------------------------------------------- item 8: --measures


@pytest.mark.parametrize("content", [b"\x89PNG\r\n\x1a\n\xff\xfe garbage", b"just some words\nand more\n",
                                     b'{"not": "a list"}', b""])
def test_a_measures_file_that_is_not_one_is_one_line(checkpoint, tmp_path, capsys, content):
    bad = tmp_path / ("m.csv" if content.startswith(b"just") else "m.json")
    bad.write_bytes(content)
    out = tmp_path / "hf"
    assert main(["export", str(checkpoint), "--out", str(out), "--measures", str(bad)]) == 2
    assert str(bad) in one_error_line(capsys)
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == [bad.name]


def test_a_measures_file_without_this_checkpoint_is_one_line(checkpoint, tmp_path, capsys):
    table = tmp_path / "m.csv"
    with table.open("w", newline="") as f:
        csv.writer(f).writerows([["checkpoint", "trace_fisher"], ["runs/other/checkpoints/step_0000001", "3.0"]])
    assert main(["export", str(checkpoint), "--out", str(tmp_path / "hf"), "--measures", str(table)]) == 2
    assert "has no row" in one_error_line(capsys)


# ---------------------------------------------------------------------------- item 4: a full disk


def test_a_full_disk_during_export_is_one_line_leaves_nothing_and_the_rerun_works(checkpoint, tmp_path):
    out = tmp_path / "hf"
    done = run_cli(["export", str(checkpoint), "--out", str(out)], file_size_limit=4096)
    assert done.returncode == 2, done.stderr
    assert error_lines(done.stderr) == done.stderr.strip().splitlines() and len(done.stderr.strip().splitlines()) == 1
    assert f"cannot write {out}: File too large" in done.stderr
    assert list(tmp_path.iterdir()) == []  # no half folder, no temporary sibling, no lock file
    assert main(["export", str(checkpoint), "--out", str(out)]) == 0  # the rerun, space "freed"
    assert (out / "model.safetensors").is_file() and not (out / files.PARTIAL_MARKER).exists()


def test_a_full_disk_reported_by_the_tokenizers_library_is_one_line(checkpoint, tmp_path, capsys, monkeypatch):
    """tokenizers (Rust) raises a plain Exception whose message ends in "(os error 28)"."""
    from tokenizers import Tokenizer

    def full(self, path, pretty=True):
        raise Exception(f"No space left on device (os error {errno.ENOSPC})")

    monkeypatch.setattr(Tokenizer, "save", full)
    assert main(["export", str(checkpoint), "--out", str(tmp_path / "hf")]) == 2
    assert one_error_line(capsys) == f"sameloss: error: cannot write {tmp_path / 'hf'}: No space left on device"
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------- item 12: a corpus run


@pytest.fixture(scope="module")
def corpus_export(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus_export")
    toy = toy_text(root / "toy", seed=0, n_corpus=120, n_train=10, n_dev=10)
    assert main(["corpus", "prepare", str(toy["corpus"]), "--out", str(root / "corpus"), "--vocab", "120",
                 "--max-len", "16"]) == 0
    assert main(["pretrain", "name=c", "--out", str(root / "runs"), "language.name=corpus",
                 f"language.data={root / 'corpus'}", "steps=4", "batch_size=8", "model.size=micro",
                 "eval.n_sentences=8", "optim.warmup_steps=1", "device=cpu", "--no-progress"]) == 0
    assert main(["export", str(root / "runs" / "c"), "--out", str(root / "hf")]) == 0
    return root


def test_the_card_of_a_corpus_run_has_its_cross_entropy_and_no_entropy_or_kl(corpus_export):
    card = (corpus_export / "hf" / "README.md").read_text()
    summary = json.loads((corpus_export / "runs" / "c" / "summary.json").read_text())["eval"]
    assert "None" not in card and "Entropy of the true" not in card and "KL(p" not in card
    assert f"Held-out cross-entropy {summary['loss']:.6g}" in card and "real-text" in card
    assert str(corpus_export / "corpus") in card


def test_the_tokenizer_of_a_corpus_export_writes_text_as_training_did(corpus_export):
    """AutoTokenizer writes a text as [CLS] + the corpus's ids + [SEP], [MASK] as the
    model's mask id, and the exported model's logits are the checkpoint's."""
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    ckpt = complete_checkpoints(corpus_export / "runs" / "c")[-1]
    model, language, _, _ = load_checkpoint(ckpt)
    folder = str(corpus_export / "hf")
    tok = AutoTokenizer.from_pretrained(folder)
    text = "the first words of a text"
    ids = tok(text)["input_ids"]
    assert ids == [language.cls_id, *language.encode([text])[0], language.sep_id]
    assert tok("a [MASK] b")["input_ids"][2] == language.mask_id and tok.pad_token_id == language.pad_id
    hf = AutoModelForMaskedLM.from_pretrained(folder).eval()
    with torch.no_grad():
        theirs = hf(input_ids=torch.tensor([ids])).logits
        ours = model(torch.tensor([ids]))
    torch.testing.assert_close(theirs, ours, rtol=0, atol=1e-5)


def test_a_corpus_export_measures_as_its_checkpoint(corpus_export, capsys):
    ckpt = complete_checkpoints(corpus_export / "runs" / "c")[-1]
    assert main(["measure", str(ckpt), "--loss", "--json", "--no-progress"]) == 0
    (ours,) = json.loads(capsys.readouterr().out)
    assert main(["measure", str(corpus_export / "hf"), "--loss", "--json", "--no-progress"]) == 0
    (theirs,) = json.loads(capsys.readouterr().out)
    assert theirs["loss"] == pytest.approx(ours["loss"], rel=1e-6) and theirs["kl"] is None


def test_a_tokenizers_own_specials_are_renamed_for_sameloss_ids(tmp_path):
    """A corpus prepared with a tokenizer that has its own [MASK]/[PAD]/[CLS]: in the export
    those names mean the ids the model was trained with."""
    from tokenizers import AddedToken
    from transformers import AutoTokenizer

    from sameloss.hf.vocab import save_corpus_tokenizer
    from sameloss.languages.text import read_documents, train_tokenizer

    toy = toy_text(tmp_path / "toy", seed=0, n_corpus=60, n_train=5, n_dev=5)
    tok = train_tokenizer("wordpiece", read_documents(toy["corpus"]), 80)
    tok.add_special_tokens([AddedToken(s, special=True) for s in ("[PAD]", "[CLS]", "[MASK]")])

    class Corpus:  # what save_corpus_tokenizer reads of a languages.text.Corpus
        tokenizer = tok
        n_words = tok.get_vocab_size(with_added_tokens=True)
        sep_id = tok.token_to_id("[SEP]")
        words = [tok.id_to_token(i) for i in range(n_words)]

    (tmp_path / "hf").mkdir()
    save_corpus_tokenizer(Corpus, tmp_path / "hf", 16)
    hf = AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    n = Corpus.n_words
    assert (hf.pad_token_id, hf.mask_token_id, hf.cls_token_id) == (n, n + 1, n + 2)
    assert hf("a [MASK] b")["input_ids"][2] == n + 1 and hf("a")["input_ids"][0] == n + 2
