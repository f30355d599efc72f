"""The optimiser of a run: torch's AdamW or SGD with weight decay on matrices only, and the
learning-rate schedule of the config (SAM is an objective of the step, ``objectives.sam``).

``foreach``: torch's multi-tensor step, everywhere (a GPU's default already): on the CPU it
gives the bits of the single-tensor step (``tests/training/test_algorithms.py``) with fewer
dispatches, which an ensemble pays once per member (``bench/bench_trainer.py``)."""

from __future__ import annotations

import torch

from .config import PretrainConfig


def make_optimizer(cfg: PretrainConfig, model: torch.nn.Module) -> torch.optim.Optimizer:
    """Weight decay on matrices only: biases, LayerNorm parameters and nothing else
    1-dimensional are not decayed (as BERT and the paper's training code do)."""
    o = cfg.optim
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [{"params": decay, "weight_decay": o.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    if o.name == "adamw":
        return torch.optim.AdamW(groups, lr=o.lr, betas=tuple(o.betas), eps=o.eps, foreach=True)
    # torch's SGD couples the decay as an L2 term (weight_decay·θ is added to the gradient),
    # unlike AdamW's decoupled decay: the two coincide only without momentum; with it the
    # decay term is accumulated in the momentum buffer too (the steps recipe's SGD uses 0.9)
    return torch.optim.SGD(groups, lr=o.lr, momentum=o.momentum, foreach=True)


def build_optimizer(cfg: PretrainConfig, model: torch.nn.Module):
    """``(optimizer, schedule)``: the optimiser and its ``LambdaLR`` schedule."""
    optimizer = make_optimizer(cfg, model)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, cfg.lr_factor)
