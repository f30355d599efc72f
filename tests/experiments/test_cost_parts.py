"""A unit's CPU per part as tidy rows (issue 49, item 1): ``declare.CostPart`` tags each part
(fork point, fork, stage); ``cost.json`` keeps rows of those tags and the seconds, and reads
nothing else (joined ``"point|fork|stage"`` keys, a layout no release wrote, are unreadable)."""

from __future__ import annotations

import json

from sameloss.experiments.engine.declare import CostPart, cost_rows
from sameloss.experiments.engine.walk import COST_FILE, UnitRecord, keep_first_cost

PARTS = {CostPart("", "base", "train+gate"): 12.5, CostPart("late", "noreg", "train"): 3.25,
         CostPart("late", "noreg", "measure"): 1.0}


def test_the_first_call_keeps_its_cost_as_rows_and_later_calls_read_it_back(tmp_path):
    notes = []
    first = keep_first_cost(tmp_path, UnitRecord("u", cpu=dict(PARTS), cpu_seconds=16.75), notes.append)
    saved = json.loads((tmp_path / COST_FILE).read_text())
    assert saved["cpu_seconds"] == 16.75 and {"point": "late", "fork": "noreg", "stage": "train",
                                              "cpu_seconds": 3.25} in saved["rows"]
    later = keep_first_cost(tmp_path, UnitRecord("u", cpu={CostPart("late", "noreg", "train"): 99.0},
                                                 cpu_seconds=99.0), notes.append)
    assert later.cpu == first.cpu == PARTS and later.cpu_seconds == 16.75 and not notes
    assert all(isinstance(k, CostPart) for k in later.cpu)


def test_a_cost_file_of_joined_keys_is_unreadable_and_replaced(tmp_path):
    (tmp_path / COST_FILE).write_text(json.dumps({"parts": {"|base|train+gate": 12.5, "late|noreg|train": 3.25,
                                                            "late|noreg|measure": 1.0}, "cpu_seconds": 16.75}))
    notes = []
    got = keep_first_cost(tmp_path, UnitRecord("u", cpu={CostPart("late", "noreg", "train"): 1.0}, cpu_seconds=1.0),
                          notes.append)
    assert got.cpu == {CostPart("late", "noreg", "train"): 1.0} and got.cpu_seconds == 1.0
    assert len(notes) == 1 and "unreadable" in notes[0]
    assert json.loads((tmp_path / COST_FILE).read_text())["rows"] == cost_rows(got.cpu)


def test_an_unreadable_cost_file_is_replaced_by_this_calls_with_a_note(tmp_path):
    (tmp_path / COST_FILE).write_text(json.dumps({"rows": [{"point": "late"}], "cpu_seconds": 1}))
    notes = []
    got = keep_first_cost(tmp_path, UnitRecord("u", cpu=dict(PARTS), cpu_seconds=16.75), notes.append)
    assert got.cpu == PARTS and len(notes) == 1 and "unreadable" in notes[0]


def test_a_part_is_a_row_of_its_tags():
    assert CostPart("late", "sam05", "measure").row(2.0) == {"point": "late", "fork": "sam05", "stage": "measure",
                                                             "cpu_seconds": 2.0}


