"""Flatness as the treatment: ``flatness.weight`` λ × an estimate of the trace of
the Hessian of the MLM loss, added to the training loss; λ > 0 flattens, λ < 0 sharpens.

Every step the estimate is taken on a slice of the step's batch — its first
``flatness.sentences`` sentences (of the update half, where the step updates on one), every
masked position of them a context, the same targets the loss trains on — with the
estimators of ``measures.curvature``, made differentiable in the weights (their
``live=True`` selection; ``composite_layer_norms``: see why there) — their arithmetic
lives in ``models`` (``derivatives``, ``label_gradients``, ``hessian_products``), which
this module and the measures both import:

``fisher`` (the paper's estimator, App. B.1, as ``trace_fisher`` measures it)
    ``T(θ) = mean_contexts Σ_y f_θ(y) ‖∇_θ log f_θ(y)‖²``, the trace of the Fisher of the
    slice's loss, equal to the trace of its Hessian near saturation.
    ``flatness.estimator = "signs"`` (the default): every label of every context, each
    label's gradient weighted by ``√f_θ(y)`` and a random sign, summed into one gradient
    ``G`` by one backward pass of the slice's logits; ``E‖G‖² = T`` and, the signs not
    depending on θ, ``E ∇‖G‖² = ∇T`` (``signed_gradient``). No per-example gradient: the
    penalty costs about what a forward, a backward kept for differentiation and its
    backward of the slice cost — less than the per-example estimator below
    (``bench/bench_flatness.py`` prints both against a plain step). Its estimate of ``T``
    per step is noisier (cross terms between contexts average out over the signs); the
    penalty's expected gradient is the same.
    ``flatness.estimator = "per-example"``: each context's label gradients through
    ``torch.func`` (``fisher_label_values``). ``flatness.labels = 0``:
    every label, weighted by its probability — ``T`` itself; its gradient is exact by
    double backward, through the weights ``f_θ(y)`` too.
    ``flatness.labels = K ≥ 1``: K labels drawn from the model per context and
    ``T̂ = mean_k ‖∇ log f(y_k)‖²``. The labels follow the weights, so ``∇T`` is not the
    mean of ``∇‖∇ log f(y_k)‖²`` with the labels held fixed: ``∇T = E_y[∇v_y + v_y ∇log f(y)]``
    (``v_y = ‖∇ log f(y)‖²``) has a score-function term. What is differentiated is the
    surrogate ``S = T̂ + mean_k (v_k − b_k)·(log f(y_k) − log f(y_k))``, with the
    factors ``v_k − b_k`` and the second ``log f(y_k)`` held constant (detached): its value
    is ``T̂`` exactly, and its gradient ``mean_k [∇v_k + (v_k − b_k) ∇log f(y_k)]`` equals
    ``∇T`` in expectation over the draws, because the baseline ``b_k`` — the mean of the
    context's *other* draws' ``v`` (0 for K = 1) — does not depend on ``y_k`` and
    ``E_y ∇log f(y) = 0``. The baseline takes most of the score term's variance. (Tested:
    averaged over every possible draw exactly, the gradient is the finite-difference
    gradient of ``T``.)
``hutchinson`` (what the authors' released script computes)
    ``q = mean_v vᵀ∇²L v`` over ``flatness.probes`` Rademacher probes ``v`` on the loss of
    the slice's true tokens: ``E_v q = tr ∇²L`` at any θ. The probes do not depend on the
    weights, so the gradient of ``q`` (a third derivative of ``L``, by differentiating the
    ``LossHessian`` products) is exact for the estimator, and unbiased for ``∇ tr ∇²L``.

``flatness.params``: the trace over the parameters matching a regex (as ``sameloss measure
--params``; e.g. ``blocks`` for the encoder's layers), differentiated in every parameter.

The penalty runs as the measures do: dropout off (the trace of the deterministic model the
study measures), float32 outside autocast (bf16 runs: the estimate needs the precision),
the model's math attention kernel; it adds to the step's loss, so it works with AdamW or
SGD, gradient clipping and the adversarial objective (SAM is refused in the config: it is a
flatness objective of its own).

Randomness. The draws (the labels' uniforms, the probes) are a pure function of
``(seed, step)`` on a stream of their own (``step_generator``, stream 5), as the data
stream is: a resumed run draws exactly what the uninterrupted one drew, and the global RNG
(dropout) is not touched. Under DDP every process builds the same draws for the whole
slice and keeps its own rows' (the signs, the labels) or uses the same probes (the signs'
``G`` are summed over the processes before the square: ``_fisher_signs``), and its part is
normalised by the slice's global number of targets times the world size — as the loss is
(``objectives.mlm.mlm_loss``) — so the averaged gradient equals the single-process one.

Cost: per step one forward and one backward pass of the slice, differentiated once more
(Fisher, signs); one forward and K backward passes per context, differentiated once more
(Fisher, per-example); a Hessian-vector product per probe, differentiated once more
(Hutchinson): ``bench/bench_flatness.py`` prints them against a plain step.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from ...errors import UserError
from ...models.derivatives import Blocks, composite_layer_norms, measuring, resolve_engine, select_parameters
from ...models.hessian_products import LossHessian, probe_vectors
from ...models.label_gradients import fisher_label_values, ghost_linears
from ..config import FlatnessConfig
from ..data import MaskedBatch, shard_bounds, step_generator
from .base import Objective, register

STREAM_FLATNESS = 5  # the penalty's draws (training 0, evaluation 1, adversarial 3 and 4)


def fisher_terms(model: nn.Module, tokens: torch.Tensor, positions: torch.Tensor, labels: torch.Tensor,
                 linears: dict[str, nn.Linear] | None = None, params: str | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(squares [n, k], log_probs [n, k])``: ``‖∇_θ log f_θ(x)_y‖²`` over the parameters
    matching ``params`` (``None``: all) and ``log f_θ(x)_y`` for each context
    ``(tokens[i], positions[i])`` and label ``labels[i, j]`` (``fisher_label_values``,
    differentiable in every parameter; call it inside ``FlatnessPenalty.context``).
    ``linears``: the ghost-norm layers (``models.label_gradients.ghost_linears``; ``None``: found here)."""
    sel = select_parameters(model, params, live=True)
    if linears is None:
        linears = ghost_linears(model, sel, tokens[:1])
    squares, log_probs = fisher_label_values(model, sel, tokens, positions, labels, linears, Blocks.whole(sel.sizes))
    return squares[..., 0], log_probs


def fisher_surrogate(squares: torch.Tensor, log_probs: torch.Tensor, exact: bool) -> torch.Tensor:
    """Per context, the quantity whose gradient the penalty takes, from
    ``fisher_label_values``' ``squares [n, k]`` (``‖∇ log f(y)‖²``) and ``log_probs [n, k]``:
    ``exact`` (every label): ``Σ_y f(y) v_y``, the trace itself; else (``k`` labels drawn
    from the model) the surrogate ``T̂ + mean_k (v_k − b_k)·(log f(y_k) − log f(y_k))``
    whose value is ``T̂`` and whose gradient is ``∇T`` in expectation (module docstring)."""
    if exact:
        return (log_probs.exp() * squares).sum(dim=1)
    k = squares.shape[1]
    v = squares.detach()
    baseline = (v.sum(dim=1, keepdim=True) - v) / (k - 1) if k > 1 else torch.zeros_like(v)
    score = ((v - baseline) * (log_probs - log_probs.detach())).mean(dim=1)
    return squares.mean(dim=1) + score


def sample_labels(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """``[n, k]`` labels drawn from each row of ``probs [n, V]`` by inverting its CDF at
    ``uniforms [n, k]`` (on the device: no read-back, as ``torch.multinomial``'s
    data-dependent draws would need for DDP-identical draws)."""
    cdf = probs.double().cumsum(dim=-1)
    # the first label whose CDF exceeds u (a label of probability 0 never is)
    labels = (cdf[:, None, :] <= uniforms[:, :, None].double() * cdf[:, None, -1:]).sum(dim=-1)
    return labels.clamp(max=probs.shape[-1] - 1)


def signed_gradient(model: nn.Module, batch: MaskedBatch, signs: torch.Tensor, params: str | None = None
                    ) -> list[torch.Tensor]:
    """``G = Σ_{i,y} s_iy √f_i(y) ∇_θ log f_i(y)`` over the batch's masked
    contexts ``i`` and every label ``y`` (``signs [contexts, V]``: ±1, on the host, in
    ``masked.nonzero()`` order): ``E_s ‖G‖² = Σ_i Σ_y f_i(y) ‖∇ log f_i(y)‖²``, the slice's
    Fisher trace (summed over contexts), because the signs are independent with mean 0
    and variance 1. As ``∇ log f_i(y) = J_iᵀ(e_y − f_i)`` (``J_i``: the Jacobian of context
    ``i``'s logits ``z_i``), ``G = Σ_i J_iᵀ u_i`` with ``u_i = c_i − f_i Σ_y c_iy``,
    ``c_iy = s_iy √f_i(y)``: one vector-Jacobian product of the slice's logits — one
    backward pass for every context and label, no per-example gradient. ``u`` is kept in
    the graph (``create_graph``), so the penalty's gradient differentiates through the
    label weights ``√f`` as well as through ``J``: the signs do not depend on θ, so
    ``E_s ∇‖G‖² = ∇ E_s ‖G‖²`` exactly — the gradient of the trace, unbiased, with every
    label and no score-function term. Its cost: a forward, a backward with its graph kept
    and that graph's backward (``bench/bench_flatness.py``). ``signed_fisher`` is ``‖G‖²``;
    under DDP the processes' ``G`` are summed before the square (``FlatnessPenalty``), so
    the estimate is one process's exactly."""
    logits = batch.at_masked(model(batch.inputs))  # [contexts, V]
    log_f = torch.log_softmax(logits, dim=-1)
    f = log_f.exp()
    # √f as exp(log f / 2): its derivative stays finite where a probability underflows to 0
    c = signs.to(logits.dtype) * (0.5 * log_f).exp()
    u = c - f * c.sum(dim=-1, keepdim=True)
    sel = select_parameters(model, params)
    grads = torch.autograd.grad(logits, sel.tensors, grad_outputs=u, create_graph=True, allow_unused=True)
    return [g if g is not None else torch.zeros_like(p) for g, p in zip(grads, sel.tensors)]


def signed_fisher(model: nn.Module, batch: MaskedBatch, signs: torch.Tensor, params: str | None = None
                  ) -> torch.Tensor:
    """``‖G‖²`` of ``signed_gradient``: unbiased for the batch's Fisher trace summed over its
    masked contexts, and so is its gradient for the trace's."""
    return sum(g.square().sum() for g in signed_gradient(model, batch, signs, params))


@register
class FlatnessPenalty(Objective):
    """The penalty as an objective: ``penalty(model, batch, step)`` → ``(λ × this process's
    part of the trace estimate, the estimate)``, the first added to the training loss (its
    gradient is the penalty's), the second logged (detached) as ``flatness_trace``. Per
    member: λ (``flatness.weight``); shared: the estimator and its settings. A ``vmap``
    stack computes it member by member (``Objective.losses``: the estimators' machinery is
    per model), each member's stacked weights swapped into its module."""

    name, order, per_member, autocast = "flatness", 30, ("weight",), False
    logs, window = "flatness_trace", "flatness"

    def __init__(self, cfg: FlatnessConfig, vocab_size: int, seed: int, rank: int = 0, world_size: int = 1):
        self.settings = self.cfg = cfg
        self.vocab_size, self.seed, self.rank, self.world_size = vocab_size, seed, rank, world_size
        self._linears: dict[int, dict[str, nn.Linear]] = {}

    @classmethod
    def build(cls, cfg, language, rank: int = 0, world_size: int = 1) -> FlatnessPenalty:
        return cls(cfg.flatness, language.vocab_size, cfg.seed, rank, world_size)

    def loss(self, run, batch: MaskedBatch, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.penalty(run.model, batch, step)

    @staticmethod
    @contextlib.contextmanager
    def context(model: nn.Module, device: torch.device, composite: bool = True):
        """As the measures run (``measuring``), and in float32 under a bf16 run's autocast;
        ``composite``: differentiable to third order through ``torch.func``
        (``composite_layer_norms``; plain autograd, as the signs estimator uses, needs no
        such help: its double backward through the fused kernel is checked against finite
        differences in the tests)."""
        off = (torch.autocast(device.type, enabled=False) if torch.amp.is_autocast_available(device.type)
               else contextlib.nullcontext())
        with off, measuring(model), composite_layer_norms(model) if composite else contextlib.nullcontext():
            yield

    def check(self, model: nn.Module) -> None:
        """One line (``UserError``) now, before anything is written, if the penalty cannot run
        on ``model``: ``flatness.params`` matching none of its parameters, or a model
        ``torch.func`` cannot transform."""
        select_parameters(model, self.cfg.params)
        if resolve_engine(model, "auto") != "func":
            raise UserError("the flatness penalty needs a model torch.func can transform (the transformer or "
                            "the LSTM MLM)")

    def penalty(self, model: nn.Module, batch: MaskedBatch, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``batch``: the step's whole (global, host) update batch; this process takes its rows
        of the slice."""
        piece = batch.rows(0, min(self.cfg.sentences, batch.inputs.shape[0]))
        n_global = piece.n_targets  # counted on the host
        lo, hi = shard_bounds(piece.inputs.shape[0], self.rank, self.world_size)
        device = next(model.parameters()).device
        # this process's part: its rows' contexts / the slice's targets, times the world size
        # (DDP averages the gradients over processes)
        scale = self.world_size / n_global
        gen = step_generator(self.seed, step, stream=STREAM_FLATNESS)
        use_signs = self.cfg.measure == "fisher" and self.cfg.estimator == "signs"
        with self.context(model, device, composite=not use_signs):
            if use_signs:
                # one sign per (sentence, position, label) of the whole slice: the same draws
                # whatever the number of processes
                signs = torch.randint(0, 2, (*piece.inputs.shape, self.vocab_size), generator=gen) * 2.0 - 1.0
                surrogate, estimate = self._fisher_signs(model, piece.rows(lo, hi), signs[lo:hi], device)
            elif self.cfg.measure == "fisher":
                # one uniform per (sentence, position, draw) of the whole slice: the same draws
                # whatever the number of processes
                uniforms = torch.rand(*piece.inputs.shape, max(self.cfg.labels, 1), generator=gen,
                                      dtype=torch.float64)
                mine = piece.rows(lo, hi)
                if mine.n_targets == 0:
                    zero = torch.zeros((), device=device)
                    return zero, zero
                surrogate, estimate = self._fisher(model, mine, uniforms[lo:hi][mine.masked], device)
            else:
                mine = piece.rows(lo, hi)
                # the same probes in every process: vᵀ(Σ_r w_r H_r)v = Σ_r w_r vᵀH_r v
                sel = select_parameters(model, self.cfg.params)
                probes = probe_vectors(self.cfg.probes, sel.n_params, "rademacher", gen, sel.dtype)
                if mine.n_targets == 0:
                    zero = torch.zeros((), device=device)
                    return zero, zero
                surrogate = estimate = self._hutchinson(model, mine, probes, device)
        return self.cfg.weight * scale * surrogate, scale * estimate.detach()

    def _fisher(self, model: nn.Module, mine: MaskedBatch, uniforms: torch.Tensor, device: torch.device
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(Σ surrogate, Σ T̂)`` over this process's contexts (``uniforms [contexts, K]``
        on the host, in ``masked.nonzero()`` order)."""
        rows, positions = mine.masked.nonzero(as_tuple=True)  # host: the batch is made there
        on = mine.to(device)
        tokens = on.inputs.index_select(0, rows.to(device))
        positions = positions.to(device)
        if self.cfg.labels == 0:
            labels = torch.arange(self.vocab_size, device=device).expand(tokens.shape[0], -1)
        else:
            with torch.no_grad():
                probs = torch.softmax(on.at_masked(model(on.inputs)).float(), dim=-1)
            labels = sample_labels(probs, uniforms.to(device))
        if id(model) not in self._linears:  # found once per model
            self._linears[id(model)] = ghost_linears(model, select_parameters(model, self.cfg.params), tokens[:1])
        squares, log_probs = fisher_terms(model, tokens, positions, labels, self._linears[id(model)], self.cfg.params)
        surrogate = fisher_surrogate(squares, log_probs, exact=self.cfg.labels == 0)
        estimate = surrogate if self.cfg.labels == 0 else squares.mean(dim=1)
        return surrogate.sum(), estimate.sum()

    def _fisher_signs(self, model: nn.Module, mine: MaskedBatch, signs: torch.Tensor, device: torch.device
                      ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(surrogate, estimate)`` of this process's rows (``signs [rows, T, V]`` on the
        host). One process: ``‖G‖²`` (``signed_gradient``) for both. Under DDP the trace is
        ``‖Σ_r G_r‖²`` — the square of the sum over processes, one process's estimate exactly
        — so every process sums its ``G_r`` with the others' (``all_reduce``, detached:
        ``Ḡ``) and differentiates ``2⟨G_r, Ḡ⟩``, whose gradients summed over the processes
        are ``∇‖Ḡ‖²``; its value (and logged estimate) is ``⟨G_r, Ḡ⟩``, which sums to
        ``‖Ḡ‖²``. A process whose rows hold no target still takes part, with ``G_r = 0``."""
        sel = select_parameters(model, self.cfg.params)
        if mine.n_targets:
            grads = signed_gradient(model, mine.to(device), signs[mine.masked].to(device), self.cfg.params)
        else:
            grads = [torch.zeros_like(p) for p in sel.tensors]
        if self.world_size == 1:
            value = sum(g.square().sum() for g in grads)
            return value, value.detach()
        flat = torch.cat([g.reshape(-1) for g in grads])
        total = flat.detach().clone()
        self.reduce(total)
        inner = (flat * total).sum()
        return 2 * inner - inner.detach(), inner.detach()

    @staticmethod
    def reduce(total: torch.Tensor) -> None:
        """Sum ``total`` over the processes in place (``torch.distributed``: DDP's group)."""
        import torch.distributed as torch_dist

        torch_dist.all_reduce(total)

    def _hutchinson(self, model: nn.Module, mine: MaskedBatch, probes: torch.Tensor, device: torch.device
                    ) -> torch.Tensor:
        """``Σ_targets`` of this process's rows × ``mean_v vᵀ∇²L_mine v``: the mean loss's
        Hessian, times its number of targets (the caller divides by the slice's)."""
        hessian = LossHessian(model, mine, params=self.cfg.params, live=True, engine="func")
        probes = probes.to(device)
        return mine.n_targets * (probes * hessian.matmat(probes)).sum(dim=1).mean()
