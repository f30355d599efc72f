"""What a study costs before it runs (``sameloss plan``): runs, steps, FLOPs, peak memory
and wall time per stage.

The runs and measures are the recipe's own: its ``units(study, preset)`` are executed on a
``DryStudy``, which records every run a unit would train (``RunSpec.config()``: model,
batch, steps, evaluation, checkpoints), every checkpoint it would measure and with which
``MeasureSpec``, and every reference representation, and writes nothing (no folder, no
lock, no data: a recipe that must prepare data first offers ``plan_units``, e.g. ``text``).
A recipe that picks its checkpoints from its runs' KL curves (``isoloss``) reads a flat
curve here, so it measures as many checkpoints as it would, at ties; its headroom gate is
assumed to pass (every seed's forks are planned).

FLOPs (``forward_flops_per_token``), counted per token of a full-length padded sentence
(every position goes through the model and the tied decoder, as ``TransformerMLM``
computes them): per layer 2·(4d² + 2·d·d_inter) for the Q/K/V/output and MLP matmuls plus
4·T·d for the attention scores and their weighted sum; the MLM head 2·(d² + V·d) (dense
transform and tied decoder). Element-wise work (LayerNorm, GELU, softmax, the optimiser) is
not counted. A training step is 3× its forward (the backward is 2×); SAM splits the batch
into its ascent and update halves (the same total); the adversarial objective adds a
forward and backward over its own batch. Checked against ``torch.utils.flop_counter`` in
``tests/experiments/test_plan.py`` (within a few %). LSTMs: 2·(4·h·(d+h)) per layer and
token, plus the head — not checked (torch's counter does not count the fused LSTM kernel).

Stages and what their FLOPs count: ``training`` (the steps each run trains; a fork that
continues a checkpoint only the steps after it), ``exact-KL evaluation`` (the held-out
forward passes: during training every ``eval.every`` steps, at the end and — with
``eval.at_checkpoints`` — at every kept checkpoint, and the measured
``loss`` of each checkpoint), ``trace`` (Fisher: a forward over the contexts and one
backward per distinct label drawn, counted as min(n_labels, vocabulary): an upper bound, a
trained model repeats labels; Hutchinson / Hutch++: one Hessian-vector product ≈ 2 forward+backward
passes per probe over the curvature batch; the Lemma's gap: the same on its batches, for
true and model-drawn tokens; top eigenvalue: 100 products; SAM sharpness: two passes),
``probes`` (the features of every task sentence, the linear heads' L-BFGS iterations on
them, fine-tuning's epochs of training steps, few-shot and count-regression features).

Time = FLOPs / (peak × utilisation); on a GPU a training step takes at least
``STEP_FLOOR_S`` (a small model is bound by kernel launches, not FLOP/s). Peaks: cpu is this machine's float32 matmul rate with
the threads torch uses, measured when the planner runs (``measure_cpu_peak``; ``--cpu-peak``
overrides); GPUs are NVIDIA's published dense peaks (``DEVICES``). Utilisations are in
``UTILISATION``, one row per device and stage, with where each number comes from.

Memory: training is one step of the model on the meta device (``measures.curvature.memory``'s
``StorageTracker``: activations, gradients and the optimiser state, AdamW two moments, plus
the weights; float32 activations, so a bf16 run needs less), compared with the device's
memory (a warning line names the runs that do not fit); each curvature measure is ``memory.peak_bytes``; the exact-KL evaluation and
probe features are one forward chunk without gradients, traced the same way.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import UserError

STAGES = ("training", "exact-KL evaluation", "trace", "probes")

# Published dense peaks (no structured sparsity), FLOP/s: NVIDIA H100 SXM5 datasheet
# (nvidia.com/en-us/data-center/h100: FP32 67 TFLOPS, BF16 Tensor Core 1979 TFLOPS with
# sparsity = 989.5 dense) and the A100 80GB SXM datasheet (nvidia.com/en-us/data-center/a100:
# FP32 19.5 TFLOPS, BF16 Tensor Core 312 TFLOPS dense). Training runs in bf16 on CUDA (the
# default precision there); evaluation, traces and probes stay in float32 (issue 26), which
# torch runs as plain FP32 unless TF32 is allowed — so their peak is the FP32 one.
DEVICES: dict[str, dict[str, float]] = {
    "h100": {"bf16": 989.5e12, "fp32": 67e12, "memory": 80 * 2**30},
    "a100": {"bf16": 312e12, "fp32": 19.5e12, "memory": 80 * 2**30},
}

# Fraction of the peak each stage reaches. cpu, with one torch thread: training is the
# lead's measurement (~31 % for the tiny transformer; bench/bench_planner.py measured 36 %
# on ``algorithms --scale tiny``); the other three are what bench/bench_planner.py measured
# on ``algorithms --scale tiny`` (process CPU seconds per stage against this module's FLOPs
# and the matmul peak measured in the same run: exact-KL evaluation 35 %, trace — the
# Fisher estimator — 38 %, probes 14 %) and are checked on ``dyck --scale tiny`` (docs/how-to/plan.md,
# "Plan a study"). h100 / a100: assumed, not measured (no GPU here): 40 % for bf16 training
# of a BERT-size model is what well-tuned MLM training reports (MFU 40-50 %); the float32
# stages are small-batch and read-back bound, so a lower share is assumed. Every plan
# prints the utilisation it used and where it comes from.
UTILISATION: dict[str, dict[str, float]] = {
    "cpu": {"training": 0.31, "exact-KL evaluation": 0.35, "trace": 0.38, "probes": 0.14},
    "h100": {"training": 0.40, "exact-KL evaluation": 0.30, "trace": 0.20, "probes": 0.20},
    "a100": {"training": 0.40, "exact-KL evaluation": 0.30, "trace": 0.20, "probes": 0.20},
}
UTILISATION_SOURCE = {"cpu": "measured on this project's CPU, one thread (bench/bench_planner.py; training ~31 % by "
                            "the lead); with more threads, or another CPU, expect other shares",
                      "h100": "assumed (no GPU measured)", "a100": "assumed (no GPU measured)"}

# The least time a training step takes whatever its FLOPs: on a GPU, eager PyTorch launches a
# few hundred kernels per step (forward, backward, AdamW) at ~5-10 µs each, so a model of a
# few thousand parameters is bound by launches, not by FLOP/s (assumed, not measured here).
# On the CPU a small step's overhead is in the measured utilisation.
STEP_FLOOR_S = {"cpu": 0.0, "h100": 3e-3, "a100": 3e-3}

LANCZOS_PRODUCTS = 100  # curvature.top_eigenvalue's default max_iter
PROBE_ITERATIONS = 500  # linear_probe's L-BFGS max_iter


# ---- the dry study ----------------------------------------------------------------------
@dataclass
class PlannedRun:
    name: str
    study: str
    config: Any  # PretrainConfig
    start_step: int  # 0, or the step of the checkpoint a continued fork starts from


@dataclass
class PlannedMeasure:
    run: str  # the run (or reference kind) it measures
    config: Any  # the PretrainConfig of the measured model
    spec: Any  # MeasureSpec
    embedded_into: str | None = None


class DryStudy:
    """Stands in for ``core.Study`` while a recipe's units run in ``plan``: records what
    they would train and measure and touches no file (see the module docstring)."""

    def __init__(self, root: Path, seed: int, plan: Plan, study: str = ""):
        self.root, self.seed, self.plan, self.study = Path(root), seed, plan, study
        self.runs_dir = self.root / "runs"
        self.progress, self.device, self.tracker = False, "cpu", "none"
        self.runs: dict[str, Any] = {}
        self.done: dict[str, Any] = {}  # unit name -> what it returned (a staged recipe asks again)
        self.language_shapes: dict[str, tuple[int, int]] = plan.language_shapes

    def log(self, msg: str) -> None:
        pass

    def bar(self, items, desc):
        return items

    def rel(self, path) -> str:
        return str(path)

    def train(self, spec):
        from .core import RunInfo

        if spec.name in self.runs:
            return self.runs[spec.name]
        cfg = spec.config()
        start = 0
        if cfg.init_from and cfg.init_step == "continue":
            found = re.search(r"(\d+)$", Path(cfg.init_from).name)
            start = int(found.group(1)) if found else 0
        self.plan.runs.append(PlannedRun(spec.name, self.study, cfg, start))
        path = self.runs_dir / spec.name
        self.plan.paths[str(path)] = cfg
        info = RunInfo(spec, cfg, path, "planned", 0.0, {})
        self.runs[spec.name] = info
        return info

    def checkpoints(self, info, steps=()):
        from ..training.checkpoint import checkpoint_dir

        return [checkpoint_dir(info.path, s) for s in (steps or (info.config.steps,))]

    def train_and_measure(self, spec, mspec, experiment, language):
        from .core import Measured, model_row

        info = self.train(spec)
        out = []
        for ck in self.checkpoints(info, spec.measure_steps):
            out.append(Measured(ck, model_row(self.measure(ck, mspec), experiment, language, spec)))
        return info, out

    def _config_of(self, checkpoint: Path):
        run = Path(checkpoint).parent.parent
        return self.plan.paths[str(run)]

    def measure(self, checkpoint, spec) -> dict:
        cfg = self._config_of(checkpoint)
        into = self.plan.embedded.get(str(Path(checkpoint).parent.parent))
        self.plan.measures.append(PlannedMeasure(cfg.name, cfg, spec, into))
        return _AnyRow(step=int(re.search(r"(\d+)$", Path(checkpoint).name).group(1)))

    def reference(self, kind, cfg, spec) -> dict:
        if kind == "random-init":  # a forward of the initial model; the others need none
            self.plan.measures.append(PlannedMeasure(kind, cfg, spec))
        return _AnyRow()

    def lookup(self, run, spec) -> dict:
        return self.reference("lookup-table", run.config, spec)

    def embed(self, checkpoint, into=None, *, width_factor=None, extra_layers=0, optimizer="fresh"):
        """``Study.embed``'s checkpoint, planned: the large model's config (the shape
        ``sameloss embed`` would write) under the embedded folder's name."""
        from ..training.checkpoint import checkpoint_dir

        cfg = self._config_of(checkpoint)
        step = int(re.search(r"(\d+)$", Path(checkpoint).name).group(1))
        large = dataclasses.replace(cfg, model=_embedded_model(cfg, self.language_shapes, into, width_factor,
                                                               extra_layers), steps=step,
                                    checkpoints=tuple(s for s in cfg.checkpoints if s <= step))
        shape = into or f"w{width_factor or 1}+{extra_layers}"
        out = self.root / "embedded" / f"{Path(checkpoint).parent.parent.name}-step{step}-into-{shape}"
        self.plan.paths[str(out)] = large
        self.plan.embedded[str(out)] = into or f"{cfg.model.size}-{shape}"
        return checkpoint_dir(out, step)

    def seed_units(self, work, seeds, *args, group: str = ""):
        from .core import Study

        return Study.seed_units(self, work, seeds, *args, group=group)  # the same units (it reads no state)

    def run_units(self, units):
        for u in units:
            if u.name not in self.done:
                self.done[u.name] = self.plan.execute(u, self)
        return [self.done[u.name] for u in units]

    def map_seeds(self, work, seeds, *args, group: str = ""):
        return self.run_units(self.seed_units(work, seeds, *args, group=group))


class _AnyRow(dict):
    """A measured row before anything is measured: every column reads 0."""

    def __missing__(self, key):
        return 0.0


@dataclass
class Plan:
    experiment: str
    scale: str
    root: Path
    runs: list[PlannedRun] = field(default_factory=list)
    measures: list[PlannedMeasure] = field(default_factory=list)
    paths: dict[str, Any] = field(default_factory=dict)
    embedded: dict[str, str] = field(default_factory=dict)
    language_shapes: dict[str, tuple[int, int]] = field(default_factory=dict)
    recipe: Any = None

    def execute(self, unit, parent: DryStudy):
        import unittest.mock

        study = parent if not unit.study else DryStudy(self.root / unit.study,
                                                       parent.seed if unit.seed is None else unit.seed, self,
                                                       unit.study)
        # a recipe that picks checkpoints from its runs' exact-KL history reads a flat one;
        # one that gates its forks on measured headroom is planned as if every seed passed
        stand_ins = {"eval_history": self._flat_history, "headroom_gate": _gate_passes}
        with contextlib.ExitStack() as stack:
            for name, stand_in in stand_ins.items():
                if hasattr(self.recipe, name):
                    stack.enter_context(unittest.mock.patch.object(self.recipe, name, stand_in))
            return unit.work(study, *unit.args)

    def _flat_history(self, run_dir) -> dict:
        return {s: {"kl": 0.0} for s in self.paths[str(run_dir)].evaluation_steps()}


def _gate_passes(*args, **kwargs) -> tuple[bool, str]:
    return True, "planned: the headroom gate is assumed to pass"


def dry_plan(experiment: str, scale: str, out: str | Path = "runs", seed: int = 0,
             languages: list[str] | None = None, preset=None, budget: float | None = None) -> Plan:
    """The runs and measures of ``experiment`` at ``scale`` (module docstring; ``languages``:
    ``--language`` specs; ``preset``: plan this preset instead of the scale's; ``budget``:
    ``--budget`` minutes), nothing written."""
    from . import SCALE_NAMES, on_languages
    from .. import registry
    from .core import experiment_dir_name, merge_units

    recipe = registry.recipe(experiment)
    if scale not in recipe.PRESETS:
        raise UserError(f"unknown scale {scale!r}; choose from {', '.join(recipe.PRESETS) or ', '.join(SCALE_NAMES)}")
    from . import on_budget

    p = on_budget(recipe, experiment, on_languages(recipe, experiment, preset or recipe.PRESETS[scale], languages),
                  budget)
    suffix = getattr(recipe, "folder_suffix", lambda _: "")(p)
    plan = Plan(experiment, scale, Path(out) / (experiment_dir_name(experiment, scale, seed) + suffix), recipe=recipe)
    study = DryStudy(plan.root, seed, plan)
    make = getattr(recipe, "plan_units", None) or getattr(recipe, "units", None)
    if make is None:
        raise UserError(f"{experiment} declares no units: the planner cannot list its runs")
    while True:  # stage by stage, as reproduce runs them (a recipe may declare more units after the first)
        todo = [u for u in merge_units(make(study, p)) if u.name not in study.done]
        if not todo:
            return plan
        study.run_units(todo)


# ---- FLOPs ------------------------------------------------------------------------------
@dataclass(frozen=True)
class ModelShape:
    kind: str
    vocab: int
    max_len: int
    d_model: int
    n_layers: int
    d_inter: int = 0
    d_hidden: int = 0
    n_params: int = 0
    mlm_head_transform: bool = True


def forward_flops_per_token(m: ModelShape) -> float:
    """FLOPs of one forward pass per input token (module docstring: what is counted)."""
    d, T = m.d_model, m.max_len
    if m.kind == "lstm":
        h = m.d_hidden
        layers = 2 * 4 * h * (d + h) + 2 * 4 * h * (h + h) * (m.n_layers - 1)
        return layers + 2 * (h * d if h != d else 0) + 2 * m.vocab * d
    per_layer = 2 * (4 * d * d + 2 * d * m.d_inter) + 4 * T * d
    head = 2 * (d * d if m.mlm_head_transform else 0) + 2 * m.vocab * d
    return m.n_layers * per_layer + head


def model_shape(cfg, language_shapes: dict) -> ModelShape:
    """The shape of ``cfg``'s model: its language's vocabulary and length (the language is
    built — cheap for the synthetic ones; a corpus not prepared yet reads the recipe's
    planned shape) and the named size with its overrides."""
    from ..models import build_model
    import torch

    vocab, max_len = _language_shape(cfg, language_shapes)
    overrides = {"dropout": 0.0, **cfg.model.shape_overrides()}
    with torch.device("meta"):
        model = build_model(cfg.model.kind, cfg.model.size, vocab, max_len, **overrides)
    c = model.config if hasattr(model, "config") else model.cfg
    n = sum(p.numel() for p in model.parameters())
    if cfg.model.kind == "lstm":
        return ModelShape("lstm", vocab, max_len, c.d_model, c.n_layers, d_hidden=c.d_hidden, n_params=n)
    return ModelShape("transformer", vocab, max_len, c.d_model, c.n_layers, c.d_inter, n_params=n,
                      mlm_head_transform=getattr(c, "mlm_head_transform", True))


def _embedded_model(cfg, language_shapes: dict, into: str | None, width_factor: int | None, extra_layers: int):
    """The ``ModelConfig`` ``sameloss embed`` gives ``cfg``'s model embedded ``into`` a
    size or ``width_factor``× wider with ``extra_layers`` more blocks (built on the meta
    device: no weights)."""
    from ..models import build_model
    from ..models.embed import check_embeddable, embedded_config, target_plan
    from ..training.embed_io import embedded_model_config
    import torch

    vocab, max_len = _language_shape(cfg, language_shapes)
    with torch.device("meta"):
        small = build_model(cfg.model.kind, cfg.model.size, vocab, max_len, **cfg.model.shape_overrides())
    plan, name = target_plan(check_embeddable(small), into, width_factor, extra_layers)
    return embedded_model_config(cfg.model, embedded_config(small.config, plan), name)


_LANGUAGES: dict = {}


def _language_shape(cfg, language_shapes: dict) -> tuple[int, int]:
    lc = cfg.language
    if lc.data is not None and str(lc.data) in language_shapes:
        return language_shapes[str(lc.data)]
    key = repr(lc)
    if key not in _LANGUAGES:
        from ..training.runio import build_language

        language = build_language(dataclasses.replace(cfg, device="cpu"))
        _LANGUAGES[key] = (language.vocab_size, language.max_len)
    return _LANGUAGES[key]


def training_flops(cfg, m: ModelShape, start_step: int = 0) -> tuple[int, float]:
    """(steps trained, FLOPs) of one run."""
    steps = max(0, cfg.steps - start_step)
    per_step = 3 * forward_flops_per_token(m) * cfg.batch_size * m.max_len
    if cfg.adversarial.weight > 0:
        per_step += 3 * forward_flops_per_token(m) * cfg.adversarial.batch_size * m.max_len
    return steps, steps * per_step


def training_evaluations(cfg, start_step: int = 0) -> int:
    """The exact-KL evaluations a run makes after ``start_step`` (``evaluation_steps``)."""
    return sum(1 for s in cfg.evaluation_steps() if s > start_step)


def measure_flops(spec, m: ModelShape) -> dict[str, float]:
    """FLOPs per stage of one ``MeasureSpec`` on one checkpoint (module docstring)."""
    F = forward_flops_per_token(m) * m.max_len  # one sentence forward
    out = dict.fromkeys(STAGES[1:], 0.0)
    if spec.loss:
        out["exact-KL evaluation"] += spec.loss_sentences * F
    for name in spec.traces:
        if name == "fisher":
            # one backward per distinct label drawn: at most n_labels, at most the vocabulary
            # (the worst case; a trained model's peaked conditionals repeat labels)
            contexts = spec.n_contexts * spec.repeats
            out["trace"] += contexts * F * (1 + 2 * min(spec.n_labels, m.vocab))
        else:
            out["trace"] += spec.n_probes * spec.curvature_sentences * 2 * 3 * F
    if spec.hessian_gap:
        out["trace"] += 2 * spec.gap_batches * spec.n_probes * spec.curvature_sentences * 2 * 3 * F
    if spec.top_eig:
        out["trace"] += LANCZOS_PRODUCTS * spec.curvature_sentences * 2 * 3 * F
    if spec.sharpness:
        out["trace"] += 2 * spec.curvature_sentences * 3 * F
    head = m.max_len * m.d_model  # a probe reads every position's features
    for _ in (*spec.probe, *spec.lookup):
        n = spec.task_train + spec.task_validation + spec.task_test
        out["probes"] += n * F + len(spec.seeds) * PROBE_ITERATIONS * 2 * 3 * spec.task_train * head
    for _ in spec.finetune:
        n = spec.task_train + spec.task_validation + spec.task_test
        out["probes"] += n * F + len(spec.seeds) * spec.finetune_epochs * spec.task_train * 3 * F
    if spec.fewshot is not None:
        out["probes"] += (spec.fewshot.pool + spec.fewshot.test) * F
    if spec.count_regression is not None:
        out["probes"] += (spec.count_regression.pool + spec.count_regression.n_test) * F
    return out


# ---- memory -----------------------------------------------------------------------------
def _meta_config(cfg, m: ModelShape):
    from ..models import lstm_config, transformer_config

    overrides = {"dropout": 0.0, **cfg.model.shape_overrides()}
    if cfg.model.kind == "lstm":
        return lstm_config(cfg.model.size, m.vocab, m.max_len, **overrides)
    return transformer_config(cfg.model.size, m.vocab, m.max_len, attn_dropout=0.0, **overrides)


def training_peak_bytes(cfg, m: ModelShape) -> int:
    """One AdamW step of ``cfg``'s model at its batch (``memory.training_step_bytes``)."""
    from ..measures.curvature.memory import training_step_bytes

    return training_step_bytes(_meta_config(cfg, m), cfg.batch_size)


def forward_peak_bytes(cfg, m: ModelShape, sentences: int) -> int:
    from ..measures.curvature.memory import forward_bytes

    return forward_bytes(_meta_config(cfg, m), sentences)


def measure_peaks(cfg, m: ModelShape, spec) -> dict[str, int]:
    """Peak device bytes of each measure of ``spec`` (``memory.peak_bytes`` for curvature)."""
    from ..measures.curvature.memory import peak_bytes

    mc = _meta_config(cfg, m)
    out = {}
    if spec.loss:
        out["exact KL"] = forward_peak_bytes(cfg, m, min(1024, spec.loss_sentences))
    for name in spec.traces:
        if name == "fisher":
            out["trace fisher"] = peak_bytes("trace_fisher", mc, {"n_labels": spec.n_labels}).bytes
        else:
            out[f"trace {name}"] = peak_bytes(f"trace_{name}", mc, {
                "n_sentences": spec.curvature_sentences, "n_probes": spec.n_probes,
                "micro_batch": spec.micro_batch}).bytes
    if spec.hessian_gap:
        out["hessian gap"] = peak_bytes("trace_hutchinson", mc, {"n_sentences": spec.curvature_sentences,
                                                                 "n_probes": spec.n_probes}).bytes
    if spec.top_eig:
        out["top eigenvalue"] = peak_bytes("top_eigenvalue", mc, {"n_sentences": spec.curvature_sentences,
                                                                  "basis_size": spec.lanczos_basis,
                                                                  "micro_batch": spec.micro_batch}).bytes
    if spec.sharpness:
        out["sam sharpness"] = peak_bytes("sam_sharpness", mc, {"n_sentences": spec.curvature_sentences}).bytes
    if spec.probe or spec.finetune or spec.lookup or spec.fewshot or spec.count_regression:
        out["probe features"] = forward_peak_bytes(cfg, m, 512)
    return out


# ---- the device -------------------------------------------------------------------------
def measure_cpu_peak(size: int = 512, seconds: float = 0.3) -> float:
    """This machine's float32 matmul FLOP/s per CPU second with torch's threads: the best of
    repeated ``size``×``size`` products over about ``seconds`` of process CPU time. CPU time,
    not wall time: on a shared machine the wall clock measures the other processes too, and
    the plan is of a machine the study has to itself."""
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


def peaks(device: str, cpu_peak: float | None) -> dict[str, float]:
    if device == "cpu":
        p = cpu_peak if cpu_peak is not None else measure_cpu_peak()
        return {"bf16": p, "fp32": p}
    return DEVICES[device]


# ---- the estimate -----------------------------------------------------------------------
@dataclass
class Estimate:
    plan: Plan
    device: str
    workers: int
    peak: dict[str, float]
    runs: list[dict]
    measures: list[dict]
    stages: dict[str, dict[str, float]]  # stage -> {flops, seconds}
    unit_seconds: list[float]

    @property
    def seconds(self) -> float:
        return sum(s["seconds"] for s in self.stages.values())

    @property
    def wall(self) -> float:
        """The study's wall time on ``workers`` devices: its units shared out longest first."""
        loads = [0.0] * self.workers
        for t in sorted(self.unit_seconds, reverse=True):
            loads[loads.index(min(loads))] += t
        return max(loads)


def estimate(plan: Plan, device: str, workers: int = 1, cpu_peak: float | None = None,
             memory: bool = True) -> Estimate:
    peak = peaks(device, cpu_peak)
    util = UTILISATION[device]
    rates = {"training": peak["bf16"] * util["training"],
             **{s: peak["fp32"] * util[s] for s in STAGES[1:]}}
    stages = {s: {"flops": 0.0, "seconds": 0.0} for s in STAGES}
    shapes: dict = {}
    per_study: dict = {}
    runs, measures = [], []
    mem_cache: dict = {}

    def shape(cfg):
        key = (repr(cfg.language), repr(cfg.model))
        if key not in shapes:
            shapes[key] = model_shape(cfg, plan.language_shapes)
        return shapes[key]

    def add(stage, flops, study, floor=0.0) -> float:
        seconds = max(flops / rates[stage], floor)
        stages[stage]["flops"] += flops
        stages[stage]["seconds"] += seconds
        per_study[study] = per_study.get(study, 0.0) + seconds
        return seconds

    for r in plan.runs:
        m = shape(r.config)
        steps, flops = training_flops(r.config, m, r.start_step)
        evals = training_evaluations(r.config, r.start_step)
        eval_flops = evals * r.config.eval.n_sentences * forward_flops_per_token(m) * m.max_len
        seconds = add("training", flops, r.study or r.name, steps * STEP_FLOOR_S[device])
        seconds += add("exact-KL evaluation", eval_flops, r.study or r.name)
        key = ("train", repr(r.config.model), r.config.batch_size, m.vocab, m.max_len)
        if memory and key not in mem_cache:
            mem_cache[key] = training_peak_bytes(r.config, m)
        runs.append({"run": r.name, "study": r.study, "model": _model_name(r.config, m), "parameters": m.n_params,
                     "steps": steps, "batch": r.config.batch_size, "flops": flops, "evaluations": evals,
                     "peak_bytes": mem_cache.get(key), "seconds": seconds})
    for ms in plan.measures:
        m = shape(ms.config)
        flops = measure_flops(ms.spec, m)
        study = next((r.study for r in plan.runs if r.name == ms.run), "") or ms.run
        seconds = sum(add(stage, f, study) for stage, f in flops.items())
        key = ("measure", repr(ms.config.model), m.vocab, m.max_len, _spec_key(ms.spec))
        if memory and key not in mem_cache:
            mem_cache[key] = measure_peaks(ms.config, m, ms.spec)
        measures.append({"run": ms.run, "model": ms.embedded_into or _model_name(ms.config, m), "flops": flops,
                         "peaks": mem_cache.get(key, {}), "seconds": seconds})
    # the units of a study: its seeds' chains (one each), else its runs
    return Estimate(plan, device, workers, peak, runs, measures, stages, list(per_study.values()))


def _model_name(cfg, m: ModelShape) -> str:
    """The size's name, or its shape where the recipe changes it (``d64-L2``)."""
    return cfg.model.size if not cfg.model.shape_overrides() else f"d{m.d_model}-L{m.n_layers}"


def device_memory(device: str) -> int:
    """The device's memory: the GPU's, or this machine's RAM for cpu."""
    if device == "cpu":
        import os

        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return int(DEVICES[device]["memory"])


def _spec_key(spec) -> str:
    """What a measure's peak memory depends on: its settings, not its seeds (a study that draws
    each seed's probe subsets with the seed has one memory estimate, not one per seed)."""
    d = dataclasses.asdict(spec)
    d.pop("seed", None)
    d.pop("device", None)
    if isinstance(d.get("fewshot"), dict):
        d["fewshot"] = {k: v for k, v in d["fewshot"].items() if k != "seed"}
    return repr(sorted(d.items()))


# ---- the text ---------------------------------------------------------------------------
def _si(x: float, unit: str = "") -> str:
    for factor, prefix in ((1e18, "E"), (1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= factor:
            return f"{x / factor:.3g} {prefix}{unit}"
    return f"{x:.3g} {unit}"


def _bytes(b: int | None) -> str:
    if b is None:
        return "-"
    return f"{b / 2**30:.2f} GiB" if b >= 2**30 else f"{b / 2**20:.1f} MiB"


def _duration(s: float) -> str:
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    if s < 3 * 86400:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.1f} days"


def format_plan(e: Estimate) -> str:
    p = e.plan
    lines = [f"plan: {p.experiment} --scale {p.scale} on {e.device}"
             + (f" ({e.workers} workers)" if e.workers > 1 else "") + " — nothing is run or written"]
    if e.device == "cpu":
        lines.append(f"device: this CPU, float32 matmul peak {_si(e.peak['fp32'], 'FLOP/s')} (measured now with "
                     "the threads torch uses; --cpu-peak overrides)")
    else:
        lines.append(f"device: {e.device}, published dense peaks bf16 {_si(e.peak['bf16'], 'FLOP/s')} (training), "
                     f"fp32 {_si(e.peak['fp32'], 'FLOP/s')} (evaluation, traces, probes); memory "
                     f"{_bytes(int(DEVICES[e.device]['memory']))}")
    total_steps = sum(r["steps"] for r in e.runs)
    lines.append(f"runs: {len(e.runs)}, {total_steps} training steps, {_si(e.stages['training']['flops'], 'FLOP')} "
                 f"of training; {len(e.measures)} measured checkpoints or references")
    lines.append("")
    lines.append(f"{'run':<34} {'model':<8} {'params':>8} {'steps':>7} {'batch':>6} {'train FLOPs':>12} "
                 f"{'evals':>5} {'peak memory':>12}")
    for r in e.runs:
        name = f"{r['study']}/{r['run']}" if r["study"] else r["run"]
        lines.append(f"{name:<34} {r['model']:<8} {_si(r['parameters']):>8} {r['steps']:>7} {r['batch']:>6} "
                     f"{_si(r['flops']):>12} {r['evaluations']:>5} {_bytes(r['peak_bytes']):>12}")
    limit = device_memory(e.device)
    over = [r for r in e.runs if (r["peak_bytes"] or 0) > limit]
    if over:
        lines.append(f"warning: {len(over)} run(s) need more than the device's {_bytes(limit)} at their batch (largest "
                     f"{_bytes(max(r['peak_bytes'] for r in over))}, float32 activations; bf16 autocast about halves "
                     "those): split the batch over devices or lower batch_size")
    lines.append("")
    lines.append("peak memory per measure (one checkpoint; the largest model measured with each):")
    worst: dict[str, tuple[int, str]] = {}
    for ms in e.measures:
        for what, b in ms["peaks"].items():
            if what not in worst or b > worst[what][0]:
                worst[what] = (b, ms["model"])
    for what, (b, model) in worst.items():
        lines.append(f"  {what:<16} {_bytes(b):>12}  ({model})")
    if not worst:
        lines.append("  (none)")
    lines.append("")
    util = UTILISATION[e.device]
    lines.append(f"{'stage':<22} {'FLOPs':>12} {'utilisation':>11} {'time':>10}")
    for s in STAGES:
        lines.append(f"{s:<22} {_si(e.stages[s]['flops']):>12} {util[s]:>10.0%} "
                     f"{_duration(e.stages[s]['seconds']):>10}")
    lines.append(f"{'total':<22} {_si(sum(v['flops'] for v in e.stages.values())):>12} {'':>11} "
                 f"{_duration(e.seconds):>10}")
    if e.workers > 1:
        lines.append(f"wall time with {e.workers} workers (units shared out, longest first): {_duration(e.wall)}")
    lines.append("")
    floor = STEP_FLOOR_S[e.device]
    lines.append(f"utilisation: {UTILISATION_SOURCE[e.device]}"
                 + (f"; a training step takes at least {floor * 1e3:g} ms (kernel launches, assumed)" if floor else "")
                 + ". Not counted: data generation, the exact "
                 "conditionals, element-wise work, start-up; memory leaves out the allocator's slack (budget 1.5x).")
    return "\n".join(lines)


def plan_text(experiment: str, scale: str, device: str, workers: int = 1, cpu_peak: float | None = None,
              out: str | Path = "runs", seed: int = 0, languages: list[str] | None = None,
              budget: float | None = None) -> str:
    if device not in UTILISATION:
        raise UserError(f"unknown device {device!r}; choose from {', '.join(UTILISATION)}")
    text = format_plan(estimate(dry_plan(experiment, scale, out, seed, languages, budget=budget), device, workers,
                                cpu_peak))
    forecast = getattr(_recipe(experiment), "forecast", None)
    if budget is not None and forecast is not None:
        from . import on_budget, on_languages

        recipe = _recipe(experiment)
        p = on_budget(recipe, experiment, on_languages(recipe, experiment, recipe.PRESETS[scale], languages), budget)
        text += "\n\n" + forecast(p, device, workers, cpu_peak)
    return text


def _recipe(experiment: str):
    from .. import registry

    return registry.recipe(experiment)
