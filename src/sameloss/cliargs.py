"""argparse pieces every ``sameloss`` command shares (``cli.py``, ``cli_text.py`` and
``experiments/cli.py``): the parser (a usage error in one line), the help formatter, the
examples a command's help ends with, and deprecated spellings.

One grammar for the whole CLI (issue 50): every flag has a help line, every command's help
ends with one or two examples, one flag name means one thing across commands, and an old
spelling keeps working for a while with a one-line note naming the new one.
"""

from __future__ import annotations

import argparse


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
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


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
