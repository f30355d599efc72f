"""The row schema of ``sameloss measure``: one flat dict of numbers per checkpoint.

``measures.run`` writes the rows; the CLI's table (``format_rows``), the experiments'
claims, tables and plots read them — all through the functions here, so what a column
means is decided once.

A quantity ``key`` may have an error column beside it, ``error_column(key)``:

* ``<key>_se`` — the standard error of the estimate itself: the trace estimators
  (``trace_fisher``, ``trace_hutchinson``, ``trace_embedded``, ``adaptive_trace``, or a
  plotted ``trace``);
* ``<key>_std`` — the standard deviation of the values the quantity averages: over the
  seeds for ``probe_*`` / ``finetune_*`` / ``lookup_*`` (accuracies in [0, 1]), over the
  held-out subsets for ``loss`` / ``kl`` (``spread_of(key)`` says which).

Any other column ending in ``_se`` or ``_std`` (``trace_fisher_repeat_std``) is an
auxiliary spread (``is_error_column``): a table shows it only where asked by name.
"""

from __future__ import annotations

ERROR_SUFFIXES = ("_se", "_std")
# accuracies (fractions in [0, 1], shown ×100 as %), their std over seeds
ACCURACY_PREFIXES = ("probe", "finetune", "lookup")
# quantities in nats (their std over the held-out subsets, where measured)
NATS_KEYS = frozenset({"loss", "kl", "entropy", "embedded_loss", "train_loss"})


def _is_trace(key: str) -> bool:
    return key == "trace" or key.startswith(("trace_", "adaptive_trace"))


def error_column(key: str) -> str:
    """The column holding the error of quantity ``key``."""
    return f"{key}_se" if _is_trace(key) else f"{key}_std"


def is_error_column(column: str) -> bool:
    return column.endswith(ERROR_SUFFIXES)


def is_accuracy(key: str) -> bool:
    return key.startswith(ACCURACY_PREFIXES)


def spread_of(key: str) -> str | None:
    """What the ``_std`` of ``key`` is taken over — ``"seeds"`` or ``"subsets"`` — or
    None when its error column is already a standard error."""
    if _is_trace(key):
        return None
    return "seeds" if is_accuracy(key) else "subsets"


def format_rows(rows: list[dict]) -> str:
    """A plain table: one line per checkpoint, value ± error columns merged."""
    if not rows:
        return "(no rows)"
    skip = {"checkpoint", "run"}
    keys = [k for k in rows[0] if k not in skip and not is_error_column(k)]

    def cell(row, key):
        value = row.get(key)
        if value is None:
            return "-"
        if isinstance(value, float):
            err = row.get(error_column(key))
            return f"{value:.4g}" + (f" ± {err:.2g}" if isinstance(err, float) else "")
        return str(value)

    table = [keys] + [[cell(r, k) for k in keys] for r in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(keys))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(line, widths)) for line in table)
