"""What the planner knows of the devices it prices work on (``plan.estimate``): the stages
of a study's cost; from the calibration record (``calibration.toml``: every number with the
machine, bench and date it comes from) each device's peak FLOP/s and memory (``DEVICES``:
NVIDIA's published dense peaks), the share of the peak each stage reaches (``UTILISATION``),
the least time a training step takes on a GPU (``STEP_FLOOR_S``) and an ensemble step's
(``ENSEMBLE_STEP_S``); this machine's float32 matmul rate measured when the planner runs
(``measure_cpu_peak``) and the memory a device offers a run or a measure."""

from __future__ import annotations

import time
import tomllib
from pathlib import Path

from ... import resources

STAGES = ("training", "exact-KL evaluation", "trace", "probes")

# the devices' numbers, each with where it comes from (machine, bench, date): one record
CALIBRATION = Path(__file__).with_name("calibration.toml")


def _calibration() -> dict:
    with open(CALIBRATION, "rb") as f:
        return tomllib.load(f)


_RECORD = _calibration()
# published dense peaks, FLOP/s, and memory, bytes
DEVICES: dict[str, dict[str, float]] = {name: {"bf16": d["bf16"], "fp32": d["fp32"], "memory": d["memory_gib"] * 2**30}
                                        for name, d in _RECORD["devices"].items()}
# this project's CPU as the README's runtimes were measured on it (the main job's pinned design prices at it)
REFERENCE_CPU_PEAK: float = _RECORD["reference_cpu"]["peak"]
# the share of the peak each stage reaches, and where each device's shares come from
UTILISATION: dict[str, dict[str, float]] = {device: {stage: shares[stage] for stage in STAGES}
                                            for device, shares in _RECORD["utilisation"].items()}
UTILISATION_SOURCE: dict[str, str] = {device: shares["source"] for device, shares in _RECORD["utilisation"].items()}
# the least time a training step takes on each device (seconds): kernel launches, not FLOP/s
STEP_FLOOR_S: dict[str, float] = {k: v for k, v in _RECORD["step_floor"].items() if k != "source"}
# an ensemble step of S members on a GPU: max(FLOP time, fixed + per_member × S) seconds
ENSEMBLE_STEP_S: dict[str, tuple[float, float]] = {device: (e["fixed"], e["per_member"])
                                                   for device, e in _RECORD["ensemble_step"].items()}
ENSEMBLE_SOURCE: str = _RECORD["ensemble_step_source"]["text"]
# local worker processes a GPU takes by default (``launch.default_workers``)
WORKERS_PER_GPU: int = _RECORD["workers_per_gpu"]["value"]


# ---- the device -------------------------------------------------------------------------
def measure_cpu_peak(size: int = 512, seconds: float = 0.3, workers: int = 1) -> float:
    """This machine's float32 matmul FLOP/s per CPU second with the threads each of
    ``workers`` workers would run (torch's threads shared out, at least one): the best of
    repeated ``size``×``size`` products over about ``seconds`` of process CPU time. CPU time,
    not wall time: on a shared machine the wall clock measures the other processes too, and
    the plan is of a machine the study has to itself. Per worker: a worker of one thread runs
    at the one-thread peak, not at a share of the all-thread one, so the planner prices each
    worker's work at the rate it will run at."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(max(1, before // max(workers, 1)))
    try:
        return _best_matmul_rate(size, seconds)
    finally:
        torch.set_num_threads(before)


def _best_matmul_rate(size: int, seconds: float) -> float:
    import torch

    a, b = torch.randn(size, size), torch.randn(size, size)
    a @ b  # warm-up
    best, spent = 0.0, 0.0
    while spent < seconds:
        start = time.process_time()
        for _ in range(4):
            a @ b
        dt = time.process_time() - start
        spent += dt
        if dt > 0:
            best = max(best, 4 * 2 * size**3 / dt * torch.get_num_threads())  # per core × cores used
    return best


def peaks(device: str, cpu_peak: float | None, workers: int = 1) -> dict[str, float]:
    if device == "cpu":
        p = cpu_peak if cpu_peak is not None else measure_cpu_peak(workers=workers)
        return {"bf16": p, "fp32": p}
    return DEVICES[device]


def ensemble_floor(device: str, members: int) -> float:
    """A member's share of the least time an ensemble step of ``members`` takes on ``device``
    (``ENSEMBLE_STEP_S``; 0 on the CPU, where members train one by one)."""
    if device not in ENSEMBLE_STEP_S:
        return STEP_FLOOR_S[device]
    fixed, per_member = ENSEMBLE_STEP_S[device]
    return fixed / members + per_member


def device_memory(device: str) -> int:
    """The device's memory: the GPU's, or this machine's RAM for cpu."""
    if device == "cpu":
        import os

        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return int(DEVICES[device]["memory"])


def measure_limit(device: str) -> int:
    """The bytes a measure may plan to use on ``device``: what ``resources`` allows a
    command there (this machine's: ``resources.memory_limit``; a GPU: its share)."""
    if device == "cpu":
        return resources.memory_limit()[0]
    return int(DEVICES[device]["memory"] * resources.MEMORY_SHARE)
