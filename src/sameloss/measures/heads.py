"""The one routine that fits linear softmax heads ``logits = x Wᵀ + b`` on fixed features:
the linear probe's single head (``probe.train_head``: all training examples, a validation
split to select the epoch) and the few-shot probes' batch of independent heads
(``fewshot.train_heads``: one per training subset, solved as one problem) are both
``fit_linear_heads``.

``x`` is ``[n, D]`` for one head (``W [C, D]``, ``b [C]``) or ``[k, n, D]`` for ``k``
independent heads (``W [k, C, D]``, ``b [k, C]``, labels ``[k, n]``); the objective of a
batch is the sum of the heads' own objectives, so its gradient is block-separable,
AdamW's update element-wise and the convex optimum each head's own. ``HeadTraining`` says
how:

* ``method="adamw"``: ``W ~ U(±1/√D)`` from the seed, minibatch AdamW (weight decay on
  ``W`` only) for ``epochs`` epochs in a seeded order; with a validation split the head of
  the epoch with the best validation accuracy (earliest among ties), else the last;
* ``method="lbfgs"``: ``mean CE + l2/2 ‖W‖²`` from zero by full-batch L-BFGS (strong Wolfe)
  until the largest gradient entry is below ``tolerance_grad`` (or ``max_iter``); the
  gradient norm left per head is returned.

The layout picks the tensor operations (one head: ``F.linear`` and a ``randperm`` order;
a batch: ``baddbmm`` and one sorted uniform draw per head), which are those the two
probes used before they shared this routine, so their numbers are unchanged bit for bit.
Everything runs on the device of ``x``; the seed's generator is on the CPU and the
caller's global RNG is not touched.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from tqdm import tqdm

METHODS = ("adamw", "lbfgs")


@dataclass(frozen=True)
class HeadTraining:
    """How heads are fitted (see the module docstring)."""

    method: str = "adamw"
    epochs: int = 50
    lr: float = 1e-3
    batch_size: int = 128
    weight_decay: float = 0.01
    l2: float = 1e-4
    max_iter: int = 500
    tolerance_grad: float = 1e-7
    tolerance_change: float = 1e-12

    def __post_init__(self):
        if self.method not in METHODS:
            raise ValueError(f"unknown method {self.method!r}; choose from {', '.join(METHODS)}")


@dataclass
class FittedHeads:
    """The heads (``W``, ``b``, detached, on the features' device) and their record:
    ``best_epoch`` (AdamW, 1-based: the selected epoch, or the last), ``iterations``
    (L-BFGS), ``grad_norm`` (L-BFGS: per head, the gradient norm of the objective left),
    ``objective`` (L-BFGS: its value at the optimum)."""

    W: torch.Tensor
    b: torch.Tensor
    best_epoch: int | None = None
    iterations: int | None = None
    grad_norm: torch.Tensor | None = None
    objective: float = float("nan")


def fit_linear_heads(x: torch.Tensor, y: torch.Tensor, n_classes: int, how: HeadTraining, seed: int = 0,
                     validation: tuple[torch.Tensor, torch.Tensor] | None = None,
                     progress: bool = False) -> FittedHeads:
    """Heads fitted to features ``x`` and labels ``y`` (module docstring); ``validation``:
    ``(x_val, y_val)`` of one head, to select its AdamW epoch by."""
    if how.method == "lbfgs":
        return _lbfgs(x, y, n_classes, how)
    return _adamw(x, y, n_classes, how, torch.Generator().manual_seed(int(seed)), validation, progress)


def linear_logits(x: torch.Tensor, W: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``x Wᵀ + b`` of one head (``x [n, D]``) or of each of a batch (``x [k, n, D]``)."""
    if x.dim() == 2:
        return F.linear(x, W, b)
    return torch.baddbmm(b[:, None, :], x, W.transpose(1, 2))  # [k, n, C]


def _cross_entropy(x: torch.Tensor, y: torch.Tensor, W: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The mean cross-entropy of one head, or the sum over a batch of each head's mean."""
    logits = linear_logits(x, W, b)
    if x.dim() == 2:
        return F.cross_entropy(logits, y)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="sum") / y.shape[1]


def _lbfgs(x, y, n_classes: int, how: HeadTraining) -> FittedHeads:
    shape = (*x.shape[:-2], n_classes)  # [C] or [k, C]
    W = torch.zeros(*shape, x.shape[-1], dtype=x.dtype, device=x.device, requires_grad=True)
    b = torch.zeros(*shape, dtype=x.dtype, device=x.device, requires_grad=True)
    opt = torch.optim.LBFGS([W, b], lr=1.0, max_iter=how.max_iter, history_size=20, tolerance_grad=how.tolerance_grad,
                            tolerance_change=how.tolerance_change, line_search_fn="strong_wolfe")

    def objective():
        return _cross_entropy(x, y, W, b) + 0.5 * how.l2 * W.pow(2).sum()

    def closure():
        opt.zero_grad()
        loss = objective()
        loss.backward()
        return loss

    opt.step(closure)
    iterations = int(opt.state[W].get("n_iter", 0))
    opt.zero_grad()
    value = objective()
    value.backward()
    heads = 1 if x.dim() == 2 else x.shape[0]
    grad = torch.cat([W.grad.reshape(heads, -1), b.grad.reshape(heads, -1)], dim=1).norm(dim=1)
    return FittedHeads(W.detach(), b.detach(), iterations=iterations, grad_norm=grad, objective=float(value.detach()))


def _order(n: int, heads: int | None, gen: torch.Generator) -> torch.Tensor:
    """An epoch's order of the examples: one ``randperm`` (one head), or each head's from
    one uniform draw sorted (a batch)."""
    if heads is None:
        return torch.randperm(n, generator=gen)
    return torch.rand(heads, n, generator=gen).argsort(dim=1)


def _adamw(x, y, n_classes: int, how: HeadTraining, gen: torch.Generator, validation, progress: bool
           ) -> FittedHeads:
    heads = None if x.dim() == 2 else x.shape[0]
    n, D = x.shape[-2:]
    shape = (n_classes, D) if heads is None else (heads, n_classes, D)
    bound = 1.0 / math.sqrt(max(D, 1))
    W = ((torch.rand(*shape, generator=gen, dtype=x.dtype) * 2 - 1) * bound).to(x.device).requires_grad_()
    b = torch.zeros(*shape[:-1], dtype=x.dtype, device=x.device, requires_grad=True)
    opt = torch.optim.AdamW([{"params": [W], "weight_decay": how.weight_decay}, {"params": [b], "weight_decay": 0.0}],
                            lr=how.lr)
    size = min(how.batch_size, n) if n else how.batch_size
    rows = None if heads is None else torch.arange(heads)[:, None]
    best = (-1.0, None, None, 0)  # validation accuracy, W, b, epoch
    for epoch in tqdm(range(1, how.epochs + 1), desc=f"head seed {gen.initial_seed()}", unit="epoch",
                      disable=not progress, leave=False):
        order = _order(n, heads, gen).to(x.device)
        for start in range(0, n, size):
            idx = order[..., start:start + size]
            xb, yb = (x[idx], y[idx]) if heads is None else (x[rows, idx], y[rows, idx])
            loss = _cross_entropy(xb, yb, W, b)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        if validation is not None and validation[1].numel():
            acc = accuracy(W.detach(), b.detach(), *validation)
            if acc > best[0]:
                best = (acc, W.detach().clone(), b.detach().clone(), epoch)
    if best[1] is None:  # no validation split (or no epochs): the last head
        return FittedHeads(W.detach(), b.detach(), best_epoch=how.epochs)
    return FittedHeads(best[1], best[2], best_epoch=best[3])


@torch.no_grad()
def accuracy(W: torch.Tensor, b: torch.Tensor, x: torch.Tensor, y: torch.Tensor, batch_size: int = 65_536) -> float:
    """The accuracy of one head on ``x [n, D]``, in chunks of rows (nan without examples)."""
    if y.numel() == 0:
        return float("nan")
    correct = 0
    for start in range(0, y.numel(), batch_size):
        pred = F.linear(x[start:start + batch_size].to(W.device), W, b).argmax(dim=1)
        correct += int((pred == y[start:start + batch_size].to(pred.device)).sum())
    return correct / y.numel()
