"""``sameloss reproduce``: one recipe at one scale, run through the engine and reported.

``reproduce(job, options)`` takes the job (``Job``: what is computed, hence the experiment
folder) and how it runs (``Options``), both built once by the caller (the CLI: from its
flags), declares the study (the recipe's ``units``), runs it stage by stage through a launcher
(``run_declaration``, ``engine.run_stages``) and writes the report from what the engine
recorded (``engine.Records``; ``report.write_report``). ``options.seeds`` runs only those
seeds' units and writes no report (``_shard``); a Slurm ``--dry-run`` prints the job script of
the first stage (``_dry_run``).
"""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ... import registry
from ...errors import UserError
from . import layout
from .recipe import Recipe, load_recipe

# ``sameloss reproduce`` with no experiment, or ``reproduce isoloss`` (the same job): the
# powered iso-loss study at the ``quick`` scale (its tiny design with fewer seeds; a scale of
# that recipe only); another experiment without ``--scale`` runs at ``tiny``
DEFAULT_EXPERIMENT = "isoloss"
MAIN_SCALE = "quick"
# isoloss's other scale of its own: the study across the registered languages (``recipes/isoloss/across.py``)
ACROSS_SCALE = "languages"
# the isoloss pilot that measured the designs' prior paired SDs (its own seeds: no design re-runs them)
PILOT_SCALE = "pilot"
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


@dataclass(frozen=True)
class Job:
    """What a study computes, hence its folder: the recipe at a scale (``main_job``: the
    defaults), ``out`` (the parent folder of the experiment's, ``OUT/EXPERIMENT-SCALE``),
    ``--seed`` (added to every seed of the study; another seed is its own folder), the
    ``--language`` specs (``with_languages``), the ``--budget`` minutes (``with_budget``)
    and ``--dropout-draws``."""

    experiment: str
    scale: str
    out: Path = Path("runs")
    seed: int = 0
    languages: tuple[str, ...] = ()
    budget: float | None = None
    dropout_draws: str = "global"

    def __post_init__(self):  # a folder given as text, languages as a list: the types the job keeps
        object.__setattr__(self, "out", Path(self.out))
        object.__setattr__(self, "languages", tuple(self.languages or ()))

    @property
    def recipe(self) -> Recipe:
        return load_recipe(self.experiment)

    def preset(self) -> Any:
        """The preset this job runs (``Recipe.preset``); ``UserError`` for an option the recipe
        does not take."""
        return self.recipe.preset(self.scale, list(self.languages), self.budget)

    def root(self, p: Any) -> Path:
        """The experiment folder (``layout.experiment_dir``)."""
        return layout.experiment_dir(self.out, self.experiment, self.scale, self.seed, self.recipe.folder_suffix(p),
                                     self.dropout_draws)

    def command(self) -> str:
        """The command line that runs this job again."""
        return (f"sameloss reproduce {self.experiment} --scale {self.scale}" + (f" --seed {self.seed}" if self.seed
                                                                               else "")
                + "".join(f" --language {x}" for x in self.languages)
                + (f" --budget {self.budget:g}" if self.budget else "")
                + (f" --dropout-draws {self.dropout_draws}" if self.dropout_draws != "global" else ""))


@dataclass(frozen=True)
class Options:
    """How ``reproduce`` runs a job (nothing here changes what it computes).

    fresh: delete the experiment's folder first (only what sameloss wrote).
    progress: show progress bars.
    device: ``auto``, ``cpu`` or ``cuda`` (default: the preset's).
    command: the command line the report names (default: the job's, ``Job.command``).
    launch: a ``launch.LaunchOptions`` (default: every unit in this process).
    seeds: run only these seeds' units and write no report (a shard).
    tracker: ``none``, ``tensorboard`` or ``wandb`` (``training.tracking``).
    formats: of the figures: png, pdf, svg (the report embeds the first).
    figure_width: ``column`` or ``page`` (``plots.style``).
    ensemble: train the runs in ensembles of at most this many members (``--ensemble N``,
        ``ensembles.py``; ``None``: one run at a time).
    """

    fresh: bool = False
    progress: bool = True
    device: str | None = None
    command: str | None = None
    launch: Any = None
    seeds: list[int] | None = None
    tracker: str = "none"
    formats: tuple[str, ...] = ("png",)
    figure_width: str = "page"
    ensemble: int | None = None


def reproduce(job: Job, options: Options = Options()) -> Path | None:
    """Run ``job``: train its runs (reusing finished ones, resuming interrupted ones), measure
    them (cached) and write its report (``sameloss reproduce``), as ``options`` say.

    Returns:
        the path of ``report.md``; with ``options.seeds``, the experiment folder; with a
        Slurm ``--dry-run``, ``None`` (the job script was printed).
    """
    p = job.preset()
    if job.out.exists() and not job.out.is_dir():
        raise UserError(f"--out {job.out} is not a folder; pass the folder to write experiments in")
    root = job.root(p)
    if options.launch is not None and options.launch.dry_run:
        return _dry_run(job, p, root, options)
    if options.seeds is not None:
        if options.fresh:
            raise UserError("--fresh deletes the whole experiment; with --seeds, remove the seeds' folders "
                            f"(under {root / layout.SEEDS}) yourself")
        return _shard(job, p, root, options)
    return _whole(job, p, root, options)


def _whole(job: Job, p: Any, root: Path, opts: Options) -> Path:
    """The study run and reported (``reproduce`` without ``seeds``)."""
    from ..reports.plots import drawing
    from ..reports.document import report_header, runs_section, terminal_summary, write_report

    from .folder import check_report

    start = time.perf_counter()
    # a launcher that cannot run (no Slurm, sbatch refuses the array): one line, before any file
    launcher = _launcher(job.experiment, root, opts.launch, opts.device or p.device)
    check_report(root)  # a report a user added lines to: kept, and one line before anything runs
    recipe, workers = job.recipe, workers_of(launcher)
    # the Study holds the experiment folder's lock for the whole call (files.folder_lock);
    # its units hold their own folders' locks (dispatch.execute)
    with _study(p, root, job, opts, launcher) as study:
        study.log(f"reproduce {job.experiment} --scale {job.scale} (seed {job.seed}) in {root}")
        if job.budget is not None and recipe.hook("forecast") is not None:  # before anything trains
            study.log(recipe.hook("forecast")(p, "cpu" if (opts.device or p.device) != "cuda" else "h100", workers))
        records = run_declaration(recipe, study, p, job.seed, workers)
        write_tables(records, root)
        with drawing(width=opts.figure_width, caveat=smoke_caveat() if job.scale == "smoke" else None):
            result = recipe.report(records, p)
        sections = result if isinstance(result, list) else [result]
        wall = time.perf_counter() - start
        runs = runs_section(study, sections)
        command = opts.command or job.command()
        header = report_header(recipe.doc, command, job.scale, study, wall, any(s.claims for s in sections))
        # a section marked ``lead`` (a study's verdicts) comes before the Runs table
        ordered = [*(s for s in sections if s.lead), runs, *(s for s in sections if not s.lead)]
        runtime = _runtime_line(wall, launcher, job.scale)
        path = write_report(root, f"{recipe.title} — scale `{job.scale}`", header, ordered, runtime)
        study.log(f"wrote {path} ({wall:.0f} s)")
        answer = terminal_summary(sections, runtime)  # the study ends with its answer, on the terminal (issue 39)
        if answer:
            print(f"\n{answer}\n", flush=True)
    return path


def write_tables(records, root: Path) -> None:
    """The study's two tidy tables: every tagged measure's row with its tags
    (``measured.csv``) and every unit's CPU seconds per part (``costs.csv``) — the records
    the report queried (``engine.Records.rows`` / ``cost_rows``), for any other query."""
    from .layout import COSTS_TABLE, MEASURED_TABLE
    from ..reports.document import write_csv

    for name, rows in ((MEASURED_TABLE, records.measured_rows()), (COSTS_TABLE, records.cost_rows())):
        if rows:
            write_csv(rows, root / name)


def _runtime_line(wall: float, launcher, scale: str) -> str:
    """The answer's last line: how long the study took, where."""
    workers = workers_of(launcher)
    where = "in this process" if launcher.name == "inprocess" else f"on {workers} {launcher.name} worker(s)"
    took = f"{wall / 60:.1f} min" if wall >= 90 else f"{wall:.0f} s"
    return f"Runtime: {took} {where} (scale {scale}; load average {os.getloadavg()[0]:.1f} at the end)."


def smoke_caveat() -> str:
    """What every figure of a smoke run says under its title (issue 39: a smoke probe at 10 %
    under a 52 % majority line read as a result)."""
    from ..presets.common import COMMON

    m = COMMON["smoke"].measure
    return (f"smoke scale — a few dozen training steps, measures on a few dozen samples (probes trained by epochs: "
            f"{m.probe_epochs} epochs on {m.task_train} examples); the numbers check the pipeline and mean nothing")


def workers_of(launcher) -> int:
    """Units at once: inprocess one; a launcher without a worker count, as many as CPU cores."""
    return 1 if launcher.name == "inprocess" else max(1, launcher.workers or os.cpu_count() or 1)


def _dry_run(job: Job, p: Any, root: Path, opts: Options) -> None:
    """``--launcher slurm --dry-run``: print the job script submitit would submit for the
    study's first stage of units (``seeds``: those seeds' only) and write nothing (the units
    are the recipe's declaration, read as ``sameloss plan`` reads it)."""
    import torch

    from .declare import Unit, merge_units
    from .walk import Setup
    from .launch import SUBMITIT_DIR
    from .slurm import Slurm, gpus_per_task

    declaration = job.recipe.units(Setup(root, job.seed, lambda msg: None, planning=True), p)
    units = merge_units([u for u in declaration if isinstance(u, Unit)])
    if opts.seeds is not None:
        units = [u for u in units if u.seed in opts.seeds]
    launch = dataclasses.replace(opts.launch, slurm_gpus_per_task=gpus_per_task(opts.launch, opts.device or p.device))
    launcher = Slurm(root.absolute() / SUBMITIT_DIR, launch, torch.get_num_threads(), f"sameloss-{job.experiment}")
    print(f"# the job script submitit would submit: a Slurm array of {len(units)} units "
          f"({', '.join(u.name for u in units[:4])}{', …' if len(units) > 4 else ''}; a study declared in stages, "
          "e.g. an adaptive one's pilot, submits its later stages after this one); nothing was submitted or "
          "written\n" + launcher.script(len(units)), flush=True)
    return None


def _launcher(experiment: str, root: Path, launch, device: str = "auto"):
    from .launch import LaunchOptions
    from .launchers import make_launcher

    return make_launcher(launch or LaunchOptions(), root, f"sameloss-{experiment}", device)


def _study(p: Any, root: Path, job: Job, opts: Options, launcher, lock: bool = True):
    from .core import Study, StudySettings

    settings = StudySettings(progress=opts.progress, device=opts.device or p.device, tracker=opts.tracker,
                             figure_formats=opts.formats, ensemble=opts.ensemble, dropout_draws=job.dropout_draws)
    return Study(root, settings, fresh=opts.fresh and lock, lock=lock, launcher=launcher)


def run_declaration(recipe: Recipe, study, p, seed: int, workers: int = 1, seeds: list[int] | None = None,
                    check=None):
    """The recipe's declaration (``units``, given the study's ``seed``: ``--seed``, the one
    channel a seed travels in) run stage by stage through the study's launcher
    (``engine.run_stages``; ``seeds``: only those seeds' units and the stages they need;
    ``check(declaration)`` first); returns what the report reads (``engine.Records``)."""
    from .dispatch import run_units
    from .walk import Records, Setup, run_stages

    setup = Setup(study.root, seed, study.log, workers=workers)
    declaration = recipe.units(setup, p)
    if check is not None:
        check(declaration)

    def resolve(later, records):
        return later.declare(Records(setup, study, dict(zip(later.after, records))), *later.args)

    return Records(setup, study, run_stages(declaration, lambda units: run_units(study, units), resolve, seeds,
                                         study.log))


def _shard(job: Job, p: Any, root: Path, opts: Options) -> Path:
    """``reproduce --seeds``: only the units of ``seeds``, no report."""
    from .walk import Setup, declared_seeds
    from .launch import format_seeds

    start = time.perf_counter()
    launcher = _launcher(job.experiment, root, opts.launch, opts.device or p.device)
    seeds, known = opts.seeds, set()

    def check(declaration: list) -> None:
        known.update(declared_seeds(declaration))
        if not known:
            raise UserError(f"{job.experiment} has no per-seed units: --seeds selects seeds of a study that has "
                            "several (isoloss); --seed N runs another replication of this one")
        unknown = sorted(set(seeds) - known)
        if unknown:
            raise UserError(f"--seeds {format_seeds(unknown)}: not seeds of this study (its seeds: "
                            f"{format_seeds(sorted(known))})")

    # the seeds checked on the declaration as a plan reads it, before the study's folder is made
    # (issue 63: a refused --seeds 5 left an empty, marked folder behind)
    check(job.recipe.units(Setup(root, job.seed, lambda msg: None, planning=True), p))
    known.clear()

    def begin(declaration: list) -> None:
        check(declaration)
        study.log(f"reproduce {job.experiment} --seeds {format_seeds(seeds)} in {root}")

    # no lock on the experiment: shards on other seeds run at once; each unit locks its seed's folder
    with _study(p, root, job, opts, launcher, lock=False) as study:
        run_declaration(job.recipe, study, p, job.seed, workers_of(launcher), seeds, begin)
    missing = sorted(known - set(seeds))
    trained = sum(1 for r in study.runs.values() if r.status != "reused")
    study.log(f"seeds {format_seeds(seeds)} done in {time.perf_counter() - start:.0f} s ({trained} runs trained or "
              f"resumed, {study.counts['measured']} rows measured); the report: the same command without --seeds"
              + (f" (it runs the seeds not given here, {format_seeds(missing)}, unless another shard has "
                 "finished them)" if missing else ""))
    return root
