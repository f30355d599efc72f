"""MLM pre-training: config, data stream, loop, exact evaluation, checkpoints, DDP."""

from .config import EvalConfig, LanguageConfig, ModelConfig, OptimConfig, PretrainConfig
from .loop import pretrain
from .runio import LoadedCheckpoint, load_checkpoint

__all__ = ["EvalConfig", "LanguageConfig", "ModelConfig", "OptimConfig", "PretrainConfig",
           "LoadedCheckpoint", "load_checkpoint", "pretrain"]
