"""Reproduce the paper's results, one recipe per result (``sameloss reproduce``).

``reproduce(experiment, scale)`` trains the runs of a recipe (or reuses / resumes them),
measures their checkpoints (cached), and writes ``<out>/<experiment>-<scale>/``:
``report.md`` (what was run, tables with error bars, figures, and for each claim of the
paper what this run measured and whether the direction agrees), ``results.csv`` (one
row per model), ``runs.csv``, the figures (``*.png``, 200 dpi, or PDF / SVG) each with
``<figure>.data.csv`` (its plotted numbers) and the run folders under ``runs/``.

Recipes: one module each in ``recipes/``, found from its file (``sameloss.registry``;
plugins add more): ``steps`` (Fig. 2/4), ``sizes`` (Fig. 3/5), ``algorithms`` (Tables
1–2), ``figure1`` (Fig. 1: all of them together, with rank correlations), ``isoloss`` (the
decisive test: forks of one base run at matched KL, paired statistics with stated power),
``text`` (real text), ``theory`` (Lemma 3.2, Theorem 3.3), ``dyck`` (Theorem 5.1).
Scales: ``smoke`` (seconds), ``tiny`` (a CPU in minutes), ``small`` and ``paper`` (GPU); a
recipe's settings at one scale are its preset (``PRESETS[scale]``, typed: ``common.py``).

Declarations, the engine and launchers: a recipe's ``units(setup, preset)`` declares its
study (``declare.py``: the parts that can run apart — one run, or a seed's chain —, each a
list of runs, forks, embeddings, measures and gates, and the stages declared from earlier
results); the engine (``engine.py``) runs them through a launcher (``launch.py``: in this
process — the default —, in local worker processes a GPU each, or as a Slurm job array),
and the recipe's ``report(records, preset)`` is written from what they trained and
measured (``engine.Records``: it trains and measures nothing). ``sameloss plan`` walks the
same declaration (``plan.py``). ``seeds=[...]`` runs only those seeds' units of a study
that has them (isoloss) and writes no report: shards of one study, in any number of
processes at once; a later call without ``seeds`` reuses every finished seed, runs the
missing ones, and reports.

Locks (``files.folder_lock``): the process that writes the experiment's own files
(report, ``results.csv``) holds the experiment folder; every unit holds its own folder
(``seeds/seed<N>`` or ``runs/<run>``), so shards on different seeds run at once and two
on the same seed cannot.
"""

from __future__ import annotations

import os
import platform
import time
from datetime import datetime, timezone
from pathlib import Path

from .. import registry
from ..errors import UserError

SCALE_NAMES = ("smoke", "tiny", "small", "paper")
# ``sameloss reproduce`` with no experiment, or ``reproduce isoloss`` (the same job): the
# powered iso-loss study at the ``quick`` scale (its tiny design with fewer seeds; a scale of
# that recipe only, runtime in its docstring); another experiment without ``--scale`` runs at
# ``tiny``
DEFAULT_EXPERIMENT = "isoloss"
MAIN_SCALE = "quick"
DEFAULT_SCALE = "tiny"


def experiments() -> dict[str, str]:
    """Every recipe's name and one-line summary (``sameloss.registry``: the files of
    ``recipes/`` and plugins; read without importing them, so ``sameloss --help`` stays fast)."""
    return {name: entry.summary for name, entry in registry.recipes().items()}


def main_job(experiment: str | None, scale: str | None, gpu: bool | None = None) -> tuple[str, str]:
    """``(experiment, scale)`` as ``sameloss reproduce`` and ``plan`` read them.

    Args:
        experiment: a recipe's name, or ``None`` for the main job's (``isoloss``).
        scale: a scale, or ``None`` for the default: for isoloss, named or not (the main
            job), ``quick`` — the design 25 minutes on 2 CPU cores decide — or, where a GPU is
            present, the whole ``tiny`` design; ``tiny`` for every other recipe.
        gpu: whether a GPU is present (default: whether torch sees one).

    Returns:
        the experiment and the scale to run.
    """
    experiment = experiment or DEFAULT_EXPERIMENT
    if scale is None and experiment == DEFAULT_EXPERIMENT and (gpu if gpu is not None else _cuda()):
        return experiment, DEFAULT_SCALE
    return experiment, scale or (MAIN_SCALE if experiment == DEFAULT_EXPERIMENT else DEFAULT_SCALE)


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def reproduce(experiment: str | None = None, scale: str | None = None, out: str | Path = "runs",
              seed: int = 0, fresh: bool = False, progress: bool = True, device: str | None = None,
              command: str | None = None, launch=None, seeds: list[int] | None = None,
              tracker: str = "none", formats: tuple[str, ...] = ("png",), languages: list[str] | None = None,
              figure_width: str = "page", budget: float | None = None, even: bool = False,
              ensemble: int | None = None, dropout_draws: str = "global") -> Path:
    """Run one recipe at one scale: train its runs (reusing finished ones, resuming
    interrupted ones), measure them (cached) and write its report (``sameloss reproduce``).

    Args:
        experiment: a recipe's name (``experiments()``); ``None``: the main job's, isoloss.
        scale: one of the recipe's scales; ``None``: ``main_job``'s default (isoloss:
            ``quick``, every other recipe: ``tiny``).
        out: the parent folder of the experiment's folder, ``OUT/EXPERIMENT-SCALE``.
        seed: added to every seed of the study (another seed is its own folder).
        fresh: delete the experiment's folder first (only what sameloss wrote).
        progress: show progress bars.
        device: ``auto``, ``cpu`` or ``cuda`` (default: the preset's).
        command: the command line the report names (default: ``reproduce_command``'s).
        launch: a ``launch.LaunchOptions`` (default: every unit in this process).
        seeds: run only these seeds' units and write no report (a shard).
        tracker: ``none``, ``tensorboard`` or ``wandb`` (``training.tracking``).
        formats: of the figures: png, pdf, svg (the report embeds the first).
        languages: ``--language`` specs (a recipe with ``with_languages``: isoloss), each
            choice of languages its own experiment folder (``<experiment>-<scale>-<tags>``).
        figure_width: ``column`` or ``page`` (``plots.style``).
        budget: the minutes the study may take (a recipe with ``with_budget``: isoloss),
            forecast before it trains and spent on the comparisons still short.
        even: every seed runs every fork (``with_even``: the design before the adaptive one).
        ensemble: train the runs in ensembles of at most this many members (``--ensemble N``,
            ``ensembles.py``; ``None``: one run at a time).
        dropout_draws: ``keyed`` trains every run with keyed dropout masks
            (``--dropout-draws``, ``training.keyed``: batchable on a GPU; other runs, in the
            experiment folder ``<name>-keyed``).

    Returns:
        the path of ``report.md``; with ``seeds``, the experiment folder; with a Slurm
        ``--dry-run``, ``None`` (the job script was printed).
    """
    from .core import experiment_dir_name

    experiment, scale = main_job(experiment, scale)
    recipe = registry.recipe(experiment)
    if scale not in recipe.PRESETS:
        raise UserError(f"unknown scale {scale!r}; choose from {', '.join(recipe.PRESETS)}")
    p = on_budget(recipe, experiment, on_languages(recipe, experiment, recipe.PRESETS[scale], languages), budget)
    if even:
        if budget is not None:
            raise UserError("--even runs every fork on a fixed number of seeds: it takes no --budget")
        if not hasattr(recipe, "with_even"):
            raise UserError(f"--even: {experiment} has no adaptive design (the option is isoloss's)")
        p = recipe.with_even(p)
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is not a folder; pass the folder to write experiments in")
    root = out / (experiment_dir_name(experiment, scale, seed) + getattr(recipe, "folder_suffix", lambda _: "")(p)
                  + ("" if dropout_draws == "global" else f"-{dropout_draws}"))
    if launch is not None and launch.dry_run:
        return _dry_run(recipe, experiment, p, root, seed, seeds, launch)
    if seeds is not None:
        if fresh:
            raise UserError("--fresh deletes the whole experiment; with --seeds, remove the seeds' folders "
                            f"(under {root / 'seeds'}) yourself")
        return _shard(recipe, experiment, p, root, seed, seeds, progress, device, launch, tracker, ensemble,
                      dropout_draws)
    start = time.perf_counter()
    launcher = _launcher(experiment, root, launch)  # a launcher that cannot run: one line, before any file
    # the Study holds the experiment folder's lock for the whole call (files.folder_lock);
    # its units hold their own folders' locks (core.execute_unit)
    with _study(p, root, seed, fresh, progress, device, launcher, tracker, formats=formats, ensemble=ensemble,
                dropout_draws=dropout_draws) as study:
        study.log(f"reproduce {experiment} --scale {scale} (seed {seed}) in {root}")
        if budget is not None and hasattr(recipe, "forecast"):  # before anything trains: what the budget buys
            study.log(recipe.forecast(p, "cpu" if (device or p.device) != "cuda" else "h100", _workers_of(launcher)))
        records = run_declaration(recipe, study, p, _workers_of(launcher))
        from .plots import drawing

        with drawing(width=figure_width, caveat=smoke_caveat() if scale == "smoke" else None):
            result = recipe.report(records, p)
        from .report import write_report

        sections = result if isinstance(result, list) else [result]
        wall = time.perf_counter() - start
        runs_section = _runs_section(study, sections)
        header = _header(recipe, experiment, scale, seed, study, wall, command)
        # a section marked ``lead`` (a study's verdicts) comes before the Runs table
        ordered = [*(s for s in sections if s.lead), runs_section, *(s for s in sections if not s.lead)]
        runtime = _runtime_line(wall, launcher, scale)
        path = write_report(root, f"{recipe.TITLE} — scale `{scale}`", header, ordered, runtime)
        study.log(f"wrote {path} ({wall:.0f} s)")
        from .report import terminal_summary

        answer = terminal_summary(sections, runtime)  # the study ends with its answer, on the terminal (issue 39)
        if answer:
            print(f"\n{answer}\n", flush=True)
    return path


def _runtime_line(wall: float, launcher, scale: str) -> str:
    """The answer's last line: how long the study took, where."""
    workers = _workers_of(launcher)
    where = "in this process" if launcher.name == "inprocess" else f"on {workers} {launcher.name} worker(s)"
    took = f"{wall / 60:.1f} min" if wall >= 90 else f"{wall:.0f} s"
    return f"Runtime: {took} {where} (scale {scale}; load average {os.getloadavg()[0]:.1f} at the end)."


def smoke_caveat() -> str:
    """What every figure of a smoke run says under its title (issue 39: a smoke probe at 10 %
    under a 52 % majority line read as a result)."""
    from .common import COMMON

    m = COMMON["smoke"].measure
    return (f"smoke scale — a few dozen training steps, measures on a few dozen samples (probes trained by epochs: "
            f"{m.probe_epochs} epochs on {m.task_train} examples); the numbers check the pipeline and mean nothing")


def on_budget(recipe, experiment: str, p, budget: float | None):
    """The preset with ``--budget`` minutes (``recipe.with_budget``), or as it is."""
    if budget is None:
        return p
    make = getattr(recipe, "with_budget", None)
    if make is None:
        raise UserError(f"--budget: {experiment} spends no seeds adaptively (the option is isoloss's)")
    return make(p, budget)


def _workers_of(launcher) -> int:
    """Units at once: inprocess one; a launcher without a worker count, as many as CPU cores."""
    return 1 if launcher.name == "inprocess" else max(1, launcher.workers or os.cpu_count() or 1)


def on_languages(recipe, experiment: str, p, languages: list[str] | None):
    """The preset on the ``--language`` choices (``recipe.with_languages``), or as it is."""
    if not languages:
        return p
    make = getattr(recipe, "with_languages", None)
    if make is None:
        raise UserError(f"--language: {experiment} runs its own languages (the option is isoloss's)")
    return make(p, languages)


def _dry_run(recipe, experiment: str, p, root: Path, seed: int, seeds: list[int] | None, launch) -> None:
    """``--launcher slurm --dry-run``: print the job script submitit would submit for the
    study's first stage of units (``seeds``: those seeds' only) and write nothing (the units
    are the recipe's declaration, read as ``sameloss plan`` reads it)."""
    import torch

    from .declare import Unit, merge_units
    from .engine import Setup
    from .launch import SUBMITIT_DIR, Slurm

    make = getattr(recipe, "units", None)
    if make is None:
        raise UserError(f"{experiment} declares no units: all of it runs in the calling process, nothing on Slurm")
    declaration = make(Setup(root, seed, lambda msg: None, planning=True), p)
    units = merge_units([u for u in declaration if isinstance(u, Unit)])
    if seeds is not None:
        units = [u for u in units if u.seed in seeds]
    launcher = Slurm(root.absolute() / SUBMITIT_DIR, launch, torch.get_num_threads(), f"sameloss-{experiment}")
    print(f"# the job script submitit would submit: a Slurm array of {len(units)} units "
          f"({', '.join(u.name for u in units[:4])}{', …' if len(units) > 4 else ''}; a study declared in stages, "
          "e.g. an adaptive one's pilot, submits its later stages after this one); nothing was submitted or "
          "written\n" + launcher.script(len(units)), flush=True)
    return None


def _launcher(experiment: str, root: Path, launch):
    from .launch import LaunchOptions, make_launcher

    return make_launcher(launch or LaunchOptions(), root, f"sameloss-{experiment}")


def _study(p, root: Path, seed: int, fresh: bool, progress: bool, device: str | None, launcher, tracker: str,
           lock: bool = True, formats: tuple[str, ...] = ("png",), ensemble: int | None = None,
           dropout_draws: str = "global"):
    from .core import Study

    return Study(root, seed=seed, fresh=fresh, progress=progress, device=device or p.device, tracker=tracker,
                 launcher=launcher, lock=lock, figure_formats=formats, ensemble=ensemble, dropout_draws=dropout_draws)


def run_declaration(recipe, study, p, workers: int = 1, seeds: list[int] | None = None, check=None):
    """The recipe's declaration (``units``) run stage by stage through the study's launcher
    (``engine.run_stages``; ``seeds``: only those seeds' units and the stages they need;
    ``check(declaration)`` first); returns what the report reads (``engine.Records``)."""
    from .engine import Records, Setup, run_stages

    setup = Setup(study.root, study.seed, study.log, workers=workers)
    declaration = recipe.units(setup, p)
    if check is not None:
        check(declaration)

    def resolve(later, records):
        return later.declare(Records(setup, study, dict(zip(later.after, records))), *later.args)

    return Records(setup, study, run_stages(declaration, study.run_units, resolve, seeds, study.log))


def _shard(recipe, experiment: str, p, root: Path, seed: int, seeds: list[int], progress: bool,
           device: str | None, launch, tracker: str, ensemble: int | None = None,
           dropout_draws: str = "global") -> Path:
    """``reproduce --seeds``: only the units of ``seeds``, no report."""
    from .engine import declared_seeds
    from .launch import format_seeds

    start = time.perf_counter()
    launcher = _launcher(experiment, root, launch)
    known: set[int] = set()

    def check(declaration: list) -> None:
        known.update(declared_seeds(declaration))
        if not known:
            raise UserError(f"{experiment} has no per-seed units: --seeds selects seeds of a study that has several "
                            "(isoloss); --seed N runs another replication of this one")
        unknown = sorted(set(seeds) - known)
        if unknown:
            raise UserError(f"--seeds {format_seeds(unknown)}: not seeds of this study (its seeds: "
                            f"{format_seeds(sorted(known))})")
        study.log(f"reproduce {experiment} --seeds {format_seeds(seeds)} in {root}")

    # no lock on the experiment: shards on other seeds run at once; each unit locks its seed's folder
    with _study(p, root, seed, False, progress, device, launcher, tracker, lock=False, ensemble=ensemble,
                dropout_draws=dropout_draws) as study:
        run_declaration(recipe, study, p, _workers_of(launcher), seeds, check)
    missing = sorted(known - set(seeds))
    trained = sum(1 for r in study.runs.values() if r.status != "reused")
    study.log(f"seeds {format_seeds(seeds)} done in {time.perf_counter() - start:.0f} s ({trained} runs trained or "
              f"resumed, {study.counts['measured']} rows measured); the report: the same command without --seeds"
              + (f" (it runs the seeds not given here, {format_seeds(missing)}, unless another shard has "
                 "finished them)" if missing else ""))
    return root


def reproduce_command(experiment: str, scale: str, seed: int = 0, languages: list[str] | None = None,
                      budget: float | None = None, even: bool = False, dropout_draws: str = "global") -> str:
    """The command line that runs this experiment again."""
    return (f"sameloss reproduce {experiment} --scale {scale}" + (f" --seed {seed}" if seed else "")
            + "".join(f" --language {x}" for x in languages or ()) + (f" --budget {budget:g}" if budget else "")
            + (" --even" if even else "") + (f" --dropout-draws {dropout_draws}" if dropout_draws != "global" else ""))


def _doc_section(doc: str, heading: str) -> str:
    """The indented paragraph under ``heading`` in a recipe's docstring."""
    lines = (doc or "").splitlines()
    out, inside = [], False
    for line in lines:
        if line.startswith(heading):
            inside = True
            continue
        if inside:
            if line and not line.startswith(" "):
                break
            out.append(line.strip())
    return " ".join(x for x in out if x)


def _header(recipe, experiment: str, scale: str, seed: int, study, wall: float, command: str | None
            ) -> list[str]:
    import torch

    cmd = command or reproduce_command(experiment, scale, seed)
    reused = sum(1 for r in study.runs.values() if r.status == "reused")
    machine = (f"{platform.machine()}, {os.cpu_count()} CPU cores, torch {torch.__version__} "
               f"({torch.get_num_threads()} threads)")
    if torch.cuda.is_available():
        machine += f", GPU {torch.cuda.get_device_name(0)}"
    workers = "" if study.launcher.name == "inprocess" else \
        f", summed over the units' workers (launcher {study.launcher.name})"
    lines = [
        f"Command: `{cmd}` — written {datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M UTC')} on {machine}.",
        f"Wall time of this call: {wall:.0f} s (training {study.timings['train']:.0f} s, measuring "
        f"{study.timings['measure']:.0f} s{workers}); {len(study.runs)} runs ({reused} reused from an earlier call), "
        f"{study.counts['measured']} rows measured, {study.counts['earlier']} taken from an earlier call's "
        "`measurements.json`." + (" Reused work is not in the wall time." if reused or study.counts["earlier"] else ""),
    ]
    expected = _doc_section(recipe.__doc__, "Expected result")
    if expected:
        lines.append(f"What the paper reports: {expected}")
    lines.append("Every claim sentence below is computed from `results.csv` by the recipe; intervals are 95%. "
                 "\"Agrees\" means the interval excludes 0 on the paper's side, \"agrees in direction\" that only "
                 "the point estimate does.")
    if scale == "smoke":
        lines.append("**Scale `smoke` checks the pipeline only: models of a few dozen steps, measures of a few "
                     "dozen samples. Its numbers mean nothing.**")
    return lines


def _runs_section(study, sections: list):
    from .report import Column, Section, Table, write_csv

    rows, seen = [], set()
    for s in sections:
        for info in s.runs:
            if info.spec.name in seen:
                continue
            seen.add(info.spec.name)
            ev = info.summary.get("eval", {}) or {}
            rows.append({"run": info.spec.name, "label": info.spec.label, "status": info.status,
                         "steps": info.config.steps, "parameters": info.summary.get("parameters"),
                         "final_kl": ev.get("kl"), "seconds": info.seconds,
                         "folder": study.rel(info.path), "overrides": " ".join(info.spec.overrides)})
    write_csv(rows, study.root / "runs.csv")
    section = Section("Runs")
    section.text.append("Pre-training runs (each in the folder `runs.csv` names, relative to this report — "
                        "`runs/<run>/`, or a seed's `seeds/seed<N>/runs/<run>/` —, with `config.toml`, "
                        "`metrics.jsonl`, `checkpoints/`, `summary.json`); status says whether this call trained, "
                        "resumed or reused it; seconds are this call's. Final KL is the run's own held-out "
                        "evaluation; the tables below use the larger measure set.")
    section.tables.append(Table("Runs", [Column("status", "status", text=True), Column("steps", "steps", fmt="d"),
                                         Column("parameters", "parameters", fmt="d"),
                                         Column("final KL", "final_kl", fmt=".3g"),
                                         Column("seconds", "seconds", fmt=".0f")],
                                rows, source="runs.csv", key="run", key_header="run"))
    return section


__all__ = ["DEFAULT_EXPERIMENT", "DEFAULT_SCALE", "MAIN_SCALE", "SCALE_NAMES", "experiments", "main_job", "reproduce",
           "reproduce_command"]
