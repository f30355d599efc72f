"""MLM pre-training: config, data stream, loop, exact evaluation, checkpoints, DDP.

The names below are loaded on first use (PEP 562), so that importing a light sub-module
(``training.tracking``: the ``--tracker`` flag, while the command line is parsed) does not
import torch — ``OMP_NUM_THREADS`` is checked before torch is loaded (``threads``)."""

from __future__ import annotations

import importlib

_EXPORTS = {"EvalConfig": "config", "LanguageConfig": "config", "ModelConfig": "config", "OptimConfig": "config",
            "PretrainConfig": "config", "pretrain": "loop", "LoadedCheckpoint": "runio",
            "load_checkpoint": "runio"}


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value
    return value


__all__ = ["EvalConfig", "LanguageConfig", "ModelConfig", "OptimConfig", "PretrainConfig",
           "LoadedCheckpoint", "load_checkpoint", "pretrain"]
