"""Few-shot linear probes, batched over training subsets (the ``isoloss`` study).

A *design* fixes, for every model compared, the same labelled pool, the same training
subsets (``k`` subsets of ``n`` examples drawn without replacement from the pool, for each
size ``n``) and one test set, so that differences between models are paired down to the
subset. ``subset_indices(pool, n, k, seed)`` draws them.

``fewshot_accuracies(features_pool, labels_pool, features_test, labels_test, ...)`` trains
one linear head per subset — all ``k`` of one size at once, as one batched problem — and
returns the test accuracy of each. The heads are independent: the batched objective is the
*sum* of the subsets' objectives, so its gradient is block-separable, AdamW's update is
element-wise, and the convex objective's optimum is each subset's own optimum.

* ``method="adamw"`` — the paper's probe with a fixed budget: standardise on the subset,
  ``W ~ U(±1/√D)``, minibatch AdamW (lr 1e-3, weight decay on ``W``) for ``epochs`` epochs,
  the last iterate (no validation split in a few-shot design, so no early selection);
* ``method="lbfgs"`` — the converged convex probe: ``mean CE + l2/2 ‖W‖²`` from zero by
  full-batch L-BFGS (strong Wolfe) until the largest gradient entry is below ``tol``; the
  largest per-subset gradient norm left is returned too.

Standardisation is folded into the head (``W/σ``, ``b − (μ/σ)·W``), so a test set is never
copied per subset.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

METHODS = ("adamw", "lbfgs")


def subset_indices(pool: int, n: int, k: int, seed: int) -> torch.Tensor:
    """``[k, n]`` long: ``k`` subsets of ``n`` distinct indices of ``range(pool)``."""
    if not 0 < n <= pool:
        raise ValueError(f"a subset of {n} needs a pool of at least {n} examples, got {pool}")
    gen = torch.Generator().manual_seed(int(seed) * 1_000_003 + n)
    return torch.rand(k, pool, generator=gen).argsort(dim=1)[:, :n]


def _standardised(x: torch.Tensor, eps: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(x − μ)/σ`` per subset and feature (``x``: ``[k, n, D]``), and ``μ``, ``σ``."""
    mu = x.mean(dim=1, keepdim=True)
    sd = x.std(dim=1, unbiased=False, keepdim=True)
    sd = torch.where(sd > eps, sd, torch.ones_like(sd))
    return (x - mu) / sd, mu, sd


def _ce_sum(x: torch.Tensor, y: torch.Tensor, W: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Sum over subsets of each subset's mean cross-entropy."""
    logits = torch.baddbmm(b[:, None, :], x, W.transpose(1, 2))  # [k, n, C]
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="sum") / y.shape[1]


def train_heads(x: torch.Tensor, y: torch.Tensor, n_classes: int, method: str = "adamw", epochs: int = 100,
                lr: float = 1e-3, batch_size: int = 128, weight_decay: float = 0.01, l2: float = 1e-3,
                max_iter: int = 500, tol: float = 1e-6, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Heads ``(W [k, C, D], b [k, C])`` on standardised ``x [k, n, D]`` with labels ``y [k, n]``,
    and the largest per-subset gradient norm of the convex objective left (``nan`` for adamw)."""
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}")
    k, n, D = x.shape
    gen = torch.Generator().manual_seed(int(seed))
    if method == "lbfgs":
        W = torch.zeros(k, n_classes, D, dtype=x.dtype, requires_grad=True)
        b = torch.zeros(k, n_classes, dtype=x.dtype, requires_grad=True)
        opt = torch.optim.LBFGS([W, b], lr=1.0, max_iter=max_iter, history_size=20, tolerance_grad=tol,
                                tolerance_change=1e-14, line_search_fn="strong_wolfe")

        def objective():
            return _ce_sum(x, y, W, b) + 0.5 * l2 * W.pow(2).sum()

        def closure():
            opt.zero_grad()
            loss = objective()
            loss.backward()
            return loss

        opt.step(closure)
        opt.zero_grad()
        objective().backward()
        grad = torch.cat([W.grad.reshape(k, -1), b.grad.reshape(k, -1)], dim=1).norm(dim=1)
        return W.detach(), b.detach(), float(grad.max())
    bound = 1.0 / math.sqrt(max(D, 1))
    W = ((torch.rand(k, n_classes, D, generator=gen, dtype=x.dtype) * 2 - 1) * bound).requires_grad_()
    b = torch.zeros(k, n_classes, dtype=x.dtype, requires_grad=True)
    opt = torch.optim.AdamW([{"params": [W], "weight_decay": weight_decay}, {"params": [b], "weight_decay": 0.0}],
                            lr=lr)
    size = min(batch_size, n)
    rows = torch.arange(k)[:, None]
    for _ in range(epochs):
        order = torch.rand(k, n, generator=gen).argsort(dim=1)
        for start in range(0, n, size):
            idx = order[:, start:start + size]
            loss = _ce_sum(x[rows, idx], y[rows, idx], W, b)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    return W.detach(), b.detach(), float("nan")


@torch.no_grad()
def _accuracies(W: torch.Tensor, b: torch.Tensor, mu: torch.Tensor, sd: torch.Tensor, x_test: torch.Tensor,
                y_test: torch.Tensor) -> torch.Tensor:
    Wf = W / sd  # [k, C, D] / [k, 1, D]: the head on raw features
    bf = b - (W * (mu / sd)).sum(dim=2)
    logits = torch.einsum("md,kcd->kmc", x_test, Wf) + bf[:, None, :]
    return (logits.argmax(dim=2) == y_test[None]).double().mean(dim=1)


def fewshot_accuracies(pool_x: torch.Tensor, pool_y: torch.Tensor, test_x: torch.Tensor, test_y: torch.Tensor,
                       n_classes: int, subsets: torch.Tensor, method: str = "adamw", **kwargs
                       ) -> tuple[list[float], float]:
    """Test accuracy of a head trained on each row of ``subsets`` (indices into the pool),
    and the largest gradient norm left (lbfgs; ``nan`` for adamw). Features are used in
    float64 for lbfgs (a converged optimum) and float32 for adamw."""
    dtype = torch.float64 if method == "lbfgs" else torch.float32
    x, mu, sd = _standardised(pool_x.to(dtype)[subsets])
    W, b, grad = train_heads(x, pool_y[subsets], n_classes, method=method, **kwargs)
    acc = _accuracies(W, b, mu, sd, test_x.to(dtype), test_y)
    return acc.tolist(), grad
