"""Batched few-shot probes: subsets, independence of the batched heads, the convex optimum,
the folded standardisation."""

from __future__ import annotations

import torch

from sameloss.measures import fewshot


def toy(n=300, D=6, C=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, C, (n,), generator=g)
    means = torch.randn(C, D, generator=g) * 2
    x = means[y] + torch.randn(n, D, generator=g) * 1.5 + 5.0  # off-centre: standardisation matters
    return x, y


def test_subsets_are_distinct_deterministic_and_differ_between_sizes():
    s = fewshot.subset_indices(100, 20, 7, seed=3)
    assert s.shape == (7, 20)
    assert all(len(set(row.tolist())) == 20 for row in s) and int(s.max()) < 100
    assert torch.equal(s, fewshot.subset_indices(100, 20, 7, seed=3))
    assert not torch.equal(s, fewshot.subset_indices(100, 20, 7, seed=4))
    assert not torch.equal(s[:, :10], fewshot.subset_indices(100, 10, 7, seed=3))


def test_batched_adamw_heads_are_independent():
    x, y = toy()
    xs, _, _ = fewshot._standardised(x[fewshot.subset_indices(300, 40, 3, seed=0)])
    ys = y[fewshot.subset_indices(300, 40, 3, seed=0)]
    W1, b1, _ = fewshot.train_heads(xs, ys, 3, epochs=20, lr=1e-2, batch_size=16)
    # replace subset 1 and 2: subset 0's head (same init, same order) must not change
    other = torch.flip(xs[1:], dims=[1]) * 0.5
    W2, b2, _ = fewshot.train_heads(torch.cat([xs[:1], other]), torch.cat([ys[:1], ys[1:].flip(1)]), 3, epochs=20,
                                    lr=1e-2, batch_size=16)
    assert torch.allclose(W1[0], W2[0], atol=1e-6) and torch.allclose(b1[0], b2[0], atol=1e-6)
    assert not torch.allclose(W1[1], W2[1], atol=1e-3)


def test_batched_lbfgs_reaches_each_subsets_own_optimum():
    x, y = toy()
    subsets = fewshot.subset_indices(300, 50, 4, seed=1)
    xs, _, _ = fewshot._standardised(x.double()[subsets])
    W, b, grad = fewshot.train_heads(xs, y[subsets], 3, method="lbfgs", l2=1e-2, tol=1e-9, max_iter=2000)
    assert grad < 1e-6
    for i in range(4):
        Wi, bi, _ = fewshot.train_heads(xs[i:i + 1], y[subsets][i:i + 1], 3, method="lbfgs", l2=1e-2, tol=1e-9,
                                         max_iter=2000)
        assert torch.allclose(W[i], Wi[0], atol=1e-5) and torch.allclose(b[i], bi[0], atol=1e-5)
        # the optimum's gradient vanishes: mean CE gradient + l2 W = 0, checked by hand
        p = torch.softmax(xs[i] @ W[i].T + b[i], dim=1)
        onehot = torch.nn.functional.one_hot(y[subsets][i], 3).double()
        gW = (p - onehot).T @ xs[i] / 50 + 1e-2 * W[i]
        assert gW.abs().max() < 1e-5


def test_accuracies_with_the_folded_standardisation_equal_explicit_ones():
    x, y = toy(n=400)
    pool_x, pool_y, test_x, test_y = x[:250], y[:250], x[250:], y[250:]
    subsets = fewshot.subset_indices(250, 60, 3, seed=2)
    acc, grad = fewshot.fewshot_accuracies(pool_x, pool_y, test_x, test_y, 3, subsets, method="lbfgs", l2=1e-2)
    xs, mu, sd = fewshot._standardised(pool_x.double()[subsets])
    W, b, _ = fewshot.train_heads(xs, pool_y[subsets], 3, method="lbfgs", l2=1e-2)
    for i in range(3):
        pred = (((test_x.double() - mu[i]) / sd[i]) @ W[i].T + b[i]).argmax(1)
        assert acc[i] == (pred == test_y).double().mean().item()
    assert min(acc) > 0.6  # the toy classes are separable enough
    acc_adamw, g = fewshot.fewshot_accuracies(pool_x, pool_y, test_x, test_y, 3, subsets, method="adamw", epochs=30)
    assert len(acc_adamw) == 3 and g != g  # nan: no convex objective
