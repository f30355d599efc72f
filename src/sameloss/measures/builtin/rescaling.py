"""``weight_norms`` and ``adaptive_trace``: is "flatter" flatter, or only rescaled?

A trace of the Hessian can be lowered by rescaling alone: where scaling some weights up and
others down leaves the function unchanged (queries and keys, values and the output
projection, a LayerNorm's gain and the layer it feeds), the trace moves while the model
does not. Beside the trace, a flatness treatment reports

* ``weight_norms``: ``weight_norm_sq`` = ``‖θ‖²`` over the measured parameters (``params``),
  ``weight_norm_sq_layernorm`` the LayerNorms' gains and biases among them, and with
  ``trace_by="block"`` each block's share (``weight_norm_sq_<block>``: embedding,
  layer<i>, head; they sum to the total). Settings: ``extra={"weight_norms": {}}``.
* ``adaptive_trace``: ``tr(T F T)``, ``T = diag(|θ|)`` (``curvature.adaptive``), a sharpness
  no such rescaling changes, with the Fisher trace's contexts, labels and repeats
  (``n_contexts``, ``n_labels``, ``repeats``, ``seed``, ``params``: the same draws as
  ``trace_fisher``); ``adaptive_trace_se``, ``adaptive_trace_repeat_std``, and per block
  with ``trace_by="block"``. Settings: ``extra={"adaptive_trace": {}}``.

No group of the post-LN transformer's weights is exactly scale-invariant (every LayerNorm
also reads the residual stream, and the decoder is the token embedding), so the norms are
split by block and by LayerNorm, not into "scale-invariant" and the rest.
"""

from __future__ import annotations

from torch import nn

from ... import resources
from ...errors import UserError
from ..spec import EVALUATION, MEASURES, TRACE, Job, Measure, MeasureSpec, MemoryContext


def _no_settings(measure: Measure, spec: MeasureSpec) -> None:
    """The measure's ``extra`` entry must be an empty dict: its settings are the spec's own."""
    given = spec.extra.get(measure.name)
    if given is None:
        return
    if not isinstance(given, dict):
        raise UserError(f"{measure.name}: its settings must be a dict, got {type(given).__name__}")
    if given:
        raise UserError(f"{measure.name} takes no settings of its own (got {', '.join(map(str, given))}); "
                        "it reads the spec's params, seed and trace_by" +
                        (", n_contexts, n_labels and repeats" if measure.name == "adaptive_trace" else ""))


def weight_norms(model: nn.Module, params: str | None = None, by_block: bool = False) -> dict[str, float]:
    """``{"weight_norm_sq", "weight_norm_sq_layernorm"[, "weight_norm_sq_<block>"...]}``: the
    squared L2 norm of the parameters matching ``params`` (tied ones once), of the
    LayerNorms' among them, and (``by_block``) of each block's (``curvature.block_name``)."""
    from ..curvature import parameter_blocks, select_parameters

    sel = select_parameters(model, params)
    squares = [float(t.detach().double().square().sum()) for t in sel.tensors]
    norms = {f"{name}.{k}" for name, m in model.named_modules() if isinstance(m, nn.LayerNorm)
             for k in ("weight", "bias")}
    row = {"weight_norm_sq": sum(squares),
           "weight_norm_sq_layernorm": sum(s for n, s in zip(sel.names, squares) if n in norms)}
    if by_block:
        blocks = parameter_blocks(sel)
        for b, block in enumerate(blocks.names):
            row[f"weight_norm_sq_{block}"] = sum(s for s, of in zip(squares, blocks.of) if of == b)
    return row


class WeightNorms(Measure):
    name, order, stage, flag = "weight_norms", 24, EVALUATION, "--weight-norms"

    def settings(self, spec):
        return {"params": spec.params, "trace_by": spec.trace_by}

    def validate(self, spec):
        _no_settings(self, spec)

    def compute(self, job: Job) -> dict:
        return weight_norms(job.model, job.spec.params, by_block=job.spec.trace_by == "block")

    def columns(self, spec):
        return ["weight_norm_sq", "weight_norm_sq_layernorm"]  # and per block with trace_by="block"

    def flops(self, spec, shape):
        return 2.0 * shape.n_params  # a multiply and an add per weight


class AdaptiveTrace(Measure):
    name, order, stage, flag = "adaptive_trace", 25, TRACE, "--adaptive-trace"

    def settings(self, spec):
        return {k: getattr(spec, k) for k in ("n_contexts", "n_labels", "repeats", "trace_by", "params", "seed")}

    def validate(self, spec):
        _no_settings(self, spec)

    def check(self, job: Job) -> None:
        n = job.spec.n_contexts
        resources.check(resources.sentences_bytes(n, job.language), f"--contexts {n}", "lower --contexts")

    def compute(self, job: Job) -> dict:
        from ..curvature import FisherContexts
        from ..curvature.adaptive import adaptive_trace

        spec = job.spec
        contexts = FisherContexts(params=spec.params, n_contexts=spec.n_contexts, seed=spec.seed)
        r = adaptive_trace(job.model, job.language, contexts, n_labels=spec.n_labels, repeats=spec.repeats,
                           by_block=spec.trace_by == "block")
        row = {"adaptive_trace": r.estimate, "adaptive_trace_se": r.stderr}
        if "repeat_std" in r.extra:
            row["adaptive_trace_repeat_std"] = r.extra["repeat_std"]
        for block, value in r.extra.get("blocks", {}).items():  # adaptive_trace_layer0, ..._se
            row[f"adaptive_trace_{block}"] = value["estimate"]
            row[f"adaptive_trace_{block}_se"] = value["stderr"]
        return row

    def columns(self, spec):
        repeats = ["adaptive_trace_repeat_std"] if spec.repeats > 1 else []
        return ["adaptive_trace", "adaptive_trace_se", *repeats]  # and per block with trace_by="block"

    def flops(self, spec, shape):
        # as the Fisher trace: per context a forward and a backward (twice a forward: the
        # inputs' gradients and the per-example weight gradients, formed) per distinct label
        # drawn — at most n_labels, at most the vocabulary
        contexts = spec.n_contexts * spec.repeats
        return contexts * shape.sentence_flops * (1 + 2 * min(spec.n_labels, shape.vocab))

    def peaks(self, spec, memory: MemoryContext):
        from ..curvature.memory import peak_bytes

        return {"adaptive trace": peak_bytes("adaptive_trace", memory.model_config,
                                             {"n_labels": spec.n_labels}).bytes}


MEASURES.add("weight_norms", WeightNorms())
MEASURES.add("adaptive_trace", AdaptiveTrace())
