"""What a recipe is, checked when it is loaded (``experiments.recipe``): its required
attributes, its optional hooks declared once, and one line for whatever is wrong."""

from __future__ import annotations

import types

import pytest

from sameloss.errors import UserError
from sameloss.experiments.engine.recipe import HOOKS, check_recipe, load_recipe


def _module(**attrs) -> types.ModuleType:
    module = types.ModuleType("fake_recipe")
    base = {"TITLE": "Fake", "PRESETS": {"smoke": object()}, "units": lambda setup, p: [],
            "report": lambda records, p: []}
    for name, value in {**base, **attrs}.items():
        if callable(value) and hasattr(value, "__module__"):
            value.__module__ = module.__name__  # defined in the recipe's module, as a recipe's own
        setattr(module, name, value)
    return module


def test_every_shipped_recipe_loads_and_only_isoloss_has_hooks():
    from sameloss import registry

    names = list(registry.recipes())
    assert "isoloss" in names and "steps" in names
    for name in names:
        recipe = load_recipe(name)
        if not recipe.module.__name__.startswith("sameloss.experiments.recipes."):
            continue  # a plugin's (tests/test_plugins.py checks one in its own process)
        assert recipe.title and recipe.presets
        assert set(recipe.hooks) <= set(HOOKS)
        assert bool(recipe.hooks) == (name == "isoloss"), name
    assert set(load_recipe("isoloss").hooks) == set(HOOKS)


def test_a_recipe_without_a_hook_names_the_option_in_one_line():
    steps = load_recipe("steps")
    with pytest.raises(UserError,
                       match=r"^--budget: steps has no design chosen for a budget \(the option is isoloss's\)$"):
        steps.preset("tiny", budget=10)
    with pytest.raises(UserError, match=r"^--language: steps runs its own languages"):
        steps.preset("tiny", languages=["hmm:micro"])
    with pytest.raises(UserError, match=r"^unknown scale 'huge'; choose from "):
        steps.preset("huge")
    assert steps.folder_suffix(steps.presets["tiny"]) == ""
    assert steps.preset("tiny") is steps.presets["tiny"]


def test_a_malformed_recipe_is_refused_when_loaded():
    assert check_recipe("fake", _module()).hooks == {}
    module = _module()
    del module.TITLE
    with pytest.raises(UserError, match=r"^recipe fake \(fake_recipe\) lacks TITLE: a recipe has "):
        check_recipe("fake", module)
    with pytest.raises(UserError, match=r"^recipe fake: with_budgets is named like a hook but is none; hooks: "):
        check_recipe("fake", _module(with_budgets=lambda p, minutes: p))
    with pytest.raises(UserError, match=r"^recipe fake: with_budget does not take the arguments of "
                                        r"with_budget\(preset, minutes\)"):
        check_recipe("fake", _module(with_budget=lambda p: p))
    with pytest.raises(UserError, match=r"^recipe fake: units does not take the arguments of units\(setup, preset\)"):
        check_recipe("fake", _module(units=lambda setup: []))
    good = check_recipe("fake", _module(with_languages=lambda p, specs: p))
    assert set(good.hooks) == {"with_languages"}


def test_a_hook_imported_from_elsewhere_is_not_a_misspelt_one():
    """A helper named like a hook but defined in another module (imported for use) is left alone."""
    module = _module()
    module.with_unit = lambda x: x  # noqa: E731 (its __module__ is this test's)
    assert check_recipe("fake", module).hooks == {}
