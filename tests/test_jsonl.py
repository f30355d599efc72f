"""The one JSON-lines reader (``sameloss.jsonl``), as the metrics log and the corpus
documents use it."""

from __future__ import annotations

import pytest

from sameloss.errors import UserError
from sameloss.jsonl import read_jsonl


def has_step(record):
    return isinstance(record.get("step"), int)


def test_records_blank_lines_and_a_cut_last_write():
    text = '{"step": 1}\n\n{"step": 2, "x": 3}\n{"step": 3, "x'
    assert [r for _, r in read_jsonl("m.jsonl", text, has_step, "a record", unfinished_last=True)] == \
        [{"step": 1}, {"step": 2, "x": 3}]
    with pytest.raises(UserError, match=r"^m.jsonl:4: not a record: Unterminated string"):
        read_jsonl("m.jsonl", text, has_step, "a record")  # documents: a cut line is an error


def test_a_bad_line_before_the_last_names_the_file_the_line_and_what_a_record_is():
    with pytest.raises(UserError, match=r"^m.jsonl:2: not a record with a step; repair it$"):
        read_jsonl("m.jsonl", '{"step": 1}\n["step", 2]\n{"step": 3}\n', has_step, "a record with a step",
                   unfinished_last=True, hint="; repair it")
    with pytest.raises(UserError, match=r"^m.jsonl:1: not a record with a step$"):
        read_jsonl("m.jsonl", '{"step": "1"}\n', has_step, "a record with a step", unfinished_last=True)
