"""Products with the Hessian of a fixed batch's loss, known only through them
(``LossHessian``, a ``LinearOperator``: flat vectors over the selected weights, batch
first), and the random probes estimators apply it to (``probe_vectors``).

The curvature measures (``measures.curvature``: Hutchinson, Lanczos, the Lemma 3.2 gap)
estimate traces and eigenvalues from these products; the training-time flatness penalty
(``training.objectives.flatness``, its Hutchinson estimator) differentiates ``vᵀ∇²L v`` once more
(``live=True``). It sits in ``models`` so that both layers import it.

Vectors are flat, of length ``dim``. ``matmat`` takes a batch of them *as rows*
(``[k, dim]``, batch first as ``torch.func.vmap``) and returns ``A v`` for each row;
``A @ x`` is the usual product (``x`` a vector, or a ``[dim, k]`` matrix of columns).
A batch is a ``training.data.MaskedBatch`` (``inputs``, ``targets``, ``masked``,
``at_masked``, ``rows``, ``n_targets``, ``to``), used through those alone.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import grad, vjp, vmap

from .derivatives import grads_or_zeros, measuring, resolve_engine, select_parameters

def batch_loss(logits: torch.Tensor, batch) -> torch.Tensor:
    """Mean cross-entropy of the true tokens at the masked positions (in the logits'
    precision; half precision is raised to float32)."""
    z = batch.at_masked(logits)
    if z.dtype in (torch.float16, torch.bfloat16):
        z = z.float()
    return F.cross_entropy(z, batch.at_masked(batch.targets))


def probe_vectors(n: int, dim: int, distribution: str, generator: torch.Generator | None,
                  dtype: torch.dtype, device: torch.device | str | None = None) -> torch.Tensor:
    """``[n, dim]`` i.i.d. probes with ``E vvᵀ = I``: ±1 entries, or standard normal ones
    (drawn in float64 whatever ``dtype``), on ``device``. They are drawn on the
    generator's device (the CPU for ``None`` and for the seeded ``step_generator``s the
    measures use, so a seed gives the same probes on every device) and moved."""
    where = generator.device if generator is not None else torch.device("cpu")
    if distribution == "rademacher":
        # drawn straight in ``dtype`` (the same stream as int64 draws, without an int64
        # temporary 2–4× the size of the probes)
        v = torch.randint(0, 2, (n, dim), generator=generator, device=where, dtype=dtype).mul_(2).sub_(1)
    else:
        v = torch.randn(n, dim, generator=generator, dtype=torch.float64, device=where).to(dtype)
    return v if device is None else v.to(device)


class LinearOperator(ABC):
    """A square linear map on flat vectors of length ``dim``, with the ``dtype`` and
    ``device`` its vectors must have. Subclasses implement ``_matmat``."""

    dim: int
    dtype: torch.dtype
    device: torch.device

    @property
    def shape(self) -> tuple[int, int]:
        return (self.dim, self.dim)

    @abstractmethod
    def _matmat(self, vectors: torch.Tensor) -> torch.Tensor:
        """``[k, dim] -> [k, dim]``: the operator applied to each row."""

    def matmat(self, vectors: torch.Tensor) -> torch.Tensor:
        """The operator applied to each row of ``vectors [k, dim]``."""
        if vectors.dim() != 2 or vectors.shape[1] != self.dim:
            raise ValueError(f"matmat takes [k, {self.dim}] rows, got shape {tuple(vectors.shape)}")
        return self._matmat(vectors)

    def matvec(self, vector: torch.Tensor) -> torch.Tensor:
        """The operator applied to one vector ``[dim]``."""
        return self.matmat(vector[None])[0]

    def __matmul__(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 1:
            return self.matvec(x)
        return self.matmat(x.T).T


class LossHessian(LinearOperator):
    """The Hessian ``∇²L`` of a fixed batch's loss (mean cross-entropy of the true tokens
    at its masked positions) with respect to the parameters matching ``params``
    (``re.search`` in ``model.named_parameters()`` names; ``None``: all), at the current
    parameters, as an operator on flat vectors over them (``selection.flat`` /
    ``unflat`` convert).

    Built once: the forward and the gradient run in the constructor (dropout off,
    attention on the math kernel, the model's mode restored after), and ``loss`` and
    ``gradient`` are kept. The gradient's graph is kept too and every product is a second
    backward through it (reverse-over-reverse): with ``engine="func"`` the pullback of
    ``vjp(grad(L))`` vmapped over the rows, with ``"autograd"`` (models with an RNN,
    which ``auto`` picks) ``autograd.grad(g, θ, v)`` per row. (Forward-over-reverse,
    ``jvp(grad(L))``, measured no faster on CPU, and needs forward AD that the fused
    attention kernels lack.) The graph holds the activations of the whole batch until
    the operator is dropped.

    ``micro_batch``: hold the graph of at most this many sentences. The loss is the mean
    over the batch's targets, ``L = Σ_b (M_b/M) L_b`` over micro-batches ``b`` with
    ``M_b`` targets, so ``Hv = Σ_b (M_b/M) H_b v``: each product rebuilds each
    micro-batch's graph (one more forward and backward per micro-batch and product
    chunk) and frees it, so the activations held shrink by ``n / micro_batch``
    (``memory.peak_bytes`` states them). The same operator, up to float rounding.

    ``live``: products differentiable in the parameters (``SelectedParameters``; engine
    ``func`` only), e.g. ``vᵀ∇²L v`` as a training penalty (``training.objectives.flatness``).
    """

    def __init__(self, model: nn.Module, batch, *, params: str | None = None, engine: str = "auto",
                 micro_batch: int | None = None, live: bool = False):
        self.engine = resolve_engine(model, engine)
        sel = self.selection = select_parameters(model, params, live)
        self.dim, self.dtype, self.device = sel.n_params, sel.dtype, sel.device
        self._model = model
        n = batch.inputs.shape[0]
        if micro_batch is not None and micro_batch < 1:
            raise ValueError(f"micro_batch must be >= 1, got {micro_batch}")
        if micro_batch is None or micro_batch >= n:
            self._pieces = None
            self._built = self._build(batch.to(sel.device))
            self.loss, self.gradient = self._built[2], self._built[1]
            return
        # each micro-batch's weight M_b / M, counted where the batch was made (the host)
        total = batch.n_targets
        self._pieces = [(piece.to(sel.device), piece.n_targets / total)
                        for piece in (batch.rows(i, i + micro_batch) for i in range(0, n, micro_batch))
                        if piece.n_targets > 0]
        loss = gradient = None
        for piece, weight in self._pieces:
            _, g, l_b = self._build(piece, keep_graph=False)
            loss = weight * l_b if loss is None else loss + weight * l_b
            gradient = weight * g if gradient is None else gradient + weight * g
        self.loss, self.gradient = loss, gradient

    def _build(self, batch, keep_graph: bool = True):
        """``(product state, gradient, loss)`` of one batch: the pullback of
        ``vjp(grad(L))`` (func) or the gradients with their graph (autograd)."""
        model, sel = self._model, self.selection
        with measuring(model):
            if self.engine == "func":
                def loss_fn(values):
                    loss = batch_loss(sel.call(model, values, batch.inputs), batch)
                    return loss, loss

                def grad_fn(values):
                    g, loss = grad(loss_fn, has_aux=True)(values)
                    return g, loss

                if not keep_graph:
                    g, loss = grad_fn(sel.values)
                    return None, sel.flat(g).detach(), loss.detach()
                gradient, pullback, loss = vjp(grad_fn, sel.values, has_aux=True)
                return pullback, sel.flat(gradient).detach(), loss.detach()
            loss = batch_loss(model(batch.inputs), batch)
            grads = torch.autograd.grad(loss, sel.tensors, create_graph=keep_graph, allow_unused=True)
            grads = grads_or_zeros(grads, sel.tensors)
            return (grads if keep_graph else None), sel.flat([g.detach() for g in grads]), loss.detach()

    def _apply(self, state, vectors: torch.Tensor) -> torch.Tensor:
        sel = self.selection
        if self.engine == "func":
            return vmap(lambda v: sel.flat(state(sel.unflat(v))[0]))(vectors)
        rows = []
        for v in vectors:
            hv = torch.autograd.grad(state, sel.tensors, list(sel.unflat(v).values()), retain_graph=True,
                                     allow_unused=True)
            rows.append(sel.flat(grads_or_zeros(hv, sel.tensors)))
        return torch.stack(rows).detach()

    def _matmat(self, vectors: torch.Tensor) -> torch.Tensor:
        if self._pieces is None:
            return self._apply(self._built[0], vectors)
        out = None
        for piece, weight in self._pieces:  # one micro-batch's graph alive at a time
            state = self._build(piece)[0]
            hv = weight * self._apply(state, vectors)
            del state
            out = hv if out is None else out + hv
        return out

