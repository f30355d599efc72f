"""Few-shot heads on a frozen representation, batched over training subsets (the
``isoloss`` and ``dyck`` studies).

A representation is ``[n, T, d]``: one feature vector per position of each sentence (a
model's final hidden states, the true conditionals of the look-up table, the true
posteriors of the latent structure: ``representations.py``). A ``View`` says which
positions a head reads and how — one position (a task about the word at ``t``), a span of
positions (a task about a constituent), every position side by side, or their mean — so
a task about a span is one more view, not one more code path.

A design (``FewShot``) fixes, for every model compared, the same labelled pool, the same
training subsets (``k`` subsets of ``n`` examples drawn without replacement from the pool,
for each size ``n``) and one test set, so that differences between models are paired down
to the subset. ``subset_indices(pool, n, k, seed)`` draws them; ``fewshot_probes`` runs
every (view, method) endpoint of a design on one representation.

``fewshot_accuracies(features_pool, labels_pool, features_test, labels_test, ...)`` trains
one linear head per subset and returns the test accuracy of each; ``fewshot_probes`` fits
every size's subsets of an endpoint together, and ``fewshot_probes_many`` every
representation's too (a fork's probed checkpoints) — one batched problem per endpoint
(``batched_heads``). The heads are independent: the batched problem is the *sum* of the
subsets' objectives, each head keeps its own optimum (Newton) or its own schedule (AdamW).

* ``method="adamw"`` — the paper's probe with a fixed budget: standardise on the subset,
  ``W ~ U(±1/√D)``, minibatch AdamW (lr 1e-3, weight decay on ``W``) for ``epochs`` epochs,
  the last iterate (no validation split in a few-shot design, so no early selection);
* ``method="lbfgs"`` — the converged convex probe: the optimum of ``mean CE + l2/2 ‖W‖²``
  (the name is the column's: the heads were fitted by L-BFGS until issue 45; now Newton's
  method to a gradient norm of 1e-10, L-BFGS only for probes wider than
  ``batched_heads.NEWTON_MAX_PARAMS``); the largest per-subset gradient norm left is
  returned too.

Standardisation is folded into the head (``W/σ``, ``b − (μ/σ)·W``), so a test set is never
copied per subset.

``count_regression`` is the other head: minimum-norm least squares (``pinv``) for a signed
count read off the class index (Dyck's mismatch count, Theorem 5.1), over independent
draws of ``n`` training examples.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from .batched_heads import NEWTON_MAX_PARAMS, HeadGroup, adamw_heads, newton_heads
from .heads import METHODS, FittedHeads, HeadTraining, fit_linear_heads

POOLINGS = ("concat", "mean")


@dataclass(frozen=True)
class View:
    """The positions of a representation ``[n, T, d]`` a head reads (0-based; ``None``:
    all ``T``) and how: their features side by side (``"concat"``: ``[n, len · d]``) or
    averaged (``"mean"``: ``[n, d]``). ``View((4,))`` is the word at position 5,
    ``View((2, 3, 4))`` a span, ``View()`` the paper's all-positions probe."""

    positions: tuple[int, ...] | None = None
    pool: str = "concat"

    def __post_init__(self):
        if self.pool not in POOLINGS:
            raise ValueError(f"unknown pooling {self.pool!r}; choose from {', '.join(POOLINGS)}")
        if self.positions is not None and (not self.positions or min(self.positions) < 0):
            raise ValueError(f"a view's positions must be non-negative and not empty, got {self.positions}")

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        if self.positions is not None:
            if max(self.positions) >= h.shape[1]:
                raise ValueError(f"view position {max(self.positions)} outside sentences of {h.shape[1]} positions")
            h = h[:, self.positions[0]] if len(self.positions) == 1 else h[:, list(self.positions)]
            if h.dim() == 2:
                return h
        return h.mean(dim=1) if self.pool == "mean" else h.reshape(h.shape[0], -1)


@dataclass(frozen=True)
class FewShot:
    """Few-shot linear probes of a task, the same for every model of a study: a labelled
    pool of ``pool`` examples and a test set of ``test`` (``tasks.make_task_data`` with
    ``seed``), ``subsets[i]`` subsets of ``sizes[i]`` examples each, and the endpoints
    probed — ``(view name, method)`` pairs over the named ``views`` (methods: ``lbfgs``, the
    converged convex probe with ridge ``l2``; ``adamw``, the paper's probe for ``epochs``
    epochs). A result's columns are ``<view>_<method>_n<size>`` (mean test accuracy over
    the subsets), ``_std``, ``_subsets`` (each subset's) and, for lbfgs, ``_grad``."""

    task: str
    views: tuple[tuple[str, View], ...]
    sizes: tuple[int, ...]
    subsets: tuple[int, ...]
    pool: int
    test: int
    endpoints: tuple[tuple[str, str], ...]
    epochs: int = 50
    l2: float = 1e-2
    seed: int = 0

    def __post_init__(self):
        names = {name for name, _ in self.views}
        if len(self.sizes) != len(self.subsets) or not self.sizes or max(self.sizes) > self.pool:
            raise ValueError("few-shot design: one subset count per size, every size within the pool")
        for view, method in self.endpoints:
            if view not in names or method not in METHODS:
                raise ValueError(f"few-shot endpoint ({view}, {method}): unknown view or method")

    def view(self, name: str) -> View:
        return dict(self.views)[name]

    def columns(self) -> list[str]:
        """The accuracy columns of a result, endpoint by endpoint, size by size."""
        return [f"{view}_{method}_n{n}" for view, method in self.endpoints for n in self.sizes]


def fewshot_probes(pool_h: torch.Tensor, test_h: torch.Tensor, pool_y: torch.Tensor, test_y: torch.Tensor,
                   n_classes: int, design: FewShot) -> dict:
    """Every endpoint of ``design`` on one representation (``pool_h`` ``[pool, T, d]``,
    ``test_h`` ``[test, T, d]``, labels ``pool_y``, ``test_y``): per size, the mean test
    accuracy over the subsets, its std, the subsets' accuracies (and for lbfgs the largest
    gradient norm left). ``fewshot_probes_many`` of one representation."""
    return fewshot_probes_many([(pool_h, test_h)], pool_y, test_y, n_classes, design)[0]


def fewshot_probes_many(representations: list[tuple[torch.Tensor, torch.Tensor]], pool_y: torch.Tensor,
                        test_y: torch.Tensor, n_classes: int, design: FewShot) -> list[dict]:
    """``fewshot_probes`` of several representations of the same pool and test sentences
    (e.g. a fork's probed checkpoints), one result per representation, equal to one call
    each: per endpoint, the heads of every representation, size and subset are fitted as
    one batched problem (``batched_heads``)."""
    out: list[dict] = [{} for _ in representations]
    views = [{name: (view(p), view(t)) for name, view in design.views} for p, t in representations]
    subsets = {n: subset_indices(design.pool, n, k, design.seed) for n, k in zip(design.sizes, design.subsets)}
    for view, method in design.endpoints:
        cells = [(r, n) for r in range(len(representations)) for n in design.sizes]
        kw = {"l2": design.l2} if method == "lbfgs" else {"epochs": design.epochs}
        accs = fewshot_accuracies_many([(views[r][view][0], subsets[n]) for r, n in cells], pool_y,
                                       [views[r][view][1] for r, _ in cells], test_y, n_classes, method, **kw)
        for (r, n), (acc, grad) in zip(cells, accs):
            key = f"{view}_{method}_n{n}"
            out[r][key] = float(np.mean(acc))
            out[r][f"{key}_std"] = float(np.std(acc, ddof=1)) if len(acc) > 1 else 0.0
            out[r][f"{key}_subsets"] = acc
            if method == "lbfgs":
                out[r][f"{key}_grad"] = grad
    return out


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


def _training(method: str, tol: float = 1e-6, **settings) -> HeadTraining:
    """The few-shot heads' training settings (``HeadTraining``'s fields; ``tol``: the
    gradient tolerance), with this module's defaults: 100 epochs, l2 1e-3."""
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}")
    return HeadTraining(method, **{"epochs": 100, "l2": 1e-3, **settings}, tolerance_grad=tol, tolerance_change=1e-14)


def train_heads(x: torch.Tensor, y: torch.Tensor, n_classes: int, method: str = "adamw", seed: int = 0,
                **settings) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Heads ``(W [k, C, D], b [k, C])`` on standardised ``x [k, n, D]`` with labels ``y [k, n]``,
    and the largest per-subset gradient norm of the convex objective left (``nan`` for adamw):
    ``_fit`` of one group (``settings``: ``_training``'s)."""
    fit = _fit([HeadGroup(x, y, seed)], n_classes, _training(method, **settings))[0]
    grad = float(fit.grad_norm.max()) if fit.grad_norm is not None else float("nan")
    return fit.W, fit.b, grad


ADAMW_PACK_BYTES = 48 * 2**20


def _packs(groups: list[HeadGroup], budget: int) -> list[list[HeadGroup]]:
    """Consecutive groups packed while their features take at most ``budget`` bytes (at
    least one group a pack)."""
    packs: list[list[HeadGroup]] = []
    used = budget + 1
    for g in groups:
        size = g.x.numel() * g.x.element_size()
        if used + size > budget:
            packs.append([])
            used = 0
        packs[-1].append(g)
        used += size
    return packs


def _fit(groups: list[HeadGroup], n_classes: int, how: HeadTraining) -> list[FittedHeads]:
    """The heads of every group, fitted together: ``batched_heads.adamw_heads`` or
    ``newton_heads``; a convex probe wider than ``NEWTON_MAX_PARAMS`` keeps L-BFGS
    (``heads.fit_linear_heads``, group by group). Newton converges to ``min(tol, 1e-10)``
    in the gradient norm (L-BFGS's ``tol`` bounds the largest gradient entry)."""
    if how.method == "adamw":
        # packs of groups whose examples take at most ADAMW_PACK_BYTES: the minibatch steps are
        # bound by memory traffic, and one pack much larger than the caches (a fork's three
        # checkpoints of a wide view) measured 1.5x slower than its parts one after another
        out: list[FittedHeads] = []
        for pack in _packs(groups, ADAMW_PACK_BYTES):
            out += adamw_heads(pack, n_classes, how)
        return out
    if n_classes * (groups[0].x.shape[2] + 1) > NEWTON_MAX_PARAMS:
        return [fit_linear_heads(g.x, g.y, n_classes, how, seed=g.seed) for g in groups]
    return newton_heads(groups, n_classes, how.l2, tol=min(how.tolerance_grad, 1e-10), max_iter=how.max_iter)


@torch.no_grad()
def _accuracies(W: torch.Tensor, b: torch.Tensor, mu: torch.Tensor, sd: torch.Tensor, x_test: torch.Tensor,
                y_test: torch.Tensor, rows: int = 8192) -> torch.Tensor:
    """``[k]``: each head's test accuracy, the standardisation folded into the heads; the
    test set in chunks of ``rows``, all heads in one matrix product per chunk."""
    Wf = W / sd  # [k, C, D] / [k, 1, D]: the head on raw features
    bf = b - (W * (mu / sd)).sum(dim=2)
    k, C, D = Wf.shape
    correct = torch.zeros(k, dtype=torch.float64, device=W.device)
    for start in range(0, x_test.shape[0], rows):
        logits = (x_test[start:start + rows] @ Wf.reshape(k * C, D).T).view(-1, k, C) + bf
        correct += (logits.argmax(dim=2) == y_test[start:start + rows, None]).sum(dim=0)
    return correct / x_test.shape[0]


def fewshot_accuracies(pool_x: torch.Tensor, pool_y: torch.Tensor, test_x: torch.Tensor, test_y: torch.Tensor,
                       n_classes: int, subsets: torch.Tensor, method: str = "adamw", **kwargs
                       ) -> tuple[list[float], float]:
    """Test accuracy of a head trained on each row of ``subsets`` (indices into the pool),
    and the largest gradient norm left (lbfgs; ``nan`` for adamw). Features are used in
    float64 for lbfgs (a converged optimum) and float32 for adamw."""
    return fewshot_accuracies_many([(pool_x, subsets)], pool_y, [test_x], test_y, n_classes, method, **kwargs)[0]


def fewshot_accuracies_many(cells: list[tuple[torch.Tensor, torch.Tensor]], pool_y: torch.Tensor,
                            tests: list[torch.Tensor], test_y: torch.Tensor, n_classes: int, method: str = "adamw",
                            **kwargs) -> list[tuple[list[float], float]]:
    """``fewshot_accuracies`` of several cells ``(pool features, subsets)`` — each with its
    own test features ``tests[i]`` —, their heads fitted together (``_fit``; ``kwargs``:
    ``seed`` and ``_training``'s settings)."""
    dtype = torch.float64 if method == "lbfgs" else torch.float32
    seed = kwargs.pop("seed", 0)
    how = _training(method, **kwargs)
    groups, scales = [], []
    for pool_x, subsets in cells:
        x, mu, sd = _standardised(pool_x.to(dtype)[subsets])
        groups.append(HeadGroup(x, pool_y[subsets], seed))
        scales.append((mu, sd))
    out = []
    for fit, (mu, sd), test_x in zip(_fit(groups, n_classes, how), scales, tests):
        acc = _accuracies(fit.W, fit.b, mu, sd, test_x.to(dtype), test_y)
        grad = float(fit.grad_norm.max()) if fit.grad_norm is not None else float("nan")
        out.append((acc.tolist(), grad))
    return out


@dataclass(frozen=True)
class CountRegression:
    """Minimum-norm least-squares heads (with a bias) for the signed count ``g = 2·c − (C − 1)``
    of a task whose class ``c`` counts something out of ``C − 1`` (Dyck's mismatch task:
    ``g* = #')' − #'('``), learned from ``n`` examples (each of ``n_train``) drawn ``draws``
    times from a pool of ``pool``, tested on ``n_test`` others, on each named view."""

    task: str
    n_train: tuple[int, ...]
    draws: int
    pool: int
    n_test: int
    views: tuple[tuple[str, View], ...]

    def __post_init__(self):
        if self.draws < 2 or max(self.n_train) > self.pool:
            raise ValueError("downstream: need >= 2 draws and n_train <= pool")


def count_regression(pool_h: torch.Tensor, test_h: torch.Tensor, pool_c: torch.Tensor, test_c: torch.Tensor,
                     n_classes: int, design: CountRegression, generator: torch.Generator) -> dict:
    """Per ``n`` and view: test MSE of the count and accuracy of its rounded prediction,
    mean, std and standard error over the draws (columns ``down_{mse,acc}_<view>_<n>``,
    ``_std``, ``_se``), and the count's variance on the test set (``target_variance``: what
    a head predicting the mean scores). Representations in float64; the draws come from
    ``generator``."""
    top = n_classes - 1

    def count(c):
        return (2 * c - top).double()

    y_pool, y_test = count(pool_c), count(test_c)
    views = {name: (view(pool_h.double()), view(test_h.double())) for name, view in design.views}
    row: dict = {}
    for n in design.n_train:
        idx = torch.stack([torch.randperm(design.pool, generator=generator)[:n] for _ in range(design.draws)])
        for name, (x_pool, x_test) in views.items():
            ones = torch.ones(x_pool.shape[0], 1, dtype=torch.float64)
            xb = torch.cat([x_pool, ones], 1)[idx]  # [draws, n, D+1]
            w = torch.linalg.pinv(xb) @ y_pool[idx][..., None]  # minimum-norm solutions [draws, D+1, 1]
            xt = torch.cat([x_test, torch.ones(x_test.shape[0], 1, dtype=torch.float64)], 1)
            pred = (xt @ w)[..., 0]  # [draws, n_test]
            mse = (pred - y_test).square().mean(dim=1)
            cls = ((pred + top) / 2).round().clamp(0, top)
            acc = (cls == test_c.double()).double().mean(dim=1)
            for what, v in (("mse", mse), ("acc", acc)):
                key = f"down_{what}_{name}_{n}"
                row[key] = float(v.mean())
                row[f"{key}_std"] = float(v.std())
                row[f"{key}_se"] = float(v.std()) / math.sqrt(design.draws)
    row["target_variance"] = float(y_test.var())
    return row
