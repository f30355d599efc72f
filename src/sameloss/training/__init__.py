"""MLM pre-training: config, data stream, loop, exact evaluation, checkpoints, DDP."""

from .config import EvalConfig, LanguageConfig, ModelConfig, OptimConfig, PretrainConfig
from .loop import load_model_from_checkpoint, pretrain

__all__ = ["EvalConfig", "LanguageConfig", "ModelConfig", "OptimConfig", "PretrainConfig",
           "load_model_from_checkpoint", "pretrain"]
