"""GLUE-format TSV tasks: reading, encoding pairs, fine-tuning and probing a corpus model."""

from __future__ import annotations

import json

import pytest
import torch

from sameloss import config as configlib
from sameloss.cli import main
from sameloss.errors import UserError
from sameloss.languages.text import Corpus, prepare_corpus
from sameloss.measures.finetune import FinetuneSettings, finetune
from sameloss.measures.glue import glue_task_data, read_glue_tsv
from sameloss.data.toy import toy_text
from sameloss.training import PretrainConfig, pretrain


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("glue")
    toy = toy_text(root / "toy", n_corpus=300, n_train=240, n_dev=60)
    prepare_corpus([toy["corpus"]], root / "corpus", vocab=120, max_len=24, heldout=0.1)
    cfg = configlib.load(PretrainConfig, None, [
        "steps=40", "batch_size=32", "model.size=micro", "eval.every=0", "eval.n_sentences=20", "save_every=1000",
        "log_every=20", "optim.warmup_steps=5", "device=cpu", "language.name=corpus",
        f"language.data={root / 'corpus'}", "optim.lr=3e-3"])
    pretrain(cfg, root / "run", progress=False)
    return root, toy


def test_read_tsv_and_errors(tmp_path):
    p = tmp_path / "a.tsv"
    p.write_text('index\tquestion\tsentence\tlabel\n0\twhat "now"?\tit is\tentailment\n1\tq\ts\tnot_entailment\n'
                 '2\tq2\ts2\t1\n')
    texts, labels = read_glue_tsv(p, "qnli")
    assert texts == [('what "now"?', "it is"), ("q", "s"), ("q2", "s2")] and labels == [0, 1, 1]
    cases = [("", "is empty"), ("sentence\n", "missing column 'label'"),
             ("sentence\tlabel\ngood\tpositive\n", "label 'positive' is not an integer"),
             ("sentence\tlabel\ngood\n", "1 columns, expected 2"), ("sentence\tlabel\n", "no examples")]
    for text, message in cases:
        p.write_text(text)
        with pytest.raises(UserError, match=message):
            read_glue_tsv(p, "sst2")
    p.write_text("sentence1\tsentence2\tlabel\na\tb\tentailment\n")
    assert read_glue_tsv(p, "rte")[1] == [0]
    p.write_text("sentence\tlabel\na\tentailment\n")  # the pair strings are not SST-2 labels
    with pytest.raises(UserError, match="not an integer"):
        read_glue_tsv(p, "sst2")


def test_pairs_are_cls_a_sep_b_sep(setup):
    root, toy = setup
    lang = Corpus(root / "corpus")
    data = glue_task_data(lang, f"glue:qnli={toy['qnli']}")
    assert len(data.train) + len(data.validation) == 240 and len(data.test) == 60 and data.n_classes == 2
    row = data.test.tokens[0].tolist()
    n = row.index(lang.pad_id) if lang.pad_id in row else len(row)
    assert row[0] == lang.cls_id and row[n - 1] == lang.sep_id and row[1:n - 1].count(lang.sep_id) == 1
    question, sentence = (toy["qnli"] / "dev.tsv").read_text().splitlines()[1].split("\t")[:2]
    cut = row.index(lang.sep_id)
    assert row[1:cut] == lang.encode([question])[0] and row[cut + 1:n - 1] == lang.encode([sentence])[0]
    assert lang.tokenizer.decode(row[cut + 1:n - 1]).replace(" ", "") == sentence.replace(" ", "")
    single = glue_task_data(lang, f"glue:sst2={toy['sst2']}").test.tokens
    assert (single[:, 0] == lang.cls_id).all()
    assert ((single == lang.sep_id).sum(dim=1) == 1).all()
    # long pairs are cut to max_len, the longer text first, and keep both separators
    from sameloss.measures.glue import encode_examples
    long = encode_examples(lang, [("the movie " * 30, "fine ."), ("fine .", "the plot " * 30)])
    assert long.shape == (2, 24) and ((long == lang.sep_id).sum(dim=1) == 2).all()
    assert (long[:, -1] == lang.sep_id).all()


def test_finetune_from_cls_learns_sst2(setup):
    root, toy = setup
    from sameloss.training.runio import load_checkpoint
    from sameloss.training.checkpoint import complete_checkpoints
    model, lang, _, _ = load_checkpoint(complete_checkpoints(root / "run")[-1])
    data = glue_task_data(lang, f"glue:sst2={toy['sst2']}")
    r = finetune(model, data, FinetuneSettings(pooling="cls", epochs=8, lr=1e-3, warmup_steps=5, batch_size=16),
                 seeds=(0, 1))
    assert r.settings["pooling"] == "cls" and len(r.accuracies) == 2
    # the label is the sentiment word class: learnable from 216 examples, well above chance
    assert r.mean > 0.75, r.accuracies


def test_cli_measure_glue_and_errors(setup, tmp_path, capsys):
    root, toy = setup
    run = str(root / "run")
    args = ["measure", run, "--no-progress", "--device", "cpu", "--json", "--probe-seeds", "2", "--finetune-epochs", "2"]
    assert main(args + ["--finetune", f"glue:sst2={toy['sst2']}", "--probe", f"glue:rte={toy['rte']}",
                        "--probe-epochs", "3"]) == 0
    row = json.loads(capsys.readouterr().out)[0]
    for key in ("finetune_sst2", "probe_rte"):
        assert 0 <= row[key] <= 1 and row[f"{key}_std"] is not None
    assert row["sst2_majority"] > 0 and row["rte_majority"] > 0
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "train.tsv").write_text("sentence\tlabel\ngood\tyes\n")
    (bad / "dev.tsv").write_text("sentence\tlabel\ngood\t1\n")
    for task, message in ((f"glue:sst2={bad}", "label 'yes' is not an integer"),
                          (f"glue:cola={bad}", "unknown GLUE task 'cola'"),
                          (f"glue:sst2={tmp_path / 'none'}", "GLUE folder not found"),
                          (f"glue:qnli={toy['sst2']}", "missing column 'question'")):
        assert main(args + ["--finetune", task]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err, err


def test_glue_refused_for_a_synthetic_language(checkpoint, toy_sst2, capsys):
    assert main(["measure", str(checkpoint), "--finetune", f"glue:sst2={toy_sst2}", "--no-progress",
                 "--device", "cpu"]) == 2
    assert "pre-trained on a corpus" in capsys.readouterr().err


@pytest.fixture
def toy_sst2(tmp_path):
    return toy_text(tmp_path, n_corpus=4, n_train=4, n_dev=4)["sst2"]


def test_cls_pooling_reads_position_zero(setup):
    from sameloss.measures.finetune import Classifier
    from sameloss.training.checkpoint import complete_checkpoints
    from sameloss.training.runio import load_checkpoint
    root, _ = setup
    model, lang, _, _ = load_checkpoint(complete_checkpoints(root / "run")[-1])
    clf = Classifier(model, 2, lang.pad_id, lang.max_len, pooling="cls")
    tokens = lang.split_batch("heldout", 3).tokens
    assert torch.equal(clf.pooled(tokens), model.features(tokens)[:, 0])


# ---- issue 20: encodings, hazards, --task-size -------------------------------------------------
def test_a_header_behind_a_byte_order_mark_is_read(tmp_path):
    p = tmp_path / "bom.tsv"
    p.write_bytes("\ufeffsentence\tlabel\ngood film\t1\nbad film\t0\n".encode("utf-8"))
    assert read_glue_tsv(p, "sst2") == ([("good film",), ("bad film",)], [1, 0])


@pytest.mark.parametrize("data, message", [
    ("sentence\tlabel\ncafé\t1\n".encode("latin-1"), "is not UTF-8 text (byte 0xe9"),
    (b"sentence\tlabel\n\x00\x01\x02\t1\n", "looks binary"),
], ids=["latin1", "binary"])
def test_a_tsv_in_another_encoding_or_binary_is_one_line(data, message, setup, tmp_path, capsys):
    (tmp_path / "train.tsv").write_bytes(data)
    (tmp_path / "dev.tsv").write_text("sentence\tlabel\ngood\t1\n")
    with pytest.raises(UserError, match=message.replace("(", r"\(")):
        read_glue_tsv(tmp_path / "train.tsv", "sst2")
    root, _ = setup
    assert main(["measure", str(root / "run"), "--finetune", f"glue:sst2={tmp_path}", "--no-progress",
                 "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message.split(" (")[0] in err


def test_a_huge_label_is_refused_with_the_memory_it_would_take(tmp_path):
    p = tmp_path / "train.tsv"
    p.write_text("sentence\tlabel\ngood\t1\nbad\t1000000000\n")
    with pytest.raises(UserError) as err:
        read_glue_tsv(p, "sst2")
    msg = str(err.value)
    assert "train.tsv:3: label 1000000000" in msg and "8 GB" in msg and "at most 1000 classes" in msg


def test_stratified_sample_keeps_each_class_in_proportion():
    import numpy as np

    from sameloss.measures.glue import stratified_sample
    labels = np.array([0] * 60 + [1] * 30 + [2] * 10)
    rng = np.random.default_rng(0)
    picked = stratified_sample(labels, 20, rng)
    assert len(set(picked.tolist())) == 20 and np.bincount(labels[picked]).tolist() == [12, 6, 2]
    picked = stratified_sample(labels, 7, np.random.default_rng(1))  # quotas 4.2, 2.1, 0.7: largest remainder
    assert np.bincount(labels[picked], minlength=3).tolist() == [4, 2, 1]
    again = stratified_sample(labels, 7, np.random.default_rng(1))
    assert picked.tolist() == again.tolist()


def test_task_size_is_honoured_for_glue(setup, monkeypatch, capsys):
    root, toy = setup
    lang = Corpus(root / "corpus")
    whole = glue_task_data(lang, f"glue:sst2={toy['sst2']}")
    assert (len(whole.train), len(whole.validation), len(whole.test)) == (216, 24, 60)
    same = glue_task_data(lang, f"glue:sst2={toy['sst2']}", n_train=2000, n_validation=500)  # fewer rows: all
    assert torch.equal(same.train.tokens, whole.train.tokens) and torch.equal(same.train.labels, whole.train.labels)
    small = glue_task_data(lang, f"glue:sst2={toy['sst2']}", n_train=40, n_validation=10)
    assert (len(small.train), len(small.validation), len(small.test)) == (40, 10, 60)
    share = float(whole.train.labels.double().mean())
    assert abs(float(small.train.labels.double().mean()) - share) <= 1 / 40 + 0.05
    # every kept row is one of the file's, and train and validation do not overlap
    rows = {tuple(t) for t in torch.cat([whole.train.tokens, whole.validation.tokens]).tolist()}
    kept = [tuple(t) for t in torch.cat([small.train.tokens, small.validation.tokens]).tolist()]
    assert set(kept) <= rows
    # measure --task-size N reaches the GLUE task (it was ignored)
    from sameloss.measures import glue as glue_module
    sizes = []
    real = glue_module.glue_task_data

    def spy(*args, **kwargs):
        data = real(*args, **kwargs)
        sizes.append((len(data.train), len(data.validation)))
        return data

    monkeypatch.setattr(glue_module, "glue_task_data", spy)
    assert main(["measure", str(root / "run"), "--probe", f"glue:sst2={toy['sst2']}", "--task-size", "40",
                 "--probe-seeds", "1", "--no-progress", "--device", "cpu", "--json"]) == 0
    assert sizes == [(40, 10)]
