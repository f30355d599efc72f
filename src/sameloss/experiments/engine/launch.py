"""Launchers: where the independent units of a study run (``reproduce --launcher``).

A *unit* (``core.Unit``) is the part of a study that can run apart from the rest: one run
(trained, then its checkpoints measured), or a seed's chain (isoloss: a base run, then its
forks — a fork waits for its base inside the unit). A launcher runs a list of units and
returns what each one returned, in order:

* ``inprocess`` (the default): one after another in this process, as ``reproduce``
  always did.
* ``local``: ``--workers N`` processes on this machine through submitit's
  ``LocalExecutor`` (at most N units at once; the next starts when one ends; a worker
  never outlives the ``reproduce`` that started it, even one killed by SIGKILL:
  ``die_with``). On a
  machine with GPUs, worker k sees only GPU k (``CUDA_VISIBLE_DEVICES``, set by the job
  before anything touches CUDA; round robin when there are more workers than GPUs;
  ``worker_devices``). Default N: up to 8 a GPU as the host's cores allow
  (``WORKERS_PER_GPU``), else one per ``--threads`` CPU cores.
* ``slurm``: one Slurm job array through submitit's ``AutoExecutor`` — a task per unit
  with ``--slurm-gpus-per-task`` GPUs (Slurm sets ``CUDA_VISIBLE_DEVICES``; default: by the
  study's device, ``gpus_per_task``), at most ``--workers`` tasks running at once (default:
  all); what sbatch would refuse is refused before any file (``sbatch --test-only``). A task
  that is preempted, or runs out of ``--slurm-time`` (up to ``--slurm-requeues`` times), is
  requeued and starts its unit again: its runs
  resume from their newest checkpoints (bit-identical to an uninterrupted run) and its
  measured rows come from the cache. This process waits for the array and then writes
  the report; killed while waiting, the tasks go on, and a later ``reproduce`` reuses
  what they finished.

Every worker applies the threads policy (``threads.configure_threads``: this process's
thread count, one unless ``--threads``) and holds the lock of the folder its unit writes
(``files.folder_lock``); a unit refused for a reason a user can fix (``UserError``),
or whose worker was killed, comes back as its one line, after the other units have
finished (the same command then reuses what finished and resumes what was cut). Submitit's own files
(pickled units, each worker's stdout/stderr log) go to ``<experiment>/submitit/``.

The launchers other than ``inprocess`` need submitit (``pip install 'sameloss[cluster]'``).
"""

from __future__ import annotations

import os
import re
import signal
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ...errors import UserError
from .hardware import WORKERS_PER_GPU
from .study_log import WorkerStages

LAUNCHERS = ("inprocess", "local", "slurm")
SUBMITIT_DIR = "submitit"
# a local worker has no time limit of its own (submitit's LocalExecutor default is 2 minutes)
LOCAL_TIMEOUT_MIN = 60 * 24 * 365
POLL_SECONDS = 0.5  # how often the local launcher looks for a finished worker
SLURM_MEM = re.compile(r"^\d+(\.\d+)?[KMGT]?B?$", re.IGNORECASE)
SLURM_KEY = re.compile(r"^[A-Za-z][A-Za-z0-9-]*$")
# what the array's script sets itself: --slurm-extra may not set these again
SBATCH_OWN = frozenset({"job_name", "time", "cpus_per_task", "nodes", "ntasks_per_node", "array", "output", "error",
                        "open_mode", "signal", "wckey"})


@dataclass(frozen=True)
class LaunchOptions:
    """How ``reproduce`` runs a study's units (the ``--launcher`` flags)."""

    launcher: str = "inprocess"
    workers: int | None = None  # local: processes at once; slurm: array tasks at once (None: the defaults)
    slurm_partition: str | None = None
    slurm_time: int = 240  # minutes per task
    slurm_gpus_per_task: int | None = None  # None: by the study's device (``gpus_per_task``)
    slurm_requeues: int = 3  # a task out of --slurm-time requeued at most this many times (submitit's max_num_timeout)
    slurm_mem: str | None = None  # e.g. 32G
    slurm_cluster: str = "slurm"  # submitit's executor: "debug" runs the Slurm path in this process (tests)
    slurm_account: str | None = None
    slurm_qos: str | None = None
    slurm_constraint: str | None = None  # e.g. "a100|h100"
    slurm_extra: tuple[tuple[str, str], ...] = ()  # any other #SBATCH --KEY=VALUE (submitit's additional_parameters)
    cpus_per_task: int | None = None  # None: one per --threads (said in the script and the submission line)
    dry_run: bool = False  # print the job script and submit nothing

    def __post_init__(self):
        if self.launcher not in LAUNCHERS:
            raise UserError(f"unknown launcher {self.launcher!r}; choose from {', '.join(LAUNCHERS)}")
        if self.workers is not None and self.workers < 1:
            raise UserError(f"--workers must be at least 1, got {self.workers}")
        if self.slurm_time < 1 or (self.slurm_gpus_per_task or 0) < 0 or self.slurm_requeues < 0:
            raise UserError("--slurm-time must be at least 1 minute, --slurm-gpus-per-task and --slurm-requeues at "
                            "least 0")
        if self.slurm_mem is not None and not SLURM_MEM.match(self.slurm_mem):
            raise UserError(f"--slurm-mem {self.slurm_mem!r} is not a Slurm memory size (e.g. 16G, 32000M)")
        if self.cpus_per_task is not None and self.cpus_per_task < 1:
            raise UserError(f"--cpus-per-task must be at least 1, got {self.cpus_per_task}")
        for key, _ in self.slurm_extra:
            if not SLURM_KEY.match(key):
                raise UserError(f"--slurm-extra {key!r}: a Slurm option name is letters, digits and '-' (e.g. "
                                "mail-type=END)")
            if key.replace("-", "_") in SBATCH_OWN:
                raise UserError(f"--slurm-extra {key}: sameloss sets --{key} itself (reproduce --help lists its "
                                "own options: --slurm-time, --cpus-per-task, --workers)")


def check_options(options: LaunchOptions, given: set[str]) -> None:
    """``UserError`` for flags that do not apply to the launcher chosen (``given``: the
    names of the flags set on the command line) and for a launcher whose package is
    missing."""
    if options.launcher == "inprocess" and "workers" in given:
        raise UserError("--workers applies to --launcher local or slurm (inprocess runs one unit at a time)")
    slurm = sorted(g for g in given if g.startswith("slurm_") or g in ("cpus_per_task", "dry_run"))
    if options.launcher != "slurm" and slurm:
        raise UserError(f"--{slurm[0].replace('_', '-')} applies to --launcher slurm")
    if options.cpus_per_task is not None:
        import torch

        if options.cpus_per_task < torch.get_num_threads():
            raise UserError(f"--cpus-per-task {options.cpus_per_task} is fewer than the {torch.get_num_threads()} "
                            "threads each worker runs (--threads): give at least as many CPUs as threads")
    if options.dry_run:
        return  # nothing runs: submitit need not be installed here
    if options.launcher != "inprocess":
        import importlib.util

        if importlib.util.find_spec("submitit") is None:
            raise UserError(f"--launcher {options.launcher} needs submitit: pip install 'sameloss[cluster]' "
                            "(or pip install submitit)")


def worker_devices(workers: int, environ=None, device_count: int | None = None) -> list[str | None]:
    """``CUDA_VISIBLE_DEVICES`` of each local worker: worker k gets the k-th GPU this
    process sees (the k-th entry of its own ``CUDA_VISIBLE_DEVICES`` when that is set, so
    a restricted parent stays restricted), round robin when there are more workers than
    GPUs; ``None`` for every worker on a machine without GPUs."""
    environ = os.environ if environ is None else environ
    if device_count is None:
        import torch

        device_count = torch.cuda.device_count()
    if device_count <= 0:
        return [None] * workers
    visible = [d.strip() for d in environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    ids = visible[:device_count] if visible else [str(i) for i in range(device_count)]
    return [ids[k % len(ids)] for k in range(workers)]




def default_workers(threads: int, device_count: int, cpu_count: int | None) -> int:
    """Local workers when ``--workers`` is not given: on a machine with GPUs up to
    ``WORKERS_PER_GPU`` a GPU, as many as the host's cores allow at ``threads`` each (at
    least one a GPU); else one per ``threads`` CPU cores."""
    by_cores = max(1, (cpu_count or 1) // max(threads, 1))
    if device_count > 0:
        return max(device_count, min(WORKERS_PER_GPU * device_count, by_cores))
    return by_cores


def main_job_options(workers: int | None, threads: int, device_count: int, cpu_count: int | None,
                     have_submitit: bool) -> LaunchOptions:
    """The launcher of the main job (``sameloss reproduce`` with no experiment and no
    ``--launcher``): its seeds' chains on ``local`` workers — ``workers``, else one per
    GPU or per ``threads`` cores — when submitit is installed and that is more than one
    worker, so the main job uses the cores it has (on a 2-core CPU: two seeds at once,
    as its runtime assumes); otherwise in this process, one unit after another."""
    n = workers or default_workers(threads, device_count, cpu_count)
    if have_submitit and (workers is not None or n > 1):
        return LaunchOptions("local", n)
    return LaunchOptions()


# ---- what runs in a worker ---------------------------------------------------------------
@dataclass
class Outcome:
    """What a worker sends back: the unit's value, or the one line of the ``UserError``
    that stopped it; and where it ran."""

    value: Any = None
    error: str | None = None
    worker: dict = field(default_factory=dict)


class WorkerJob:
    """The callable a launcher submits: ``call()`` under this study's threads policy.

    It follows the protocol of ``submitit.helpers.Checkpointable`` (submitit requeues a
    job whose callable has a ``checkpoint`` method; duck-typed, so that this module
    imports without submitit): on preemption or timeout, ``checkpoint`` resubmits the
    same job, whose unit then resumes from what is on disk — the newest checkpoint of each
    run (exact resume) and the measured rows of ``measurements.json``."""

    def __init__(self, call: Callable[[], Any], threads: int, name: str = "", device: str | None = None,
                 parent: int | None = None):
        self.call, self.threads, self.name, self.device, self.parent = call, threads, name, device, parent

    def on_device(self, device: str | None, parent: int | None = None) -> WorkerJob:
        """This job, seeing only GPU ``device`` (``None``: as the worker's environment says);
        ``parent``: the pid of the process it must not outlive (``die_with``)."""
        return WorkerJob(self.call, self.threads, self.name, device, parent)

    def __call__(self) -> Outcome:
        from ...threads import configure_threads

        if self.parent is not None:
            die_with(self.parent)
        if self.device is not None:
            # before anything initialises CUDA (importing torch does not), which reads it once
            os.environ["CUDA_VISIBLE_DEVICES"] = self.device
        configure_threads(self.threads)
        worker = worker_info()
        try:
            return Outcome(self.call(), None, worker)
        except UserError as exc:
            return Outcome(None, str(exc).splitlines()[0] if str(exc) else type(exc).__name__, worker)

    def checkpoint(self, *args, **kwargs):
        from submitit.helpers import DelayedSubmission

        return DelayedSubmission(self, *args, **kwargs)


def die_with(pid: int) -> None:
    """End this process (SIGKILL) as soon as the process ``pid`` ends — a local worker and
    the ``reproduce`` that started it, also when that one is killed with SIGKILL and
    cannot stop its workers itself: no orphan keeps writing (and locking) the study's
    folders, and the next ``reproduce`` resumes what was cut, as after any kill (the
    checkpoints and rows are written atomically). A thread waits on a pidfd (Linux); where
    there is none, it looks every second."""
    import threading

    me = os.getpid()
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:  # gone already
        os.kill(me, signal.SIGKILL)
        return
    except (AttributeError, OSError):
        fd = None

    def wait():
        if fd is not None:
            import select

            select.select([fd], [], [])
        else:
            while _exists(pid):
                time.sleep(1.0)
        os.kill(me, signal.SIGKILL)

    threading.Thread(target=wait, name=f"die-with-{pid}", daemon=True).start()


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def worker_info() -> dict:
    """Where this worker runs: host, pid, the GPUs it sees, its torch threads (and the
    ``OMP_NUM_THREADS`` it started with)."""
    import torch

    from ...threads import ENV

    return {"host": socket.gethostname(), "pid": os.getpid(), "threads": torch.get_num_threads(),
            "omp_num_threads": os.environ.get(ENV), "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}


def _describe(worker: dict) -> str:
    if not worker:  # a worker that ended without a result
        return "no result"
    gpu = worker.get("cuda_visible_devices")
    return f"pid {worker.get('pid')}" + (f", GPU {gpu}" if gpu else "")


# ---- the launchers -----------------------------------------------------------------------
class InProcess:
    """Each unit here, one after another."""

    name = "inprocess"
    workers = 1

    def run(self, jobs: list[WorkerJob], log: Callable[[str], None],
            progress: Callable[[], str] | None = None) -> list[Outcome]:
        # a UserError stops the study at once, as reproduce always did
        out = []
        for k, job in enumerate(jobs, 1):
            started = time.perf_counter()
            out.append(Outcome(job.call(), None, {}))
            eta = progress() if progress else ""
            if eta and len(jobs) > 1:
                log(f"[{k}/{len(jobs)}] {job.name}: done in {time.perf_counter() - started:.0f} s; {eta}")
        return out


class Local:
    """``workers`` processes through submitit's ``LocalExecutor``, the GPUs shared round robin."""

    name = "local"

    def __init__(self, folder: Path, workers: int, threads: int, devices: list[str | None]):
        self.folder, self.workers, self.threads, self.devices = Path(folder), workers, threads, devices

    def run(self, jobs: list[WorkerJob], log: Callable[[str], None],
            progress: Callable[[], str] | None = None) -> list[Outcome]:
        import submitit

        from ...threads import for_children

        slots = min(self.workers, len(jobs))
        executor = submitit.LocalExecutor(self.folder)
        executor.update_parameters(timeout_min=LOCAL_TIMEOUT_MIN)
        waiting = list(range(len(jobs)))
        running: dict[int, tuple[int, Any, float]] = {}  # slot -> (job index, submitit job, start)
        out: list[Outcome | None] = [None] * len(jobs)
        stages = WorkerStages(log)
        try:
            while waiting or running:
                stages.report({jobs[i].name: job for i, job, _ in running.values()},
                              len(jobs) - len(waiting) - len(running), len(jobs))
                for slot in range(slots):
                    if slot not in running and waiting:
                        i = waiting.pop(0)
                        # the worker's environment is this process's at submission: libgomp reads
                        # OMP_NUM_THREADS when the worker imports torch
                        with for_children(self.threads):  # (it dies with this process: die_with)
                            job = executor.submit(jobs[i].on_device(self.devices[slot], os.getpid()))
                        running[slot] = (i, job, time.perf_counter())
                finished = [slot for slot, (_, job, _) in running.items() if job.done()]
                if not finished:
                    time.sleep(POLL_SECONDS)
                for slot in finished:
                    i, job, started = running.pop(slot)
                    out[i] = _outcome(job, jobs[i])
                    done = len(jobs) - len(waiting) - len(running)
                    eta = progress() if progress else ""
                    log(f"[{done}/{len(jobs)}] {jobs[i].name}: {'failed' if out[i].error else 'done'} in "
                        f"{time.perf_counter() - started:.0f} s ({_describe(out[i].worker)})"
                        + (f": {out[i].error}" if out[i].error else "") + (f"; {eta}" if eta else ""))
        except BaseException:
            for _, job, _ in running.values():  # a worker must not outlive an interrupted study
                _stop(job)
            raise
        return out


def _stop(job) -> None:
    """Stop a local worker at once: its controller process and the task under it. SIGKILL:
    a submitit task ignores SIGTERM (it waits for Slurm's USR2), and a process started in
    the background ignores SIGINT. Safe: checkpoints and rows are written atomically, and
    the kernel releases the worker's locks.

    The tree is frozen first (SIGSTOP, parents before children), so a process that was
    starting its child while we looked cannot leave that child behind; then every process
    in it is killed, and we wait until each has exited."""
    pid = int(job.job_id)  # a local job's id is its controller's pid
    tree: list[int] = []
    frontier = [pid]
    while frontier:
        for p in frontier:
            _signal(p, signal.SIGSTOP)
        tree += frontier
        frontier = [c for p in frontier for c in _children(p) if c not in tree]
    for p in tree:
        _signal(p, signal.SIGKILL)
    process = getattr(job, "_process", None)
    if process is not None:
        process.wait()
    deadline = time.monotonic() + 60  # a guard against a process stuck in the kernel, not a timing
    for p in tree:  # reaped by their parent or by init: gone once /proc says so (or a zombie)
        while _alive(p) and time.monotonic() < deadline:
            time.sleep(0.01)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _children(pid: int) -> list[int]:
    """The direct children of ``pid`` (Linux ``/proc``; none found elsewhere)."""
    out = []
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return out
    for task in tasks:
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return out

def _outcome(job, worker_job: WorkerJob) -> Outcome:
    """A finished submitit job's ``Outcome``. A worker that ended without a result (killed:
    ``kill -9``, out of memory; a Slurm task cancelled or out of time) is the unit's one
    line — the same command resumes it; a crash (a bug, not a ``UserError``) keeps its
    traceback."""
    from submitit.core.utils import FailedJobError, UncompletedJobError

    try:
        return job.result()
    except UncompletedJobError as exc:
        return Outcome(None, _ended(job, str(exc)))
    except FailedJobError as exc:
        if _OUT_OF_TIME in str(exc):
            return Outcome(None, _ended(job, str(exc)))
        raise RuntimeError(f"unit {worker_job.name!r} failed in its worker (log: {job.paths.stderr}):\n{exc}") \
            from None


# submitit's own end of a task that ran out of its time once more than it may be requeued
_OUT_OF_TIME = "timed-out too many times"
# what a Slurm task's end state says, in words
_ENDS = {"TIMEOUT": "over its time limit, --slurm-time", "CANCELLED": "cancelled", "PREEMPTED": "preempted",
         "NODE_FAIL": "its node failed", "OUT_OF_MEMORY": "out of memory, --slurm-mem", "FAILED": "failed"}


def _ended(job, said: str) -> str:
    """A worker that ended without a result, in one line: how (a Slurm task's end state, or
    its time limit reached once more than ``--slurm-requeues`` allows: ``said``, submitit's
    message) and where its log is; the same command resumes it."""
    from submitit.slurm.slurm import SlurmInfoWatcher

    slurm = isinstance(getattr(job, "watcher", None), SlurmInfoWatcher)
    state = job.watcher.get_state(job.job_id, mode="force").upper() if slurm else ""
    why = next((v for k, v in _ENDS.items() if state.startswith(k)), None)
    if _OUT_OF_TIME in said:
        how = (f"its Slurm task {job.job_id} ran out of its time limit (--slurm-time) once more than it may be "
               "requeued (--slurm-requeues)")
    elif why is not None:
        how = f"its Slurm task {job.job_id} ended {state.split()[0]} ({why}) without a result"
    else:
        how = "its worker ended without a result (killed?)"
    log = job.paths.stderr if slurm else job.paths.stdout
    return f"{how}; log: {log}; run the same command again: it reuses what finished and resumes the rest"


def parse_seeds(text: str) -> list[int]:
    """``--seeds``: ``0-7``, ``0,2,5`` or a mix (``0-3,8``), as a sorted list."""
    seeds: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not m or (m.group(2) is not None and int(m.group(2)) < int(m.group(1))):
            raise ValueError(f"{text!r} is not a list of seeds (e.g. 0-7 or 0,2,5)")
        seeds.update(range(int(m.group(1)), int(m.group(2) or m.group(1)) + 1))
    return sorted(seeds)


def format_seeds(seeds: list[int]) -> str:
    """``[0, 1, 2, 5]`` as ``0-2,5``."""
    out, seeds = [], sorted(seeds)
    i = 0
    while i < len(seeds):
        j = i
        while j + 1 < len(seeds) and seeds[j + 1] == seeds[j] + 1:
            j += 1
        out.append(str(seeds[i]) if i == j else f"{seeds[i]}-{seeds[j]}")
        i = j + 1
    return ",".join(out)


__all__ = ["LAUNCHERS", "LaunchOptions", "Local", "InProcess", "Outcome", "StudyProgress", "WorkerJob",
           "check_options",
           "default_workers", "format_seeds", "parse_seeds", "worker_devices"]
