"""What a row's key means on a figure: its scale (accuracies in %), the range its axis may
span, its unit, its error column and the words for its error bars (``measures/rows.py``
decides what each column is; this module how it is shown)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from ....measures import rows as schema

@dataclass(frozen=True)
class Quantity:
    """How a row's key is shown: ``scale`` (100 for accuracies in %), the range ``[lo, hi]``
    it can take (as shown), its unit."""

    scale: float = 1.0
    lo: float = -math.inf
    hi: float = math.inf
    unit: str = ""


# quantities that cannot be negative (besides accuracies and nats): traces of positive
# semi-definite matrices (the Fisher, its embedded view), absolute gaps, counts, MSEs, rates
NONNEGATIVE = frozenset({"trace", "trace_fisher", "trace_embedded", "trace_abs_gap", "trace_per_kl", "target_variance",
                         "lr", "parameters", "step", "tokens_per_s", "epochs"})
# (a block's trace of the Fisher, ``trace_fisher_<block>`` of ``measure --trace-by block``, is
# that of a diagonal block of a PSD matrix)
NONNEGATIVE_PREFIXES = ("down_mse", "trace_fisher_")


def quantity(key: str | None) -> Quantity:
    if key is None:
        return Quantity()
    if schema.is_accuracy(key) or key.startswith("down_acc"):
        return Quantity(100.0, 0.0, 100.0, "%")
    if key in schema.NATS_KEYS or key.startswith("heldout_loss"):
        return Quantity(1.0, 0.0, math.inf, "nats")
    if key in NONNEGATIVE or key.startswith(NONNEGATIVE_PREFIXES):
        return Quantity(1.0, 0.0, math.inf)
    return Quantity()


def _value(row: dict, key: str | None) -> float:
    if key is None:
        return math.nan
    try:
        v = float(row.get(key))
    except (TypeError, ValueError):
        return math.nan
    return v * quantity(key).scale


def _error(row: dict, key: str) -> float | None:
    """The row's error of ``key`` (as shown), or None."""
    try:
        e = float(row.get(schema.error_column(key)))
    except (TypeError, ValueError):
        return None
    return e * quantity(key).scale if math.isfinite(e) and e > 0 else None


def with_unit(label: str, key: str | None) -> str:
    """``label`` with the unit of ``key`` appended unless it already says it."""
    unit = quantity(key).unit
    if not unit or unit in label:
        return label
    return f"{label} ({unit})"


def _stem(label: str) -> str:
    """An axis label without its trailing parenthesis (unit, notes)."""
    return re.sub(r"\s*\([^()]*\)\s*$", "", label) or label


# ---- what the error bars are -----------------------------------------------------------------
def error_labels(spec=None) -> dict[str, str]:
    """What the error column of each measured quantity is, in words, with the counts of
    ``spec`` (a ``measures.run.MeasureSpec``; without one, without counts): the legend and
    the caption of every figure say it. Keys are quantity keys or their prefixes."""
    from ....training.config import EvalConfig

    subsets = EvalConfig().n_subsets  # measures use the run's eval.n_subsets, 5 unless changed
    out = {"loss": f"± std over {subsets} held-out subsets", "kl": f"± std over {subsets} held-out subsets",
           "trace": "± SE of the trace estimator", "probe": "± std over probe seeds",
           "finetune": "± std over fine-tuning seeds", "lookup": "± std over probe seeds"}
    if spec is not None:
        n = len(spec.seeds)
        fisher = (f"± SE of the Fisher estimator ({spec.n_contexts * spec.repeats} contexts × {spec.n_labels} "
                  "sampled labels)")
        out.update({"trace_fisher": fisher, "trace_embedded": fisher,
                    "trace_hutchinson": f"± SE over {spec.n_probes} Hutchinson probes",
                    "trace_hutchpp": f"± SE of Hutch++ ({spec.n_probes} Hessian products)",
                    "probe": f"± std over {n} probe seeds", "finetune": f"± std over {n} fine-tuning seeds",
                    "lookup": f"± std over {n} probe seeds"})
    return out


def describe_error(key: str, errors: dict[str, str] | None = None) -> str:
    """The words for the error bar of ``key``: ``errors[key]``, else the longest key of
    ``errors`` that ``key`` starts with, else what ``measures/rows.py`` says it is."""
    errors = errors or {}
    if key in errors:
        return errors[key]
    prefixes = [k for k in errors if key.startswith(k)]
    if prefixes:
        return errors[max(prefixes, key=len)]
    if key == "trace" or key.startswith("trace_"):
        return "± SE of the trace estimator"
    if schema.is_accuracy(key):
        return "± std over seeds"
    if key in schema.NATS_KEYS:
        return "± std over held-out subsets"
    return f"± the row's {schema.error_column(key)}"


def _float(v) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
