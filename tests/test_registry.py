"""The generic registry (``sameloss.registry.Registry``): one type for languages, recipes,
measures, model kinds and data sets; a name is taken once, an unknown name is one line
listing the known ones."""

from __future__ import annotations

import pytest

from sameloss import registry
from sameloss.data.sets import DATASETS

from sameloss.errors import UserError
from sameloss.measures.spec import MEASURES
MODELS = registry.MODELS
from sameloss.registry import Registry


class Thing:
    def __init__(self, name):
        self.name = name


def test_a_name_is_taken_once_and_an_unknown_one_lists_the_known():
    things = Registry("thing")
    first = things.add("a", Thing("a"))
    things.register()(Thing("b"))
    assert things.get("a") is first and things.names() == ("a", "b") and "b" in things and len(things) == 2
    with pytest.raises(UserError, match=r"two things are named 'a' \(.*\); rename one"):
        things.add("a", Thing("a"))
    assert things.get("a") is first  # the first stays
    with pytest.raises(UserError, match=r"^unknown thing 'c'; choose from a, b$"):
        things.get("c")


def test_added_registers_for_a_block_only():
    things = Registry("thing")
    with things.added(Thing("toy")) as toy:
        assert things["toy"] is toy
    assert "toy" not in things
    with pytest.raises(RuntimeError), things.added(Thing("toy")):
        raise RuntimeError
    assert "toy" not in things


def test_the_loader_runs_once_on_first_read():
    calls = []
    things = Registry("thing", loader=lambda: (calls.append(1), things.add("x", Thing("x"))))
    assert calls == []
    assert things.names() == ("x",) and list(things) == ["x"] and calls == [1]


def test_every_registry_is_one_type_and_refuses_a_second_name():
    for reg, name in ((registry.LANGUAGES, "hmm"), (registry.RECIPES, "steps"), (MEASURES, "loss"),
                      (MODELS, "transformer"), (DATASETS, "kjv")):
        assert isinstance(reg, Registry) and name in reg
        with pytest.raises(UserError, match=f"two {reg.kind}s are named '{name}'"):
            reg.add(name, reg.get(name))
    with pytest.raises(UserError, match="unknown language 'pcfgg'"):
        registry.language("pcfgg")
    with pytest.raises(UserError, match="unknown experiment 'figure9'"):
        registry.recipe("figure9")
