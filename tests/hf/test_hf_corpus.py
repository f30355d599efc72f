"""``sameloss measure HF_FOLDER language.name=corpus language.data=DIR``: a Hugging Face
masked LM measured on real text (held-out cross-entropy, Fisher trace, GLUE tasks)."""

from __future__ import annotations

import json
import warnings

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from sameloss import config as configlib  # noqa: E402
from sameloss.cli import main  # noqa: E402
from sameloss.hf.adapter import MISSING_LOGIT, load_hf_folder  # noqa: E402
from sameloss.languages.text import Corpus, read_documents, train_tokenizer  # noqa: E402
from sameloss.measures.curvature import FisherContexts, sample_contexts, trace_fisher  # noqa: E402
from sameloss.measures.run import MeasureSpec  # noqa: E402
from sameloss.data.toy import toy_text  # noqa: E402
from sameloss.training.config import PretrainConfig  # noqa: E402
from sameloss.training.evaluate import HeldOutEvaluator  # noqa: E402

CONTEXTS, LABELS, SEED = 48, 8, 3


def save_quietly(obj, folder):
    from transformers.utils import logging

    logging.disable_progress_bar()  # its bar would be read as the command's stderr
    try:
        obj.save_pretrained(str(folder))
    finally:
        logging.enable_progress_bar()


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A random tiny ``BertForMaskedLM`` with a WordPiece tokenizer trained here (BERT's
    specials), and a corpus prepared with that folder as its tokenizer."""
    from tokenizers import AddedToken
    from transformers import BertConfig, BertForMaskedLM, PreTrainedTokenizerFast

    root = tmp_path_factory.mktemp("hf_corpus")
    toy = toy_text(root / "toy", n_corpus=120, n_train=40, n_dev=20)
    tok = train_tokenizer("wordpiece", read_documents(toy["corpus"]), 100)  # [UNK] and [SEP] are its first ids
    tok.add_special_tokens([AddedToken(s, special=True) for s in ("[PAD]", "[CLS]", "[MASK]")])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", sep_token="[SEP]", pad_token="[PAD]",
                                   cls_token="[CLS]", mask_token="[MASK]")
    folder = root / "bert"
    save_quietly(fast, folder)
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=len(fast), hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=32, max_position_embeddings=32, pad_token_id=fast.pad_token_id)
    save_quietly(BertForMaskedLM(cfg), folder)
    assert main(["corpus", "prepare", str(toy["corpus"]), "--tokenizer", str(folder), "--max-len", "16",
                 "--heldout", "0.2", "--out", str(root / "corpus")]) == 0
    return root, toy, folder


def measure_args(setup) -> list[str]:
    root, _, folder = setup
    return ["measure", str(folder), "language.name=corpus", f"language.data={root / 'corpus'}", "--no-progress",
            "--json"]


def test_the_folders_own_tokenizer_maps_every_id_to_itself(setup):
    from transformers import AutoTokenizer

    root, _, folder = setup
    language = Corpus(root / "corpus")
    tok = AutoTokenizer.from_pretrained(str(folder))
    assert language.n_words == len(tok) and language.words == [tok.convert_ids_to_tokens(i) for i in range(len(tok))]
    model = load_hf_folder(folder, language)
    assert torch.equal(model.input_ids[:language.n_words], torch.arange(language.n_words))
    # sameloss's pad, mask and cls are fed as the tokenizer's; their output columns are
    # empty, since the tokenizer's own [PAD]/[MASK]/[CLS] rows are already words
    specials = model.input_ids[[language.pad_id, language.mask_id, language.cls_id]].tolist()
    assert specials == [tok.pad_token_id, tok.mask_token_id, tok.cls_token_id]
    assert model.input_ids[language.sep_id] == tok.sep_token_id
    assert model.output_missing.tolist() == [False] * language.n_words + [True] * 3
    logits = model(language.split_batch("heldout", 2).tokens)
    assert (logits[..., language.n_words:] == MISSING_LOGIT).all()


def test_loss_fisher_and_glue_through_the_cli(setup, capsys):
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    root, toy, folder = setup
    sst2 = f"glue:sst2={toy['sst2']}"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # transformers' note on batching its CPU attention under vmap
        assert main(measure_args(setup) + ["--loss", "--trace", "fisher", "--contexts", str(CONTEXTS), "--labels",
                                           str(LABELS), "--seed", str(SEED), "--finetune", sst2, "--probe", sst2,
                                           "--finetune-epochs", "1", "--probe-epochs", "3", "--seeds", "1"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["language"] == "corpus" and row["architecture"] == "BertForMaskedLM" and row["kl"] is None
    # held-out cross-entropy, straight through transformers: the evaluator's held-out
    # sequences and masks in the tokenizer's ids, softmax over the model's whole vocabulary
    cfg = configlib.load(PretrainConfig, None, ["language.name=corpus", f"language.data={root / 'corpus'}"])
    language = Corpus(root / "corpus")
    held = HeldOutEvaluator(language, MeasureSpec(loss=True).loss_sentences, cfg.mask_rate, cfg.eval.seed,
                            cfg.eval.n_subsets).sets["heldout"]
    tok = AutoTokenizer.from_pretrained(str(folder))
    ids = held.inputs.clone()
    for ours, theirs in ((language.pad_id, tok.pad_token_id), (language.mask_id, tok.mask_token_id),
                         (language.cls_id, tok.cls_token_id)):
        ids[held.inputs == ours] = theirs
    bert = AutoModelForMaskedLM.from_pretrained(str(folder)).eval().double()
    with torch.no_grad():
        logits = bert(input_ids=ids, attention_mask=(held.inputs != language.pad_id).long()).logits
    assert logits.shape[-1] == language.n_words  # the loss below is over every row the model has
    ce = torch.nn.functional.cross_entropy(logits[held.masked], held.targets[held.masked])
    assert row["n_tokens"] == int(held.masked.sum())
    assert row["loss"] == pytest.approx(float(ce), abs=1e-5)
    # the Fisher trace is the adapter's, with the same seed
    model = load_hf_folder(folder, language)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fisher = trace_fisher(model, language, FisherContexts(n_contexts=CONTEXTS, seed=SEED), n_labels=LABELS,
                              repeats=MeasureSpec(loss=True).repeats)
    assert row["trace_fisher"] == pytest.approx(fisher.estimate, rel=1e-9) and fisher.estimate > 0
    assert row["n_params_measured"] == sum(p.numel() for p in bert.parameters())
    for key in ("finetune_sst2", "probe_sst2"):
        assert 0 <= row[key] <= 1
    assert row["sst2_majority"] > 0


def test_exact_fisher_through_the_adapter_equals_brute_force_on_the_hf_model(setup):
    """``n_labels=None`` (the expectation over the vocabulary): Σ_y p(y) ‖∇ log p(y)‖²
    per context, computed with plain autograd on the transformers model in float64,
    over its whole vocabulary."""
    from transformers import AutoModelForMaskedLM

    root, _, folder = setup
    language = Corpus(root / "corpus")
    contexts = sample_contexts(language, 3, seed=SEED)
    model = load_hf_folder(folder, language)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ours = trace_fisher(model, language, FisherContexts(batch=contexts, engine="autograd"), n_labels=None).estimate
    bert = AutoModelForMaskedLM.from_pretrained(str(folder)).eval().double()
    ids = model.input_ids[contexts.inputs]
    params = list(bert.parameters())
    total = 0.0
    for row in range(ids.shape[0]):
        pos = int(contexts.masked[row].nonzero())
        real = (contexts.inputs[row] != language.pad_id).long()[None]
        logp = torch.log_softmax(bert(input_ids=ids[row:row + 1], attention_mask=real).logits[0, pos], dim=-1)
        for y in range(logp.shape[0]):
            grads = torch.autograd.grad(logp[y], params, retain_graph=True, allow_unused=True)
            total += float(logp[y].exp()) * sum(float((g ** 2).sum()) for g in grads if g is not None)
    assert ours == pytest.approx(total / ids.shape[0], rel=1e-4)


def test_a_tokenizer_that_cannot_express_the_corpus_is_one_line(setup, tmp_path, capsys):
    from transformers import AutoTokenizer

    root, toy, folder = setup
    other = tmp_path / "corpus"  # its own WordPiece, larger than the folder's
    assert main(["corpus", "prepare", str(toy["corpus"]), "--tokenizer", "wordpiece", "--vocab", "150",
                 "--max-len", "16", "--out", str(other)]) == 0
    vocab = AutoTokenizer.from_pretrained(str(folder)).get_vocab()
    first_missing = next(w for w in Corpus(other).words if w not in vocab)
    assert main(["measure", str(folder), "language.name=corpus", f"language.data={other}", "--loss"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("sameloss: error: "), err
    assert f"token {first_missing!r}" in err and "--tokenizer" in err


def test_fisher_contexts_leave_out_a_corpus_sequence_with_nothing_to_mask(tmp_path):
    """The last sequence of a split can be ``[CLS] [SEP]`` (the stream's final separator
    alone): no context. Four training documents of three words + [SEP] make a stream of
    16 tokens, cut into chunks of 3: the sixth chunk is that [SEP]."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = {"[UNK]": 0, "[SEP]": 1, "alpha": 2, "beta": 3, "gamma": 4}
    tok = Tokenizer(models.WordLevel(words, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    (tmp_path / "tok").mkdir()
    tok.save(str(tmp_path / "tok" / "tokenizer.json"))
    (tmp_path / "docs.txt").write_text("alpha beta gamma\n" * 5)
    assert main(["corpus", "prepare", str(tmp_path / "docs.txt"), "--tokenizer", str(tmp_path / "tok"),
                 "--max-len", "4", "--heldout", "0.2", "--out", str(tmp_path / "corpus")]) == 0
    language = Corpus(tmp_path / "corpus")
    train = language.split_batch("train")
    valid = torch.arange(language.max_len)[None, :] < train.lengths[:, None]
    nothing_to_mask = ~(language.maskable(train.tokens) & valid).any(dim=1)
    assert int(nothing_to_mask.sum()) == 1
    contexts = sample_contexts(language, 64, seed=0)
    assert (contexts.masked.sum(dim=1) == 1).all()
    assert 0 < contexts.inputs.shape[0] < 64  # the draws of that sequence are left out


def test_a_corpus_separated_by_another_token_than_the_tokenizers_sep_is_one_line(setup, tmp_path, capsys):
    """The folder's vocabulary holds ``[SEP]`` as a plain token but separates with
    ``</s>``; a corpus prepared with it joins documents with ``[SEP]`` (the first
    candidate), which the model never saw as its separator: refused."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import BertConfig, BertForMaskedLM, PreTrainedTokenizerFast

    _, toy, _ = setup
    names = ["[UNK]", "[SEP]", "</s>", "[PAD]", "[CLS]", "[MASK]"] + sorted(
        {w for doc in read_documents(toy["corpus"]) for w in doc.split()})
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(names)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", sep_token="</s>", pad_token="[PAD]",
                                   cls_token="[CLS]", mask_token="[MASK]")
    folder = tmp_path / "bert"
    save_quietly(fast, folder)
    save_quietly(BertForMaskedLM(BertConfig(vocab_size=len(names), hidden_size=8, num_hidden_layers=1,
                                            num_attention_heads=1, intermediate_size=8, max_position_embeddings=16,
                                            pad_token_id=3)), folder)
    assert main(["corpus", "prepare", str(toy["corpus"]), "--tokenizer", str(folder), "--max-len", "16",
                 "--out", str(tmp_path / "corpus")]) == 0
    assert main(["measure", str(folder), "language.name=corpus", f"language.data={tmp_path / 'corpus'}",
                 "--loss"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "separates documents with '[SEP]'" in err and "'</s>'" in err, err
