"""Forked runs: a new run that starts from another run's checkpoint (``init_from``).

A fork continues the base run's trajectory with its own settings: the weights, the step
counter and (``init_optimizer = true``, the default) the optimiser moments and the RNG
state come from the checkpoint; the data stream is the base's when the seed is the same
(batch ``step`` is a pure function of ``(seed, step)``), so forks of one base compared at
one step saw the same batches. What the fork's config sets is the fork's own: dropout,
weight decay (written into the loaded parameter groups, which would otherwise keep the
base's), SAM (around the loaded optimiser), the adversarial objective, and the
learning rate — the schedule continues at the fork's ``lr_factor`` of the checkpoint's
step (after the warm-up: the fork's constant lr).

A fork of an AdamW base with the base's own settings and seed is the base continued:
bit-identical on CPU to a longer base run (tested).

``init_step = "restart"`` takes the checkpoint's weights (and, with ``init_optimizer``,
its optimiser state) but counts steps from 0: steps ``1..steps`` of the fork's own
schedule and data stream (its ``seed``). With ``init_optimizer = false`` that is a new run
started from the checkpoint's weights — e.g. plain SGD from a converged AdamW model
(``reproduce theory``, Theorem 3.3), which needs no moments.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..errors import UserError
from . import checkpoint as ckpt
from .config import PretrainConfig
from .objectives.sam import base_state


def init_from_checkpoint(cfg: PretrainConfig, model: torch.nn.Module, optimizer, schedule) -> int:
    """Load ``cfg.init_from`` into a freshly built model / optimiser / schedule; returns the
    first step to train (the checkpoint's step + 1; 1 with ``init_step = "restart"``)."""
    path = Path(cfg.init_from)
    if not (path / "meta.json").exists():
        raise UserError(f"init_from: {path} is not a checkpoint (no meta.json)")
    meta = ckpt.read_meta(path)
    step = int(meta["step"]) if cfg.init_step == "continue" else 0
    if step >= cfg.steps:
        raise UserError(f"init_from: the checkpoint is at step {step}, but the fork trains to steps={cfg.steps}")
    try:
        ckpt.load_weights(path, model)
    except ckpt.CorruptCheckpoint:
        raise UserError(f"init_from: the weights of {path} do not fit the fork's model (its shape must be "
                        "the checkpoint's)") from None
    bad = next((n for n, t in model.state_dict().items() if t.is_floating_point() and not torch.isfinite(t).all()),
               None)
    if bad is not None:  # named here: the fork's first step would say its own loss became nan (issue 63)
        raise UserError(f"init_from: the weights of {path} are not finite ({bad} holds NaN or inf): the base run "
                        "diverged at its last update before this checkpoint; fork from an earlier one, or train "
                        "the base with a lower optim.lr")
    if cfg.init_optimizer:
        saved_name = meta.get("config", {}).get("optim", {}).get("name", cfg.optim.name)
        if saved_name != cfg.optim.name:
            raise UserError(f"init_from: the checkpoint's optimiser state is {saved_name}'s and does not fit "
                            f"optim.name = {cfg.optim.name!r}; fork with the base's optimiser or set "
                            "init_optimizer = false")
        state = ckpt.load_state(path)
        try:
            optimizer.load_state_dict(base_state(state["optimizer"]))  # (a SAM run's: unwrapped)
        except (ValueError, KeyError) as exc:
            raise UserError(f"init_from: the checkpoint's optimiser state does not fit ({exc}); "
                            "the fork needs the base's optimiser (optim.name) or init_optimizer = false") from None
        torch.set_rng_state(state["rng"])
        if torch.cuda.is_available() and state.get("cuda_rng") is not None:
            torch.cuda.set_rng_state(state["cuda_rng"])
    # the loaded groups carry the base's hyper-parameters: the fork's own replace them
    o = cfg.optim
    lr = o.lr * cfg.lr_factor(step)
    for i, group in enumerate(optimizer.param_groups):  # [decayed matrices, the rest] (make_optimizer)
        group["weight_decay"] = o.weight_decay if i == 0 else 0.0
        group["initial_lr"] = o.lr
        group["lr"] = lr
        if "betas" in group:
            group["betas"] = tuple(o.betas)
            group["eps"] = o.eps
        if "momentum" in group:
            group["momentum"] = o.momentum
    n = len(optimizer.param_groups)
    schedule.load_state_dict({**schedule.state_dict(), "base_lrs": [o.lr] * n, "last_epoch": step,
                              "_last_lr": [lr] * n})  # (torch's own keys of a LambdaLR's state)
    return step + 1
