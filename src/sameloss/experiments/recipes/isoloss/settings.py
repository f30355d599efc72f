"""The iso-loss preset's settings, grouped (``design.IsolossPreset`` holds one of each): the
schedule of a fork (``ForkSchedule``), the few-shot probes (``Probes``), the rules of the
verdicts (``VerdictRules``), the seeds' design (``SeedDesign``: the adaptive rule, the even
design, a plan fixed before the data) and the adversary's data (``Adversary``). Each checks
what concerns it alone; what spans groups (the forks against the schedule, the pilot against
the seeds, the claims against the tests) the preset checks."""

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
    """What the verdicts read (``paired.Design``) and the headroom gate, fixed before any data."""

    equivalence_margin: float = 0.35  # δ of the accuracy verdicts, points
    trace_margin: float = 0.05  # δ of the trace verdicts: this fraction of the reference fork's mean trace
    # a multiple of each fork's own measured KL range: a pair whose fork's target lies further
    # than this outside that range is named in the report and not used (``paired.Design.limit``)
    extrapolation_limit: float
    headroom_margin: float = 5.0  # points: the gate's distance from look-up, random-init and oracle
    on_no_headroom: str = "stop"  # "stop" (before the forks) or "mark" (every verdict uninformative)
    # the fork × KL model (a KL slope common to both forks, ``weighted``): only where every pair's
    # ranges lie at most ``borrow_gap`` × the smaller range apart and equal slopes are not rejected
    # at ``slope_level``
    borrow_gap: float = 0.25
    slope_level: float = 0.2
    dose_floor: float = 0.05  # the dose-response leaves out (and names) pairs whose trace moved less

    def __post_init__(self):
        if self.on_no_headroom not in ("stop", "mark"):
            raise ValueError("on_no_headroom must be 'stop' or 'mark'")
        if not 0 < self.slope_level < 1 or self.borrow_gap < 0 or not 0 <= self.dose_floor < 1:
            raise ValueError("0 < slope_level < 1, borrow_gap >= 0, 0 <= dose_floor < 1")
        if self.equivalence_margin <= 0 or self.headroom_margin < 0 or not 0 < self.trace_margin < 1 \
                or self.extrapolation_limit <= 0:
            raise ValueError("equivalence_margin > 0, 0 < trace_margin < 1, extrapolation_limit > 0, "
                             "headroom_margin >= 0")


@dataclass(frozen=True, kw_only=True)
class SeedDesign:
    """Which seeds run which forks. The adaptive design: the first ``pilot_seeds`` seeds run every
    fork; every later seed only the forks of the comparisons whose planned seeds (``allocation``:
    the MDE target ``mde_target`` at 80 % power from the pilot's paired SD, at most all the
    preset's seeds) it is still short of; 0: every seed runs every fork (the even design)."""

    pilot_seeds: int = 0
    mde_target: float = 0.35
    exempt: tuple[str, ...] = ()  # comparisons tested on the pilot's seeds only (their effect is large)
    budget_minutes: float | None = None  # the wall time the study may take (``--budget``); None: no limit
    # the paired SDs of the primary accuracy per test expected before any data (a budget's forecast
    # before the pilot; the pilot's own SDs plan the seeds): measured in an earlier run, named where set
    prior_sds: tuple[tuple[str, float], ...] = ()
    # ``--even``: the seeds that run every fork in the even design (the design before the adaptive one)
    even_seeds: int = 16
    even: bool = False  # this preset is the even design of an adaptive scale (its folder: ``-even``)
    # a design fixed before the data (``allocation.choose_design``, the main job): per test
    # ``"comparison @ point"`` the seeds it runs on — seed i runs the forks of the tests planned
    # more than i seeds, and only the planned tests are reported; empty: every test on every seed
    plan: tuple[tuple[str, int], ...] = ()
    # the tests such a design leaves to the full study, each with what it would need (words)
    left: tuple[tuple[str, str], ...] = ()

    def __post_init__(self):
        if self.mde_target <= 0 or (self.budget_minutes is not None and self.budget_minutes <= 0):
            raise ValueError("mde_target > 0 and budget_minutes > 0 (or None: no limit)")


@dataclass(frozen=True, kw_only=True)
class Adversary:
    """The adversarial fork's data on the preset's task: its batch and the pool it is drawn from
    (``adversarial.batch_size``, ``adversarial.pool_size``)."""

    batch_size: int = 128
    pool_size: int = 10_000


__all__ = ["Adversary", "ForkSchedule", "Probes", "SeedDesign", "VerdictRules"]
