"""Languages whose masked-token conditionals are known exactly (and real text).

A language is one module here that declares itself (``LANGUAGE = {...}`` near its top, its
sizes in ``PRESETS``, a ``build`` function): ``sameloss.registry`` finds it from its file,
and plugins add more (``SAMELOSS_PLUGINS``). ``make_language(name, preset=..., ...)``
builds one by name from ``language.*`` settings; each class also has its own
constructors (``PCFG.from_file``, ``PCFG.random``, ``HMM.random``, ...).
"""

from __future__ import annotations

import dataclasses

from .. import registry
from ..errors import UserError
from .base import Batch, Estimate, Language, Task, entropy_of, sample_mask
from .dyck import Dyck
from .hmm import HMM
from .lm_generated import CausalLM, CausalSettings
from .pcfg import PCFG
from .pcfg_grammar import Grammar
from .text import Corpus


def make_language(name: str, preset: str = "tiny", seed: int | None = None, grammar: str | None = None,
                  params: str | None = None, data: str | None = None, causal: CausalSettings = CausalSettings(),
                  device: str = "cpu") -> Language:
    """Build the registered language ``name`` from its ``language.*`` settings.

    A setting the language does not take is refused (a ``UserError`` naming the languages
    that take it); an unknown name too.

    Args:
        name: a registered language: ``hmm``, ``pcfg``, ``dyck``, ``causal``, ``corpus`` or a
            plugin's (``sameloss.registry.languages()``).
        preset: its named size (``micro``, ``headroom``, ``tiny``, ``paper``; the isoloss study
            uses ``headroom``).
        seed: another random language of that size's shape (``None``: the size's own).
        grammar: a PCFG grammar file (pcfg; overrides ``preset``).
        params: constructor settings over the size's own, ``"key=value[,key=value...]"``
            (hmm, pcfg; e.g. ``"n_states=6,emission_concentration=0.5"``).
        data: a prepared corpus folder (corpus; ``sameloss corpus prepare``).
        causal: the causal language's settings (``lm_generated.CausalSettings``): a local
            Hugging Face causal LM folder (``generator``), its allowed tokens (``k``), its
            sentence length (``length``) and a token pool (``pool``; ``sameloss
            causal-lm sample``); each is refused by the other languages.
        device: where a causal generator runs.

    Returns:
        the language (``languages.base.Language``).

    Example:
        >>> hmm = make_language("hmm", preset="micro")
        >>> hmm.n_words, sorted(hmm.tasks)[0]
        (8, 'task-3')
    """
    entry = registry.language(name)
    given = {"size": preset, "seed": seed, "params": params, "grammar": grammar, **dataclasses.asdict(causal),
             "data": data, "device": device}
    for key, value in given.items():
        if value is not None and key not in entry.settings and key not in registry.ALWAYS_GIVEN:
            takers = [n for n, e in registry.languages().items() if key in e.settings]
            raise UserError(f"language.{key} applies to the {', '.join(takers)} language"
                            f"{'s' if len(takers) > 1 else ''} only")
    return entry.builder()(**{key: given[key] for key in entry.settings})


__all__ = ["Batch", "CausalLM", "CausalSettings", "Corpus", "Dyck", "Estimate", "Grammar", "HMM", "Language", "PCFG",
           "Task", "entropy_of", "make_language", "sample_mask"]
