"""What a study costs before it runs (``sameloss plan``): runs, steps, FLOPs, peak memory
and wall time per stage.

The runs and measures are the recipe's own: the engine walks its declaration
(``units(setup, preset)``, ``declare.py``) as ``reproduce`` does, with the ``Record`` actor,
which records every run a unit would train (``RunSpec.config()``: model, batch, steps,
evaluation, checkpoints; a fork's start) and every row it would measure, with which
``MeasureSpec`` — each once, as ``reproduce`` measures it once and then reads its cache —
and writes nothing (no folder, no lock; data a recipe must prepare first is planned by the
recipe's ``setup.data`` stand-in, e.g. ``text``'s corpus). A gate is assumed to pass
(every seed's forks are planned); a stage declared from an earlier one's results
(isoloss's seeds after its pilot) is declared from what the recipe offers for planning
(``declare.Later.plan``: the preset's prior paired SDs).

FLOPs: a forward pass per token of a full-length padded sentence is the model kind's count
(``forward_flops_per_token``: ``models.kind.ModelKind.flops_per_token``, e.g. the
transformer's in ``models/transformer.py``; element-wise work is not counted). A training
step is 3× its forward (the backward is 2×); SAM splits the batch into its ascent and
update halves (the same total); the adversarial objective adds a forward and backward over
its own batch; a flatness penalty its measured cost: each treatment's ``step_forwards``
(``training.config``). Stages: ``training`` (the steps each run trains; a fork that continues a
checkpoint only the steps after it) and ``exact-KL evaluation`` (the held-out forward
passes during training: every ``eval.every`` steps, at the end and — with
``eval.at_checkpoints`` — at every kept checkpoint); each measure of a checkpoint adds its
own count to its own stage (``Measure.flops`` and ``Measure.stage``, ``measures/builtin/``:
the loss to ``exact-KL evaluation``, curvature to ``trace``, task probes and fine-tuning
to ``probes``).

Time = FLOPs / (peak × utilisation); on a GPU a training step takes at least
``STEP_FLOOR_S`` (a small model is bound by kernel launches, not FLOP/s). Peaks: cpu is
this machine's float32 matmul rate with the threads each worker runs, measured when the planner
runs (``hardware.measure_cpu_peak``; ``--cpu-peak`` overrides); GPUs are NVIDIA's published dense
peaks (``hardware.DEVICES``). Utilisations are in ``hardware.UTILISATION``, one row per device and stage,
with where each number comes from. ``plan_report`` writes the text.

Memory: training is one step of the model on the meta device (``measures.curvature.memory``'s
``StorageTracker``: activations, gradients and the optimiser state, AdamW two moments, plus
the weights; float32 activations, so a bf16 run needs less), compared with the device's
memory (a warning line names the runs that do not fit); each measure states its own peak
(``Measure.peaks``: a curvature measure's ``memory.peak_bytes``, at the micro-batch it
would pick on the planned device; the exact-KL evaluation and probe features one forward
chunk without gradients, traced the same way).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import layout
from .declare import Checkpoint, Embedded, Reference, with_setting
from .hardware import STAGES, STEP_FLOOR_S, UTILISATION, ensemble_floor, measure_limit, peaks

# ---- the plan: the engine's walk, recorded ---------------------------------------------------
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


@dataclass
class Plan:
    experiment: str
    scale: str
    root: Path
    runs: list[PlannedRun] = field(default_factory=list)
    measures: list[PlannedMeasure] = field(default_factory=list)
    language_shapes: dict[str, tuple[int, int]] = field(default_factory=dict)
    trained: dict = field(default_factory=dict)  # (study, run) -> RunInfo, as planned
    measured: set = field(default_factory=set)  # (study, measure key): a row is measured once


class Record:
    """The actor of ``sameloss plan`` (``engine.walk``): each run a unit would train and
    each row it would measure, recorded once (a row ``reproduce`` takes from its cache is
    not measured twice); a gate passes; nothing is written."""

    def __init__(self, plan: Plan, study: str):
        self.plan, self.study = plan, study
        self.root = plan.root / study

    def bar(self, items: list, record):
        return items

    def _info(self, run: str):
        return self.plan.trained[(self.study, run)]

    def _step(self, at) -> int:
        """The step of a checkpoint (its run's last when not given)."""
        of = at.of if isinstance(at, Embedded) else at
        return of.step or self._info(of.run).config.steps

    def _resolved(self, at):
        """A checkpoint with its step."""
        if isinstance(at, Embedded):
            return dataclasses.replace(at, of=self._resolved(at.of))
        return Checkpoint(at.run, self._step(at))

    def path(self, at, record=None) -> Path:
        """The folder the checkpoint ``at`` would be in (an embedded one: where it would be written)."""
        from ...training.checkpoint import checkpoint_dir

        if isinstance(at, Embedded):
            return checkpoint_dir(layout.embedded_dir(self.root, at.folder(at.of.run, self._step(at))), self._step(at))
        return checkpoint_dir(layout.run_dir(self.root, at.run), self._step(at))

    def train(self, run, record):
        from .runspec import RunInfo
        from .walk import start_spec

        key = (self.study, run.name)
        if key not in self.plan.trained:
            spec = start_spec(run, self, record)
            cfg = spec.config()
            start = self._step(run.start) if run.start is not None and cfg.init_step == "continue" else 0
            self.plan.runs.append(PlannedRun(run.name, self.study, cfg, start))
            self.plan.trained[key] = RunInfo(spec, cfg, layout.run_dir(self.root, run.name), "planned", 0.0, {})
        return self.plan.trained[key]

    def measure(self, m, record) -> dict:
        from .walk import measure_key

        # one checkpoint named by its step or as its run's last is one row
        at = m.of if isinstance(m.of, Reference) else self._resolved(m.of)
        key = (self.study, measure_key(dataclasses.replace(m, of=at)))
        if key in self.plan.measured:
            return {}
        if isinstance(m.of, Reference):
            if m.of.kind == "random-init":  # a forward of the initial model; the others need none
                self.plan.measures.append(PlannedMeasure(m.of.kind, self._info(m.of.run).config, m.spec))
        elif isinstance(m.of, Embedded):
            cfg, step = self._info(m.of.of.run).config, self._step(m.of)
            large = dataclasses.replace(cfg, model=_embedded_model(cfg, self.plan.language_shapes, m.of), steps=step,
                                        checkpoints=tuple(s for s in cfg.checkpoints if s <= step))
            self.plan.measures.append(PlannedMeasure(cfg.name, large, m.spec, m.of.into or
                                                     f"{cfg.model.size}-{m.of.shape}"))
        else:
            cfg = self._info(m.of.run).config
            self.plan.measures.append(PlannedMeasure(cfg.name, cfg, m.spec))
        self.plan.measured.add(key)
        return {}

    def gate(self, gate, rows) -> tuple[bool, str]:
        return True, f"planned: the {gate.name} gate is assumed to pass"


def dry_plan(experiment: str, scale: str, out: str | Path = "runs", seed: int = 0,
             languages: list[str] | None = None, preset=None, budget: float | None = None,
             dropout_draws: str = "global") -> Plan:
    """The runs and measures of ``experiment`` at ``scale`` (module docstring; ``languages``:
    ``--language`` specs; ``preset``: plan this preset instead of the scale's; ``budget``:
    ``--budget`` minutes), nothing written: the engine walks the recipe's declaration with
    the ``Record`` actor, and a later stage is declared from what the recipe offers for
    planning (``declare.Later.plan``)."""
    from .walk import Setup, run_stages, walk
    from .recipe import load_recipe

    recipe = load_recipe(experiment)
    p = recipe.preset(scale, languages, budget, base=preset)
    plan = Plan(experiment, scale, layout.experiment_dir(out, experiment, scale, seed, recipe.folder_suffix(p),
                                                         dropout_draws))
    setup = Setup(plan.root, seed, lambda msg: None, planning=True)
    plan.language_shapes = setup.language_shapes

    def record(units):
        if dropout_draws != "global":  # as dispatch.run_units sets it (``--dropout-draws``)
            units = with_setting(units, "dropout_draws", dropout_draws)
        return [walk(u, Record(plan, u.study)) for u in units]

    run_stages(recipe.units(setup, p), record, lambda later, records: later.plan(setup, *later.args), log=setup.log)
    return plan


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

    @property
    def sentence_flops(self) -> float:
        """One full-length sentence's forward pass (what the measures count in)."""
        return forward_flops_per_token(self) * self.max_len


def forward_flops_per_token(m: ModelShape) -> float:
    """FLOPs of one forward pass per input token: the model kind's count
    (``models.kind.ModelKind.flops_per_token``; the module docstring says what is counted)."""
    from ...models import model_kind

    return model_kind(m.kind).flops_per_token(m)


def model_shape(cfg, language_shapes: dict) -> ModelShape:
    """The shape of ``cfg``'s model: its language's vocabulary and length (the language is
    built — cheap for the synthetic ones; a corpus not prepared yet reads the recipe's
    planned shape) and the named size with its overrides."""
    from ...models import build_model
    import torch

    vocab, max_len = _language_shape(cfg, language_shapes)
    overrides = {"dropout": 0.0, **cfg.model.shape_overrides()}
    with torch.device("meta"):
        model = build_model(cfg.model.kind, cfg.model.size, vocab, max_len, **overrides)
    c = model.config
    n = sum(p.numel() for p in model.parameters())
    return ModelShape(cfg.model.kind, vocab, max_len, c.d_model, c.n_layers, getattr(c, "d_inter", 0),
                      getattr(c, "d_hidden", 0), n, getattr(c, "mlm_head_transform", True))


def _embedded_model(cfg, language_shapes: dict, target: Embedded):
    """The ``ModelConfig`` ``sameloss embed`` gives ``cfg``'s model embedded as ``target``
    says (built on the meta device: no weights)."""
    from ...models import build_model
    from ...models.embed import check_embeddable, embedded_config, target_plan
    from ...training.embed_io import embedded_model_config
    import torch

    vocab, max_len = _language_shape(cfg, language_shapes)
    with torch.device("meta"):
        small = build_model(cfg.model.kind, cfg.model.size, vocab, max_len, **cfg.model.shape_overrides())
    plan, name = target_plan(check_embeddable(small), target.into, target.width_factor, target.extra_layers)
    return embedded_model_config(cfg.model, embedded_config(small.config, plan), name)


_LANGUAGES: dict = {}


def _language_shape(cfg, language_shapes: dict) -> tuple[int, int]:
    lc = cfg.language
    if lc.data is not None and str(lc.data) in language_shapes:
        return language_shapes[str(lc.data)]
    key = repr(lc)
    if key not in _LANGUAGES:
        from ...training.runio import build_language

        language = build_language(dataclasses.replace(cfg, device="cpu"))
        _LANGUAGES[key] = (language.vocab_size, language.max_len)
    return _LANGUAGES[key]


def training_flops(cfg, m: ModelShape, start_step: int = 0) -> tuple[int, float]:
    """(steps trained, FLOPs) of one run."""
    steps = max(0, cfg.steps - start_step)
    # ``update_half``: the update on one half of the batch (SAM's control); SAM itself runs both
    # halves (ascent and update), the whole batch
    batch = cfg.batch_size // 2 if getattr(cfg, "update_half", False) else cfg.batch_size
    per_step = 3 * forward_flops_per_token(m) * batch * m.max_len
    # each treatment declares what it adds to a step (``step_forwards``: sentence forwards)
    extra = sum(t.step_forwards(cfg.batch_size, m.vocab) for t in cfg.treatments())
    return steps, steps * (per_step + extra * m.sentence_flops)


def training_evaluations(cfg, start_step: int = 0) -> int:
    """The exact-KL evaluations a run makes after ``start_step`` (``evaluation_steps``)."""
    return sum(1 for s in cfg.evaluation_steps() if s > start_step)


def measure_flops(spec, m: ModelShape) -> dict[str, float]:
    """FLOPs per stage of one ``MeasureSpec`` on one checkpoint: each measure's own count
    (``Measure.flops``, in its ``stage``; ``measures/builtin/`` says what each counts)."""
    from ...measures.spec import measures_of

    out = dict.fromkeys(STAGES[1:], 0.0)
    for measure in measures_of(spec):
        out[measure.stage] += measure.flops(spec, m)
    return out


# ---- memory -----------------------------------------------------------------------------
def _meta_config(cfg, m: ModelShape):
    """The model config of ``cfg`` at its language's shape, without dropout (what the
    memory estimates build on the meta device)."""
    from ...models import model_kind

    kind = model_kind(cfg.model.kind)
    overrides = {field: 0.0 for field in kind.dropout_fields}
    return kind.config(cfg.model.size, m.vocab, m.max_len, **overrides, **cfg.model.shape_overrides())


def training_peak_bytes(cfg, m: ModelShape) -> int:
    """One AdamW step of ``cfg``'s model at its batch (``memory.training_step_bytes``)."""
    from ...measures.curvature.memory import training_step_bytes

    return training_step_bytes(_meta_config(cfg, m), cfg.batch_size)


def forward_peak_bytes(cfg, m: ModelShape, sentences: int) -> int:
    from ...measures.curvature.memory import forward_bytes

    return forward_bytes(_meta_config(cfg, m), sentences)


def measure_peaks(cfg, m: ModelShape, spec, limit: int = 0) -> dict[str, int]:
    """Peak device bytes of each part of each measure of ``spec`` (``Measure.peaks``; the
    curvature measures' are ``memory.peak_bytes``); ``limit``: the device memory a measure
    may plan to use (a Hessian measure's default micro-batch is sized to it)."""
    from ...measures.spec import MemoryContext, measures_of

    memory = MemoryContext(_meta_config(cfg, m), cfg, m, lambda n: forward_peak_bytes(cfg, m, n), limit)
    out: dict[str, int] = {}
    for measure in measures_of(spec):
        out.update(measure.peaks(spec, memory))
    return out


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
    ensemble: int | None = None  # --ensemble N (each run's ``members``: its ensemble's size)

    @property
    def seconds(self) -> float:
        return sum(s["seconds"] for s in self.stages.values())

    def training_utilisation(self) -> float:
        """The share of the training peak the planned training reaches: the stage's
        utilisation, or much less where the step floor (``STEP_FLOOR_S``) sets the time."""
        seconds = self.stages["training"]["seconds"]
        return self.stages["training"]["flops"] / (seconds * self.peak["bf16"]) if seconds > 0 else 0.0

    def fill(self) -> int:
        """Models per launch that would fill the card (``UTILISATION``'s training share): the
        FLOP time of one step of a launch-bound run against its step floor — the members of
        an ensemble trained as one computation, or about as many processes if they scaled
        (they do not: ``STEP_FLOOR_S``'s measurement). 1 where no run is launch-bound."""
        bound = [r for r in self.runs if r["launch_bound"]]
        if not bound:
            return 1
        rate = self.peak["bf16"] * UTILISATION[self.device]["training"]
        per_step = sorted(r["flops"] / r["steps"] / rate for r in bound if r["steps"])
        return max(1, int(STEP_FLOOR_S[self.device] / per_step[len(per_step) // 2]))

    @property
    def wall(self) -> float:
        """The study's wall time on ``workers`` devices: its units shared out longest first."""
        return longest_first(self.unit_seconds, self.workers)


def longest_first(unit_seconds, workers: int) -> float:
    """The wall time of units taking ``unit_seconds`` shared out longest first over
    ``workers`` (each to the least loaded), as a launcher's workers take them: five equal
    units on 2 workers take 3 units' time, not 2.5."""
    loads = [0.0] * max(workers, 1)
    for t in sorted(unit_seconds, reverse=True):
        loads[loads.index(min(loads))] += t
    return max(loads)


def ensemble_sizes(runs: list[PlannedRun], device: str, cap: int | None) -> list[int]:
    """Per planned run, the members of the ensemble the engine would train it in under
    ``--ensemble cap`` (1: alone): runs of one ``ensemble_key`` and first step, ``cap`` at a
    time, those the device's strategy can batch (a GPU's: no global-RNG dropout)."""
    if not cap or cap < 2:
        return [1] * len(runs)
    from ...training.ensemble import batchable, ensemble_key

    strategy = "loop" if device == "cpu" else "vmap"
    groups: dict[tuple, list[int]] = {}
    for i, r in enumerate(runs):
        if batchable(r.config, strategy) is None:
            groups.setdefault((ensemble_key(r.config), r.start_step), []).append(i)
    sizes = [1] * len(runs)
    for members in groups.values():
        for k in range(0, len(members), cap):
            share = members[k:k + cap]
            for i in share:
                sizes[i] = len(share)
    return sizes


def estimate(plan: Plan, device: str, workers: int = 1, cpu_peak: float | None = None,
             memory: bool = True, ensemble: int | None = None) -> Estimate:
    """The plan's FLOPs, memory and time on ``device`` (module docstring); ``ensemble``: the
    engine's ``--ensemble`` cap (``ENSEMBLE_SOURCE`` says how an ensemble step is priced)."""
    peak = peaks(device, cpu_peak, workers)
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

    sizes = ensemble_sizes(plan.runs, device, ensemble)
    for r, members in zip(plan.runs, sizes):
        m = shape(r.config)
        steps, flops = training_flops(r.config, m, r.start_step)
        evals = training_evaluations(r.config, r.start_step)
        eval_flops = evals * r.config.eval.n_sentences * forward_flops_per_token(m) * m.max_len
        # a member's share of its ensemble's steps: the fixed part is paid once per ensemble step
        floor = steps * (ensemble_floor(device, members) if members > 1 else STEP_FLOOR_S[device])
        seconds = add("training", flops, r.study or r.name, floor)
        train_seconds = seconds
        seconds += add("exact-KL evaluation", eval_flops, r.study or r.name)
        key = ("train", repr(r.config.model), r.config.batch_size, m.vocab, m.max_len)
        if memory and key not in mem_cache:
            mem_cache[key] = training_peak_bytes(r.config, m)
        runs.append({"run": r.name, "study": r.study, "model": _model_name(r.config, m), "parameters": m.n_params,
                     "steps": steps, "batch": r.config.batch_size, "flops": flops, "evaluations": evals,
                     "peak_bytes": mem_cache.get(key), "seconds": seconds,
                     "launch_bound": floor > flops / rates["training"], "train_seconds": train_seconds,
                     "members": members})
    for ms in plan.measures:
        m = shape(ms.config)
        flops = measure_flops(ms.spec, m)
        study = next((r.study for r in plan.runs if r.name == ms.run), "") or ms.run
        seconds = sum(add(stage, f, study) for stage, f in flops.items())
        key = ("measure", repr(ms.config.model), m.vocab, m.max_len, _spec_key(ms.spec))
        if memory and key not in mem_cache:
            mem_cache[key] = measure_peaks(ms.config, m, ms.spec, measure_limit(device))
        measures.append({"run": ms.run, "model": ms.embedded_into or _model_name(ms.config, m), "flops": flops,
                         "peaks": mem_cache.get(key, {}), "seconds": seconds})
    # the units of a study: its seeds' chains (one each), else its runs
    return Estimate(plan, device, workers, peak, runs, measures, stages, list(per_study.values()), ensemble)


def _model_name(cfg, m: ModelShape) -> str:
    """The size's name, or its shape where the recipe changes it (``d64-L2``)."""
    return cfg.model.size if not cfg.model.shape_overrides() else f"d{m.d_model}-L{m.n_layers}"


def _spec_key(spec) -> str:
    """What a measure's peak memory depends on: its settings, not its seeds (a study that draws
    each seed's probe subsets with the seed has one memory estimate, not one per seed)."""
    d = dataclasses.asdict(spec)
    d.pop("seed", None)
    d.pop("device", None)
    if isinstance(d.get("fewshot"), dict):
        d["fewshot"] = {k: v for k, v in d["fewshot"].items() if k != "seed"}
    return repr(sorted(d.items()))
