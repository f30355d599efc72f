"""The Slurm launcher (``reproduce --launcher slurm``, ``launch.py``'s module docstring): one
job array through submitit's ``AutoExecutor``; the GPUs a task asks for by the study's device
(``gpus_per_task``); what sbatch would refuse, refused before any file (``Slurm.check``:
``sbatch --test-only``); the tasks watched through ``sacct``, or ``squeue`` on a cluster that
keeps no accounting (``queue_watcher``). ``docs/how-to/cluster.md`` shows a session on a real
one-node Slurm (``scripts/slurm_local.sh``)."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Callable

from ...errors import UserError
from .launch import LaunchOptions, Outcome, WorkerJob, _describe, _outcome


class Slurm:
    """One job array through submitit's ``AutoExecutor`` (``cluster="debug"``: submitit's
    ``DebugExecutor``, which runs the array here, one task after another)."""

    name = "slurm"

    def __init__(self, folder: Path, options: LaunchOptions, threads: int, job_name: str):
        self.folder, self.options, self.threads, self.job_name = Path(folder), options, threads, job_name

    @property
    def workers(self) -> int | None:
        return self.options.workers

    @property
    def cpus_per_task(self) -> int:
        """``--cpus-per-task``, else one CPU per thread a worker runs (``--threads``)."""
        return self.options.cpus_per_task or self.threads

    def parameters(self, n_units: int) -> dict:
        """The submission parameters of an array of ``n_units`` tasks (``AutoExecutor``
        names: generic ones and ``slurm_``-prefixed ones)."""
        from ...threads import ENV

        o = self.options
        params = {"name": self.job_name, "timeout_min": o.slurm_time, "cpus_per_task": self.cpus_per_task,
                  "nodes": 1, "tasks_per_node": 1,
                  "slurm_array_parallelism": min(o.workers or n_units, n_units),
                  "slurm_setup": [f"export {ENV}={self.threads}"]}
        for key in ("partition", "mem", "account", "qos", "constraint"):
            if getattr(o, f"slurm_{key}"):
                params[f"slurm_{key}"] = getattr(o, f"slurm_{key}")
        if o.slurm_gpus_per_task:
            params["slurm_gpus_per_task"] = o.slurm_gpus_per_task
        if o.slurm_extra:
            params["slurm_additional_parameters"] = dict(o.slurm_extra)
        return params

    def script(self, n_units: int) -> str:
        """The job script submitit submits for an array of ``n_units`` tasks: its own
        ``sbatch`` text (``submitit.slurm.slurm._make_sbatch_string``, the function its
        ``SlurmExecutor`` writes the file with) from these parameters, translated to Slurm's
        names as ``AutoExecutor`` does — without a Slurm installation (``--dry-run``)."""
        import shlex
        import sys

        from submitit.slurm import slurm

        native = {}
        generic = slurm.SlurmExecutor._equivalence_dict()
        for key, value in self.parameters(n_units).items():
            native[generic[key] if key in generic else key.removeprefix("slurm_")] = value
        command = " ".join([shlex.quote(sys.executable), "-u -m submitit.core._submit",
                            shlex.quote(str(self.folder.expanduser().absolute()))])
        return slurm._make_sbatch_string(command=command, folder=self.folder.expanduser().absolute(),
                                         map_count=n_units, **native)

    def executor(self, n_units: int):
        import submitit

        executor = submitit.AutoExecutor(self.folder, cluster=self.options.slurm_cluster,
                                         slurm_max_num_timeout=self.options.slurm_requeues)
        executor.update_parameters(**self.parameters(n_units))
        return executor

    def check(self) -> None:
        """``UserError`` (one line, sbatch's reasons) when sbatch would refuse this array:
        the job script itself, submitted with ``--test-only`` (nothing is queued or written)."""
        import subprocess

        try:
            done = subprocess.run(["sbatch", "--test-only"], input=self.script(1), capture_output=True, text=True,
                                  timeout=120)
        except (OSError, subprocess.SubprocessError) as exc:
            raise UserError(f"--launcher slurm: sbatch could not be run ({exc})") from None
        if done.returncode != 0:
            raise UserError(f"sbatch refuses the job array ({self._asked()}): {_refusal(done.stderr)}")

    def _asked(self) -> str:
        o = self.options
        asked = [f"--slurm-{k.replace('_', '-')} {getattr(o, f'slurm_{k}')}"
                 for k in ("partition", "account", "qos", "constraint", "mem") if getattr(o, f"slurm_{k}")]
        asked += [f"{o.slurm_gpus_per_task} GPU(s) per task", f"{self.cpus_per_task} CPU(s) per task",
                  f"--slurm-time {o.slurm_time}"]
        return ", ".join(asked)

    def submit(self, jobs: list[WorkerJob]) -> list:
        """Submit the array (without waiting): submitit's jobs, in order (a refusal: one line),
        each watched by ``QueueWatcher`` (where the cluster keeps no accounting)."""
        from submitit.core.utils import FailedJobError

        try:
            submitted = self.executor(len(jobs)).submit_array(jobs)
        except FailedJobError as exc:  # sbatch's refusal of this stage (the check passed for the first)
            raise UserError(f"sbatch refused the job array ({self._asked()}): {_refusal(str(exc))}") from None
        if self.options.slurm_cluster == "slurm":  # (the debug executor's jobs watch themselves)
            watcher = queue_watcher()
            for job in submitted:
                job.watcher = watcher
                watcher.register_job(job.job_id)
        return submitted

    def run(self, jobs: list[WorkerJob], log: Callable[[str], None],
            progress: Callable[[], str] | None = None) -> list[Outcome]:
        submitted = self.submit(jobs)
        cpus = f"{self.cpus_per_task} CPUs per task" + ("" if self.options.cpus_per_task else " (one per --threads)")
        log(f"submitted {len(jobs)} units as Slurm array {submitted[0].job_id.split('_')[0]} ({cpus}; logs in "
            f"{self.folder}); waiting for them (interrupted, they go on: run reproduce again to collect them)")
        out = []
        for k, (job, sub) in enumerate(zip(jobs, submitted), 1):
            out.append(_outcome(sub, job))
            eta = progress() if progress else ""
            log(f"[{k}/{len(jobs)}] {job.name}: {'failed' if out[-1].error else 'done'} "
                f"({', '.join(x for x in (out[-1].worker.get('host'), _describe(out[-1].worker)) if x)})"
                + (f": {out[-1].error}" if out[-1].error else "") + (f"; {eta}" if eta else ""))
        return out


def gpus_per_task(options: LaunchOptions, device: str) -> int:
    """``--slurm-gpus-per-task``, else by the device the study's runs use: none for a CPU
    study (``cpu``), one for ``cuda``, and for ``auto`` one where the partition has GPUs
    (``sinfo``'s generic resources), none where it has none (issue 63: a CPU study asked
    for a GPU and sbatch refused it on a cluster without)."""
    if options.slurm_gpus_per_task is not None:
        return options.slurm_gpus_per_task
    if device in ("cpu", "cuda"):
        return int(device == "cuda")
    import subprocess

    command = ["sinfo", "-h", "-o", "%G"] + (["-p", options.slurm_partition] if options.slurm_partition else [])
    try:
        gres = subprocess.run(command, capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):  # no Slurm here (a dry run): as on a cluster with GPUs
        return 1
    return int("gpu" in gres)


def _refusal(stderr: str) -> str:
    """sbatch's reasons, one line (``sbatch: error: ...`` / ``allocation failure: ...``)."""
    reasons = [re.sub(r"^(sbatch: error: |allocation failure: )", "", line.strip()) for line in stderr.splitlines()]
    return "; ".join(dict.fromkeys(r for r in reasons if r)) or "no reason given"


_QUEUE_WATCHER = None
# squeue's states that sacct does not report, as submitit's watcher knows them (not ended)
_SQUEUE_STATES = {"CONFIGURING": "RUNNING", "SIGNALING": "RUNNING", "STAGE_OUT": "RUNNING", "STOPPED": "RUNNING",
                  "SUSPENDED": "RUNNING", "RESIZING": "RUNNING", "REQUEUE_FED": "REQUEUED",
                  "REQUEUE_HOLD": "REQUEUED", "RESV_DEL_HOLD": "PENDING", "SPECIAL_EXIT": "REQUEUED"}


def queue_watcher():
    """The watcher of every Slurm task this process submits: submitit's (``sacct``), which
    falls back to ``squeue`` where the cluster keeps no accounting (no slurmdbd: ``sacct``
    fails, and submitit would wait for ever for a task cancelled or out of time, and print
    a warning at each look). One per process, as submitit's own."""
    global _QUEUE_WATCHER
    if _QUEUE_WATCHER is None:
        from submitit.slurm.slurm import SlurmInfoWatcher

        class QueueWatcher(SlurmInfoWatcher):
            def update(self) -> None:
                command = self._make_command()
                if command is None:
                    return
                self._num_calls += 1
                arrays = command[command.index("-j") + 1::2]
                text = _quiet_run(command)
                if text is not None:
                    self._info_dict.update(self.read_info(text))
                else:  # no accounting: the controller's queue (which lists finished tasks for MinJobAge)
                    for array in arrays:
                        self._info_dict.update(self._queued(array))

                self._last_status_check = time.time()
                for job in self._registered - self._finished:
                    if self.is_done(job, mode="cache"):
                        self._finished.add(job)

            def _queued(self, array: str) -> dict:
                """The states ``squeue`` gives the tasks of ``array``; a task it no longer lists
                (or an array it calls invalid: purged after MinJobAge) ended long ago."""
                import subprocess

                try:
                    done = subprocess.run(["squeue", "-h", "-t", "all", "-o", "%i|%T|%N", "-j", array],
                                          capture_output=True, text=True, timeout=120)
                except (OSError, subprocess.SubprocessError):
                    return {}
                if done.returncode != 0 and "invalid job id" not in done.stderr.lower():
                    return {}  # squeue itself failed: ask again later
                known = self.read_info("JobID|State|NodeList\n" + done.stdout) if done.returncode == 0 else {}
                for info in known.values():  # squeue's passing states, which sacct does not have: not ended
                    info["State"] = _SQUEUE_STATES.get(info["State"], info["State"])
                for job in self._registered - self._finished:
                    if job.split("_")[0] == array and job not in known:
                        known[job] = {"JobID": job, "State": "ENDED", "NodeList": ""}
                return known

        _QUEUE_WATCHER = QueueWatcher(delay_s=60)
    return _QUEUE_WATCHER


def _quiet_run(command: list[str]) -> str | None:
    """``command``'s stdout, or ``None`` when it fails (its stderr kept off the terminal)."""
    import subprocess

    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None



__all__ = ["Slurm", "gpus_per_task", "queue_watcher"]
