"""Batched few-shot probes: subsets, independence of the batched heads, the convex optimum,
the folded standardisation."""

from __future__ import annotations

import pytest
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


# ---- views, designs and the measures built on them ------------------------------------------
def test_views_pick_positions_spans_and_pools():
    h = torch.arange(2 * 4 * 3, dtype=torch.float32).reshape(2, 4, 3)  # [n, T, d]
    assert torch.equal(fewshot.View((2,))(h), h[:, 2])
    assert torch.equal(fewshot.View((1, 2))(h), torch.cat([h[:, 1], h[:, 2]], dim=1))  # a span, side by side
    assert torch.equal(fewshot.View((1, 2), pool="mean")(h), (h[:, 1] + h[:, 2]) / 2)  # a span, averaged
    assert torch.equal(fewshot.View()(h), h.reshape(2, 12))
    assert torch.equal(fewshot.View(pool="mean")(h), h.mean(dim=1))
    with pytest.raises(ValueError, match="outside sentences"):
        fewshot.View((4,))(h)
    with pytest.raises(ValueError, match="pooling"):
        fewshot.View(pool="max")


def design(**kw):
    base = dict(task="t", views=(("pos", fewshot.View((1,))), ("span", fewshot.View((0, 1)))), sizes=(8, 16),
                subsets=(3, 2), pool=40, test=30, endpoints=(("pos", "lbfgs"), ("span", "adamw")), epochs=3)
    return fewshot.FewShot(**{**base, **kw})


def test_fewshot_probes_are_the_heads_of_each_view():
    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, 3, (70,), generator=g)
    h = torch.randn(70, 3, 4, generator=g) + y[:, None, None].float()
    d = design()
    out = fewshot.fewshot_probes(h[:40], h[40:], y[:40], y[40:], 3, d)
    assert d.columns() == ["pos_lbfgs_n8", "pos_lbfgs_n16", "span_adamw_n8", "span_adamw_n16"]
    for key in d.columns():
        assert len(out[f"{key}_subsets"]) == dict(zip(d.sizes, d.subsets))[int(key.split("_n")[1])]
        assert out[key] == pytest.approx(sum(out[f"{key}_subsets"]) / len(out[f"{key}_subsets"]))
    acc, grad = fewshot.fewshot_accuracies(h[:40, 0:2].reshape(40, -1), y[:40], h[40:, 0:2].reshape(30, -1),
                                           y[40:], 3, fewshot.subset_indices(40, 16, 2, 0), "adamw", epochs=3)
    assert out["span_adamw_n16_subsets"] == acc
    assert out["pos_lbfgs_n8_grad"] < 1e-5 and "span_adamw_n8_grad" not in out
    with pytest.raises(ValueError, match="unknown view"):
        design(endpoints=(("nope", "lbfgs"),))
    with pytest.raises(ValueError, match="within the pool"):
        design(sizes=(8, 50))


def test_count_regression_is_the_minimum_norm_least_squares_head():
    g = torch.Generator().manual_seed(1)
    C = 5  # classes 0..4: the count g = 2c - 4
    c = torch.randint(0, C, (90,), generator=g)
    h = torch.randn(90, 2, 3, generator=g, dtype=torch.float64)
    h[:, 0, 0] += c.double()  # the count is (noisily) linear in the first position
    d = fewshot.CountRegression("t", (4, 20), draws=3, pool=50, n_test=40, views=(("first", fewshot.View((0,))),))
    out = fewshot.count_regression(h[:50], h[50:], c[:50], c[50:], C, d, torch.Generator().manual_seed(7))
    # the same draws by hand
    gen = torch.Generator().manual_seed(7)
    for n in (4, 20):
        mses = []
        for _ in range(3):
            idx = torch.randperm(50, generator=gen)[:n]
            x = torch.cat([h[idx, 0], torch.ones(n, 1, dtype=torch.float64)], 1)
            w = torch.linalg.lstsq(x, (2 * c[idx] - 4).double()[:, None], driver="gelsd").solution \
                if n > 4 else torch.linalg.pinv(x) @ (2 * c[idx] - 4).double()[:, None]
            pred = torch.cat([h[50:, 0], torch.ones(40, 1, dtype=torch.float64)], 1) @ w
            mses.append(float((pred[:, 0] - (2 * c[50:] - 4).double()).square().mean()))
        assert out[f"down_mse_first_{n}"] == pytest.approx(sum(mses) / 3, rel=1e-6)
    assert out["down_mse_first_20"] < out["target_variance"]  # enough examples beat the mean
    assert out["target_variance"] == pytest.approx(float((2 * c[50:] - 4).double().var()))
