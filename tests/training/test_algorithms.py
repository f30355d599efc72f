"""SAM and the adversarial objective."""

from __future__ import annotations

import pytest
import torch

from sameloss.errors import UserError
from sameloss.languages import PCFG
from sameloss.training import pretrain
from sameloss.training.checkpoint import complete_checkpoints, load_state
from sameloss.training.config import AdversarialConfig, PretrainConfig
from sameloss.training.objectives import sam
from sameloss.training.objectives.adversarial import Adversarial

from training.test_pretrain import small_config, weights


def _quadratic():
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(5, dtype=torch.float64))
    a = torch.randn(5, 5, dtype=torch.float64)
    h = a @ a.T + torch.eye(5, dtype=torch.float64)

    def loss(x):
        return 0.5 * x @ h @ x + x.sum() ** 3 / 10

    return w, loss


@pytest.mark.parametrize("adaptive", [False, True])
def test_sam_step_is_the_base_step_with_the_gradient_at_the_ascent_point(adaptive):
    w, loss = _quadratic()
    start = w.detach().clone()
    opt = torch.optim.SGD([w], lr=0.1)
    loss(w).backward()
    g = w.grad.clone()
    eps = sam.ascend([w], 0.05, adaptive)
    t = start.abs() if adaptive else torch.ones_like(start)
    want = 0.05 * t * t * g / (t * g).norm()
    assert torch.allclose(w.detach() - start, want, atol=1e-14) and torch.allclose(eps[0], want, atol=1e-14)
    if not adaptive:
        assert (w.detach() - start).norm().item() == pytest.approx(0.05, abs=1e-12)
    opt.zero_grad()
    loss(w).backward()
    g_at_ascent = w.grad.clone()
    sam.descend([w], eps)
    opt.step()
    assert torch.allclose(w.detach(), start - 0.1 * g_at_ascent, atol=1e-14)


def test_the_stacked_ascent_is_each_members_own():
    """``ascend_stacked`` moves each member of a stack as ``ascend`` moves it alone (its own
    norm and radius), and ``descend`` brings both back."""
    torch.manual_seed(1)
    a, b = torch.randn(3, 4, 5, dtype=torch.float64), torch.randn(3, 7, dtype=torch.float64)
    ga, gb = torch.randn_like(a), torch.randn_like(b)
    rho = torch.tensor([0.05, 0.2, 0.0], dtype=torch.float64)
    for adaptive in (False, True):
        params = {"a": a.clone(), "b": b.clone()}
        params["a"].grad, params["b"].grad = ga, gb
        eps = sam.ascend_stacked(params, rho, adaptive)
        for i in range(3):
            alone = [a[i].clone(), b[i].clone()]
            alone[0].grad, alone[1].grad = ga[i], gb[i]
            sam.ascend(alone, float(rho[i]), adaptive)
            assert torch.allclose(params["a"][i], alone[0], atol=1e-15) and torch.allclose(params["b"][i], alone[1])
        sam.descend(params, eps)
        assert torch.allclose(params["a"], a, atol=1e-15) and torch.allclose(params["b"], b, atol=1e-15)


def test_a_sam_checkpoint_keeps_its_optimiser_state_as_sam_runs_saved_it(tmp_path):
    cfg = small_config(steps=4, **{"sam.rho": 0.07, "sam.adaptive": "true", "model.dropout": 0.0})
    pretrain(cfg, tmp_path / "sam", progress=False)
    saved = load_state(complete_checkpoints(tmp_path / "sam")[-1])["optimizer"]
    assert set(saved) == {"base", "rho", "adaptive"} and saved["rho"] == 0.07 and saved["adaptive"] is True
    assert sam.base_state(saved) is saved["base"] and "exp_avg" in saved["base"]["state"][0]
    plain = {"state": {}, "param_groups": []}
    assert sam.base_state(plain) is plain


def test_sam_pretraining_resumes_bit_identically(tmp_path):
    cfg = small_config(**{"sam.rho": 0.05, "model.dropout": 0.0, "optim.weight_decay": 0.0})
    pretrain(cfg, tmp_path / "whole", progress=False)
    pretrain(cfg, tmp_path / "split", progress=False, stop_after=5)
    pretrain(cfg, tmp_path / "split", progress=False, resume=True)
    a, b = weights(tmp_path / "whole"), weights(tmp_path / "split")
    assert all(torch.equal(a[k], b[k]) for k in a)
    # and SAM changed the trajectory
    plain = small_config(**{"model.dropout": 0.0, "optim.weight_decay": 0.0})
    pretrain(plain, tmp_path / "plain", progress=False)
    c = weights(tmp_path / "plain")
    assert any(not torch.equal(a[k], c[k]) for k in a)


def test_closed_form_head_is_the_ridge_solution_and_differentiable():
    lang = PCFG.preset("tiny")
    adv = Adversarial(PretrainConfig(adversarial=AdversarialConfig(weight=1.0, task="A", pool_size=200, ridge=0.1)),
                      lang)
    torch.manual_seed(0)
    feats = torch.randn(40, 3, 4, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(0, 3, (40,))
    got = adv.downstream_loss(feats, labels)
    # primal ridge: W = (X1^T X1 + lam I)^-1 X1^T Y1
    x = torch.cat([feats.detach().flatten(1), torch.ones(40, 1, dtype=torch.float64)], 1)
    y = torch.nn.functional.one_hot(labels, adv.n_classes).double()
    x1, x2, y1, y2 = x[:20], x[20:], y[:20], y[20:]
    lam = 0.1 * (x1 * x1).sum(1).mean()
    w = torch.linalg.solve(x1.T @ x1 + lam * torch.eye(x.shape[1], dtype=torch.float64), x1.T @ y1)
    want = (x2 @ w - y2).pow(2).sum(1).mean()
    assert got.item() == pytest.approx(want.item(), rel=1e-10)
    got.backward()
    assert feats.grad is not None and feats.grad.abs().sum() > 0


def test_adversarial_pretraining_runs_and_logs_the_downstream_loss(tmp_path):
    cfg = small_config(**{"adversarial.weight": 0.5, "adversarial.task": "A", "adversarial.batch_size": 32,
                          "adversarial.pool_size": 200})
    result = pretrain(cfg, tmp_path / "adv", progress=False)
    assert result["kl"] > 0
    text = (tmp_path / "adv" / "metrics.jsonl").read_text()
    assert "adversarial_downstream_loss" in text
    assert complete_checkpoints(tmp_path / "adv")


def test_adversarial_task_must_exist():
    from sameloss.errors import UserError
    with pytest.raises(UserError, match="adversarial.task 'Z' is not a task of pcfg"):
        Adversarial(PretrainConfig(adversarial=AdversarialConfig(weight=1.0, task="Z")), PCFG.preset("tiny"))


def test_update_half_updates_on_exactly_the_half_batch_sam_updates_on(tmp_path, monkeypatch):
    """The control of SAM's batch: the update sees SAM's update half (the second half of
    the step's batch, the same sentences and masks) and nothing else, once per step."""
    from sameloss.training.objectives import mlm

    seen = []
    real = mlm.mlm_loss

    def recording(model, batch, n_targets_global, world_size):
        seen.append((batch.inputs.clone(), batch.targets.clone(), batch.masked.clone(), n_targets_global))
        return real(model, batch, n_targets_global, world_size)

    monkeypatch.setattr(mlm, "mlm_loss", recording)
    noreg = {"model.dropout": 0.0, "optim.weight_decay": 0.0}
    pretrain(small_config(steps=4, **noreg, **{"sam.rho": 0.05}), tmp_path / "sam", progress=False)
    sam_calls, seen[:] = list(seen), []
    pretrain(small_config(steps=4, **noreg, update_half="true"), tmp_path / "half", progress=False)
    half_calls, seen[:] = list(seen), []
    pretrain(small_config(steps=4, **noreg), tmp_path / "full", progress=False)
    full_calls = list(seen)
    assert len(sam_calls) == 8 and len(half_calls) == 4 and len(full_calls) == 4
    for step in range(4):
        ascent, update = sam_calls[2 * step], sam_calls[2 * step + 1]
        got, full = half_calls[step], full_calls[step]
        assert all(torch.equal(a, b) for a, b in zip(update[:3], got[:3])) and update[3] == got[3]
        # the half is the second half of the full batch; SAM's ascent half is not used
        assert torch.equal(got[0], full[0][16:]) and torch.equal(ascent[0], full[0][:16])
        assert got[3] == int(full[2][16:].sum())
    a, b = weights(tmp_path / "half"), weights(tmp_path / "full")
    assert any(not torch.equal(a[k], b[k]) for k in a)
    with pytest.raises(UserError, match="update_half"):
        small_config(update_half="true", **{"sam.rho": 0.05})


def test_update_half_resumes_bit_identically(tmp_path):
    cfg = small_config(update_half="true")
    pretrain(cfg, tmp_path / "whole", progress=False)
    pretrain(cfg, tmp_path / "split", progress=False, stop_after=5)
    pretrain(cfg, tmp_path / "split", progress=False, resume=True)
    a, b = weights(tmp_path / "whole"), weights(tmp_path / "split")
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("settings", [{"optim.weight_decay": 0.01}, {"optim.name": "sgd", "optim.momentum": 0.9,
                                                                        "optim.weight_decay": 0.1}])
def test_the_multi_tensor_step_is_the_single_tensor_step_bit_for_bit(settings):
    """``optim`` asks torch for its ``foreach`` step, which must not change a run's numbers."""
    from sameloss.training.optim import make_optimizer
    from sameloss.training.runio import build_language, init_model

    cfg = small_config(**settings)
    language = build_language(cfg)
    got = []
    for foreach in (True, False):
        torch.manual_seed(0)
        model = init_model(cfg, language)
        optimizer = make_optimizer(cfg, model)
        assert all(g["foreach"] for g in optimizer.param_groups)
        for group in optimizer.param_groups:
            group["foreach"] = foreach
        gen = torch.Generator().manual_seed(1)
        for step in range(30):
            for p in model.parameters():
                p.grad = torch.randn(p.shape, generator=gen) * 10.0 ** (step % 5 - 2)
            optimizer.step()
        got.append([p.detach() for p in model.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*got))
