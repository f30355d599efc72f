"""How flat is a trained MLM? Curvature of its pre-training loss (paper §3–4, App. B.1).

The paper's flatness measure is the trace of the Hessian of the MLM loss. Six views are
offered, each a function ``(model, language, ...) -> CurvatureResult`` (the fixed batch
of ``trace_hutchinson`` and ``top_eigenvalue`` is a ``FixedBatch``, the contexts of
``trace_fisher`` and ``adaptive_trace`` a ``FisherContexts``):

``trace_fisher``
    The paper's estimator (App. B.1). Near saturation the model's conditional equals the
    true one and the Hessian equals the Fisher (Bartlett identity, Lemma 3.2), so
    ``tr ∇²L ≈ E_{t, x₋ₜ} E_{y ∼ f_θ(x₋ₜ)} ‖∇_θ log f_θ(x₋ₜ)_y‖²`` — contexts from the
    language, labels *sampled from the model*. Every term is a squared norm, so the
    estimate is positive and its relative variance small. Away from saturation it
    measures the trace of the Fisher (Gauss–Newton) matrix, not of the Hessian.
``adaptive_trace``
    ``tr(T F T)`` with ``T = diag(|θ|)``: the Fisher trace of the weight-scaled gradients
    ``|θ| ⊙ ∇_θ log f_θ(x₋ₜ)_y``, on ``trace_fisher``'s contexts and labels — the
    second-order average-case adaptive sharpness (Kwon et al. 2021; Andriushchenko et al.
    2023), which a function-preserving rescaling of the weights leaves unchanged while the
    trace moves (``adaptive.py``).
``trace_hutchinson``
    ``E_v vᵀ∇²L v`` with Rademacher (or Gaussian) probes on the loss of a fixed batch with
    its *true* tokens — what the authors' released script computes. Exact in
    expectation for that batch's Hessian at any θ, but each probe is a Hessian-vector
    product (a double backward) and the probe variance is ``2 Σ_{i≠j} H_ij²``.
    ``estimator="hutchpp"``: Hutch++ (Meyer et al. 2021) with the same products — the top
    of the spectrum sketched and taken exactly, Hutchinson on the rest.
``top_eigenvalue``
    The largest Hessian eigenvalue of the same fixed-batch loss, by thick-restart Lanczos
    in bounded memory (a basis of ``basis_size + 1`` vectors).
``sam_sharpness``
    SAM's one-step sharpness ``L(θ + ρ g/‖g‖) − L(θ)`` on the same batch.
``trace_hessian_gap``
    Lemma 3.2's ``tr H − tr F``: Hutchinson's trace of ``Difference(LossHessian,
    LossGaussNewton)`` (and of ``LossHessian`` on the same probes), batch after batch, with
    the true tokens and with tokens drawn from the model (where it is 0 in expectation).

Conventions shared by all of them:

* dropout is off while measuring (``model.eval()``); the previous mode is restored;
* ``params`` is a regex searched (``re.search``) in the names of
  ``model.named_parameters()``; ``None`` takes them all. Tied weights are one parameter
  (the transformer's token embedding is also its decoder) and count once. The others
  are held fixed. ``CurvatureResult.n_params`` says how many entries were measured;
* the loss of the Hessian measures is the mean cross-entropy of the true tokens over the
  masked positions of a batch drawn by ``loss_batch`` (15% masking by default; ``None``:
  one position per sentence), fixed for the call — pass one to reuse it
  (``FixedBatch(batch=...)``; ``sam_sharpness(batch=...)``);
* attention runs on PyTorch's "math" SDPA kernel: the fused CPU/CUDA kernels have no
  vmap batching rule, no forward-mode AD and no double backward.

Engines. With ``engine="func"`` (the default for the transformer) per-sample gradients
and Hessian-vector products are vectorised with ``torch.func`` (``functional_call`` +
``vmap`` of ``vjp``); the Fisher estimator also merges repeated label draws and takes the
squared gradient norms of linear layers from their activations ("ghost norms", see
``models.label_gradients.fisher_label_values``). ``nn.LSTM`` with packed sequences supports none of vmap,
forward-AD or batched double backward; the LSTM MLM therefore runs *unrolled* while
measured (``LSTMMLM.unrolled``: the same parameters in plain tensor operations, a loop
over time steps batched over sentences), and ``auto`` gives it the ``func`` engine too.
Other models containing an RNN get ``engine="autograd"``: plain double backward per
probe and a loop over contexts — correct, but much slower.

Operators. The Hessian of the fixed-batch loss is a public linear operator,
``LossHessian(model, batch, params=..., engine=...)`` (``matvec``/``matmat``, ``dim``,
``dtype``, ``device``; ``operators.py``), and the estimators are free functions over any
``LinearOperator`` (``estimators.py``): ``hutchinson_trace(A, num_matvecs)`` and
``hutchpp_trace`` → ``TraceEstimate`` (estimate, standard error, and with ``blocks=`` each
diagonal block's trace from the same products), and ``lanczos_top_eigenvalue(A)``.
``trace_hutchinson`` and ``top_eigenvalue`` are these applied to a ``LossHessian``;
``MatrixOperator`` wraps a dense matrix (to test an estimator, or to compare).

Blocks. ``by_block=True`` (``measure --trace-by block``) splits a trace over the
diagonal blocks of embedding, each layer and head (``base.parameter_blocks``): for the
Fisher, a squared gradient norm is a sum over parameters; for Hutchinson and Hutch++, the
probes' products are summed per block. The blocks sum to the total.

Memory. ``memory.peak_bytes(measure, model_config, settings)`` states what each
measure holds at its peak (parameter-sized vectors kept, activations of its batch),
from parameter counts on the meta device.

Device. Every estimator keeps its per-sample values on the model's device and reads
them back once at the end; Lanczos reads its recurrence coefficients once per product,
the Fisher estimator the model's probabilities once per block of contexts (its labels
are drawn on the host from the seeded generator, the same on every device).

Which is cheaper? On the tiny transformer (``bench/bench_trace.py``) the Fisher
estimator reaches a 2% relative standard error 4–5× faster than Hutchinson with the
paper's 50 labels per context, and about 10× faster with 2: its variance is mostly the
spread between contexts, so labels beyond a few per context buy little.

Layout: ``base`` (results, parameter blocks, batches), ``operators``, ``estimators``,
``fisher`` (the paper's estimator), ``adaptive`` (the same on weight-scaled gradients),
``hessian`` (the fixed-batch measures: Hutchinson, top eigenvalue, SAM sharpness). The arithmetic the training-time flatness penalty shares with
them lives below, in ``models``: ``derivatives`` (parameter selection, measuring mode,
engines), ``label_gradients`` (``fisher_label_values``) and ``hessian_products``
(``LossHessian``, the probes).
"""

from .base import (
    Blocks,
    CurvatureResult,
    SelectedParameters,
    block_name,
    loss_batch,
    map_in_chunks,
    parameter_blocks,
    sample_contexts,
    select_parameters,
)
from .adaptive import adaptive_trace
from .estimators import LanczosResult, TraceEstimate, hutchinson_trace, hutchpp_trace, lanczos_top_eigenvalue
from .fisher import FisherContexts, trace_fisher
from .hessian import FixedBatch, sam_sharpness, top_eigenvalue, trace_hessian_gap, trace_hutchinson
from .operators import Difference, LinearOperator, LossGaussNewton, LossHessian, MatrixOperator

__all__ = [
    "Blocks",
    "CurvatureResult",
    "TraceEstimate",
    "adaptive_trace",
    "block_name",
    "hutchpp_trace",
    "parameter_blocks",
    "Difference",
    "FisherContexts",
    "FixedBatch",
    "LanczosResult",
    "LinearOperator",
    "LossGaussNewton",
    "LossHessian",
    "MatrixOperator",
    "SelectedParameters",
    "hutchinson_trace",
    "lanczos_top_eigenvalue",
    "loss_batch",
    "map_in_chunks",
    "sample_contexts",
    "sam_sharpness",
    "select_parameters",
    "top_eigenvalue",
    "trace_fisher",
    "trace_hessian_gap",
    "trace_hutchinson",
]
