"""The ``sameloss`` command.

Every error a user can cause ends in one line on stderr and exit code 2; anything else
is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys

from . import __version__
from .cliargs import Parser as _Parser
from .cliargs import add_output_file, deprecated, examples
from .config import int_at_least as _int_at_least
from .config import positive_float
from .errors import UserError
from .cli_language import add_language_parser
from .threads import add_threads_argument, check_env_before_torch, configure_threads


_positive_int = _int_at_least(1)
_non_negative_int = _int_at_least(0)


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
                              "(columns trace_<estimator>_<block>, summing to the total; likewise "
                              "adaptive_trace_<block> and weight_norm_sq_<block>)")
    measure.add_argument("--adaptive-trace", action="store_true",
                         help="the adaptive trace tr(T F T), T = diag(|weights|): the Fisher trace of the "
                              "weight-scaled gradients, a sharpness no function-preserving rescaling changes (with "
                              "the Fisher trace's --contexts, --labels and draws; column adaptive_trace)")
    measure.add_argument("--weight-norms", action="store_true",
                         help="squared L2 norm of the weights (weight_norm_sq) and of the LayerNorms' gains and "
                              "biases (weight_norm_sq_layernorm), over --params")
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
                         help="contexts for the Fisher trace and --adaptive-trace (default 1000; paper 10000)")
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
    add_output_file(measure, "--out", "write the rows to FILE (.csv, else JSON); checked before measuring")
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
        device=str(resolve_device(args.device)),
        extra={name: {} for name, asked in (("adaptive_trace", args.adaptive_trace),
                                            ("weight_norms", args.weight_norms)) if asked})
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
