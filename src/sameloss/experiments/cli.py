"""``sameloss reproduce`` (the command-line entry of the recipes) and ``sameloss plot``
(training curves of runs).

Hooked into ``sameloss.cli.build_parser`` by ``add_reproduce_parser(commands)`` and
``add_plot_parser(commands)``; the handlers raise ``UserError`` for mistakes a user can
make (the CLI turns them into one line and exit code 2).
"""

from __future__ import annotations

import argparse

from ..cliargs import add_output_file, deprecated, examples
from ..config import int_at_least, positive_float
from ..threads import add_threads_argument


def _epilog(*example_lines: str) -> str:
    from .engine.orchestrate import DEFAULT_EXPERIMENT, MAIN_SCALE, experiments

    lines = ["experiments:"]
    for name, what in experiments().items():
        lines.append(f"  {name:<11} {what}")
    lines += ["", "scales: smoke (the pipeline only, its numbers mean nothing: seconds to minutes on a CPU), tiny (the "
              "CPU scale: minutes to hours on 2 cores), small and paper (GPU: hours to days); "
              f"{MAIN_SCALE}: {DEFAULT_EXPERIMENT}'s only (its tiny design cut to what the main job's budget decides: "
              f"the main job); languages: {DEFAULT_EXPERIMENT}'s only (its primary comparisons on every registered "
              "language, pooled). Runtimes: `sameloss plan EXPERIMENT --scale SCALE` forecasts them on this machine "
              "before anything runs; those measured are in docs/results/isoloss.md, from the runs' records.", "",
              examples(*example_lines)]
    return "\n".join(lines)


SCALE_HELP = ("how big: smoke, {main}, tiny, small, paper, languages (default: {main} for {default}, named or not: the "
              "main job; tiny for every other experiment); {main} and languages (the study across the registered "
              "languages) are {default}'s only")
SEED_HELP = ("added to every seed of the study: its runs, measures and probe draws, and {default}'s seeds 0, 1, ... "
             "become N, N+1, ... (default 0; another N is its own folder, OUT/EXPERIMENT-SCALE-seedN). Not --seeds, "
             "which picks the seeds to run")


def _add_experiment_arguments(parser: argparse.ArgumentParser) -> list[str]:
    """``EXPERIMENT`` and ``--scale``, the same for ``reproduce`` and ``plan``: both default to
    the main job. Returns the scales (every one ``reproduce`` accepts)."""
    from .engine.orchestrate import ACROSS_SCALE, DEFAULT_EXPERIMENT, MAIN_SCALE, PILOT_SCALE, experiments
    from .engine.recipe import SCALE_NAMES

    names = list(experiments())
    scales = [SCALE_NAMES[0], MAIN_SCALE, *SCALE_NAMES[1:], ACROSS_SCALE, PILOT_SCALE]
    parser.add_argument("experiment", nargs="?", default=None, choices=names, metavar="EXPERIMENT",
                        help=f"one of {', '.join(names)} (default {DEFAULT_EXPERIMENT}, the main job)")
    parser.add_argument("--scale", default=None, choices=scales,
                        help=SCALE_HELP.format(main=MAIN_SCALE, default=DEFAULT_EXPERIMENT))
    return scales


def add_reproduce_parser(commands) -> argparse.ArgumentParser:
    """Add ``reproduce`` to the ``sameloss`` sub-command parsers ``commands``."""
    from .engine.orchestrate import DEFAULT_EXPERIMENT, MAIN_SCALE

    reproduce = commands.add_parser(
        "reproduce", help="reproduce a result of the paper end to end: train, measure, report",
        description="Train the runs of one experiment (or reuse / resume them), measure every checkpoint "
                    "(exact loss, trace of Hessian, probe accuracy; cached), and write "
                    "OUT/EXPERIMENT-SCALE/: report.md (tables with error bars, figures, and whether each claim "
                    "of the paper holds in this run), results.csv, figures and every run's folder, then print the "
                    "study's answer (isoloss: its verdict table). The main job is "
                    f"{DEFAULT_EXPERIMENT} --scale {MAIN_SCALE} on local workers, whether {DEFAULT_EXPERIMENT} is "
                    "named or not (the powered iso-loss study in a design chosen for 25 minutes on 2 cores; "
                    "`sameloss plan` forecasts its runtime here, and docs/results/isoloss.md gives the runtimes "
                    "measured, per scale).",
        epilog=_epilog("sameloss reproduce                      # the main job: isoloss --scale quick",
                       "sameloss reproduce steps --scale smoke  # another experiment, its pipeline only"))
    scales = _add_experiment_arguments(reproduce)
    # the old name of --scale, kept so that earlier commands still work
    reproduce.add_argument("--preset", dest="scale", choices=scales, action=deprecated("--scale"),
                           help=argparse.SUPPRESS)
    reproduce.add_argument("--out", default="runs", metavar="DIR", help="parent folder (default runs)")
    reproduce.add_argument("--seed", type=int_at_least(0), default=0, metavar="N",
                           help=SEED_HELP.format(default=DEFAULT_EXPERIMENT))
    reproduce.add_argument("--language", dest="languages", action="append", default=None, metavar="SPEC",
                           help="isoloss: the language to study, NAME[:SIZE][:key=value,...] — e.g. hmm:headroom, "
                                "pcfg:headroom, hmm:headroom:seed=7 (another draw of that size), "
                                "hmm:micro:emission_concentration=1.0,n_states=5 (constructor settings: "
                                "language.params), task=NAME (the task probed: one with a span and a posterior; "
                                "default task-5 for hmm, span-1 for pcfg); the size defaults to headroom. Given more "
                                "than once: the study on each language and a replication table. Each choice of "
                                "languages is its own folder, OUT/isoloss-SCALE-<languages> (hmm:headroom alone: "
                                "OUT/isoloss-SCALE, the default)")
    reproduce.add_argument("--budget", type=positive_float, default=None, metavar="MINUTES",
                           help="isoloss at quick or tiny: choose the design again by the claims-first rule for "
                                "this many wall minutes on 2 cores (the planner's cost model; its own folder, "
                                "OUT/isoloss-SCALE-budgetMINUTES); `sameloss plan` says first which claims it is "
                                "expected to decide (default: the scale's own design)")
    reproduce.add_argument("--fresh", action="store_true",
                           help="delete the experiment's folder first and redo everything (only when all it "
                                "holds is what sameloss wrote, inside its run folders too: a user's file there is "
                                "named and nothing is deleted)")
    reproduce.add_argument("--device", choices=["auto", "cpu", "cuda"], default=None,
                           help="where to train and measure (default: the preset's; auto = CUDA when present)")
    reproduce.add_argument("--no-progress", action="store_true", help="no progress bars")
    reproduce.add_argument("--format", dest="formats", type=_formats, default=("png",), metavar="FMT[,FMT]",
                           help="figure formats: png (200 dpi, the default), pdf, svg (vector, for papers), or "
                                "several, e.g. png,pdf; the report embeds the first. Each figure also gets "
                                "<figure>.data.csv with exactly its plotted numbers; a re-run removes the figures it "
                                "wrote earlier in formats no longer asked for")
    _add_figure_width(reproduce)
    add_threads_argument(reproduce)
    from ..training.tracking import add_tracker_argument
    add_tracker_argument(reproduce)
    _add_launch_arguments(reproduce)
    reproduce.set_defaults(run=_reproduce)
    return reproduce


def _add_figure_width(parser: argparse.ArgumentParser) -> None:
    from .reports.document import FIGURE_WIDTHS  # (not plots: it imports torch, before the threads are checked)

    parser.add_argument("--figure-width", choices=list(FIGURE_WIDTHS), default="page",
                        help="the width the figures are drawn and saved at, with no text under 7 pt there: column "
                             f"({FIGURE_WIDTHS['column']:g} in, one column of a two-column paper) or page "
                             f"({FIGURE_WIDTHS['page']:g} in, the text width; the default)")


def _formats(text: str) -> tuple[str, ...]:
    """An argparse type: ``png`` / ``png,pdf`` (a bad format is a one-line usage error)."""
    from .reports.document import parse_formats  # (not plots: it imports torch, before the threads are checked)

    try:
        return parse_formats(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


_positive = int_at_least(1)
_non_negative = int_at_least(0)


def _seeds(text: str) -> list[int]:
    from .engine.launch import parse_seeds

    try:
        return parse_seeds(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _ensemble(text: str) -> int | None:
    from .engine.ensembles import parse_ensemble

    try:
        return parse_ensemble(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _mem(text: str) -> str:
    from .engine.launch import SLURM_MEM

    if not SLURM_MEM.match(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a Slurm memory size (e.g. 16G, 32000M)")
    return text


def _slurm_extra(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    key = key.strip().lstrip("-")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE (e.g. mail-type=END)")
    return key, value


def _add_launch_arguments(parser: argparse.ArgumentParser) -> None:
    from .engine.launch import LAUNCHERS, LaunchOptions

    d = LaunchOptions()
    group = parser.add_argument_group(
        "launchers", "where the study's units run (a unit is one run, or a seed's chain: base run, then its forks); "
                     "every launcher gives the same results. docs/how-to/cluster.md has the commands.")
    group.add_argument("--launcher", choices=LAUNCHERS, default=None,
                       help="inprocess: one unit after another in this process (the default, but isoloss, the main "
                            "job, named or not and at any scale, runs its seeds on local workers when submitit is "
                            "installed and the machine has cores for more than one; a --seeds shard in this process); "
                            "local: --workers processes "
                            "on this machine, sharing its GPUs round robin; slurm: a Slurm job array (submitit), "
                            "preempted tasks requeued and resumed")
    group.add_argument("--workers", type=_positive, default=None, metavar="N",
                       help="local: processes at once (default: up to 8 a GPU as the cores allow, else one per --threads cores); "
                            "slurm: array tasks running at once (default: all)")
    group.add_argument("--seeds", type=_seeds, default=None, metavar="LIST",
                       help="run only these of the study's seeds (e.g. 0-7 or 0,3,5, as --seed numbers them; "
                            "isoloss) and write no report: shards "
                            "of one study may run at once; the same command without --seeds reuses what they "
                            "finished, runs what is missing and writes the report")
    group.add_argument("--slurm-partition", default=None, metavar="P", help="Slurm partition (default: the cluster's)")
    group.add_argument("--slurm-time", type=_positive, default=d.slurm_time, metavar="MIN",
                       help=f"time limit of each task in minutes; one that runs out is requeued and resumes "
                            f"(default {d.slurm_time})")
    group.add_argument("--slurm-gpus-per-task", type=_non_negative, default=d.slurm_gpus_per_task, metavar="G",
                       help="GPUs per task (default: by the study's device — none for a CPU study, e.g. scale "
                            "smoke or --device cpu; one for --device cuda; for auto, one where the partition has "
                            "GPUs, as sinfo lists them, else none)")
    group.add_argument("--slurm-requeues", type=_non_negative, default=d.slurm_requeues, metavar="N",
                       help=f"how many times a task that runs out of --slurm-time is requeued and resumes (default "
                            f"{d.slurm_requeues}; 0: never); past that its unit's line says so")
    group.add_argument("--slurm-mem", type=_mem, default=None, metavar="SIZE",
                       help="memory per task, e.g. 32G (default: the partition's)")
    group.add_argument("--slurm-account", default=None, metavar="A", help="Slurm account to charge (sbatch --account)")
    group.add_argument("--slurm-qos", default=None, metavar="Q", help="Slurm quality of service (sbatch --qos)")
    group.add_argument("--slurm-constraint", default=None, metavar="C",
                       help="node features the tasks need, e.g. 'a100|h100' (sbatch --constraint)")
    group.add_argument("--slurm-extra", dest="slurm_extra", action="append", type=_slurm_extra, default=None,
                       metavar="KEY=VALUE",
                       help="any other sbatch option, e.g. mail-type=END (repeat for several; written as "
                            "#SBATCH --KEY=VALUE)")
    group.add_argument("--cpus-per-task", type=_positive, default=None, metavar="N",
                       help="CPUs of each array task (default: one per --threads, the threads each worker runs)")
    group.add_argument("--dry-run", action="store_true",
                       help="slurm: print the job script submitit would submit (sbatch options, the array, the "
                            "command) and exit; nothing is submitted or written")
    group.add_argument("--dropout-draws", choices=["global", "keyed"], default="global",
                       help="global: every run's dropout drawn from torch's global RNG (the recipes' runs); keyed: "
                            "masks a pure function of seed, step and position, which a GPU ensemble can draw "
                            "batched — other runs (other numbers), in the experiment folder <name>-keyed")
    group.add_argument("--ensemble", type=_ensemble, default=None, metavar="N|off",
                       help="train runs that share a model shape as ensembles of at most N members, one batched "
                            "computation (on a GPU; on the CPU member by member, the same numbers bit for bit and "
                            "no faster): each worker walks its units together (default off)")


def _launch_options(args, argv_given: set[str]):
    from .engine.launch import LaunchOptions, check_options

    launcher = args.launcher
    if launcher is None:
        from .engine.orchestrate import DEFAULT_EXPERIMENT

        main = args.experiment in (None, DEFAULT_EXPERIMENT) and args.seeds is None
        launcher = _main_job_launcher(args) if main else "inprocess"
    options = LaunchOptions(launcher, args.workers, args.slurm_partition, args.slurm_time,
                            args.slurm_gpus_per_task, args.slurm_requeues, args.slurm_mem, slurm_account=args.slurm_account,
                            slurm_qos=args.slurm_qos, slurm_constraint=args.slurm_constraint,
                            slurm_extra=tuple(args.slurm_extra or ()), cpus_per_task=args.cpus_per_task,
                            dry_run=args.dry_run)
    check_options(options, argv_given)
    return options


def _main_job_launcher(args) -> str:
    """``local`` or ``inprocess`` for the main job (``launch.main_job_options``), said in a note."""
    import importlib.util
    import os

    import torch

    from .engine.launch import main_job_options

    have = importlib.util.find_spec("submitit") is not None
    options = main_job_options(args.workers, torch.get_num_threads(), torch.cuda.device_count(), os.cpu_count(),
                               have)
    from ..progress import say

    if options.launcher == "local":  # a note, beside the headings (stdout unless a terminal): stderr is for errors
        say(f"note: isoloss runs its seeds on {options.workers} local workers at once (--launcher inprocess: "
            "one after another in this process)")
    elif not have:
        say("note: isoloss runs its seeds one after another (pip install submitit to run them on this "
            "machine's cores at once)")
    return options.launcher


def _given(args) -> set[str]:
    """The launch flags set to something else than their default."""
    from .engine.launch import LaunchOptions

    d = LaunchOptions()
    given = set()
    if args.workers is not None:
        given.add("workers")
    for name in ("slurm_partition", "slurm_time", "slurm_gpus_per_task", "slurm_requeues", "slurm_mem",
                 "slurm_account", "slurm_qos",
                 "slurm_constraint", "cpus_per_task", "dry_run"):
        if getattr(args, name) != getattr(d, name):
            given.add(name)
    if args.slurm_extra:
        given.add("slurm_extra")
    return given


def add_plan_parser(commands) -> argparse.ArgumentParser:
    """Add ``plan`` (``experiments.plan``) to the ``sameloss`` sub-command parsers."""
    from .engine.orchestrate import DEFAULT_EXPERIMENT

    plan = commands.add_parser(
        "plan", help="what a study costs before it runs: wall time, the budget's forecast, runs, FLOPs, memory",
        description="Print, without training or writing anything, what `sameloss reproduce EXPERIMENT --scale "
                    "SCALE` would do, summary first: the wall time on --workers, the totals (runs, training steps, "
                    "FLOPs), what the budget buys (isoloss at an adaptive scale: the comparisons expected to reach "
                    "their MDE target, and those with no prior SD, planned after the pilot), the time per stage "
                    "(training, exact-KL evaluation, trace, probes) from the hardware's peak FLOP/s and a stated "
                    "utilisation per stage, and the peak memory per measure; --runs adds one row per run. cpu: this "
                    "machine's float32 matmul peak per worker, measured when the command runs; h100 / a100: NVIDIA's published "
                    "peaks, with the least time a training step takes there (src/sameloss/experiments/engine/plan.py "
                    "says what is counted, engine/calibration.toml where each number comes from). The defaults plan "
                    "the main job as "
                    "`sameloss reproduce` runs it here.",
        epilog=_epilog("sameloss plan                                  # the main job, on this machine's workers",
                       "sameloss plan isoloss --scale tiny --hardware h100 --workers 8"))
    _add_experiment_arguments(plan)
    plan.add_argument("--hardware", default="cpu", choices=["cpu", "h100", "a100"],
                      help="what it would run on: cpu (this machine; the default), h100 or a100 (one GPU per worker)")
    # its old name: plan's --device named hardware, reproduce's --device is auto/cpu/cuda
    plan.add_argument("--device", dest="hardware", choices=["cpu", "h100", "a100"], action=deprecated("--hardware"),
                      help=argparse.SUPPRESS)
    plan.add_argument("--workers", type=_positive, default=None, metavar="N",
                      help="processes (cpu) or GPUs the units are shared out to (default: what reproduce would "
                           "use, the main job's local workers on this machine for isoloss on cpu, else 1)")
    plan.add_argument("--cpu-peak", type=positive_float, default=None, metavar="GFLOPS",
                      help="cpu: use this float32 peak (GFLOP/s) instead of measuring it")
    plan.add_argument("--runs", action="store_true", help="also list every run: model, steps, FLOPs, peak memory")
    plan.add_argument("--out", default="runs", metavar="DIR",
                      help="the --out reproduce would use (only names the folders; nothing is written)")
    plan.add_argument("--seed", type=int_at_least(0), default=0, metavar="N",
                      help="the --seed reproduce would use: " + SEED_HELP.format(default=DEFAULT_EXPERIMENT))
    plan.add_argument("--language", dest="languages", action="append", default=None, metavar="SPEC",
                      help="the --language reproduce would use (isoloss; repeat for several)")
    plan.add_argument("--budget", type=positive_float, default=None, metavar="MINUTES",
                      help="isoloss at quick or tiny: the wall minutes reproduce --budget would be given "
                           "(default: the scale's own design, chosen for 25 and 180 minutes); the plan says first "
                           "which claims that budget's design is expected to decide, and at what power")
    plan.add_argument("--ensemble", type=_ensemble, default=None, metavar="N|off",
                      help="the --ensemble reproduce would use: runs trained as ensembles of at most N (default off)")
    plan.add_argument("--dropout-draws", choices=["global", "keyed"], default="global",
                      help="the --dropout-draws reproduce would use (keyed: runs with dropout batch on a GPU)")
    add_threads_argument(plan)
    plan.set_defaults(run=_plan)
    return plan


def _job(args):
    """The job ``reproduce`` and ``plan`` are given (``orchestrate.Job``), built once from their flags."""
    from .engine.orchestrate import Job, main_job

    experiment, scale = main_job(args.experiment, args.scale)
    return Job(experiment, scale, args.out, args.seed, args.languages, args.budget, args.dropout_draws)


def _plan(args) -> None:
    from .reports.plan import plan_text

    job = _job(args)
    workers = args.workers or _plan_workers(job.experiment, args.hardware)
    print(plan_text(job, args.hardware, workers, None if args.cpu_peak is None else args.cpu_peak * 1e9,
                    args.ensemble, runs=args.runs))


def _plan_workers(experiment: str, hardware: str) -> int:
    """The workers ``reproduce`` would use: isoloss on this CPU runs on local workers
    (``launch.main_job_options``); anything else in one process, or on one GPU."""
    from .engine.orchestrate import DEFAULT_EXPERIMENT

    if experiment != DEFAULT_EXPERIMENT or hardware != "cpu":
        return 1
    import importlib.util
    import os

    import torch

    from .engine.launch import main_job_options

    options = main_job_options(None, torch.get_num_threads(), 0, os.cpu_count(),
                               importlib.util.find_spec("submitit") is not None)
    return options.workers if options.launcher == "local" else 1


def _reproduce(args) -> None:
    from .engine.orchestrate import Options, reproduce

    options = Options(fresh=args.fresh, progress=not args.no_progress, device=args.device,
                      launch=_launch_options(args, _given(args)), seeds=args.seeds, tracker=args.tracker,
                      formats=args.formats, figure_width=args.figure_width, ensemble=args.ensemble)
    path = reproduce(_job(args), options)
    if path is not None:  # (--dry-run printed the job script and wrote nothing)
        print(path)


def add_replicate_parser(commands) -> argparse.ArgumentParser:
    """Add ``replicate`` (the replication table of finished isoloss studies)."""
    replicate = commands.add_parser(
        "replicate", help="the replication table of isoloss studies run apart (one per language)",
        description="Read finished `sameloss reproduce isoloss` folders — each on one language, or on several "
                    "(--language given more than once) — and print the replication table a study of all of "
                    "them at once leads with: per comparison and fork point each language's mean primary "
                    "difference [95% t] and verdict, \"replicated\" only where every language with headroom "
                    "agrees in direction and at least one detects, and the inverse-variance pooled estimate "
                    "(fixed and random effects) with Cochran's Q and I². Studies run apart (other sessions, "
                    "machines or clusters) are combined without rerunning anything; nothing is written but "
                    "--csv.",
        epilog=examples("sameloss replicate runs/isoloss-tiny-hmm runs/isoloss-tiny-pcfg",
                        "sameloss replicate hmm=runs/isoloss-tiny pcfg=runs/isoloss-tiny-pcfg --csv replication.csv"))
    replicate.add_argument("studies", nargs="+", metavar="[LABEL=]FOLDER",
                           help="a study folder, OUT/isoloss-SCALE[-languages]; LABEL= names a one-language study "
                                "(default: the language its results.csv names, else the folder's name)")
    add_output_file(replicate, "--csv", "also write the table's numbers to FILE")
    replicate.set_defaults(run=_replicate)
    return replicate


def _replicate(args) -> None:
    from pathlib import Path

    from .. import files, storage
    from ..errors import UserError
    from .recipes.isoloss import finished_studies, replication_section
    from .reports.document import csv_text

    outcomes = []
    for text in args.studies:
        label, sep, folder = text.partition("=")
        if not sep or Path(text).exists():  # a folder whose name has "=" in it is a folder
            label, folder = None, text
        elif not label:
            raise UserError(f"{text!r}: LABEL=FOLDER needs a label before '='")
        elif not folder:  # (an empty path would be read as the current folder)
            raise UserError(f"{text!r}: LABEL=FOLDER needs a folder after '='")
        outcomes += finished_studies(folder, label)
    tags = [o["tag"] for o in outcomes]
    twice = sorted({t for t in tags if tags.count(t) > 1})
    if twice:
        raise UserError(f"two studies are named {', '.join(twice)}: name each one-language study, LABEL=FOLDER")
    if len(outcomes) < 2:
        raise UserError("one language is nothing to replicate: give at least two studies (or one of several "
                        "languages)")
    csv_path = Path(args.csv) if args.csv else None
    if csv_path is not None:
        files.check_output(csv_path, args.force, "--csv")
        if not csv_path.parent.is_dir():
            raise UserError(f"--csv {csv_path}: no folder {csv_path.parent} to write it in")
    section = replication_section(outcomes)
    section.text.insert(0, "Studies: " + "; ".join(f"{o['tag']} ← {o['folder']}" for o in outcomes) + ".")
    print("\n".join(section.answer) + "\n\n" + section.markdown())
    if csv_path is not None:
        try:
            files.write_output(csv_path, csv_text(section.files["replication.csv"]), args.force, "--csv")
        except OSError as exc:  # a folder it may not write in (a full disk: write_output's own line)
            raise storage.write_error(csv_path, exc) from None
        print(f"\n{csv_path}")


def add_plot_parser(commands) -> argparse.ArgumentParser:
    """Add ``plot`` (training curves of runs) to the ``sameloss`` sub-command parsers."""
    from .reports.curves import DEFAULT_OUT

    plot = commands.add_parser(
        "plot", help="training curves of runs: train loss, exact KL (or held-out loss), learning rate",
        description="Draw the training curves of one or more pre-training runs from their metrics.jsonl: train "
                    "loss (with the optimum, the entropy of the true conditionals, dashed), the exact KL to the "
                    "true conditionals on a log axis ± std over the held-out subsets (a corpus run: the held-out "
                    "cross-entropy) and the learning rate, against step; one line per run, labelled by its folder's "
                    "name. Writes the figure and FILE.data.csv (the plotted numbers) beside it; an existing file is "
                    "replaced only when sameloss wrote it (its sha256 listed in .sameloss-outputs beside it, or a figure "
                    "tagged by sameloss), or with --force; a symbolic link never.",
        epilog=examples("sameloss plot runs/hmm-micro runs/hmm-sam --out curves.pdf"))
    plot.add_argument("runs", nargs="+", metavar="RUN", help="run folders (runs/NAME, as sameloss pretrain writes them)")
    plot.add_argument("--out", default=None, metavar="FILE",
                      help=f"the figure (default {DEFAULT_OUT}.png in the current folder); FILE.pdf / FILE.svg "
                           "choose the format, a FILE without one of those suffixes gets --format's")
    plot.add_argument("--format", dest="formats", type=_formats, default=None, metavar="FMT[,FMT]",
                      help="png (200 dpi, the default), pdf, svg, or several: png,pdf")
    plot.add_argument("--force", action="store_true",
                      help="replace existing files at --out that sameloss did not write (a link still never)")
    _add_figure_width(plot)
    plot.set_defaults(run=_plot)
    return plot


def _plot(args) -> None:
    from .reports.curves import plot_runs

    plot_runs(args.runs, args.out, args.formats, force=args.force, width=args.figure_width)
