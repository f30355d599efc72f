"""The §5 bracket language: exact conditionals, sampling, task, encoding."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from sameloss.errors import UserError
from sameloss.languages.base import sample_mask
from sameloss.languages.dyck import Dyck

NESTED = [False, True]


# ---- brute force ------------------------------------------------------------------------
def all_strings(T: int) -> torch.Tensor:
    return torch.tensor(list(itertools.product([0, 1], repeat=T)), dtype=torch.long)


def is_valid(strings: torch.Tensor, nested: bool) -> torch.Tensor:
    step = torch.where(strings == 0, 1, -1)
    height = step.cumsum(dim=1)
    ok = height[:, -1] == 0
    if nested:
        ok &= (height >= 0).all(dim=1)
    return ok


def support(T: int, nested: bool) -> torch.Tensor:
    s = all_strings(T)
    return s[is_valid(s, nested)]


def brute_conditionals(S, tokens, masked, query) -> torch.Tensor:
    """P(x_t | unmasked words other than t) by filtering the (uniform) support S."""
    rows, cols = query.nonzero(as_tuple=True)
    visible = ~masked[rows].clone()
    visible[torch.arange(rows.numel()), cols] = False
    tok = tokens[rows]
    match = ((S[None] == tok[:, None]) | ~visible[:, None]).all(dim=2)  # [Q, K]
    total = match.sum(dim=1).double()
    opens = (match & (S[:, cols].T == 0)).sum(dim=1).double()
    p = opens / total  # 0/0 -> NaN for impossible contexts
    return torch.stack([p, 1 - p], dim=1)


def assert_close_nan(a, b, tol=1e-10):
    assert a.shape == b.shape
    assert a.dtype == torch.float64
    nan_a, nan_b = torch.isnan(a), torch.isnan(b)
    assert torch.equal(nan_a, nan_b)
    if (~nan_a).any():
        assert (a[~nan_a] - b[~nan_b]).abs().max() < tol


def random_patterns(T, n, g):
    masks, queries = [], []
    for rate in (0.0, 0.15, 0.3, 0.5, 0.8, 1.0):
        masks.append(torch.rand(n, T, generator=g) < rate)
        queries.append(torch.rand(n, T, generator=g) < 0.5)
    return torch.cat(masks), torch.cat(queries)


# ---- conditionals -----------------------------------------------------------------------
@pytest.mark.parametrize("nested", NESTED)
@pytest.mark.parametrize("T", [4, 6, 8])
def test_conditionals_match_brute_force(T, nested):
    lang = Dyck(T, nested=nested)
    S = support(T, nested)
    g = torch.Generator().manual_seed(T + 10 * nested)
    masked, query = random_patterns(T, 200, g)
    n = masked.shape[0]
    # sentences of the language, and arbitrary strings (many impossible contexts)
    for tokens in (lang.sample(n, g).tokens, all_strings(T)[torch.randint(0, 2**T, (n,), generator=g)]):
        tok = tokens.clone()
        tok[masked] = lang.mask_id  # ids at masked positions are ignored
        got = lang.conditionals(tok, masked, query)
        want = brute_conditionals(S, tokens, masked, query)
        assert_close_nan(got, want)
    # default query = masked
    got = lang.conditionals(tok, masked)
    assert_close_nan(got, brute_conditionals(S, tokens, masked, masked))


@pytest.mark.parametrize("nested", NESTED)
def test_conditionals_exhaustive_small(nested):
    """Every string, every mask, every query position, T = 4."""
    T = 4
    lang = Dyck(T, nested=nested)
    S = support(T, nested)
    strings = all_strings(T)
    masks = strings.bool()  # all 16 subsets
    tokens = strings.repeat_interleave(16, dim=0)
    masked = masks.repeat(16, 1)
    query = torch.ones_like(masked)
    assert_close_nan(lang.conditionals(tokens, masked, query), brute_conditionals(S, tokens, masked, query))


@pytest.mark.parametrize("nested", NESTED)
def test_conditionals_ignore_own_word_and_masked_ids(nested):
    lang = Dyck(8, nested=nested)
    g = torch.Generator().manual_seed(1)
    batch = lang.sample(300, g)
    masked = sample_mask(batch.lengths, 8, 0.3, g)
    query = torch.zeros_like(masked)
    query[:, 3] = True  # one query per sentence, masked or not
    a = lang.conditionals(batch.tokens, masked, query)
    flipped = batch.tokens.clone()
    flipped[:, 3] = 1 - flipped[:, 3]
    flipped[masked] = 1 - flipped[masked]
    b = lang.conditionals(flipped, masked, query)
    assert torch.equal(a, b)
    # single-token conditionals of a sentence are deterministic and correct
    p = lang.conditionals(batch.tokens, torch.zeros_like(masked), torch.ones_like(masked))
    assert torch.equal(p[:, 1], batch.tokens.reshape(-1).double())


@pytest.mark.parametrize("nested", NESTED)
def test_conditionals_paper_size(nested):
    """Larger T: rows are distributions, no NaN on sentences, and counts variant has
    the closed form (#'(' still needed) / (#hidden)."""
    T = 16
    lang = Dyck.preset("paper", nested=nested)
    g = torch.Generator().manual_seed(2)
    batch = lang.sample(500, g)
    masked = sample_mask(batch.lengths, T, 0.4, g)
    p = lang.conditionals(batch.tokens, masked)
    assert p.shape == (int(masked.sum()), 2)
    assert not torch.isnan(p).any()
    assert torch.allclose(p.sum(dim=1), torch.ones(p.shape[0], dtype=torch.float64))
    # the true word always has positive probability
    truth = batch.tokens[masked]
    assert (p.gather(1, truth[:, None]) > 0).all()
    if not nested:
        hidden = masked.sum(dim=1)
        need = 8 - ((batch.tokens == 0) & ~masked).sum(dim=1)
        rows = masked.nonzero()[:, 0]
        assert torch.allclose(p[:, 0], need[rows].double() / hidden[rows].double(), atol=0, rtol=0)


def test_conditionals_bad_inputs():
    lang = Dyck(6)
    tok = torch.zeros(2, 6, dtype=torch.long)
    m = torch.zeros(2, 6, dtype=torch.bool)
    with pytest.raises(ValueError):
        lang.conditionals(torch.zeros(2, 8, dtype=torch.long), torch.zeros(2, 8, dtype=torch.bool))
    with pytest.raises(ValueError):
        lang.conditionals(tok, torch.zeros(2, 5, dtype=torch.bool))
    bad = tok.clone()
    bad[0, 2] = lang.mask_id  # an unmasked position that is not a bracket
    with pytest.raises(ValueError):
        lang.conditionals(bad, m, torch.ones_like(m))
    empty = lang.conditionals(tok, m)
    assert empty.shape == (0, 2) and empty.dtype == torch.float64


# ---- entropy ----------------------------------------------------------------------------
def exact_entropy(T, nested, rate):
    """E[Σ_{t∈M} H(x_t | x_{¬M})] / E[|M|] under sample_mask's law, by enumeration."""
    S = support(T, nested)
    K = S.shape[0]
    subsets = all_strings(T).bool()[1:]  # non-empty masks
    size = subsets.sum(dim=1).double()
    prob = rate**size * (1 - rate) ** (T - size)
    prob[size == 1] += (1 - rate) ** T / T  # fallback: one uniform position
    num = den = 0.0
    for mask, pm in zip(subsets, prob.tolist()):
        masked = mask.expand(K, T)
        p = brute_conditionals(S, S, masked, masked)
        h = -torch.special.xlogy(p, p).sum(dim=1)
        num += pm * float(h.sum()) / K
        den += pm * float(mask.sum())
    return num / den


@pytest.mark.parametrize("nested", NESTED)
def test_entropy_matches_enumeration(nested):
    T, rate = 6, 0.4
    lang = Dyck(T, nested=nested)
    want = exact_entropy(T, nested, rate)
    est = lang.entropy(20_000, torch.Generator().manual_seed(3), mask_rate=rate)
    assert abs(est.mean - want) < 4 * est.stderr + 1e-12, (est, want)
    # a single hidden word is determined by the others: the optimal loss is 0
    zero = lang.entropy(2000, torch.Generator().manual_seed(4))
    assert zero.mean == 0.0


# ---- sampling ---------------------------------------------------------------------------
def chi_square(counts: torch.Tensor) -> float:
    expected = counts.sum().double() / counts.numel()
    return float(((counts.double() - expected) ** 2 / expected).sum())


def chi2_bound(dof: int) -> float:
    # mean dof, sd sqrt(2 dof): 6 sd is far in the tail, still catches real bias
    return dof + 6 * math.sqrt(2 * dof)


def codes(tokens: torch.Tensor) -> torch.Tensor:
    T = tokens.shape[1]
    return (tokens * (2 ** torch.arange(T - 1, -1, -1))).sum(dim=1)


@pytest.mark.parametrize("nested", NESTED)
def test_sampling_uniform(nested):
    T = 6
    lang = Dyck(T, nested=nested)
    S = support(T, nested)
    assert S.shape[0] == lang.n_sentences == (5 if nested else 20)
    batch = lang.sample(40_000, torch.Generator().manual_seed(5))
    assert batch.tokens.shape == (40_000, T) and batch.tokens.dtype == torch.long
    assert torch.equal(batch.lengths, torch.full((40_000,), T))
    assert is_valid(batch.tokens, nested).all()
    counts = torch.bincount(codes(batch.tokens), minlength=2**T)[codes(S)]
    assert counts.sum() == 40_000  # nothing outside the support
    assert chi_square(counts) < chi2_bound(S.shape[0] - 1)


@pytest.mark.parametrize("nested", NESTED)
def test_sampling_seeded(nested):
    lang = Dyck(10, nested=nested)
    a = lang.sample(64, torch.Generator().manual_seed(7)).tokens
    b = lang.sample(64, torch.Generator().manual_seed(7)).tokens
    c = lang.sample(64, torch.Generator().manual_seed(8)).tokens
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert is_valid(a, nested).all()


def test_nested_sampler_larger_T():
    lang = Dyck(12, nested=True)  # Catalan(6) = 132
    batch = lang.sample(26_400, torch.Generator().manual_seed(9))
    assert is_valid(batch.tokens, True).all()
    S = support(12, True)
    counts = torch.bincount(codes(batch.tokens), minlength=2**12)[codes(S)]
    assert counts.sum() == 26_400
    assert chi_square(counts) < chi2_bound(131)


# ---- downstream task --------------------------------------------------------------------
def test_task_labels_and_sampler():
    T = 6
    lang = Dyck(T)
    task = lang.tasks["mismatch"]
    assert task.name == "mismatch" and task.n_classes == T + 1
    assert task.sample is not None
    batch = task.sample(64_000, torch.Generator().manual_seed(11))
    tok = batch.tokens
    assert tok.shape == (64_000, T) and torch.equal(batch.lengths, torch.full((64_000,), T))
    g = (tok == 1).sum(dim=1) - (tok == 0).sum(dim=1)
    assert torch.equal(lang.mismatch(tok), g)
    labels = task.label(batch)
    assert torch.equal(labels, (g + T) // 2)
    assert labels.min() >= 0 and labels.max() <= T
    # i.i.d. uniform over all 2^T strings
    counts = torch.bincount(codes(tok), minlength=2**T)
    assert chi_square(counts) < chi2_bound(2**T - 1)
    # pre-training sentences all have g* = 0; a masked word gives the paper's MLM target
    sent = lang.sample(100, torch.Generator().manual_seed(12))
    assert (task.label(sent) == T // 2).all()
    one = sent.tokens.clone()
    one[:, 0] = lang.mask_id
    assert torch.equal(lang.mismatch(one), torch.where(sent.tokens[:, 0] == 0, 1, -1))
    assert (task.label(type(sent)(one, sent.lengths)) == -1).all()
    # task sampler is seeded
    a = task.sample(32, torch.Generator().manual_seed(13)).tokens
    b = task.sample(32, torch.Generator().manual_seed(13)).tokens
    assert torch.equal(a, b)


def test_describe_runs():
    d = Dyck.preset("tiny").describe(n_sentences=512)
    assert d["language"] == "dyck" and d["max_len"] == 8 and d["vocab_size"] == 5
    assert d["tasks"]["mismatch"]["n_classes"] == 9


# ---- encoding ---------------------------------------------------------------------------
def test_encode_signed():
    T = 8
    lang = Dyck(T)
    g = torch.Generator().manual_seed(14)
    batch = lang.sample(500, g)
    masked = sample_mask(batch.lengths, T, None, g)
    tok = batch.tokens.clone()
    tok[masked] = lang.mask_id
    x = lang.encode_signed(tok, masked, g)
    assert x.shape == (500, T, 2 * T) and x.dtype == torch.float32
    # one non-zero entry of magnitude 1 per position
    assert torch.equal((x != 0).sum(dim=2), torch.ones(500, T, dtype=torch.long))
    assert torch.equal(x.abs().sum(dim=2), torch.ones(500, T))
    idx = x.abs().argmax(dim=2)
    pos = torch.arange(T).expand(500, T)
    assert torch.equal(idx, torch.where(masked, pos + T, pos))
    val = x.gather(2, idx[..., None])[..., 0]
    assert torch.equal(val[~masked], torch.where(batch.tokens[~masked] == 0, 1.0, -1.0))
    signs = val[masked]
    assert (signs.abs() == 1).all() and 0.4 < (signs > 0).double().mean() < 0.6
    # the paper's identity: g*(x) = -<1_T, [Σ_t x_t]_{1:T}>
    z = x.sum(dim=1)
    assert torch.equal(-z[:, :T].sum(dim=1).long(), lang.mismatch(tok))
    # seeded; unmasked input needs no generator
    a = lang.encode_signed(tok, masked, torch.Generator().manual_seed(15))
    b = lang.encode_signed(tok, masked, torch.Generator().manual_seed(15))
    assert torch.equal(a, b)
    plain = lang.encode_signed(batch.tokens)
    assert torch.equal(plain[:, :, T:], torch.zeros(500, T, T))
    with pytest.raises(ValueError):
        lang.encode_signed(tok)  # mask ids at unmasked positions


# ---- construction -----------------------------------------------------------------------
def test_construction_and_presets():
    assert Dyck.preset("tiny").max_len == 8
    paper = Dyck.preset("paper")
    assert paper.max_len == 16 and paper.n_words == 2 and paper.words == ["(", ")"]
    assert paper.name == "dyck" and not paper.nested
    assert Dyck.preset("tiny", nested=True).nested
    assert (paper.pad_id, paper.mask_id, paper.cls_id) == (2, 3, 4)
    assert Dyck(2).n_sentences == 2 and Dyck(2, nested=True).n_sentences == 1


@pytest.mark.parametrize("length", [0, 1, 3, 7, -2, 2.5, "8", None, True])
def test_bad_length(length):
    with pytest.raises(UserError):
        Dyck(length)


def test_bad_preset_and_flag():
    with pytest.raises(UserError, match="paper.*tiny"):
        Dyck.preset("huge")
    with pytest.raises(UserError):
        Dyck(8, nested="yes")
