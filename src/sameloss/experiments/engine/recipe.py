"""What a recipe is, declared once: the attributes every recipe has and the hooks a recipe
may offer, checked when the recipe is loaded (``load_recipe``), so that ``reproduce``,
``plan`` and the shards call a declared hook or say in one line that the recipe has none —
never ``getattr`` with a default.

A recipe is the module the registry finds (``sameloss.registry``: a file or package of
``recipes/``, or a plugin's module) with

``TITLE``     the report's title;
``PRESETS``   its settings per scale (``SCALE_NAMES``, and any of its own: isoloss's
              ``quick``), each a frozen dataclass (``common.Preset``);
``units``     ``units(setup, preset)``: its declared study (``declare.py``);
``report``    ``report(records, preset)``: its report's sections from what the engine
              recorded (``engine.Records``).

and, optionally, the hooks of ``HOOKS`` (only isoloss has them today): each takes the
preset first, as its ``Hook.call`` says. A module that defines a function named like a hook
that is not one (``with_budgets``), a hook with the wrong parameters, or lacks a required
attribute is refused when loaded, with one line naming the recipe and what is wrong.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from ...errors import UserError

SCALE_NAMES = ("smoke", "tiny", "small", "paper")
REQUIRED = ("TITLE", "PRESETS", "units", "report")


@dataclass(frozen=True)
class Hook:
    """An optional hook: its positional parameters after the preset, the command-line option
    that needs it, and what a recipe without it tells the user."""

    call: str
    option: str
    missing: str


HOOKS: dict[str, Hook] = {
    "with_budget": Hook("with_budget(preset, minutes) -> preset", "--budget",
                        "has no design chosen for a budget (the option is isoloss's)"),
    "with_languages": Hook("with_languages(preset, specs) -> preset", "--language",
                           "runs its own languages (the option is isoloss's)"),
    "folder_suffix": Hook("folder_suffix(preset) -> str", "", ""),
    "plan_notes": Hook("plan_notes(preset, device, workers, cpu_peak) -> (lines, ceiling)", "", ""),
}
# the prefixes of hook names: a function so named that is no hook is a misspelt one
_HOOK_PREFIXES = ("with_", "folder_", "plan_")


@dataclass(frozen=True)
class Recipe:
    """A loaded, checked recipe: its module's required attributes and its hooks (``None``
    where it has none)."""

    name: str
    module: ModuleType
    title: str
    presets: dict
    units: Callable
    report: Callable
    hooks: dict[str, Callable]

    @property
    def doc(self) -> str:
        return self.module.__doc__ or ""

    def hook(self, name: str) -> Callable | None:
        """The recipe's hook ``name`` (one of ``HOOKS``), or ``None``."""
        if name not in HOOKS:
            raise KeyError(f"{name!r} is not a recipe hook; hooks: {', '.join(HOOKS)}")
        return self.hooks.get(name)

    def needs(self, name: str):
        """The hook ``name``; ``UserError`` naming its option when the recipe has none."""
        found = self.hook(name)
        if found is None:
            raise UserError(f"{HOOKS[name].option}: {self.name} {HOOKS[name].missing}")
        return found

    def preset(self, scale: str, languages: list[str] | None = None, budget: float | None = None,
               base: Any = None) -> Any:
        """The preset ``reproduce`` and ``plan`` run: the scale's (or ``base``), on the
        ``--language`` choices (``with_languages``), with ``--budget`` minutes
        (``with_budget``)."""
        if scale not in self.presets:
            raise UserError(f"unknown scale {scale!r}; choose from "
                            f"{', '.join(self.presets) or ', '.join(SCALE_NAMES)}")
        p = base if base is not None else self.presets[scale]
        if languages:
            p = self.needs("with_languages")(p, languages)
        if budget is not None:
            p = self.needs("with_budget")(p, budget)
        return p

    def folder_suffix(self, p: Any) -> str:
        """What the preset adds to the experiment folder's name (``""`` for most)."""
        hook = self.hook("folder_suffix")
        return hook(p) if hook is not None else ""


def check_recipe(name: str, module: ModuleType) -> Recipe:
    """``module`` as a ``Recipe``, or ``UserError`` (one line) naming what is wrong."""
    missing = [a for a in REQUIRED if not hasattr(module, a)]
    if missing:
        raise UserError(f"recipe {name} ({module.__name__}) lacks {', '.join(missing)}: a recipe has "
                        f"{', '.join(REQUIRED)} (sameloss.experiments.engine.recipe)")
    _check_call(name, "units", module.units, 2, "units(setup, preset)")
    _check_call(name, "report", module.report, 2, "report(records, preset)")
    hooks = {}
    for attr, value in vars(module).items():
        if not callable(value) or not attr.startswith(_HOOK_PREFIXES) or attr.startswith("_"):
            continue
        if attr not in HOOKS:
            if getattr(value, "__module__", "").startswith(module.__name__):
                raise UserError(f"recipe {name}: {attr} is named like a hook but is none; hooks: {', '.join(HOOKS)}")
            continue
        n = HOOKS[attr].call.split("(")[1].split(")")[0].count(",") + 1
        _check_call(name, attr, value, n, HOOKS[attr].call)
        hooks[attr] = value
    return Recipe(name, module, module.TITLE, module.PRESETS, module.units, module.report, hooks)


def _check_call(name: str, attr: str, fn: Callable, n: int, call: str) -> None:
    """``fn`` takes ``n`` positional arguments (``call`` as declared), else ``UserError``."""
    try:
        inspect.signature(fn).bind(*range(n))
    except TypeError:
        raise UserError(f"recipe {name}: {attr} does not take the arguments of {call}") from None
    except ValueError:  # a builtin without a signature: trusted
        pass


_LOADED: dict[tuple[str, int], Recipe] = {}


def load_recipe(name: str) -> Recipe:
    """Recipe ``name`` from the registry, checked (once per module)."""
    from ... import registry

    module = registry.recipe(name)
    key = (name, id(module))
    if key not in _LOADED:
        _LOADED[key] = check_recipe(name, module)
    return _LOADED[key]
