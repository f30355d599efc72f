"""``sameloss reproduce``: the command-line entry of the recipes.

Hooked into ``sameloss.cli.build_parser`` by ``add_reproduce_parser(commands)``; the
handler ``_reproduce(args)`` raises ``UserError`` for mistakes a user can make (the CLI
turns them into one line and exit code 2).
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
    add_threads_argument(reproduce)
    reproduce.set_defaults(run=_reproduce)
    return reproduce


def _reproduce(args) -> None:
    from . import reproduce, reproduce_command

    command = reproduce_command(args.experiment, args.scale, args.seed)
    path = reproduce(args.experiment, args.scale, out=args.out, seed=args.seed, fresh=args.fresh,
                     progress=not args.no_progress, device=args.device, command=command)
    print(path)
