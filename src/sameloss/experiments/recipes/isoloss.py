"""At the same loss, does the implicit bias decide transfer? Forked runs at matched KL,
few-shot probes and paired statistics with stated power (issue 11).

Command
    sameloss reproduce isoloss --scale tiny         [--out runs] [--seed N] [--fresh]

    (``--seed N`` shifts the preset's seeds by N: an independent replication.)

Runtime per scale (``workers`` seeds in parallel, one thread each)
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
import json
import math
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..claims import fmt
from ..common import COMMON, Preset, base_settings, measure_spec
from ..core import RunSpec, Setting, Study
from ..report import Claim, Column, Section, Table
from ..stats import (DETECTED, DETECTED_AGAINST, NONE_LARGER, cluster_bootstrap_ols, covariate_adjusted_mean,
                     paired_difference, power_verdict, t_quantile)

TITLE = "Iso-loss forks: does flatness decide transfer at the same loss? (Fig. 1, Tables 1–2, with power)"
NOREG = (("model.dropout", 0.0), ("optim.weight_decay", 0.0))


@dataclass(frozen=True)
class Fork:
    """A recipe continued from the base checkpoint: its name, a label, its settings and how
    many steps it trains at the constant learning rate before the shared decay (``None``:
    the preset's ``recipe_steps``)."""

    name: str
    label: str
    settings: tuple[Setting, ...] = ()
    recipe_steps: int | None = None


@dataclass(frozen=True)
class Comparison:
    """``recipe − reference`` of the paired design; ``sign``: the paper's direction of the
    accuracy difference (the trace's is the opposite)."""

    name: str
    recipe: str
    reference: str
    sign: int
    paper: str


@dataclass(frozen=True)
class ProbeDesign:
    """The few-shot probes every model of a study gets (the same pool, subsets, test set)."""

    language: str
    task: str
    position: int  # 1-based position of the task's hidden state
    sizes: tuple[int, ...]
    subsets: tuple[int, ...]
    pool: int
    test: int
    epochs: int  # of the fixed-budget AdamW probe
    l2: float  # of the convex probe
    # (view, method) pairs probed: the task's position by both probes; all positions by the
    # paper's AdamW probe only (the convex probe on 8 × 64 features costs most of the time)
    endpoints: tuple[tuple[str, str], ...] = (("pos", "lbfgs"), ("pos", "adamw"), ("all", "adamw"))
    seed: int = 0


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
    workers: int

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
        workers=1, kl_tolerance=10.0),
    "tiny": _preset(
        "tiny", seeds=tuple(range(22)), base_steps=1000, recipe_steps=100, decay_steps=200, final_lr_factor=0.05,
        match_from=80, match_every=10, eval_sentences=4000, forks=_forks("task-5", 128, 10_000, 400),
        probe_sizes=(50, 200, 1000), probe_subsets=(20, 40, 10), probe_pool=2000, probe_test=20_000,
        probe_epochs=50, probe_l2=1e-2, primary_size=200, workers=2, kl_tolerance=3e-4,
        measure=dataclasses.replace(COMMON["tiny"].measure, seeds=(0,))),
    "small": _preset(
        "small", seeds=tuple(range(8)), base_steps=20_000, recipe_steps=2000, decay_steps=2000,
        final_lr_factor=0.05, match_from=800, match_every=100, eval_sentences=20_000,
        forks=_forks("task-5", 256, 10_000, 8000), probe_sizes=(50, 200, 1000), probe_subsets=(20, 40, 10),
        probe_pool=5000, probe_test=20_000, probe_epochs=100, probe_l2=1e-2, primary_size=200, workers=1,
        kl_tolerance=3e-4),
    "paper": _preset(
        "paper", seeds=tuple(range(8)), base_steps=100_000, recipe_steps=10_000, decay_steps=10_000,
        final_lr_factor=0.05, match_from=4000, match_every=500, eval_sentences=100_000,
        forks=_forks("task-5", 256, 10_000, 40_000), probe_sizes=(50, 200, 1000), probe_subsets=(20, 40, 10),
        probe_pool=5000, probe_test=30_000, probe_epochs=100, probe_l2=1e-2, primary_size=200, workers=1,
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
    from ...training.checkpoint import checkpoint_dir

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
def _design(p: IsolossPreset) -> ProbeDesign:
    return ProbeDesign(p.use[0], p.task, int(p.task.split("-")[1]), p.probe_sizes, p.probe_subsets, p.probe_pool,
                       p.probe_test, p.probe_epochs, p.probe_l2)


def _eval_kls(run_dir: Path) -> dict[int, float]:
    out = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if rec.get("eval"):
            out[int(rec["step"])] = float(rec["eval"]["kl"])
    return out


def iso_loss_target(kls: dict[str, dict[int, float]], candidates: dict[str, list[int]]) -> float:
    """The lowest KL every fork reaches among its candidates: the largest of the forks'
    smallest candidate KLs (each fork's decay starts above it, so each passes near it)."""
    return max(min(kls[name][s] for s in candidates[name]) for name in candidates)


def select_iso_loss(kls: dict[int, float], candidates: list[int], target: float, tolerance: float) -> int:
    """The latest candidate step whose KL is within ``tolerance`` of ``target`` (the most
    decayed learning rate: the least batch noise), else the nearest (the latest of ties)."""
    within = [s for s in candidates if abs(kls[s] - target) <= tolerance]
    if within:
        return max(within)
    return min(candidates, key=lambda s: (abs(kls[s] - target), -s))


def seed_study(root: Path, p: IsolossPreset, seed: int, progress: bool, device: str) -> dict:
    """Train the base and the forks of one seed, pick the iso-loss checkpoints and measure
    them (trace, probes; cached in ``<root>/seed<N>/``). Runs in a worker process."""
    from ...training.checkpoint import checkpoint_dir

    study = Study(root / f"seed{seed}", seed=seed, progress=progress, device=device)
    language = p.use[0]
    design = _design(p)
    mspec = dataclasses.replace(measure_spec(p, (), seed), probe=())
    base_spec = runs(p, language, seed)[0]
    base = study.train(base_spec)
    specs = runs(p, language, seed, base.path)[1:]
    infos = {spec.group: study.train(spec) for spec in specs}
    forks = {f.name: f for f in p.forks}
    kls = {name: _eval_kls(info.path) for name, info in infos.items()}
    candidates = {name: p.candidates(forks[name]) for name in infos}
    target = iso_loss_target(kls, candidates)
    # half the tolerance to the target keeps every pair of forks within the tolerance
    chosen = {name: select_iso_loss(kls[name], candidates[name], target, p.kl_tolerance / 2) for name in infos}
    rows = []
    for name, step in chosen.items():
        info = infos[name]
        ck = checkpoint_dir(info.path, step)
        study.log(f"measure {study.rel(ck)}")
        decay_start = p.fork_steps(forks[name]) - p.decay_steps
        row = {"model": f"s{seed}-{name}@{step}", "seed": seed, "fork": name, "label": info.spec.label,
               "step": step, "extra_steps": step - p.base_steps, "into_decay": step - decay_start,
               "lr_factor": info.config.lr_factor(step - 1), "kl_match": kls[name][step], "kl_target": target,
               "dkl": kls[name][step] - target}
        row.update({k: v for k, v in study.measure(ck, mspec).items()
                    if k in ("loss", "loss_std", "kl", "kl_std", "trace_fisher", "trace_fisher_se")})
        row.update(study.cached("fewshot", study.rel(ck), design, lambda ck=ck: _probe_checkpoint(ck, design),
                                (ck / "meta.json").read_text()))
        rows.append(row)
    # the random-init encoder of this seed (the base's architecture, freshly initialised)
    rand = study.cached("fewshot-random-init", base_spec.name, design,
                        lambda: _probe_random_init(base.config, design), json.dumps(dataclasses.asdict(base.config),
                                                                                    default=str))
    return {"rows": rows, "random_init": rand, "runs": [base, *infos.values()], "timings": study.timings,
            "counts": study.counts}


# ---- probes -------------------------------------------------------------------------------
_DATA: dict = {}


def _task_data(language, design: ProbeDesign):
    from ...measures.tasks import make_task_data

    key = (language.name, dataclasses.astuple(design))
    if key not in _DATA:
        _DATA[key] = make_task_data(language, design.task, n_train=design.pool, n_validation=0, n_test=design.test,
                                    seed=design.seed)
    return _DATA[key]


def probe_representation(pool_h, test_h, data, design: ProbeDesign) -> dict:
    """Few-shot probes of one representation ``[n, T, d]`` (pool, test): at the task's position
    (``pos_*``) and all positions concatenated (``all_*``), by the methods of
    ``design.endpoints``, per size: the mean test accuracy over subsets, its std, and the
    subsets' accuracies (L-BFGS: also the largest gradient norm left)."""
    from ...measures.fewshot import fewshot_accuracies, subset_indices

    out: dict = {}
    y_pool, y_test = data.train.labels, data.test.labels
    views = {"pos": (pool_h[:, design.position - 1], test_h[:, design.position - 1]),
             "all": (pool_h.reshape(pool_h.shape[0], -1), test_h.reshape(test_h.shape[0], -1))}
    for view, method in design.endpoints:
        xp, xt = views[view]
        for n, k in zip(design.sizes, design.subsets):
            subsets = subset_indices(design.pool, n, k, design.seed)
            kw = {"l2": design.l2} if method == "lbfgs" else {"epochs": design.epochs}
            acc, grad = fewshot_accuracies(xp, y_pool, xt, y_test, data.n_classes, subsets, method, **kw)
            key = f"{view}_{method}_n{n}"
            out[key] = float(np.mean(acc))
            out[f"{key}_std"] = float(np.std(acc, ddof=1)) if len(acc) > 1 else 0.0
            out[f"{key}_subsets"] = acc
            if method == "lbfgs":
                out[f"{key}_grad"] = grad
    return out


def _model_features(model, data):
    import torch

    from ...measures.probe import extract_features, model_pad_id

    pad = model_pad_id(model)
    feats = []
    for split in (data.train, data.test):
        f = extract_features(model, split.tokens, pad)
        feats.append(f.reshape(f.shape[0], split.tokens.shape[1], -1).to(torch.float32))
    return feats


def _probe_checkpoint(checkpoint: Path, design: ProbeDesign) -> dict:
    from ...training.runio import load_checkpoint

    model, language, _, _ = load_checkpoint(checkpoint, "cpu")
    data = _task_data(language, design)
    return probe_representation(*_model_features(model, data), data, design)


def _probe_random_init(cfg, design: ProbeDesign) -> dict:
    import torch

    from ...training.runio import build_language, init_model

    language = build_language(cfg)
    with torch.random.fork_rng(devices=[]):  # the run's own initial weights, no global side effect
        torch.manual_seed(cfg.seed)
        model = init_model(cfg, language, "cpu")
    data = _task_data(language, design)
    return probe_representation(*_model_features(model, data), data, design)


def _baselines(study: Study, p: IsolossPreset, cfg, design: ProbeDesign) -> dict[str, dict]:
    """Majority, look-up table (the true single-mask conditionals) and the oracle (the true
    hidden-state posteriors given the sentence); none depends on the seed."""
    from ...measures.lookup import lookup_features
    from ...training.runio import build_language

    language = build_language(cfg)
    what = json.dumps(dataclasses.asdict(cfg.language), default=str)

    def rep(fn):
        def compute():
            data = _task_data(language, design)
            return probe_representation(fn(data.train.tokens), fn(data.test.tokens), data, design)
        return compute

    T, W = language.max_len, language.n_words
    lookup = study.cached("fewshot-lookup", design.language, design,
                          rep(lambda tok: lookup_features(language, tok).reshape(tok.shape[0], T, W)), what)
    oracle = study.cached("fewshot-oracle", design.language, design,
                          rep(lambda tok: language.posteriors(tok).float()), what)
    data = _task_data(language, design)
    majority = data.majority()[1]
    return {"lookup": lookup, "oracle": oracle, "majority": {"majority": majority}}


# ---- the report ---------------------------------------------------------------------------
def study_seeds(study: Study, p: IsolossPreset) -> list[int]:
    """The seeds of the runs: the preset's, shifted by ``--seed`` (another seed is an
    independent replication in its own folder)."""
    return [study.seed + s for s in p.seeds]


def _run_seeds(study: Study, p: IsolossPreset) -> list[dict]:
    seeds = study_seeds(study, p)
    args = [(study.root / "seeds", p, seed, study.progress and p.workers == 1, study.device) for seed in seeds]
    if p.workers <= 1:
        return [seed_study(*a) for a in args]
    import torch

    from ... import threads

    ctx = multiprocessing.get_context("spawn")
    n = torch.get_num_threads()  # this process's count (threads.configure_threads): the workers' too
    with threads.for_children(n), ProcessPoolExecutor(max_workers=p.workers, mp_context=ctx,
                                                      initializer=threads.init_worker, initargs=(n,)) as pool:
        futures = [pool.submit(seed_study, *a) for a in args]
        out = []
        for seed, fut in zip(seeds, futures):
            out.append(fut.result())
            study.log(f"seed {seed} done")
        return out


def _key(p: IsolossPreset, view: str = "pos", method: str = "lbfgs", n: int | None = None) -> str:
    return f"{view}_{method}_n{n or p.primary_size}"


def report(study: Study, p: IsolossPreset) -> Section:
    section = Section(TITLE)
    design = _design(p)
    results = _run_seeds(study, p)
    rows = [r for res in results for r in res["rows"]]
    for res in results:
        section.runs += res["runs"]
        study.runs.update({info.spec.name: info for info in res["runs"]})
        for k in ("train", "measure"):
            study.timings[k] += res["timings"][k]
        for k in study.counts:
            study.counts[k] += res["counts"][k]
    base_cfg = results[0]["runs"][0].config
    base = _baselines(study, p, base_cfg, design)
    section.rows += rows
    section.text.append(
        f"Language hmm ({p.languages['hmm']}), task {p.task} (the hidden state at position {design.position}); "
        f"{len(study_seeds(study, p))} seeds; base run {p.base_steps} steps (AdamW, constant lr after the "
        f"warm-up); every fork starts from its step {p.base_steps} (weights, optimiser moments, RNG, data stream), "
        f"trains its recipe for {p.recipe_steps} steps (short: 0, long: "
        f"{p.recipe_steps_of(next(f for f in p.forks if f.name == 'long'))}) at the constant lr, then "
        f"{p.decay_steps} steps of linear decay to {p.final_lr_factor:g} × lr. **Iso-loss**: per seed the target is "
        "the lowest KL (on one shared held-out set of "
        f"{p.eval_sentences} sentences) that every fork reaches among its candidate checkpoints (every "
        f"{p.match_every} steps from {p.match_from} steps into the decay to its end); each fork is taken at its "
        f"latest candidate within {p.kl_tolerance / 2:g} nats (half the tolerance) of the target (else the nearest). Probes: the same "
        f"{design.pool}-example pool, subsets and "
        f"{design.test}-example test set for every model. **Primary endpoint**: probe at the task's position, "
        f"converged L-BFGS (l2 {design.l2:g}), n = {p.primary_size}, mean over {dict(zip(p.probe_sizes, p.probe_subsets))[p.primary_size]} "
        "subsets; accuracies in %.")
    _headroom(section, p, base, results, rows)
    _models_table(section, p, rows)
    diffs = _differences(section, p, rows)
    _sensitivity(section, p, rows)
    mean_dkl = {r["recipe"] + " − " + r["reference"]: r["mean_dkl"] for r in section.files["differences.csv"]
                if r["quantity"] == _key(p)}
    _regression(section, p, rows, diffs, mean_dkl)
    return section


def _headroom(section: Section, p: IsolossPreset, base: dict, results: list[dict], rows: list[dict]) -> None:
    def mean_of(dicts: list[dict]) -> dict:
        return {k: float(np.mean([d[k] for d in dicts])) for k in dicts[0]
                if isinstance(dicts[0][k], (int, float)) and not k.endswith("_grad")}

    trained = mean_of([r for r in rows if r["fork"] == "adamw"])
    table_rows = [{"baseline": "majority class", **{f"{v}_{m}_n{n}": base["majority"]["majority"]
                                                    for v, m in ENDPOINTS for n in p.probe_sizes}},
                  {"baseline": "random-init encoder (mean over seeds)", **mean_of([r["random_init"] for r in results])},
                  {"baseline": "look-up table (true conditionals)", **base["lookup"]},
                  {"baseline": "trained model (AdamW reference, mean over seeds)", **trained},
                  {"baseline": "oracle (true hidden-state posteriors)", **base["oracle"]}]
    cols = []
    for view, method, what in (("pos", "lbfgs", "position, L-BFGS"), ("all", "adamw", "all positions, AdamW")):
        for n in p.probe_sizes:
            cols.append(Column(f"{what} n={n} (%)", f"{view}_{method}_n{n}", scale=100, fmt=".1f"))
    section.tables.append(Table(
        "Headroom: probe accuracy of the baselines and the trained model (at the task's position: converged "
        "L-BFGS probe; all positions: the paper's AdamW probe)", cols,
        table_rows, source="headroom.csv", key="baseline", key_header="representation"))
    section.files["headroom.csv"] = [{k: v for k, v in r.items() if not k.endswith("_subsets")} for r in table_rows]


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


ENDPOINTS = ProbeDesign.__dataclass_fields__["endpoints"].default


def _differences(section: Section, p: IsolossPreset, rows: list[dict]) -> dict:
    by = {(r["seed"], r["fork"]): r for r in rows}
    out_rows, claims, primary = [], [], {}
    for c in p.comparisons:
        seeds = sorted({s for s, _ in by if (s, c.recipe) in by and (s, c.reference) in by})
        dkl = [by[(s, c.recipe)]["kl_match"] - by[(s, c.reference)]["kl_match"] for s in seeds]
        within = sum(abs(d) <= p.kl_tolerance for d in dkl)
        quantities = [(f"{v}_{m}_n{n}", f"probe {v} {m} n={n}", c.sign, 100.0)
                      for v, m in ENDPOINTS for n in p.probe_sizes]
        quantities.append(("trace_fisher", "trace of Hessian (Fisher)", -c.sign, 1.0))
        for key, what, sign, scale in quantities:
            d = [scale * (float(by[(s, c.recipe)][key]) - float(by[(s, c.reference)][key])) for s in seeds]
            pd = paired_difference(d, seed=len(out_rows))
            row = {"comparison": f"{c.name}: {key}", "recipe": c.recipe, "reference": c.reference, "quantity": key,
                   "n_seeds": pd.n, "mean": pd.mean, "sd": pd.sd, "t_low": pd.t_low, "t_high": pd.t_high,
                   "boot_low": pd.boot_low, "boot_high": pd.boot_high, "p_value": pd.p_value, "mde": pd.mde,
                   "expected_sign": sign, "verdict": power_verdict(pd, sign),
                   "mean_dkl": float(np.mean(dkl)), "mean_abs_dkl": float(np.mean(np.abs(dkl))), "max_abs_dkl": float(np.max(np.abs(dkl))),
                   "within_tolerance": within}
            out_rows.append(row)
            if key == _key(p) or key == "trace_fisher":
                unit = " pts" if scale == 100 else ""
                claims.append(Claim(
                    c.paper,
                    f"{c.recipe} − {c.reference}, {what}, paired over {pd.n} seeds: {fmt(pd.mean)}{unit}, 95% t "
                    f"interval [{fmt(pd.t_low)}, {fmt(pd.t_high)}], bootstrap [{fmt(pd.boot_low)}, "
                    f"{fmt(pd.boot_high)}], paired SD {fmt(pd.sd)}, MDE (80% power) {fmt(pd.mde)}{unit}; ΔKL mean "
                    f"|{fmt(row['mean_abs_dkl'])}|, max |{fmt(row['max_abs_dkl'])}| nats, {within} of {pd.n} pairs "
                    f"within the tolerance {p.kl_tolerance:g}.", row["verdict"]))
                if key == _key(p):
                    primary[c.name] = pd
    section.files["differences.csv"] = out_rows
    shown = [r for r in out_rows if r["quantity"] in (_key(p), "trace_fisher")]
    section.tables.append(Table(
        "Paired differences (recipe − reference) across seeds: primary probe (points) and trace", [
            Column("n", "n_seeds", fmt="d"), Column("mean", "mean", ci=("t_low", "t_high"), fmt=".3g"),
            Column("bootstrap 95%", "boot_low", fmt=".3g"), Column("to", "boot_high", fmt=".3g"),
            Column("paired SD", "sd", fmt=".3g"), Column("MDE 80%", "mde", fmt=".3g"),
            Column("p", "p_value", fmt=".3g"), Column("max abs ΔKL", "max_abs_dkl", fmt=".2e"),
            Column("pairs within tol.", "within_tolerance", fmt="d"), Column("verdict", "verdict", text=True)],
        shown, source="differences.csv", key="comparison", key_header="comparison"))
    secondary = [r for r in out_rows if r["quantity"] not in (_key(p), "trace_fisher")]
    section.tables.append(Table(
        "Secondary endpoints (other probe sizes, the AdamW probe, the all-positions probe): paired differences in "
        "points", [Column("mean [t 95%]", "mean", ci=("t_low", "t_high"), fmt=".3g"), Column("MDE", "mde", fmt=".3g"),
                   Column("verdict", "verdict", text=True)],
        secondary, source="differences.csv", key="comparison", key_header="comparison"))
    section.claims += claims
    counts = {v: sum(r["verdict"] == v for r in secondary) for v in (DETECTED, DETECTED_AGAINST, NONE_LARGER)}
    section.notes.append(f"Secondary endpoints ({len(secondary)} tests, not corrected for multiplicity): "
                         + ", ".join(f"{k}: {v}" for k, v in counts.items()) + ".")
    return primary


def _sensitivity(section: Section, p: IsolossPreset, rows: list[dict]) -> None:
    """The primary paired differences two more ways, so a residual ΔKL cannot carry a verdict:
    over the pairs within the tolerance only, and corrected for each pair's ΔKL (the
    intercept of the differences regressed on ΔKL)."""
    by = {(r["seed"], r["fork"]): r for r in rows}
    key, out = _key(p), []
    for c in p.comparisons:
        seeds = sorted({s for s, _ in by if (s, c.recipe) in by and (s, c.reference) in by})
        d = np.array([100 * (float(by[(s, c.recipe)][key]) - float(by[(s, c.reference)][key])) for s in seeds])
        dkl = np.array([by[(s, c.recipe)]["kl_match"] - by[(s, c.reference)]["kl_match"] for s in seeds])
        ok = np.abs(dkl) <= p.kl_tolerance
        within = paired_difference(d[ok].tolist(), seed=0)
        adjusted = covariate_adjusted_mean(d, 1000 * dkl)
        out.append({"comparison": f"{c.name}: {key}", "n_within": within.n, "within_mean": within.mean,
                    "within_low": within.t_low, "within_high": within.t_high, "adjusted": adjusted.estimate,
                    "adjusted_low": adjusted.low, "adjusted_high": adjusted.high})
    section.files["sensitivity.csv"] = out
    section.tables.append(Table(
        "Sensitivity of the primary differences (points) to the residual ΔKL: the pairs within the tolerance "
        "only, and the mean corrected for each pair's ΔKL (t intervals, 95%)",
        [Column("pairs within tol.", "n_within", fmt="d"),
         Column("mean of those", "within_mean", ci=("within_low", "within_high"), fmt=".3g"),
         Column("ΔKL-corrected mean", "adjusted", ci=("adjusted_low", "adjusted_high"), fmt=".3g")],
        out, source="sensitivity.csv", key="comparison", key_header="comparison"))


def _regression(section: Section, p: IsolossPreset, rows: list[dict], primary: dict, mean_dkl: dict) -> None:
    key = _key(p)
    reg_rows = []
    # all models, and without the adversarial fork (aimed at the task itself: its accuracy
    # loss is by construction, not through flatness)
    for subset, models in (("all forks", [r for r in rows]), ("without adv", [r for r in rows if r["fork"] != "adv"])):
        good = [r for r in models if math.isfinite(float(r["trace_fisher"]))]
        y = np.array([100 * float(r[key]) for r in good])
        X = np.array([[float(r["trace_fisher"]), 1000 * float(r["kl_match"])] for r in good])
        seeds = np.array([r["seed"] for r in good])
        ivs = cluster_bootstrap_ols(y, X, seeds, n_boot=2000, seed=0)
        n_seeds = len(set(seeds.tolist()))
        df = max(n_seeds - 1, 1)
        for what, iv, sign in zip(("per unit of trace", "per 0.001 nats of KL"), ivs, (-1, -1)):
            decided = math.isfinite(iv.low) and (iv.low > 0 or iv.high < 0)
            verdict = NONE_LARGER if not decided else (DETECTED if (iv.low > 0) == (sign > 0) else DETECTED_AGAINST)
            # the slope's MDE: (t_.975 + t_.8) × its standard error, read off the bootstrap interval
            se = (iv.high - iv.low) / (2 * t_quantile(0.975, df))
            mde = (t_quantile(0.975, df) + t_quantile(0.8, df)) * se
            reg_rows.append({"coefficient": f"{subset}: accuracy (pts) {what}", "estimate": iv.estimate,
                             "low": iv.low, "high": iv.high, "mde": mde, "n_models": len(good), "n_seeds": n_seeds,
                             "verdict": verdict})
    section.files["regression.csv"] = reg_rows
    section.tables.append(Table(
        "Fig. 1 within seeds: primary accuracy (pts) regressed on trace and KL with seed fixed effects "
        "(cluster bootstrap over seeds, 95%)",
        [Column("estimate [95%]", "estimate", ci=("low", "high"), fmt=".3g"), Column("MDE 80%", "mde", fmt=".3g"),
         Column("models", "n_models", fmt="d"),
         Column("verdict", "verdict", text=True)], reg_rows, source="regression.csv", key="coefficient",
        key_header="coefficient"))
    for tr in (reg_rows[0], reg_rows[2]):
        section.claims.append(Claim(
            "at the same loss, flatter models transfer better (Fig. 1): a negative slope of accuracy on the trace.",
            f"within seeds, holding KL fixed ({tr['coefficient'].split(':')[0]}, {tr['n_models']} models): "
            f"{fmt(tr['estimate'])} pts per unit of trace, 95% cluster-bootstrap interval [{fmt(tr['low'])}, "
            f"{fmt(tr['high'])}] over {tr['n_seeds']} seeds (MDE {fmt(tr['mde'])}).", tr["verdict"]))
    # the tolerance by consequence: |slope on KL| × tolerance against half the smallest MDE.
    # The slope is the one without the adversarial fork: its accuracy loss is aimed at the
    # task and has nothing to do with its KL, so with it the KL coefficient is not the
    # accuracy a small KL difference is worth (it may even come out positive).
    slope = abs(reg_rows[3]["estimate"]) * 1000  # pts per nat
    mdes = [d.mde for d in primary.values() if math.isfinite(d.mde)]
    if mdes and math.isfinite(slope):
        effect = slope * p.kl_tolerance
        ok = effect <= min(mdes) / 2
        worst = max(mean_dkl, key=lambda k: abs(mean_dkl[k])) if mean_dkl else None
        section.notes.append(
            f"KL tolerance by consequence: the measured within-seed slope of the primary accuracy on KL (without "
            f"the adversarial fork, whose accuracy loss is aimed at the task) is {fmt(slope / 1000)} pts per 0.001 "
            f"nats (all forks: {fmt(reg_rows[1]['estimate'])}); times the tolerance {p.kl_tolerance:g} nats that "
            f"is {fmt(effect)} pts, {'at most' if ok else 'MORE than'} half the smallest primary MDE "
            f"({fmt(min(mdes))} pts)" + ("." if ok else ": the tolerance is too loose for this design.")
            + (f" The largest mean ΔKL of a compared pair ({worst}: {fmt(mean_dkl[worst])} nats) is worth "
               f"{fmt(slope * abs(mean_dkl[worst]))} pts at that slope." if worst else ""))
