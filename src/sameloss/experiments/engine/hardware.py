"""What the planner knows of the devices it prices work on (``plan.estimate``): the stages
of a study's cost, each device's peak FLOP/s and memory (``DEVICES``: NVIDIA's published
dense peaks), the share of the peak each stage reaches (``UTILISATION``, with where each
number comes from), the least time a training step takes on a GPU (``STEP_FLOOR_S``) and an
ensemble step's (``ENSEMBLE_STEP_S``), this machine's float32 matmul rate measured when the
planner runs (``measure_cpu_peak``) and the memory a device offers a run or a measure."""

from __future__ import annotations

import time

from ... import resources

STAGES = ("training", "exact-KL evaluation", "trace", "probes")

# Published dense peaks (no structured sparsity), FLOP/s: NVIDIA H100 SXM5 datasheet
# (nvidia.com/en-us/data-center/h100: FP32 67 TFLOPS, BF16 Tensor Core 1979 TFLOPS with
# sparsity = 989.5 dense) and the A100 80GB SXM datasheet (nvidia.com/en-us/data-center/a100:
# FP32 19.5 TFLOPS, BF16 Tensor Core 312 TFLOPS dense). Training runs in bf16 on CUDA (the
# default precision there); evaluation, traces and probes stay in float32 (autocast is for
# training only), which torch runs as plain FP32 unless TF32 is allowed — so their peak is
# the FP32 one.
DEVICES: dict[str, dict[str, float]] = {
    "h100": {"bf16": 989.5e12, "fp32": 67e12, "memory": 80 * 2**30},
    "a100": {"bf16": 312e12, "fp32": 19.5e12, "memory": 80 * 2**30},
}

# This project's CPU as the README's runtimes were measured on it: the one-thread float32
# matmul peak ``measure_cpu_peak`` reads on the 2-core machine, otherwise idle (158-160
# GFLOP/s, 2026-11-28). The main job's pinned design (isoloss ``QUICK_PLAN``) and the tests
# that hold the README's runtime to the planner price work at this peak, not at one measured
# while the tests run (the load moves a measurement by a third).
REFERENCE_CPU_PEAK = 160e9

# Fraction of the peak each stage reaches. cpu, per worker thread: calibrated on the main
# job (``sameloss reproduce``, isoloss quick, 10 seeds, 2 workers of one thread on this
# project's 2-core CPU, otherwise idle, 2026-11-28): its cost.json gave 2,722 CPU-s training
# (with the gate and the evaluations the matching reads) and 855 CPU-s measuring, against
# 1,433 s and 482 s that the previous shares (training 31 %, exact-KL evaluation 35 %, trace
# 38 %, probes 14 %: bench/bench_planner.py on ``algorithms --scale tiny``) predict at the
# one-thread peak measured beside it (160 GFLOP/s); both groups scaled by those ratios (0.527,
# 0.564). The tiny transformer on 10-token sentences is far from the matmul peak (dropout,
# softmax, the optimiser's element-wise work); larger shapes of other recipes will run
# nearer it, so their CPU forecasts here are on the long side.
# h100: training measured on an H100 80GB HBM3 (SXM, torch 2.11+cu130; bench/gpu_check.sh,
# bench/gpu_throughput.py): bf16 training of the ``paper`` shape (t3-1024, 203 M parameters,
# batch 4096 x 16 tokens) reached 25.4 % of the bf16 dense peak (252 TFLOP/s by our FLOP
# count), the ``small`` shape (t4-384) 11.7 %; so 25 % here, an overestimate for small
# models. Float32 training on the same card reached 53-66 % of the FP32 peak (35-44 TFLOP/s):
# the float32 stages' shares below stay assumed (their own calls were not timed on the card;
# see STEP_FLOOR_S for the tiny sizes, where overheads, not FLOP/s, set the time).
# a100: assumed, not measured: the h100's stage shares.
UTILISATION: dict[str, dict[str, float]] = {
    "cpu": {"training": 0.163, "exact-KL evaluation": 0.184, "trace": 0.214, "probes": 0.079},
    "h100": {"training": 0.25, "exact-KL evaluation": 0.30, "trace": 0.20, "probes": 0.20},
    "a100": {"training": 0.25, "exact-KL evaluation": 0.30, "trace": 0.20, "probes": 0.20},
}
UTILISATION_SOURCE = {"cpu": "measured on this project's 2-core CPU, per worker thread (the main job, isoloss quick, "
                            "2026-11-28: training 16 %, measuring 8-21 %); with more threads, another CPU or larger "
                            "models, expect other shares",
                      "h100": "training measured on an H100 80GB HBM3 (bf16, paper shape: 25 %; small shape 12 %); "
                              "the float32 stages assumed",
                      "a100": "assumed (the h100's shares; no A100 measured)"}

# The least time a training step takes whatever its FLOPs: eager PyTorch launches a few
# hundred kernels per step (forward, backward, AdamW). Measured on an H100 80GB HBM3
# (bench/gpu_workers.py): the isoloss tiny model (106 k parameters, batch 256) trains at
# 115 steps/s in one process, 8.7 ms a step; k processes sharing the card reach 236, 438 and
# 637 steps/s for k = 2, 4, 8 (so a study's workers, not its FLOPs, set a tiny study's pace
# on a GPU). a100: the h100's, assumed. On the CPU a small step's overhead is in the
# measured utilisation.
STEP_FLOOR_S = {"cpu": 0.0, "h100": 8.7e-3, "a100": 8.7e-3}
# ``--ensemble N`` (experiments/ensembles.py): S runs of one ``ensemble_key`` that the engine
# asks for together (the plan's proxy: one key and one first step, e.g. one fork of every
# seed) train as one computation. On a GPU (the ``vmap`` strategy) a step of S members costs
# max(S × a member's FLOPs / rate, a + b × S): measured on an NVIDIA H200 (the H100's chip with
# more memory; torch 2.11+cu130, driver 580.159.04, 16 host cores; bench/bench_ensemble.py in
# bench/gpu_check.sh, 2026-11-28), the isoloss tiny model at batch 256 with keyed dropout 0.1
# stepped S = 1, 4, 16, 64 members in 26.0, 30.5, 49.5 and 120.6 ms: a = 24.8 ms, b = 1.50 ms
# (least squares, each point within 4 %). At S = 64 a member's step is 1.9 ms, 0.12× one model's
# 15.4 ms beside it (8×; 0.7 TFLOP/s, 0.07 % of the bf16 peak): b is the host's work per
# member (its batch; 5 ms of a host core to draw one), not the card's. Used for the h100 too
# (the same chip), assumed for the a100. On the CPU (the ``loop`` strategy) a member costs what
# one model does.
ENSEMBLE_STEP_S = {"h100": (24.8e-3, 1.50e-3), "a100": (24.8e-3, 1.50e-3)}
ENSEMBLE_SOURCE = ("a step of S members costs max(S × a member's FLOPs / rate, its launch floor 24.8 ms + 1.50 ms × S), measured for "
                   "the tiny model on an NVIDIA H200 (torch 2.11; S = 1-64: 26-121 ms a step; bench/bench_ensemble.py)")


# ---- the device -------------------------------------------------------------------------
def measure_cpu_peak(size: int = 512, seconds: float = 0.3, workers: int = 1) -> float:
    """This machine's float32 matmul FLOP/s per CPU second with the threads each of
    ``workers`` workers would run (torch's threads shared out, at least one): the best of
    repeated ``size``×``size`` products over about ``seconds`` of process CPU time. CPU time,
    not wall time: on a shared machine the wall clock measures the other processes too, and
    the plan is of a machine the study has to itself. Per worker: the main job's two workers
    run one thread each on a 2-core CPU, whose one-thread peak (~160 GFLOP/s idle) is not
    the two-thread one (~123 per the same count), so the planner prices each worker's work
    at the rate it will run at."""
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
