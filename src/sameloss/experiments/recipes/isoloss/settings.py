"""The iso-loss preset's settings, grouped (``design.IsolossPreset`` holds one of each): the
schedule of a fork (``ForkSchedule``), the few-shot probes (``Probes``), the rules of the
verdicts (``VerdictRules``), the seeds' design (``SeedDesign``: a plan fixed before the data
by the claims-first rule) and the adversary's data
(``Adversary``). Each checks what concerns it alone; what spans groups (the forks against the
schedule, the claims against the tests, the prior's seeds against the study's) the preset
checks."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class ForkSchedule:
    """Every fork: ``recipe_steps`` (its own, or this) at the constant lr up to the base's steps +
    ``recipe_steps``, then ``decay_steps`` of linear decay to ``final_lr_factor`` × lr, then
    ``final_steps`` (its own, or this) at that lr: the stretch, where candidates lie every
    ``match_every`` steps. ``probe_points`` checkpoints of each fork's stretch are measured
    (trace and probes), evenly spaced over its candidates, first and last included: each fork's
    estimate at a comparison's target KL is read off the line through them (``paired.at_target``)."""

    recipe_steps: int
    decay_steps: int
    final_lr_factor: float
    final_steps: int
    match_every: int
    probe_points: int = 3

    def __post_init__(self):
        if self.probe_points < 3:
            raise ValueError("probe_points >= 3: each fork's estimate at the target reads a line through at least "
                             "3 checkpoints")
        if self.decay_steps < 1 or not 0 <= self.final_lr_factor < 1:
            raise ValueError("decay_steps >= 1 and final_lr_factor in [0, 1)")


@dataclass(frozen=True, kw_only=True)
class Probes:
    """The few-shot probes of every model (``measures.fewshot.FewShot``): ``subsets[i]`` training
    subsets of ``sizes[i]`` examples from a pool of ``pool``, tested on ``test`` examples; the
    AdamW probe's ``epochs``, the L-BFGS probe's ridge ``l2``; ``primary_size`` the size of the
    primary endpoint."""

    sizes: tuple[int, ...]
    subsets: tuple[int, ...]
    pool: int
    test: int
    epochs: int
    l2: float
    primary_size: int

    def __post_init__(self):
        if len(self.sizes) != len(self.subsets) or max(self.sizes) > self.pool:
            raise ValueError("one subset count per probe size, every size within the pool")
        if self.primary_size not in self.sizes:
            raise ValueError("the primary size must be a probe size")

    @property
    def primary_subsets(self) -> int:
        """The subsets of the primary size."""
        return dict(zip(self.sizes, self.subsets))[self.primary_size]


@dataclass(frozen=True, kw_only=True)
class VerdictRules:
    """What the verdicts read (``paired.Design``) and the headroom gate, fixed before any data.
    The accuracies' margins are each comparison's (``Comparison.margin``, from the paper's
    effects); ``secondary_margin`` is the secondary "no effect beyond" reading beside them."""

    secondary_margin: float = 0.35  # points: the secondary equivalence reading of the accuracies
    trace_margin: float = 0.05  # δ of the trace verdicts: this fraction of the reference fork's mean trace
    # nats, the same for every fork: a pair whose fork's target lies further than this outside that
    # fork's measured KL range is named in the report and not used (``paired.Design.limit``); every
    # verdict is shown at limit 0 and at no limit beside it
    extrapolation_limit: float
    headroom_margin: float = 5.0  # points: the gate's distance from look-up, random-init and oracle
    on_no_headroom: str = "stop"  # "stop" (before the forks) or "mark" (every verdict uninformative)

    def __post_init__(self):
        if self.on_no_headroom not in ("stop", "mark"):
            raise ValueError("on_no_headroom must be 'stop' or 'mark'")
        if self.secondary_margin <= 0 or self.headroom_margin < 0 or not 0 < self.trace_margin < 1 \
                or self.extrapolation_limit < 0:
            raise ValueError("secondary_margin > 0, 0 < trace_margin < 1, extrapolation_limit >= 0 (nats), "
                             "headroom_margin >= 0")


@dataclass(frozen=True, kw_only=True)
class SeedDesign:
    """Which seeds run which forks: a design fixed before the data by the claims-first rule
    (``allocation.choose_design``): per test ``"comparison @ point"`` the seeds it runs on
    (``plan``: seed i runs the forks of the tests planned more than i seeds; only the planned
    tests are reported), the tests it leaves out with what each would need (``left``), the budget
    it was chosen for, and the prior paired SDs it was planned from with where they were
    measured (``prior_source``; their seeds, ``prior_seeds``, are disjoint from the study's).
    An empty plan: every test on every seed."""

    plan: tuple[tuple[str, int], ...] = ()
    left: tuple[tuple[str, str], ...] = ()
    budget_minutes: float | None = None  # the wall time the design was chosen for (``--budget`` chooses again)
    workers: int = 2  # the local workers the budget's wall time assumes
    rebudgeted: bool = False  # chosen again by ``--budget`` for another budget than its scale's (its own folder)
    # the paired SDs of the primary accuracy per test expected before any data (points): measured in
    # a pilot on other seeds, named by ``prior_source``
    prior_sds: tuple[tuple[str, float], ...] = ()
    prior_source: str = ""
    prior_seeds: tuple[int, ...] = ()

    def __post_init__(self):
        if self.budget_minutes is not None and self.budget_minutes <= 0:
            raise ValueError("budget_minutes > 0 (or None: no limit)")


@dataclass(frozen=True, kw_only=True)
class Adversary:
    """The adversarial fork's data on the preset's task: its batch and the pool it is drawn from
    (``adversarial.batch_size``, ``adversarial.pool_size``)."""

    batch_size: int = 128
    pool_size: int = 10_000


__all__ = ["Adversary", "ForkSchedule", "Probes", "SeedDesign", "VerdictRules"]
