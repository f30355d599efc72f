"""Languages whose masked-token conditionals are known exactly.

``make_language(name, preset=..., seed=..., grammar=...)`` builds one by name; each
class also has its own constructors (``PCFG.from_file``, ``PCFG.random``,
``HMM.random``, ...).
"""

from __future__ import annotations

from ..errors import UserError
from .base import Batch, Estimate, Language, Task, entropy_of, sample_mask
from .dyck import Dyck
from .hmm import HMM
from .pcfg import PCFG
from .pcfg_grammar import Grammar

LANGUAGES = {"pcfg": PCFG, "hmm": HMM, "dyck": Dyck}


def make_language(name: str, preset: str = "tiny", seed: int | None = None, grammar: str | None = None) -> Language:
    """Build a language by name. ``seed`` draws another random language of the preset's
    shape (default: the preset's own); ``grammar`` (PCFG only) reads a grammar file
    instead of generating a preset."""
    if name not in LANGUAGES:
        raise UserError(f"unknown language {name!r}; choose from {', '.join(LANGUAGES)}")
    if grammar is not None:
        if name != "pcfg":
            raise UserError("--grammar applies to the pcfg language only")
        return PCFG.from_file(grammar)
    if name == "dyck":
        return Dyck.preset(preset)  # nothing random about it
    if name == "hmm":
        return HMM.preset(preset, seed=seed)
    return PCFG.preset(preset, seed=seed)


__all__ = ["Batch", "Dyck", "Estimate", "Grammar", "HMM", "LANGUAGES", "Language", "PCFG", "Task",
           "entropy_of", "make_language", "sample_mask"]
