"""Training objectives, one class each (``Objective``): what a step trains on.

The update pass of a step (``training.step``) computes, for every member of a stack, a sum
of *terms* in the objectives' ``order``: the masked-language-model loss (``mlm.MLM``, every
run's), then the term of each objective the run's config turns on — the adversarial
objective (``adversarial.Adversarial``), the flatness penalty (``flatness.FlatnessPenalty``).
An objective may also act around the update instead (``sam.SAM``: the ascent before it, the
return to the weights before the optimiser). Each class (``base.Objective``) holds:

* **its loss** — ``loss(run, batch, step)``: one member's term on its own module, the
  computation of a run trained alone (the ``Members`` back-end calls it: bit for bit);
* **its batched form** — ``losses(objectives, stack, batches, step)``: the term of every
  member of a ``vmap`` stack (``training.step``) at once; by default member by member,
  each member's stacked weights swapped into its module (``Vmapped.call``);
* **its per-member settings** — ``per_member``: the keys of its settings that may differ
  between the members of one ensemble (the others they share: ``ensemble.ensemble_key``);
* **its cost** — ``cost(cfg, vocab)``: what it adds to a step, in full-length sentence
  forwards (its settings' ``step_forwards``, which ``sameloss plan`` sums);
* **what it logs** — ``logs``: the ``metrics.jsonl`` key of its logged value's mean over a
  log window (``window``: that sum's key in a checkpoint's saved window).

Its settings are the config section ``cfg.<name>`` (``PretrainConfig``'s field) or, for an
objective without a field there (a plugin's), ``cfg.objectives[name]``, parsed into the
dataclass it registered (``config.register_objective``). The registry is this folder:
every module here registers its class when imported (``register``), a plugin's module the
same way. Adding an objective is one module and its settings: docs/how-to/extend.md.
"""

from .base import OBJECTIVES, Objective, build, ordered, register

__all__ = ["OBJECTIVES", "Objective", "build", "ordered", "register"]
