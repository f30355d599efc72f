"""At the same loss, does the implicit bias decide transfer? Forks of one base run at
matched exact KL and one learning rate — the algorithm, training longer and model size,
each acting from step 0 and late — few-shot probes, paired statistics with stated power
(issues 11, 22, 23).

Command
    sameloss reproduce                              (the main job: scale ``quick``)
    sameloss reproduce isoloss --scale tiny         [--out runs] [--seed N] [--fresh]
        [--launcher inprocess|local|slurm] [--workers N] [--seeds 0-7]
        [--language NAME[:SIZE][:key=value,...] ...]

    (``--seed N`` shifts the preset's seeds by N: an independent replication. Each seed's
    chain — its base run, then the forks — is one unit: ``--launcher local --workers 2``
    runs two seeds at once, ``--seeds 0-7`` only those seeds; see the README's "Running
    on a cluster".)

Runtime per scale (one thread per worker; ``--launcher local --workers N`` runs N seeds at once)
    The design changed in issue 34 (three measured checkpoints per fork, longer stretches for
    the forks on a higher KL floor): the figures below are measured on this design.
    smoke   ~2 min on a 2-core CPU (3 seeds, micro model, tens of steps; the numbers mean
            nothing)
    quick   NOT YET MEASURED on this design (the main job: tiny's first two seeds)
    tiny    NOT YET MEASURED on this design
    small   estimate, not measured: ~8 h on one H100 (paper HMM, t4-384, batch 4096)
    paper   estimate, not measured: days on one H100

Languages (issue 24)
    ``--language SPEC`` studies another language: ``NAME[:SIZE][:key=value,...]`` with
    ``seed=N`` (another draw of the size's shape), ``task=NAME`` (any task with a span and a
    posterior: an HMM's ``task-k``, a PCFG's ``span-k``; default ``DEFAULT_TASKS``) and any
    other key a constructor setting (``language.params``: ``HMM.random`` / ``PCFG.random``'s
    keywords over the size's own); the size defaults to ``headroom``. The language is built
    when the option is read, so a bad name, setting or task is one line before any file.
    Given several times, each language is a study of its own (its seeds in
    ``seeds/<tag>/``, its files and figures ``<tag>-*``) and the report leads with the
    replication table (``paired.replication``: per comparison each language's verdict,
    "replicated (paper's direction)" / "(against the paper)" only where every language with
    headroom detects it in that direction; the random-effects pooled estimate with the
    Hartung–Knapp–Sidik–Jonkman interval, the fixed effect, Cochran's Q, I² and τ²). A language without headroom is stopped by the gate (or marked)
    and counted as uninformative, never pooled. Each choice of languages is its own
    folder (``<out>/isoloss-<scale>-<tags>``; the HMM alone: ``isoloss-<scale>``).
    Every scale studies the HMM by default. The PCFG ``headroom`` size joins the default
    when it passes the gate at ``tiny``: measured 2026-11-24, 14 of its 16 bases passed
    (seeds 7 and 10: 4.3 and 4.7 points below the oracle), so its ``tiny`` study gives no
    verdict (70 min 55 s on 2 workers). Studies run apart (other sessions, machines) are
    combined by ``sameloss replicate FOLDER FOLDER`` (``finished_studies``: the same table,
    read from their files).

What it runs
    Language: the HMM ``headroom`` size (4 states, 8 words, length 8, emission
    concentration 1.0), task ``task-5`` (its hidden state 5, majority ≈ 38 %) — both read
    from the preset (``use``, ``task``) in one place (``_language``), or from ``--language``;
    the second language is the PCFG ``headroom`` size (6 words, 2 levels of 4 symbols,
    sentences of 2-4 words), task ``span-1`` (the symbol over the first word, majority 55 %).
    The probes read the task's span (``Task.span``: one position for an HMM state, the
    first k words for a PCFG's ``span-k``) and the oracle is the latent's true posterior
    (the HMM's hidden states; a PCFG's span symbol from inside–outside). Per seed one base run
    (AdamW, dropout 0.1, WD 0.01, constant lr after the warm-up) to ``base_steps``, and
    forks of it at each fork point k of ``fork_points``: ``late`` (k = ``base_steps``: the
    fork starts from the base's weights, optimiser moments, RNG state and step) and
    ``scratch`` (k = 0: the recipe trains from the run's initial weights — the same seed,
    so the same weights and data stream — the paper's protocol, still paired by seed).
    Every fork then trains its recipe to ``base_steps + recipe_steps`` at the constant lr,
    decays linearly over ``decay_steps`` to ``final_lr_factor`` × lr, and holds that lr
    for ``final_steps`` (its *stretch*). Forks: ``adamw`` (the base continued), ``short`` /
    ``long`` (0 / 400 recipe steps: "train longer"), ``noreg`` (−dropout −WD), ``noreg-half``
    (−dropout −WD updating on the half batch SAM updates on: SAM's batch control),
    ``sam05`` / ``sam02`` (−dropout −WD +SAM ρ 0.05 / 0.02), ``adv`` (AdamW + the adversarial
    objective on the preset's task, λ 0.02), ``large`` (the base embedded function-
    preservingly into a larger shape — App. B.4 — with its Adam moments mapped,
    ``models.embed``; asserted: its exact KL at the fork equals the base's to 1e-6; from
    scratch: the large shape's own initial weights, same seed and data), and the flatness
    forks — flatness as the treatment, the loss held fixed (issue 38; not in the paper):
    ``sharp`` / ``flat`` / ``flatter`` (AdamW + λ × the Fisher trace of each step's batch
    slice, ``training.flatness``, λ −1e-4 / 2e-4 / 3e-4: ``FLATNESS_TINY``, calibrated at
    tiny to move the trace at the target KL by +27 / −26 / −32 % against ``adamw``), each
    compared with ``adamw`` and together giving the dose-response (``paired.dose_response``:
    the paired accuracy difference per unit of relative trace change, within seeds).
    Forks per scale (the budget's choice at ``quick``/``tiny``, issue 23 item 6: a 2×
    wider model costs 4× per step, and the size forks were 45 % of a seed's training
    FLOPs by ``sameloss plan``): ``small``/``paper``/``smoke`` run every fork above with
    ``large`` 2× wider and one more block; ``quick``/``tiny`` drop ``sam02``, fork ``adv``
    late only (``Fork.late_only``; its comparison is exempt from the MDE target) and make
    ``large`` two more blocks at the same width (2 → 4 blocks, 106 k → 206 k parameters):
    ``sameloss plan isoloss --scale tiny --device cpu`` 6.6 h → 3.3 h on one thread.
    The flatness forks run at ``quick``/``tiny`` (their λ's scale) and, ``sharp`` and ``flat``
    only, at ``smoke`` (the plumbing); ``small``/``paper`` leave them out until calibrated
    (``bench/calibrate_flatness.py``): another model has another trace scale.
    ``adamw``, ``short`` and ``long`` are the base's own recipe until their decay, so their
    forks at every point are the late ones (one run each).
    Headroom gate, before any fork: in each seed's unit its base is probed beside its
    random-init encoder, the look-up table (true conditionals) and the oracle (true
    posteriors); that seed's forks run only if the trained encoder is ≥ ``headroom_margin``
    points above the look-up table and the random-init encoder and ≥ ``headroom_margin``
    below the oracle (primary endpoint). If any seed fails, the study gives no verdict
    (``on_no_headroom="stop"``: the failing seeds ran no fork) or marks every verdict
    "uninformative: no headroom" (``"mark"``: every seed's forks run).
    The same loss, estimated (issue 34): every fork's KL is evaluated on one shared held-out
    set at its candidates (every ``match_every`` steps of its stretch, all at the final lr
    factor); each fork is measured (trace and probes) at ``probe_points`` of them spread over
    the stretch. Per comparison and seed one target KL, from the two forks' measured KL
    ranges alone (``paired.comparison_target``: the middle of their overlap, or of the gap
    between them); each fork's accuracy and trace estimated *at* the target by the
    least-squares line of the quantity on KL through its own checkpoints
    (``paired.at_target``) — a line per seed and fork, not a model pooled across seeds, so
    the seeds stay independent and the t interval across seeds covers the fit's own error;
    linear because along one stretch at one lr KL moves by about 1e-3 nats and the
    quantities move smoothly with it. Every pair is used unless a fork's estimate lies more
    than ``extrapolation_limit`` nats outside its measured range (named in the report with
    its reason); the earlier rule — keep a pair only where the forks landed within
    ``kl_tolerance`` of each other — survives only as the sensitivity row beside each result
    (selecting on where a fork's KL landed conditions on a post-treatment variable). Why
    the stretch: at the end of a shared decay the forks' KLs spread, so matching there would
    compare forks at different lrs; along the stretch at the final lr KL keeps falling
    smoothly, and forks whose floors differ (SAM's sits higher) get a longer stretch
    (``Fork.final_steps``) so that the compared ranges overlap.
    Transfer: linear probes on the frozen representation at the task's position (primary)
    and on all positions concatenated (the paper's, secondary), trained on subsets of n =
    ``probe_sizes`` examples drawn per seed (the same for the seed's forks: pairs stay
    paired; another draw per seed: the intervals cover the draw) and tested on one test set:
    a converged convex probe (L-BFGS, the primary) and the paper's fixed-budget AdamW probe.
    Statistics (``paired``): per comparison and fork point the paired difference at the
    target across seeds (t and bootstrap 95 % intervals; the MDE at 80 % power from the
    noncentral t; p raw and Holm-adjusted within each family); verdicts "detected" (in the
    paper's direction / against it: the 95 % interval excludes 0), "no effect beyond ±δ"
    (TOST at α = 0.05 per side: the 90 % interval inside ±δ; δ fixed here:
    ``equivalence_margin`` points for accuracies, ``trace_margin`` × the reference's mean
    trace for traces), "inconclusive", "degenerate"; the dose (the effect from scratch minus
    late, per seed); the size contrast with traces in one parameter space (the small fork's
    checkpoints embedded into the large shape); Fig. 1 as a within-seed regression of
    accuracy on trace and KL (one row per fork, seed fixed effects, cluster bootstrap over
    seeds).

Expected result (paper)
    At the same loss: training longer lowers the trace and raises accuracy (Fig. 2, 4);
    −dropout−WD raises the trace and lowers accuracy, SAM recovers both (Table 1, 2); the
    adversarial objective lowers accuracy (Table 1); larger models are flatter and
    transfer better (Fig. 3, 5); across models, flatter means better transfer (Fig. 1): a
    negative slope of accuracy on trace at fixed loss.

Deviations
    The paper trains at a constant lr and compares checkpoints at equal loss; every fork
    here ends with the same decay and stretch at the final lr (the candidates' lr), so
    "same loss" is matched at one learning rate. The AdamW probe has no validation split in
    a few-shot design: it keeps its last epoch. No few-shot fine-tuning (the probes are the
    endpoints). The size contrast is one step (2× wider, one more block) of a 0.1M model.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import resource
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...errors import UserError
from ...measures.fewshot import FewShot, View
from ...measures.headroom import span_task, span_view
from ...measures.run import MeasureSpec
from ...models.sizes import TRANSFORMER_SIZES
from ...training.checkpoint import checkpoint_dir
from ...training.runio import eval_history
from .. import paired
from ..claims import fmt
from ..common import COMMON, Preset, base_settings, measure_spec
from ..core import RunSpec, Setting, Study
from ..allocation import Allocation
from ..paired import Comparison, Design
from ..report import Column, Section, Table

TITLE = ("Iso-loss forks: does flatness decide transfer at the same loss? (Fig. 1, 3, 5, Tables 1–2: the "
         "algorithm, training longer and model size, with power)")
SUMMARY = ("forks of one base run at matched KL and one lr (algorithm, longer, size; from scratch and late), "
           "few-shot probes, paired differences with power (Fig. 1)")
NOREG = (("model.dropout", 0.0), ("optim.weight_decay", 0.0))
# (view, method) pairs probed: the task's position by both probes; all positions by the
# paper's AdamW probe only (the convex probe on 8 × 64 features costs most of the time)
ENDPOINTS = (("pos", "lbfgs"), ("pos", "adamw"), ("all", "adamw"))
# the measured columns of a model's row besides its probes
MEASURED = ("trace_fisher", "trace_fisher_se", "parameters", "measure_seconds")
# the tolerance of "exactly the base's function" at a size fork's start (issue 23)
EMBED_KL_TOLERANCE = 1e-6


@dataclass(frozen=True)
class Fork:
    """A recipe forked from the base: its name, a label, its settings, how many steps it
    trains at the constant lr before the shared decay and at the final lr after it
    (``None``: the preset's), the adversarial objective's weight on the preset's task (0:
    off), and for a size fork the shape it is embedded into (``width_factor``× wider,
    ``extra_layers`` more blocks)."""

    name: str
    label: str
    settings: tuple[Setting, ...] = ()
    recipe_steps: int | None = None
    final_steps: int | None = None
    adversarial: float = 0.0
    width_factor: int = 1
    extra_layers: int = 0
    late_only: bool = False  # forked at the latest point only (a budget's choice: see the preset)

    @property
    def resized(self) -> bool:
        return self.width_factor > 1 or self.extra_layers > 0

    @property
    def base_recipe(self) -> bool:
        """The base's own recipe (AdamW with dropout and WD, the base's shape) until the
        decay: its fork at any point is its late fork."""
        return not self.settings and not self.adversarial and not self.resized


@dataclass(frozen=True, kw_only=True)
class IsolossPreset(Preset):
    seeds: tuple[int, ...]
    task: str  # the task probed (and the adversary's): one of the language's tasks about one position
    base_steps: int
    # fork points: base_steps (late) and/or earlier steps of the base (0: from scratch)
    fork_points: tuple[int, ...]
    # every fork: recipe_steps (its own, or this) at the constant lr up to base_steps +
    # recipe_steps, then decay_steps of linear decay to final_lr_factor × lr, then
    # final_steps (its own, or this) at that lr: the stretch, where candidates lie every
    # match_every steps
    recipe_steps: int
    decay_steps: int
    final_lr_factor: float
    final_steps: int
    match_every: int
    # checkpoints of each fork's stretch measured (trace and probes), evenly spaced over its
    # candidates, first and last included: each fork's estimate at a comparison's target KL
    # is read off the line through them (``paired.at_target``)
    probe_points: int
    eval_sentences: int  # the shared held-out set on which forks are matched
    forks: tuple[Fork, ...]
    comparisons: tuple[Comparison, ...]
    adversarial_batch: int
    adversarial_pool: int
    probe_sizes: tuple[int, ...]
    probe_subsets: tuple[int, ...]
    probe_pool: int
    probe_test: int
    probe_epochs: int
    probe_l2: float
    primary_size: int
    equivalence_margin: float  # δ of the accuracy verdicts, points
    trace_margin: float  # δ of the trace verdicts: this fraction of the reference fork's mean trace
    # nats: a pair whose fork's estimate lies further than this outside its measured KL range
    # is named in the report and not used (``paired.Design.limit``)
    extrapolation_limit: float
    headroom_margin: float  # points: the gate's distance from look-up, random-init and oracle
    on_no_headroom: str  # "stop" (before the forks) or "mark" (every verdict uninformative)
    # the language beyond its name and size: language.seed / language.params settings (``--language``)
    language_settings: tuple[Setting, ...] = ()
    # a study of several languages (``--language`` given more than once): each its own study in
    # ``seeds/<tag>/``, then a replication table; empty: the one language of ``use``
    replicate: tuple[LanguageChoice, ...] = ()
    # one language's study inside a study of several: its folder and model names start with it
    tag: str = ""
    # issue 35: the first ``pilot_seeds`` seeds run every fork; every later seed only the forks of
    # the comparisons whose planned seeds (``allocation``: the MDE target ``mde_target`` at 80 %
    # power from the pilot's paired SD, at most all the preset's seeds) it is still short of;
    # 0: every seed runs every fork (the even design)
    pilot_seeds: int = 0
    mde_target: float = 0.35
    exempt: tuple[str, ...] = ()  # comparisons tested on the pilot's seeds only (their effect is large)
    budget_minutes: float | None = None  # the wall time the study may take (``--budget``); None: no limit
    # the paired SDs of the primary accuracy per test expected before any data (a budget's forecast
    # before the pilot; the pilot's own SDs plan the seeds): measured in an earlier run, named where set
    prior_sds: tuple[tuple[str, float], ...] = ()
    # ``--even``: the seeds that run every fork in the even design (the design before issue 35)
    even_seeds: int = 16
    even: bool = False  # this preset is the even design of an adaptive scale (its folder: ``-even``)

    def __post_init__(self):
        super().__post_init__()
        names = [f.name for f in self.forks]
        if names[0] != "adamw" or len(set(names)) != len(names) or not self.forks[0].base_recipe:
            raise ValueError("the first fork must be the reference 'adamw' (the base's recipe) and fork names unique")
        for c in self.comparisons:
            if not {c.recipe, c.reference} <= set(names):
                raise ValueError(f"comparison {c.name} names an unknown fork")
        for f in self.forks:
            if self.recipe_steps_of(f) < 0 or self.final_steps_of(f) < self.match_every \
                    or self.final_steps_of(f) % self.match_every:
                raise ValueError(f"fork {f.name}: recipe steps >= 0, and its final steps a positive multiple of "
                                 "match_every")
            if len(self.candidates(f)) < self.probe_points:
                raise ValueError(f"fork {f.name}: {len(self.candidates(f))} candidates on its stretch, fewer than "
                                 f"probe_points={self.probe_points}")
        if self.probe_points < 3:
            raise ValueError("probe_points >= 3: each fork's estimate at the target reads a line through at least "
                             "3 checkpoints")
        if not self.fork_points or len(set(self.fork_points)) != len(self.fork_points) \
                or any(not 0 <= k <= self.base_steps for k in self.fork_points):
            raise ValueError(f"fork points must be distinct steps in [0, base_steps={self.base_steps}]")
        if self.decay_steps < 1 or not 0 <= self.final_lr_factor < 1:
            raise ValueError("decay_steps >= 1 and final_lr_factor in [0, 1)")
        if len(self.probe_sizes) != len(self.probe_subsets) or max(self.probe_sizes) > self.probe_pool:
            raise ValueError("one subset count per probe size, every size within the pool")
        if self.primary_size not in self.probe_sizes or len(self.seeds) < 2 or len(self.use) != 1:
            raise ValueError("the primary size must be a probe size; at least 2 seeds; one language")
        if self.task not in self.tasks[self.use[0]]:
            raise ValueError(f"task {self.task!r} must be one of the preset's tasks of its language")
        if self.on_no_headroom not in ("stop", "mark"):
            raise ValueError("on_no_headroom must be 'stop' or 'mark'")
        if self.pilot_seeds and not 2 <= self.pilot_seeds <= len(self.seeds):
            raise ValueError(f"pilot_seeds: 0 (every seed runs every fork) or 2..{len(self.seeds)} (the seeds)")
        if self.mde_target <= 0 or (self.budget_minutes is not None and self.budget_minutes <= 0):
            raise ValueError("mde_target > 0 and budget_minutes > 0 (or None: no limit)")
        if self.equivalence_margin <= 0 or self.headroom_margin < 0 or not 0 < self.trace_margin < 1 \
                or self.extrapolation_limit <= 0:
            raise ValueError("equivalence_margin > 0, 0 < trace_margin < 1, extrapolation_limit > 0, "
                             "headroom_margin >= 0")

    # ---- the schedule of a fork --------------------------------------------------------
    def recipe_steps_of(self, fork: Fork) -> int:
        return self.recipe_steps if fork.recipe_steps is None else fork.recipe_steps

    def final_steps_of(self, fork: Fork) -> int:
        return self.final_steps if fork.final_steps is None else fork.final_steps

    def fork_end(self, fork: Fork) -> int:
        """The fork's last step (counted from the base's step 0)."""
        return self.base_steps + self.recipe_steps_of(fork) + self.decay_steps + self.final_steps_of(fork)

    def stretch_start(self, fork: Fork) -> int:
        """The step the fork's stretch at the final lr starts after."""
        return self.fork_end(fork) - self.final_steps_of(fork)

    def candidates(self, fork: Fork) -> list[int]:
        """The fork's candidate checkpoints: every ``match_every`` steps of its stretch."""
        return list(range(self.stretch_start(fork) + self.match_every, self.fork_end(fork) + 1, self.match_every))

    def probe_steps(self, fork: Fork) -> list[int]:
        """The fork's measured checkpoints: ``probe_points`` of its candidates, evenly spaced,
        the first and the last included (its measured KL range is the stretch's)."""
        cands = self.candidates(fork)
        picks = np.round(np.linspace(0, len(cands) - 1, self.probe_points)).astype(int)
        return [cands[i] for i in sorted(set(picks.tolist()))]

    # ---- fork points -------------------------------------------------------------------
    @property
    def late(self) -> int:
        return max(self.fork_points)

    def point_name(self, k: int) -> str:
        return "late" if k == self.base_steps else "scratch" if k == 0 else f"step{k}"

    def fork_point_of(self, fork: Fork, k: int) -> int:
        """The step a fork's run starts from at fork point ``k`` (the base recipe's: the latest)."""
        return self.late if fork.base_recipe else k

    def forks_at(self, k: int) -> list[Fork]:
        """The forks compared at fork point ``k``: all at the latest, at earlier points all
        but the ``late_only`` ones."""
        return [f for f in self.forks if k == self.late or not f.late_only]

    def tests(self) -> list[tuple[Comparison, str]]:
        """Every (comparison, fork point name) reported: a comparison of two base-recipe
        forks is the same at every point, so it is reported at the latest only."""
        out = []
        for k in sorted(self.fork_points, reverse=True):
            f = {x.name: x for x in self.forks_at(k)}
            for c in self.comparisons:
                if c.recipe not in f or c.reference not in f:
                    continue
                if k != self.late and f[c.recipe].base_recipe and f[c.reference].base_recipe:
                    continue
                out.append((c, self.point_name(k)))
        return out

    # ---- what is probed --------------------------------------------------------------------
    @property
    def language(self) -> str:
        return _language(self)[0]

    @property
    def choice(self) -> LanguageChoice:
        """The study's one language as ``--language`` names it."""
        name, size, task = _language(self)
        given = dict(self.language_settings)
        return LanguageChoice(name, size, task, given.get("language.seed"), given.get("language.params"))

    def choices(self) -> tuple[LanguageChoice, ...]:
        """The languages of the study: ``replicate``, or the preset's own."""
        return self.replicate or (self.choice,)

    def on(self, choice: LanguageChoice, tag: str = "") -> IsolossPreset:
        """This preset on another language (its study of one language: ``tag`` names it in a
        study of several)."""
        return dataclasses.replace(self, use=(choice.name,), languages={choice.name: choice.size},
                                   tasks={choice.name: (choice.task,)}, task=choice.task,
                                   language_settings=choice.settings(), replicate=(), tag=tag)

    @property
    def span(self) -> tuple[int, int]:
        """The task's span ``[start, end)`` (0-based): where its latent sits (``Task.span``)."""
        return task_span(self.choice)

    def fewshot(self, seed: int) -> FewShot:
        """The probes every model of seed ``seed`` gets: at the task's span (its positions side
        by side; an HMM state's: one position) and at all positions, the same pool and test set
        for every seed, and training subsets drawn with the seed — the same across the seed's
        forks (its pairs stay paired) and new for each seed (the intervals cover the draw)."""
        return FewShot(self.task, (("pos", span_view(self.span)), ("all", View())), self.probe_sizes,
                       self.probe_subsets, self.probe_pool, self.probe_test, ENDPOINTS, self.probe_epochs,
                       self.probe_l2, seed=seed)

    def design(self, headroom: bool = True, pilot: tuple[int, ...] = ()) -> Design:
        """What every verdict of the study shares, fixed here before any data (``pilot``: an
        adaptive study's pilot seeds, whose spread its tests read: Stein's test)."""
        return Design(self.equivalence_margin, self.trace_margin, self.extrapolation_limit, self.kl_tolerance,
                      headroom, pilot)

    @property
    def primary_key(self) -> str:
        return f"pos_lbfgs_n{self.primary_size}"


def _language(p: IsolossPreset) -> tuple[str, str, str]:
    """The one place the study reads its language: (name, size, task)."""
    name = p.use[0]
    return name, p.languages[name], p.task


# ---- the language, by name (``--language``) ---------------------------------------------------
# the task probed on a language named without ``task=``: the one its headroom size was made for
DEFAULT_TASKS = {"hmm": "task-5", "pcfg": "span-1"}


@dataclass(frozen=True)
class LanguageChoice:
    """A language of the study: registered name, size, the task probed (one with a span and
    a posterior), and optionally another draw (``seed``) or constructor settings
    (``params``: ``language.params``, e.g. ``n_states=6,emission_concentration=0.5``)."""

    name: str
    size: str
    task: str
    seed: int | None = None
    params: str | None = None

    @property
    def spec(self) -> str:
        """As ``--language`` takes it: ``NAME:SIZE[:key=value,...]``."""
        extra = [*([f"seed={self.seed}"] if self.seed is not None else []),
                 *([self.params] if self.params else []), f"task={self.task}"]
        return f"{self.name}:{self.size}:" + ",".join(extra)

    @property
    def tag(self) -> str:
        """A folder-safe name: ``hmm-headroom``, ``hmm-headroom-seed7-n_states6-task-5``."""
        parts = [self.name, self.size, *([f"seed{self.seed}"] if self.seed is not None else []),
                 *(x.replace("=", "") for x in (self.params or "").split(",") if x)]
        if self.task != DEFAULT_TASKS.get(self.name):
            parts.append(self.task)
        return "-".join(parts).replace("/", "_").replace(":", "_")

    def settings(self) -> tuple[Setting, ...]:
        return (*((("language.seed", self.seed),) if self.seed is not None else ()),
                *((("language.params", self.params),) if self.params else ()))


def parse_language(text: str) -> LanguageChoice:
    """``NAME[:SIZE][:key=value,...]`` → a ``LanguageChoice`` (``UserError`` naming what is
    wrong). Keys: ``task`` (default ``DEFAULT_TASKS``), ``seed`` (another draw of the size's
    shape), anything else a constructor setting of the language (``language.params``). The
    size defaults to ``headroom``; the language is built here, so a bad setting or a task
    without a span and posterior is refused before anything runs."""
    from ... import registry
    from ...registry import parse_params

    parts = text.strip().split(":")
    if not parts[0] or len(parts) > 3:
        raise UserError(f"--language {text!r}: expected NAME[:SIZE][:key=value,...], e.g. hmm:headroom, "
                        "pcfg:headroom, hmm:headroom:seed=7,emission_concentration=0.5")
    name = parts[0]
    known = registry.languages()
    if name not in known:
        raise UserError(f"--language {text!r}: unknown language {name!r}; choose from {', '.join(known)}")
    size = parts[1] if len(parts) > 1 and parts[1] else "headroom"
    if size not in known[name].sizes:
        raise UserError(f"--language {text!r}: {name} has no size {size!r}; its sizes: "
                        f"{', '.join(known[name].sizes) or '(none)'}")
    # task= names a task (text); every other key is a number: registry.parse_params reads them
    # (the syntax of language.params: key=value, names once, integers or finite decimals)
    items = parts[2].split(",") if len(parts) > 2 and parts[2] else []
    tasks = [item.partition("=")[2].strip() for item in items if item.partition("=")[0].strip() == "task"]
    numbers = [item for item in items if item.partition("=")[0].strip() != "task"]
    if len(tasks) > 1 or (tasks and not tasks[0]):
        raise UserError(f"--language {text!r}: give task=NAME once")
    try:
        values = parse_params(",".join(numbers), what=f"--language {text!r}") if numbers else {}
    except ValueError as exc:
        raise UserError(str(exc)) from None
    task = tasks[0] if tasks else DEFAULT_TASKS.get(name)
    if task is None:
        raise UserError(f"--language {text!r}: say which task to probe (task=NAME: one about a latent at fixed "
                        "positions, with a span and a posterior)")
    seed = values.pop("seed", None)
    if seed is not None and (not isinstance(seed, int) or seed < 0):
        raise UserError(f"--language {text!r}: seed must be a non-negative integer, got {seed!r}")
    params = ",".join(f"{k}={v}" for k, v in values.items()) or None
    choice = LanguageChoice(name, size, task, seed, params)
    try:
        task_span(choice)  # builds the language: a bad setting or task is one line now
    except UserError as exc:
        raise UserError(f"--language {text!r}: {exc}") from None
    return choice


@functools.lru_cache(maxsize=32)
def task_span(choice: LanguageChoice) -> tuple[int, int]:
    """The span ``[start, end)`` of the choice's task (built once per process). The study
    probes a fixed span (every labelled sentence covers it), so ``end`` must be fixed."""
    from ...languages import make_language

    language = make_language(choice.name, preset=choice.size, seed=choice.seed, params=choice.params)
    task = span_task(language, choice.task)
    start, end = task.span
    if end is None:
        raise UserError(f"task {choice.task!r} of {choice.name} spans to the end of each sentence: the study probes "
                        "a fixed span (a task about fixed positions, e.g. an HMM's task-k or a PCFG's span-k)")
    return int(start), int(end)


# The flatness forks (flatness as the treatment): the Fisher-trace penalty's weight λ by fork
# (``training.flatness``; λ < 0 sharpens), calibrated on the tiny HMM with
# bench/calibrate_flatness.py (seed 0's late fork against AdamW, each estimated at the pair's
# target KL): λ −1e-4 raises the trace by 27 % inside both KL ranges, +2e-4 lowers it by 26 %
# (4e-5 nats of extrapolation), +3e-4 by 32 % (2e-4 nats) — with 300 steps at the final lr;
# flattening costs KL (the penalty trades loss for trace: λ 1e-3 lowers it by 55 % but 1.4e-3
# nats above AdamW's range, beyond the extrapolation limit), so the flattening forks get the
# AdamW fork's longer stretch. Calibrated at tiny only: another model size has another trace
# scale, so small and paper leave them out until calibrated there.
FLATNESS_TINY = {"sharp": -1e-4, "flat": 2e-4, "flatter": 3e-4}


def _forks(long_steps: int, short_final: int | None = None, *, sam02: bool = True, width_factor: int = 2,
           extra_layers: int = 1, adv_late_only: bool = False, stretch: dict[str, int] | None = None,
           flatness: dict[str, float] | None = None) -> tuple[Fork, ...]:
    """The forks; ``stretch``: a fork's own steps at the final lr (``final_steps``) by name
    (``STRETCH``), ``short_final`` the short fork's; ``flatness``: the flatness forks' λ by
    name (``FLATNESS_TINY``)."""
    large = ("2× wider and one more block" if (width_factor, extra_layers) == (2, 1)
             else f"{width_factor}× wider and {extra_layers} more blocks" if width_factor > 1
             else f"{extra_layers} more blocks")
    forks = (Fork("adamw", "AdamW (base continued)"),
             Fork("short", "AdamW, decayed at once", recipe_steps=0, final_steps=short_final),
             Fork("long", f"AdamW, {long_steps} steps before the decay", recipe_steps=long_steps),
             Fork("noreg", "−dropout−WD", NOREG),
             Fork("noreg-half", "−dropout−WD on SAM's update half-batch", (*NOREG, ("update_half", True))),
             Fork("sam05", "−dropout−WD+SAM ρ 0.05", (*NOREG, ("sam.rho", 0.05))),
             *((Fork("sam02", "−dropout−WD+SAM ρ 0.02", (*NOREG, ("sam.rho", 0.02))),) if sam02 else ()),
             Fork("adv", "adversarial λ 0.02", adversarial=0.02, late_only=adv_late_only),
             Fork("large", f"AdamW, {large}", width_factor=width_factor, extra_layers=extra_layers),
             *(Fork(name, f"trace penalty λ {weight:g}" + (" (sharpens)" if weight < 0 else ""),
                    (("flatness.weight", weight), ("flatness.measure", "fisher")))
               for name, weight in (flatness or {}).items()))
    return tuple(dataclasses.replace(f, final_steps=stretch[f.name]) if f.name in (stretch or {}) else f
                 for f in forks)


def stretches(final: int) -> dict[str, int]:
    """Each fork's steps at the final lr, in multiples of the preset's ``final`` (issue 34):
    long enough that compared forks' KL ranges overlap. Measured on the tiny HMM (two seeds
    of this design trained with 900-step stretches, KL every 20 steps): with 300 steps for
    all, SAM ρ 0.05 sat 5–6e-4 nats above −dropout−WD late and 1.1–1.7e-3 from scratch,
    the short fork up to 2e-4 above the long one, the adversarial fork 1e-4 above AdamW and,
    from scratch, the large model below AdamW; with these stretches every late pair of those
    two seeds overlaps, and from scratch all but SAM (and its half-batch control) against
    −dropout−WD, whose gaps shrank to 0.3–1.0e-3 (SAM) and 0.1–1.1e-3 (the half batch)
    and close too slowly to close at one lr: the report gives each pair's gap. SAM's steps
    cost two forward–backward passes, so its 3× stretch is the dearest part. The flattening
    forks (``FLATNESS_TINY``) sit above AdamW's KL range after 300 steps (the penalty costs
    loss): AdamW's 2×; the sharpening fork's range already lies inside AdamW's."""
    return {"adamw": 2 * final, "short": 3 * final, "noreg-half": 2 * final, "sam05": 3 * final,
            "sam02": 3 * final, "adv": 2 * final, "large": 2 * final, "flat": 2 * final, "flatter": 2 * final}


COMPARISONS = (
    Comparison("longer", "long", "short", +1, "training longer at the same loss raises accuracy and lowers "
               "the trace (Fig. 2, Fig. 4)"),
    Comparison("noreg", "noreg", "adamw", -1, "removing dropout and weight decay lowers accuracy and raises the "
               "trace (Table 1, 2)"),
    Comparison("sam05", "sam05", "noreg", +1, "SAM (ρ 0.05) recovers accuracy and flatness lost without "
               "dropout and WD (Table 1, 2)"),
    Comparison("sam05-half", "sam05", "noreg-half", +1, "SAM's gain is its perturbation, not its half-size update "
               "batch: SAM (ρ 0.05) against −dropout−WD on the same half batch (Table 1, 2)"),
    Comparison("sam02", "sam02", "noreg", +1, "SAM (ρ 0.02) recovers accuracy and flatness (Table 1, 2)"),
    Comparison("adv", "adv", "adamw", -1, "the adversarial objective lowers accuracy and raises the trace "
               "(Table 1, 2)"),
    Comparison("size", "large", "adamw", +1, "at the same loss a larger model is flatter (traces in one parameter "
               "space) and transfers better (Fig. 3, 5)", reference_trace="trace_fisher_embedded"),
    # flatness as the treatment (not in the paper: its thesis tested directly, the loss held fixed)
    Comparison("flat", "flat", "adamw", +1, "the thesis as a treatment: a trace penalty that flattens (λ > 0) "
               "raises accuracy at the same loss (not in the paper; Fig. 1's claim made causal)"),
    Comparison("flatter", "flatter", "adamw", +1, "the thesis as a treatment: a stronger flattening penalty raises "
               "accuracy at the same loss (not in the paper)"),
    Comparison("sharp", "sharp", "adamw", -1, "the thesis as a treatment: a penalty that sharpens (λ < 0) lowers "
               "accuracy at the same loss (not in the paper)"),
)
# not in the primary family: the half batch's own effect (what SAM's batch control controls)
HALF_BATCH = Comparison("half-batch", "noreg-half", "noreg", +1, "a half-size update batch (more gradient noise) "
                        "flattens (Theorem 3.3's mechanism)")

# where the presets' prior paired SDs (``prior_sds``: a budget's forecast before the pilot) were measured
PRIOR_SOURCE = "not measured yet"
_HMM = {"hmm": "headroom"}
_TASKS = {"hmm": ("task-5",)}


def _preset(scale: str, **kw) -> IsolossPreset:
    common = {**COMMON[scale].common(), "languages": _HMM, "tasks": _TASKS}
    for key in ("training", "reference", "measure", "kl_tolerance"):
        if key in kw:
            common[key] = kw.pop(key)
    names = {f.name for f in kw["forks"]}
    defaults = dict(use=("hmm",), task="task-5", equivalence_margin=0.35, trace_margin=0.05, probe_points=3,
                    comparisons=tuple(c for c in COMPARISONS if {c.recipe, c.reference} <= names),
                    headroom_margin=5.0, on_no_headroom="stop", adversarial_batch=128, adversarial_pool=10_000)
    return IsolossPreset(**common, **{**defaults, **kw})


_TINY = dict(
    base_steps=1000, fork_points=(1000, 0), recipe_steps=100, decay_steps=200, final_lr_factor=0.05,
    final_steps=300, match_every=20, eval_sentences=4000,
    forks=_forks(400, sam02=False, width_factor=1, extra_layers=2, adv_late_only=True, stretch=stretches(300),
                 flatness=FLATNESS_TINY),
    probe_sizes=(50, 200, 1000),
    probe_subsets=(20, 40, 10), probe_pool=2000, probe_test=20_000, probe_epochs=50, probe_l2=1e-2,
    primary_size=200, kl_tolerance=3e-4, extrapolation_limit=1e-3,
    measure=dataclasses.replace(COMMON["tiny"].measure, seeds=(0,)))

PRESETS: dict[str, IsolossPreset] = {
    "smoke": _preset(
        "smoke", seeds=(0, 1, 2), base_steps=30, fork_points=(30, 0), recipe_steps=10, decay_steps=10,
        final_lr_factor=0.05, final_steps=15, match_every=5, eval_sentences=64,
        forks=_forks(20, flatness={"sharp": -1e-3, "flat": 1e-3}), probe_sizes=(8, 16),
        probe_subsets=(3, 3), probe_pool=40, probe_test=64, probe_epochs=3, probe_l2=0.1, primary_size=16,
        kl_tolerance=10.0, extrapolation_limit=10.0, headroom_margin=0.0, on_no_headroom="mark",
        adversarial_batch=32, adversarial_pool=256),
    # the main job: tiny's first two seeds — its first two units exactly (the same runs and
    # measures), one round of two workers on a 2-core CPU
    # the main job: every fork on two seeds (nothing to allocate with two)
    "quick": _preset("tiny", seeds=(0, 1), exempt=("adv",), **_TINY),
    # a pilot of 6 seeds with every fork, then at most 48 seeds, each with the forks of the
    # comparisons still short of an MDE of 0.35 points, within 90 minutes (issue 35)
    "tiny": _preset("tiny", seeds=tuple(range(48)), pilot_seeds=6, exempt=("adv",), budget_minutes=90.0, **_TINY),
    "small": _preset(
        "small", seeds=tuple(range(8)), base_steps=20_000, fork_points=(20_000, 0), recipe_steps=2000,
        decay_steps=2000, final_lr_factor=0.05, final_steps=3000, match_every=200, eval_sentences=20_000,
        forks=_forks(8000, stretch=stretches(3000)), probe_sizes=(50, 200, 1000), probe_subsets=(20, 40, 10),
        probe_pool=5000, probe_test=20_000, probe_epochs=100, probe_l2=1e-2, primary_size=200, kl_tolerance=3e-4,
        extrapolation_limit=1e-3, adversarial_batch=256),
    "paper": _preset(
        "paper", seeds=tuple(range(8)), base_steps=100_000, fork_points=(100_000, 0), recipe_steps=10_000,
        decay_steps=10_000, final_lr_factor=0.05, final_steps=15_000, match_every=1000, eval_sentences=100_000,
        forks=_forks(40_000, stretch=stretches(15_000)), probe_sizes=(50, 200, 1000), probe_subsets=(20, 40, 10),
        probe_pool=5000,
        probe_test=30_000, probe_epochs=100, probe_l2=1e-2, primary_size=200, kl_tolerance=3e-4,
        extrapolation_limit=1e-3, adversarial_batch=256),
}


# ---- runs ---------------------------------------------------------------------------------
def _run_prefix(p: IsolossPreset) -> str:
    """Run names start with the language (its tag in a study of several languages: runs.csv
    lists every language's runs, and two draws of one language must not share a name)."""
    return p.tag or p.language


def _common_settings(p: IsolossPreset, seed: int) -> tuple[Setting, ...]:
    return (*base_settings(p, p.language, seed), *p.language_settings, *p.reference.shape.settings(),
            ("eval.n_sentences", p.eval_sentences), ("save_every", 10 * p.base_steps))


def large_shape(p: IsolossPreset, fork: Fork) -> tuple[Setting, ...]:
    """A size fork's shape as config settings: the reference shape ``width_factor``× wider
    (heads and MLP too) with ``extra_layers`` more blocks (``models.embed``'s plan)."""
    shape = {**TRANSFORMER_SIZES[p.reference.shape.size],
             **{k: v for k, v in dataclasses.asdict(p.reference.shape).items() if k != "size" and v is not None}}
    k = fork.width_factor
    return (("model.d_model", k * shape["d_model"]), ("model.n_heads", k * shape["n_heads"]),
            ("model.n_layers", shape["n_layers"] + fork.extra_layers), ("model.d_inter", k * shape["d_inter"]))


def base_run(p: IsolossPreset, seed: int) -> RunSpec:
    points = tuple(k for k in sorted(p.fork_points) if 0 < k < p.base_steps)
    return RunSpec(f"{_run_prefix(p)}-s{seed}-base", (*_common_settings(p, seed), ("steps", p.base_steps),
                                                   ("checkpoints", points)), label="base", group="base")


def fork_run(p: IsolossPreset, seed: int, fork: Fork, k: int, start: Path | None) -> RunSpec:
    """Fork ``fork`` at point ``k`` (``start``: the checkpoint it starts from; ``None`` at
    step 0). It keeps and evaluates its KL at its candidate checkpoints (every ``match_every``
    steps of its stretch: the curves, the measured checkpoints' KL) and nowhere else."""
    end = p.fork_end(fork)
    keep = set(p.candidates(fork))
    settings = [*_common_settings(p, seed), ("steps", end), ("checkpoints", tuple(sorted(s for s in keep if s > k))),
                ("eval.every", 0), ("eval.at_checkpoints", True), ("optim.decay_steps", p.decay_steps),
                ("optim.final_steps", p.final_steps_of(fork)), ("optim.final_lr_factor", p.final_lr_factor),
                *fork.settings]
    if fork.adversarial:  # on the preset's task (read when the run is built, not when the fork was declared)
        settings += [("adversarial.weight", fork.adversarial), ("adversarial.task", p.task),
                     ("adversarial.batch_size", p.adversarial_batch), ("adversarial.pool_size", p.adversarial_pool)]
    if fork.resized:
        settings += large_shape(p, fork)
    if start is not None:
        settings.append(("init_from", str(Path(start).resolve())))
    point = p.point_name(k)
    return RunSpec(f"{_run_prefix(p)}-s{seed}-{point}-{fork.name}", tuple(settings), label=fork.label,
                   group=fork.name)


def runs(p: IsolossPreset, language: str, seed: int, base_dir: str | Path | None = None) -> list[RunSpec]:
    """The base run and, given its folder, its forks at every point (the size fork's late
    start is an embedded checkpoint the study writes first: ``seed_study``)."""
    base = base_run(p, seed)
    if base_dir is None:
        return [base]
    out = [base]
    for k in sorted(p.fork_points, reverse=True):
        for f in p.forks_at(k):
            if p.fork_point_of(f, k) != k or (f.resized and k > 0):
                continue
            start = checkpoint_dir(Path(base_dir), k) if k > 0 else None
            out.append(fork_run(p, seed, f, k, start))
    return out


# ---- the measures ----------------------------------------------------------------------------
def _probe_spec(p: IsolossPreset, seed: int) -> MeasureSpec:
    """The measures of a measured checkpoint: the Fisher trace and the few-shot probes (its
    KL is the run's own evaluation at the candidate: no second evaluation)."""
    return dataclasses.replace(measure_spec(p, (), seed), loss=False, probe=(), fewshot=p.fewshot(seed))


def _fewshot_spec(p: IsolossPreset, seed: int) -> MeasureSpec:
    return dataclasses.replace(_probe_spec(p, seed), traces=())


def _trace_spec(p: IsolossPreset, seed: int) -> MeasureSpec:
    return dataclasses.replace(_probe_spec(p, seed), fewshot=None)


def _kl_spec(p: IsolossPreset) -> MeasureSpec:
    """The exact KL on the runs' own held-out set (the size fork's start is checked on it)."""
    return MeasureSpec(loss=True, loss_sentences=p.eval_sentences)


# ---- the headroom gate (in each seed's unit, before its forks) -------------------------------
def gate_seed(study: Study, seed: int, p: IsolossPreset, base) -> dict:
    """Probe one seed's trained base beside its random-init encoder, the look-up table and
    the oracle, all with the seed's probe subsets (the look-up and oracle representations do
    not depend on the seed: cached in the experiment's folder per probe draw), and apply the
    gate."""
    trained = study.measure(checkpoint_dir(base.path, p.base_steps), _fewshot_spec(p, seed))
    refs = {kind: study.reference(kind, base.config, MeasureSpec(fewshot=p.fewshot(seed)))
            for kind in ("random-init", "lookup", "oracle")}
    ok, text = headroom_gate(p, seed, trained, refs["random-init"], refs["lookup"], refs["oracle"])
    study.log(text)
    return {"seed": seed, "ok": ok, "text": text, "trained": trained, "random_init": refs["random-init"],
            "lookup": refs["lookup"], "oracle": refs["oracle"]}


def headroom_gate(p: IsolossPreset, seed: int, trained: dict, random_init: dict, lookup: dict, oracle: dict
                  ) -> tuple[bool, str]:
    """Whether the trained encoder has room to differ: ≥ ``headroom_margin`` points above the
    look-up table and the random-init encoder and below the oracle (primary endpoint)."""
    key, m = p.primary_key, p.headroom_margin
    t, r, lk, o = (100 * float(x[key]) for x in (trained, random_init, lookup, oracle))
    ok = t >= lk + m and t >= r + m and t <= o - m
    text = (f"Headroom gate (primary endpoint, seed {seed}'s base at step {p.base_steps}): trained {t:.1f} %, "
            f"random-init {r:.1f} %, look-up table {lk:.1f} %, oracle {o:.1f} %; the gate asks ≥ {m:g} points above "
            f"both references and ≥ {m:g} below the oracle: " + ("passed." if ok else "FAILED"))
    return ok, text


# ---- one seed (a worker process) ---------------------------------------------------------
def seed_study(study: Study, seed: int, p: IsolossPreset, only: frozenset | None = None) -> dict:
    """One seed's chain, one unit of the study (``units``; run by its launcher): train the
    base and gate it (``gate_seed``: with no headroom and ``on_no_headroom="stop"`` no fork
    runs), then train the forks at every fork point and measure each fork's ``probe_steps``
    (trace and probes; for a size contrast the reference's checkpoints embedded into the
    large shape for the trace in one parameter space). ``only``: the ``(point, fork)`` pairs
    this seed runs (a later seed of an adaptive study: the forks of the comparisons still
    short; ``None``: all). Nothing is selected here: the estimation at each comparison's
    target KL reads these rows (``paired.estimate_pairs``)."""
    t0, c0 = time.perf_counter(), _cpu()
    spec = _probe_spec(p, seed)
    # CPU seconds of this process per part (what a budget plans with): the base with its gate,
    # and per fork point and fork its training and its measures
    cost: dict[tuple[str, str, str], float] = {}
    base = study.train(base_run(p, seed))
    gate = gate_seed(study, seed, p, base)
    cost[("", "base", "train+gate")] = _cpu() - c0
    if not gate["ok"] and p.on_no_headroom == "stop":
        return {"gate": gate, "rows": [], "runs": [base], "embedded_kl": [], "curves": {}, "cost": _cost_rows(cost),
                "seconds": time.perf_counter() - t0, "cpu_seconds": _cpu() - c0}
    infos: dict[tuple[str, str], object] = {}  # (point, fork) -> RunInfo
    embedded_kl = []
    wanted = {(p.point_name(k), f.name) for k in p.fork_points for f in p.forks_at(k)}
    if only is not None:
        wanted &= set(only)
    # the runs they read: a base-recipe fork's entry at any point is its late run
    trained = {(p.point_name(p.fork_point_of(f, k)), f.name) for k in p.fork_points for f in p.forks_at(k)
               if (p.point_name(k), f.name) in wanted}
    for k in sorted(p.fork_points, reverse=True):
        start = checkpoint_dir(base.path, k) if k > 0 else None
        for f in p.forks_at(k):
            run_k = p.fork_point_of(f, k)
            if run_k != k:  # the base recipe's late fork
                if (p.point_name(k), f.name) in wanted:
                    infos[(p.point_name(k), f.name)] = infos[(p.point_name(run_k), f.name)]
                continue
            if (p.point_name(k), f.name) not in trained:
                continue
            begin, c1 = start, _cpu()
            if f.resized and start is not None:
                begin = study.embed(start, width_factor=f.width_factor, extra_layers=f.extra_layers,
                                    optimizer="embedded")
                embedded_kl.append(_check_embedded_kl(study, p, start, begin))
            infos[(p.point_name(k), f.name)] = study.train(fork_run(p, seed, f, k, begin))
            cost[(p.point_name(k), f.name, "train")] = _cpu() - c1
    forks = {f.name: f for f in p.forks}
    # the references of a size contrast: their traces in the large model's parameter space too
    one_space = {c.reference: forks[c.recipe] for c in p.comparisons if forks[c.recipe].resized}
    histories = {id(info): eval_history(info.path) for info in infos.values()}
    fork_steps = {p.point_name(k): k for k in p.fork_points}
    rows = []
    for (point, name), info in infos.items():
        if (point, name) not in wanted:  # trained only for another point's entry
            continue
        fork, c1 = forks[name], _cpu()
        for step in p.probe_steps(fork):
            ck = checkpoint_dir(info.path, step)
            study.log(f"measure {study.rel(ck)}")
            measured = study.measure(ck, spec)
            row = {"model": f"{p.tag + ':' if p.tag else ''}s{seed}-{point}-{name}@{step}",
                   "language": p.choice.spec, "seed": seed, "point": point,
                   "fork_step": fork_steps[point], "fork": name,
                   "label": info.spec.label, "run": info.spec.name, "step": step,
                   "steps_at_final_lr": step - p.stretch_start(fork), "lr_factor": info.config.lr_factor(step - 1),
                   "kl": float(histories[id(info)][step]["kl"]),
                   **{key: v for key, v in measured.items() if key in MEASURED or key.startswith(("pos_", "all_"))}}
            if name in one_space:
                big = one_space[name]
                emb = study.embed(ck, width_factor=big.width_factor, extra_layers=big.extra_layers)
                e = study.measure(emb, _trace_spec(p, seed))
                row["trace_fisher_embedded"] = e["trace_fisher"]
                row["trace_fisher_embedded_se"] = e["trace_fisher_se"]
            rows.append(row)
        cost[(point, name, "measure")] = _cpu() - c1
    curves = {f"{pt}-{name}": {s: float(ev["kl"]) for s, ev in histories[id(info)].items()}
              for (pt, name), info in infos.items()}
    curves["base"] = {s: float(ev["kl"]) for s, ev in eval_history(base.path).items()}
    runs_used = [base, *{id(i): i for i in infos.values()}.values()]
    cost_rows, cpu = _first_cost(study, _cost_rows(cost), _cpu() - c0)
    return {"gate": gate, "rows": rows, "runs": runs_used, "embedded_kl": embedded_kl, "curves": curves,
            "cost": cost_rows, "seconds": time.perf_counter() - t0, "cpu_seconds": cpu}


def _first_cost(study: Study, rows: list[dict], cpu: float) -> tuple[list[dict], float]:
    """The CPU a seed cost when it was computed: a later call that reuses its runs and
    measures costs ~0, which a budget must not plan with. Kept in the seed's folder
    (``cost.json``) by the call that finished the seed, read back by every later one."""
    import json

    if not _writes(study):
        return rows, cpu
    path = study.root / "cost.json"
    try:
        saved = json.loads(path.read_text())
        return saved["rows"], float(saved["cpu_seconds"])
    except FileNotFoundError:
        pass
    except (OSError, ValueError, KeyError, TypeError):
        study.log(f"note: {path} is unreadable; this call's CPU is kept instead")
    from ...files import atomic_write_json, storage_errors

    with storage_errors(path):
        atomic_write_json(path, {"rows": rows, "cpu_seconds": cpu}, indent=1)
    return rows, cpu


def _cost_rows(cost: dict[tuple[str, str, str], float]) -> list[dict]:
    """A seed's CPU seconds per part (``seed_study``): one row per fork point, fork and
    stage (a reused run or a cached measure costs ~0: a base-recipe fork's scratch entry)."""
    return [{"point": pt, "fork": f, "stage": st, "cpu_seconds": v} for (pt, f, st), v in cost.items()]


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _check_embedded_kl(study: Study, p: IsolossPreset, small: Path, large: Path) -> dict:
    """The size fork starts from exactly the base's function: its exact KL equals the base
    checkpoint's to ``EMBED_KL_TOLERANCE`` (else the study stops: the construction broke)."""
    a = study.measure(small, _kl_spec(p))["kl"]
    b = study.measure(large, _kl_spec(p))["kl"]
    if not abs(a - b) <= EMBED_KL_TOLERANCE:
        raise RuntimeError(f"the embedded model {large} does not compute the base's function: KL {b!r} vs {a!r}")
    return {"checkpoint": study.rel(small), "kl_small": a, "kl_large": b}


# ---- the report ---------------------------------------------------------------------------
def study_seeds(study: Study, p: IsolossPreset) -> list[int]:
    """The seeds of the runs: the preset's, shifted by ``--seed`` (another seed is an
    independent replication in its own folder)."""
    return [study.seed + s for s in p.seeds]


def units(study: Study, p: IsolossPreset) -> list:
    """One unit per seed and language: its chain (the base run and its headroom gate, then
    its forks at every fork point, the size fork included), measured. An adaptive study
    (``pilot_seeds``) declares its units in two stages: the pilot's seeds first; once they
    have run (``study.done``), the later seeds, each with the forks its allocation gives it
    (``reproduce`` asks again after each stage)."""
    out = []
    for q in language_studies(p):
        first = _pilot_units(study, q)
        out += first
        if q.pilot_seeds and all(u.name in study.done for u in first):
            pilot = [study.done[u.name] for u in first]
            if _forks_ran(q, pilot):
                out += _later_units(study, q, allocation_of(study, q, pilot))
    return out


def _forks_ran(p: IsolossPreset, pilot: list[dict]) -> bool:
    """Whether the pilot's forks ran (not stopped by the headroom gate): else no later seed runs."""
    return all(res["gate"]["ok"] for res in pilot) or p.on_no_headroom != "stop"


def _run_seeds(study: Study, p: IsolossPreset) -> tuple[list[dict], Allocation | None]:
    """Every seed's unit of one language's study, in seed order, and the allocation of an
    adaptive study (its pilot first, then the later seeds it planned)."""
    results = study.run_units(_pilot_units(study, p))
    if not p.pilot_seeds or not _forks_ran(p, results):
        return results, None
    alloc = allocation_of(study, p, results)
    return results + study.run_units(_later_units(study, p, alloc)), alloc


def _pilot_units(study: Study, p: IsolossPreset) -> list:
    """The seeds that run every fork: the pilot's (an adaptive study), else all."""
    seeds = study_seeds(study, p)
    return study.seed_units(_seed_work, seeds[:p.pilot_seeds] if p.pilot_seeds else seeds, p, None, group=p.tag)


def _later_units(study: Study, p: IsolossPreset, alloc: Allocation) -> list:
    """The seeds after the pilot, each with the forks of the tests it is planned for (a seed
    planned for none runs nothing)."""
    out = []
    for index, seed in enumerate(study_seeds(study, p)):
        tests = alloc.active(index) if index >= p.pilot_seeds else []
        if tests:
            out += study.seed_units(_seed_work, [seed], p, _forks_of(p, tests), group=p.tag)
    return out


def _forks_of(p: IsolossPreset, tests: list[str]) -> frozenset:
    """The ``(point, fork)`` pairs the tests ``"comparison @ point"`` compare."""
    by = {f"{c.name} @ {pt}": (c, pt) for c, pt in p.tests()}
    return frozenset((pt, name) for t in tests for c, pt in [by[t]] for name in (c.recipe, c.reference))


def allocation_of(study: Study, p: IsolossPreset, pilot: list[dict]) -> Allocation:
    """The plan of the seeds after the pilot (``allocation``): each test's paired SD of the
    primary accuracy over the pilot's pairs, the seeds its MDE target needs, cut to what the
    budget buys (``budget_minutes``: the pilot's measured CPU per fork, shared over the
    launcher's workers). Written to ``allocation.json`` the first time and read back after
    (a reused seed costs no CPU, so a second call could not measure the pilot again); a
    dry plan (``sameloss plan``) has no pilot data and plans with ``prior_sds``."""
    from ..allocation import afford, allocate

    tests = [f"{c.name} @ {pt}" for c, pt in p.tests()]
    saved = _saved_allocation(study, p)
    if saved is not None:
        sds, costs, pilot_wall = saved["sds"], saved["costs"], saved["pilot_wall"]
    elif not _writes(study):  # a dry plan: no pilot data
        sds, costs, pilot_wall = dict(p.prior_sds), {}, 0.0
    else:
        sds, costs, pilot_wall = _pilot_sds(p, pilot), _pilot_costs(pilot), _pilot_wall(study, pilot)
    sds = {t: float(sds.get(t, math.nan)) for t in tests}
    alloc = allocate(sds, p.pilot_seeds, len(p.seeds), p.mde_target, p.exempt)
    if p.budget_minutes is not None and costs:
        def seed_cost(active: list[str]) -> float:
            forks = _forks_of(p, active)
            runs = {(p.point_name(p.fork_point_of(f, k)), f.name) for k in p.fork_points for f in p.forks_at(k)
                    if (p.point_name(k), f.name) in forks}
            return costs.get("|base|train+gate", 0.0) + sum(
                costs.get(f"{pt}|{name}|train", 0.0) for pt, name in runs) + sum(
                costs.get(f"{pt}|{name}|measure", 0.0) for pt, name in forks)
        alloc = afford(alloc, seed_cost, pilot_wall, 60 * p.budget_minutes, _workers(study))
    if saved is None and _writes(study):
        _save_allocation(study, p, sds, costs, pilot_wall)
    return alloc


def _pilot_sds(p: IsolossPreset, pilot: list[dict]) -> dict[str, float]:
    """Each test's paired SD of the primary accuracy (points) over the pilot's used pairs."""
    rows = [r for res in pilot for r in res["rows"]]
    tests = p.tests()
    pairs = paired.estimate_pairs(rows, tests, [p.primary_key], p.design())
    out = {}
    for c, pt in tests:
        d = [100 * q[f"d_{p.primary_key}"] for q in pairs if q["comparison"] == c.name and q["point"] == pt
             and q["used"]]
        out[f"{c.name} @ {pt}"] = float(np.std(d, ddof=1)) if len(d) >= 2 else math.nan
    return out


def _pilot_costs(pilot: list[dict]) -> dict[str, float]:
    """The pilot's mean CPU seconds per fork point, fork and stage (``cost`` rows), keyed
    ``point|fork|stage``."""
    sums: dict[str, list[float]] = {}
    for res in pilot:
        for r in res.get("cost", []):
            sums.setdefault(f"{r['point']}|{r['fork']}|{r['stage']}", []).append(r["cpu_seconds"])
    return {k: float(np.mean(v)) for k, v in sums.items()}


def _pilot_wall(study: Study, pilot: list[dict]) -> float:
    """The pilot's wall seconds, as its seeds shared the workers (their summed CPU over them)."""
    return sum(res["cpu_seconds"] for res in pilot) / _workers(study)


def _workers(study: Study) -> int:
    from .. import _workers_of

    launcher = getattr(study, "launcher", None)
    return 1 if launcher is None else _workers_of(launcher)


def _writes(study) -> bool:
    """A real study (a dry plan's stand-in has no launcher and writes nothing)."""
    return getattr(study, "launcher", None) is not None


def _allocation_path(study: Study, p: IsolossPreset) -> Path:
    return study.root / (f"{p.tag}-allocation.json" if p.tag else "allocation.json")


def _allocation_key(p: IsolossPreset) -> dict:
    return {"pilot": p.pilot_seeds, "seeds": list(p.seeds), "tests": [f"{c.name} @ {pt}" for c, pt in p.tests()]}


def _saved_allocation(study: Study, p: IsolossPreset) -> dict | None:
    """What the first call measured of the pilot (``allocation.json``), if it is this design's."""
    import json

    if not _writes(study):
        return None
    path = _allocation_path(study, p)
    try:
        saved = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise UserError(f"{path}: cannot be read ({exc}); it records the pilot's spread and cost — remove it to "
                        "measure the pilot again") from None
    return saved if isinstance(saved, dict) and saved.get("key") == _allocation_key(p) else None


def _save_allocation(study: Study, p: IsolossPreset, sds: dict, costs: dict, pilot_wall: float) -> None:
    from ...files import atomic_write_json, storage_errors

    path = _allocation_path(study, p)
    with storage_errors(path):
        atomic_write_json(path, {"key": _allocation_key(p), "sds": sds, "costs": costs, "pilot_wall": pilot_wall},
                          indent=1)


def with_budget(p: IsolossPreset, minutes: float) -> IsolossPreset:
    """``reproduce isoloss --budget MINUTES``: the preset with that budget (an adaptive study
    spends it on the comparisons still short; ``UserError`` for one that cannot)."""
    if not minutes > 0:
        raise UserError(f"--budget must be a positive number of minutes, got {minutes:g}")
    if not p.pilot_seeds:
        raise UserError("--budget: this scale runs every fork on every seed (no pilot): there is nothing to spend "
                        "adaptively; `sameloss plan` says what it costs")
    return dataclasses.replace(p, budget_minutes=float(minutes))


def forecast(p: IsolossPreset, device: str, workers: int, cpu_peak: float | None = None) -> str:
    """What the budget buys, before anything trains: the planner's cost per fork and stage
    (``sameloss plan``'s model: one seed of the study planned with every fork), the
    allocation the ``prior_sds`` would give (the pilot's own SDs plan the seeds once it has
    run) cut to the budget; the comparisons it expects to decide and those it does not."""
    from ..allocation import afford, allocate
    from ..plan import dry_plan, estimate

    one = dataclasses.replace(p, seeds=p.seeds[:2], pilot_seeds=0, budget_minutes=None, replicate=())
    e = estimate(dry_plan("isoloss", "tiny", preset=one), device, 1, cpu_peak, memory=False)
    costs: dict[str, float] = {}
    for item in (*e.runs, *e.measures):
        key = _cost_key(item["run"], "train" if "steps" in item else "measure")
        costs[key] = costs.get(key, 0.0) + item["seconds"] / len(one.seeds)
    per_seed = sum(costs.values())
    tests = [f"{c.name} @ {pt}" for c, pt in p.tests()]
    prior = dict(p.prior_sds)
    if not prior:
        return (f"Budget forecast: the pilot ({p.pilot_seeds} seeds, every fork) costs ~{_minutes(p.pilot_seeds * per_seed / workers)} "
                f"on {workers} worker(s) by the planner; no prior paired SDs in the preset, so the later seeds are "
                "planned only once the pilot has run.")
    alloc = allocate({t: prior.get(t, math.nan) for t in tests}, p.pilot_seeds, len(p.seeds), p.mde_target, p.exempt)

    def seed_cost(active: list[str]) -> float:
        forks = _forks_of(p, active)
        return costs.get("|base|train", 0.0) + costs.get("|base|measure", 0.0) + sum(
            v for k, v in costs.items() if tuple(k.split("|")[:2]) in forks)

    pilot_wall = p.pilot_seeds * per_seed / workers
    cut = afford(alloc, seed_cost, pilot_wall, 60 * p.budget_minutes, workers) if p.budget_minutes else alloc
    expect = [t for t in tests if cut.needed[t] is not None and cut.planned[t] >= cut.needed[t]]
    short = [f"{t} (needs {cut.needed[t] or f'more than {cut.cap}'} seeds, gets {cut.planned[t]})" for t in tests
             if t not in expect and not t.startswith(tuple(f"{x} @" for x in p.exempt))]
    return (f"Budget forecast ({device}, {workers} worker(s), the planner's cost model: ~{_minutes(per_seed)} per seed "
            f"with every fork): the pilot of {p.pilot_seeds} seeds ~{_minutes(pilot_wall)}; "
            + (cut.budget_note + "; " if cut.budget_note else "")
            + f"with the prior paired SDs ({_prior_source(p)}) the MDE target {p.mde_target:g} points is expected "
            f"for: {', '.join(expect) or 'none'}; not for: {'; '.join(short) or 'none'}"
            + (f"; exempt (tested on the pilot): {', '.join(p.exempt)}" if p.exempt else "") + ".")


def _cost_key(run: str, stage: str) -> str:
    """``point|fork|stage`` of a planned run or measure (its run's name ``…-s<seed>-<point>-<fork>``
    or ``…-base``; a reference's measure belongs to the base)."""
    import re

    found = re.search(r"-s\d+-(?P<rest>.+)$", run)
    if found is None or found["rest"] == "base":
        return f"|base|{stage}"
    point, _, fork = found["rest"].partition("-")
    return f"{point}|{fork}|{stage}"


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 60 else f"{seconds:.0f} s"


def _prior_source(p: IsolossPreset) -> str:
    return PRIOR_SOURCE if p.prior_sds else "none"


def all_seeds(study: Study, p: IsolossPreset) -> list[int]:
    """Every seed of the study (``reproduce --seeds`` accepts them before an adaptive study's
    later seeds are declared)."""
    return sorted({s for q in language_studies(p) for s in study_seeds(study, q)})


def language_studies(p: IsolossPreset) -> list[IsolossPreset]:
    """The study's per-language presets: the preset itself, or one per language of
    ``replicate`` (each tagged: its seeds in ``seeds/<tag>/``)."""
    return [p.on(c, c.tag) for c in p.replicate] if p.replicate else [p]


def with_languages(p: IsolossPreset, specs: list[str]) -> IsolossPreset:
    """``reproduce isoloss --language SPEC [--language SPEC ...]``: the preset on those
    languages (``parse_language``; one: the study of that language; several: a study per
    language and the replication table)."""
    choices = list(dict.fromkeys(parse_language(s) for s in specs))
    tags = [c.tag for c in choices]
    if len(set(tags)) != len(tags):
        raise UserError(f"--language: two languages with one name ({', '.join(tags)})")
    return p.on(choices[0]) if len(choices) == 1 else dataclasses.replace(p, replicate=tuple(choices))


def folder_suffix(p: IsolossPreset) -> str:
    """The experiment folder's suffix: none on the preset's own language, else the
    languages' tags (each choice of languages is its own experiment)."""
    own = PRESETS["tiny"].choice
    return ("" if p.choices() == (own,) else "-" + "+".join(c.tag for c in p.choices())) + ("-even" if p.even else "")


def with_even(p: IsolossPreset) -> IsolossPreset:
    """``reproduce isoloss --even``: every seed runs every fork, the scale's first
    ``even_seeds`` seeds, no pilot and no budget (the design before issue 35; its own folder)."""
    if not p.pilot_seeds:
        return p
    return dataclasses.replace(p, seeds=p.seeds[:p.even_seeds], pilot_seeds=0, budget_minutes=None, even=True)




def report(study: Study, p: IsolossPreset) -> list[Section]:
    """Two sections: the verdicts with their MDE (``lead``: before the Runs table, issue 23)
    and the study (design, headroom, selection, every table and figure). On several
    languages (issue 24): the replication table first, then each language's verdicts and
    study, their files and figures named by the language's tag."""
    if not p.replicate:
        lead, section, _ = _language_report(study, p)
        return [lead, section]
    leads, sections, outcomes = [], [], []
    for q in language_studies(p):
        lead, section, outcome = _language_report(study, q)
        _prefix_files(q.tag, lead, section)
        leads.append(lead)
        sections.append(section)
        outcomes.append(outcome)
    rep = replication_section(outcomes)
    rep.text[-1] += " Each language's verdicts, design and tables follow, under its name."
    return [rep, *leads, *sections]


def replication_section(outcomes: list[dict]) -> Section:
    """The replication table of the languages' ``outcomes`` (``_language_report``'s, or
    ``finished_studies``' read back from study folders), with what it means."""
    rep = Section("Replication across languages", lead=True)
    rep.text.append(
        f"{len(outcomes)} languages: " + "; ".join(
            f"{o['language']} ({'headroom gate passed' if o['ok'] else 'NO HEADROOM: its verdicts are uninformative'})"
            for o in outcomes) + ". Per comparison the verdict on each language and whether it replicates: "
        "\"replicated (paper's direction)\" or \"replicated (against the paper)\" only where every language with "
        "headroom detects the effect in that one direction, \"contradicted\" where detections point both ways, "
        "\"not replicated\" otherwise, \"uninformative\" with fewer than two languages with headroom and an "
        "estimate. The pooled estimate is over the languages with headroom, each with its standard error sd/√n of "
        "its used pairs: random effects (DerSimonian–Laird τ²) with the Hartung–Knapp–Sidik–Jonkman t interval on "
        "k − 1 degrees of freedom (a normal interval is anti-conservative with few languages), beside the "
        "fixed-effect estimate; I² is the share of the spread between languages beyond chance. With fewer than two "
        "languages with headroom nothing is pooled.")
    paired.replication(rep, outcomes)
    return rep


def _tag_of(spec: str) -> str:
    """The tag a study of several languages gives the language ``spec`` (``hmm-headroom``);
    the spec itself where this installation cannot build it (a plugin's language gone)."""
    try:
        return parse_language(spec).tag
    except UserError:
        return spec


def finished_studies(folder: str | Path, label: str | None = None) -> list[dict]:
    """What the replication table reads of a finished ``reproduce isoloss`` folder, per
    language: one language (``differences.csv``) or several (``<tag>-differences.csv``).
    Whether a language had headroom is read from its gate table (``gate.csv``: every seed's
    gate), never inferred from a missing file: a language whose study stopped at the gate
    (or marked every verdict uninformative) is there, without headroom; a study whose seeds
    all passed but whose differences are missing is an error. ``label`` names a
    one-language folder (default: the language its ``results.csv`` names, else the
    folder's name). ``UserError`` (one line) for a folder that is no finished study."""
    import csv

    folder = Path(folder)
    if not folder.is_dir():
        raise UserError(f"{folder}: no such study folder")
    if not (folder / "report.md").is_file():
        raise UserError(f"{folder}: not a finished isoloss study (no report.md: run `sameloss reproduce isoloss` "
                        "to its end, or without --seeds)")

    def rows(path: Path) -> list[dict]:
        try:
            with path.open(newline="") as f:
                return list(csv.DictReader(f))
        except (OSError, UnicodeDecodeError, csv.Error) as exc:
            raise UserError(f"{path}: cannot be read ({exc})") from None

    tags = sorted({path.name[:-len("-headroom.csv")] for path in folder.glob("*-headroom.csv")})
    if not tags and not (folder / "headroom.csv").is_file():
        raise UserError(f"{folder}: not an isoloss study folder (no headroom.csv; is it another experiment's?)")
    if tags and label is not None:
        raise UserError(f"{folder}: a study of {len(tags)} languages is named by its own tags ({', '.join(tags)}); "
                        "give it without LABEL=")
    if not tags:
        results = folder / "results.csv"
        named = {r.get("language") for r in rows(results)} - {None, ""} if results.is_file() else set()
        tags = [label or (_tag_of(named.pop()) if len(named) == 1 else folder.name)]
        files = {tags[0]: folder / "differences.csv"}
    else:
        files = {tag: folder / f"{tag}-differences.csv" for tag in tags}
    out = []
    needed = {"family", "comparison", "point", "n_used", "mean", "sd", "t_low", "t_high", "verdict"}
    for tag, path in files.items():
        gate_path = path.with_name(path.name.replace("differences.csv", "gate.csv"))
        if not gate_path.is_file():
            raise UserError(f"{folder}: no {gate_path.name} (the headroom gate of every seed): a study from an "
                            "earlier version of sameloss or an unfinished one; rerun it to its end")
        gates = rows(gate_path)
        if not gates or "ok" not in gates[0]:
            raise UserError(f"{gate_path}: not an isoloss gate table (no seeds, or no 'ok' column)")
        ok = all(g["ok"] == "True" for g in gates)
        if ok and not path.is_file():
            raise UserError(f"{folder}: every seed passed the headroom gate but {path.name} is missing: the study "
                            "is incomplete or the file was removed; rerun it to its end")
        diffs = rows(path) if path.is_file() else []
        if diffs and not needed <= set(diffs[0]):
            raise UserError(f"{path}: lacks the columns {', '.join(sorted(needed - set(diffs[0])))}: not an isoloss "
                            "differences table (or one from an earlier version: rerun the study)")
        primary = [r for r in diffs if r["family"] == "primary"]
        out.append({"language": tag, "tag": tag, "ok": ok, "diffs": diffs,
                    "tests": list(dict.fromkeys(f"{r['comparison']} @ {r['point']}" for r in primary)),
                    "folder": str(folder)})
    return out


def _prefix_files(tag: str, *sections: Section) -> None:
    """A language's CSV files named ``<tag>-<file>`` (the tables that read them too)."""
    for section in sections:
        renamed = {name: f"{tag}-{name}" for name in section.files}
        section.files = {renamed[k]: v for k, v in section.files.items()}
        for t in section.tables:
            t.source = renamed.get(t.source, t.source)


def _language_report(study: Study, p: IsolossPreset) -> tuple[Section, Section, dict]:
    """One language's verdicts and study, and what the replication table reads of it."""
    where = f" — {p.choice.spec}" if p.tag else ""
    section = Section(TITLE + where)
    lead = Section("Verdicts" + where, lead=True)
    language, size, task = _language(p)
    # every seed's unit gated its forks on its own base (gate_seed); headroom.csv shows the first seed's
    results, alloc = _run_seeds(study, p)
    seeds = [res["gate"]["seed"] for res in results]
    gates = [res["gate"] for res in results]
    ok = all(g["ok"] for g in gates)
    failed = [g for g in gates if not g["ok"]]
    gate_text = gates[0]["text"] if ok else " ".join(g["text"] for g in failed)
    if ok and len(gates) > 1:
        gate_text += f" (passed on all {len(gates)} seeds' bases; gate.csv: each seed's; headroom.csv: seed {seeds[0]}'s)"
    _headroom(section, p, gates[0])
    _gate_table(section, p, gates)
    if not ok and p.on_no_headroom == "stop":
        for res in results:
            section.runs += res["runs"]
        section.text.append(f"**No headroom: the forks were not run** (the {len(failed)} of {len(gates)} seeds whose "
                            f"base failed the gate), **and no verdict is given.** {gate_text} On this language and "
                            "task the trained encoder cannot be told apart from the references, so no verdict would "
                            "mean anything (set `on_no_headroom=\"mark\"` in the preset to run the forks anyway).")
        lead.text.append(f"**No verdict: no headroom** ({len(failed)} of {len(gates)} seeds' bases failed the gate; "
                         "the headroom table below says by how much).")
        return lead, section, {"language": p.choice.spec, "tag": p.tag, "ok": False, "diffs": [],
                               "tests": [f"{c.name} @ {pt}" for c, pt in p.tests()]}
    design = p.design(headroom=ok, pilot=tuple(study_seeds(study, p)[:p.pilot_seeds]) if alloc is not None else ())
    rows = [r for res in results for r in res["rows"]]
    for res in results:
        section.runs += res["runs"]
    section.rows += rows
    comparisons = {c.name: c for c in (*p.comparisons, HALF_BATCH)}
    tests = p.tests()
    section.text.append(_design_text(p, seeds, language, size, task, gate_text, ok))
    accuracies = [(f"{v}_{m}_n{n}", f"probe {v} {m} n={n}") for v, m in ENDPOINTS for n in p.probe_sizes]
    quantities = [key for key, _ in accuracies] + ["trace_fisher"]
    pairs = paired.estimate_pairs(rows, tests, quantities, design)
    diffs = paired.differences(pairs, tests, accuracies, p.primary_key, design)
    half_tests = [(HALF_BATCH, pt) for pt in _point_names(p)]
    half = paired.differences(paired.estimate_pairs(rows, half_tests, [p.primary_key, "trace_fisher"], design),
                              half_tests, [(p.primary_key, "primary probe")], p.primary_key, design)
    _verdict_table(lead, p, diffs, seeds, ok)
    _decided(lead, p, diffs)
    if alloc is not None:
        from ..allocation import allocation_table

        allocation_table(section, alloc, {f"{r['comparison']} @ {r['point']}": r["n_used"] for r in diffs
                                          if r["family"] == "primary"}, "allocation.csv")
    paired.pairs_table(section, pairs, p.primary_key)
    paired.difference_tables(section, diffs, comparisons)
    _sam_controls(section, diffs, half)
    _size_table(section, p, rows, pairs, diffs, results)
    points = _point_names(p)
    if len(points) >= 2:
        dose_comparisons = [c for c in p.comparisons if all((c, pt) in tests for pt in points[:2])]
        paired.dose(section, pairs, dose_comparisons, (points[0], points[1]), p.primary_key, design)
    flat = [c for c in p.comparisons if c.recipe in flatness_forks(p) and c.reference == "adamw"]
    if flat:  # flatness as the treatment: accuracy per unit of relative trace change, within seeds
        paired.dose_response(section, pairs, flat, [pt for pt in points if all((c, pt) in tests for c in flat)],
                             p.primary_key, design)
    reg = []
    for pt in points:
        reg += paired.regression(section, rows, p.primary_key, pt, _regression_without(p), design)
    _regression_table(section, reg)
    section.notes.append(paired.HOLM_FAMILIES)
    _figures(study, section, p, rows, diffs, results, seeds)
    _runtime(section, study, results, seeds)
    return lead, section, {"language": p.choice.spec, "tag": p.tag, "ok": ok, "diffs": diffs,
                           "tests": [f"{c.name} @ {pt}" for c, pt in tests]}


def _decided(section: Section, p: IsolossPreset, diffs: list[dict]) -> list[dict]:
    """The study's answer: per comparison and fork point whether the primary test decided
    (detected, or no effect beyond ±δ) and, where not, how many more seeds its MDE target
    needs at its measured paired SD (``allocation.needed_seeds``)."""
    from ..allocation import needed_seeds
    from ..stats import DETECTED, DETECTED_AGAINST, EQUIVALENT

    out = []
    for r in diffs:
        if r["family"] != "primary":
            continue
        decided = r["verdict"] in (DETECTED, DETECTED_AGAINST, EQUIVALENT)
        stein = 0 < int(r["df"]) < int(r["n_used"]) - 1  # Stein's test: its spread is the pilot's
        need = None if decided else needed_seeds(r["sd"], p.mde_target, start=max(int(r["n_used"]), 2),
                                                 pilot=int(r["df"]) + 1 if stein else None)
        out.append({"test": f"{r['comparison']} @ {r['point']}", "decided": decided, "verdict": r["verdict"],
                    "used": r["n_used"], "mde": r["mde"],
                    "more_seeds": math.nan if decided or need is None else max(0, need - int(r["n_used"]))})
    done = [f"{x['test']} ({x['verdict']})" for x in out if x["decided"]]
    open_ = [f"{x['test']} ({_more(x)})" for x in out if not x["decided"]]
    section.files["decided.csv"] = out
    section.text.append(f"**Decided ({len(done)} of {len(out)}):** " + ("; ".join(done) or "none") + ". "
                        "**Undecided:** " + ("; ".join(open_) or "none") + f" (seeds for an MDE of {p.mde_target:g} "
                        "points at each comparison's measured paired SD).")
    return out


def _more(x: dict) -> str:
    if math.isfinite(x["more_seeds"]):
        return f"MDE {fmt(x['mde'])} with {x['used']} seeds; {int(x['more_seeds'])} more seeds"
    if not math.isfinite(x["mde"]):
        return f"{x['used']} pairs without spread or too few: no MDE"
    return f"MDE {fmt(x['mde'])} with {x['used']} seeds; more than 10,000 seeds"


def _regression_without(p: IsolossPreset) -> tuple[str, ...]:
    """The forks Fig. 1 within seeds leaves out: the adversary (its accuracy loss is by
    construction), the other model sizes (their traces live in another space) and the
    flatness forks (flatness is their treatment: the dose-response tests them)."""
    return ("adv", *(f.name for f in p.forks if f.resized), *flatness_forks(p))


def flatness_forks(p) -> tuple[str, ...]:
    """The forks whose treatment is a flatness penalty (``flatness.weight`` ≠ 0)."""
    return tuple(f.name for f in p.forks if dict(f.settings).get("flatness.weight", 0))


def _seed_work(study: Study, seed: int, p: IsolossPreset, only: frozenset | None) -> dict:
    return seed_study(study, seed, p, only)


def _point_names(p: IsolossPreset) -> list[str]:
    return [p.point_name(k) for k in sorted(p.fork_points, reverse=True)]


def _design_text(p: IsolossPreset, seeds: list[int], language: str, size: str, task: str, gate_text: str,
                 ok: bool) -> str:
    f = {x.name: x for x in p.forks}
    points = ", ".join(f"{p.point_name(k)} (step {k})" for k in sorted(p.fork_points, reverse=True))
    longer = [x for x in p.forks if x.final_steps is not None and x.name != "short"]
    return (
        f"Language {p.choice.spec} ({language}, size {size}), task {task} (its latent over positions "
        f"{p.span[0] + 1}–{p.span[1]}); {len(seeds)} seeds; "
        f"base run {p.base_steps} steps (AdamW, constant lr after the warm-up). Fork points: {points}. Every fork "
        f"trains its recipe up to step {p.base_steps + p.recipe_steps} (short: {p.base_steps}, long: "
        f"{p.base_steps + p.recipe_steps_of(f['long'])}), decays the lr linearly over {p.decay_steps} steps to "
        f"{p.final_lr_factor:g} × lr and holds it for {p.final_steps} steps (short: {p.final_steps_of(f['short'])}"
        + "".join(f", {x.name}: {p.final_steps_of(x)}" for x in longer) + "): its *stretch*. "
        f"**The same loss, estimated**: KL on one shared held-out set of {p.eval_sentences} sentences every "
        f"{p.match_every} steps of each stretch (lr factor {p.final_lr_factor:g} for all); each fork measured (trace "
        f"and probes) at {p.probe_points} checkpoints spread over its stretch, first and last included. Per "
        "comparison and seed one target KL, from the two forks' measured KL ranges alone (the middle of their "
        "overlap, or of the gap between them); each fork's accuracy and trace estimated at the target by the "
        "least-squares line through its own checkpoints (each seed's estimate from its own checkpoints only, so "
        "the seeds stay independent and the t interval across seeds covers the fit's error). Every pair is used "
        f"unless a fork's estimate lies more than {p.extrapolation_limit:g} nats outside its measured range (such a "
        "pair is named with its reason); the sensitivity row beside each result uses only the pairs whose ranges lie "
        f"within {p.kl_tolerance:g} nats of each other (the earlier exclusion rule). Probes: the same "
        f"{p.probe_pool}-example pool and {p.probe_test}-example test set for every model, the training subsets drawn "
        "per seed (the same for the seed's forks). **Primary endpoint**: probe at the task's position, converged "
        f"L-BFGS (l2 {p.probe_l2:g}), n = {p.primary_size}, mean over "
        f"{dict(zip(p.probe_sizes, p.probe_subsets))[p.primary_size]} subsets; accuracies in %. Verdicts: "
        "\"detected\" when the two-sided 95% t interval excludes 0; \"no effect beyond ±δ (TOST, 90% interval)\" when "
        "both one-sided tests at α = 0.05 reject an effect of ±δ (the 90% t interval inside ±δ), with δ fixed in the "
        f"preset: {p.equivalence_margin:g} points for accuracies, {100 * p.trace_margin:g} % of the reference fork's "
        "mean trace for traces; else \"inconclusive\". MDE: the true difference the two-sided test detects with 80% "
        "power, from the noncentral t: MDE = λ*·sd/√n, λ* solving P(|T′(n−1, λ*)| > t(0.975, n−1)) = 0.8. "
        f"{paired.HOLM_FAMILIES} {gate_text}"
        + "".join(f" {x.label} is forked late only (this scale's budget)." for x in p.forks if x.late_only)
        + ("" if ok else " **Every verdict is marked uninformative.**"))


def _verdict_table(section: Section, p: IsolossPreset, diffs: list[dict], seeds: list[int], ok: bool) -> None:
    """The verdicts first: the primary accuracy and the trace of every comparison at every
    fork point, with their MDE and Holm-adjusted p, and the exclusion sensitivity beside."""
    section.text.append(
        f"{len(seeds)} seeds; per comparison and fork point the mean paired difference (recipe − reference) at the "
        "target KL, every pair used unless a fork's estimate lies beyond the extrapolation limit "
        f"({p.extrapolation_limit:g} nats outside its measured KL range), its 95% t interval and its minimum "
        "detectable effect (MDE, 80% power, noncentral t): \"detected\" when the interval excludes 0, \"no effect "
        "beyond ±δ (TOST, 90% interval)\" when the 90% interval lies inside ±δ (δ fixed in the preset: "
        f"{p.equivalence_margin:g} points for accuracies, {100 * p.trace_margin:g} % of the reference's trace for "
        "traces), else \"inconclusive\"; Holm within the primary family (and within the traces). Beside it the "
        f"sensitivity: only the pairs whose forks' KL ranges lie within {p.kl_tolerance:g} nats of each other. The "
        "design, the headroom gate and every table follow the Runs table."
        + ("" if ok else " **The headroom gate failed: every verdict is marked uninformative.**"))
    rows = [r for r in diffs if r["family"] == "primary"]
    trace = {(r["comparison"], r["point"]): r for r in diffs if r["family"] == "trace"}
    out = []
    for r in rows:
        t = trace[(r["comparison"], r["point"])]
        out.append({"test": f"{r['comparison']} @ {r['point']}", "claim": f"{r['recipe']} − {r['reference']}",
                    "sign": "+" if r["expected_sign"] > 0 else "−", "mean": r["mean"], "t_low": r["t_low"],
                    "t_high": r["t_high"], "mde": r["mde"], "holm_p": r["holm_p"], "verdict": r["verdict"],
                    "after_holm": r["after_holm"], "used": r["n_used"], "of": r["n_pairs"],
                    "trace": t["mean"], "trace_low": t["t_low"], "trace_high": t["t_high"],
                    "trace_margin": t["margin"], "trace_verdict": t["verdict"], "tol_n": r["tol_n"],
                    "tol_mean": r["tol_mean"], "tol_low": r["tol_low"], "tol_high": r["tol_high"],
                    "tol_verdict": r["tol_verdict"]})
    section.files["verdicts.csv"] = out
    section.tables.append(Table(
        "Verdicts: primary accuracy difference at the target KL (points; paper's sign of the accuracy effect) and "
        "trace difference per comparison and fork point, with the MDE at 80% power and Holm-adjusted p (primary "
        "family); the sensitivity beside: only the pairs within the KL tolerance",
        [Column("recipe − reference", "claim", text=True), Column("paper", "sign", text=True),
         Column("pairs used", "used", fmt="d"), Column("of", "of", fmt="d"),
         Column("accuracy [95%]", "mean", ci=("t_low", "t_high"), fmt=".2f"), Column("MDE", "mde", fmt=".2f"),
         Column("p Holm", "holm_p", fmt=".2g"), Column("verdict", "verdict", text=True),
         Column("after Holm", "after_holm", text=True),
         Column("trace [95%]", "trace", ci=("trace_low", "trace_high"), fmt=".3g"),
         Column("trace δ", "trace_margin", fmt=".3g"), Column("trace verdict", "trace_verdict", text=True),
         Column("within tolerance", "tol_n", fmt="d"),
         Column("their accuracy [95%]", "tol_mean", ci=("tol_low", "tol_high"), fmt=".2f"),
         Column("their verdict", "tol_verdict", text=True)],
        out, source="verdicts.csv", key="test", key_header="comparison @ fork point"))


def _headroom(section: Section, p: IsolossPreset, gate: dict) -> list[dict]:
    keys = p.fewshot(gate["seed"]).columns()
    columns = [c for key in keys for c in (key, f"{key}_std")]

    def pick(d: dict) -> dict:
        return {k: float(d[k]) for k in columns}

    majority = gate["lookup"]["fewshot_majority"]
    table_rows = [{"baseline": "majority class", **{k: majority for k in keys}},
                  {"baseline": f"random-init encoder (seed {gate['seed']})", **pick(gate["random_init"])},
                  {"baseline": "look-up table (true conditionals)", **pick(gate["lookup"])},
                  {"baseline": f"trained base (seed {gate['seed']}, step {p.base_steps})", **pick(gate["trained"])},
                  {"baseline": "oracle (true posteriors of the task's latent)", **pick(gate["oracle"])}]
    cols = []
    for view, method, what in (("pos", "lbfgs", "position, L-BFGS"), ("all", "adamw", "all positions, AdamW")):
        for n in p.probe_sizes:
            cols.append(Column(f"{what} n={n} (%)", f"{view}_{method}_n{n}", scale=100, fmt=".1f"))
    section.tables.append(Table(
        "Headroom (measured before the forks): probe accuracy of the baselines and the trained base (at the task's "
        "position: converged L-BFGS probe; all positions: the paper's AdamW probe)", cols,
        table_rows, source="headroom.csv", key="baseline", key_header="representation"))
    section.files["headroom.csv"] = table_rows
    return table_rows


def _gate_table(section: Section, p: IsolossPreset, gates: list[dict]) -> None:
    """Every seed's gate (``gate.csv``: what ``sameloss replicate`` reads to know whether a
    study had headroom): the primary endpoint of its base and its references, and whether it
    passed."""
    key = p.primary_key
    out = [{"seed": g["seed"], "trained": float(g["trained"][key]), "random_init": float(g["random_init"][key]),
            "lookup": float(g["lookup"][key]), "oracle": float(g["oracle"][key]), "ok": bool(g["ok"])}
           for g in gates]
    section.files["gate.csv"] = out
    section.tables.append(Table(
        f"The headroom gate per seed (primary endpoint, %; the gate asks ≥ {p.headroom_margin:g} points above the "
        f"look-up table and the random-init encoder and ≥ {p.headroom_margin:g} below the oracle)",
        [Column("trained base", "trained", scale=100, fmt=".1f"), Column("random-init", "random_init", scale=100,
                                                                          fmt=".1f"),
         Column("look-up table", "lookup", scale=100, fmt=".1f"), Column("oracle", "oracle", scale=100, fmt=".1f"),
         Column("passed", "ok", text=True)],
        out, source="gate.csv", key="seed", key_header="seed"))


def _sam_controls(section: Section, diffs: list[dict], half: list[dict]) -> None:
    """SAM against both of its references: −dropout−WD on the full batch and on SAM's half."""
    keep = [r for r in diffs if r["family"] in ("primary", "trace") and r["comparison"] in ("sam05", "sam05-half")]
    keep += [r for r in half if r["family"] in ("primary", "trace")]
    section.files["sam_controls.csv"] = keep
    section.tables.append(Table(
        "SAM's controls: SAM ρ 0.05 against −dropout−WD on the full batch and on the same half batch SAM updates "
        "on, and the half batch's own effect (primary accuracy in points; trace), at the target KL",
        [Column("pairs used", "n_used", fmt="d"), Column("mean [t 95%]", "mean", ci=("t_low", "t_high"), fmt=".3g"),
         Column("MDE", "mde", fmt=".3g"), Column("verdict", "verdict", text=True),
         Column("within tolerance", "tol_n", fmt="d"),
         Column("their mean [t 95%]", "tol_mean", ci=("tol_low", "tol_high"), fmt=".3g")],
        keep, source="sam_controls.csv", key="test", key_header="comparison @ fork point: quantity"))


def _size_table(section: Section, p: IsolossPreset, rows: list[dict], pairs: list[dict], diffs: list[dict],
                results: list[dict]) -> None:
    """The size contrast at the target KL: accuracy, both traces in the large model's
    parameter space, and each model's trace in its own."""
    from ..stats import paired_difference

    size = [c for c in p.comparisons if {f.name: f for f in p.forks}[c.recipe].resized]
    tests = [(c, pt) for c in size for pt in _point_names(p) if (c, pt) in p.tests()]
    # each model's own space: the reference's own trace, estimated at the same targets
    own_tests = [(dataclasses.replace(c, reference_trace="trace_fisher"), pt) for c, pt in tests]
    own = paired.estimate_pairs(rows, own_tests, ["trace_fisher"], p.design())
    out = []
    for c, pt in tests:
        used = [q for q in pairs if q["comparison"] == c.name and q["point"] == pt and q["used"]]
        used_own = {q["seed"] for q in used}
        mine = [q for q in own if q["comparison"] == c.name and q["point"] == pt and q["seed"] in used_own]
        a = paired_difference([100 * q[f"d_{p.primary_key}"] for q in used], seed=1)
        t1 = paired_difference([q["d_trace_fisher"] for q in used], seed=2)
        t0 = paired_difference([q["d_trace_fisher"] for q in mine], seed=3)
        out.append({"test": f"{c.name} @ {pt}", "n_used": a.n, "acc": a.mean, "acc_low": a.t_low,
                    "acc_high": a.t_high, "acc_mde": a.mde, "trace_one_space": t1.mean,
                    "trace_one_space_low": t1.t_low, "trace_one_space_high": t1.t_high,
                    "trace_own": t0.mean, "trace_own_low": t0.t_low, "trace_own_high": t0.t_high,
                    "large_trace": _mean(q["recipe_trace_fisher"] for q in used),
                    "small_trace": _mean(q["reference_trace_fisher"] for q in mine),
                    "small_trace_embedded": _mean(q["reference_trace_fisher"] for q in used)})
    checks = [e for res in results for e in res["embedded_kl"]]
    section.files["size.csv"] = out
    section.tables.append(Table(
        "Size contrast (large − small at the target KL, every pair used unless beyond the limit): primary accuracy "
        "(points), the trace in one parameter space (the small model embedded into the large shape, App. B.4) and "
        "in each model's own; the mean traces at the target",
        [Column("pairs used", "n_used", fmt="d"), Column("accuracy [95%]", "acc", ci=("acc_low", "acc_high"),
                                                          fmt=".3g"),
         Column("MDE", "acc_mde", fmt=".3g"),
         Column("trace, one space [95%]", "trace_one_space", ci=("trace_one_space_low", "trace_one_space_high"),
                fmt=".3g"),
         Column("trace, own spaces [95%]", "trace_own", ci=("trace_own_low", "trace_own_high"), fmt=".3g"),
         Column("large", "large_trace", fmt=".4g"), Column("small", "small_trace", fmt=".4g"),
         Column("small embedded", "small_trace_embedded", fmt=".4g")],
        out, source="size.csv", key="test", key_header="comparison @ fork point"))
    if checks:
        worst = max(abs(e["kl_large"] - e["kl_small"]) for e in checks)
        section.notes.append(f"Size forks start from exactly the base's function: over {len(checks)} seeds the "
                             f"embedded model's exact KL equals the base checkpoint's to {worst:.1e} nats "
                             f"(asserted ≤ {EMBED_KL_TOLERANCE:g}).")


def _mean(values) -> float:
    v = list(values)
    return float(np.mean(v)) if v else math.nan


def _regression_table(section: Section, reg: list[dict]) -> None:
    section.files["regression.csv"] = reg
    section.tables.append(Table(
        "Fig. 1 within seeds: primary accuracy (pts) regressed on trace and KL with seed fixed effects, per fork "
        "point, one row per fork (the mean of its measured checkpoints), one model size, without the adversarial "
        "fork (cluster bootstrap over seeds, 95%; MDE from the noncentral t on seeds − 1 degrees of freedom; no "
        "equivalence margin is set for a slope)",
        [Column("estimate [95%]", "estimate", ci=("low", "high"), fmt=".3g"), Column("MDE 80%", "mde", fmt=".3g"),
         Column("models", "n_models", fmt="d"), Column("verdict", "verdict", text=True)], reg,
        source="regression.csv", key="coefficient", key_header="coefficient"))


def _figures(study: Study, section: Section, p: IsolossPreset, rows: list[dict], diffs: list[dict],
             results: list[dict], seeds: list[int]) -> None:
    """The three figures, drawn with ``plots.py``'s kinds (each writes ``<stem>.data.csv``
    with its plotted numbers): the forest of paired differences, Fig. 1 within seeds, one
    seed's KL curves with the matching window."""
    from ..plots import XY, Band, Fit, Forest, Panel, Ref, forest_plot, scatter_plot, series_plot

    points = _point_names(p)
    stem = f"{p.tag}-" if p.tag else ""  # a language's figures in a study of several
    primary = [r for r in diffs if r["family"] == "primary"]
    trace = {(r["comparison"], r["point"]): r for r in diffs if r["family"] == "trace"}
    forest = []
    for r in primary:
        t = trace[(r["comparison"], r["point"])]
        forest.append({"label": f"{r['comparison']} @ {r['point']} (n={r['n_used']})", "acc": r["mean"],
                       "acc_low": r["t_low"], "acc_high": r["t_high"], "acc_mde": r["mde"], "trace": t["mean"],
                       "trace_low": t["t_low"], "trace_high": t["t_high"], "trace_mde": t["mde"]})
    delta = p.equivalence_margin
    margin = tuple(Ref(v, f"±δ = {delta:g} points (equivalence margin)", axis="x", color="0.45", style="--")
                   for v in (-delta, delta))
    interval = "95 % t interval over the seeds' pairs, each fork estimated at the pair's target KL"
    fig = forest_plot(forest, "label", [
        Forest("acc", "primary accuracy difference (points)", interval=interval, refs=margin),
        Forest("trace", "trace difference (tr(H), Fisher)", interval=interval)],
        "Paired differences at one KL, recipe − reference")
    section.figures.append(study.figure(
        fig, stem + "forest",
        shows="Forest plot: per comparison and fork point, the mean paired difference (recipe − reference) at one "
              "KL of (a) the primary probe accuracy (points) and (b) the trace of Hessian (Fisher estimator); a "
              "solid line at 0 (no difference), grey ticks at ± the row's minimum detectable effect (80 % power), "
              f"in (a) dashed lines at ±δ = {delta:g} points (the equivalence margin)",
        sample=f"{len(seeds)} seeds; per row the pairs used (n in the row's name: every pair unless a fork's "
               f"estimate lies more than {p.extrapolation_limit:g} nats outside its measured KL range)",
        claim="training recipes change downstream accuracy and the trace at the same pre-training loss, with the "
              "paper's signs (Tables 1–2, Figs. 2–5)"))
    scatter = []
    for pt in points:
        models = paired.fork_means(rows, p.primary_key, pt, _regression_without(p))
        by_seed: dict[int, list[dict]] = {}
        for m in models:
            by_seed.setdefault(m["seed"], []).append(m)
        for s, ms in by_seed.items():
            ma = float(np.mean([m["acc"] for m in ms]))
            mt = float(np.mean([m["trace"] for m in ms]))
            for m in ms:  # keys per fork point: each panel draws its own point's models
                scatter.append({"fork": m["fork"], "seed": s, f"dtrace_{pt}": m["trace"] - mt,
                                f"dacc_{pt}": m["acc"] - ma})
    slopes = {r["point"]: r for r in section.files.get("regression.csv", []) if "trace" in r["coefficient"]}
    panels = []
    for pt in points:
        b = slopes.get(pt)
        fit = None if b is None or not math.isfinite(b["estimate"]) else Fit(
            b["estimate"], 0.0, f"{pt}: within-seed slope {fmt(b['estimate'])} [{fmt(b['low'])}, {fmt(b['high'])}] "
                                "pts per unit of trace (95 % cluster bootstrap, KL held fixed)")
        panels.append(XY(f"dtrace_{pt}", f"trace − seed mean, fork point {pt}", f"dacc_{pt}",
                         "primary accuracy − seed mean (points)", fit=fit))
    fig = scatter_plot(scatter, panels, "Fig. 1 within seeds", colour_by=None, marker_by=lambda r: r["fork"])
    section.figures.append(study.figure(
        fig, stem + "scatter",
        shows="Fig. 1 within seeds: every fork's primary probe accuracy (points) against its trace of Hessian "
              "(Fisher estimator), each the mean of the fork's measured checkpoints minus its seed's mean over the "
              "forks of one size at that fork point "
              "(without the adversarial fork), one panel per fork point; marker = fork; line = the within-seed "
              "slope of accuracy on trace through 0 (seed fixed effects, holding KL fixed; regression.csv)",
        sample=f"{len(seeds)} seeds × {len({r['fork'] for r in scatter})} forks per fork point",
        claim="flatter models (smaller trace) transfer better at the same loss (Fig. 1, §4)"))
    first = results[0]
    series: dict[str, list[dict]] = {}
    for name, kl in first["curves"].items():
        if name == "base":  # drawn in every panel
            series.setdefault("base", []).extend({"step": s, **{f"kl_{pt}": v for pt in points}}
                                                 for s, v in sorted(kl.items()))
            continue
        pt, fork = name.split("-", 1)
        series.setdefault(fork, []).extend({"step": s, f"kl_{pt}": v} for s, v in sorted(kl.items()))
    for name in series:
        series[name].sort(key=lambda r: r["step"])
    probed = {}  # the measured checkpoints' KL range per fork point: where the targets lie
    for r in first["rows"]:
        probed.setdefault(r["point"], []).append(float(r["kl"]))
    curve_panels = []
    for k in sorted(p.fork_points, reverse=True):
        pt = p.point_name(k)
        starts = [p.stretch_start(f) for f in p.forks]
        ends = [p.fork_end(f) for f in p.forks]
        window = Band(min(starts), max(ends), f"matching window: the stretches at {p.final_lr_factor:g} × lr")
        target = tuple(Ref(v, f"seed {seeds[0]}'s measured KL range: {what}", color="0.3", style=":")
                       for v, what in ((min(probed[pt]), "lowest"), (max(probed[pt]), "highest"))) \
            if pt in probed else ()
        curve_panels.append(Panel(f"kl_{pt}", f"exact KL, fork point {pt} (nats)", log=True, refs=target,
                                  bands=(window,)))
    fig = series_plot(series, "step", curve_panels, f"Seed {seeds[0]}: exact KL of the base and its forks")
    section.figures.append(study.figure(
        fig, stem + "curves",
        shows=f"Training curves of seed {seeds[0]}: the exact KL to the true conditionals (log axis; held-out set of "
              f"{p.eval_sentences} sentences) against step, for the base and every fork, one panel per fork point; "
              "KL is evaluated only where it is read (every fork's candidates on its stretch, the base's "
              "evaluations); shaded: the matching window (the stretches at "
              f"{p.final_lr_factor:g} × lr); dotted: the lowest and highest KL of the seed's measured checkpoints "
              "(every comparison's target lies between them)",
        sample=f"1 seed ({seeds[0]}) of {len(seeds)}: {len(first['curves'])} runs",
        claim="none directly: it shows that the matched checkpoints lie where the KL moves smoothly at one "
              "learning rate (the design of the iso-loss comparison)"))
    _dose(study, section, p, seeds, stem)


def _dose(study, section: Section, p: IsolossPreset, seeds: list[int], stem: str) -> None:
    """The dose-response of the flatness forks: each pair's primary difference against its
    relative trace change, the mean within-seed slope through the origin per fork point."""
    from ..plots import XY, Fit, Ref, scatter_plot

    slopes = {r["point"]: r for r in section.files.get("dose_response.csv", [])}
    pts = section.files.get("dose_points.csv", [])
    if not pts:
        return
    rows = [{"fork": r["fork"], "seed": r["seed"], f"x_{r['point']}": 100 * r["x"], f"y_{r['point']}": r["y"]}
            for r in pts]
    panels = []
    for pt in [x for x in _point_names(p) if x in slopes]:
        b = slopes[pt]
        fit = None if not math.isfinite(b["slope"]) else Fit(
            b["slope"] / 100, 0.0, f"{pt}: {fmt(b['slope'])} [{fmt(b['t_low'])}, {fmt(b['t_high'])}] points per "
                                   "unit of relative trace change (mean of the seeds' slopes through 0, 95 % t)")
        panels.append(XY(f"x_{pt}", f"trace change at the target KL, fork point {pt} (%)", f"y_{pt}",
                         "primary accuracy difference (points)", fit=fit,
                         refs=(Ref(0.0, "no difference", color="0.6", style="-"),)))
    fig = scatter_plot(rows, panels, "Dose-response: flatness as the treatment", colour_by=None,
                       marker_by=lambda r: r["fork"])
    section.figures.append(study.figure(
        fig, stem + "dose",
        shows="Dose-response of the flatness forks (a trace penalty λ × the Fisher trace in training; λ < 0 "
              "sharpens): per seed and fork, the paired primary probe accuracy difference (fork − AdamW, points) "
              "against the relative trace change (fork ÷ AdamW − 1, %), both at the pair's target KL; one panel "
              "per fork point; marker = fork; line = the mean over seeds of each seed's slope through 0 "
              "(dose_response.csv)",
        sample=f"{len(seeds)} seeds × {len({r['fork'] for r in pts})} flatness forks per fork point (the used pairs)",
        claim="the thesis as a treatment: at the same loss, flatter (a negative trace change) transfers better "
              "(a negative slope)"))


def _runtime(section: Section, study: Study, results: list[dict], seeds: list[int]) -> None:
    rows = [{"seed": s, "seconds": res["seconds"], "cpu_seconds": res["cpu_seconds"]} for s, res in zip(seeds, results)]
    section.files["runtime.csv"] = rows
    # CPU seconds per fork point, fork and stage of every seed (a budget's cost model reads them)
    section.files["cost.csv"] = [{"seed": s, **r} for s, res in zip(seeds, results) for r in res.get("cost", [])]
    cpu = [r["cpu_seconds"] for r in rows]
    section.notes.append(f"Runtime per seed (CPU of the call that computed the seed: seeds/*/cost.json): CPU "
                         f"{fmt(float(np.mean(cpu)))} s on average "
                         f"(min {fmt(min(cpu))}, max {fmt(max(cpu))}; runtime.csv; per fork and stage: cost.csv); "
                         f"{_workers_text(study.launcher)}.")


def _workers_text(launcher) -> str:
    """How many seeds ran at once (what a timing depends on)."""
    if launcher.name == "inprocess":
        return "one seed at a time in this process (--launcher inprocess)"
    n = launcher.workers
    return (f"{n} seeds at a time" if n else "all seeds at once (the launcher's default)") + \
        f" (--launcher {launcher.name})"
