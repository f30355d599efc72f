"""``sameloss causal-lm train|sample`` lose nothing and refuse bad input in one line
(issue 20): learning rates that are not finite and positive, diverged training, sizes
that would not fit in memory, a full disk, damaged pools."""

from __future__ import annotations

import errno
import hashlib
import json
import shutil

import numpy as np
import pytest

from sameloss.cli import main
from sameloss.errors import UserError
from sameloss.languages.lm_generated import CausalLM
from sameloss.languages.lm_generated import load_pool
from sameloss.languages.lm_train import MAX_TRAIN_BYTES, GeneratorTraining, train_generator
from helpers.datacli import error_line, leftovers, run_cli

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

K, T = 6, 5
WORDS = "the cat dog sat on a mat and ran to big small red house".split()
SMALL = ["--vocab", "300", "--size", "micro", "--steps", "3", "--batch-size", "4", "--context", "16"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    import random
    rng = random.Random(0)
    path = tmp_path_factory.mktemp("text") / "c.txt"
    path.write_text("\n".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 9))) for _ in range(300)))
    return path


@pytest.fixture(scope="module")
def generator(corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("gen") / "gen"
    assert main(["causal-lm", "train", "--corpus", str(corpus), *SMALL, "--out", str(out)]) == 0
    return out


def _usage_error(args, capsys) -> str:
    with pytest.raises(SystemExit) as exit_:
        main(args)
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and len(err) == 1, err
    return err[0]


@pytest.mark.parametrize("lr", ["nan", "-1", "inf", "0"])
def test_a_learning_rate_not_finite_and_positive_is_one_line(lr, corpus, tmp_path, capsys):
    line = _usage_error(["causal-lm", "train", "--corpus", str(corpus), *SMALL, "--lr", lr,
                         "--out", str(tmp_path / "g")], capsys)
    assert "--lr" in line and "finite number > 0" in line
    with pytest.raises(UserError, match="--lr must be a finite number > 0"):
        train_generator([corpus], tmp_path / "g", GeneratorTraining(vocab=300, size="micro", steps=1, lr=float(lr)))
    assert not (tmp_path / "g").exists()


def test_a_diverged_run_is_an_error_not_a_generator(corpus, tmp_path, capsys):
    assert main(["causal-lm", "train", "--corpus", str(corpus), *SMALL, "--lr", "1e10",
                 "--out", str(tmp_path / "g")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "training diverged" in err[0] and "lower --lr" in err[0]
    assert not (tmp_path / "g").exists() and leftovers(tmp_path) == []


def test_a_context_too_large_for_memory_is_refused_before_allocating(corpus, tmp_path, capsys):
    assert main(["causal-lm", "train", "--corpus", str(corpus), "--context", "100000",
                 "--out", str(tmp_path / "g")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--context 100000" in err[0] and "GiB" in err[0]
    assert f"the limit is {MAX_TRAIN_BYTES / 2**30:.3g} GiB" in err[0]
    assert not (tmp_path / "g").exists()


def test_non_utf8_text_and_an_out_file_are_one_line(corpus, tmp_path, capsys):
    (tmp_path / "latin1.txt").write_bytes("un café\n".encode("latin-1"))
    assert main(["causal-lm", "train", "--corpus", str(tmp_path / "latin1.txt"), *SMALL,
                 "--out", str(tmp_path / "g")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is not UTF-8 text" in err[0]
    (tmp_path / "afile").write_text("")
    assert main(["causal-lm", "train", "--corpus", str(corpus), *SMALL, "--out", str(tmp_path / "afile")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is a file" in err[0]
    assert (tmp_path / "afile").read_text() == ""


def test_sample_checks_the_length_and_the_memory_first(generator, tmp_path, capsys):
    positions = json.loads((generator / "config.json").read_text())["n_positions"]
    assert main(["causal-lm", "sample", "--generator", str(generator), "--k", str(K), "--length", "100000",
                 "--n", "10", "--out", str(tmp_path / "p")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"exceeds the generator's {positions} positions" in err[0]
    assert main(["causal-lm", "sample", "--generator", str(generator), "--k", str(K), "--length", str(T),
                 "--n", str(10**9), "--out", str(tmp_path / "p")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs about" in err[0] and "GiB" in err[0] and "the limit is 8 GiB" in err[0]
    # the frequent-token list (written into the generator folder) was never estimated at those sizes
    assert not list(generator.glob("sameloss-tokens-*len100000*"))
    assert not (tmp_path / "p").exists()


def test_train_on_a_full_disk_leaves_nothing_and_the_rerun_works(corpus, tmp_path, capsys):
    args = ["causal-lm", "train", "--corpus", str(corpus), *SMALL, "--out", str(tmp_path / "g")]
    result = run_cli(args, fsize=20_000)  # the weights (~70 kB; safetensors reports it in its own words) do not fit
    assert f"cannot write {tmp_path / 'g'}: File too large" in error_line(result)
    assert not (tmp_path / "g").exists() and leftovers(tmp_path) == []
    assert main(args) == 0
    assert (tmp_path / "g" / "model.safetensors").is_file() and leftovers(tmp_path) == []


def test_sample_on_a_full_disk_leaves_nothing_and_the_rerun_works(generator, tmp_path, monkeypatch, capsys):
    args = ["causal-lm", "sample", "--generator", str(generator), "--k", str(K), "--length", str(T), "--n", "20",
            "--out", str(tmp_path / "p")]

    def full(path, arr, **kwargs):
        with open(path, "wb") as f:
            f.write(b"\x93NUMPY")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(np, "save", full)
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"cannot write {tmp_path / 'p'}: No space left on device" in err[0]
    assert not (tmp_path / "p").exists() and leftovers(tmp_path) == []
    monkeypatch.undo()
    assert main(args) == 0
    assert (tmp_path / "p" / "tokens.npy").is_file() and leftovers(tmp_path) == []


@pytest.fixture(scope="module")
def pool(generator, tmp_path_factory):
    out = tmp_path_factory.mktemp("pool") / "pool"
    assert main(["causal-lm", "sample", "--generator", str(generator), "--k", str(K), "--length", str(T),
                 "--n", "50", "--out", str(out)]) == 0
    return out


@pytest.mark.parametrize("case", ["truncated", "pickled", "tokens-garbage", "meta-list", "n-more", "n-missing"])
def test_a_damaged_pool_is_one_line_even_when_its_checksum_matches(case, generator, pool, tmp_path):
    broken = tmp_path / "pool"
    shutil.copytree(pool, broken)
    meta = json.loads((broken / "meta.json").read_text())
    data = (broken / "tokens.npy").read_bytes()
    if case == "truncated":
        (broken / "tokens.npy").write_bytes(data[:-30])
    elif case == "pickled":
        np.save(broken / "tokens.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    elif case == "tokens-garbage":
        meta["tokens"] = "abc"
    elif case == "n-more":  # its metadata describes another array (issue 40: n = 100 over 10 rows was accepted)
        meta["n"] = 100
    elif case == "n-missing":
        del meta["n"]
    if case == "meta-list":
        (broken / "meta.json").write_text("[1]")
    else:
        meta["tokens_sha256"] = hashlib.sha256((broken / "tokens.npy").read_bytes()).hexdigest()
        (broken / "meta.json").write_text(json.dumps(meta))
    lm = CausalLM.from_pretrained(generator, k=K, length=T)
    with pytest.raises(UserError) as err:
        load_pool(broken, K, T, lm.tokens.tolist())
    assert "\n" not in str(err.value) and str(broken) in str(err.value)


# ---- library warnings off the terminal (issue 40) ------------------------------------------
def test_the_causal_language_uses_the_current_cache_api_and_warns_nothing(generator):
    """The KV cache goes by transformers' current keyword (``cache``, was ``past_key_values``
    with a FutureWarning per forward pass in 5.x): fixed at its source, not only filtered."""
    import warnings

    import torch

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        lm = CausalLM.from_pretrained(generator, k=K, length=T)
        batch = lm.sample(8, torch.Generator().manual_seed(0))
        masked = torch.zeros_like(batch.tokens, dtype=torch.bool)
        masked[:, 1] = True
        lm.conditionals(batch.tokens, masked)
    assert [str(w.message) for w in caught] == []


def test_causal_commands_print_nothing_on_stderr_but_their_error(generator, checkpoint, tmp_path):
    """``causal-lm sample`` prints no transformers line, and a masked-LM folder as the
    generator (an exported BERT) is sameloss's one line, not transformers' warning first."""
    ok = run_cli(["causal-lm", "sample", "--generator", generator, "--k", K, "--length", T, "--n", 20, "--out",
                  tmp_path / "p"])
    assert ok.returncode == 0 and ok.stderr == "", ok.stderr
    assert main(["export", str(checkpoint), "--out", str(tmp_path / "bert")]) == 0
    bert = run_cli(["causal-lm", "sample", "--generator", tmp_path / "bert", "--k", K, "--length", T, "--n", 20,
                    "--out", tmp_path / "q"])
    assert "bert holds a BertForMaskedLM, not a causal language model" in error_line(bert)
