"""The causal-LM language against brute-force enumeration of all K^T sentences (float64),
on tiny random GPT-2 and OPT generators built here and saved as HF folders."""

from __future__ import annotations

import itertools
import json

import pytest
import torch
from scipy import stats

from sameloss import config as configlib
from sameloss.cli import main
from sameloss.errors import UserError
from sameloss.languages import make_language
from sameloss.languages.base import entropy_of
from sameloss.languages.lm_generated import CausalLM, CausalSettings, LoadSettings, expected_token_counts
from sameloss.languages.lm_tokens import tokens_filename
from sameloss.training import PretrainConfig, pretrain

transformers = pytest.importorskip("transformers")

K, T, V = 5, 4, 24
TOL = 1e-12
ALLOWED = [7, 3, 19, 11, 4]  # generator ids, deliberately out of order


def _gpt2():
    # a large init scale: conditionals far from uniform, so agreement means something
    cfg = transformers.GPT2Config(vocab_size=V, n_positions=8, n_embd=16, n_layer=2, n_head=2,
                                  bos_token_id=1, eos_token_id=2, initializer_range=0.5)
    return transformers.GPT2LMHeadModel(cfg)


def _opt():
    cfg = transformers.OPTConfig(vocab_size=V, hidden_size=16, num_hidden_layers=2, ffn_dim=32,
                                 num_attention_heads=2, max_position_embeddings=8, word_embed_proj_dim=16,
                                 bos_token_id=2, eos_token_id=2, pad_token_id=1, init_std=0.5)
    return transformers.OPTForCausalLM(cfg)


@pytest.fixture(scope="module", params=["gpt2", "opt"])
def folder(request, tmp_path_factory):
    torch.manual_seed(0)
    model = _gpt2() if request.param == "gpt2" else _opt()
    path = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def lm(folder):
    return CausalLM.from_pretrained(folder, k=K, length=T, tokens=ALLOWED, dtype=torch.float64)


@pytest.fixture(scope="module")
def joint(lm):
    """Every sentence ``[K^T, T]`` and its probability, from the model's full logits."""
    strings = torch.tensor(list(itertools.product(range(K), repeat=T)))
    return strings, lm.log_prob(strings, full_head=True).exp()


def brute(joint, x, hidden, t):
    """P(x_t | the words not hidden, other than t) by summing the joint."""
    strings, p = joint
    keep = ~hidden.clone()
    keep[t] = False
    agree = (strings[:, keep] == x[keep]).all(dim=1)
    num = torch.zeros(K, dtype=torch.float64).index_add_(0, strings[agree, t], p[agree])
    return num / num.sum()


def test_joint_is_normalised_and_not_flat(joint):
    _, p = joint
    assert abs(float(p.sum()) - 1) < TOL
    assert float(p.max() / p.min()) > 50  # far from uniform: the tests below are not trivial


def test_conditionals_equal_enumeration(lm, joint):
    x = joint[0][torch.randperm(K**T, generator=torch.Generator().manual_seed(0))[:40]]
    none = torch.zeros_like(x, dtype=torch.bool)
    every = torch.ones_like(none)
    got = lm.conditionals(x, none, every)
    want = torch.stack([brute(joint, x[i], none[i], t) for i in range(len(x)) for t in range(T)])
    assert (got - want).abs().max() < TOL
    # one masked position per sentence (mask id in the input), as the exact evaluator asks
    pos = torch.arange(len(x)) % T
    masked = torch.nn.functional.one_hot(pos, T).bool()
    got = lm.conditionals(x.masked_fill(masked, lm.mask_id), masked)
    want = torch.stack([brute(joint, x[i], masked[i], int(pos[i])) for i in range(len(x))])
    assert (got - want).abs().max() < TOL


def test_trailing_hidden_words_are_marginalised_for_free(lm, joint):
    x = joint[0][[5, 77, 300, 611]]
    # hidden suffixes of different lengths in one batch (as padding would be)
    hidden = torch.arange(T)[None, :] >= torch.tensor([2, 3, T, 1])[:, None]
    query = torch.zeros_like(hidden)
    query[:, 0] = True
    got = lm.conditionals(x.masked_fill(hidden, lm.pad_id), hidden, query)
    want = torch.stack([brute(joint, x[i], hidden[i], 0) for i in range(len(x))])
    assert (got - want).abs().max() < TOL


def test_two_masked_positions_are_refused(lm, joint):
    x = joint[0][:3]
    masked = torch.zeros_like(x, dtype=torch.bool)
    masked[1, 0] = masked[1, 2] = True
    with pytest.raises(UserError, match=r"K\^2 = 5\^2") as err:
        lm.conditionals(x, masked)
    assert "\n" not in str(err.value)


def test_entropy_estimate_matches_the_exact_optimal_loss(lm, joint):
    strings, p = joint
    every = torch.ones_like(strings, dtype=torch.bool)
    h = entropy_of(lm.conditionals(strings, ~every, every)).view(-1, T).mean(dim=1)  # per sentence
    exact = float((p * h).sum())
    est = lm.entropy(2000, torch.Generator().manual_seed(0))
    assert est.n == 2000 and 0 < est.stderr < 0.05
    assert abs(est.mean - exact) < 4 * est.stderr, (est, exact)


def test_cache_and_chunks_equal_the_plain_computation(lm, joint):
    x = joint[0][torch.randperm(K**T, generator=torch.Generator().manual_seed(1))[:12]]
    every = torch.ones_like(x, dtype=torch.bool)
    plain = lm.conditionals_reference(x, every)
    fast = lm.conditionals(x, torch.zeros_like(every), every)
    before = lm.chunk_tokens
    try:
        lm.chunk_tokens = 7  # one or two continuation rows per chunk
        chunked = lm.conditionals(x, torch.zeros_like(every), every)
    finally:
        lm.chunk_tokens = before
    assert (fast - plain).abs().max() < TOL
    assert (chunked - plain).abs().max() < TOL


def test_restricted_head_equals_renormalised_full_logits(lm, joint):
    x = joint[0][::37]
    restricted = lm.next_log_probs(x)
    full = lm.next_log_probs(x, full_head=True)
    assert restricted.shape == (len(x), T, K)
    assert (restricted - full).abs().max() < TOL
    # and the language-id order follows the allowed list: row w is generator token ALLOWED[w]
    ids = torch.tensor([[lm.bos_id] + [ALLOWED[w] for w in x[0, :-1].tolist()]])
    with torch.no_grad():
        logits = lm.model(input_ids=ids).logits[0].double()
    assert (torch.log_softmax(logits[:, ALLOWED], dim=-1) - restricted[0]).abs().max() < TOL


def test_sampling_frequencies_match_the_joint(lm, joint):
    strings, p = joint
    n = 20_000
    batch = lm.sample(n, torch.Generator().manual_seed(123))
    assert batch.tokens.shape == (n, T) and bool((batch.lengths == T).all())
    index = (batch.tokens * K ** torch.arange(T - 1, -1, -1)).sum(dim=1)  # row in `strings`
    observed = torch.bincount(index, minlength=K**T).double()
    expected = p * n
    # pool the cells expected fewer than 5 times, as the chi-square approximation asks
    small = expected < 5
    obs = torch.cat([observed[~small], observed[small].sum()[None]])
    exp = torch.cat([expected[~small], expected[small].sum()[None]])
    chi2 = float(((obs - exp) ** 2 / exp).sum())
    assert chi2 < stats.chi2.ppf(0.999, df=len(obs) - 1)
    # a sampler ignoring the generator (uniform words) would fail the same test badly
    uniform = torch.bincount(torch.randint(0, K**T, (n,), generator=torch.Generator().manual_seed(0)),
                             minlength=K**T).double()
    u_obs = torch.cat([uniform[~small], uniform[small].sum()[None]])
    assert float(((u_obs - exp) ** 2 / exp).sum()) > 10 * stats.chi2.ppf(0.999, df=len(obs) - 1)


def test_token_list_save_load_round_trip(lm, folder, tmp_path):
    path = tmp_path / "tokens.json"
    lm.save_tokens(path)
    with pytest.raises(UserError, match="not overwriting"):
        lm.save_tokens(path)
    again = CausalLM.from_pretrained(folder, k=K, length=T, tokens=path, dtype=torch.float64)
    assert again.tokens.tolist() == ALLOWED
    x = torch.tensor([[0, 1, 2, 3], [4, 4, 0, 2]])
    every = torch.ones_like(x, dtype=torch.bool)
    assert torch.equal(again.conditionals(x, ~every, every), lm.conditionals(x, ~every, every))
    with pytest.raises(UserError, match="holds 5 tokens, not k=4"):
        CausalLM.from_pretrained(folder, k=4, length=T, tokens=path)


def test_frequent_tokens_are_estimated_cached_and_reused(folder, tmp_path):
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, local_files_only=True).double()
    bos = model.config.bos_token_id
    # exact expected frequencies: Σ_s E[p(· | x_<s)] over all V^(T-1) prefixes
    prefixes = torch.tensor(list(itertools.product(range(V), repeat=T - 1)))
    ids = torch.cat([torch.full((len(prefixes), 1), bos), prefixes], dim=1)
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits.double(), dim=-1)  # [V^3, T, V]
    path_logp = torch.zeros(len(prefixes), dtype=torch.float64)
    exact = torch.zeros(V, dtype=torch.float64)
    for s in range(T):
        # weight of each distinct prefix of length s: P(prefix), counted once per prefix
        first = (prefixes[:, s:] == 0).all(dim=1) if s < T - 1 else torch.ones(len(prefixes), dtype=torch.bool)
        exact += (path_logp[first, None] + logp[first, s]).exp().sum(dim=0)
        if s < T - 1:
            path_logp += logp[torch.arange(len(prefixes)), s, prefixes[:, s]]
    assert abs(float(exact.sum()) - T) < 1e-9
    # 30 independent estimates (seeds) give the Monte-Carlo error of their mean; |t| > 5
    # with 29 degrees of freedom has probability 2.5e-5 per token
    n, m = 100, 30
    runs = torch.stack([expected_token_counts(model, bos, T, n, seed=100 + s) / n for s in range(m)])
    assert torch.allclose(runs.sum(dim=1), torch.full((m,), float(T), dtype=torch.float64), atol=1e-9)
    t = (runs.mean(dim=0) - exact) / (runs.std(dim=0) / m**0.5)
    assert float(t.abs().max()) < 5, t
    n = 3000
    estimate = expected_token_counts(model, bos, T, n, seed=0) / n

    lm = CausalLM.from_pretrained(folder, k=K, length=T, dtype=torch.float64,
                                  settings=LoadSettings(frequency_sentences=n))
    special = {model.config.bos_token_id, model.config.eos_token_id, model.config.pad_token_id}
    ranked = [t for t in torch.sort(-estimate, stable=True).indices.tolist() if t not in special][:K]
    assert lm.tokens.tolist() == ranked
    cache = folder / tokens_filename(K, T, n, 0)
    record = json.loads(cache.read_text())
    assert record["tokens"] == ranked
    # the next load reads the cached list instead of estimating again
    record["tokens"] = ranked[::-1]
    cache.write_text(json.dumps(record))
    again = CausalLM.from_pretrained(folder, k=K, length=T, settings=LoadSettings(frequency_sentences=n))
    assert again.tokens.tolist() == ranked[::-1]
    cache.unlink()


def test_float32_is_close_to_float64(folder, lm):
    lm32 = CausalLM.from_pretrained(folder, k=K, length=T, tokens=ALLOWED, dtype="float32")
    x = torch.tensor([[0, 1, 2, 3], [4, 4, 0, 2]])
    every = torch.ones_like(x, dtype=torch.bool)
    got = lm32.conditionals(x, ~every, every)
    assert got.dtype == torch.float64
    assert (got - lm.conditionals(x, ~every, every)).abs().max() < 1e-5


def test_bad_generator_folder_and_k_are_one_line_errors(folder, tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    for path, message in ((tmp_path / "missing", "generator folder not found"),
                          (empty, "cannot load a causal LM from")):
        with pytest.raises(UserError, match=message) as err:
            CausalLM.from_pretrained(path, k=K, length=T)
        assert "\n" not in str(err.value)
    with pytest.raises(UserError, match=f"k={V + 1} is larger than the generator's vocabulary of {V}"):
        CausalLM.from_pretrained(folder, k=V + 1, length=T)
    with pytest.raises(UserError, match="outside the generator's vocabulary"):
        CausalLM.from_pretrained(folder, k=2, length=T, tokens=[0, V])
    # through the CLI: one line on stderr, exit code 2
    for override, message in ((f"language.generator={empty}", "cannot load a causal LM"),
                              ("language.k=999", "is larger than the generator's vocabulary")):
        code = main(["pretrain", "--out", str(tmp_path / "run"), "language.name=causal",
                     f"language.generator={folder}", override, "masking=single", "device=cpu"])
        err = capsys.readouterr().err
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").iterdir())


def test_make_language_needs_a_generator_and_keeps_causal_keys_to_causal(folder):
    with pytest.raises(UserError, match="language.generator=DIR"):
        make_language("causal")
    with pytest.raises(UserError, match="language.k applies to the causal language only"):
        make_language("hmm", preset="micro", causal=CausalSettings(k=5))
    lm = make_language("causal", causal=CausalSettings(generator=str(folder), k=K, length=T))
    assert (lm.n_words, lm.max_len, lm.vocab_size) == (K, T, K + 3)


def test_pretrain_runs_on_the_causal_language(folder, tmp_path):
    cfg = configlib.load(PretrainConfig, None, [
        "steps=4", "batch_size=16", "model.size=micro", "eval.every=2", "eval.n_sentences=32", "save_every=100",
        "log_every=2", "optim.warmup_steps=1", "device=cpu", "masking=single", "language.name=causal",
        f"language.generator={folder}", f"language.k={K}", f"language.length={T}"])
    result = pretrain(cfg, tmp_path / "run", progress=False)
    assert result["kl"] >= 0 and result["loss"] >= result["entropy"] > 0
    assert result["n_tokens"] == 32
    # the default 15% masking hides several words at once: refused before anything is written
    cfg = configlib.load(PretrainConfig, None, [
        "steps=2", "batch_size=8", "model.size=micro", "eval.n_sentences=64", "device=cpu",
        "language.name=causal", f"language.generator={folder}", f"language.k={K}", f"language.length={T}"])
    with pytest.raises(UserError, match="needs masking=single"):
        pretrain(cfg, tmp_path / "refused", progress=False)
    assert not (tmp_path / "refused").exists() or not any((tmp_path / "refused").iterdir())
