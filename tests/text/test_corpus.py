"""The corpus language: preparing text, shards, sampling, masking, held-out evaluation."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from sameloss import config as configlib
from sameloss.cli import main
from sameloss.errors import UserError
from sameloss.languages import make_language
from sameloss.languages.base import sample_mask
from sameloss.languages.text import Corpus, pack, prepare_corpus, read_documents
from sameloss.measures import curvature
from sameloss.data.toy import toy_text
from sameloss.training import PretrainConfig, load_checkpoint, pretrain
from sameloss.training.checkpoint import complete_checkpoints
from sameloss.training.data import global_batch


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    return toy_text(tmp_path_factory.mktemp("toy"), n_corpus=300)


@pytest.fixture(scope="module")
def prepared(toy, tmp_path_factory):
    out = tmp_path_factory.mktemp("prep") / "corpus"
    prepare_corpus([toy["corpus"]], out, tokenizer="wordpiece", vocab=120, max_len=24, heldout=0.1)
    return out


def test_read_documents_plain_jsonl_paragraph(tmp_path):
    (tmp_path / "a.txt").write_text("one doc\n\n  two doc \n")
    assert read_documents(tmp_path / "a.txt") == ["one doc", "two doc"]
    (tmp_path / "b.txt").write_text("first line\nsame doc\n\nsecond\n")
    assert read_documents(tmp_path / "b.txt", "paragraph") == ["first line same doc", "second"]
    (tmp_path / "c.jsonl").write_text('{"text": "hello there"}\n\n{"text": "x", "id": 3}\n')
    assert read_documents(tmp_path / "c.jsonl") == ["hello there", "x"]
    (tmp_path / "d.jsonl").write_text('{"title": "no text"}\n')
    with pytest.raises(UserError, match="field 'text'"):
        read_documents(tmp_path / "d.jsonl")


def test_parquet_without_pyarrow_is_one_clear_error(tmp_path, monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # as if not installed
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    (tmp_path / "x.parquet").write_bytes(b"PAR1")
    with pytest.raises(UserError, match="needs pyarrow"):
        read_documents(tmp_path / "x.parquet")


def test_pack_joins_documents_with_sep_behind_cls():
    rows = pack([[5, 6, 7], [8], [9, 10]], sep_id=1, cls_id=99, pad_id=98, max_len=4)
    # stream 5 6 7 S 8 S 9 10 S, chunks of 3, each behind CLS
    assert rows.tolist() == [[99, 5, 6, 7], [99, 1, 8, 1], [99, 9, 10, 1]]
    rows = pack([[5, 6]], sep_id=1, cls_id=99, pad_id=98, max_len=3)
    assert rows.tolist() == [[99, 5, 6], [99, 1, 98]]


def test_prepared_corpus_round_trip(prepared, toy):
    meta = json.loads((prepared / "meta.json").read_text())
    lang = Corpus(prepared)
    assert lang.n_words == meta["n_words"] <= 120 and lang.max_len == 24
    train, held = meta["splits"]["train"], meta["splits"]["heldout"]
    assert train["documents"] + held["documents"] == 300 and held["documents"] == 30
    assert lang.n_sequences("train") == train["sequences"] and lang.n_sequences("heldout") == held["sequences"]
    assert np.load(prepared / "train-00000.npy").dtype == np.uint16
    # every sequence starts with [CLS]; the non-pad tokens decode back to the documents' words
    batch = lang.split_batch("train")
    assert (batch.tokens[:, 0] == lang.cls_id).all()
    ids = batch.tokens[0, 1:].tolist()
    assert lang.sep_id in ids
    first_doc = lang.tokenizer.decode(ids[:ids.index(lang.sep_id)])
    assert first_doc.replace(" ", "") in toy["corpus"].read_text().replace(" ", "").splitlines()
    # checksums are recorded and checked
    shard = prepared / "train-00000.npy"
    assert meta["splits"]["train"]["shards"][0]["sha256"] != meta["splits"]["heldout"]["shards"][0]["sha256"]
    assert len(meta["sources"][0]["sha256"]) == 64
    data = shard.read_bytes()
    try:
        shard.write_bytes(data[:-2] + bytes([data[-2] ^ 1, data[-1]]))
        with pytest.raises(UserError, match="checksum"):
            Corpus(prepared)
    finally:
        shard.write_bytes(data)


def test_prepare_refuses_a_non_empty_out_and_missing_tokenizer(toy, tmp_path):
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "keep.txt").write_text("mine")
    with pytest.raises(UserError, match="not empty"):
        prepare_corpus([toy["corpus"]], tmp_path / "busy", vocab=50)
    assert (tmp_path / "busy" / "keep.txt").read_text() == "mine"
    with pytest.raises(UserError, match="tokenizer folder not found"):
        prepare_corpus([toy["corpus"]], tmp_path / "new", tokenizer=str(tmp_path / "nowhere"))


def test_cli_prepare_with_a_tokenizer_folder_and_bpe(toy, prepared, tmp_path, capsys):
    # a local Hugging Face tokenizer folder (tokenizer.json) is used as is
    folder = tmp_path / "tok"
    folder.mkdir()
    (folder / "tokenizer.json").write_text((prepared / "tokenizer.json").read_text())
    assert main(["corpus", "prepare", str(toy["corpus"]), "--tokenizer", str(folder), "--max-len", "16",
                 "--out", str(tmp_path / "c1")]) == 0
    assert Corpus(tmp_path / "c1").n_words == Corpus(prepared).n_words
    assert "train" in capsys.readouterr().out
    assert main(["corpus", "prepare", str(toy["corpus"]), "--tokenizer", "bpe", "--vocab", "80", "--max-len", "16",
                 "--out", str(tmp_path / "c2")]) == 0
    assert Corpus(tmp_path / "c2").tokenizer.get_vocab_size() <= 80
    assert main(["corpus", "prepare", str(toy["corpus"]), "--tokenizer", str(tmp_path / "missing"),
                 "--out", str(tmp_path / "c3")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "tokenizer folder not found" in err


def test_masking_never_hides_cls_or_sep_and_sampling_is_seeded(prepared):
    lang = make_language("corpus", data=str(prepared))
    a = global_batch(lang, 3, 7, 64, 0.15)
    b = global_batch(lang, 3, 7, 64, 0.15)
    assert torch.equal(a.inputs, b.inputs) and torch.equal(a.masked, b.masked)
    assert not torch.equal(a.targets, global_batch(lang, 3, 8, 64, 0.15).targets)
    hidden = a.targets[a.masked]
    assert not ((hidden == lang.cls_id) | (hidden == lang.sep_id) | (hidden == lang.pad_id)).any()
    assert a.masked.any(dim=1).all()
    assert (a.inputs[a.masked] == lang.mask_id).all()
    # single-position masks fall on maskable positions only, uniformly
    tokens = torch.tensor([[9, 0, 1, 9, 2]] * 6000)
    maskable = tokens != 9
    m = sample_mask(torch.full((6000,), 5), 5, None, torch.Generator().manual_seed(0), maskable)
    assert (m.sum(dim=1) == 1).all() and not m[:, [0, 3]].any()
    freq = m.double().mean(dim=0)[[1, 2, 4]]
    assert torch.allclose(freq, torch.full((3,), 1 / 3, dtype=torch.float64), atol=0.025)


def test_bert_80_10_10_replacement(prepared):
    lang = Corpus(prepared)
    batch = global_batch(lang, 0, 1, 4000, 0.15, replace="bert")
    shown = batch.inputs[batch.masked]
    truth = batch.targets[batch.masked]
    is_mask = (shown == lang.mask_id).double().mean()
    same = (shown == truth).double().mean()
    assert abs(is_mask - 0.8) < 0.02
    # 10 % unchanged plus the random words that happen to equal the truth
    assert 0.09 < same < 0.13
    assert torch.equal(batch.inputs[~batch.masked], batch.targets[~batch.masked])


def test_conditionals_refused(prepared):
    lang = Corpus(prepared)
    b = lang.sample(2, torch.Generator().manual_seed(0))
    with pytest.raises(UserError, match="not defined for a corpus"):
        lang.conditionals(b.tokens, b.tokens == lang.cls_id)


def corpus_config(prepared, **overrides):
    base = ["steps=80", "batch_size=32", "model.size=micro", "eval.every=40", "eval.n_sentences=40",
            "save_every=1000", "log_every=10", "optim.warmup_steps=5", "device=cpu", "language.name=corpus",
            f"language.data={prepared}", "optim.lr=3e-3"]
    return configlib.load(PretrainConfig, None, base + [f"{k}={v}" for k, v in overrides.items()])


def test_pretrain_on_a_corpus_logs_epochs_and_the_gap(prepared, tmp_path):
    cfg = corpus_config(prepared, mask_replace="bert")
    result = pretrain(cfg, tmp_path / "run", progress=False)
    assert result["kl"] is None and result["entropy"] is None and result["kl_note"] == "not defined for a corpus"
    assert result["gap"] == pytest.approx(result["heldout_loss"] - result["train_loss"])
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    n_train = Corpus(prepared).n_sequences("train")
    assert records[-1]["epoch"] == pytest.approx(80 * 32 / n_train)
    evals = [r["eval"] for r in records if "eval" in r]
    # the model learns the text: held-out loss falls well below the uniform guess
    assert evals[-1]["loss"] < evals[0]["loss"] < np.log(Corpus(prepared).vocab_size) + 0.5
    assert evals[-1]["loss"] < np.log(Corpus(prepared).vocab_size) - 0.5
    # the model and the language come back from the checkpoint; the Fisher trace works
    model, language, _, _ = load_checkpoint(complete_checkpoints(tmp_path / "run")[-1])
    r = curvature.trace_fisher(model, language, curvature.FisherContexts(n_contexts=16), n_labels=2, repeats=2)
    assert r.estimate > 0 and np.isfinite(r.estimate)


def test_cli_pretrain_and_measure_a_corpus(prepared, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(prepared.parent)  # a relative language.data is saved as an absolute path
    args = ["pretrain", "--out", str(tmp_path), "--no-progress", "name=c", "steps=6", "batch_size=16",
            "model.size=micro", "eval.n_sentences=20", "device=cpu", "language.name=corpus",
            f"language.data={prepared.name}", "optim.warmup_steps=2"]
    assert main(args) == 0
    monkeypatch.chdir(tmp_path)
    out = capsys.readouterr().out
    assert "held-out cross-entropy" in out and "KL not defined for a corpus" in out
    assert f'data = "{prepared.resolve()}"' in (tmp_path / "c" / "config.toml").read_text()
    assert main(["measure", str(tmp_path / "c"), "--loss", "--json", "--no-progress", "--device", "cpu"]) == 0
    row = json.loads(capsys.readouterr().out)[0]
    assert row["kl"] is None and row["kl_note"] == "not defined for a corpus" and row["loss"] > 0
    assert main(["measure", str(tmp_path / "c"), "--lookup-table", "x", "--no-progress", "--device", "cpu"]) == 2
    assert "look-up table is not defined for a corpus" in capsys.readouterr().err
    assert main(args[:4] + ["name=d", "language.name=corpus", "device=cpu"]) == 2
    assert "language.data=DIR" in capsys.readouterr().err


def test_decode_shows_words_and_specials(prepared):
    lang = Corpus(prepared)
    row = lang.split_batch("heldout", 1).tokens[0]
    text = lang.decode(row.masked_fill(torch.arange(lang.max_len) == 2, lang.mask_id))
    assert text.startswith("[CLS] ") and text.split()[2] == "[MASK]" and "[SEP]" in text.split()


def test_hf_folder_without_tokenizer_json_goes_through_autotokenizer(toy, tmp_path):
    pytest.importorskip("transformers")  # the test extra installs it; the path needs it
    folder = tmp_path / "bert-like"
    folder.mkdir()
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "movie", "was", "great", "bad", "."]
    (folder / "vocab.txt").write_text("\n".join(words) + "\n")
    (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "BertTokenizer",
                                                              "do_lower_case": True}))
    meta = prepare_corpus([toy["corpus"]], tmp_path / "c", tokenizer=str(folder), max_len=16)
    assert meta["n_words"] == len(words) and meta["sep_id"] == 3
    lang = Corpus(tmp_path / "c")
    assert lang.encode(["The movie was GREAT ."]) == [[5, 6, 7, 8, 10]]
    assert lang.words == words
