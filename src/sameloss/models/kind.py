"""A model kind (``model.kind``): everything sameloss needs to know of one architecture,
in one object that its own module defines as ``KIND`` and declares near its top as
``MODEL_KIND = "<name>"`` (read from the file by ``sameloss.registry``, without importing
torch: config validation and ``--help`` stay fast).

``ModelKind`` holds the config and model classes, the named sizes, the settings of a
``model`` config section its config takes, and the two numbers the planner and the
memory checks need from the shape alone: the forward FLOPs per token and the activations
a training step keeps per token. ``build_model``, ``training.runio.init_model``,
``experiments.plan``, ``training.runio.training_bytes`` and ``measures.curvature.memory`` ask
the kind; none of them names one. A new architecture is one module in ``models/`` with
its config, its model (``forward`` to logits, ``features`` to hidden states), its sizes
and its ``KIND``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import UserError


@dataclass(frozen=True)
class ModelKind:
    """``flops_per_token(shape)``: a forward pass's FLOPs per token of a full-length
    sentence (``shape``: ``d_model``, ``n_layers``, ``d_inter``, ``d_hidden``, ``vocab``,
    ``max_len``, ``mlm_head_transform``: ``experiments.plan.ModelShape``);
    ``activations_per_token(config, max_len)``: float32 entries a training step's
    backward pass keeps per token (a lower bound: the inputs of its linear maps and norms,
    attention weights); ``dropout_fields``: the config fields a ``model.dropout`` sets;
    ``settings``: ``model`` section fields passed on as they are (the transformer's
    ``norm``)."""

    name: str
    config_class: type
    model_class: type
    sizes: Mapping[str, Mapping[str, int]]
    aliases: Mapping[str, str]
    flops_per_token: Callable[[Any], float]
    activations_per_token: Callable[[Any, int], int]
    dropout_fields: tuple[str, ...] = ("dropout",)
    settings: tuple[str, ...] = ()

    def size_names(self) -> list[str]:
        """Every valid size name, aliases included."""
        return [*self.sizes, *self.aliases]

    def config(self, size: str | Mapping[str, Any], vocab_size: int, max_len: int, **overrides: Any):
        """The config of a named size (or a table of shape fields) at a vocabulary and
        length; ``overrides`` set any other field. ``pad_id`` defaults to
        ``vocab_size - 3`` (``sameloss.languages.base``). ``UserError`` for an unknown
        name or field."""
        from ..languages.base import N_SPECIAL

        if isinstance(size, str):
            name = self.aliases.get(size, size)
            if name not in self.sizes:
                raise UserError(f"unknown {self.name} size {size!r}; valid sizes: {', '.join(self.size_names())}")
            shape = dict(self.sizes[name])
        elif isinstance(size, Mapping):
            shape = dict(size)
        else:
            raise UserError(f"a {self.name} size must be a name or a table of fields, got {size!r}")
        fields = {"pad_id": vocab_size - N_SPECIAL, **shape, **overrides}
        fields.update(vocab_size=vocab_size, max_len=max_len)
        known = {f.name for f in dataclasses.fields(self.config_class)}
        unknown = sorted(set(fields) - known)
        if unknown:
            raise UserError(f"unknown {self.name} setting(s) {', '.join(unknown)}; valid: {', '.join(sorted(known))}")
        missing = sorted(f.name for f in dataclasses.fields(self.config_class)
                         if f.default is dataclasses.MISSING and f.name not in fields)
        if missing:
            raise UserError(f"{self.name} size is missing {', '.join(missing)}")
        return self.config_class(**fields)

    def build(self, size, vocab_size: int, max_len: int, **overrides: Any):
        """A freshly initialised model of a named size (the global RNG draws its weights)."""
        return self.model_class(self.config(size, vocab_size, max_len, **overrides))

    def overrides(self, section, dropout: float | None = None) -> dict:
        """The config fields a ``model`` config section sets: dropout (``dropout`` instead of
        the section's, e.g. 0 for a shape on the meta device), the kind's settings and the
        shape overrides."""
        rate = section.dropout if dropout is None else dropout
        out = {field: rate for field in self.dropout_fields}
        out.update({name: getattr(section, name) for name in self.settings})
        return {**out, **section.shape_overrides()}


def model_kind(name: str) -> ModelKind:
    """The kind registered as ``name`` (``sameloss.registry.MODELS``)."""
    from .. import registry

    return registry.MODELS.get(name).load()


def kind_of_config(config) -> ModelKind | None:
    """The kind whose config class ``config`` is (else whose class it derives from; None:
    not a sameloss model's config)."""
    from .. import registry

    kinds = [entry.load() for entry in registry.MODELS.values()]
    exact = [k for k in kinds if type(config) is k.config_class]
    derived = [k for k in kinds if isinstance(config, k.config_class)]
    return (exact or derived or [None])[0]
