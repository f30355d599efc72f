"""``sameloss causal-lm train`` / ``sample`` and pre-training from a token pool."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from sameloss.cli import main
from sameloss.errors import UserError
from sameloss.languages.lm_generated import CausalLM
from sameloss.languages.lm_generated import load_pool
from sameloss.training.data import global_batch

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

K, T = 6, 5
WORDS = "the cat dog sat on a mat and ran to big small red house".split()


def _corpus(path, n=300, seed=0):
    rng = random.Random(seed)
    path.write_text("\n".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 9))) for _ in range(n)))
    return path


def _train(tmp, out, seed=0):
    return main(["causal-lm", "train", "--corpus", str(_corpus(tmp / "c.txt")), "--vocab", "300", "--size", "micro",
                 "--steps", "6", "--batch-size", "4", "--context", "16", "--seed", str(seed), "--out", str(out)])


@pytest.fixture(scope="module")
def generator(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gen")
    assert _train(tmp, tmp / "gen") == 0
    return tmp / "gen"


@pytest.fixture(scope="module")
def pool(generator, tmp_path_factory):
    out = tmp_path_factory.mktemp("pool") / "pool"
    assert main(["causal-lm", "sample", "--generator", str(generator), "--k", str(K), "--length", str(T),
                 "--n", "50", "--seed", "3", "--out", str(out)]) == 0
    return out


def test_train_writes_a_hf_folder_that_loads_as_a_language(generator):
    for name in ("config.json", "model.safetensors", "tokenizer.json", "sameloss-generator.json"):
        assert (generator / name).is_file(), name
    lm = CausalLM.from_pretrained(generator, k=K, length=T)
    assert lm.n_words == K
    # words come from the trained tokenizer (byte-level BPE pieces), not the <id> fallback
    assert not any(w.startswith("<") and w.endswith(">") for w in lm.words)
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(str(generator), local_files_only=True)
    assert tok.decode(tok("the cat sat")["input_ids"]) == "the cat sat"
    assert json.loads((generator / "sameloss-generator.json").read_text())["size"] == "micro"


def test_train_is_a_pure_function_of_its_seed(generator, tmp_path):
    from safetensors.torch import load_file

    assert _train(tmp_path, tmp_path / "again") == 0
    a, b = load_file(generator / "model.safetensors"), load_file(tmp_path / "again" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_existing_out_is_refused_and_untouched(generator, pool, tmp_path, capsys):
    before = sorted(p.name for p in generator.iterdir())
    assert _train(tmp_path, generator) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "exists" in err[0]
    assert sorted(p.name for p in generator.iterdir()) == before
    stamp = (pool / "tokens.npy").read_bytes()
    assert main(["causal-lm", "sample", "--generator", str(generator), "--k", str(K), "--length", str(T),
                 "--n", "5", "--out", str(pool)]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
    assert (pool / "tokens.npy").read_bytes() == stamp


@pytest.mark.parametrize("case", ["missing", "not-a-model", "k-too-large"])
def test_bad_generator_or_k_is_one_line_exit_2(case, generator, tmp_path, capsys):
    folder, k = generator, K
    if case == "missing":
        folder = tmp_path / "nowhere"
    elif case == "not-a-model":
        folder = tmp_path / "empty"
        folder.mkdir()
    else:
        k = 10_000
    rc = main(["causal-lm", "sample", "--generator", str(folder), "--k", str(k), "--length", str(T),
               "--n", "5", "--out", str(tmp_path / "p")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("sameloss: error:")
    assert not (tmp_path / "p").exists()


def test_pool_holds_language_ids_with_a_checksum(generator, pool):
    meta = json.loads((pool / "meta.json").read_text())
    data = np.load(pool / "tokens.npy")
    assert data.shape == (50, T) and data.max() < K
    lm = CausalLM.from_pretrained(generator, k=K, length=T)
    assert meta["tokens"] == lm.tokens.tolist()
    # the pool is the language's own seeded sample
    assert torch.equal(torch.from_numpy(data.astype(np.int64)), lm.sample(50, torch.Generator().manual_seed(3)).tokens)


def test_pool_streaming_is_a_pure_function_of_seed_and_step(generator, pool):
    lm = CausalLM.from_pretrained(generator, k=K, length=T, pool=pool)
    rows = {tuple(r) for r in lm.pool.tolist()}
    assert lm.pool.dtype == np.uint16  # kept compact in memory; drawn rows are int64
    a = global_batch(lm, seed=1, step=7, batch_size=32, rate=None)
    b = global_batch(lm, seed=1, step=7, batch_size=32, rate=None)
    c = global_batch(lm, seed=1, step=8, batch_size=32, rate=None)
    assert torch.equal(a.inputs, b.inputs) and torch.equal(a.targets, b.targets)
    assert not torch.equal(a.targets, c.targets)
    assert a.targets.dtype == torch.long and all(tuple(r) in rows for r in a.targets.tolist())  # training sentences come from the pool
    # the held-out sampler is the generator's own (not the pool)
    fresh = lm.sample(200, torch.Generator().manual_seed(0)).tokens
    assert any(tuple(r) not in rows for r in fresh.tolist())


def test_pool_mismatch_and_corruption_are_refused(generator, pool, tmp_path):
    lm = CausalLM.from_pretrained(generator, k=K, length=T)
    with pytest.raises(UserError, match="K=6, T=5"):
        load_pool(pool, K, T + 1, lm.tokens.tolist())
    with pytest.raises(UserError, match="other allowed tokens"):
        load_pool(pool, K, T, lm.tokens.tolist()[::-1])
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "meta.json").write_text((pool / "meta.json").read_text())
    data = np.load(pool / "tokens.npy")
    data[0, 0] = (data[0, 0] + 1) % K
    np.save(broken / "tokens.npy", data)
    with pytest.raises(UserError, match="checksum"):
        load_pool(broken, K, T, lm.tokens.tolist())


def test_pretrain_streams_from_the_pool(generator, pool, tmp_path, capsys):
    args = ["pretrain", "language.name=causal", f"language.generator={generator}", f"language.k={K}",
            f"language.length={T}", f"language.pool={pool}", "masking=single", "steps=2", "batch_size=8",
            "model.size=micro", "name=r", "--out", str(tmp_path), "--no-progress"]
    assert main(args) == 0
    assert "exact held-out loss" in capsys.readouterr().out
    assert f'pool = "{pool}"' in (tmp_path / "r" / "config.toml").read_text()


@pytest.mark.parametrize("case", ["missing-corpus", "bad-size", "small-vocab"])
def test_bad_train_arguments_are_one_line_exit_2(case, tmp_path, capsys):
    corpus = _corpus(tmp_path / "c.txt") if case != "missing-corpus" else tmp_path / "nowhere.txt"
    size = "huge" if case == "bad-size" else "micro"
    vocab = "100" if case == "small-vocab" else "300"
    try:  # argument errors leave through argparse (SystemExit), the others through main's return
        rc = main(["causal-lm", "train", "--corpus", str(corpus), "--vocab", vocab, "--size", size, "--steps", "1",
                   "--out", str(tmp_path / "gen")])
    except SystemExit as exc:
        rc = exc.code
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("sameloss") and "error:" in err[0]
    assert not (tmp_path / "gen").exists()
