"""Errors a user can cause. The CLI turns them into one line on stderr and exit code 2."""

from __future__ import annotations


class UserError(Exception):
    """Bad input from the user (config, file, option): reported without a traceback."""


class InputFileError(UserError):
    """A problem located in an input file, reported as ``file:line: message``."""

    def __init__(self, message: str, path: str | None = None, line: int | None = None):
        self.path, self.line, self.message = path, line, message
        where = ""
        if path is not None:
            where = f"{path}:{line}: " if line is not None else f"{path}: "
        super().__init__(where + message)


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (its type's name when it has none): what a
    one-line error quotes of a library's."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
