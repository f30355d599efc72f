"""What a measure is, and what a caller asks of the measures (``MeasureSpec``).

A measure is one registered object (``MEASURES``, a ``registry.Registry``), a subclass of
``Measure`` that carries everything about it: whether a spec asks for it (``wanted``) and
its settings (``settings``), the checks of those settings (``validate``), the computation
on a loaded model (``compute``: the row's new columns), the columns it writes
(``columns``), its FLOPs per planner stage (``flops``) and peak device memory
(``peaks``) for ``sameloss plan``, and the memory check made before anything is
allocated (``check``). ``measures.run.measure_model``, ``experiments.plan`` and
``run.check_measure`` all loop over ``measures_of(spec)``; none knows a measure by
name.

Adding a measure is one file: a module in ``measures/builtin/`` (found there, in the
order of its ``order``; the row's columns follow it), or any module that calls
``MEASURES.add(MyMeasure())`` (a plugin: ``SAMELOSS_PLUGINS``). A built-in measure's
settings are fields of ``MeasureSpec`` (the recipes' declarations: ``MeasureSpec(loss=True,
loss_sentences=64)``); another measure's are ``spec.extra[name]`` (a dict; the measure is
wanted when its name is a key there), so a new measure needs no new field.

``MeasureSpec``'s fields are the declaration recipes write and ``measurements.json``
fingerprints (``experiments.core.spec_fingerprint``: a changed field set would measure
every cached row again), so they stay as they are; the defaults suit a CPU, the paper's
sizes in the comments.
"""

from __future__ import annotations

import importlib
import math
import pkgutil
from dataclasses import dataclass, field

from .. import registry
from ..errors import UserError
from .fewshot import CountRegression, FewShot

TRACES = ("fisher", "hutchinson", "hutchpp")  # the trace estimators of ``--trace``

# What ``sameloss plan`` counts a measure's FLOPs in (with ``training``: its stages)
EVALUATION, TRACE, PROBES = "exact-KL evaluation", "trace", "probes"
MEASURE_STAGES = (EVALUATION, TRACE, PROBES)


@dataclass(frozen=True)
class MeasureSpec:
    """What ``measure_path`` measures and at which sizes (``sameloss measure``'s flags); the
    defaults suit a CPU, the paper's sizes are in the comments of the source.

    Attributes:
        loss: the exact held-out loss = entropy + KL.
        traces: trace estimators: ``fisher`` (the paper's), ``hutchinson``, ``hutchpp``.
        trace_by: ``block``: each trace also per block (embedding, layers, head).
        top_eig: the largest Hessian eigenvalue (Lanczos).
        sharpness: SAM sharpness in a ball of radius ``rho``.
        probe: tasks to linear-probe.
        finetune: tasks to fine-tune on.
        lookup: tasks of the look-up-table baseline (a probe on the true conditionals).
        loss_sentences: held-out sentences of the exact loss.
        n_contexts: contexts of the Fisher trace.
        n_labels: labels drawn per context.
        repeats: independent sets of the Fisher trace.
        n_probes: Hessian-vector products of Hutchinson / Hutch++.
        task_train: training examples per task (validation and test: ``task_validation``,
            ``task_test``).
        probe_method: ``lbfgs`` (the exact convex solve) or ``adamw`` (the paper's).
        seeds: probe / fine-tune repeats.
        seed: of the measures' own draws.
        device: where to measure.
        extra: settings of measures without a field here, by measure name.
    """

    loss: bool = False
    traces: tuple[str, ...] = ()  # "fisher", "hutchinson", "hutchpp"
    trace_by: str | None = None  # "block": each trace also per block (embedding, layer<i>, head)
    top_eig: bool = False
    sharpness: bool = False
    probe: tuple[str, ...] = ()  # task names
    finetune: tuple[str, ...] = ()
    lookup: tuple[str, ...] = ()
    hessian_gap: bool = False  # Lemma 3.2: tr H − tr F by Hutchinson, true and model-drawn tokens
    fewshot: FewShot | None = None  # few-shot probes on views of the representation
    count_regression: CountRegression | None = None  # min-norm count heads (Dyck's Theorem 5.1)
    # sizes (paper defaults in comments; these defaults suit a CPU)
    loss_sentences: int = 2000  # paper: 10^6
    n_contexts: int = 1000  # paper: 10^4
    n_labels: int = 50  # paper: 50
    repeats: int = 5  # paper: 5
    n_probes: int = 100  # Hessian-vector products of Hutchinson / Hutch++
    lanczos_basis: int = 20  # vectors the top-eigenvalue Lanczos keeps (bounded memory)
    curvature_sentences: int = 1024  # the fixed batch of Hutchinson, eigenvalue, sharpness; the gap's batches
    # Hessian graphs held for at most this many sentences (None: the most that fit the
    # device, from the measure's own peak-memory estimate: ``curvature_micro_batch``)
    micro_batch: int | None = None
    gap_batches: int = 8  # independent batches of the gap (its standard error is over them)
    params: str | None = None
    rho: float = 0.05
    task_train: int = 2000  # paper: 0.1M examples in all
    task_validation: int = 500
    task_test: int = 1000
    probe_method: str = "lbfgs"
    probe_epochs: int = 50  # paper: 100 (AdamW)
    finetune_epochs: int = 10
    finetune_lr: float = 1e-4  # paper (App. A.5)
    finetune_warmup: int = 200  # paper
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    seed: int = 0
    device: str = "cpu"
    extra: dict = field(default_factory=dict)  # {measure name: its settings}: the measures without a field here

    def __post_init__(self):
        for measure in sorted(MEASURES.values(), key=_order):
            measure.validate(self)
        unknown = [name for name in self.extra if name not in MEASURES]
        if unknown:
            known = (m.name for m in sorted(MEASURES.values(), key=_order))
            raise UserError(f"unknown measure {unknown[0]!r}; choose from {', '.join(known)}")
        if not measures_of(self):
            flags = [m.flag for m in sorted(MEASURES.values(), key=_order) if m.flag]
            raise UserError(f"nothing to measure: pass {', '.join(flags[:-1])} or {flags[-1]}")


class Measure:
    """One measure (see the module docstring). Subclasses set ``name`` (the registry key),
    ``order`` (where its columns go in a row), ``stage`` (the planner stage of its FLOPs)
    and ``flag`` (the ``sameloss measure`` option that asks for it, if any), and override
    what applies; the defaults are those of a measure whose settings are
    ``spec.extra[name]``."""

    name: str = ""
    order: float = 1000.0
    stage: str = PROBES
    flag: str | None = None

    def wanted(self, spec: MeasureSpec) -> bool:
        """Whether ``spec`` asks for this measure."""
        return self.name in spec.extra

    def settings(self, spec: MeasureSpec):
        """This measure's settings in ``spec``."""
        return spec.extra.get(self.name)

    def validate(self, spec: MeasureSpec) -> None:
        """``UserError`` (one line) for settings that cannot work; called for every spec."""

    def check(self, job: Job) -> None:
        """``UserError`` when the work would not fit in memory: called for every wanted
        measure before any of them allocates (``resources.check``)."""

    def compute(self, job: Job) -> dict:
        """The columns this measure adds to ``job.row`` (the row so far: a measure may read
        an earlier one's columns)."""
        raise NotImplementedError

    def columns(self, spec: MeasureSpec) -> list[str]:
        """The columns ``compute`` writes (their ``_std`` / ``_se`` error columns included)."""
        return []

    def flops(self, spec: MeasureSpec, shape) -> float:
        """FLOPs of one measurement, counted in ``stage`` (``shape``: an
        ``experiments.plan.ModelShape``; ``shape.sentence_flops`` is one full sentence's
        forward pass)."""
        return 0.0

    def peaks(self, spec: MeasureSpec, memory: MemoryContext) -> dict[str, int]:
        """Peak device bytes of the measure's parts (name -> bytes), for ``sameloss plan``."""
        return {}


def _order(measure: Measure) -> float:
    return measure.order


@dataclass
class Job:
    """What a measure runs on: the loaded ``model`` (token ids to logits, ``features`` for
    probes), its ``language`` and run ``cfg`` (a ``PretrainConfig``; for a Hugging Face
    folder, the config it is measured under), the ``spec``, the ``cache`` shared by the
    checkpoints of one call (evaluators, task data) and the ``row`` measured so far."""

    model: object
    language: object
    cfg: object
    spec: MeasureSpec
    cache: dict
    row: dict


@dataclass
class MemoryContext:
    """What a measure's planned peak needs: the meta-device ``model_config`` of the
    checkpoint's model, the run's ``cfg``, its ``shape``, ``forward_bytes(n)``: one
    forward pass without gradients over ``n`` full sentences, and ``limit``: the bytes
    of the planned device a measure may plan to use (what a default micro-batch is
    sized to)."""

    model_config: object
    cfg: object
    shape: object
    forward_bytes: object
    limit: int = 0


def _discover() -> None:
    """The built-in measures (the modules of ``measures/builtin/``), then the plugins'."""
    from . import builtin

    for module in pkgutil.iter_modules(builtin.__path__):
        importlib.import_module(f"{builtin.__name__}.{module.name}")
    registry.load_plugins()


MEASURES: registry.Registry[Measure] = registry.Registry("measure", loader=_discover)


def measures_of(spec: MeasureSpec) -> list[Measure]:
    """The measures ``spec`` asks for, in row order."""
    return sorted((m for m in MEASURES.values() if m.wanted(spec)), key=_order)


def check_finite_positive(value: float, message: str) -> None:
    if not (math.isfinite(value) and value > 0):
        raise UserError(message)
