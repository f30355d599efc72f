"""GLUE-format tasks on the causal language: re-tokenised with the generator's tokenizer,
mapped into its K allowed tokens (out-of-vocabulary examples dropped, cut/padded to T)."""

from __future__ import annotations

import json
import random
import shutil

import pytest
import torch

from sameloss.cli import main
from sameloss.errors import UserError
from sameloss.languages.lm_generated import CausalLM
from sameloss.languages.lm_tokens import tokens_filename
from sameloss.languages.lm_train import GeneratorTraining, train_generator
from sameloss.measures.glue import encode_causal, glue_task_data

transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

T = 5
IN_VOCAB = "the cat dog sat on a mat".split()
OUT_OF_VOCAB = "zebra quixotic"  # letters the corpus never joins into these words


@pytest.fixture(scope="module")
def generator(tmp_path_factory):
    root = tmp_path_factory.mktemp("gen")
    rng = random.Random(0)
    words = IN_VOCAB + "and ran to big".split()
    (root / "c.txt").write_text("\n".join(" ".join(rng.choice(words) for _ in range(rng.randint(3, 9)))
                                          for _ in range(300)))
    train_generator([root / "c.txt"], root / "gen",
                    GeneratorTraining(vocab=300, size="micro", steps=4, batch_size=4, context=16),
                    log=lambda line: None)
    return root / "gen"


@pytest.fixture(scope="module")
def allowed(generator):
    """The generator ids of the in-vocabulary words as the first and as a later word."""
    tok = transformers.AutoTokenizer.from_pretrained(str(generator), local_files_only=True)
    ids = tok(" ".join(IN_VOCAB) + " " + IN_VOCAB[0], add_special_tokens=False)["input_ids"]
    return tok, sorted(set(ids))


@pytest.fixture(scope="module")
def lm(generator, allowed):
    return CausalLM.from_pretrained(generator, k=len(allowed[1]), length=T, tokens=allowed[1])


def _tsv(folder, rows, header=("sentence", "label")):
    folder.mkdir(parents=True, exist_ok=True)
    text = "\t".join(header) + "\n" + "".join("\t".join(map(str, r)) + "\n" for r in rows)
    (folder / "train.tsv").write_text(text)
    (folder / "dev.tsv").write_text(text)
    return folder


def test_oov_examples_are_dropped_and_long_ones_cut_to_t(lm, allowed):
    tok, ids = allowed
    texts = [("the cat sat",), (f"the {OUT_OF_VOCAB} cat",), ("the cat sat on a mat the dog",), ("",)]
    x, kept = encode_causal(lm, texts)
    assert kept.tolist() == [True, False, True, False]
    table = {g: i for i, g in enumerate(ids)}
    for row, (text,) in zip(x[kept], [texts[0], texts[2]]):
        gen = tok(text, add_special_tokens=False)["input_ids"][:T]
        expected = [table[g] for g in gen] + [lm.pad_id] * (T - len(gen))
        assert row.tolist() == expected
    assert (x[2] != lm.pad_id).all()  # eight words, cut to T tokens, no padding
    # an out-of-vocabulary word beyond the first T tokens does not matter
    assert encode_causal(lm, [(f"the cat sat on a {OUT_OF_VOCAB}",)])[1].tolist() == [True]


def test_pairs_are_joined_without_separator(lm, allowed):
    tok, ids = allowed
    x, kept = encode_causal(lm, [("the cat", "sat on")])
    gen = tok("the cat", add_special_tokens=False)["input_ids"] + tok(" sat on", add_special_tokens=False)["input_ids"]
    table = {g: i for i, g in enumerate(ids)}
    assert kept.tolist() == [True]
    assert x[0].tolist() == [table[g] for g in gen] + [lm.pad_id] * (T - len(gen))


def test_task_data_counts_the_kept_fraction(lm, tmp_path):
    rows = [("the cat sat", 0), ("the dog sat", 1), (f"{OUT_OF_VOCAB} sat", 0), ("the mat", 1)] * 5
    data = glue_task_data(lm, f"glue:sst2={_tsv(tmp_path / 'sst2', rows)}")
    assert data.language == "causal" and data.kept_fraction == pytest.approx(0.75)
    assert len(data.train) + len(data.validation) == 15 and len(data.test) == 15
    assert int(data.test.tokens.max()) <= lm.pad_id  # words and pad only: no cls/sep
    with pytest.raises(UserError, match="0 of 4 examples use only"):
        glue_task_data(lm, f"glue:sst2={_tsv(tmp_path / 'oov', [(OUT_OF_VOCAB, 0)] * 4)}")


def test_a_generator_without_a_tokenizer_is_a_one_line_error(generator, allowed, tmp_path):
    bare = tmp_path / "bare"
    shutil.copytree(generator, bare)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (bare / name).unlink()
    lm = CausalLM.from_pretrained(bare, k=len(allowed[1]), length=T, tokens=allowed[1])
    with pytest.raises(UserError, match="tokenizer") as info:
        encode_causal(lm, [("the cat",)])
    assert "\n" not in str(info.value)


def test_cli_measure_probe_finetune_lookup_on_a_causal_run(generator, allowed, tmp_path, capsys):
    gen = tmp_path / "gen"
    shutil.copytree(generator, gen)
    k = len(allowed[1])
    # the frequency cache in the folder is what a run reads back: fix the language's tokens through it
    (gen / tokens_filename(k, T, 4096, 0)).write_text(json.dumps({"tokens": allowed[1]}))
    assert main(["pretrain", "language.name=causal", f"language.generator={gen}", f"language.k={k}",
                 f"language.length={T}", "masking=single", "steps=3", "batch_size=8", "model.size=micro",
                 "eval.n_sentences=20", "name=r", "--out", str(tmp_path), "--no-progress"]) == 0
    rng = random.Random(1)
    rows = [("the " + " ".join(rng.choice(IN_VOCAB) for _ in range(2)), i % 2) for i in range(24)] + [(OUT_OF_VOCAB, 0)] * 6
    task = f"glue:sst2={_tsv(tmp_path / 'sst2', rows)}"
    capsys.readouterr()
    assert main(["measure", str(tmp_path / "r"), "--probe", task, "--finetune", task, "--lookup-table", task,
                 "--probe-seeds", "1", "--finetune-epochs", "1", "--json", "--no-progress", "--device", "cpu"]) == 0
    out = json.loads(capsys.readouterr().out)
    for key in ("probe_sst2", "finetune_sst2", "lookup_sst2"):
        assert 0.0 <= out[-1][key] <= 1.0, key
