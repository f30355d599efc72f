"""``sameloss language``: ``describe`` (a language, or a registered one with its gate) and
``search`` (draws screened, trained and gated: ``experiments/search/screen.py``)."""

from __future__ import annotations

import argparse
import json
import os
import shlex

from .cliargs import add_output_file, command_group, examples
from .config import int_at_least as _int_at_least
from .errors import UserError
from .threads import add_threads_argument

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


def add_language_parser(commands) -> None:
    """``sameloss language describe`` and ``search``."""
    language_commands = command_group(commands, "language", "synthetic languages with exact conditionals",
                                      ("sameloss language describe hmm",
                                       "sameloss language search hmm n_states=4..8 --draws 40"), "language_command")
    describe = language_commands.add_parser(
        "describe", help="vocabulary, sentence lengths, optimal MLM loss, tasks and examples of a language",
        description="Describe a language: vocabulary, sentence lengths, the entropy of the true masked-token "
                    "conditionals (the optimal MLM loss, with its standard error), each downstream task's "
                    "class count and majority-class rate, and a few sample sentences.",
        epilog=examples("sameloss language describe pcfg                 # the size the isoloss study uses",
                        "sameloss language describe pcfg --size paper --seed 3 --save-grammar g.txt"))
    from .found import names as registered_names
    from .registry import languages  # read from the language files (and plugins): no torch import
    names = [*(n for n, e in languages().items() if e.describe), *registered_names()]
    describe.add_argument("name", type=_describable, metavar="NAME",
                          help=f"which language: a family ({', '.join(n for n in names if ':' not in n)}), a family "
                               "at a size, FAMILY:SIZE as --language writes it (e.g. hmm:headroom, the same as hmm "
                               "--size headroom), or a registered language "
                               f"({', '.join(n for n in names if ':' in n) or 'none yet'}: FAMILY:LABEL, found by "
                               "language search; its gate per seed and the command that found it, then the language)")
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
    add_output_file(describe, "--save-grammar",
                    "pcfg: also write the grammar to FILE (sameloss's format), which --grammar FILE reads back")
    add_threads_argument(describe)
    describe.set_defaults(run=_language_describe)
    add_search_parser(language_commands)


def add_search_parser(language_commands) -> None:
    """``sameloss language search`` (``experiments/search/screen.py``)."""
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


def _describable(text: str) -> str:
    """An argparse type: a family ``language describe`` describes, a registered language, or
    ``FAMILY:SIZE`` (a family at one of its sizes, as ``--language`` writes it)."""
    from .found import names as registered
    from .registry import languages

    families = {n: e for n, e in languages().items() if e.describe}
    if text in families or text in registered():
        return text
    family, sep, size = text.partition(":")
    if sep and family in families and size in families[family].sizes:
        return text
    if sep and family in families:
        raise argparse.ArgumentTypeError(
            f"{family} has no size {size!r} (its sizes: {', '.join(families[family].sizes) or 'none'}) and no "
            f"registered language is called {text!r} (registered: {', '.join(registered()) or 'none'})")
    known = [*families, *registered()]
    import difflib

    close = difflib.get_close_matches(text, known, n=1, cutoff=0.6)
    raise argparse.ArgumentTypeError(f"unknown language {text!r}; one of {', '.join(known)}, or FAMILY:SIZE"
                                     + (f"; did you mean {close[0]!r}?" if close else ""))


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
    from .experiments.search.screen import Draws, SearchDesign, SearchOutput, run_search

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


def _language_describe(args) -> None:
    from .found import names as registered
    from .languages import make_language
    from .languages.describe import format_summary, grammar_notes
    from .resources import check_sentences

    if ":" in args.name and args.name not in registered():  # FAMILY:SIZE, as --language writes it
        args.name, size = args.name.split(":", 1)
        if args.size not in (None, size):
            raise UserError(f"{args.name}:{size} and --size {args.size} name two sizes: give one")
        args.size = size
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
