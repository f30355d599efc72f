"""The pre-training configuration (``sameloss pretrain``), with the paper's defaults
where they fit a CPU (App. A.5: AdamW, betas (0.9, 0.98), constant lr 1e-3 after a linear
warm-up, dropout 0.1, weight decay 0.01; the paper's batch is 4096)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, fields
from typing import Literal

from .. import config as configlib
from .. import registry
from ..errors import UserError


@dataclass(frozen=True)
class LanguageConfig:
    name: str = "pcfg"  # a language of ``sameloss.registry``
    size: str = "tiny"  # a named size of the language: micro, tiny, paper
    seed: int | None = None  # another random language of that size's shape (None: the size's own)
    # constructor settings over the size's own, "key=value[,key=value...]" (hmm: HMM.random's,
    # e.g. "n_states=6,emission_concentration=0.5"; pcfg: GrammarShape's fields and max_len)
    params: str | None = None
    grammar: str | None = None  # PCFG grammar file; overrides the size
    # causal only: a local Hugging Face causal-LM folder, K allowed tokens, sentence length T
    generator: str | None = None
    k: int | None = None  # None: 2000 (the paper's)
    length: int | None = None  # None: 24 (the paper's)
    pool: str | None = None  # a folder of 'sameloss causal-lm sample': training sentences drawn from it
    # corpus only: a folder written by ``sameloss corpus prepare``
    data: str | None = None
    # (configs saved before the key was renamed say ``language.preset``)
    ALIASES = {"preset": "size"}

    def __post_init__(self):
        from ..registry import languages, parse_params  # found from their files (and plugins), no import

        if self.name not in languages():
            raise ValueError(f"language.name must be one of {', '.join(languages())}, got {self.name!r}")
        if self.seed is not None and self.seed < 0:
            raise ValueError(f"language.seed must be >= 0, got {self.seed}")
        if self.params is not None:
            parse_params(self.params)  # the syntax; the keys are the language's to check when built

    def __repr__(self) -> str:
        # the dataclass's own repr, but without params while it is unset: the repr of a
        # config is part of cached measurements' keys (experiments.core), which stay those
        # of the configs saved before language.params existed
        shown = [f.name for f in fields(self) if f.name != "params" or self.params is not None]
        return f"{type(self).__qualname__}({', '.join(f'{n}={getattr(self, n)!r}' for n in shown)})"


@dataclass(frozen=True)
class ModelConfig:
    kind: str = "transformer"  # a model kind of ``sameloss.registry.MODELS``: transformer, lstm
    size: str = "tiny"
    dropout: float = 0.1
    norm: Literal["post", "pre"] = "post"  # transformer only
    # optional changes to the named size's shape (None: the size's own value)
    d_model: int | None = None
    n_heads: int | None = None
    n_layers: int | None = None
    d_inter: int | None = None  # transformer only
    d_hidden: int | None = None  # LSTM only

    def __post_init__(self):
        from ..registry import MODELS  # found from their files (and plugins), no import

        if self.kind not in MODELS:
            raise ValueError(f"model.kind must be one of {', '.join(MODELS.names())}, got {self.kind!r}")

    def shape_overrides(self) -> dict:
        names = ("d_model", "n_heads", "n_layers", "d_inter", "d_hidden")
        return {n: getattr(self, n) for n in names if getattr(self, n) is not None}


@dataclass(frozen=True)
class OptimConfig:
    name: Literal["adamw", "sgd"] = "adamw"
    lr: float = 1e-3
    betas: tuple[float, ...] = (0.9, 0.98)
    eps: float = 1e-6
    # decoupled in AdamW; torch's SGD adds it to the gradient (L2), which equals decoupled
    # decay only without momentum
    weight_decay: float = 0.01
    momentum: float = 0.0  # SGD only
    warmup_steps: int = 1000
    warmup_fraction: float | None = None  # if set, warm-up = fraction * steps (paper's SGD: 0.12)
    # optional linear decay over decay_steps to final_lr_factor * lr, then final_steps more
    # at that factor (the paper keeps lr constant; a short decay removes the constant-lr
    # noise floor of the loss; the stretch at the final lr lets forks of one base be
    # compared at one learning rate: ``reproduce isoloss``)
    decay_steps: int = 0
    final_lr_factor: float = 0.0
    final_steps: int = 0
    grad_clip: float | None = None  # max global gradient norm

    def __post_init__(self):
        if not math.isfinite(self.lr) or self.lr <= 0:
            raise ValueError(f"optim.lr must be a positive finite number, got {self.lr}")
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise ValueError(f"optim.betas must be two numbers in [0, 1), got {self.betas}")
        if self.warmup_steps < 0:
            raise ValueError("optim.warmup_steps must be >= 0")
        if self.warmup_fraction is not None and not 0 <= self.warmup_fraction <= 1:
            raise ValueError("optim.warmup_fraction must be in [0, 1]")
        if self.decay_steps < 0 or not 0 <= self.final_lr_factor <= 1:
            raise ValueError("optim.decay_steps must be >= 0 and optim.final_lr_factor in [0, 1]")
        if self.final_steps < 0:
            raise ValueError(f"optim.final_steps must be >= 0, got {self.final_steps}")


@dataclass(frozen=True)
class EvalConfig:
    every: int = 200  # steps between exact evaluations (0: only at the end)
    # also at every kept checkpoint (``checkpoints``): a study that selects checkpoints by
    # their KL evaluates those and nothing else (eval.every = 0)
    at_checkpoints: bool = False
    n_sentences: int = 2000  # held-out sentences (fixed for the whole run)
    n_subsets: int = 5  # standard deviations over this many disjoint subsets (App. A.7)
    seed: int = 1_000_003  # the held-out set's seed, apart from the training stream

    def __post_init__(self):
        if self.every < 0:
            raise ValueError(f"eval.every must be >= 0 (0: only at the end), got {self.every}")
        if self.n_sentences < 1:
            raise ValueError(f"eval.n_sentences must be >= 1, got {self.n_sentences}")
        if not 1 <= self.n_subsets <= self.n_sentences:
            raise ValueError(f"eval.n_subsets must be in [1, eval.n_sentences={self.n_sentences}], "
                             f"got {self.n_subsets}")


@dataclass(frozen=True)
class SAMConfig:
    """Sharpness-aware minimisation (paper App. A.5: rho 0.05, no dropout or weight decay)."""

    rho: float = 0.0  # 0: off
    adaptive: bool = False

    def __post_init__(self):
        if self.rho < 0:
            raise ValueError(f"sam.rho must be >= 0, got {self.rho}")

    def step_forwards(self, batch_size: int, vocab: int) -> float:
        """What SAM adds to a training step, in full-length sentence forwards (the planner's
        unit): nothing — its ascent and its update each run on one half of the batch, so
        the step passes the batch once forward and back, as a plain one does."""
        return 0.0


@dataclass(frozen=True)
class AdversarialConfig:
    """The adversarial meta-learning objective (App. A.5): L_MLM - weight * downstream loss."""

    weight: float = 0.0  # lambda; 0: off
    task: str = ""  # a task of the language, e.g. "C" for the PCFG
    batch_size: int = 256  # labelled examples per step, split into halves D1, D2
    pool_size: int = 10_000  # the downstream training examples drawn from
    ridge: float = 1e-2  # relative ridge of the closed-form head

    def __post_init__(self):
        if self.weight < 0:
            raise ValueError(f"adversarial.weight must be >= 0, got {self.weight}")
        if self.weight > 0 and not self.task:
            raise ValueError("adversarial.task must name a downstream task when adversarial.weight > 0")

    def step_forwards(self, batch_size: int, vocab: int) -> float:
        """What the objective adds to a training step, in full-length sentence forwards: a
        forward and a backward (3 forwards' FLOPs) of its own labelled batch; 0 when off."""
        return 3.0 * self.batch_size if self.weight > 0 else 0.0


# The flatness penalty's cost per step (``training.objectives.flatness``) in forward passes of one sentence,
# per sentence of its slice and per label it differentiates (Fisher: ``flatness.labels``
# drawn, or every label — the vocabulary — for 0) or per probe (Hutchinson): per-context
# gradients differentiated once more have no clean matmul count, so these are measured
# time ratios — bench/bench_flatness.py on the tiny isoloss design (CPU, one thread, 32
# sentences of a 256-sentence batch): Fisher with 2 labels 2.31× a plain step and with every
# one of the 11 labels 8.19× (both 15.7 sentence-forwards per sentence and label),
# Hutchinson with one probe 10.8× (234 per sentence and probe).
# The signs estimator (``flatness.estimator = "signs"``, the default): one forward, one backward
# kept for differentiation and its backward, of the slice — every label at once, so per
# sentence of the slice only (measured with bench/bench_flatness.py: 7 forwards a sentence).
FLATNESS_FORWARDS = {"fisher": 15.7, "hutchinson": 234.5}
FLATNESS_SIGNS_FORWARDS = 7.0


@dataclass(frozen=True)
class FlatnessConfig:
    """A flatness penalty (``training.objectives.flatness``): ``weight`` × an estimate of the trace of the
    Hessian of the MLM loss on a slice of each step's batch, added to the training loss —
    flatness as the treatment."""

    weight: float = 0.0  # lambda; 0: off; > 0 flattens, < 0 sharpens (raises the trace)
    # "fisher": the paper's estimator (App. B.1), E_x E_{y~f} ||grad log f_y||^2 with labels
    # drawn from the model; "hutchinson": v^T H v with Rademacher v on the loss of the true tokens
    measure: Literal["fisher", "hutchinson"] = "fisher"
    sentences: int = 32  # the slice: the first this many sentences of the step's (update) batch
    # fisher: labels drawn from the model per masked position (>= 2: each draw's baseline is the
    # mean of the others); 0: every label, weighted by its probability (exact; vocabulary-many
    # backward passes per position)
    labels: int = 2
    # fisher: how the per-context squared gradient norms are combined. "signs" (the default):
    # every label of every context of the slice, each gradient weighted by sqrt f(y) and a
    # random sign, summed into ONE gradient whose squared norm is unbiased for the trace (one
    # backward pass for the whole slice; ``labels`` is not read); "per-example": each
    # context's own gradients (``labels`` drawn, or all), through torch.func (the estimator
    # before issue 45: the same expected penalty, ~6x dearer per step)
    estimator: Literal["signs", "per-example"] = "signs"
    probes: int = 1  # hutchinson: Rademacher probes per step
    # the parameters the trace is taken over: a regex searched in their names (as ``sameloss
    # measure --params``), e.g. "blocks" for the encoder layers; None: all
    params: str | None = None

    def __post_init__(self):
        if self.params is not None:
            try:
                re.compile(self.params)
            except re.error as exc:
                raise ValueError(f"flatness.params is not a valid regex ({exc}): {self.params!r}") from None
        if not math.isfinite(self.weight):
            raise ValueError(f"flatness.weight must be a finite number, got {self.weight}")
        if self.sentences < 1:
            raise ValueError(f"flatness.sentences must be >= 1, got {self.sentences}")
        if self.labels < 0:
            raise ValueError(f"flatness.labels must be >= 0 (0: every label, exactly), got {self.labels}")
        if self.probes < 1:
            raise ValueError(f"flatness.probes must be >= 1, got {self.probes}")

    def step_forwards(self, batch_size: int, vocab: int) -> float:
        """What the penalty adds to a training step of ``batch_size`` sentences, in full-length
        sentence forwards (``FLATNESS_FORWARDS``, ``FLATNESS_SIGNS_FORWARDS``); 0 when off."""
        if self.weight == 0:
            return 0.0
        sentences = min(self.sentences, batch_size)
        if self.measure == "fisher" and self.estimator == "signs":
            return FLATNESS_SIGNS_FORWARDS * sentences
        per = self.probes if self.measure == "hutchinson" else (self.labels or vocab)
        return FLATNESS_FORWARDS[self.measure] * per * sentences


@dataclass(frozen=True)
class PretrainConfig:
    """Every setting of a pre-training run, with the paper's defaults; ``sameloss pretrain
    KEY=VALUE ...`` and ``config.load(PretrainConfig, file, overrides)`` set them by dotted
    name (``optim.lr=3e-4``), and ``--print-config`` lists them all.

    Attributes:
        name: the run's folder under ``--out`` (one plain folder name).
        seed: initial weights and data stream (the same seed, the same of both).
        steps: optimiser steps.
        batch_size: global batch (split across processes under DDP).
        masking: ``rate`` (``mask_rate`` of the positions) or ``single`` (one per sentence).
        mask_rate: the share of positions masked.
        mask_replace: ``mask`` (the mask token; the exact conditionals apply) or ``bert``
            (80/10/10; training batches only).
        update_half: update on the second half of each batch only (SAM's batch control).
        checkpoints: steps to keep a checkpoint at, besides the last.
        checkpoints_log: this many more, log-spaced between 1 and ``steps``.
        save_every: steps between the rolling checkpoint ``--resume`` continues from.
        log_every: steps between logged training losses.
        device: ``auto`` (CUDA when present), ``cpu`` or ``cuda``.
        precision: ``auto`` (bf16 autocast on CUDA, fp32 on the CPU), ``bf16`` or ``fp32``.
        init_from: a checkpoint to fork from (``training.fork``).
        init_optimizer: a fork also takes the checkpoint's optimiser moments and RNG state.
        init_step: ``continue`` the checkpoint's step count, or ``restart`` from 0.
        language: the language (``LanguageConfig``: ``language.name``, ``language.size``, ...).
        model: the model (``ModelConfig``: kind, size, dropout, shape overrides).
        optim: the optimiser (``OptimConfig``: AdamW or SGD, lr, schedule, weight decay).
        eval: the exact held-out evaluation (``EvalConfig``).
        sam: SAM (``sam.rho > 0`` turns it on).
        adversarial: the adversarial meta-learning objective (``adversarial.weight > 0``).
        flatness: the flatness penalty (``flatness.weight``: λ × the trace; λ < 0 sharpens).
        objectives: the settings of the training objectives that have no field here (a
            plugin's, ``training.objectives``), by name.
    """

    name: str = "pretrain"
    seed: int = 0
    steps: int = 2000
    batch_size: int = 256  # global batch (split across processes under DDP)
    masking: Literal["rate", "single"] = "rate"  # 'single': exactly one position per sentence
    mask_rate: float = 0.15
    # what a masked input shows: "mask" (the mask token; exact conditionals apply) or
    # "bert" (80 % mask, 10 % random word, 10 % unchanged; training batches only)
    mask_replace: Literal["mask", "bert"] = "mask"
    # update on the second half of each batch only — the half SAM's update uses (its first
    # half goes to the ascent): the control that separates SAM's perturbation from its
    # smaller update batch (``reproduce isoloss``); the first half is drawn and not used
    update_half: bool = False
    checkpoints: tuple[int, ...] = ()  # steps to keep a checkpoint at (besides the last)
    checkpoints_log: int = 0  # this many more, log-spaced between 1 and steps
    save_every: int = 200  # rolling 'latest' checkpoint for --resume
    log_every: int = 20
    device: Literal["auto", "cpu", "cuda"] = "auto"
    # the arithmetic of the training forward/backward passes: "bf16" runs them under
    # torch.autocast (bfloat16 matmuls; parameters, optimiser state and checkpoints stay
    # float32), "fp32" without it, "auto" bf16 on CUDA and fp32 on the CPU. Evaluation,
    # curvature and probes always run outside autocast (float32/float64).
    precision: Literal["auto", "bf16", "fp32"] = "auto"
    # where dropout masks come from: "global" (torch's global RNG, seeded with ``seed``: every
    # run before this key existed) or "keyed" (a pure function of seed, step and position,
    # ``training.keyed``: what lets S runs train as one batched ensemble, ``training.ensemble``,
    # with each member's numbers those of its run alone). Another run's trajectory, not a
    # setting to resume across.
    dropout_draws: Literal["global", "keyed"] = "global"
    # a fork (``training.fork``): start from this checkpoint's weights and step (and, with
    # init_optimizer, its optimiser moments and RNG state) instead of a fresh model;
    # init_step = "restart": count steps from 0 instead (steps 1..steps of this run's own
    # schedule and data stream, from the checkpoint's weights: a new run that starts there)
    init_from: str | None = None
    init_optimizer: bool = True
    init_step: Literal["continue", "restart"] = "continue"
    language: LanguageConfig = field(default_factory=LanguageConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    sam: SAMConfig = field(default_factory=SAMConfig)
    adversarial: AdversarialConfig = field(default_factory=AdversarialConfig)
    flatness: FlatnessConfig = field(default_factory=FlatnessConfig)
    # the settings of training objectives without a field here (a plugin's), by name:
    # ``objectives.NAME.KEY=VALUE``, parsed into the dataclass ``register_objective`` gave
    objectives: dict = field(default_factory=dict, metadata={"omit_empty": True})

    def __post_init__(self):
        object.__setattr__(self, "objectives", _objective_settings(self.objectives))
        # the run folder is <out>/<name>: one plain folder name, never a path elsewhere
        if (not self.name or self.name in (".", "..") or any(c in self.name for c in "/\\\0")
                or self.name != self.name.strip()):
            raise ValueError(f"name must be a plain folder name (no '/', '\\', '..', empty or surrounding "
                             f"spaces), got {self.name!r}")
        if self.steps < 1:
            raise ValueError("steps must be >= 1")
        if self.log_every < 1:
            raise ValueError(f"log_every must be >= 1, got {self.log_every}")
        if self.save_every < 1:
            raise ValueError(f"save_every must be >= 1, got {self.save_every}")
        if self.batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        if not 0 < self.mask_rate <= 1:
            raise ValueError(f"mask_rate must be in (0, 1], got {self.mask_rate}")
        if any(s < 1 or s > self.steps for s in self.checkpoints):
            raise ValueError(f"checkpoints must lie in [1, steps={self.steps}]")
        if self.sam.rho > 0 and self.adversarial.weight > 0:
            raise ValueError("SAM and the adversarial objective cannot be combined")
        if self.sam.rho > 0 and self.flatness.weight != 0:
            raise ValueError("flatness.weight and sam.rho cannot be combined: SAM is a flatness objective of its "
                             "own (its gradient is taken at a perturbed point, the penalty's at the weights); "
                             "compare them as separate runs")
        if self.sam.rho > 0 and self.batch_size < 2:
            raise ValueError("SAM needs batch_size >= 2 (it splits the batch in halves)")
        if self.update_half and (self.sam.rho > 0 or self.batch_size < 2):
            raise ValueError("update_half needs batch_size >= 2 and no SAM (SAM already updates on that half)")
        if self.optim.decay_steps + self.optim.final_steps > self.steps:
            raise ValueError(f"optim.decay_steps + optim.final_steps ({self.optim.decay_steps} + "
                             f"{self.optim.final_steps}) must not exceed steps={self.steps}")

    def treatments(self) -> tuple:
        """The settings of this run that declare what they add to a training step: every field
        with ``step_forwards`` (``sam``, ``adversarial``, ``flatness``), then the settings of
        ``objectives`` that have it (a plugin objective's: the planner prices it too)."""
        return tuple(v for v in (*(getattr(self, f.name) for f in fields(self)), *self.objectives.values())
                     if callable(getattr(v, "step_forwards", None)))

    @property
    def warmup(self) -> int:
        if self.optim.warmup_fraction is not None:
            return round(self.optim.warmup_fraction * self.steps)
        return self.optim.warmup_steps

    def lr_factor(self, step: int) -> float:
        """Multiplier of ``optim.lr`` for (0-based) step ``step``: linear warm-up, constant,
        then the optional linear decay to ``final_lr_factor`` and ``final_steps`` at it."""
        factor = min(1.0, (step + 1) / self.warmup) if self.warmup > 0 else 1.0
        decay, final = self.optim.decay_steps, self.optim.final_steps
        start = self.steps - final - decay  # the first step of the decay
        if step >= self.steps - final and (decay > 0 or final > 0):
            factor *= self.optim.final_lr_factor
        elif decay > 0 and step >= start:
            done = (step - start + 1) / decay
            factor *= 1.0 - done * (1.0 - self.optim.final_lr_factor)
        return factor

    def checkpoint_steps(self) -> list[int]:
        """Every step whose checkpoint is kept: the listed ones, the log-spaced ones and
        the last."""
        steps = set(self.checkpoints) | {self.steps}
        if self.checkpoints_log > 0:
            import math
            n = self.checkpoints_log
            for i in range(n):
                steps.add(max(1, round(math.exp(math.log(self.steps) * (i + 1) / n))))
        return sorted(steps)

    def evaluation_steps(self) -> list[int]:
        """Every step whose exact KL the run evaluates: each ``eval.every``-th, the last and,
        with ``eval.at_checkpoints``, every kept checkpoint (the loop and ``sameloss plan``
        read this one list)."""
        every = self.eval.every
        steps = set(range(every, self.steps + 1, every)) if every else set()
        if self.eval.at_checkpoints:
            steps |= set(self.checkpoint_steps())
        return sorted(steps | {self.steps})


# the settings classes of training objectives without a field in ``PretrainConfig`` (a
# plugin's), by objective name; torch-free, so that a config loads before torch does
OBJECTIVE_SETTINGS: dict[str, type] = {}


def register_objective(name: str, settings: type) -> None:
    """Make ``objectives.NAME.*`` the settings of training objective ``name``: ``settings`` is
    a frozen dataclass (its fields the keys, with defaults) with ``step_forwards(batch_size,
    vocab)``, its cost (``training.objectives``). A name taken by another class is refused."""
    taken = OBJECTIVE_SETTINGS.get(name)
    if taken is not None and taken is not settings:
        raise UserError(f"two training objectives' settings are named {name!r} ({taken.__module__} and "
                        f"{settings.__module__}); rename one")
    OBJECTIVE_SETTINGS[name] = settings


def _objective_settings(given: dict) -> dict:
    """``PretrainConfig.objectives`` with each table parsed into its objective's settings."""
    if given and any(name not in OBJECTIVE_SETTINGS for name in given):
        registry.load_plugins()  # (a plugin registers its objective's settings when imported)
    out = {}
    for name, value in given.items():
        if name not in OBJECTIVE_SETTINGS:
            known = ", ".join(OBJECTIVE_SETTINGS) or "none registered"
            raise UserError(f"unknown training objective {name!r} (objectives.{name}); known: {known}")
        cls = OBJECTIVE_SETTINGS[name]
        out[name] = value if isinstance(value, cls) else configlib.from_dict(cls, value, f"objectives.{name}.")
    return out

