"""Languages whose masked-token conditionals are known exactly (and real text).

A language is one module here that declares itself (``LANGUAGE = {...}`` near its top, its
sizes in ``PRESETS``, a ``build`` function): ``sameloss.registry`` finds it from its file,
and plugins add more (``SAMELOSS_PLUGINS``). ``make_language(name, preset=..., ...)``
builds one by name from ``language.*`` settings; each class also has its own
constructors (``PCFG.from_file``, ``PCFG.random``, ``HMM.random``, ...).
"""

from __future__ import annotations

from .. import registry
from ..errors import UserError
from .base import Batch, Estimate, Language, Task, entropy_of, sample_mask
from .dyck import Dyck
from .hmm import HMM
from .lm_generated import CausalLM
from .pcfg import PCFG
from .pcfg_grammar import Grammar
from .text import Corpus


def make_language(name: str, preset: str = "tiny", seed: int | None = None, grammar: str | None = None,
                  params: str | None = None,
                  generator: str | None = None, k: int | None = None, length: int | None = None,
                  device: str = "cpu", data: str | None = None, pool: str | None = None) -> Language:
    """Build the registered language ``name`` from ``language.*`` settings (``preset``: its
    size; ``seed``: another random language of that size's shape; ``params``: constructor
    settings over the size's own, ``"key=value[,key=value...]"``; ``grammar``: a PCFG
    grammar file; ``generator``, ``k``, ``length``, ``pool``: the causal language; ``data``:
    a prepared corpus; ``device``: where a generator runs). A setting the language does not
    take is refused (one line naming the languages that take it); an unknown name too."""
    entry = registry.language(name)
    given = {"size": preset, "seed": seed, "params": params, "grammar": grammar, "generator": generator, "k": k, "length": length,
             "pool": pool, "data": data, "device": device}
    for key, value in given.items():
        if value is not None and key not in entry.settings and key not in registry.ALWAYS_GIVEN:
            takers = [n for n, e in registry.languages().items() if key in e.settings]
            raise UserError(f"language.{key} applies to the {', '.join(takers)} language"
                            f"{'s' if len(takers) > 1 else ''} only")
    return entry.builder()(**{key: given[key] for key in entry.settings})


__all__ = ["Batch", "CausalLM", "Corpus", "Dyck", "Estimate", "Grammar", "HMM", "Language", "PCFG", "Task",
           "entropy_of", "make_language", "sample_mask"]
