"""Frozen representations ``[n, T, d]`` of sentences — what a few-shot head reads
(``fewshot.py``): one feature vector per position.

* ``model_representation(model, tokens)``: a model's final hidden states (``model.features``,
  zero at pad positions; float32);
* ``reference_representation(kind, language, cfg, tokens)``: the representations a study
  compares its models with (the headroom of a task):

  ``random-init``  the config's model freshly initialised from ``cfg.seed`` (the run's own
                   initial weights; the global RNG is left as it was);
  ``lookup``       the look-up table: the true single-mask conditionals at every position
                   (``lookup.lookup_features``, ``[n, T, n_words]``);
  ``oracle``       the language's true posteriors of the latent structure given the whole
                   sentence (``language.posteriors``: the HMM's hidden states at every
                   position); for a language without them (the PCFG), the ``task``'s own
                   posterior (``Task.posterior``: P(symbol spans the span | sentence)) at the
                   first position of its span, zeros elsewhere — so a view of the span reads
                   it where it reads a model's span.
"""

from __future__ import annotations

import torch

from ..errors import UserError
from ..training.runio import init_model
from .lookup import lookup_features
from .probe import extract_features, model_pad_id

REFERENCES = ("random-init", "lookup", "oracle")


def model_representation(model: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """``model.features`` of every position, float32 ``[n, T, d]`` on the CPU."""
    h = extract_features(model, tokens, model_pad_id(model))
    return h.reshape(h.shape[0], tokens.shape[1], -1).to(torch.float32)


def reference_representation(kind: str, language, cfg, tokens: torch.Tensor, device="cpu", task=None
                             ) -> torch.Tensor:
    """The ``kind`` reference representation (module docstring) of ``tokens``, ``[n, T, d]``
    (``task``: a ``Task`` with a span and a posterior, the oracle of a language without
    ``posteriors``)."""
    if kind == "random-init":
        with torch.random.fork_rng(devices=[]):  # the run's own initial weights, no global side effect
            torch.manual_seed(cfg.seed)
            model = init_model(cfg, language, device)
        return model_representation(model, tokens)
    if kind == "lookup":
        return lookup_features(language, tokens).reshape(tokens.shape[0], language.max_len, language.n_words)
    if kind == "oracle":
        if hasattr(language, "posteriors"):
            return language.posteriors(tokens).float()
        if task is None or task.span is None or task.posterior is None:
            raise UserError(f"the {language.name} language has no true posteriors of a latent structure "
                            "(no oracle representation)" + ("" if task is None else
                                                             f"; its task {task.name!r} has no span and posterior"))
        post = task.posterior(tokens).float()
        out = torch.zeros(tokens.shape[0], tokens.shape[1], post.shape[1])
        out[:, task.span[0]] = post
        return out
    raise UserError(f"unknown reference representation {kind!r}; choose from {', '.join(REFERENCES)}")
