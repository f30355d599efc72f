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
from .lm_generated import CausalLM
from .pcfg import PCFG
from .pcfg_grammar import Grammar
from .text import Corpus

LANGUAGES = {"pcfg": PCFG, "hmm": HMM, "dyck": Dyck, "causal": CausalLM, "corpus": Corpus}
CAUSAL_DEFAULTS = {"k": 2000, "length": 24}  # the paper's OPT data (App. A.1)


def make_language(name: str, preset: str = "tiny", seed: int | None = None, grammar: str | None = None,
                  generator: str | None = None, k: int | None = None, length: int | None = None,
                  device: str = "cpu", data: str | None = None, pool: str | None = None) -> Language:
    """Build a language by name. ``seed`` draws another random language of the preset's
    shape (default: the preset's own); ``grammar`` (PCFG only) reads a grammar file
    instead of generating a preset. ``causal`` takes ``generator`` (a local Hugging Face
    causal-LM folder), ``k`` and ``length`` (default 2000 and 24) and runs the generator
    on ``device`` (``auto``: CUDA if available); ``pool`` (a folder of ``sameloss
    causal-lm sample``) supplies its training sentences. ``corpus`` reads the folder ``data`` written
    by ``sameloss corpus prepare``."""
    if name not in LANGUAGES:
        raise UserError(f"unknown language {name!r}; choose from {', '.join(LANGUAGES)}")
    if name == "corpus":
        if data is None:
            raise UserError("the corpus language needs language.data=DIR (a folder from 'sameloss corpus prepare')")
        return Corpus(data)
    if data is not None:
        raise UserError("language.data applies to the corpus language only")
    if name == "causal":
        if generator is None:
            raise UserError("the causal language needs language.generator=DIR (a local Hugging Face causal LM folder)")
        return CausalLM.from_pretrained(generator, k=CAUSAL_DEFAULTS["k"] if k is None else k,
                                        length=CAUSAL_DEFAULTS["length"] if length is None else length,
                                        device=device, pool=pool)
    for key, value in (("generator", generator), ("k", k), ("length", length), ("pool", pool)):
        if value is not None:
            raise UserError(f"language.{key} applies to the causal language only")
    if grammar is not None:
        if name != "pcfg":
            raise UserError("--grammar applies to the pcfg language only")
        return PCFG.from_file(grammar)
    if name == "dyck":
        return Dyck.preset(preset)  # nothing random about it
    if name == "hmm":
        return HMM.preset(preset, seed=seed)
    return PCFG.preset(preset, seed=seed)


__all__ = ["Batch", "CausalLM", "Corpus", "Dyck", "Estimate", "Grammar", "HMM", "LANGUAGES", "Language", "PCFG", "Task",
           "entropy_of", "make_language", "sample_mask"]
