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
    smoke   ~1 min on a 2-core CPU (3 seeds, micro model, tens of steps; the numbers mean
            nothing)
    quick   ~14 min on a 2-core CPU running nothing else (the main job: tiny's first two
            seeds, its first two units exactly; measured in the tiny run below, seeds 0 and 1
            ran side by side in 797 s and 785 s of CPU, 807 s wall; as the main job, 803 s
            wall, its 30 selected models identical to tiny's; MDE: the t quantile at
            1 degree of freedom makes it ~10× a seed's paired SD — several points)
    tiny    99 min on a 2-core CPU running nothing else (measured 2026-11-24: 5961 s wall,
            ``--launcher local --workers 2``; 16 seeds, 208 runs; CPU per seed 680–797 s,
            mean 729 s; load 2.0 throughout) — over the 90-minute budget it was cut for; 14 seeds
            would fit it. MDE of the primary accuracy 0.12–0.43 points where ≥ 11 pairs are
            kept (report: verdicts.csv)
    tiny, ``--language pcfg:headroom``: 71 min (measured 2026-11-24: 4253 s wall on 2 workers,
            idle 2-core CPU; 549-636 s per seed whose forks ran; 14 of 16 bases passed the
            gate, so no verdict); all 16 seeds' forks: ~80 min
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
    "replicated" only where every language with headroom agrees in direction and at least
    one detects; the inverse-variance pooled estimate, fixed and random effects, with
    Cochran's Q and I²). A language without headroom is stopped by the gate (or marked)
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
    scratch: the large shape's own initial weights, same seed and data).
    Forks per scale (the budget's choice at ``quick``/``tiny``, issue 23 item 6: a 2×
    wider model costs 4× per step, and the size forks were 45 % of a seed's training
    FLOPs by ``sameloss plan``): ``small``/``paper``/``smoke`` run every fork above with
    ``large`` 2× wider and one more block; ``quick``/``tiny`` drop ``sam02``, fork ``adv``
    late only (``Fork.late_only``; its comparison is exempt from the MDE target) and make
    ``large`` two more blocks at the same width (2 → 4 blocks, 106 k → 206 k parameters):
    ``sameloss plan isoloss --scale tiny --device cpu`` 6.6 h → 3.3 h on one thread.
    ``adamw``, ``short`` and ``long`` are the base's own recipe until their decay, so their
    forks at every point are the late ones (one run each).
    Headroom gate, before any fork: in each seed's unit its base is probed beside its
    random-init encoder, the look-up table (true conditionals) and the oracle (true
    posteriors); that seed's forks run only if the trained encoder is ≥ ``headroom_margin``
    points above the look-up table and the random-init encoder and ≥ ``headroom_margin``
    below the oracle (primary endpoint). If any seed fails, the study gives no verdict
    (``on_no_headroom="stop"``: the failing seeds ran no fork) or marks every verdict
    "uninformative: no headroom" (``"mark"``: every seed's forks run).
    Iso-loss at one learning rate: candidates are checkpoints every ``match_every`` steps
    of each fork's stretch only (every candidate at the same lr factor, KL evaluated there
    and nowhere else); per seed and fork point one target KL, the one whose nearest
    candidates leave the fewest compared pairs outside ``kl_tolerance`` and then the
    smallest largest |ΔKL| (``paired.choose_target``); each fork is taken at its candidate
    nearest the target. A pair outside the tolerance is excluded from the verdict and
    counted; every pair's step, lr factor and signed ΔKL are reported.
    Transfer: linear probes on the frozen representation at the task's position (primary)
    and on all positions concatenated (the paper's, secondary), trained on the same
    subsets of n = ``probe_sizes`` examples and tested on one test set, for every model: a
    converged convex probe (L-BFGS, the primary) and the paper's fixed-budget AdamW probe.
    Statistics: per comparison and fork point the paired difference across seeds (t and
    bootstrap 95 % intervals, MDE at 80 % power, p raw and Holm-adjusted within the
    primary family); verdicts "detected" (in the paper's direction / against it), "no
    effect beyond ±δ" (the 95 % interval inside ±``equivalence_margin`` points; a trace's
    δ is its MDE), "inconclusive", "degenerate"; the dose (the effect from scratch minus
    late, per seed); the size contrast with traces in one parameter space (the small
    fork's model embedded into the large shape); the KL tolerance checked by the slope of
    accuracy on KL along the AdamW fork's decay and stretch (``slope_seeds`` seeds); Fig. 1
    as a within-seed regression of accuracy on trace and KL (seed fixed effects, cluster
    bootstrap over seeds).

Why the stretch (issue 22, measured on 3 seeds of the earlier design's tiny preset,
/work/notes/matchprobe: its forks decayed over 200 steps, then 300 steps at lr × 0.05, KL
every 10 steps)
    Lead's measurement (seeds 0-2; /work/notes/matchprobe/summary.txt). At the end of
    the shared decay the forks' KLs spread over 1.4-1.7e-3 nats (seed 0: 0.0053-0.0071),
    so matching there means taking forks at different lrs. Along the stretch at the final
    lr KL keeps falling, 0.6-1.4e-3 nats in 300 steps, smoothly (step-to-step sd 4-8e-5,
    well under the 3e-4 tolerance). At that one lr the stretch ranges of adamw/noreg and
    of long/short overlap, so they match by design; SAM ρ 0.05 sits on a higher floor
    (its 300-step range stays 3-4e-4 above noreg's: seed 0 noreg [0.00460, 0.00518] vs
    sam05 [0.00558, 0.00672]), so a SAM pair may fall outside the tolerance: it is then
    excluded and counted, never kept.

Calibration (issue 23: budget, seeds and the profile)
    Before (the earlier design, one fork point, no size forks): 2.6 min per seed, 57 min
    for 22 seeds on two workers. This design as first written (9 late + 6 scratch forks, the
    size fork 2× wider + 1 block): ``sameloss plan isoloss --scale tiny --device cpu`` 6.6 h
    on one thread, 18–22 CPU-min per seed measured. After the cuts (the size fork two
    blocks deeper at the same width, no ρ 0.02, the adversary late only): plan 3.3 h;
    measured 12.1 CPU-min per seed (tiny, above): training 9099 s and measuring 2697 s
    summed over the 16 seeds (77 % / 23 %).

    Profile of one seed of THIS design, measured at a reduced scale (not quick, not tiny):
    quick's seed 0 with every step count divided by 10 (base 100 steps, stretch 30, a
    candidate every 2 steps: the same 16 runs, 15 candidates per fork and measures as
    quick) and a probe test set of 2,000 sentences (quick: 20,000), CPU seconds per stage
    (process time, one thread; load 0.9-1.5 on 2 cores, another job beside it)::

        OMP_NUM_THREADS=1 python bench/profile_isoloss.py --scale quick --shrink 10 --probe-test 2000

        stage                  before (4b5e10d)     after (29 → 28 models measured)
        probes                 174.0 s  44 %        164.7 s  43 %
        training                93.7 s  24 %         94.8 s  25 %
        exact-KL evaluation     67.6 s  17 %         68.3 s  18 %
        Fisher trace            56.6 s  14 %         53.4 s  14 %
        rest                     1.1 s   0 %          1.0 s   0 %
        total                  393.1 s              382.2 s

    Work nobody reads, checked there: exact-KL evaluations 246 per seed = 243 at the forks'
    matching candidates and the AdamW fork's slope checkpoints + 1 at the base's end (its
    training curve) + 2 for the size fork's embedding check: none elsewhere
    (``eval.at_checkpoints``). Cut: the look-up and oracle representations do not depend
    on the seed and were probed in every seed (2 of the 29 measured rows, ~4 s each at
    this scale): now once per study (``core.SEED_FREE_REFERENCES``: 2 probes instead of
    2 × seeds); the AdamW fork's selected checkpoint was probed again for the slope (one
    probed model per slope seed): its row is reused. A single seed's profile shows only the
    second cut (the references are still probed once in it): −9 s of probes, the other
    stages within the run-to-run noise of a shared machine (trace −3 s, training +1 s).
    For quick (4 seeds) the first cut saves 6 of 8 reference probes. Left: probes are the largest
    stage at this scale (at quick's 20,000 test sentences more so), every one read; the
    size fork's check re-evaluates the base checkpoint's KL, which its training curve
    already holds (one evaluation per seed).

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
from ..paired import Comparison, Design, choose_target, nearest_candidate
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
    headroom_margin: float  # points: the gate's distance from look-up, random-init and oracle
    on_no_headroom: str  # "stop" (before the forks) or "mark" (every verdict uninformative)
    slope_seeds: int  # seeds whose AdamW fork is probed along its decay and stretch (the tolerance check)
    # the language beyond its name and size: language.seed / language.params settings (``--language``)
    language_settings: tuple[Setting, ...] = ()
    # a study of several languages (``--language`` given more than once): each its own study in
    # ``seeds/<tag>/``, then a replication table; empty: the one language of ``use``
    replicate: tuple[LanguageChoice, ...] = ()
    # one language's study inside a study of several: its folder and model names start with it
    tag: str = ""

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
        if self.equivalence_margin <= 0 or self.headroom_margin < 0 or self.slope_seeds < 0:
            raise ValueError("equivalence_margin > 0, headroom_margin >= 0, slope_seeds >= 0")

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

    def slope_steps(self, fork: Fork) -> list[int]:
        """The checkpoints of the AdamW fork probed for the along-fork slope of accuracy on
        KL: the decay's start and middle and the stretch's start (its candidates add the rest)."""
        start = self.stretch_start(fork) - self.decay_steps
        return [start, start + self.decay_steps // 2, self.stretch_start(fork)]

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

    def fewshot(self) -> FewShot:
        """The probes every model gets: at the task's span (its positions side by side; an
        HMM state's: one position) and at all positions, the same pool, subsets and test set."""
        return FewShot(self.task, (("pos", span_view(self.span)), ("all", View())), self.probe_sizes,
                       self.probe_subsets, self.probe_pool, self.probe_test, ENDPOINTS, self.probe_epochs,
                       self.probe_l2)

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


def _forks(long_steps: int, short_final: int | None = None, *, sam02: bool = True, width_factor: int = 2,
           extra_layers: int = 1, adv_late_only: bool = False) -> tuple[Fork, ...]:
    large = ("2× wider and one more block" if (width_factor, extra_layers) == (2, 1)
             else f"{width_factor}× wider and {extra_layers} more blocks" if width_factor > 1
             else f"{extra_layers} more blocks")
    return (Fork("adamw", "AdamW (base continued)"),
            Fork("short", "AdamW, decayed at once", recipe_steps=0, final_steps=short_final),
            Fork("long", f"AdamW, {long_steps} steps before the decay", recipe_steps=long_steps),
            Fork("noreg", "−dropout−WD", NOREG),
            Fork("noreg-half", "−dropout−WD on SAM's update half-batch", (*NOREG, ("update_half", True))),
            Fork("sam05", "−dropout−WD+SAM ρ 0.05", (*NOREG, ("sam.rho", 0.05))),
            *((Fork("sam02", "−dropout−WD+SAM ρ 0.02", (*NOREG, ("sam.rho", 0.02))),) if sam02 else ()),
            Fork("adv", "adversarial λ 0.02", adversarial=0.02, late_only=adv_late_only),
            Fork("large", f"AdamW, {large}", width_factor=width_factor, extra_layers=extra_layers))


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
)
# not in the primary family: the half batch's own effect (what SAM's batch control controls)
HALF_BATCH = Comparison("half-batch", "noreg-half", "noreg", +1, "a half-size update batch (more gradient noise) "
                        "flattens (Theorem 3.3's mechanism)")

_HMM = {"hmm": "headroom"}
_TASKS = {"hmm": ("task-5",)}


def _preset(scale: str, **kw) -> IsolossPreset:
    common = {**COMMON[scale].common(), "languages": _HMM, "tasks": _TASKS}
    for key in ("training", "reference", "measure", "kl_tolerance"):
        if key in kw:
            common[key] = kw.pop(key)
    names = {f.name for f in kw["forks"]}
    defaults = dict(use=("hmm",), task="task-5", equivalence_margin=0.35,
                    comparisons=tuple(c for c in COMPARISONS if {c.recipe, c.reference} <= names),
                    headroom_margin=5.0, on_no_headroom="stop", adversarial_batch=128, adversarial_pool=10_000)
    return IsolossPreset(**common, **{**defaults, **kw})


_TINY = dict(
    base_steps=1000, fork_points=(1000, 0), recipe_steps=100, decay_steps=200, final_lr_factor=0.05,
    final_steps=300, match_every=20, eval_sentences=4000, forks=_forks(400, 600, sam02=False, width_factor=1, extra_layers=2, adv_late_only=True),
    probe_sizes=(50, 200, 1000),
    probe_subsets=(20, 40, 10), probe_pool=2000, probe_test=20_000, probe_epochs=50, probe_l2=1e-2,
    primary_size=200, slope_seeds=6, kl_tolerance=3e-4,
    measure=dataclasses.replace(COMMON["tiny"].measure, seeds=(0,)))

PRESETS: dict[str, IsolossPreset] = {
    "smoke": _preset(
        "smoke", seeds=(0, 1, 2), base_steps=30, fork_points=(30, 0), recipe_steps=10, decay_steps=10,
        final_lr_factor=0.05, final_steps=10, match_every=5, eval_sentences=64, forks=_forks(20), probe_sizes=(8, 16),
        probe_subsets=(3, 3), probe_pool=40, probe_test=64, probe_epochs=3, probe_l2=0.1, primary_size=16,
        slope_seeds=2, kl_tolerance=10.0, headroom_margin=0.0, on_no_headroom="mark",
        adversarial_batch=32, adversarial_pool=256),
    # the main job: tiny's first two seeds — its first two units exactly (the same runs and
    # measures), one round of two workers on a 2-core CPU
    "quick": _preset("tiny", seeds=(0, 1), **{k: v for k, v in _TINY.items() if k != "slope_seeds"},
                     slope_seeds=2),
    "tiny": _preset("tiny", seeds=tuple(range(16)), **_TINY),
    "small": _preset(
        "small", seeds=tuple(range(8)), base_steps=20_000, fork_points=(20_000, 0), recipe_steps=2000,
        decay_steps=2000, final_lr_factor=0.05, final_steps=3000, match_every=200, eval_sentences=20_000,
        forks=_forks(8000, 6000), probe_sizes=(50, 200, 1000), probe_subsets=(20, 40, 10), probe_pool=5000,
        probe_test=20_000, probe_epochs=100, probe_l2=1e-2, primary_size=200, slope_seeds=4,
        kl_tolerance=3e-4, adversarial_batch=256),
    "paper": _preset(
        "paper", seeds=tuple(range(8)), base_steps=100_000, fork_points=(100_000, 0), recipe_steps=10_000,
        decay_steps=10_000, final_lr_factor=0.05, final_steps=15_000, match_every=1000, eval_sentences=100_000,
        forks=_forks(40_000, 30_000), probe_sizes=(50, 200, 1000), probe_subsets=(20, 40, 10), probe_pool=5000,
        probe_test=30_000, probe_epochs=100, probe_l2=1e-2, primary_size=200, slope_seeds=4,
        kl_tolerance=3e-4, adversarial_batch=256),
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
    step 0). It evaluates its KL at its candidate checkpoints (and the AdamW fork at its
    slope checkpoints) and nowhere else."""
    end = p.fork_end(fork)
    keep = set(p.candidates(fork)) | (set(p.slope_steps(fork)) if fork.name == "adamw" else set())
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
    """The measures of a selected model: the Fisher trace and the few-shot probes (its KL
    is the run's own evaluation at the candidate: no second evaluation)."""
    return dataclasses.replace(measure_spec(p, (), seed), loss=False, probe=(), fewshot=p.fewshot())


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
    the oracle (the last two do not depend on the seed: measured once per seed folder, a
    few seconds), and apply the gate."""
    trained = study.measure(checkpoint_dir(base.path, p.base_steps), _fewshot_spec(p, seed))
    refs = {kind: study.reference(kind, base.config, MeasureSpec(fewshot=p.fewshot()))
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
def seed_study(study: Study, seed: int, p: IsolossPreset, slope: bool) -> dict:
    """One seed's chain, one unit of the study (``units``; run by its launcher): train the
    base and gate it (``gate_seed``: with no headroom and ``on_no_headroom="stop"`` no fork
    runs), then train the forks at every fork point, pick each point's iso-loss
    checkpoints and measure them (trace and probes; the small model embedded into the large
    shape for the trace), and — with ``slope`` — probe the AdamW fork along its decay and
    stretch."""
    t0, c0 = time.perf_counter(), _cpu()
    spec = _probe_spec(p, seed)
    base = study.train(base_run(p, seed))
    gate = gate_seed(study, seed, p, base)
    if not gate["ok"] and p.on_no_headroom == "stop":
        return {"gate": gate, "rows": [], "slope": [], "runs": [base], "embedded_kl": [], "curves": {},
                "seconds": time.perf_counter() - t0, "cpu_seconds": _cpu() - c0}
    infos: dict[tuple[str, str], object] = {}  # (point, fork) -> RunInfo
    embedded_kl = []
    for k in sorted(p.fork_points, reverse=True):
        start = checkpoint_dir(base.path, k) if k > 0 else None
        for f in p.forks_at(k):
            run_k = p.fork_point_of(f, k)
            if run_k != k:  # the base recipe's late fork
                infos[(p.point_name(k), f.name)] = infos[(p.point_name(run_k), f.name)]
                continue
            begin = start
            if f.resized and start is not None:
                begin = study.embed(start, width_factor=f.width_factor, extra_layers=f.extra_layers,
                                    optimizer="embedded")
                embedded_kl.append(_check_embedded_kl(study, p, start, begin))
            infos[(p.point_name(k), f.name)] = study.train(fork_run(p, seed, f, k, begin))
    forks = {f.name: f for f in p.forks}
    rows, selections = [], []
    selected: dict[tuple[str, int], dict] = {}  # (run, step) -> its row: the slope reuses their probes
    for k in sorted(p.fork_points, reverse=True):
        point = p.point_name(k)
        here = {name: info for (pt, name), info in infos.items() if pt == point}
        kls = {name: {s: float(ev["kl"]) for s, ev in eval_history(info.path).items()} for name, info in here.items()}
        candidates = {name: p.candidates(forks[name]) for name in here}
        pairs = [(c.recipe, c.reference) for c, pt in p.tests() if pt == point]
        target = choose_target(kls, candidates, pairs, p.kl_tolerance)
        for name, info in here.items():
            step = nearest_candidate(kls[name], candidates[name], target)
            ck = checkpoint_dir(info.path, step)
            study.log(f"measure {study.rel(ck)}")
            measured = study.measure(ck, spec)
            selected[(info.spec.name, step)] = measured
            row = {"model": f"{p.tag + ':' if p.tag else ''}s{seed}-{point}-{name}@{step}",
                   "language": p.choice.spec, "seed": seed, "point": point, "fork_step": k,
                   "fork": name, "label": info.spec.label, "run": info.spec.name, "step": step,
                   "steps_at_final_lr": step - p.stretch_start(forks[name]),
                   "lr_factor": info.config.lr_factor(step - 1), "kl_match": kls[name][step], "kl_target": target,
                   "dkl": kls[name][step] - target,
                   **{key: v for key, v in measured.items() if key in MEASURED or key.startswith(("pos_", "all_"))}}
            rows.append(row)
            selections.append((point, name, step))
        # the size contrast's traces in one parameter space: the small model embedded
        for c in p.comparisons:
            if forks[c.recipe].resized and (point, c.reference) in {(r["point"], r["fork"]) for r in rows}:
                small = next(r for r in rows if r["point"] == point and r["fork"] == c.reference)
                big = forks[c.recipe]
                ck = checkpoint_dir(here[c.reference].path, small["step"])
                emb = study.embed(ck, width_factor=big.width_factor, extra_layers=big.extra_layers)
                e = study.measure(emb, _trace_spec(p, seed))
                small["trace_fisher_embedded"] = e["trace_fisher"]
                small["trace_fisher_embedded_se"] = e["trace_fisher_se"]
    slope_rows = []
    if slope:
        info = infos[(p.point_name(p.late), "adamw")]
        history = eval_history(info.path)
        picked = next(r["step"] for r in rows if r["point"] == p.point_name(p.late) and r["fork"] == "adamw")
        for step in sorted(set(p.slope_steps(forks["adamw"])) | {p.candidates(forks["adamw"])[-1], picked}):
            # a selected checkpoint's probes were measured with its trace (the same probes:
            # seeded subsets and heads), not probed again
            m = selected.get((info.spec.name, step)) or study.measure(checkpoint_dir(info.path, step),
                                                                      _fewshot_spec(p, seed))
            slope_rows.append({"seed": seed, "step": step, "kl_match": float(history[step]["kl"]),
                               "lr_factor": info.config.lr_factor(step - 1),
                               **{key: v for key, v in m.items() if key.startswith(("pos_", "all_"))}})
    curves = {f"{pt}-{name}": {s: float(ev["kl"]) for s, ev in eval_history(info.path).items()}
              for (pt, name), info in infos.items()}
    curves["base"] = {s: float(ev["kl"]) for s, ev in eval_history(base.path).items()}
    runs_used = [base, *{id(i): i for i in infos.values()}.values()]
    return {"gate": gate, "rows": rows, "slope": slope_rows, "runs": runs_used, "embedded_kl": embedded_kl,
            "curves": curves, "seconds": time.perf_counter() - t0, "cpu_seconds": _cpu() - c0}


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
    its forks at every fork point, the size fork included), measured."""
    return [u for q in language_studies(p) for u in study.seed_units(_seed_work, *_seed_args(study, q), group=q.tag)]


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
    return "" if p.choices() == (own,) else "-" + "+".join(c.tag for c in p.choices())


def _seed_args(study: Study, p: IsolossPreset) -> tuple:
    seeds = study_seeds(study, p)
    return seeds, p, tuple(seeds[:p.slope_seeds])


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
        "\"replicated\" only where every language with headroom agrees in direction and at least one detects. The "
        "pooled estimate weights each language by the inverse variance of its mean paired difference, over the "
        "languages with headroom; I² is the share of the spread between languages beyond "
        "chance. Each language's standard error is its 95% t interval's half width over 1.96 (a t interval of a few "
        "seeds is wider than ± 1.96 sd/√n); with fewer than two languages with headroom nothing is pooled.")
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
    A language whose study stopped at the headroom gate left only its headroom table (or
    marked every verdict uninformative): it is there, without headroom. ``label`` names a
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
    needed = {"family", "comparison", "point", "n_kept", "mean", "t_low", "t_high", "verdict"}
    for tag, path in files.items():
        diffs = rows(path) if path.is_file() else []
        if diffs and not needed <= set(diffs[0]):
            raise UserError(f"{path}: lacks the columns {', '.join(sorted(needed - set(diffs[0])))}: not an isoloss "
                            "differences table (or one from before the replication table)")
        primary = [r for r in diffs if r["family"] == "primary"]
        ok = any(r["verdict"] != paired.UNINFORMATIVE for r in primary)
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
    seeds = study_seeds(study, p)
    language, size, task = _language(p)
    # every seed's unit gated its forks on its own base (gate_seed): the references are the first seed's
    results = study.map_seeds(_seed_work, *_seed_args(study, p), group=p.tag)
    gates = [res["gate"] for res in results]
    ok = all(g["ok"] for g in gates)
    failed = [g for g in gates if not g["ok"]]
    gate_text = gates[0]["text"] if ok else " ".join(g["text"] for g in failed)
    if ok and len(gates) > 1:
        gate_text += f" (passed on all {len(gates)} seeds' bases; headroom.csv: seed {seeds[0]}'s)"
    _headroom(section, p, gates[0])
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
    design = Design(p.kl_tolerance, p.equivalence_margin, headroom=ok)
    rows = [r for res in results for r in res["rows"]]
    slope_rows = [r for res in results for r in res["slope"]]
    for res in results:
        section.runs += res["runs"]
    section.rows += rows
    comparisons = {c.name: c for c in (*p.comparisons, HALF_BATCH)}
    tests = p.tests()
    section.text.append(_design_text(p, seeds, language, size, task, gate_text, ok))
    _selection_table(section, p, rows)
    accuracies = [(f"{v}_{m}_n{n}", f"probe {v} {m} n={n}") for v, m in ENDPOINTS for n in p.probe_sizes]
    diffs = paired.differences(section, rows, tests, accuracies, p.primary_key, design)
    half = paired.differences(Section(""), rows, [(HALF_BATCH, pt) for pt in _point_names(p)],
                              [(p.primary_key, "primary probe")], p.primary_key, design)
    _verdict_table(lead, p, diffs, seeds, ok)
    paired.difference_tables(section, diffs, comparisons, p.primary_key)
    _sam_controls(section, diffs, half)
    _size_table(section, p, rows, diffs, results)
    points = _point_names(p)
    if len(points) >= 2:
        dose_comparisons = [c for c in p.comparisons if all((c, pt) in tests for pt in points[:2])]
        paired.dose(section, rows, dose_comparisons, (points[0], points[1]), p.primary_key, design)
    slope = paired.along_fork_slope(slope_rows, p.primary_key)
    section.files["slope.csv"] = slope_rows
    paired.tolerance_check(section, rows, diffs, tests, p.primary_key, slope, design)
    reg = []
    for pt in points:
        reg += paired.regression(section, rows, p.primary_key, pt,
                                 ("adv", *(f.name for f in p.forks if f.resized)), design)
    _regression_table(section, reg)
    _figures(study, section, p, rows, diffs, results, seeds)
    _runtime(section, study, results, seeds)
    return lead, section, {"language": p.choice.spec, "tag": p.tag, "ok": ok, "diffs": diffs,
                           "tests": [f"{c.name} @ {pt}" for c, pt in tests]}


def _seed_work(study: Study, seed: int, p: IsolossPreset, slope_seeds: tuple[int, ...]) -> dict:
    return seed_study(study, seed, p, seed in slope_seeds)


def _point_names(p: IsolossPreset) -> list[str]:
    return [p.point_name(k) for k in sorted(p.fork_points, reverse=True)]


def _design_text(p: IsolossPreset, seeds: list[int], language: str, size: str, task: str, gate_text: str,
                 ok: bool) -> str:
    f = {x.name: x for x in p.forks}
    points = ", ".join(f"{p.point_name(k)} (step {k})" for k in sorted(p.fork_points, reverse=True))
    return (
        f"Language {p.choice.spec} ({language}, size {size}), task {task} (its latent over positions "
        f"{p.span[0] + 1}–{p.span[1]}); {len(seeds)} seeds; "
        f"base run {p.base_steps} steps (AdamW, constant lr after the warm-up). Fork points: {points}. Every fork "
        f"trains its recipe up to step {p.base_steps + p.recipe_steps} (short: {p.base_steps}, long: "
        f"{p.base_steps + p.recipe_steps_of(f['long'])}), decays the lr linearly over {p.decay_steps} steps to "
        f"{p.final_lr_factor:g} × lr and holds it for {p.final_steps} steps (short: {p.final_steps_of(f['short'])}). "
        f"**Iso-loss at one learning rate**: candidates every {p.match_every} steps of each stretch (lr factor "
        f"{p.final_lr_factor:g} for all), KL on one shared held-out set of {p.eval_sentences} sentences; per seed and "
        "fork point one target KL, the one leaving the fewest compared pairs outside the tolerance "
        f"{p.kl_tolerance:g} nats and then the smallest largest |ΔKL|; every fork at its candidate nearest it; pairs "
        f"outside the tolerance are excluded and counted. Probes: the same {p.probe_pool}-example pool, subsets and "
        f"{p.probe_test}-example test set for every model. **Primary endpoint**: probe at the task's position, "
        f"converged L-BFGS (l2 {p.probe_l2:g}), n = {p.primary_size}, mean over "
        f"{dict(zip(p.probe_sizes, p.probe_subsets))[p.primary_size]} subsets; accuracies in %. Verdicts: "
        f"\"detected\" when the 95% t interval excludes 0, \"no effect beyond ±δ\" when it lies inside ±δ "
        f"(δ = {p.equivalence_margin:g} points for accuracies, the MDE for traces), else \"inconclusive\"; Holm's "
        f"correction over the primary family. {gate_text}"
        + "".join(f" {x.label} is forked late only (this scale's budget)." for x in p.forks if x.late_only)
        + ("" if ok else " **Every verdict is marked uninformative.**"))


def _verdict_table(section: Section, p: IsolossPreset, diffs: list[dict], seeds: list[int], ok: bool) -> None:
    """The verdicts first: the primary accuracy and the trace of every comparison at every
    fork point, with their MDE and Holm-adjusted p."""
    section.text.append(
        f"{len(seeds)} seeds; per comparison and fork point the mean paired difference (recipe − reference) at one "
        f"KL (pairs within {p.kl_tolerance:g} nats), its 95% t interval and its minimum detectable effect (MDE, "
        f"80% power): \"detected\" when the interval excludes 0, \"no effect beyond ±δ\" when it lies inside ±δ "
        f"(δ = {p.equivalence_margin:g} points for accuracies, the MDE for traces), else \"inconclusive\"; Holm "
        "over the primary family. The design, the headroom gate and every table follow the Runs table."
        + ("" if ok else " **The headroom gate failed: every verdict is marked uninformative.**"))
    rows = [r for r in diffs if r["family"] == "primary"]
    trace = {(r["comparison"], r["point"]): r for r in diffs if r["family"] == "trace"}
    out = []
    for r in rows:
        t = trace[(r["comparison"], r["point"])]
        out.append({"test": f"{r['comparison']} @ {r['point']}", "claim": f"{r['recipe']} − {r['reference']}",
                    "sign": "+" if r["expected_sign"] > 0 else "−", "mean": r["mean"], "t_low": r["t_low"],
                    "t_high": r["t_high"], "mde": r["mde"], "holm_p": r["holm_p"], "verdict": r["verdict"],
                    "after_holm": r["after_holm"], "kept": r["n_kept"], "trace": t["mean"], "trace_low": t["t_low"],
                    "trace_high": t["t_high"], "trace_verdict": t["verdict"]})
    section.files["verdicts.csv"] = out
    section.tables.append(Table(
        "Verdicts: primary accuracy difference (points; paper's sign of the accuracy effect) and trace difference "
        "per comparison and fork point, with the MDE at 80% power and Holm-adjusted p (primary family)",
        [Column("recipe − reference", "claim", text=True), Column("paper", "sign", text=True),
         Column("accuracy [95%]", "mean", ci=("t_low", "t_high"), fmt=".2f"), Column("MDE", "mde", fmt=".2f"),
         Column("p Holm", "holm_p", fmt=".2g"), Column("verdict", "verdict", text=True),
         Column("after Holm", "after_holm", text=True), Column("pairs kept", "kept", fmt="d"),
         Column("trace [95%]", "trace", ci=("trace_low", "trace_high"), fmt=".3g"),
         Column("trace verdict", "trace_verdict", text=True)],
        out, source="verdicts.csv", key="test", key_header="comparison @ fork point"))


def _headroom(section: Section, p: IsolossPreset, gate: dict) -> list[dict]:
    columns = [c for key in p.fewshot().columns() for c in (key, f"{key}_std")]

    def pick(d: dict) -> dict:
        return {k: float(d[k]) for k in columns}

    refs = gate
    majority = refs["lookup"]["fewshot_majority"]
    table_rows = [{"baseline": "majority class", **{k: majority for k in p.fewshot().columns()}},
                  {"baseline": f"random-init encoder (seed {gate['seed']})", **pick(gate["random_init"])},
                  {"baseline": "look-up table (true conditionals)", **pick(refs["lookup"])},
                  {"baseline": f"trained base (seed {gate['seed']}, step {p.base_steps})", **pick(gate["trained"])},
                  {"baseline": "oracle (true posteriors of the task's latent)", **pick(refs["oracle"])}]
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


def _selection_table(section: Section, p: IsolossPreset, rows: list[dict]) -> None:
    cols = [Column("fork point", "point", text=True), Column("fork", "fork", text=True),
            Column("step", "step", fmt="d"), Column("steps at final lr", "steps_at_final_lr", fmt="d"),
            Column("lr factor", "lr_factor", fmt=".3g"), Column("KL (nats)", "kl_match", fmt=".5f"),
            Column("ΔKL to target", "dkl", fmt="+.2e"),
            Column("tr(H) (Fisher)", "trace_fisher", "trace_fisher_se", fmt=".4g")]
    for n in p.probe_sizes:
        cols.append(Column(f"pos n={n} (%)", f"pos_lbfgs_n{n}", scale=100, fmt=".2f"))
    cols.append(Column(f"all AdamW n={p.primary_size} (%)", f"all_adamw_n{p.primary_size}", scale=100, fmt=".2f"))
    section.tables.append(Table("Selection: the iso-loss checkpoint of each fork, per seed and fork point (step, lr "
                                "factor, KL on the shared held-out set, signed ΔKL to the seed's target; probe "
                                "accuracy = mean over subsets)", cols, rows))


def _sam_controls(section: Section, diffs: list[dict], half: list[dict]) -> None:
    """SAM against both of its references: −dropout−WD on the full batch and on SAM's half."""
    keep = [r for r in diffs if r["family"] in ("primary", "trace") and r["comparison"] in ("sam05", "sam05-half")]
    keep += [r for r in half if r["family"] == "primary"]
    section.files["sam_controls.csv"] = keep
    section.tables.append(Table(
        "SAM's controls: SAM ρ 0.05 against −dropout−WD on the full batch and on the same half batch SAM updates "
        "on, and the half batch's own effect (primary accuracy in points; trace)",
        [Column("kept", "n_kept", fmt="d"), Column("mean [t 95%]", "mean", ci=("t_low", "t_high"), fmt=".3g"),
         Column("MDE", "mde", fmt=".3g"), Column("verdict", "verdict", text=True)],
        keep, source="sam_controls.csv", key="test", key_header="comparison @ fork point: quantity"))


def _size_table(section: Section, p: IsolossPreset, rows: list[dict], diffs: list[dict], results: list[dict]
                ) -> None:
    """The size contrast: accuracy, the small model's own trace, and both traces in the
    large model's parameter space."""
    size = [c for c in p.comparisons if {f.name: f for f in p.forks}[c.recipe].resized]
    out = []
    for c in size:
        for pt in _point_names(p):
            _, acc, dkl = paired.pairs(rows, c, pt, p.primary_key, 100.0)
            if not len(acc):
                continue
            kept = np.abs(dkl) <= p.kl_tolerance
            _, own, _ = paired.pairs(rows, c, pt, "trace_fisher")
            big = [r for r in rows if r["point"] == pt and r["fork"] == c.recipe]
            small = {r["seed"]: r for r in rows if r["point"] == pt and r["fork"] == c.reference}
            one_space = np.array([float(b["trace_fisher"]) - float(small[b["seed"]].get("trace_fisher_embedded",
                                                                                       math.nan))
                                  for b in big if b["seed"] in small])
            from ..stats import paired_difference
            a = paired_difference(acc[kept].tolist(), seed=1)
            t1 = paired_difference(one_space[kept].tolist(), seed=2)
            t0 = paired_difference(own[kept].tolist(), seed=3)
            out.append({"test": f"{c.name} @ {pt}", "n_kept": a.n, "acc": a.mean, "acc_low": a.t_low,
                        "acc_high": a.t_high, "acc_mde": a.mde, "trace_one_space": t1.mean,
                        "trace_one_space_low": t1.t_low, "trace_one_space_high": t1.t_high,
                        "trace_own": t0.mean, "trace_own_low": t0.t_low, "trace_own_high": t0.t_high,
                        "large_trace": float(np.mean([float(b["trace_fisher"]) for b in big])),
                        "small_trace": float(np.mean([float(s["trace_fisher"]) for s in small.values()])),
                        "small_trace_embedded": float(np.mean([float(s.get("trace_fisher_embedded", math.nan))
                                                               for s in small.values()]))})
    checks = [e for res in results for e in res["embedded_kl"]]
    section.files["size.csv"] = out
    section.tables.append(Table(
        "Size contrast (large − small at one KL, pairs within the tolerance): primary accuracy (points), the trace "
        "in one parameter space (the small model embedded into the large shape, App. B.4) and in each model's own",
        [Column("kept", "n_kept", fmt="d"), Column("accuracy [95%]", "acc", ci=("acc_low", "acc_high"), fmt=".3g"),
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


def _regression_table(section: Section, reg: list[dict]) -> None:
    section.files["regression.csv"] = reg
    section.tables.append(Table(
        "Fig. 1 within seeds: primary accuracy (pts) regressed on trace and KL with seed fixed effects, per fork "
        "point, one model size, without the adversarial fork (cluster bootstrap over seeds, 95%; δ = the MDE)",
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
        forest.append({"label": f"{r['comparison']} @ {r['point']} (n={r['n_kept']})", "acc": r["mean"],
                       "acc_low": r["t_low"], "acc_high": r["t_high"], "acc_mde": r["mde"], "trace": t["mean"],
                       "trace_low": t["t_low"], "trace_high": t["t_high"], "trace_mde": t["mde"]})
    delta = p.equivalence_margin
    margin = tuple(Ref(v, f"±δ = {delta:g} points (equivalence margin)", axis="x", color="0.45", style="--")
                   for v in (-delta, delta))
    interval = "95 % t interval over the seeds' pairs within the KL tolerance"
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
        sample=f"{len(seeds)} seeds; per row the seeds whose pair lies within the KL tolerance {p.kl_tolerance:g} "
               "nats (n in the row's name)",
        claim="training recipes change downstream accuracy and the trace at the same pre-training loss, with the "
              "paper's signs (Tables 1–2, Figs. 2–5)"))
    forks = {f.name: f for f in p.forks}
    scatter = []
    for pt in points:
        models = [r for r in rows if r["point"] == pt and r["fork"] != "adv" and not forks[r["fork"]].resized]
        by_seed: dict[int, list[dict]] = {}
        for r in models:
            by_seed.setdefault(r["seed"], []).append(r)
        for s, rs in by_seed.items():
            ma = float(np.mean([100 * float(r[p.primary_key]) for r in rs]))
            mt = float(np.mean([float(r["trace_fisher"]) for r in rs]))
            for r in rs:  # keys per fork point: each panel draws its own point's models
                scatter.append({"fork": r["fork"], "seed": s, f"dtrace_{pt}": float(r["trace_fisher"]) - mt,
                                f"dacc_{pt}": 100 * float(r[p.primary_key]) - ma})
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
        shows="Fig. 1 within seeds: every model's primary probe accuracy (points) against its trace of Hessian "
              "(Fisher estimator), each minus its seed's mean over the forks of one size at that fork point "
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
    targets = {r["point"]: r["kl_target"] for r in first["rows"]}
    curve_panels = []
    for k in sorted(p.fork_points, reverse=True):
        pt = p.point_name(k)
        starts = [p.stretch_start(f) for f in p.forks]
        ends = [p.fork_end(f) for f in p.forks]
        window = Band(min(starts), max(ends), f"matching window: the stretches at {p.final_lr_factor:g} × lr")
        target = (Ref(targets[pt], f"seed {seeds[0]}'s target KL", color="0.3", style=":"),) if pt in targets else ()
        curve_panels.append(Panel(f"kl_{pt}", f"exact KL, fork point {pt} (nats)", log=True, refs=target,
                                  bands=(window,)))
    fig = series_plot(series, "step", curve_panels, f"Seed {seeds[0]}: exact KL of the base and its forks")
    section.figures.append(study.figure(
        fig, stem + "curves",
        shows=f"Training curves of seed {seeds[0]}: the exact KL to the true conditionals (log axis; held-out set of "
              f"{p.eval_sentences} sentences) against step, for the base and every fork, one panel per fork point; "
              "KL is evaluated only where it is read (the forks' candidates on the stretch, the AdamW fork's slope "
              "checkpoints, the base's evaluations); shaded: the matching window (the stretches at "
              f"{p.final_lr_factor:g} × lr); dotted: the seed's target KL",
        sample=f"1 seed ({seeds[0]}) of {len(seeds)}: {len(first['curves'])} runs",
        claim="none directly: it shows that the matched checkpoints lie where the KL moves smoothly at one "
              "learning rate (the design of the iso-loss comparison)"))


def _runtime(section: Section, study: Study, results: list[dict], seeds: list[int]) -> None:
    rows = [{"seed": s, "seconds": res["seconds"], "cpu_seconds": res["cpu_seconds"]} for s, res in zip(seeds, results)]
    section.files["runtime.csv"] = rows
    cpu = [r["cpu_seconds"] for r in rows]
    section.notes.append(f"Runtime per seed (this call, seeds not reused): CPU {fmt(float(np.mean(cpu)))} s on average "
                         f"(min {fmt(min(cpu))}, max {fmt(max(cpu))}; runtime.csv); {_workers_text(study.launcher)}.")


def _workers_text(launcher) -> str:
    """How many seeds ran at once (what a timing depends on)."""
    if launcher.name == "inprocess":
        return "one seed at a time in this process (--launcher inprocess)"
    n = launcher.workers
    return (f"{n} seeds at a time" if n else "all seeds at once (the launcher's default)") + \
        f" (--launcher {launcher.name})"
