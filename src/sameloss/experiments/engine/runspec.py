"""A run of a recipe (``RunSpec``): a name and its settings, turned into a ``PretrainConfig``
here and only here (a key ``PretrainConfig`` lacks is refused when the spec is made)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ... import config as configlib
from ...training.config import PretrainConfig

Setting = tuple[str, Any]  # a dotted config key and its value, e.g. ("optim.lr", 0.05)


@dataclass(frozen=True)
class RunSpec:
    """One pre-training run of a recipe.

    name: folder name (unique in the experiment); settings: ``(dotted config key, value)``
    pairs, the scale's first and the variant's after (a key that ``PretrainConfig`` lacks
    is refused here); measure_steps: the checkpoints to measure (empty: the last one);
    label: a short human name; group: what it is compared with (e.g. ``"adamw"``).
    """

    name: str
    settings: tuple[Setting, ...]
    label: str = ""
    group: str = ""
    measure_steps: tuple[int, ...] = ()

    def __post_init__(self):
        for key, _ in self.settings:
            if key not in _CONFIG_KEYS:
                raise ValueError(f"run {self.name}: {key!r} is not a config key")

    @property
    def overrides(self) -> tuple[str, ...]:
        """The settings as ``key=value`` config overrides (as ``sameloss pretrain`` takes them)."""
        return tuple(f"{key}={_override_value(value)}" for key, value in self.settings)

    def config(self) -> PretrainConfig:
        return configlib.load(PretrainConfig, None, [*self.overrides, f"name={self.name}"])


def _config_keys(cls, prefix: str = "") -> set[str]:
    keys = set()
    for f in dataclasses.fields(cls):
        keys.add(prefix + f.name)
        if dataclasses.is_dataclass(f.default_factory):  # a section, e.g. optim
            keys |= _config_keys(f.default_factory, prefix + f.name + ".")
    return keys


_CONFIG_KEYS = _config_keys(PretrainConfig)


def _override_value(value) -> str:
    if isinstance(value, (tuple, list)):
        return "[" + ",".join(str(v) for v in value) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


# a measure spec's identity in a cache (its device aside); here, below core and the engine,
# so both use it without importing each other
def _fingerprint(obj) -> str:
    text = json.dumps(obj, sort_keys=True, default=str)
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def spec_fingerprint(spec) -> str:
    d = dataclasses.asdict(spec)
    d.pop("device", None)
    return _fingerprint(d)


@dataclass
class RunInfo:
    """A run a study trained or reused: its spec, config, folder, what was done to it
    (``trained | resumed | extended | reused``, ``planned`` in a plan), its wall seconds and
    its summary."""
    spec: RunSpec
    config: PretrainConfig
    path: Path
    status: str  # trained | resumed | extended | reused
    seconds: float
    summary: dict = field(default_factory=dict)
