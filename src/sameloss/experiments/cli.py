"""``sameloss reproduce`` (the command-line entry of the recipes) and ``sameloss plot``
(training curves of runs).

Hooked into ``sameloss.cli.build_parser`` by ``add_reproduce_parser(commands)`` and
``add_plot_parser(commands)``; the handlers raise ``UserError`` for mistakes a user can
make (the CLI turns them into one line and exit code 2).
"""

from __future__ import annotations

import argparse
import sys

from ..threads import add_threads_argument


def _epilog() -> str:
    from . import experiments

    lines = ["experiments:"]
    for name, what in experiments().items():
        lines.append(f"  {name:<11} {what}")
    lines += ["", "scales: smoke (the pipeline in seconds), tiny (a 2-core CPU in minutes), small and paper (GPU; "
              "runtimes in each recipe's docstring: src/sameloss/experiments/recipes/<experiment>.py)"]
    return "\n".join(lines)


class _DeprecatedScale(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None):
        print("note: --preset is now called --scale", file=sys.stderr)
        setattr(namespace, self.dest, values)


def add_reproduce_parser(commands) -> argparse.ArgumentParser:
    """Add ``reproduce`` to the ``sameloss`` sub-command parsers ``commands``."""
    from . import DEFAULT_EXPERIMENT, DEFAULT_SCALE, SCALE_NAMES, experiments

    names = list(experiments())

    reproduce = commands.add_parser(
        "reproduce", help="reproduce a result of the paper end to end: train, measure, report",
        description="Train the runs of one experiment (or reuse / resume them), measure every checkpoint "
                    "(exact loss, trace of Hessian, probe accuracy; cached), and write "
                    "OUT/EXPERIMENT-SCALE/: report.md (tables with error bars, figures, and whether each claim "
                    "of the paper holds in this run), results.csv, figures and every run's folder. Without an "
                    "experiment: figure1 --scale tiny (about 15 minutes on a 2-core CPU).",
        epilog=_epilog(), formatter_class=argparse.RawDescriptionHelpFormatter)
    reproduce.add_argument("experiment", nargs="?", default=DEFAULT_EXPERIMENT, choices=names,
                           metavar="EXPERIMENT", help=f"one of {', '.join(names)} (default {DEFAULT_EXPERIMENT})")
    reproduce.add_argument("--scale", default=DEFAULT_SCALE, choices=list(SCALE_NAMES),
                           help=f"how big: {', '.join(SCALE_NAMES)} (default {DEFAULT_SCALE})")
    # the old name of --scale, kept so that earlier commands still work
    reproduce.add_argument("--preset", dest="scale", choices=list(SCALE_NAMES), action=_DeprecatedScale,
                           help=argparse.SUPPRESS)
    reproduce.add_argument("--out", default="runs", metavar="DIR", help="parent folder (default runs)")
    reproduce.add_argument("--seed", type=int, default=0,
                           help="seed of every run and measure (default 0; other seeds get their own folder)")
    reproduce.add_argument("--fresh", action="store_true",
                           help="delete the experiment's folder first and redo everything (only when all it "
                                "holds is what sameloss wrote: a user's file there is named and nothing is deleted)")
    reproduce.add_argument("--device", choices=["auto", "cpu", "cuda"], default=None,
                           help="where to train and measure (default: the preset's; auto = CUDA when present)")
    reproduce.add_argument("--no-progress", action="store_true", help="no progress bars")
    reproduce.add_argument("--format", dest="formats", type=_formats, default=("png",), metavar="FMT[,FMT]",
                           help="figure formats: png (200 dpi, the default), pdf, svg (vector, for papers), or "
                                "several, e.g. png,pdf; the report embeds the first. Each figure also gets "
                                "<figure>.data.csv with exactly its plotted numbers")
    add_threads_argument(reproduce)
    reproduce.set_defaults(run=_reproduce)
    return reproduce


def _formats(text: str) -> tuple[str, ...]:
    """An argparse type: ``png`` / ``png,pdf`` (a bad format is a one-line usage error)."""
    from .plots import parse_formats

    try:
        return parse_formats(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _reproduce(args) -> None:
    from . import reproduce, reproduce_command

    command = reproduce_command(args.experiment, args.scale, args.seed)
    path = reproduce(args.experiment, args.scale, out=args.out, seed=args.seed, fresh=args.fresh,
                     progress=not args.no_progress, device=args.device, command=command, formats=args.formats)
    print(path)


def add_plot_parser(commands) -> argparse.ArgumentParser:
    """Add ``plot`` (training curves of runs) to the ``sameloss`` sub-command parsers."""
    from .curves import DEFAULT_OUT

    plot = commands.add_parser(
        "plot", help="training curves of runs: train loss, exact KL (or held-out loss), learning rate",
        description="Draw the training curves of one or more pre-training runs from their metrics.jsonl: train "
                    "loss (with the optimum, the entropy of the true conditionals, dashed), the exact KL to the "
                    "true conditionals on a log axis ± std over the held-out subsets (a corpus run: the held-out "
                    "cross-entropy) and the learning rate, against step; one line per run, labelled by its folder's "
                    "name. Writes the figure and FILE.data.csv (the plotted numbers) beside it; an existing file is "
                    "replaced only when sameloss wrote it.")
    plot.add_argument("runs", nargs="+", metavar="RUN", help="run folders (runs/NAME, as sameloss pretrain writes them)")
    plot.add_argument("--out", default=None, metavar="FILE",
                      help=f"the figure (default {DEFAULT_OUT}.png in the current folder); FILE.pdf / FILE.svg "
                           "choose the format, a FILE without one of those suffixes gets --format's")
    plot.add_argument("--format", dest="formats", type=_formats, default=None, metavar="FMT[,FMT]",
                      help="png (200 dpi, the default), pdf, svg, or several: png,pdf")
    plot.set_defaults(run=_plot)
    return plot


def _plot(args) -> None:
    from .curves import plot_runs

    plot_runs(args.runs, args.out, args.formats)
