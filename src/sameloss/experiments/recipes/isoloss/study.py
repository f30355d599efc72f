"""The iso-loss study as a declaration (``declare.py``): the runs (a base per seed, its forks
at every fork point), the measures, the headroom gate and the seed unit — one seed's chain,
which a launcher runs apart, with the forks its design plans. ``seed_result`` reads a seed's
records back into what the analysis takes."""

from __future__ import annotations

import dataclasses

from ....measures.run import MeasureSpec
from ....models.sizes import TRANSFORMER_SIZES
from ...presets.common import base_settings, measure_spec
from ...engine.runspec import RunSpec, Setting
from ...engine.declare import (Checkpoint, CostPart, Embedded, Gate, Measure, Reference, Run, cost_rows,
    seed_unit, tags)
from ...engine import layout
from ...engine.walk import eval_history
from .design import EMBED_KL_TOLERANCE, MEASURED, Fork, IsolossPreset, flatness_forks, forks_of, language_studies


# ---- runs ---------------------------------------------------------------------------------
def _run_prefix(p: IsolossPreset) -> str:
    """Run names start with the language (its tag in a study of several languages: runs.csv
    lists every language's runs, and two draws of one language must not share a name)."""
    return p.tag or p.language


def _tags(p: IsolossPreset, seed: int, **more) -> tuple:
    """A run's or measure's tags (``declare.tags``): the language (its tag in a study of
    several; ``""`` alone), the seed, and what it is in the seed's chain. The report finds
    every row by these (``seed_result``)."""
    return tags(language=p.tag, seed=seed, **more)


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


def fork_run(p: IsolossPreset, seed: int, fork: Fork, k: int, curves: bool = False) -> RunSpec:
    """Fork ``fork`` at point ``k`` (the checkpoint it starts from is its ``Run``'s
    ``start``: ``seed_study``). It keeps and evaluates its exact KL where it is read and
    nowhere else: at its measured checkpoints (``probe_steps``: the matching reads their
    KL), and with ``curves`` — the study's first seed, whose KL curves the curves figure
    draws — at every candidate (every ``match_every`` steps of its stretch). An evaluation
    of the tiny design's 4,000 held-out sentences costs ~0.27 CPU-s: every candidate of every
    fork was ~140 CPU-s a seed, for 3 read per fork (issue 45)."""
    end = p.fork_end(fork)
    keep = set(p.candidates(fork) if curves else p.probe_steps(fork))
    settings = [*_common_settings(p, seed), ("steps", end), ("checkpoints", tuple(sorted(s for s in keep if s > k))),
                ("eval.every", 0), ("eval.at_checkpoints", True), ("optim.decay_steps", p.schedule.decay_steps),
                ("optim.final_steps", p.final_steps_of(fork)), ("optim.final_lr_factor", p.schedule.final_lr_factor),
                *fork.settings]
    if fork.adversarial:  # on the preset's task (read when the run is built, not when the fork was declared)
        settings += [("adversarial.weight", fork.adversarial), ("adversarial.task", p.task),
                     ("adversarial.batch_size", p.adversary.batch_size),
                     ("adversarial.pool_size", p.adversary.pool_size)]
    if fork.resized:
        settings += large_shape(p, fork)
    return RunSpec(f"{_run_prefix(p)}-s{seed}-{p.point_name(k)}-{fork.name}", tuple(settings), label=fork.label,
                   group=fork.name)


def runs(p: IsolossPreset, language: str, seed: int) -> list[RunSpec]:
    """The base run and its forks at every point (a base-recipe fork once: its late run)."""
    return [base_run(p, seed), *(fork_run(p, seed, f, k) for k in sorted(p.fork_points, reverse=True)
                                 for f in p.forks_at(k) if p.fork_point_of(f, k) == k)]


# ---- the measures ----------------------------------------------------------------------------
def _probe_spec(p: IsolossPreset, seed: int) -> MeasureSpec:
    """The measures of a measured checkpoint: the Fisher trace and the few-shot probes (its
    KL is the run's own evaluation at the candidate: no second evaluation)."""
    return dataclasses.replace(measure_spec(p, (), seed), loss=False, probe=(), fewshot=p.fewshot(seed))


# the guards of the flatness arms (and of their AdamW reference): "flatter" is not a rescaling of
# the weights when the weight norm and the reparametrisation-invariant adaptive trace move with it
RESCALING = {"weight_norms": {}, "adaptive_trace": {}}


def _arm_spec(p: IsolossPreset, seed: int, fork: Fork) -> MeasureSpec:
    """A measured checkpoint's spec: ``_probe_spec``, and for a flatness arm and the AdamW fork it
    is compared with, the weight norms and the adaptive trace beside the trace."""
    spec = _probe_spec(p, seed)
    arms = flatness_forks(p)
    if p.rescaling and arms and (fork.name in arms or fork.name == "adamw"):
        return dataclasses.replace(spec, extra={**spec.extra, **RESCALING})
    return spec


def _fewshot_spec(p: IsolossPreset, seed: int) -> MeasureSpec:
    return dataclasses.replace(_probe_spec(p, seed), traces=())


def _trace_spec(p: IsolossPreset, seed: int) -> MeasureSpec:
    return dataclasses.replace(_probe_spec(p, seed), fewshot=None)


def _kl_spec(p: IsolossPreset) -> MeasureSpec:
    """The exact KL on the runs' own held-out set (the size fork's start is checked on it)."""
    return MeasureSpec(loss=True, loss_sentences=p.eval_sentences)


# ---- the headroom gate (in each seed's unit, before its forks) -------------------------------
REFERENCES = ("random-init", "lookup", "oracle")


# the base's training, its gate and the references (a seed's cost before any fork)
BASE_COST = CostPart("", "base", "train+gate")


def gate_measures(p: IsolossPreset, seed: int) -> tuple[Measure, ...]:
    """What the gate reads: the seed's trained base probed beside its random-init encoder,
    the look-up table and the oracle, all with the seed's probe subsets (the look-up and
    oracle representations do not depend on the seed: measured once per experiment)."""
    base = base_run(p, seed).name
    cost = BASE_COST
    return (Measure(Checkpoint(base, p.base_steps), _fewshot_spec(p, seed), cost,
                    tags=_tags(p, seed, role="gate", of="trained")),
            *(Measure(Reference(kind, base), MeasureSpec(fewshot=p.fewshot(seed)), cost,
                      tags=_tags(p, seed, role="gate", of=kind.replace("-", "_"))) for kind in REFERENCES))


def headroom_gate(p: IsolossPreset, seed: int, trained: dict, random_init: dict, lookup: dict, oracle: dict
                  ) -> tuple[bool, str]:
    """Whether the trained encoder has room to differ: ≥ ``headroom_margin`` points above the
    look-up table and the random-init encoder and below the oracle (primary endpoint)."""
    key, m = p.primary_key, p.verdicts.headroom_margin
    t, r, lk, o = (100 * float(x[key]) for x in (trained, random_init, lookup, oracle))
    ok = t >= lk + m and t >= r + m and t <= o - m
    text = (f"Headroom gate (primary endpoint, seed {seed}'s base at step {p.base_steps}): trained {t:.1f} %, "
            f"random-init {r:.1f} %, look-up table {lk:.1f} %, oracle {o:.1f} %; the gate asks ≥ {m:g} points above "
            f"both references and ≥ {m:g} below the oracle: " + ("passed." if ok else "FAILED"))
    return ok, text


def _headroom_check(rows: list[dict], p: IsolossPreset, seed: int) -> tuple[bool, str]:
    return headroom_gate(p, seed, *rows)


def _same_function(rows: list[dict], large: str) -> tuple[bool, str]:
    """The size fork starts from exactly the base's function: its exact KL equals the base
    checkpoint's to ``EMBED_KL_TOLERANCE`` (else the study stops: the construction broke)."""
    a, b = rows[0]["kl"], rows[1]["kl"]
    if not abs(a - b) <= EMBED_KL_TOLERANCE:
        raise RuntimeError(f"the embedded model {large} does not compute the base's function: KL {b!r} vs {a!r}")
    return True, ""


# ---- one seed (a unit: one worker process) --------------------------------------------------
def wanted(p: IsolossPreset, only: frozenset | None) -> tuple[set, set]:
    """The ``(point, fork)`` pairs a seed measures (``only``: a planned seed's; ``None``:
    all) and the pairs whose runs it trains (a base-recipe fork's entry at any point is
    its late run)."""
    measured = {(p.point_name(k), f.name) for k in p.fork_points for f in p.forks_at(k)}
    if only is not None:
        measured &= set(only)
    return measured, p.runs_read(measured)


def entries(p: IsolossPreset, seed: int, only: frozenset | None, curves: bool = False
            ) -> dict[tuple[str, str], RunSpec]:
    """Every ``(point, fork)`` entry of the seed and the run it reads, in the order the
    study runs them: the fork points from the latest, the forks in the preset's order
    (``curves``: the seed whose KL curves are drawn, ``fork_run``)."""
    measured, trained = wanted(p, only)
    out: dict[tuple[str, str], RunSpec] = {}
    for k in sorted(p.fork_points, reverse=True):
        for f in p.forks_at(k):
            run_k = p.fork_point_of(f, k)
            if run_k != k:  # the base recipe's late fork
                if (p.point_name(k), f.name) in measured:
                    out[(p.point_name(k), f.name)] = out[(p.point_name(run_k), f.name)]
            elif (p.point_name(k), f.name) in trained:
                out[(p.point_name(k), f.name)] = fork_run(p, seed, f, k, curves)
    return out


def _fork_items(p: IsolossPreset, seed: int, f: Fork, k: int, curves: bool) -> tuple:
    """A fork's run from its start: the base's checkpoint at ``k`` (none from scratch) or,
    for a size fork, that checkpoint embedded with its optimiser moments, after checking it
    computes the base's function."""
    cost = CostPart(p.point_name(k), f.name, "train")
    spec = fork_run(p, seed, f, k, curves)
    tagged = _tags(p, seed, role="fork", point=p.point_name(k), fork=f.name)
    if k == 0:
        return (Run(spec, None, cost, tagged),)
    if not f.resized:
        return (Run(spec, Checkpoint(base_run(p, seed).name, k), cost, tagged),)
    reads = embedding_check(p, seed, f, k)
    return (*reads, Gate(f"embedding of {spec.name}", _same_function, reads, (Run(spec, reads[1].of, cost, tagged),),
                         (spec.name,)))


def embedding_check(p: IsolossPreset, seed: int, f: Fork, k: int) -> tuple[Measure, Measure]:
    """The exact KL of the base's checkpoint at ``k`` and of its embedding into the size
    fork's shape (with the optimiser moments: the fork's start)."""
    small = Checkpoint(base_run(p, seed).name, k)
    large = Embedded(small, width_factor=f.width_factor, extra_layers=f.extra_layers, optimizer="embedded")
    cost = CostPart(p.point_name(k), f.name, "train")
    at = dict(role="embedding", point=p.point_name(k), fork=f.name)
    return (Measure(small, _kl_spec(p), cost, tags=_tags(p, seed, **at, of="small")),
            Measure(large, _kl_spec(p), cost, tags=_tags(p, seed, **at, of="large")))


def probe_measures(p: IsolossPreset, seed: int, point: str, fork: Fork, spec: RunSpec) -> list[tuple[int, tuple]]:
    """Per measured checkpoint of an entry, its step and measures: trace and probes, and for
    the reference of a size contrast its trace in the large model's space (embedded)."""
    big = one_space(p).get(fork.name)
    cost = CostPart(point, fork.name, "measure")
    out = []
    for step in p.probe_steps(fork):
        ck = Checkpoint(spec.name, step)
        at = dict(point=point, fork=fork.name, run=spec.name, step=step)
        extra = () if big is None else (Measure(Embedded(ck, width_factor=big.width_factor,
                                                         extra_layers=big.extra_layers), _trace_spec(p, seed), cost,
                                                tags=_tags(p, seed, role="probe-embedded", **at)),)
        out.append((step, (Measure(ck, _arm_spec(p, seed, fork), cost, tags=_tags(p, seed, role="probe", **at)),
                           *extra)))
    return out


def one_space(p: IsolossPreset) -> dict[str, Fork]:
    """The references of a size contrast and the large fork whose parameter space their
    traces are measured in too."""
    forks = {f.name: f for f in p.forks}
    return {c.reference: forks[c.recipe] for c in p.comparisons if forks[c.recipe].resized}


def seed_study(p: IsolossPreset, seed: int, only: frozenset | None = None, curves: bool = False) -> tuple:
    """One seed's chain, the items of its unit: train the base and gate it (with no headroom
    and ``on_no_headroom="stop"`` no fork runs), then train the forks at every fork point and
    measure each fork's ``probe_steps`` (trace and probes). ``only``: the ``(point, fork)``
    pairs this seed runs (in a planned design: the forks of the tests planned beyond it;
    ``None``: all). Nothing is selected here: the estimation at each
    comparison's target KL reads these rows (``paired.estimate_pairs``). ``curves``: the
    study's first seed, whose forks evaluate their KL at every candidate (``fork_run``)."""
    forks = {f.name: f for f in p.forks}
    runs_of = entries(p, seed, only, curves)
    trained: dict[str, tuple[str, str]] = {}  # each run once, at the entry that trains it
    for (point, name), spec in runs_of.items():
        trained.setdefault(spec.name, (point, name))
    steps = {p.point_name(k): k for k in p.fork_points}
    training = [item for spec_name, (point, name) in trained.items()
                for item in _fork_items(p, seed, forks[name], steps[point], curves)]
    measured, _ = wanted(p, only)
    measuring = [m for (point, name), spec in runs_of.items() if (point, name) in measured
                 for _, ms in probe_measures(p, seed, point, forks[name], spec) for m in ms]
    reads = gate_measures(p, seed)
    return (Run(base_run(p, seed), None, BASE_COST, _tags(p, seed, role="base", point="", fork="base")), *reads,
            Gate("headroom", _headroom_check, reads, (*training, *measuring), (p, seed), p.verdicts.on_no_headroom))


def seed_result(records, p: IsolossPreset, seed: int) -> dict:
    """What the analysis takes of one seed's records (``engine.Records``), found by its tags
    (``_tags``), never by declaring the seed again: its gate, a row per measured checkpoint
    of each entry (its KL from the run's own evaluation there), the runs, the size forks'
    start checks, every run's KL curve and the unit's CPU per part."""
    where, mine = seed_folder(p, seed), dict(language=p.tag, seed=seed)
    unit = records.unit_in(where)
    ((_, base),) = records.runs(**mine, role="base")
    gate = {t["of"]: row for t, row in records.tagged(**mine, role="gate")}
    ok, text = records.gate("headroom", where)
    out = {"gate": {"seed": seed, "ok": ok, "text": text, "trained": gate["trained"],
                    "random_init": gate["random_init"], "lookup": gate["lookup"], "oracle": gate["oracle"]},
           "rows": [], "runs": [base], "embedded_kl": [], "curves": {}, "seconds": unit.seconds,
           "cpu_seconds": unit.cpu_seconds, "cost": cost_rows(unit.cpu)}
    if not ok and p.verdicts.on_no_headroom == "stop":
        return out
    forks = {f.name: f for f in p.forks}
    fork_steps = {p.point_name(k): k for k in p.fork_points}
    embedded = {(r["point"], r["fork"], r["step"]): r for r in records.rows(**mine, role="probe-embedded")}
    entries: dict[tuple[str, str], object] = {}  # (point, fork) -> the run it reads, as measured
    histories: dict[str, dict] = {}  # each run's evaluations, read once

    def history(info) -> dict:
        return histories.setdefault(info.spec.name, eval_history(info))

    for got in records.rows(**mine, role="probe"):
        point, name, step = got["point"], got["fork"], got["step"]
        info = entries.setdefault((point, name), records.run(got["run"], where))
        row = {"model": f"{p.tag + ':' if p.tag else ''}s{seed}-{point}-{name}@{step}",
               "language": p.choice.spec, "seed": seed, "point": point, "fork_step": fork_steps[point],
               "fork": name, "label": info.spec.label, "run": info.spec.name, "step": step,
               "steps_at_final_lr": step - p.stretch_start(forks[name]),
               "lr_factor": info.config.lr_factor(step - 1), "kl": float(history(info)[step]["kl"]),
               **{key: v for key, v in got.items() if key in MEASURED or key.startswith(("pos_", "all_"))}}
        if (point, name, step) in embedded:
            e = embedded[(point, name, step)]
            row["trace_fisher_embedded"] = e["trace_fisher"]
            row["trace_fisher_embedded_se"] = e["trace_fisher_se"]
        out["rows"].append(row)
    trained = records.runs(**mine, role="fork")
    for t, info in trained:  # a run trained only for another point's entry has its curve too
        entries.setdefault((t["point"], t["fork"]), info)
    kl = {(r["point"], r["fork"], r["of"]): r["kl"] for r in records.rows(**mine, role="embedding")}
    out["embedded_kl"] = [{"kl_small": kl[(pt, name, "small")], "kl_large": kl[(pt, name, "large")]}
                          for pt, name, of in kl if of == "small"]
    out["curves"] = {f"{pt}-{name}": {s: float(ev["kl"]) for s, ev in history(info).items()}
                     for (pt, name), info in entries.items()}
    out["curves"]["base"] = {s: float(ev["kl"]) for s, ev in eval_history(base).items()}
    out["runs"] += list({info.spec.name: info for _, info in trained}.values())
    return out


def seed_folder(p: IsolossPreset, seed: int) -> str:
    """The study folder of a seed's unit (``declare.seed_unit``; ``layout.seed_folder``)."""
    return layout.seed_folder(seed, p.tag)


def study_seeds(setup, p: IsolossPreset) -> list[int]:
    """The seeds of the runs: the preset's, shifted by ``--seed`` (another seed is an
    independent replication in its own folder)."""
    return [setup.seed + s for s in p.seeds]


def all_seeds(setup, p: IsolossPreset) -> list[int]:
    """Every seed of the study (what ``reproduce --seeds`` accepts)."""
    return sorted({s for q in language_studies(p) for s in study_seeds(setup, q)})


# ---- the units: every seed's chain ------------------------------------------------------------
def units(setup, p: IsolossPreset) -> list:
    """One unit per seed and language: its chain (the base run and its headroom gate, then
    its forks at every fork point, the size fork included), measured; in a design with a
    ``plan``, seed i runs the forks of the tests planned more than i seeds."""
    out: list = []
    for q in language_studies(p):
        first = study_seeds(setup, q)[0]
        out += [seed_unit(seed, seed_study(q, seed, only, curves=seed == first), q.tag)
                for seed, only in seed_forks(setup, q)]
    return out


def seed_forks(setup, p: IsolossPreset) -> list[tuple[int, frozenset | None]]:
    """The seeds and the ``(point, fork)`` pairs each runs (``None``: every fork): in a design
    with a ``plan``, seed i the forks of the tests planned more than i seeds; else every seed,
    every fork."""
    seeds = study_seeds(setup, p)
    if p.seed_design.plan:
        return [(seed, forks_of(p, p.planned_tests(i))) for i, seed in enumerate(seeds) if p.planned_tests(i)]
    return [(seed, None) for seed in seeds]


def seeds_of(records, p: IsolossPreset) -> list[int]:
    """The seeds of the language's units that ran, in order (their base runs' tags)."""
    return sorted(t["seed"] for t, _ in records.runs(language=p.tag, role="base"))


def seed_results(records, p: IsolossPreset) -> list[dict]:
    """The results (``seed_result``) of the seeds that ran, in seed order."""
    return [seed_result(records, p, seed) for seed in seeds_of(records, p)]


