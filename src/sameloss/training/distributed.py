"""``torch.distributed`` set-up for data-parallel pre-training.

Launched by ``torchrun`` (which sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR``/``MASTER_PORT``), a run joins a process group — gloo on CPU, NCCL on
CUDA — and wraps its model in DDP. Without those variables everything is a no-op and
the run is single-process.
"""

from __future__ import annotations

import contextlib
import os

import torch
import torch.distributed as torch_dist
from torch.nn.parallel import DistributedDataParallel


def setup() -> tuple[int, int]:
    """``(rank, world_size)``, joining the process group if launched by torchrun."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size == 1:
        return 0, 1
    if not torch_dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        torch_dist.init_process_group(backend)
    return torch_dist.get_rank(), torch_dist.get_world_size()


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def process_device(device: torch.device, world_size: int) -> torch.device:
    """This process's device: under torchrun (``world_size`` > 1) on CUDA, GPU
    ``LOCAL_RANK`` of the node — one per process; else ``device`` as resolved (one process
    per GPU through ``CUDA_VISIBLE_DEVICES`` is ``experiments.launch``'s job)."""
    if world_size > 1 and device.type == "cuda":
        return torch.device("cuda", local_rank())
    return device


def wrap(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=ids)


def no_sync(model: torch.nn.Module):
    """DDP's ``no_sync`` (gradients stay local), or a no-op for a plain module."""
    if isinstance(model, DistributedDataParallel):
        return model.no_sync()
    return contextlib.nullcontext()


def barrier() -> None:
    if torch_dist.is_available() and torch_dist.is_initialized():
        torch_dist.barrier()


def teardown() -> None:
    if torch_dist.is_available() and torch_dist.is_initialized():
        torch_dist.destroy_process_group()
