"""Few-shot heads fitted as one batched problem: every subset of every size (and of every
representation, ``fewshot.fewshot_probes_many``) of one (view, method) endpoint at once.

A ``HeadGroup`` is ``k`` heads on ``n`` examples each (``x [k, n, D]``, standardised,
labels ``y [k, n]``): one training-subset size of one representation. Groups of one call
share ``D`` and the number of classes ``C``; their ``n`` may differ. The heads are
independent problems, so fitting them together changes no head's optimum (Newton) and no
head's own schedule (AdamW).

``newton_heads`` — the converged convex probe (``method="lbfgs"``): each head minimises
``mean CE + l2/2 ‖W‖²`` (``b`` unpenalised) in float64 by Newton's method — one batched
solve of the ``[P, P]`` Hessians per group and step (``P = C·(D+1)``), an Armijo
backtracking line search per head —, until each head's gradient norm is at most ``tol``.
Why dense Newton: the objective is strictly convex and smooth and ``P`` is small for the
probes' views (260 at tiny's position view), so ~10 Newton steps reach the optimum to
1e-10 where L-BFGS needed hundreds of iterations and stopped short (gradients ~1e-4 left
at the quick design's sizes); the Hessian's build (``n·P²``) and solve (``P³``) grow
faster than L-BFGS's ``n·P`` per iteration, so above ``NEWTON_MAX_PARAMS`` the endpoint
keeps the batched L-BFGS (``heads.fit_linear_heads``; see ``fewshot._fit``). A
matrix-free Newton-CG would need ~√κ ≈ 20-100 Hessian-vector products per step at
l2 = 1e-2, which costs about as much as the dense build at these sizes. The Hessian is
built and solved in float32 (LU: torch's batched Cholesky is slower at these sizes;
half the time of float64), redone in float64 for any head whose float32 step fails or
does not descend, while the gradient, the objective and the iterate stay float64: an
inexact Hessian changes the path, not the fixed point (gradient 0 in float64).

Two exact details. (1) The softmax is unchanged by adding a constant to every logit, so
the bias has a flat direction; the penalty ``(Σ_c b_c)²/2`` — zero on the iterates, which
start at 0 and keep ``Σ_c b_c = 0`` as L-BFGS's did — makes the Hessian definite without
moving the optimum. (2) A class absent from a head's subset has no finite optimum (its
bias runs to −∞; L-BFGS stopped somewhere on the way): here its logit is −∞ from the
start — the limit, exactly: that class is never predicted and adds nothing to the
objective, its weights stay 0 — and the other classes are solved to convergence.

``adamw_heads`` — the paper's fixed-budget probe (``method="adamw"``): each head keeps
today's schedule exactly — its group's generator (``seed``) draws ``W ~ U(±1/√D)`` and
then every epoch's order, in the same order as ``heads.fit_linear_heads`` —, minibatches
of ``batch_size`` in that order, ``epochs`` epochs, AdamW (lr, weight decay on ``W``,
torch's update written out element by element). All groups step together: every head
starts at step 1, so the shared step count (bias correction) is each head's own; a group
whose schedule is shorter stops (its heads are a suffix of the batch, ordered by step
count). The last minibatch of an epoch is padded with weight-0 rows, and each head's
cross-entropy is divided by its own minibatch size. The gradient is taken in closed form
(``softmax − onehot``), not by autograd. The numbers equal the per-size path's to
float32 rounding (the sums run in another order), which AdamW carries over hundreds of
steps: weights within ~1e-5 relative, and test predictions equal except on near ties
(``tests/measures/test_batched_heads.py`` states the tolerance).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .heads import FittedHeads, HeadTraining

# C·(D+1) above which the convex probe keeps L-BFGS (module docstring). Measured on the quick
# design's subsets (C = 4, 20/40/10 heads of 50/200/1000): P = 260 (tiny's position view)
# Newton 0.7 s against L-BFGS 4 s; on well-conditioned Gaussian features P = 404 1.9 s
# against 2.3 s, P = 604 3.8 s against 0.7 s (Newton's P³ takes over)
NEWTON_MAX_PARAMS = 420


@dataclass
class HeadGroup:
    """``k`` heads on ``n`` examples each: features ``x [k, n, D]`` and labels ``y [k, n]``;
    ``seed``: the AdamW group's generator (init draws, epoch orders)."""

    x: torch.Tensor
    y: torch.Tensor
    seed: int = 0


# ---- Newton ------------------------------------------------------------------------------
def _assembly(C: int, D1: int) -> torch.Tensor:
    """``[P·P]`` indices that place a head's Hessian blocks ``[D1, pairs, D1]`` (the pairs
    ``c ≤ c'`` of ``triu_indices``) into its ``[P, P]`` matrix, the blocks below the
    diagonal transposed."""
    upper = torch.triu_indices(C, C)
    pair = torch.zeros(C, C, dtype=torch.long)
    pair[upper[0], upper[1]] = torch.arange(upper.shape[1])
    pair = torch.maximum(pair, pair.T)
    c, a, c2, a2 = torch.meshgrid(*(torch.arange(m) for m in (C, D1, C, D1)), indexing="ij")
    below = c > c2
    row, col = torch.where(below, a2, a), torch.where(below, a, a2)
    return (row * (upper.shape[1] * D1) + pair[c, c2] * D1 + col).reshape(-1)


class _Newton:
    """One group's heads under ``newton_heads``: its float64 iterate ``theta [k, C, D+1]``
    (``W`` then ``b``), and the arithmetic. Logits are laid out ``[k, C, n]`` (a softmax
    over a short middle axis runs vectorised along ``n``). Heads that converge leave the
    working tensors (``index``: the original heads still iterating)."""

    def __init__(self, group: HeadGroup, n_classes: int, l2: float):
        x = group.x.double()
        k, n, D = x.shape
        self.n, self.C, self.D1 = n, n_classes, D + 1
        self.x = torch.cat([x, torch.ones(k, n, 1, dtype=x.dtype, device=x.device)], dim=2)  # [k, n, D+1]
        self.x32 = self.x.float()
        self.onehot = F.one_hot(group.y, n_classes).double().transpose(1, 2).contiguous()  # [k, C, n]
        present = self.onehot.sum(dim=2) > 0  # [k, C]
        self.present = present
        self.mask = torch.zeros(k, n_classes, 1, dtype=x.dtype, device=x.device).masked_fill(~present[..., None],
                                                                                             -math.inf)
        self.reg = torch.full((n_classes, D + 1), float(l2), dtype=x.dtype, device=x.device)
        self.reg[:, D] = 0.0
        self.theta = torch.zeros(k, n_classes, D + 1, dtype=x.dtype, device=x.device)
        self.final = self.theta.clone()
        self.norms = torch.zeros(k, dtype=torch.float64)
        self.index = torch.arange(k, device=x.device)
        self.upper = torch.triu_indices(n_classes, n_classes, device=x.device)
        self.where = _assembly(n_classes, D + 1).to(x.device)

    def objective(self, theta: torch.Tensor) -> torch.Tensor:
        """Per head: mean CE (absent classes at −∞) + l2/2 ‖W‖²."""
        z = torch.bmm(theta, self.x.transpose(1, 2)) + self.mask
        # the labels' log-probabilities (an absent class's −∞ is never a label: not −∞·0)
        ce = -torch.log_softmax(z, dim=1).masked_fill(self.onehot == 0, 0.0).sum(dim=(1, 2)) / self.n
        return ce + 0.5 * (self.reg * theta.square()).sum(dim=(1, 2))

    def gradient(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(gradient [k, C, D+1], probabilities [k, C, n])`` at the iterate."""
        p = torch.softmax(torch.bmm(self.theta, self.x.transpose(1, 2)) + self.mask, dim=1)
        return torch.bmm(p - self.onehot, self.x) / self.n + self.reg * self.theta, p

    def hessian(self, p: torch.Tensor, dtype: torch.dtype, rows: torch.Tensor | None = None) -> torch.Tensor:
        """``[k, P, P]``: Σ_i (diag p_i − p_i p_iᵀ) ⊗ x̃_i x̃_iᵀ / n + l2 on ``W``, the bias's
        flat direction closed, identity on absent classes' biases (of the heads ``rows``
        of the working set, whose probabilities are ``p``; ``None``: all)."""
        C, D1, k = self.C, self.D1, p.shape[0]
        x = self.x32 if dtype == torch.float32 else self.x
        present = self.present
        if rows is not None:
            x, present = x[rows], present[rows]
        s = p.to(dtype)
        a, b = self.upper
        # the weights of block (c, c') per example, [k, n, pairs] (contiguous: ``right`` then is)
        pairs = (s[:, a] * ((a == b).to(dtype)[:, None] - s[:, b]) / self.n).transpose(1, 2).contiguous()
        right = (pairs[..., None] * x[:, :, None, :]).reshape(k, self.n, -1)
        blocks = torch.bmm(x.transpose(1, 2), right)  # [k, D+1, pairs·(D+1)]
        H = blocks.reshape(k, -1).index_select(1, self.where).view(k, C * D1, C * D1)
        diag = self.reg.expand(k, C, D1).clone()
        diag[..., D1 - 1] += (~present).to(diag.dtype)
        H.diagonal(dim1=1, dim2=2).add_(diag.reshape(k, -1).to(dtype))
        bias = torch.arange(C, device=p.device) * D1 + D1 - 1
        H[:, bias[:, None], bias[None, :]] += (present[:, :, None] & present[:, None, :]).to(dtype)
        return H

    def keep(self, rows: torch.Tensor) -> None:
        """Only the heads ``rows`` iterate on; the others' iterates are final."""
        self.final[self.index] = self.theta
        for name in ("x", "x32", "onehot", "present", "mask", "theta", "index"):
            setattr(self, name, getattr(self, name)[rows])

    def step(self, tol: float, last: bool) -> None:
        """Record the gradient norms, retire the heads within ``tol``, and (unless ``last``)
        take a damped Newton step on the others."""
        g, p = self.gradient()
        norm = g.reshape(len(g), -1).norm(dim=1)
        self.norms[self.index.cpu()] = norm.cpu()
        go = norm > tol
        if not bool(go.all()):
            self.keep(go.nonzero()[:, 0])
            g, p = g[go], p[go]
        if len(self.index) and not last:
            self.theta = _armijo(self, g, self._direction(g, p))

    def _direction(self, g: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        """``H⁻¹ g`` per head: the Hessian in float32, solved by LU (faster than torch's
        batched Cholesky at these sizes); in float64 for heads whose float32 solve failed or
        is not a descent direction."""
        k = len(g)
        with _lapack_threads(g.device):
            step, info = torch.linalg.solve_ex(self.hessian(p, torch.float32), g.reshape(k, -1, 1).float())
            step = step[..., 0].double()
            bad = ((info != 0) | ~((step * g.reshape(k, -1)).sum(dim=1) > 0) | ~step.isfinite().all(dim=1))
            if bool(bad.any()):
                rows = bad.nonzero()[:, 0]
                H, rhs = self.hessian(p[rows], torch.float64, rows), g[rows].reshape(len(rows), -1, 1)
                exact, info = torch.linalg.solve_ex(H, rhs)
                if bool((info != 0).any()):  # singular (l2 = 0 on separable data): the least-squares step
                    # gelsd is the CPU's driver alone (CUDA's lstsq has only gels, full rank)
                    exact = torch.linalg.lstsq(H.cpu(), rhs.cpu(), driver="gelsd").solution.to(H.device)
                step[rows] = exact[..., 0]
        return step.reshape(g.shape)


@contextlib.contextmanager
def _lapack_threads(device: torch.device):
    """One torch thread around a batched LU solve on the CPU: MKL's threaded batched getrf
    hands ``lu_solve`` invalid pivots ("Parameter 6 was incorrect on entry to SLASWP", then
    "Pivots given to lu_solve must all be ≥ 1" or a hang) once n ≳ 100 with 2 or more threads
    (pytorch/pytorch#142815; seen with torch 2.11 and 2.13, the study's probes under 3 threads a
    worker on a GPU host). One thread is the path every CPU study has taken (its workers run
    one), so the numbers are those."""
    n = torch.get_num_threads()
    if device.type != "cpu" or n == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


def newton_heads(groups: list[HeadGroup], n_classes: int, l2: float, tol: float = 1e-10, max_iter: int = 100
                 ) -> list[FittedHeads]:
    """The converged convex heads of every group (module docstring), one ``FittedHeads``
    per group: ``W [k, C, D]``, ``b [k, C]`` (``-inf`` for a class absent from a head's
    subset), float64; ``grad_norm`` per head (the norm over ``W`` and ``b``);
    ``iterations`` the Newton steps taken. The groups step together; a head stops once
    its gradient norm is at most ``tol``."""
    solvers = [_Newton(g, n_classes, l2) for g in groups]
    it = 0
    for it in range(max_iter + 1):
        for s in solvers:
            if len(s.index):
                s.step(tol, last=it == max_iter)
        if not any(len(s.index) for s in solvers):
            break
    out = []
    for s, g in zip(solvers, groups):
        s.keep(torch.zeros(0, dtype=torch.long, device=s.theta.device))
        mask = torch.zeros(len(s.norms), n_classes, dtype=torch.float64, device=s.final.device)
        mask = mask.masked_fill(F.one_hot(g.y, n_classes).sum(dim=1) == 0, -math.inf)
        out.append(FittedHeads(s.final[..., :-1].clone(), s.final[..., -1] + mask, iterations=it, grad_norm=s.norms))
    return out


def _armijo(s: _Newton, g: torch.Tensor, step: torch.Tensor, shrink: int = 40) -> torch.Tensor:
    """``θ − t·step`` per head, ``t`` the first of 1, ½, ¼, … with a sufficient decrease."""
    theta = s.theta
    f0 = s.objective(theta)
    slope = (g * step).sum(dim=(1, 2))  # > 0: the step descends along −step
    t = torch.ones(len(theta), dtype=theta.dtype, device=theta.device)
    new = theta - step
    # a decrease below float64 rounding of the objective counts as sufficient: near the
    # optimum the predicted decrease (~|g|²) is smaller than the objective's last digit
    slack = 1e-13 * f0.abs()
    for _ in range(shrink):
        bad = ~(s.objective(new) <= f0 - 1e-4 * t * slope + slack)  # a nan objective is no decrease
        if not bool(bad.any()):
            break
        t = torch.where(bad, t / 2, t)
        new = theta - t[:, None, None] * step
    return new


# ---- AdamW -------------------------------------------------------------------------------
def _draws(group: HeadGroup, n_classes: int, how: HeadTraining) -> tuple[torch.Tensor, torch.Tensor]:
    """A group's initial ``W [k, C, D]`` and its epochs' orders ``[epochs, k, n]``, drawn from
    its own generator in the order ``heads._adamw`` draws them (the init, then one sorted
    uniform draw per epoch)."""
    gen = torch.Generator().manual_seed(int(group.seed))
    k, n, D = group.x.shape
    bound = 1.0 / math.sqrt(max(D, 1))
    W = (torch.rand(k, n_classes, D, generator=gen, dtype=group.x.dtype) * 2 - 1) * bound
    # one draw of every epoch's uniforms: the generator fills them in the order the
    # per-epoch draws would (tested: the same orders)
    return W, torch.rand(how.epochs, k, n, generator=gen).argsort(dim=2)


def _schedule(groups: list[HeadGroup], orders: list[torch.Tensor], batch: int, pad: int
              ) -> tuple[torch.Tensor, list[int]]:
    """``[steps, heads, batch]`` indices into the groups' examples flattened one after the
    other (``pad``: a zero row, past a group's last step and in an epoch's short last
    minibatch), the groups' heads side by side; and each group's number of steps."""
    steps = [order.shape[0] * math.ceil(order.shape[2] / batch) for order in orders]
    sched = torch.full((max(steps, default=0), sum(o.shape[1] for o in orders), batch), pad, dtype=torch.long)
    offset = head = 0
    for order, n_steps in zip(orders, steps):
        epochs, k, n = order.shape
        idx = torch.full((epochs, k, n_steps // max(epochs, 1) * batch), pad, dtype=torch.long)
        idx[:, :, :n] = order + offset + torch.arange(k)[None, :, None] * n
        sched[:n_steps, head:head + k] = idx.reshape(epochs, k, -1, batch).transpose(1, 2).reshape(-1, k, batch)
        offset, head = offset + k * n, head + k
    return sched, steps


def adamw_heads(groups: list[HeadGroup], n_classes: int, how: HeadTraining) -> list[FittedHeads]:
    """The fixed-budget AdamW heads of every group (module docstring), one ``FittedHeads``
    per group (``W [k, C, D]``, ``b [k, C]``, the last iterate; ``best_epoch`` = epochs)."""
    D = groups[0].x.shape[2]
    if any(g.x.shape[2] != D for g in groups):
        raise ValueError("heads fitted together need features of one width")
    # the longest schedules first, so that the heads still training are a prefix
    order = sorted(range(len(groups)), key=lambda i: -math.ceil(groups[i].x.shape[1] / how.batch_size))
    groups_sorted = [groups[i] for i in order]
    draws = [_draws(g, n_classes, how) for g in groups_sorted]
    dtype, device = groups[0].x.dtype, groups[0].x.device
    # every example with a 1 appended (the bias), then one zero row for the padding
    rows = [g.x.shape[0] * g.x.shape[1] for g in groups_sorted]
    x = torch.zeros(sum(rows) + 1, D + 1, dtype=dtype, device=device)
    x[:-1, D] = 1.0
    for g, start in zip(groups_sorted, [sum(rows[:i]) for i in range(len(rows))]):
        x[start:start + g.x.shape[0] * g.x.shape[1], :D] = g.x.reshape(-1, D)
    y = torch.cat([g.y.reshape(-1) for g in groups_sorted] + [torch.zeros(1, dtype=torch.long, device=device)])
    sched, steps = _schedule(groups_sorted, [o for _, o in draws], how.batch_size, x.shape[0] - 1)
    sched = sched.to(device)
    sizes = [g.x.shape[0] for g in groups_sorted]
    heads_at = torch.tensor([sum(k for k, s in zip(sizes, steps) if s > t) for t in range(max(steps, default=0))])
    if bool((heads_at[1:] > heads_at[:-1]).any()):
        raise AssertionError("the heads still training must be a prefix")
    theta = torch.cat([torch.cat([W.to(device), torch.zeros(*W.shape[:2], 1, dtype=dtype, device=device)], dim=2)
                       for W, _ in draws])
    _adamw_loop(theta, x, y, sched, heads_at, how)
    fitted, start = [], 0
    for k in sizes:
        fitted.append(FittedHeads(theta[start:start + k, :, :D].clone(), theta[start:start + k, :, D].clone(),
                                  best_epoch=how.epochs))
        start += k
    return [fitted[order.index(i)] for i in range(len(groups))]


def _adamw_loop(theta: torch.Tensor, x: torch.Tensor, y: torch.Tensor, sched: torch.Tensor, heads_at: torch.Tensor,
                how: HeadTraining) -> None:
    """AdamW on ``theta [K, C, D+1]`` in place: at step ``t`` the first ``heads_at[t]``
    heads take the minibatch ``x[sched[t, h]]``; ``_adamw_update`` with the closed-form
    gradient of each head's mean cross-entropy over its real rows."""
    m, v = torch.zeros_like(theta), torch.zeros_like(theta)
    decay = torch.full((theta.shape[2],), 1 - how.lr * how.weight_decay, dtype=theta.dtype, device=theta.device)
    decay[-1] = 1.0  # the bias column: no weight decay
    pad = x.shape[0] - 1
    B, D1 = sched.shape[2], x.shape[1]
    minus_one = torch.full((theta.shape[0], 1, B), -1.0, dtype=theta.dtype, device=theta.device)
    for t, K in enumerate(heads_at.tolist()):
        idx = sched[t, :K]
        xb = x.index_select(0, idx.reshape(-1)).view(K, B, D1)
        real = (idx != pad).to(theta.dtype)
        th = theta[:K]
        # logits as [K, C, B]: the softmax over a short middle axis runs vectorised along
        # the batch (over a last axis of C entries it is ~20x slower on the CPU)
        p = torch.softmax(torch.bmm(th, xb.transpose(1, 2)), dim=1)
        p.scatter_add_(1, y[idx][:, None, :], minus_one[:K])
        p.mul_((real / real.sum(dim=1, keepdim=True))[:, None, :])
        _adamw_update(th, torch.bmm(p, xb), m[:K], v[:K], t + 1, how.lr, decay)


def _adamw_update(theta: torch.Tensor, grad: torch.Tensor, m: torch.Tensor, v: torch.Tensor, step: int, lr: float,
                  decay: torch.Tensor) -> None:
    """torch's single-tensor AdamW update (betas 0.9, 0.999, eps 1e-8), in place, with the
    decoupled weight decay ``decay`` per column (1 on the bias column). Written out by hand
    for speed: torch's functional ``torch.optim.adam.adam`` in its place gives the same bits
    but fits the study's heads slower (its per-step Python overhead on small tensors;
    ``bench/bench_batched_adamw.py`` prints the ratio)."""
    beta1, beta2, eps = 0.9, 0.999, 1e-8
    theta.mul_(decay)
    m.lerp_(grad, 1 - beta1)
    v.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    denom = (v.sqrt() / (1 - beta2 ** step) ** 0.5).add_(eps)
    theta.addcdiv_(m, denom, value=-lr / (1 - beta1 ** step))
