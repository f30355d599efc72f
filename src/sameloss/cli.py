"""The ``sameloss`` command.

Every error a user can cause ends in one line on stderr and exit code 2; anything else
is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import signal
import sys

from . import __version__
from .cliargs import Parser as _Parser
from .cliargs import deprecated, examples
from .config import int_at_least as _int_at_least
from .config import positive_float
from .errors import UserError
from .threads import add_threads_argument, check_env_before_torch, configure_threads


_positive_int = _int_at_least(1)
_non_negative_int = _int_at_least(0)


def _language_params(text: str) -> str:
    """An argparse type: ``language.params`` text whose syntax reads (``registry.parse_params``;
    the keys are the language's to check), kept as the text."""
    from .registry import parse_params

    try:
        parse_params(text, "--params")
    except ValueError as exc:  # argparse names the option itself
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--params: ").removeprefix("--params ")) from None
    return text


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="sameloss", description=(
        "Same pre-training loss, different downstream: languages with exact masked-token "
        "conditionals, MLM pre-training and flatness measures (Liu, Xie, Li, Ma, ICML 2023; "
        "arXiv:2210.14199). Each command has its own --help, ending with examples."),
        epilog=examples("sameloss reproduce            # the main job: the iso-loss study at its quick scale",
                        "sameloss plan                 # what the main job costs, before it runs"))
    parser.add_argument("--version", action="version", version=f"sameloss {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    commands.required = True
    from .cli_text import add_causal_parsers, add_text_parsers

    for add in (add_language_parser, add_pretrain_parser, add_embed_parser, add_measure_parser, add_export_parser,
                add_text_parsers, add_causal_parsers, *_experiment_parsers()):
        add(commands)
    return parser


def _experiment_parsers() -> tuple:
    """``reproduce``, ``plan``, ``replicate`` and ``plot`` (``experiments/cli.py``)."""
    from .experiments.cli import add_plan_parser, add_plot_parser, add_replicate_parser, add_reproduce_parser

    return add_reproduce_parser, add_plan_parser, add_replicate_parser, add_plot_parser


def add_language_parser(commands) -> None:
    """``sameloss language describe`` and ``search``."""
    language = commands.add_parser("language", help="synthetic languages with exact conditionals",
                                   epilog=examples("sameloss language describe hmm",
                                                   "sameloss language search hmm n_states=4..8 --draws 40"))
    language_commands = language.add_subparsers(dest="language_command", metavar="ACTION", parser_class=_Parser)
    language_commands.required = True
    describe = language_commands.add_parser(
        "describe", help="vocabulary, sentence lengths, optimal MLM loss, tasks and examples of a language",
        description="Describe a language: vocabulary, sentence lengths, the entropy of the true masked-token "
                    "conditionals (the optimal MLM loss, with its standard error), each downstream task's "
                    "class count and majority-class rate, and a few sample sentences.",
        epilog=examples("sameloss language describe pcfg                 # the size the isoloss study uses",
                        "sameloss language describe pcfg --size paper --seed 3 --save-grammar g.txt"))
    from .found import registered
    from .registry import languages  # read from the language files (and plugins): no torch import
    describe.add_argument("name", choices=[*(n for n, e in languages().items() if e.describe), *registered()],
                          help="which language: a family, or a registered language (FAMILY:LABEL, found by "
                               "language search: its gate per seed and the command that found it, then the language)")
    describe.add_argument("--grammar", metavar="FILE",
                          help="PCFG grammar file (the released rule_deep_mlm.txt format or ours); "
                               "overrides --size")
    describe.add_argument("--size", "--preset", dest="size", default=None,
                          help="named size (default headroom, the size the isoloss study uses; dyck: tiny; "
                               "--preset: its old name): "
                               + "; ".join(f"{n}: {', '.join(e.sizes)}" for n, e in languages().items()
                                           if e.describe and e.sizes))
    describe.add_argument("--seed", type=_non_negative_int, default=None,
                          help="draw another random language of that size's shape, and seed the samples "
                               "(default: the size's own language, samples seeded 0)")
    describe.add_argument("--params", metavar="KEY=VALUE[,...]", type=_language_params, default=None,
                          help="hmm, pcfg: constructor settings over the size's own, as language.params "
                               "(e.g. hmm: n_states=6,emission_concentration=0.5)")
    describe.add_argument("--n-sentences", type=_positive_int, default=4096,
                          help="sentences sampled for the statistics (default 4096)")
    describe.add_argument("--json", action="store_true", help="print the summary as JSON")
    describe.add_argument("--save-grammar", metavar="FILE",
                          help="pcfg: also write the grammar to FILE (sameloss's format), which --grammar FILE reads "
                               "back; an existing FILE is replaced only when sameloss wrote it (its sha256 listed in "
                               ".sameloss-outputs beside it), a symbolic link never")
    describe.add_argument("--force", action="store_true",
                          help="replace an existing --save-grammar FILE that sameloss did not write (a link still "
                               "never)")
    add_threads_argument(describe)
    describe.set_defaults(run=_language_describe)
    add_search_parser(language_commands)


def add_search_parser(language_commands) -> None:
    """``sameloss language search`` (``experiments/search.py``)."""
    from .registry import languages

    families = [n for n, e in languages().items() if "params" in e.settings and "seed" in e.settings]
    search = language_commands.add_parser(
        "search", help="find languages with headroom: screen draws of a family's settings, train the best as the "
                       "isoloss study does, apply its headroom gate",
        description="Draw --draws languages of FAMILY from the ranges (KEY=LO..HI; KEY=VALUE fixes a setting; "
                    "seed=LO..HI draws the language itself, else each draw gets a seed in 0..999), screen each "
                    "without training (majority, random-init encoder, look-up table, oracle at the isoloss "
                    "study's primary probe), train the first --train-top whose gap oracle - max(look-up, "
                    "random-init) is at least --min-gap as the study trains seed 0 (its base and adamw fork) and apply its headroom "
                    "gate to the base (>= 5 points above the look-up table and the random-init encoder, >= 5 "
                    "below the oracle); --gate-seeds N gates the passing draws on the bases of seeds 0..N-1. "
                    "Prints each stage's table and the --language specs that pass, or says that none do. "
                    "Everything goes to --out (a search folder: reused and resumed by a rerun).",
        epilog=examples("sameloss language search hmm n_states=4..8 n_words=6..12 concentration=0.1..0.5 --draws 40",
                        "sameloss language search pcfg --scale smoke --draws 4 --out runs/search-smoke"))
    search.add_argument("family", choices=families, help="the language family: " + ", ".join(families))
    search.add_argument("overrides", nargs="*", metavar="KEY=LO..HI",
                        help="a range of a constructor setting (language.params; integers for integer settings) "
                             "or KEY=VALUE to fix it; seed= draws the language itself")
    search.add_argument("--draws", type=_positive_int, default=20, help="languages drawn (default 20)")
    search.add_argument("--seed", type=_non_negative_int, default=0, help="seed of the draws (default 0)")
    search.add_argument("--task", default=None,
                        help="the task probed, one with a fixed span and a posterior (default: the isoloss study's, "
                             "task-5 for hmm, span-1 for pcfg; e.g. span-1-sampled)")
    search.add_argument("--size", default="headroom",
                        help="the size whose other settings the draws keep (default headroom)")
    search.add_argument("--scale", default="tiny",
                        help="the isoloss scale whose schedule, probes and gate are applied (default tiny; smoke: a "
                             "pipeline check in seconds)")
    search.add_argument("--screen-only", action="store_true", help="screen only: train nothing")
    search.add_argument("--screen-subsets", type=_positive_int, default=10,
                        help="probe subsets of the screen (default 10; the trained stage uses the study's)")
    search.add_argument("--screen-test", type=_positive_int, default=2000,
                        help="test sentences of the screen (default 2000; the trained stage uses the study's)")
    search.add_argument("--min-gap", type=float, default=15.0,
                        help="a draw is promising when oracle - max(look-up, random-init) >= this many points "
                             "(default 15)")
    search.add_argument("--train-top", type=_non_negative_int, default=3,
                        help="train the first this many promising draws, in drawing order (default 3)")
    search.add_argument("--gate-seeds", type=_non_negative_int, default=0, metavar="N",
                        help="gate each draw that passes on seed 0 on the bases of seeds 0..N-1 too (e.g. 16)")
    search.add_argument("--gate-pass", type=_fraction, default=15 / 16, metavar="F",
                        help="with --gate-seeds: the share of seeds a draw must pass (default 15/16 = 0.9375)")
    search.add_argument("--out", default="runs/language-search", metavar="DIR",
                        help="the search's folder (default runs/language-search): a new one, or one an earlier "
                             "search made at the same --scale (its finished candidates are reused)")
    search.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                        help="where to train and measure (default auto: CUDA when present)")
    search.add_argument("--no-progress", action="store_true", help="no progress bars")
    search.add_argument("--register", metavar="FAMILY:LABEL", default=None,
                        help="with --gate-seeds: register the first draw that passes, in drawing order, under this "
                             "name (e.g. hmm:search-1: a file in src/sameloss/languages/registered/ with its gate per "
                             "seed and this command), so that --language NAME and language describe NAME know it")
    add_threads_argument(search)
    search.set_defaults(run=_language_search)


def _fraction(text: str) -> float:
    """An argparse type: a number in (0, 1], or a fraction a/b."""
    num, slash, den = text.partition("/")
    try:
        value = float(num) / (float(den) if slash else 1.0)
    except (ValueError, ZeroDivisionError):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number or a fraction a/b") from None
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"{text!r} must lie in (0, 1]")
    return value


def _language_search(args) -> None:
    from .experiments.search import Draws, SearchDesign, SearchOutput, run_search

    design = SearchDesign(scale=args.scale, screen_subsets=args.screen_subsets, screen_test=args.screen_test,
                          min_gap=args.min_gap, train_top=args.train_top, gate_seeds=args.gate_seeds,
                          gate_pass=args.gate_pass, screen_only=args.screen_only)
    draws = Draws(args.family, tuple(args.overrides), task=args.task, size=args.size, n=args.draws, seed=args.seed)
    output = SearchOutput(out=args.out, progress=not args.no_progress, device=args.device,
                          log=lambda line: print(line, flush=True), register=args.register,
                          command=" ".join(["sameloss", *map(shlex.quote, args.argv)]))
    result = run_search(draws, design, output)
    print()
    print(result["text"])


def add_pretrain_parser(commands) -> None:
    """``sameloss pretrain``."""
    pretrain = commands.add_parser(
        "pretrain", help="pre-train an MLM on a language, with exact loss evaluation and checkpoints",
        description="Pre-train a masked language model on fresh sentences of a language every step. "
                    "Writes runs/<name>/: config.toml (resolved), metrics.jsonl (train loss, tokens/s, and "
                    "the exact held-out loss = entropy + KL), checkpoints/step_*/ (safetensors + optimiser "
                    "and RNG state) and summary.json. Settings come from --config and KEY=VALUE overrides, "
                    "e.g. steps=3000 optim.lr=3e-4 model.size=t3-128 language.name=hmm; a flatness penalty: "
                    "flatness.weight=1e-4 [flatness.measure=fisher|hutchinson flatness.sentences=32 "
                    "flatness.labels=2 flatness.probes=1] (λ × the trace of the Hessian on a slice of each batch; "
                    "λ < 0 sharpens); --print-config lists every key with its value.",
        epilog=examples("sameloss pretrain name=hmm-micro language.name=hmm language.size=micro steps=2000",
                        "sameloss pretrain name=hmm-micro language.name=hmm language.size=micro --print-config"))
    pretrain.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides (TOML values)")
    pretrain.add_argument("--config", metavar="FILE", help="TOML config file")
    pretrain.add_argument("--out", default="runs", metavar="DIR", help="parent folder of run folders (default runs)")
    pretrain.add_argument("--resume", action="store_true", help="continue the run from its newest checkpoint")
    pretrain.add_argument("--fresh", action="store_true",
                          help="delete an existing run of the same name first (only a folder sameloss made "
                               "as a run: it holds the .sameloss-run marker, and nothing of a user's: a file sameloss "
                               "did not write there is named and nothing is deleted)")
    pretrain.add_argument("--no-progress", action="store_true", help="no progress bar")
    from .training.tracking import add_tracker_argument
    add_tracker_argument(pretrain)
    pretrain.add_argument("--print-config", action="store_true",
                          help="print the resolved config (every key, with the overrides applied) and exit")
    add_threads_argument(pretrain)
    pretrain.set_defaults(run=_pretrain)


def add_embed_parser(commands) -> None:
    """``sameloss embed``."""
    embed = commands.add_parser(
        "embed", help="embed a small transformer checkpoint function-preservingly into a larger shape",
        description="Write a checkpoint of a larger transformer that computes exactly the same function as "
                    "the small one (App. B.4): width x K by replicating weights, N extra blocks that act as "
                    "the identity. Use it to compare the trace of Hessian of different sizes in one "
                    "architecture.",
        epilog=examples("sameloss embed runs/hmm-micro/checkpoints/step_2000 --out runs/hmm-micro-x2 "
                        "--width-factor 2 --extra-layers 1"))
    embed.add_argument("checkpoint", metavar="SMALL_CHECKPOINT", help="checkpoint directory (runs/NAME/checkpoints/step_N)")
    embed.add_argument("--out", required=True, metavar="DIR",
                       help="new folder for the embedded checkpoint (an existing one is refused; never a run)")
    embed.add_argument("--force", action="store_true",
                       help="replace an existing --out folder written by an earlier sameloss embed (one that "
                            "holds nothing of a user's)")
    target = embed.add_mutually_exclusive_group()
    target.add_argument("--into", metavar="SIZE", help="target size name (e.g. t4-640); sets width and depth")
    target.add_argument("--width-factor", type=_positive_int, metavar="K", help="widen by K (heads x K)")
    embed.add_argument("--extra-layers", type=_non_negative_int, default=0, metavar="N",
                       help="blocks added after the last one (default 0)")
    add_threads_argument(embed)
    embed.set_defaults(run=_embed)


def _add_measure_inputs(measure) -> None:
    """What ``sameloss measure`` measures: a run, a checkpoint, or a Hugging Face folder on a language."""
    measure.add_argument("path", metavar="RUN_OR_CHECKPOINT_OR_HF_FOLDER",
                         help="a run folder (every checkpoint), one checkpoint folder, or a Hugging Face masked-LM "
                              "folder")
    measure.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                         help="Hugging Face folder only: the language to measure on, e.g. language.name=hmm "
                              "language.size=tiny (also masking, mask_rate, eval.*)")
    measure.add_argument("--language-config", metavar="FILE",
                         help="Hugging Face folder only: a pretrain config TOML whose [language] (and masking, "
                              "eval) say what to measure on (default: the folder's sameloss.toml, as export "
                              "writes it)")


def _add_measure_choices(measure) -> None:
    """Which measures ``sameloss measure`` takes (each flag a column or a group of columns)."""
    measure.add_argument("--loss", action="store_true", help="exact held-out loss = entropy + KL (and log-KL)")
    measure.add_argument("--trace", action="append", default=[], choices=["fisher", "hutchinson", "hutchpp"],
                         help="trace of Hessian: 'fisher' = the paper's estimator (labels sampled from the "
                              "model), 'hutchinson' = probes on the loss with the true tokens, 'hutchpp' = "
                              "Hutch++ on the same loss (a smaller error for the same --probes products where the "
                              "spectrum decays; keeps 2/3 of --probes vectors in memory); repeatable")
    measure.add_argument("--trace-by", choices=["block"],
                         help="also each trace per block of parameters: embedding, layer0, layer1, ..., head "
                              "(columns trace_<estimator>_<block>, summing to the total)")
    measure.add_argument("--top-eig", action="store_true",
                         help="largest Hessian eigenvalue (thick-restart Lanczos, --lanczos-basis vectors)")
    measure.add_argument("--micro-batch", type=_positive_int, metavar="N",
                         help="hutchinson / hutchpp / --top-eig: hold the Hessian's graph for N sentences at a time "
                              "(less memory, one more forward and backward per N sentences and product chunk; "
                              "default: the whole batch if the measure's peak-memory estimate, x1.5, fits the memory "
                              "limit ($SAMELOSS_MEMORY_LIMIT, else 80%% of RAM or of the GPU), else the largest power "
                              "of two that does)")
    measure.add_argument("--lanczos-basis", type=_int_at_least(2), default=20, metavar="K",
                         help="vectors the Lanczos basis keeps (memory: K+1 model-sized vectors; default 20)")
    measure.add_argument("--sharpness", action="store_true", help="SAM sharpness in an L2 ball of radius --rho")
    measure.add_argument("--probe", action="append", default=[], metavar="TASK",
                         help="linear probe on TASK (a corpus model: glue:sst2=DIR, glue:qnli=DIR or glue:rte=DIR, "
                              "GLUE-format train.tsv and dev.tsv)")
    measure.add_argument("--finetune", action="append", default=[], metavar="TASK",
                         help="fine-tune on TASK (a corpus model: glue:NAME=DIR, read from its CLS token)")
    measure.add_argument("--lookup-table", action="append", default=[], metavar="TASK",
                         help="look-up-table baseline (probe on the true conditionals) on TASK")


def _add_measure_settings(measure) -> None:
    """The settings of ``sameloss measure``'s measures (their sizes, seeds and methods)."""
    measure.add_argument("--params", metavar="REGEX", help="only parameters whose name matches (default: all)")
    measure.add_argument("--contexts", type=_positive_int, default=1000,
                         help="contexts for the Fisher trace (default 1000; paper 10000)")
    measure.add_argument("--labels", type=_positive_int, default=50, help="labels per context (paper 50)")
    measure.add_argument("--probes", type=_positive_int, default=100,
                         help="Hessian-vector products of hutchinson / hutchpp (default 100)")
    measure.add_argument("--rho", type=positive_float, default=0.05, help="SAM radius (default 0.05)")
    measure.add_argument("--task-size", type=_positive_int, default=2000,
                         help="training examples per task (validation 1/4, test 1/2 of it; paper 0.1M in all). "
                              "GLUE tasks: a seeded sample of N train.tsv rows and N/4 for validation, each class "
                              "in proportion (all rows, 10%% for validation, when train.tsv has no more); dev.tsv "
                              "is the test split, whole")
    measure.add_argument("--probe-seeds", type=_positive_int, default=5, metavar="N",
                         help="probe / fine-tune repeats, with seeds 0..N-1 (default 5)")
    measure.add_argument("--seeds", dest="probe_seeds", type=_positive_int, action=deprecated("--probe-seeds"),
                         help=argparse.SUPPRESS)  # its old name (reproduce's --seeds is a list of study seeds)
    measure.add_argument("--probe-method", choices=["lbfgs", "adamw"], default="lbfgs",
                         help="lbfgs: exact convex solve (default); adamw: the paper's (lr 1e-3, --probe-epochs)")
    measure.add_argument("--probe-epochs", type=_positive_int, default=50, help="AdamW probe epochs (paper 100)")
    measure.add_argument("--finetune-epochs", type=_positive_int, default=10, help="fine-tuning epochs (paper 10)")


def add_measure_parser(commands) -> None:
    """``sameloss measure``."""
    measure = commands.add_parser(
        "measure", help="loss, flatness and downstream accuracy of a checkpoint or of every checkpoint of a run",
        description="Measure one checkpoint (runs/NAME/checkpoints/step_N), every checkpoint of a run "
                    "(runs/NAME) or a Hugging Face masked-LM folder on a sameloss language (KEY=VALUE "
                    "language.* settings or --language-config): one row per checkpoint, printed as a table (or --json) and written to --out "
                    "(.csv or .json). Defaults are sized for a CPU; the paper's sizes are given in each "
                    "option's help.",
        epilog=examples("sameloss measure runs/hmm-micro --loss --trace fisher --probe task-5 --out m.csv",
                        "sameloss measure HF_FOLDER language.name=hmm language.size=micro --loss --probe task-5"))
    _add_measure_inputs(measure)
    _add_measure_choices(measure)
    _add_measure_settings(measure)
    measure.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                         help="where to measure (default auto: CUDA when present)")
    measure.add_argument("--seed", type=int, default=0,
                         help="seed of the measures' random draws: trace probes, task data (default 0)")
    measure.add_argument("--out", metavar="FILE",
                         help="write the rows to FILE (.csv, else JSON); checked before measuring. An existing "
                              "FILE is replaced only when sameloss wrote it (its sha256 is listed in "
                              ".sameloss-outputs beside it); a symbolic link never")
    measure.add_argument("--force", action="store_true",
                         help="replace an existing --out FILE that sameloss did not write (a link still never)")
    measure.add_argument("--json", action="store_true", help="print the rows as JSON")
    measure.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_threads_argument(measure)
    measure.set_defaults(run=_measure)


def add_export_parser(commands) -> None:
    """``sameloss export``."""
    export = commands.add_parser(
        "export", help="write a checkpoint as a Hugging Face folder (BertForMaskedLM + tokenizer + model card)",
        description="Write a post-LN transformer checkpoint (or a run's newest one) as a folder that "
                    "transformers' AutoModelForMaskedLM and AutoTokenizer load without sameloss: a "
                    "BertForMaskedLM, a word-level tokenizer with the language's words and specials, "
                    "sameloss.toml (the recipe) and a model card README.md (language, entropy, exact KL, "
                    "trace of Hessian if measured). Pre-LN transformers and LSTMs are refused.",
        epilog=examples("sameloss export runs/hmm-micro --out hf/hmm-micro"))
    export.add_argument("checkpoint", metavar="CHECKPOINT", help="checkpoint directory or run folder")
    export.add_argument("--out", required=True, metavar="DIR", help="new folder to write (must not exist)")
    export.add_argument("--measures", metavar="FILE",
                        help="a `sameloss measure --out` file to take the trace from (default: one found in "
                             "the run folder)")
    add_threads_argument(export)
    export.set_defaults(run=_export)


def _measure(args) -> None:
    from .measures.run import MeasureSpec, check_output, measure_path, write_rows
    from .training.runio import resolve_device

    spec = MeasureSpec(
        loss=args.loss, traces=tuple(args.trace), trace_by=args.trace_by, top_eig=args.top_eig,
        sharpness=args.sharpness, lanczos_basis=args.lanczos_basis, micro_batch=args.micro_batch,
        probe=tuple(args.probe), finetune=tuple(args.finetune), lookup=tuple(args.lookup_table),
        n_contexts=args.contexts, n_labels=args.labels, n_probes=args.probes, params=args.params, rho=args.rho,
        task_train=args.task_size, task_validation=max(args.task_size // 4, 1),
        task_test=max(args.task_size // 2, 1), probe_method=args.probe_method, probe_epochs=args.probe_epochs,
        finetune_epochs=args.finetune_epochs, seeds=tuple(range(args.probe_seeds)), seed=args.seed,
        device=str(resolve_device(args.device)))
    if args.out:
        check_output(args.out, args.force)
    skipped: list[str] = []
    rows = measure_path(args.path, spec, progress=not args.no_progress, skipped=skipped,
                        language_config=args.language_config, overrides=tuple(args.overrides))
    # the rows are shown before anything can go wrong writing them
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        from .measures.rows import format_rows

        print(format_rows(rows))
    sys.stdout.flush()
    if args.out:
        write_rows(rows, args.out, args.force)
    if skipped:  # the good checkpoints' rows are out; the bad ones make the exit code 2
        raise UserError("\n".join(skipped))


def _embed(args) -> None:
    from .training.embed_io import embed_checkpoint

    path = embed_checkpoint(args.checkpoint, args.out, into=args.into, width_factor=args.width_factor,
                            extra_layers=args.extra_layers, force=args.force)
    print(path)


def _export(args) -> None:
    from .hf.export import export_checkpoint

    print(export_checkpoint(args.checkpoint, args.out, measures=args.measures))


def _pretrain(args) -> None:
    import contextlib
    from pathlib import Path

    from . import config as configlib
    from . import files
    from .training import PretrainConfig, pretrain, runfolder
    from .training.distributed import setup

    cfg = configlib.load(PretrainConfig, args.config, args.overrides)
    paths = {key: str(Path(getattr(cfg.language, key)).expanduser().resolve())
             for key in ("data", "generator", "pool") if getattr(cfg.language, key) is not None}
    if paths:  # the run must find its corpus / generator / pool from any folder later
        import dataclasses
        cfg = dataclasses.replace(cfg, language=dataclasses.replace(cfg.language, **paths))
    if args.print_config:
        print(configlib.to_toml(cfg), end="")
        return
    if args.resume and args.fresh:
        raise UserError("--resume and --fresh contradict each other")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is not a folder")
    run_dir = out / cfg.name  # cfg.name is one plain path component (PretrainConfig checks it)
    args.interrupt_hint = lambda: _resume_hint(args, run_dir)
    rank, _ = setup()
    # the run's lock from the decision (runfolder.plan: what to do with the folder) to the
    # end of training, so a second process cannot decide on a folder being written
    with files.folder_lock(run_dir, "run") if rank == 0 else contextlib.nullcontext():
        plan = runfolder.plan(run_dir, cfg, "resume" if args.resume else "fresh" if args.fresh else "new")
        if plan.action == "reuse":
            if rank == 0:
                print(plan.message)
            return
        result = pretrain(cfg, run_dir, progress=not args.no_progress, plan=plan,
                          tracker=args.tracker)
    if rank == 0 and result and result.get("kl") is None:
        print(f"{run_dir}: held-out cross-entropy {result['loss']:.4f} ± {result['loss_std']:.4f}, training subset "
              f"{result['train_loss']:.4f} (gap {result['gap']:+.4f}; KL {result['kl_note']})")
    elif rank == 0 and result:
        print(f"{run_dir}: exact held-out loss {result['loss']:.4f} (entropy {result['entropy']:.4f} + "
              f"KL {result['kl']:.5f} ± {result['kl_std']:.5f} over {result['n_tokens']} masked tokens)")


def _resume_hint(args, run_dir) -> str:
    import shlex

    from .training.checkpoint import complete_checkpoints

    if not complete_checkpoints(run_dir):
        return "no checkpoint was written; nothing to resume"
    words = ["sameloss", "pretrain"]
    if args.config:
        words += ["--config", args.config]
    words += list(args.overrides)
    if args.out != "runs":
        words += ["--out", args.out]
    return "resume with --resume: " + " ".join(shlex.quote(w) for w in words + ["--resume"])


def _language_describe(args) -> None:
    from .languages import make_language
    from .languages.describe import format_summary, grammar_notes
    from .resources import check_sentences

    if args.save_grammar is not None:
        if args.name != "pcfg":
            raise UserError("--save-grammar applies to the pcfg language only")
        from .files import check_output

        check_output(args.save_grammar, args.force, "--save-grammar")
        if not os.path.isdir(os.path.dirname(args.save_grammar) or "."):
            raise UserError(f"--save-grammar {args.save_grammar}: no folder {os.path.dirname(args.save_grammar)}")
    from .found import describe_args

    found = describe_args(args)
    if args.size is None:  # the study's size where the language has it (dyck has none)
        from .registry import language

        args.size = "headroom" if "headroom" in language(args.name).sizes else "tiny"
    lang = make_language(args.name, preset=args.size, seed=args.seed, grammar=args.grammar, params=args.params)
    # describe samples the sentences twice and takes their exact conditionals: refused now
    # if that cannot fit, not after minutes of allocating (and before --save-grammar writes)
    check_sentences(args.n_sentences, lang, f"--n-sentences {args.n_sentences}", "lower --n-sentences")
    if args.save_grammar is not None:  # before the (slower) statistics: the file is what was asked for
        from .files import write_output

        write_output(args.save_grammar, lang.grammar.to_text(), args.force, "--save-grammar")
    summary = lang.describe(n_sentences=args.n_sentences, seed=args.seed or 0)
    seed = "" if args.seed is None else f", seed {args.seed}"
    params = "" if args.params is None else f", params {args.params}"
    summary["source"] = args.grammar or f"size {args.size}{seed}{params}"
    grammar = getattr(lang, "grammar", None)
    if grammar is not None:
        summary["nonterminals"] = grammar.n_nonterminals
        summary["notes"] = grammar_notes(grammar)
    if args.json:
        if found is not None:
            from dataclasses import asdict

            summary["registered"] = asdict(found)
        print(json.dumps(summary, indent=2))
    else:
        if found is not None:
            from .found import describe_text

            print(describe_text(found))
        print(format_summary(summary))
    if args.save_grammar is not None and not args.json:
        print(f"wrote the grammar to {args.save_grammar}; read it back with --grammar {args.save_grammar}")


def main(argv: list[str] | None = None) -> int:
    from .libraries import quiet_libraries  # the libraries' warnings are noise to a user

    with quiet_libraries():
        return _main(argv)


def _main(argv: list[str] | None) -> int:
    try:
        parser = build_parser()  # reads the registry: a plugin that fails to import is a user error
    except UserError as exc:
        print(f"sameloss: error: {exc}", file=sys.stderr)
        return 2
    # KEY=VALUE overrides may come after options (``--out runs steps=10``), which plain
    # argparse positionals do not allow: collect the leftovers that look like overrides
    args, extra = parser.parse_known_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # the command as given (a registered language keeps it)
    bad = [a for a in extra if a.startswith("-") or "=" not in a or not hasattr(args, "overrides")]
    if bad:
        parser.error(f"unrecognized arguments: {' '.join(bad)}")
    if extra:
        args.overrides = list(args.overrides) + extra
    received = []
    previous = _handle_sigterm(received)
    try:
        # before anything imports torch (libgomp reads OMP_NUM_THREADS then)
        check_env_before_torch(getattr(args, "threads", None))
        if "threads" in vars(args):  # every compute command has --threads
            configure_threads(args.threads)
        from .progress import data_on_stdout, say

        data_on_stdout(bool(getattr(args, "json", False)))  # notes and progress then stay off the JSON
        for note in getattr(args, "deprecation_notes", None) or []:
            say(note)
        args.run(args)
    except UserError as exc:
        for line in str(exc).splitlines() or [type(exc).__name__]:
            print(f"sameloss: error: {line}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        name = "SIGTERM" if received else "interrupted"
        hint = getattr(args, "interrupt_hint", None)
        hint = hint() if hint else None
        print(f"sameloss: {name}" + (f"; {hint}" if hint else ""), file=sys.stderr)
        return 128 + (received[0] if received else signal.SIGINT)
    except BrokenPipeError:  # output piped into `head` and the like
        sys.stderr.close()
        return 0
    except Exception as exc:
        # the last net for a full disk or a read-only folder that no writer turned into a
        # UserError naming its folder (libraries raise it as their own exception types)
        from .storage import storage_reason
        reason = storage_reason(exc)
        if reason is None:
            raise
        where = f"{exc.filename}: " if isinstance(exc, OSError) and exc.filename else ""
        print(f"sameloss: error: {where}{reason}", file=sys.stderr)
        return 2
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    return 0


def _handle_sigterm(received: list):
    """SIGTERM (``kill``, a batch scheduler) ends a command like Ctrl-C: the same clean
    exit (checkpoints are written atomically; a run resumes from its newest one)."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return None

    def handler(signum, frame):
        received.append(signum)
        raise KeyboardInterrupt

    return signal.signal(signal.SIGTERM, handler)


if __name__ == "__main__":
    sys.exit(main())
