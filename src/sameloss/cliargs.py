"""argparse pieces every ``sameloss`` command shares (``cli.py``, ``cli_text.py`` and
``experiments/cli.py``): the parser (a usage error in one line), the help formatter, the
examples a command's help ends with, and deprecated spellings.

One grammar for the whole CLI (issue 50): every flag has a help line, every command's help
ends with one or two examples, one flag name means one thing across commands, and an old
spelling keeps working for a while with a one-line note naming the new one.
"""

from __future__ import annotations

import argparse
import difflib
import re
import shutil
import textwrap


class HelpFormatter(argparse.HelpFormatter):
    """argparse's formatter, but an indented line (an example, a list item) is kept as it is
    written; prose paragraphs are wrapped to the terminal as usual."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        out: list[str] = []
        paragraph: list[str] = []

        def flush() -> None:
            if paragraph:
                out.append(super(HelpFormatter, self)._fill_text(" ".join(paragraph), width, indent))
                paragraph.clear()

        for line in text.splitlines():
            if line.strip() and not line.startswith(" "):
                paragraph.append(line.strip())
                continue
            flush()
            out.append(indent + line if line.strip() else "")
        flush()
        return "\n".join(out)


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (the house rule for bad input), and the help
    keeps its examples' lines as written (``HelpFormatter``)."""

    def __init__(self, *args, formatter_class=HelpFormatter, **kwargs):
        super().__init__(*args, formatter_class=formatter_class, **kwargs)

    def error(self, message: str):  # noqa: D401 - argparse API
        self.exit(2, f"{self.prog}: error: {message}{_did_you_mean(message)} (see {self.prog} --help)\n")


def _did_you_mean(message: str) -> str:
    """``; did you mean 'reproduce'?`` for argparse's "invalid choice" of a misspelt command or
    value (the closest choice, by ``difflib``), else nothing."""
    found = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
    if not found:
        return ""
    close = difflib.get_close_matches(found.group(1), re.findall(r"'([^']*)'", found.group(2)), n=1, cutoff=0.6)
    return f"; did you mean '{close[0]}'?" if close else ""


def chosen_parser(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.ArgumentParser:
    """The (sub)command parser ``argv`` reaches: ``sameloss language describe ...`` gives
    ``language describe``'s."""
    for word in argv:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if subs and word in subs[0].choices:
            parser = subs[0].choices[word]
    return parser


def refuse_misspelt_options(parser: argparse.ArgumentParser, argv: list[str]) -> None:
    """A usage error (one line, exit 2) for an option ``--x`` that the command ``argv`` reaches
    does not take, neither whole nor as the start of one, when one of its options is close:
    ``unrecognized arguments: --sead; did you mean --seed?``. Checked before parsing, since
    argparse would otherwise take the misspelt option's value for a positional and complain
    about that instead."""
    chosen = chosen_parser(parser, argv)
    options = [o for a in chosen._actions for o in a.option_strings] + ["--help", "--version"]
    for word in argv:
        if word == "--":
            return
        flag = word.split("=")[0]
        if not flag.startswith("--") or any(o.startswith(flag) for o in options):
            continue
        hint = close_options(parser, argv, [flag])
        if hint:
            chosen.error(f"unrecognized arguments: {flag}{hint}")


def close_options(parser: argparse.ArgumentParser, argv: list[str], unknown: list[str]) -> str:
    """``; did you mean --seed?`` for options ``unknown`` that the command ``argv`` reaches
    does not take (the closest of its own option strings, by ``difflib``), else nothing."""
    options = [o for a in chosen_parser(parser, argv)._actions if a.help != argparse.SUPPRESS
               for o in a.option_strings]
    guesses = []
    for word in unknown:
        flag = word.split("=")[0]
        close = difflib.get_close_matches(flag, options, n=1, cutoff=0.6) if flag.startswith("-") else []
        if close:
            guesses.append(f"{flag} → {close[0]}" if len(unknown) > 1 else close[0])
    return f"; did you mean {', '.join(guesses)}?" if guesses else ""


def group_commands(parser: argparse.ArgumentParser, commands, groups: tuple[tuple[str, tuple[str, ...]], ...]) -> None:
    """List ``parser``'s subcommands by group in its help, the groups in order (the main
    commands first), instead of argparse's one list in the order they were added.

    Args:
        parser: the parser whose ``--help`` lists the commands.
        commands: its ``add_subparsers`` object, every command added.
        groups: ``(title, command names)`` pairs naming every command exactly once.
    """
    helps = {a.dest: a.help for a in commands._choices_actions}
    listed = [name for _, names in groups for name in names]
    if sorted(listed) != sorted(helps):
        raise ValueError(f"the groups name {sorted(listed)}, the commands are {sorted(helps)}")
    width = max(len(name) for name in listed)
    columns = max(60, shutil.get_terminal_size().columns - 2)
    lines = ["commands (each with its own --help):"]
    for title, names in groups:
        lines.append(f"  {title}:")
        for name in names:
            lines += textwrap.wrap(helps[name], columns, initial_indent=f"    {name:<{width}}  ",
                                   subsequent_indent=" " * (width + 6))
    parser.description = (parser.description or "") + "\n\n" + "\n".join(lines)
    commands._choices_actions.clear()  # the list above replaces argparse's (the commands still parse)
    commands.help = "one of the commands above, then its options (sameloss COMMAND --help)"


def examples(*commands: str) -> str:
    """The ``examples:`` block a command's help ends with (its epilog, or the end of it).

    Args:
        *commands: one or two command lines, each shown on its own indented line.

    Returns:
        the text, for ``add_parser(..., epilog=...)``.
    """
    return "examples:\n" + "\n".join(f"  {command}" for command in commands)


def deprecated(new: str) -> type[argparse.Action]:
    """An argparse action for an old spelling of an option: stores the value as the new
    option does and says, in one note line, what the option is called now.

    Args:
        new: the option's current spelling, e.g. ``--hardware``.

    Returns:
        the action class, for ``add_argument(old, dest=..., action=deprecated(new), help=argparse.SUPPRESS)``.
    """

    class Deprecated(argparse.Action):
        def __call__(self, parser, namespace, values, option_string=None):
            # the note waits on the namespace (``deprecation_notes``): it is said once the command
            # knows whether stdout carries ``--json`` data, which the note must stay out of
            notes = getattr(namespace, "deprecation_notes", None) or []
            setattr(namespace, "deprecation_notes", [*notes, f"note: {option_string} is now {new}"])
            setattr(namespace, self.dest, values)

    return Deprecated


def command_group(commands, name: str, help: str, example_lines: tuple[str, ...], dest: str):
    """A command whose actions are subcommands (``sameloss corpus prepare``): its parser,
    with ``example_lines`` as its examples, and the subparsers its actions are added to (one
    is required).

    Returns:
        the ``add_subparsers`` object, for ``.add_parser(action, ...)``.
    """
    group = commands.add_parser(name, help=help, epilog=examples(*example_lines))
    actions = group.add_subparsers(dest=dest, metavar="ACTION", parser_class=Parser)
    actions.required = True
    return actions


def add_output_file(parser: argparse.ArgumentParser, option: str, what: str) -> None:
    """``option FILE`` (a file a command writes, saying ``what``) and ``--force``, with the one
    rule every such file follows (``files.check_output``): an existing file is replaced only
    when sameloss wrote it, a symbolic link never, unless ``--force`` (still never a link)."""
    parser.add_argument(option, default=None, metavar="FILE",
                        help=f"{what}. An existing FILE is replaced only when sameloss wrote it (its sha256 "
                             "listed in .sameloss-outputs beside it); a symbolic link never")
    parser.add_argument("--force", action="store_true",
                        help=f"replace an existing {option} FILE that sameloss did not write (a link still never)")
