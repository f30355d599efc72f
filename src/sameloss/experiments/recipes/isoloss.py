"""At the same loss, does the implicit bias decide transfer? Forked runs at matched KL,
few-shot probes and paired statistics with stated power (issue 11).

Command
    sameloss reproduce isoloss --scale tiny         [--out runs] [--seed N] [--fresh]
        [--launcher inprocess|local|slurm] [--workers N] [--seeds 0-7]

    (``--seed N`` shifts the preset's seeds by N: an independent replication. Each seed's
    chain — its base run, then the forks — is one unit: ``--launcher local --workers 2``
    runs two seeds at once, ``--seeds 0-7`` only those seeds; see the README's "Running
    on a cluster".)

Runtime per scale (two seeds at once, one thread each, as ``--launcher local --workers 2``)
    smoke   ~16 s on an idle 2-core CPU (3 seeds, micro model, tens of steps; the numbers
            mean nothing); one worker: on a busy 2-core CPU (load 5) two spawned workers took
            52-59 s and one 35-45 s (their start-up costs more than they save)
    tiny    measured: 57 min for the 22 seeds on a 2-core CPU running nothing else (load 2.0:
            the two workers; 2.6 min per seed — base 1000 steps, seven forks of 200–600
            steps, 8 encoders probed ≈ 1.5 min). Primary endpoint (probe at the task's
            position, n = 200): paired SD 0.35–0.49 points, MDE at 80 % power 0.22–0.31
            points for longer, −dropout−WD and both SAM contrasts (the adversarial one:
            SD 1.9, MDE 1.2). (The
            recorded run trained 24 seeds in 62 min; the preset keeps the 22 that fit in an
            hour; with all 24 the verdicts are the same.)
    small   estimate, not measured: ~6 h on one H100 (paper HMM, t4-384, batch 4096)
    paper   estimate, not measured: days on one H100

What it runs
    Language: the HMM ``headroom`` size (4 states, 8 words, length 8, emission
    concentration 1.0): the ~0.1M ``tiny`` transformer reaches KL < 0.01 nats in ~1000
    steps, and its hidden state 5 (``task-5``, majority ≈ 38 %) leaves room between the
    look-up table and the oracle. Per seed: one base run (AdamW, dropout 0.1, WD 0.01,
    constant lr after the warm-up) to near-convergence, then forks of it — each starts from
    the base's weights, optimiser moments, RNG state and step, on the same data stream
    (``init_from``), trains its recipe for ``recipe_steps`` at the constant lr and then
    ``decay_steps`` of linear decay to ``final_lr_factor`` × lr: ``adamw`` (the base
    continued), ``short`` / ``long`` (AdamW with 0 / ``long`` recipe steps: "train
    longer"), ``noreg`` (−dropout −WD), ``sam05`` / ``sam02`` (−dropout −WD +SAM ρ 0.05 /
    0.02), ``adv`` (AdamW + the adversarial objective, mild λ).
    Iso-loss: at a constant lr the exact KL jumps by ~1e-3 nats between checkpoints tens of
    steps apart (driven by the last batches), so forks are matched on the decay, where it
    falls smoothly: candidate checkpoints every ``match_every`` steps from ``match_from``
    steps into the decay to its end, each evaluated on one shared held-out set; per seed
    the target is the lowest KL every fork reaches, and every fork is taken at its latest
    candidate within ``kl_tolerance``/2 of it (so every pair is within ``kl_tolerance``;
    else the nearest). Every ΔKL is reported; the tolerance is set by consequence (the
    measured slope of accuracy on KL × tolerance ≤ half the MDE; checked in the report).
    Transfer: linear probes on the frozen representation at the task's position (primary)
    and on all positions concatenated (the paper's, secondary), trained on the same
    subsets of n = ``probe_sizes`` examples (``probe_subsets`` subsets each) and tested on
    one test set, for every model: a converged convex probe (L-BFGS, the primary) and the
    paper's fixed-budget AdamW probe. Headroom table: majority, random-init encoder,
    look-up table (true conditionals), the trained reference, the oracle (true hidden-state
    posteriors), at each probe size.
    Statistics: per comparison the paired difference across seeds (t and bootstrap 95 %
    intervals, MDE at 80 % power); Fig. 1 as a within-seed regression of accuracy on trace
    and KL (seed fixed effects, cluster bootstrap over seeds).

Expected result (paper)
    At the same loss: training longer lowers the trace and raises accuracy (Fig. 2, 4);
    −dropout−WD raises the trace and lowers accuracy, SAM recovers both (Table 1, 2); the
    adversarial objective lowers accuracy (Table 1); across models, flatter means better
    transfer (Fig. 1): a negative slope of accuracy on trace at fixed loss.

Deviations
    The paper trains from scratch per recipe at a constant lr; forks continue one base run
    for a few hundred steps and end with a short lr decay (the same for every fork), so the
    recipes act only on the last stretch of training (what pairing costs).
    The AdamW probe has no validation split in a few-shot design: it keeps its last epoch.
    No size contrast (forks need the base's shape; the ``sizes`` recipe covers size) and no
    few-shot fine-tuning (the probes are the endpoints).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...measures.fewshot import FewShot, View
from ...measures.run import MeasureSpec
from ...training.checkpoint import checkpoint_dir
from ...training.runio import eval_history
from .. import paired
from ..common import COMMON, Preset, base_settings, measure_spec
from ..core import RunSpec, Setting, Study
from ..paired import Comparison, iso_loss_target, select_iso_loss
from ..report import Column, Section, Table

TITLE = "Iso-loss forks: does flatness decide transfer at the same loss? (Fig. 1, Tables 1–2, with power)"
SUMMARY = "forks of one base run at matched KL, few-shot probes, paired differences with power (Fig. 1)"
NOREG = (("model.dropout", 0.0), ("optim.weight_decay", 0.0))
# (view, method) pairs probed: the task's position by both probes; all positions by the
# paper's AdamW probe only (the convex probe on 8 × 64 features costs most of the time)
ENDPOINTS = (("pos", "lbfgs"), ("pos", "adamw"), ("all", "adamw"))
# the measured columns of a model's row besides its probes
MEASURED = ("loss", "loss_std", "kl", "kl_std", "trace_fisher", "trace_fisher_se", "measure_seconds")


@dataclass(frozen=True)
class Fork:
    """A recipe continued from the base checkpoint: its name, a label, its settings and how
    many steps it trains at the constant learning rate before the shared decay (``None``:
    the preset's ``recipe_steps``)."""

    name: str
    label: str
    settings: tuple[Setting, ...] = ()
    recipe_steps: int | None = None


@dataclass(frozen=True, kw_only=True)
class IsolossPreset(Preset):
    seeds: tuple[int, ...]
    task: str  # the hidden-state task probed (an HMM task-k)
    base_steps: int
    # every fork: recipe_steps (its own, or this) at the constant lr, then decay_steps of
    # linear decay to final_lr_factor × lr; candidate checkpoints every match_every steps
    # from match_from steps into the decay to its end
    recipe_steps: int
    decay_steps: int
    final_lr_factor: float
    match_from: int
    match_every: int
    eval_sentences: int  # the shared held-out set on which forks are matched
    forks: tuple[Fork, ...]
    comparisons: tuple[Comparison, ...]
    probe_sizes: tuple[int, ...]
    probe_subsets: tuple[int, ...]
    probe_pool: int
    probe_test: int
    probe_epochs: int
    probe_l2: float
    primary_size: int

    def __post_init__(self):
        super().__post_init__()
        names = [f.name for f in self.forks]
        if names[0] != "adamw" or len(set(names)) != len(names):
            raise ValueError("the first fork must be the reference 'adamw' and fork names unique")
        for c in self.comparisons:
            if not {c.recipe, c.reference} <= set(names):
                raise ValueError(f"comparison {c.name} names an unknown fork")
        lengths = [self.recipe_steps_of(f) for f in self.forks]
        if not (0 < self.match_from < self.decay_steps) or self.decay_steps % self.match_every \
                or self.match_from % self.match_every or any(n < 0 or n % self.match_every for n in lengths):
            raise ValueError("0 < match_from < decay_steps; match_from, decay_steps and every fork's recipe "
                             "steps multiples of match_every")
        if not 0 <= self.final_lr_factor < 1:
            raise ValueError("final_lr_factor must be in [0, 1)")
        if len(self.probe_sizes) != len(self.probe_subsets) or max(self.probe_sizes) > self.probe_pool:
            raise ValueError("one subset count per probe size, every size within the pool")
        if self.primary_size not in self.probe_sizes or len(self.seeds) < 2 or len(self.use) != 1:
            raise ValueError("the primary size must be a probe size; at least 2 seeds; one language")
        if not self.task.startswith("task-") or self.task not in self.tasks[self.use[0]]:
            raise ValueError(f"task {self.task!r} must be an HMM hidden-state task of the preset")

    def recipe_steps_of(self, fork: Fork) -> int:
        return self.recipe_steps if fork.recipe_steps is None else fork.recipe_steps

    def fork_steps(self, fork: Fork) -> int:
        """The fork's last step (counted from the base's step 0)."""
        return self.base_steps + self.recipe_steps_of(fork) + self.decay_steps

    def candidates(self, fork: Fork) -> list[int]:
        """The fork's candidate checkpoints: every ``match_every`` steps of the decay's end."""
        end = self.fork_steps(fork)
        return list(range(end - self.decay_steps + self.match_from, end + 1, self.match_every))

    @property
    def position(self) -> int:
        """The 1-based position of the task's hidden state."""
        return int(self.task.split("-")[1])

    def fewshot(self) -> FewShot:
        """The probes every model gets: at the task's position and all positions, the same
        pool, subsets and test set."""
        return FewShot(self.task, (("pos", View((self.position - 1,))), ("all", View())), self.probe_sizes,
                       self.probe_subsets, self.probe_pool, self.probe_test, ENDPOINTS, self.probe_epochs,
                       self.probe_l2)


def _adversarial(weight: float, task: str, batch: int, pool: int) -> tuple[Setting, ...]:
    return (("adversarial.weight", weight), ("adversarial.task", task), ("adversarial.batch_size", batch),
            ("adversarial.pool_size", pool))


def _forks(task: str, adv_batch: int, adv_pool: int, long_steps: int) -> tuple[Fork, ...]:
    return (Fork("adamw", "AdamW (base continued)"), Fork("short", "AdamW, decayed at once", recipe_steps=0),
            Fork("long", f"AdamW, {long_steps} steps before the decay", recipe_steps=long_steps),
            Fork("noreg", "−dropout−WD", NOREG),
            Fork("sam05", "−dropout−WD+SAM ρ 0.05", (*NOREG, ("sam.rho", 0.05))),
            Fork("sam02", "−dropout−WD+SAM ρ 0.02", (*NOREG, ("sam.rho", 0.02))),
            Fork("adv", "adversarial λ 0.02", _adversarial(0.02, task, adv_batch, adv_pool)))


COMPARISONS = (
    Comparison("longer", "long", "short", +1, "training longer at the same loss raises accuracy and lowers "
               "the trace (Fig. 2, Fig. 4)"),
    Comparison("noreg", "noreg", "adamw", -1, "removing dropout and weight decay lowers accuracy and raises the "
               "trace (Table 1, 2)"),
    Comparison("sam05", "sam05", "noreg", +1, "SAM (ρ 0.05) recovers accuracy and flatness lost without "
               "dropout and WD (Table 1, 2)"),
    Comparison("sam02", "sam02", "noreg", +1, "SAM (ρ 0.02) recovers accuracy and flatness (Table 1, 2)"),
    Comparison("adv", "adv", "adamw", -1, "the adversarial objective lowers accuracy and raises the trace "
               "(Table 1, 2)"),
)

_HMM = {"hmm": "headroom"}
_TASKS = {"hmm": ("task-5",)}


def _preset(scale: str, **kw) -> IsolossPreset:
    common = {**COMMON[scale].common(), "languages": _HMM, "tasks": _TASKS}
    for key in ("training", "reference", "measure", "kl_tolerance"):
        if key in kw:
            common[key] = kw.pop(key)
    return IsolossPreset(**common, use=("hmm",), task="task-5", comparisons=COMPARISONS, **kw)


PRESETS: dict[str, IsolossPreset] = {
    "smoke": _preset(
        "smoke", seeds=(0, 1, 2), base_steps=30, recipe_steps=10, decay_steps=10, final_lr_factor=0.05,
        match_from=5, match_every=5, eval_sentences=64, forks=_forks("task-5", 32, 256, 20), probe_sizes=(8, 16),
        probe_subsets=(3, 3), probe_pool=40, probe_test=64, probe_epochs=3, probe_l2=1e-2, primary_size=16,
        kl_tolerance=10.0),
    "tiny": _preset(
        "tiny", seeds=tuple(range(22)), base_steps=1000, recipe_steps=100, decay_steps=200, final_lr_factor=0.05,
        match_from=80, match_every=10, eval_sentences=4000, forks=_forks("task-5", 128, 10_000, 400),
        probe_sizes=(50, 200, 1000), probe_subsets=(20, 40, 10), probe_pool=2000, probe_test=20_000,
        probe_epochs=50, probe_l2=1e-2, primary_size=200, kl_tolerance=3e-4,
        measure=dataclasses.replace(COMMON["tiny"].measure, seeds=(0,))),
    "small": _preset(
        "small", seeds=tuple(range(8)), base_steps=20_000, recipe_steps=2000, decay_steps=2000,
        final_lr_factor=0.05, match_from=800, match_every=100, eval_sentences=20_000,
        forks=_forks("task-5", 256, 10_000, 8000), probe_sizes=(50, 200, 1000), probe_subsets=(20, 40, 10),
        probe_pool=5000, probe_test=20_000, probe_epochs=100, probe_l2=1e-2, primary_size=200,
        kl_tolerance=3e-4),
    "paper": _preset(
        "paper", seeds=tuple(range(8)), base_steps=100_000, recipe_steps=10_000, decay_steps=10_000,
        final_lr_factor=0.05, match_from=4000, match_every=500, eval_sentences=100_000,
        forks=_forks("task-5", 256, 10_000, 40_000), probe_sizes=(50, 200, 1000), probe_subsets=(20, 40, 10),
        probe_pool=5000, probe_test=30_000, probe_epochs=100, probe_l2=1e-2, primary_size=200,
        kl_tolerance=3e-4),
}


# ---- runs ---------------------------------------------------------------------------------
def _common_settings(p: IsolossPreset, language: str, seed: int) -> tuple[Setting, ...]:
    return (*base_settings(p, language, seed), *p.reference.shape.settings(),
            ("eval.n_sentences", p.eval_sentences), ("save_every", 10 * p.base_steps))


def runs(p: IsolossPreset, language: str, seed: int, base_dir: str | Path | None = None) -> list[RunSpec]:
    """The base run and its forks (``base_dir``: the base run's folder; forks start from its
    checkpoint at ``base_steps``). Every fork ends with the same linear decay of the
    learning rate, so its candidate checkpoints lie on a smooth stretch of its KL curve
    rather than on the constant-lr noise floor (where the KL jumps by ~1e-3 nats between
    checkpoints 25 steps apart, driven by the last batches)."""
    base = RunSpec(f"{language}-s{seed}-base", (*_common_settings(p, language, seed), ("steps", p.base_steps)),
                   label="base", group="base")
    if base_dir is None:
        return [base]
    start = str(checkpoint_dir(Path(base_dir), p.base_steps).resolve())
    out = [base]
    for f in p.forks:
        out.append(RunSpec(
            f"{language}-s{seed}-{f.name}",
            (*_common_settings(p, language, seed), ("steps", p.fork_steps(f)),
             ("checkpoints", tuple(p.candidates(f))), ("eval.every", p.match_every), ("init_from", start),
             ("optim.decay_steps", p.decay_steps), ("optim.final_lr_factor", p.final_lr_factor), *f.settings),
            label=f.label, group=f.name))
    return out


# ---- one seed (a worker process) ---------------------------------------------------------
def seed_study(study: Study, seed: int, p: IsolossPreset) -> dict:
    """Train the base and the forks of one seed, pick the iso-loss checkpoints and measure
    them (loss, trace and probes in one pass; the random-init encoder of the seed), cached
    in the seed's study folder. One unit of the study (``units``), run by its launcher."""
    language = p.use[0]
    mspec = dataclasses.replace(measure_spec(p, (), seed), probe=(), fewshot=p.fewshot())
    base = study.train(runs(p, language, seed)[0])
    infos = {spec.group: study.train(spec) for spec in runs(p, language, seed, base.path)[1:]}
    forks = {f.name: f for f in p.forks}
    kls = {name: {step: float(ev["kl"]) for step, ev in eval_history(info.path).items()}
           for name, info in infos.items()}
    candidates = {name: p.candidates(forks[name]) for name in infos}
    target = iso_loss_target(kls, candidates)
    rows = []
    for name, info in infos.items():
        # half the tolerance to the target keeps every pair of forks within the tolerance
        step = select_iso_loss(kls[name], candidates[name], target, p.kl_tolerance / 2)
        ck = checkpoint_dir(info.path, step)
        study.log(f"measure {study.rel(ck)}")
        decay_start = p.fork_steps(forks[name]) - p.decay_steps
        measured = study.measure(ck, mspec)
        rows.append({"model": f"s{seed}-{name}@{step}", "seed": seed, "fork": name, "label": info.spec.label,
                     "step": step, "extra_steps": step - p.base_steps, "into_decay": step - decay_start,
                     "lr_factor": info.config.lr_factor(step - 1), "kl_match": kls[name][step], "kl_target": target,
                     "dkl": kls[name][step] - target,
                     **{k: v for k, v in measured.items() if k in MEASURED or k.startswith(("pos_", "all_"))}})
    # the random-init encoder of this seed (the base's architecture, freshly initialised)
    random_init = study.reference("random-init", base.config, MeasureSpec(fewshot=p.fewshot()))
    return {"rows": rows, "random_init": random_init, "runs": [base, *infos.values()]}


# ---- the report ---------------------------------------------------------------------------
def study_seeds(study: Study, p: IsolossPreset) -> list[int]:
    """The seeds of the runs: the preset's, shifted by ``--seed`` (another seed is an
    independent replication in its own folder)."""
    return [study.seed + s for s in p.seeds]


def units(study: Study, p: IsolossPreset) -> list:
    """One unit per seed: its chain (the base run, then its forks), measured."""
    return study.seed_units(seed_study, study_seeds(study, p), p)


def _key(p: IsolossPreset, view: str = "pos", method: str = "lbfgs", n: int | None = None) -> str:
    return f"{view}_{method}_n{n or p.primary_size}"


def report(study: Study, p: IsolossPreset) -> Section:
    section = Section(TITLE)
    results = study.map_seeds(seed_study, study_seeds(study, p), p)
    rows = [r for res in results for r in res["rows"]]
    for res in results:
        section.runs += res["runs"]
    # the baselines of the language (none depends on the seed): look-up table, oracle, majority
    base_cfg = results[0]["runs"][0].config
    refs = {kind: study.reference(kind, base_cfg, MeasureSpec(fewshot=p.fewshot())) for kind in ("lookup", "oracle")}
    section.rows += rows
    section.text.append(
        f"Language hmm ({p.languages['hmm']}), task {p.task} (the hidden state at position {p.position}); "
        f"{len(study_seeds(study, p))} seeds; base run {p.base_steps} steps (AdamW, constant lr after the "
        f"warm-up); every fork starts from its step {p.base_steps} (weights, optimiser moments, RNG, data stream), "
        f"trains its recipe for {p.recipe_steps} steps (short: 0, long: "
        f"{p.recipe_steps_of(next(f for f in p.forks if f.name == 'long'))}) at the constant lr, then "
        f"{p.decay_steps} steps of linear decay to {p.final_lr_factor:g} × lr. **Iso-loss**: per seed the target is "
        "the lowest KL (on one shared held-out set of "
        f"{p.eval_sentences} sentences) that every fork reaches among its candidate checkpoints (every "
        f"{p.match_every} steps from {p.match_from} steps into the decay to its end); each fork is taken at its "
        f"latest candidate within {p.kl_tolerance / 2:g} nats (half the tolerance) of the target (else the nearest). Probes: the same "
        f"{p.probe_pool}-example pool, subsets and "
        f"{p.probe_test}-example test set for every model. **Primary endpoint**: probe at the task's position, "
        f"converged L-BFGS (l2 {p.probe_l2:g}), n = {p.primary_size}, mean over {dict(zip(p.probe_sizes, p.probe_subsets))[p.primary_size]} "
        "subsets; accuracies in %.")
    _headroom(section, p, refs, [res["random_init"] for res in results], rows)
    _models_table(section, p, rows)
    accuracies = [(f"{v}_{m}_n{n}", f"probe {v} {m} n={n}") for v, m in ENDPOINTS for n in p.probe_sizes]
    primary = paired.differences(section, rows, p.comparisons, accuracies, _key(p), p.kl_tolerance)
    paired.sensitivity(section, rows, p.comparisons, _key(p), p.kl_tolerance)
    paired.regression(section, rows, _key(p), p.kl_tolerance, primary, without="adv")
    return section


def _headroom(section: Section, p: IsolossPreset, refs: dict, random_init: list[dict], rows: list[dict]) -> None:
    columns = [c for key in p.fewshot().columns() for c in (key, f"{key}_std")]

    def mean_of(dicts: list[dict]) -> dict:
        return {k: float(np.mean([d[k] for d in dicts])) for k in columns}

    majority = refs["lookup"]["fewshot_majority"]
    table_rows = [{"baseline": "majority class", **{k: majority for k in p.fewshot().columns()}},
                  {"baseline": "random-init encoder (mean over seeds)", **mean_of(random_init)},
                  {"baseline": "look-up table (true conditionals)", **mean_of([refs["lookup"]])},
                  {"baseline": "trained model (AdamW reference, mean over seeds)",
                   **mean_of([r for r in rows if r["fork"] == "adamw"])},
                  {"baseline": "oracle (true hidden-state posteriors)", **mean_of([refs["oracle"]])}]
    cols = []
    for view, method, what in (("pos", "lbfgs", "position, L-BFGS"), ("all", "adamw", "all positions, AdamW")):
        for n in p.probe_sizes:
            cols.append(Column(f"{what} n={n} (%)", f"{view}_{method}_n{n}", scale=100, fmt=".1f"))
    section.tables.append(Table(
        "Headroom: probe accuracy of the baselines and the trained model (at the task's position: converged "
        "L-BFGS probe; all positions: the paper's AdamW probe)", cols,
        table_rows, source="headroom.csv", key="baseline", key_header="representation"))
    section.files["headroom.csv"] = table_rows


def _models_table(section: Section, p: IsolossPreset, rows: list[dict]) -> None:
    cols = [Column("fork", "fork", text=True), Column("+steps", "extra_steps", fmt="d"),
            Column("into decay", "into_decay", fmt="d"), Column("lr factor", "lr_factor", fmt=".2f"),
            Column("KL (nats)", "kl_match", fmt=".5f"), Column("ΔKL to target", "dkl", fmt=".2e"),
            Column("tr(H) (Fisher)", "trace_fisher", "trace_fisher_se", fmt=".4g")]
    for n in p.probe_sizes:
        cols.append(Column(f"pos n={n} (%)", f"pos_lbfgs_n{n}", scale=100, fmt=".2f"))
    cols.append(Column(f"pos AdamW n={p.primary_size} (%)", f"pos_adamw_n{p.primary_size}", scale=100, fmt=".2f"))
    cols.append(Column(f"all AdamW n={p.primary_size} (%)", f"all_adamw_n{p.primary_size}", scale=100, fmt=".2f"))
    section.tables.append(Table("Every model: the iso-loss checkpoint of each fork, per seed (KL on the shared "
                                "held-out set; probe accuracy = mean over subsets)", cols, rows))


