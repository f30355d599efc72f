"""The one reader of JSON-lines files: a run's ``metrics.jsonl`` (``training.runio``) and
a corpus's ``.jsonl`` documents (``languages.text``).

``read_jsonl(path, text, accepts, describe)`` returns ``(line, record)`` for every
non-blank line of ``text`` (the file's contents, read by the caller with its own rules for
bytes): each must be a JSON object that ``accepts`` takes, else a ``UserError`` names the
file and the line and says what a record must be (``describe``, and the parser's reason
when the line is not JSON at all). ``unfinished_last``: a last line without its newline
that is not a record is a write cut short (a kill, a full disk) and is left out rather
than refused — the log of a run killed mid-write.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from .errors import UserError


def read_jsonl(path: str | Path, text: str, accepts: Callable[[dict], bool], describe: str,
               unfinished_last: bool = False, hint: str = "") -> list[tuple[str, dict]]:
    """The records of a JSON-lines text (module docstring); ``hint`` ends each error."""
    lines = text.splitlines()
    out = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        reason = ""
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            record, reason = None, f": {exc.msg}"
        if isinstance(record, dict) and accepts(record):
            out.append((line, record))
            continue
        if unfinished_last and number == len(lines) and not text.endswith("\n"):
            break  # the unfinished last write
        raise UserError(f"{path}:{number}: not {describe}{reason}{hint}")
    return out
