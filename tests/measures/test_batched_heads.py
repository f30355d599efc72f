"""Few-shot heads fitted as one batched problem (``measures.batched_heads``) against the
per-size path they replace (``heads.fit_linear_heads``: L-BFGS, torch's AdamW).

Tolerances, and why numbers cannot be equal bit for bit:
* Newton (the ``lbfgs`` endpoint) converges to the optimum (gradient norm ≤ 1e-10) where the
  old L-BFGS stopped short (~1e-4 left at the study's sizes): its weights are within 1e-6
  relative of an L-BFGS run to 1e-12, and its test predictions equal the old ones except on
  near ties — a changed prediction's top-two logit gap under the converged head is below
  ``NEAR_TIE``.
* AdamW keeps every head's draws and schedule; its sums run in another order (a closed-form
  gradient, minibatches padded to one width), so float32 rounding differs and is carried
  through the steps: weights within 1e-5 relative of torch's AdamW on the same schedule,
  test predictions equal except on ties within ``NEAR_TIE``.
"""

from __future__ import annotations

import torch

from sameloss.measures import fewshot
from sameloss.measures.batched_heads import HeadGroup, adamw_heads, newton_heads
from sameloss.measures.heads import HeadTraining, fit_linear_heads

NEAR_TIE = 1e-3


def data(n=900, D=8, C=4, seed=0, rare=0.03):
    """Off-centre Gaussian classes, the last one rare (few-shot subsets often miss it)."""
    g = torch.Generator().manual_seed(seed)
    weights = torch.tensor([1.0] * (C - 1) + [rare * (C - 1)])
    y = torch.multinomial(weights / weights.sum(), n, replacement=True, generator=g)
    means = torch.randn(C, D, generator=g) * 1.2
    x = means[y] + torch.randn(n, D, generator=g) * 1.5 + 3.0
    return x, y


def groups_of(x, y, sizes=((20, 6), (60, 4), (300, 3)), dtype=torch.float64, seed=0):
    out, scales = [], []
    for n, k in sizes:
        s = fewshot.subset_indices(x.shape[0], n, k, seed)
        xs, mu, sd = fewshot._standardised(x.to(dtype)[s])
        out.append(HeadGroup(xs, y[s]))
        scales.append((mu, sd))
    return out, scales


def logits_of(W, b, x):
    return torch.einsum("md,kcd->kmc", x, W) + b[:, None, :]


def assert_same_predictions_but_near_ties(new_logits, old_logits):
    new_pred, old_pred = new_logits.argmax(dim=2), old_logits.argmax(dim=2)
    top2 = new_logits.topk(2, dim=2).values
    gap = (top2[..., 0] - top2[..., 1])[new_pred != old_pred]
    assert gap.numel() == 0 or float(gap.max()) < NEAR_TIE, gap
    return int((new_pred != old_pred).sum())


def test_newton_reaches_the_optimum_of_each_head():
    x, y = data()
    groups, _ = groups_of(x, y)
    fits = newton_heads(groups, 4, l2=1e-2)
    for g, fit in zip(groups, fits):
        assert float(fit.grad_norm.max()) <= 1e-10
        tight = fit_linear_heads(g.x, g.y, 4, HeadTraining("lbfgs", l2=1e-2, max_iter=5000, tolerance_grad=1e-12,
                                                             tolerance_change=0.0))
        present = torch.nn.functional.one_hot(g.y, 4).sum(dim=1) > 0
        for h in range(g.x.shape[0]):
            if bool(present[h].all()):  # a finite optimum: the same weights as a tight L-BFGS
                assert torch.allclose(fit.W[h], tight.W[h], rtol=1e-6, atol=1e-7 * float(tight.W[h].abs().max()))
                assert torch.allclose(fit.b[h] - fit.b[h].mean(), tight.b[h] - tight.b[h].mean(), rtol=1e-6,
                                      atol=1e-7)
            # the gradient by hand: (p − onehot)ᵀx̃ / n + l2 [W, 0] = 0 (absent classes: p = 0, W = 0)
            p = torch.softmax(g.x[h] @ fit.W[h].T + fit.b[h], dim=1)
            r = p - torch.nn.functional.one_hot(g.y[h], 4).double()
            gW = r.T @ g.x[h] / g.x.shape[1] + 1e-2 * fit.W[h]
            assert float(gW.abs().max()) < 1e-9 and float(r.sum(dim=0).abs().max()) < 1e-9 * g.x.shape[1]


def test_an_absent_class_is_never_predicted_and_the_others_are_the_reduced_optimum():
    x, y = data(seed=1, rare=0.0)  # the last class never occurs
    groups, _ = groups_of(x, y, sizes=((40, 3),))
    fit = newton_heads(groups, 4, l2=1e-2)[0]
    assert bool(torch.isinf(fit.b[:, 3]).all()) and float(fit.W[:, 3].abs().max()) == 0.0
    reduced = newton_heads(groups, 3, l2=1e-2)[0]  # the same problem without the class
    assert torch.allclose(fit.W[:, :3], reduced.W, atol=1e-9) and torch.allclose(fit.b[:, :3], reduced.b, atol=1e-9)
    # the old L-BFGS stopped on the way (its bias for the class finite): the same predictions
    old = fit_linear_heads(groups[0].x, groups[0].y, 4, HeadTraining("lbfgs", l2=1e-2, tolerance_grad=1e-6,
                                                                      tolerance_change=1e-14))
    probe = torch.randn(500, x.shape[1], generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    assert assert_same_predictions_but_near_ties(logits_of(fit.W, fit.b, probe), logits_of(old.W, old.b, probe)) \
        <= 5


def test_groups_fitted_together_are_the_groups_fitted_alone():
    x, y = data(seed=3)
    groups, _ = groups_of(x, y)
    together = newton_heads(groups, 4, l2=1e-2)
    for g, fit in zip(groups, together):
        alone = newton_heads([g], 4, l2=1e-2)[0]
        assert torch.equal(fit.W, alone.W) and torch.equal(fit.b, alone.b)
    groups32, _ = groups_of(x, y, dtype=torch.float32)
    how = HeadTraining("adamw", epochs=7, batch_size=32)
    together = adamw_heads(groups32, 4, how)
    for g, fit in zip(groups32, together):
        alone = adamw_heads([g], 4, how)[0]
        assert torch.allclose(fit.W, alone.W, rtol=1e-5, atol=1e-7) and torch.allclose(fit.b, alone.b, atol=1e-7)


def test_adamw_follows_each_heads_own_schedule_as_torch_adamw_does():
    x, y = data(seed=4)
    groups, _ = groups_of(x, y, dtype=torch.float32)
    how = HeadTraining("adamw", epochs=6, batch_size=32, lr=3e-2)  # several minibatches, a short last one
    probe = torch.randn(2000, x.shape[1], generator=torch.Generator().manual_seed(5))
    changed = 0
    for g, fit in zip(groups, adamw_heads(groups, 4, how)):
        old = fit_linear_heads(g.x, g.y, 4, how, seed=g.seed)
        scale = float(old.W.abs().max())
        assert torch.allclose(fit.W, old.W, rtol=1e-5, atol=1e-5 * scale)
        assert torch.allclose(fit.b, old.b, rtol=1e-5, atol=1e-5 * scale)
        changed += assert_same_predictions_but_near_ties(logits_of(fit.W, fit.b, probe), logits_of(old.W, old.b, probe))
    assert changed <= 3
    # a different seed draws another init and order: the heads change
    other = adamw_heads([HeadGroup(groups[0].x, groups[0].y, seed=1)], 4, how)[0]
    assert not torch.allclose(other.W, fit_linear_heads(groups[0].x, groups[0].y, 4, how, seed=0).W, atol=1e-3)


def old_fewshot_accuracies(pool_x, pool_y, test_x, test_y, n_classes, subsets, method, **kw):
    """The per-size path before the batched one (``fit_linear_heads`` per call, einsum)."""
    dtype = torch.float64 if method == "lbfgs" else torch.float32
    x, mu, sd = fewshot._standardised(pool_x.to(dtype)[subsets])
    how = HeadTraining(method, epochs=kw.get("epochs", 100), l2=kw.get("l2", 1e-3), tolerance_grad=1e-6,
                       tolerance_change=1e-14)
    fit = fit_linear_heads(x, pool_y[subsets], n_classes, how, seed=0)
    Wf, bf = fit.W / sd, fit.b - (fit.W * (mu / sd)).sum(dim=2)
    return torch.einsum("md,kcd->kmc", test_x.to(dtype), Wf) + bf[:, None, :]


def test_every_head_kind_and_view_equals_the_per_size_path_but_near_ties():
    g = torch.Generator().manual_seed(6)
    y = torch.multinomial(torch.tensor([1.0, 1.0, 1.0, 0.1]), 1400, replacement=True, generator=g)
    h = torch.randn(1400, 3, 5, generator=g) + 0.7 * y[:, None, None].float() * torch.randn(1, 3, 5, generator=g)
    views = (("pos", fewshot.View((1,))), ("span", fewshot.View((0, 2))), ("mean", fewshot.View((0, 1), "mean")),
             ("all", fewshot.View()))
    design = fewshot.FewShot("t", views, sizes=(20, 80, 300), subsets=(6, 4, 2), pool=400, test=1000,
                             endpoints=tuple((v, m) for v, _ in views for m in ("lbfgs", "adamw")), epochs=8,
                             l2=1e-2)
    out = fewshot.fewshot_probes(h[:400], h[400:], y[:400], y[400:], 4, design)
    changed = 0
    for view, method in design.endpoints:
        xp, xt = design.view(view)(h[:400]), design.view(view)(h[400:])
        for n, k in zip(design.sizes, design.subsets):
            subsets = fewshot.subset_indices(400, n, k, 0)
            old = old_fewshot_accuracies(xp, y[:400], xt, y[400:], 4, subsets, method,
                                         **({"l2": 1e-2} if method == "lbfgs" else {"epochs": 8}))
            new = fewshot.fewshot_accuracies(xp, y[:400], xt, y[400:], 4, subsets, method,
                                             **({"l2": 1e-2} if method == "lbfgs" else {"epochs": 8}))
            assert out[f"{view}_{method}_n{n}_subsets"] == new[0]
            old_acc = (old.argmax(dim=2) == y[400:]).double().mean(dim=1)
            # each subset's accuracy within 2 test examples of the old path's
            assert float((torch.tensor(new[0], dtype=torch.float64) - old_acc).abs().max()) <= 2 / 1000 + 1e-12
            changed += int((old_acc != torch.tensor(new[0], dtype=torch.float64)).sum())
            if method == "lbfgs":
                assert out[f"{view}_{method}_n{n}_grad"] <= 1e-10
    assert changed <= 10  # of 96 subsets


def test_several_representations_at_once_equal_one_at_a_time(monkeypatch):
    g = torch.Generator().manual_seed(7)
    y = torch.randint(0, 3, (260,), generator=g)
    reps = [(torch.randn(200, 3, 4, generator=g) + s * y[:200, None, None], torch.randn(60, 3, 4, generator=g)
             + s * y[200:, None, None]) for s in (0.3, 0.6, 1.0)]
    design = fewshot.FewShot("t", (("pos", fewshot.View((1,))), ("all", fewshot.View())), sizes=(10, 50),
                             subsets=(4, 3), pool=200, test=60,
                             endpoints=(("pos", "lbfgs"), ("pos", "adamw"), ("all", "adamw")), epochs=5)
    many = fewshot.fewshot_probes_many(reps, y[:200], y[200:], 3, design)
    monkeypatch.setattr(fewshot, "ADAMW_PACK_BYTES", 1000)  # AdamW heads in several packs: the same numbers
    assert fewshot.fewshot_probes_many(reps, y[:200], y[200:], 3, design) == many
    for (pool_h, test_h), row in zip(reps, many):
        one = fewshot.fewshot_probes(pool_h, test_h, y[:200], y[200:], 3, design)
        assert one.keys() == row.keys()
        for key, value in one.items():
            assert row[key] == value or (key.endswith("_grad") and abs(row[key] - value) < 1e-12), key
    assert many[0] != many[2]


def test_packs_keep_consecutive_groups_within_the_budget():
    groups = [HeadGroup(torch.zeros(2, n, 4), torch.zeros(2, n, dtype=torch.long)) for n in (10, 20, 5, 100)]
    packs = fewshot._packs(groups, budget=2 * 30 * 4 * 4)  # bytes of 2 heads × 30 examples × 4 floats
    assert [[g.x.shape[1] for g in p] for p in packs] == [[10, 20], [5], [100]]


def test_a_probe_wider_than_newtons_limit_keeps_the_old_lbfgs(monkeypatch):
    x, y = data(seed=8)
    monkeypatch.setattr(fewshot, "NEWTON_MAX_PARAMS", 10)
    subsets = fewshot.subset_indices(600, 40, 3, 0)
    acc, grad = fewshot.fewshot_accuracies(x[:600], y[:600], x[600:], y[600:], 4, subsets, "lbfgs", l2=1e-2)
    old = old_fewshot_accuracies(x[:600], y[:600], x[600:], y[600:], 4, subsets, "lbfgs", l2=1e-2)
    assert acc == (old.argmax(dim=2) == y[600:]).double().mean(dim=1).tolist()
    assert 1e-10 < grad < 1e-4  # L-BFGS's stopping point, not Newton's 1e-10


def test_heads_wider_than_a_hundred_parameters_fit_under_several_torch_threads():
    """MKL's threaded batched LU gave lu_solve invalid pivots from n ≈ 100 with 2+ threads
    (pytorch#142815: "Pivots given to lu_solve must all be ≥ 1"; the study's probes under 3
    threads a worker on a GPU host): the solve runs on one thread, the fit equals the
    one-thread fit and the caller's thread count is restored."""
    x, y = data(n=600, D=40, seed=4)  # 4 classes × 41 = 164 parameters a head, batched heads
    groups, _ = groups_of(x, y, sizes=((60, 4), (300, 3)))
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = newton_heads(groups, 4, l2=1e-2)
        torch.set_num_threads(2)
        two = newton_heads(groups, 4, l2=1e-2)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    for a, b in zip(one, two):
        assert float(b.grad_norm.max()) <= 1e-10
        assert torch.equal(a.W, b.W) and torch.equal(a.b, b.b)
