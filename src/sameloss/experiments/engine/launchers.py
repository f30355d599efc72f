"""The launcher a study's options ask for (``make_launcher``): in process, local workers
(``launch.py``) or Slurm (``slurm.py``). Apart from both, so that neither imports the other's
user."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from ...errors import UserError
from .launch import SUBMITIT_DIR, InProcess, LaunchOptions, Local, default_workers, worker_devices
from .slurm import Slurm, gpus_per_task


def make_launcher(options: LaunchOptions, root: Path, job_name: str, device: str = "auto"):
    """The launcher ``options`` ask for; its submitit files under ``root/submitit``;
    ``device``: the study's (``cpu``, ``cuda``, ``auto``), which the Slurm GPUs follow."""
    import torch

    threads = torch.get_num_threads()  # this process's, by the threads policy: its workers' too
    folder = Path(root).absolute() / SUBMITIT_DIR
    if options.launcher == "inprocess":
        return InProcess()
    if options.launcher == "local":
        count = torch.cuda.device_count()
        workers = options.workers or default_workers(threads, count, os.cpu_count())
        return Local(folder, workers, threads, worker_devices(workers, device_count=count))
    if options.slurm_cluster == "slurm" and not options.dry_run:
        from submitit import SlurmExecutor

        if SlurmExecutor.affinity() < 0:  # before anything is written
            raise UserError("--launcher slurm: no Slurm on this machine (srun not found); run reproduce on a "
                            "cluster's login node, or use --launcher local")
    options = dataclasses.replace(options, slurm_gpus_per_task=gpus_per_task(options, device))
    launcher = Slurm(folder, options, threads, job_name)
    if options.slurm_cluster == "slurm" and not options.dry_run:
        launcher.check()  # a partition, account or resource sbatch refuses: one line, before any file
    return launcher


__all__ = ["make_launcher"]
