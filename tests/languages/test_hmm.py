"""The HMM language against brute-force enumeration (float64, every path and string)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from sameloss.errors import UserError
from sameloss.languages.base import entropy_of
from sameloss.languages.hmm import HMM

S, W, T = 3, 4, 5
TOL = 1e-10


@pytest.fixture(scope="module")
def hmm() -> HMM:
    # fairly flat rows so that no conditional is trivially one-hot
    return HMM.random(S, W, T, seed=3, concentration=1.0, emission_concentration=1.0)


@pytest.fixture(scope="module")
def joint(hmm):
    """``strings [W^T, T]``, ``paths [S^T, T]`` and ``P(x, z) [W^T, S^T]``."""
    strings = torch.tensor(list(itertools.product(range(W), repeat=T)))
    paths = torch.tensor(list(itertools.product(range(S), repeat=T)))
    pz = hmm.initial[paths[:, 0]]
    for t in range(1, T):
        pz = pz * hmm.transition[paths[:, t - 1], paths[:, t]]
    px_z = torch.ones(len(strings), len(paths), dtype=torch.float64)
    for t in range(T):
        px_z = px_z * hmm.emission[paths[None, :, t], strings[:, None, t]]
    return strings, paths, px_z * pz[None, :]


def brute_conditional(joint, x, masked, t):
    strings, _, pxz = joint
    px = pxz.sum(dim=1)
    keep = ~masked.clone()
    keep[t] = False
    agree = (strings[:, keep] == x[keep]).all(dim=1)
    num = torch.zeros(W, dtype=torch.float64).index_add_(0, strings[agree, t], px[agree])
    return num / num.sum()


def brute_posterior(joint, x, masked):
    strings, paths, pxz = joint
    agree = (strings[:, ~masked] == x[~masked]).all(dim=1)
    pz = pxz[agree].sum(dim=0)  # [S^T]
    out = torch.zeros(T, S, dtype=torch.float64)
    for t in range(T):
        out[t].index_add_(0, paths[:, t], pz)
    return out / out.sum(dim=1, keepdim=True)


def random_patterns(hmm, n=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    tokens = hmm.sample(n, g).tokens
    masked = torch.rand(n, T, generator=g) < 0.4
    query = torch.rand(n, T, generator=g) < 0.5
    masked[0], query[0] = False, True  # nothing masked, query everything
    masked[1], query[1] = True, True  # everything masked: the marginals
    masked[2] = torch.tensor([True, True, False, True, True])  # several masked, one seen
    query[2] = True
    return tokens, masked, query


def test_conditionals_match_brute_force(hmm, joint):
    tokens, masked, query = random_patterns(hmm)
    # the value at a masked position must not matter, mask id or otherwise
    tokens = torch.where(masked, torch.full_like(tokens, hmm.mask_id), tokens)
    got = hmm.conditionals(tokens, masked, query)
    rows = query.nonzero().tolist()
    assert got.dtype == torch.float64 and got.shape == (len(rows), W)
    assert query[~masked].any() and query[masked].any()  # both kinds of query positions
    want = torch.stack([brute_conditional(joint, tokens[i], masked[i], t) for i, t in rows])
    assert (got - want).abs().max() < TOL
    # every position at once (the all-query fast path)
    everything = torch.ones_like(query)
    got = hmm.conditionals(tokens, masked, everything)
    want = torch.stack([brute_conditional(joint, tokens[i], masked[i], t)
                        for i, t in everything.nonzero().tolist()])
    assert (got - want).abs().max() < TOL


def test_conditionals_default_query_and_own_word_ignored(hmm):
    tokens, masked, _ = random_patterns(hmm, seed=1)
    a = hmm.conditionals(tokens, masked)
    b = hmm.conditionals(tokens, masked, masked)
    assert torch.equal(a, b) and a.shape[0] == int(masked.sum())
    # an unmasked query position never sees its own word
    query = torch.zeros_like(masked)
    query[:, 2] = True
    masked[:, 2] = False
    other = tokens.clone()
    other[:, 2] = (other[:, 2] + 1) % W
    assert torch.equal(hmm.conditionals(tokens, masked, query), hmm.conditionals(other, masked, query))


def test_posteriors_and_task_labels_match_brute_force(hmm, joint):
    tokens, masked, _ = random_patterns(hmm, seed=2)
    got = hmm.posteriors(tokens, masked)
    want = torch.stack([brute_posterior(joint, tokens[i], masked[i]) for i in range(len(tokens))])
    assert (got - want).abs().max() < TOL

    batch = hmm.sample(30, torch.Generator().manual_seed(5))
    nothing = torch.zeros(T, dtype=torch.bool)
    full = torch.stack([brute_posterior(joint, x, nothing) for x in batch.tokens])
    tasks = hmm.tasks
    for k in hmm.task_positions:
        assert tasks[f"task-{k}"].n_classes == S
        assert torch.equal(tasks[f"task-{k}"].label(batch), full[:, k - 1].argmax(dim=1))
        assert torch.equal(tasks[f"task-{k}-sampled"].label(batch), batch.latent[:, k - 1])
        # the state's position and posterior: the span probe's view and the oracle's features
        for name in (f"task-{k}", f"task-{k}-sampled"):
            assert tasks[name].span == (k - 1, k)
            assert (tasks[name].posterior(batch.tokens) - full[:, k - 1]).abs().max() < TOL


def test_task_names():
    assert set(HMM.random(4, 5, 16, seed=0).tasks) == {"task-6", "task-10", "task-6-sampled", "task-10-sampled"}
    assert set(HMM.random(4, 5, 12, seed=0).tasks) == {"task-5", "task-8", "task-5-sampled", "task-8-sampled"}
    custom = HMM(torch.ones(2) / 2, torch.eye(2), torch.eye(2), length=3, task_positions=[1, 3])
    assert set(custom.tasks) == {"task-1", "task-3", "task-1-sampled", "task-3-sampled"}
    with pytest.raises(UserError, match="task position 4"):
        HMM(torch.ones(2) / 2, torch.eye(2), torch.eye(2), length=3, task_positions=[4])


def exact_single_mask_entropy(joint):
    """E_x[(1/T) Σ_t H(x_t | x_{-t})] by enumeration."""
    strings, _, pxz = joint
    px = pxz.sum(dim=1)
    total = 0.0
    for t in range(T):
        # group strings by their other positions: P(x_{-t}, x_t) as [W^(T-1), W]
        others = [s for s in range(T) if s != t]
        key = (strings[:, others] * (W ** torch.arange(T - 2, -1, -1))).sum(dim=1)
        table = torch.zeros(W ** (T - 1), W, dtype=torch.float64)
        table.index_put_((key, strings[:, t]), px, accumulate=True)
        marg = table.sum(dim=1)
        total += float((marg * entropy_of(table / marg[:, None])).sum())
    return total / T


def test_entropy_estimate_matches_enumeration(hmm, joint):
    exact = exact_single_mask_entropy(joint)
    small = hmm.entropy(2_000, torch.Generator().manual_seed(0))
    large = hmm.entropy(20_000, torch.Generator().manual_seed(1), batch_size=4096)
    for est in (small, large):
        assert est.stderr > 0
        assert abs(est.mean - exact) < 4 * est.stderr
    assert large.stderr < small.stderr
    assert large.n == 20_000
    rated = hmm.entropy(2_000, torch.Generator().manual_seed(2), mask_rate=0.3)
    assert math.isfinite(rated.mean) and 0 < rated.mean <= math.log(W)


def test_sampling_frequencies_and_seed(hmm):
    n = 40_000
    batch = hmm.sample(n, torch.Generator().manual_seed(7))
    assert batch.tokens.shape == (n, T) and batch.tokens.dtype == torch.long
    assert torch.equal(batch.lengths, torch.full((n,), T))
    # exact marginals of every position's state and word
    state = hmm.initial.clone()
    for t in range(T):
        emp_s = torch.bincount(batch.latent[:, t], minlength=S).double() / n
        emp_w = torch.bincount(batch.tokens[:, t], minlength=W).double() / n
        word = state @ hmm.emission
        # 5 binomial standard errors
        assert ((emp_s - state).abs() <= 5 * (state * (1 - state) / n).sqrt() + 1e-12).all()
        assert ((emp_w - word).abs() <= 5 * (word * (1 - word) / n).sqrt() + 1e-12).all()
        state = state @ hmm.transition
    # pairwise transitions are right too
    pair = torch.zeros(S, S, dtype=torch.float64)
    pair.index_put_((batch.latent[:, 0], batch.latent[:, 1]), torch.ones(n, dtype=torch.float64), accumulate=True)
    want = hmm.initial[:, None] * hmm.transition
    assert ((pair / n - want).abs() <= 5 * (want * (1 - want) / n).sqrt() + 1e-12).all()

    a = hmm.sample(100, torch.Generator().manual_seed(11))
    b = hmm.sample(100, torch.Generator().manual_seed(11))
    c = hmm.sample(100, torch.Generator().manual_seed(12))
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.latent, b.latent)
    assert not torch.equal(a.tokens, c.tokens)


def test_zero_probabilities_never_sampled():
    initial = torch.tensor([0.0, 1.0, 0.0])
    transition = torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 1.0], [0.5, 0.0, 0.5]])
    emission = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.3, 0.7]])
    h = HMM(initial, transition, emission, length=6)
    batch = h.sample(5000, torch.Generator().manual_seed(0))
    z = batch.latent
    assert (z[:, 0] == 1).all()
    assert (transition[z[:, :-1], z[:, 1:]] > 0).all()
    assert (emission[z, batch.tokens] > 0).all()


def test_paper_size_is_stable():
    h = HMM.preset("paper")
    assert (h.n_states, h.n_words, h.max_len) == (100, 200, 16)
    batch = h.sample(256, torch.Generator().manual_seed(0))
    masked = torch.rand(256, 16, generator=torch.Generator().manual_seed(1)) < 0.5
    cond = h.conditionals(batch.tokens, masked, torch.ones_like(masked))
    post = h.posteriors(batch.tokens, masked)
    assert torch.isfinite(cond).all() and torch.isfinite(post).all()
    assert (cond.sum(dim=1) - 1).abs().max() < 1e-12
    assert (post.sum(dim=2) - 1).abs().max() < 1e-12
    assert h.words[:2] == ["w0", "w1"] and h.vocab_size == 203


def test_tiny_preset_is_informative():
    h = HMM.preset("tiny")
    assert (h.n_states, h.n_words, h.max_len) == (8, 16, 12)
    ent = h.entropy(4096, torch.Generator().manual_seed(0))
    assert 0.5 < ent.mean < 0.8 * math.log(16)
    batch = h.sample(4096, torch.Generator().manual_seed(1))
    for name, task in h.tasks.items():
        counts = torch.bincount(task.label(batch), minlength=8)
        assert counts.max() < 0.5 * 4096, name  # no near-absorbing state


def good():
    return np.array([0.5, 0.5]), np.array([[0.9, 0.1], [0.2, 0.8]]), np.array([[0.7, 0.3, 0.0], [0.1, 0.1, 0.8]])


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda p: (np.array([1.5, -0.5]), p[1], p[2]), "negative"),
        (lambda p: (p[0], np.array([[0.9, 0.1], [np.nan, 0.8]]), p[2]), "NaN"),
        (lambda p: (p[0], p[1], np.array([[0.7, 0.3, 0.1], [0.1, 0.1, 0.8]])), "sums to"),
        (lambda p: (p[0], np.array([[0.9, 0.1, 0.0], [0.2, 0.8, 0.0]]), p[2]), "transition"),
        (lambda p: (p[0], p[1], p[2][:1]), "emission"),
        (lambda p: (p[0][None], p[1], p[2]), "initial"),
    ],
)
def test_bad_matrices_raise_user_error(change, message):
    HMM(*good(), length=4)  # the unchanged matrices are fine
    with pytest.raises(UserError, match=message):
        HMM(*change(good()), length=4)


def test_other_bad_input():
    with pytest.raises(UserError, match="valid sizes: headroom, micro, paper, tiny"):
        HMM.preset("huge")
    with pytest.raises(UserError, match="length"):
        HMM(*good(), length=0)
    with pytest.raises(UserError, match="word names"):
        HMM(*good(), length=3, words=["a", "b"])
    with pytest.raises(UserError):
        HMM.random(n_states=0)


def test_pad_and_mask_ids_count_as_unobserved(hmm):
    tokens, _, query = random_patterns(hmm, seed=4)
    hidden = torch.zeros_like(query)
    hidden[:, 3:] = True
    padded = tokens.masked_fill(hidden, hmm.pad_id)
    nothing = torch.zeros_like(hidden)
    want = hmm.conditionals(tokens, hidden, query)
    assert torch.equal(hmm.conditionals(padded, nothing, query), want)
    assert torch.equal(hmm.conditionals(tokens.masked_fill(hidden, hmm.mask_id), nothing, query), want)
    # a prefix is the marginal of its words: the same as masking the rest
    short = hmm.conditionals(tokens[:, :3], nothing[:, :3], query[:, :3])
    assert (short - hmm.conditionals(tokens, hidden, query & ~hidden)).abs().max() < TOL
    with pytest.raises(ValueError):
        hmm.conditionals(torch.full_like(tokens, hmm.cls_id), nothing)
