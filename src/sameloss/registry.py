"""Where sameloss finds what it is made of: ``Registry``, one generic type of named
objects (duplicate names refused, an unknown name one clear line), and its two instances
here, the languages and the recipes, filled from their own files and from plugins without
importing torch (``sameloss --help``, config validation and the command-line choices stay
fast). Model kinds (``MODELS``, declared in their files the same way), measures
(``measures.spec.MEASURES``) and data sets (``data.sets.DATASETS``) are registries of
the same type.

Languages. A language is one module in ``sameloss/languages/`` that declares itself near
its top, as a literal the registry reads from the file (``ast``, no import)::

    LANGUAGE = {"name": "hmm", "build": "build", "settings": ("size", "seed"), "describe": True}

``build`` names a function of the module, imported only when a language is built, that
takes the ``language.*`` settings listed in ``settings`` (``size``, ``seed``, ``params``,
``grammar``, ``generator``, ``k``, ``length``, ``pool``, ``data``, ``device``) as keyword
arguments;
``describe``: whether ``sameloss language describe`` offers it (it needs no files). Its
named sizes are the keys of the module's ``PRESETS`` dict literal (no sizes: none).

Params. ``language.params`` is text, ``key=value[,key=value...]``: constructor keyword
arguments over the size's own (``"n_states=6,emission_concentration=0.5"``).
``parse_params`` reads its syntax (no language needed: config validation calls it);
``language_params`` checks the keys and types against what one language's constructor
takes (``keyword_types`` of it), so a builder that takes ``params`` calls that.

Recipes. A recipe is one module in ``sameloss/experiments/recipes/`` named by its file, or
one package there named by its folder (its ``__init__.py`` holds what a module would), with
``SUMMARY`` (a string literal, read from the file the same way: the line of ``reproduce
--help``), ``TITLE``, ``PRESETS``, ``units(setup, preset)`` (its declared study,
``experiments/declare.py``) and ``report(records, preset)``.

Plugins. ``SAMELOSS_PLUGINS=module[,module...]`` (importable module names, e.g. a file on
``PYTHONPATH``) are imported the first time the registry is asked; they add languages and
recipes through the public hooks ``register_language`` and ``register_recipe`` (and
measures, model kinds, data sets through their registries' ``add``). Nothing else needs
an edit: ``pretrain language.name=...``, ``language describe`` and ``reproduce`` find them
here.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import inspect
import math
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Generic, TypeVar

from .errors import UserError

PACKAGE = Path(__file__).parent
PLUGINS_ENV = "SAMELOSS_PLUGINS"
# language.* settings a builder may take; size and device are always given (a config
# always has them) and go only to builders that take them
LANGUAGE_SETTINGS = ("size", "seed", "params", "grammar", "generator", "k", "length", "pool", "data", "device")
ALWAYS_GIVEN = ("size", "device")
T = TypeVar("T")



class Registry(Generic[T]):
    """Named objects of one kind, in the order they were added.

    ``add(name, obj)`` (or ``@registry.register()`` on an object with a ``name``) refuses a
    name already taken — a second language ``hmm`` from a plugin is an error naming both,
    never a silent replacement; ``get(name)`` of an unknown name is a ``UserError`` listing
    the known ones. ``loader`` (optional) fills the registry the first time it is read
    (discovery from files, plugins). ``added(obj)`` registers an object for the length
    of a ``with`` block (a test's throw-away measure)."""

    def __init__(self, kind: str, loader: Callable[[], None] | None = None, unknown: str | None = None):
        self.kind = kind
        self._unknown = unknown or f"unknown {kind}"
        self._items: dict[str, T] = {}
        self._origins: dict[str, str] = {}
        self._loader = loader
        self._loaded = False

    def _load(self) -> None:
        if self._loader is not None and not self._loaded:
            self._loaded = True  # set first: a loader runs once, and adds to the registry itself
            self._loader()

    def add(self, name: str, obj: T, origin: str | None = None) -> T:
        """Register ``obj`` as ``name`` (``origin``: where it comes from, named in a clash)."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"a {self.kind} needs a name, got {name!r}")
        if name in self._items:
            raise UserError(f"two {self.kind}s are named {name!r} ({self._origins[name]} and "
                            f"{origin or _origin(obj)}); rename one")
        self._items[name] = obj
        self._origins[name] = origin or _origin(obj)
        return obj

    def register(self, name: str | None = None) -> Callable[[T], T]:
        """A decorator: ``@MEASURES.register()`` adds an object (or class instance) under its
        ``name`` attribute, or under ``name``."""
        def decorate(obj: T) -> T:
            self.add(name or getattr(obj, "name"), obj)
            return obj
        return decorate

    def remove(self, name: str) -> T:
        self._load()
        self._origins.pop(name, None)
        return self._items.pop(name)

    @contextlib.contextmanager
    def added(self, obj: T, name: str | None = None) -> Iterator[T]:
        """``obj`` registered inside the ``with`` block only."""
        name = name or getattr(obj, "name")
        self._load()
        self.add(name, obj)
        try:
            yield obj
        finally:
            self.remove(name)

    def get(self, name: str) -> T:
        self._load()
        if name not in self._items:
            raise UserError(f"{self._unknown} {name!r}; choose from {', '.join(self._items) or '(none)'}")
        return self._items[name]

    def __getitem__(self, name: str) -> T:
        return self.get(name)

    def __contains__(self, name: object) -> bool:
        self._load()
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        self._load()
        return iter(list(self._items))

    def __len__(self) -> int:
        self._load()
        return len(self._items)

    def names(self) -> tuple[str, ...]:
        self._load()
        return tuple(self._items)

    def values(self) -> list[T]:
        self._load()
        return list(self._items.values())

    def items(self) -> list[tuple[str, T]]:
        self._load()
        return list(self._items.items())

    def as_dict(self) -> dict[str, T]:
        self._load()
        return dict(self._items)


def _origin(obj) -> str:
    """Where an object comes from, for a clash's message: its module, or its text."""
    module = obj if isinstance(obj, str) else getattr(obj, "__module__", None) or type(obj).__module__
    return str(module)


@dataclass(frozen=True)
class LanguageEntry:
    """A registered language: its name, named sizes (empty: none), the ``language.*``
    settings its builder takes, whether ``language describe`` offers it, and the builder
    (a callable, or ``"module:function"`` imported when first used)."""

    name: str
    sizes: tuple[str, ...]
    settings: tuple[str, ...]
    describe: bool
    build: Callable | str

    def builder(self) -> Callable:
        if callable(self.build):
            return self.build
        module, _, function = self.build.partition(":")
        return getattr(importlib.import_module(module), function)


@dataclass(frozen=True)
class RecipeEntry:
    """A registered recipe: its name, one-line summary and module (or module name)."""

    name: str
    summary: str
    module: ModuleType | str

    def load(self) -> ModuleType:
        return self.module if isinstance(self.module, ModuleType) else importlib.import_module(self.module)


@dataclass(frozen=True)
class ModelEntry:
    """A registered model kind: its name and its module (or module name), whose ``KIND``
    is the ``models.kind.ModelKind``, imported when first used."""

    name: str
    module: ModuleType | str

    def load(self):
        module = self.module if isinstance(self.module, ModuleType) else importlib.import_module(self.module)
        return module.KIND


def _discover() -> None:
    """The languages, model kinds and recipes of sameloss's own files, then the plugins'."""
    for path in sorted((PACKAGE / "languages").glob("*.py")):
        declared = _literals(path, ("LANGUAGE", "PRESETS"))
        if "LANGUAGE" in declared:
            d = declared["LANGUAGE"]
            module = f"sameloss.languages.{path.stem}"
            register_language(d["name"], f"{module}:{d.get('build', 'build')}", tuple(declared.get("PRESETS", ())),
                              tuple(d.get("settings", ("size", "seed"))), bool(d.get("describe", True)))
    for path in sorted((PACKAGE / "models").glob("*.py")):
        declared = _literals(path, ("MODEL_KIND",))
        if "MODEL_KIND" in declared:
            register_model_kind(declared["MODEL_KIND"], f"sameloss.models.{path.stem}")
    folder = PACKAGE / "experiments" / "recipes"
    found = {path.stem: path for path in folder.glob("*.py")}  # a recipe in one file, or
    found.update({path.parent.name: path for path in folder.glob("*/__init__.py")})  # a package of its own
    for name, path in sorted(found.items()):
        if not name.startswith("_"):
            declared = _literals(path, ("SUMMARY",))
            register_recipe(name, f"sameloss.experiments.recipes.{name}", declared.get("SUMMARY", ""))
    load_plugins()


def load_plugins() -> None:
    """Import the modules of ``$SAMELOSS_PLUGINS`` (once: Python keeps imported modules)."""
    for name in filter(None, (n.strip() for n in os.environ.get(PLUGINS_ENV, "").split(","))):
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise UserError(f"{PLUGINS_ENV}: cannot import plugin {name!r} ({exc})") from None


LANGUAGES: Registry[LanguageEntry] = Registry("language", loader=_discover)
RECIPES: Registry[RecipeEntry] = Registry("recipe", loader=LANGUAGES._load, unknown="unknown experiment")
MODELS: Registry[ModelEntry] = Registry("model kind", loader=LANGUAGES._load)


def register_language(name: str, build: Callable | str, sizes=(), settings=("size", "seed"),
                      describe: bool = True) -> None:
    """Add a language (the hook for plugins; built-in languages are read from their files).
    ``build(**settings)`` returns the language (``languages.base.Language``)."""
    bad = [s for s in settings if s not in LANGUAGE_SETTINGS]
    if bad:
        raise ValueError(f"language {name!r}: unknown setting {bad[0]!r}; choose from {', '.join(LANGUAGE_SETTINGS)}")
    origin = build.partition(":")[0] if isinstance(build, str) else None
    LANGUAGES.add(name, LanguageEntry(name, tuple(sizes), tuple(settings), describe, build),
                  origin or getattr(build, "__module__", None))


def register_recipe(name: str, module: ModuleType | str, summary: str | None = None) -> None:
    """Add a recipe (the hook for plugins; built-in recipes are the files and packages of
    ``experiments/recipes/``): a module with ``TITLE``, ``PRESETS``, ``units`` and ``report``."""
    if summary is None:
        loaded = module if isinstance(module, ModuleType) else importlib.import_module(module)
        summary = getattr(loaded, "SUMMARY", "") or (loaded.__doc__ or "").strip().split("\n")[0]
    RECIPES.add(name, RecipeEntry(name, summary, module),
                module if isinstance(module, str) else module.__name__)


def register_model_kind(name: str, module: ModuleType | str) -> None:
    """Add a model kind (the hook for plugins; built-in kinds are the modules of
    ``models/`` declaring ``MODEL_KIND``): a module whose ``KIND`` is a
    ``models.kind.ModelKind``."""
    MODELS.add(name, ModelEntry(name, module), module if isinstance(module, str) else module.__name__)


def languages() -> dict[str, LanguageEntry]:
    return LANGUAGES.as_dict()


def recipes() -> dict[str, RecipeEntry]:
    return RECIPES.as_dict()


def language(name: str) -> LanguageEntry:
    return LANGUAGES.get(name)


def recipe(name: str) -> ModuleType:
    """The module of recipe ``name``."""
    return RECIPES.get(name).load()


# ---- language.params ----------------------------------------------------------------
def parse_params(text: str, what: str = "language.params") -> dict[str, int | float]:
    """``"key=value[,key=value...]"`` as a dict: each value an integer if it reads as one,
    else a finite decimal number, else refused; keys must be names (identifiers), each
    given once; blanks around keys and values are ignored. ``ValueError`` (one line,
    starting with ``what``) for anything else, an empty text included."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"{what} is empty; give key=value[,key=value...] (e.g. n_states=6) or leave it unset")
    out: dict[str, int | float] = {}
    for item in text.split(","):
        key, eq, value = (part.strip() for part in item.partition("="))
        if not item.strip():
            raise ValueError(f"{what}: an empty item in {text!r} (a comma too many?)")
        if not eq:
            raise ValueError(f"{what}: {item.strip()!r} is not key=value")
        if not key.isidentifier():
            raise ValueError(f"{what}: {key!r} is not a setting name")
        if key in out:
            raise ValueError(f"{what}: {key} is given twice")
        out[key] = _number(value, f"{what}: {key}")
    return out


def _number(text: str, where: str) -> int | float:
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{where}={text!r} is not a number (an integer or a decimal)") from None
    if not math.isfinite(value):
        raise ValueError(f"{where}={text} is not a finite number")
    return value


def keyword_types(function: Callable, skip: tuple[str, ...] = ("seed",)) -> dict[str, type]:
    """The keyword arguments of ``function`` (or the fields of a dataclass) with an int or
    float default, and that type (but ``skip``): the ``language.params`` a constructor takes."""
    out = {}
    for name, parameter in inspect.signature(function).parameters.items():
        default = parameter.default
        if name not in skip and type(default) in (int, float):
            out[name] = type(default)
    return out


def language_params(params: str | dict | None, accepted: dict[str, type], language: str) -> dict:
    """``language.params`` (text, a dict, or ``None``: none) checked against what the
    ``language``'s constructor takes (``accepted``: name -> int or float): an unknown key,
    or a decimal for an integer setting, is a ``UserError`` of one line naming it."""
    if params is None:
        return {}
    if isinstance(params, str):
        try:
            params = parse_params(params)
        except ValueError as exc:
            raise UserError(str(exc)) from None
    out = {}
    for key, value in params.items():
        if key not in accepted:
            raise UserError(f"language.params: the {language} language takes no {key!r}; it takes "
                            f"{', '.join(accepted)}")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise UserError(f"language.params: {key} must be a number, got {value!r}")
        if accepted[key] is int and not isinstance(value, int):
            raise UserError(f"language.params: {key} must be an integer, got {value!r}")
        out[key] = accepted[key](value)
    return out


# ---- reading declarations from files -----------------------------------------------
def _literals(path: Path, names: tuple[str, ...]) -> dict:
    """The values of the module-level assignments ``names`` of a Python file, where they are
    literals (a dict literal whose values are not gives its keys). Only each assignment's
    own lines are parsed (``NAME = ...`` or ``NAME: type = ...`` at the start of a line, up
    to where it parses), not the whole file: the registry is read at every start."""
    lines = path.read_text(encoding="utf-8").splitlines()
    out = {}
    for i, line in enumerate(lines):
        name = next((n for n in names if line.startswith((f"{n} =", f"{n}:")) and n not in out), None)
        if name is None:
            continue
        for j in range(i + 1, min(i + 400, len(lines)) + 1):
            try:
                node = ast.parse("\n".join(lines[i:j])).body[0]
                break
            except SyntaxError:
                continue
        else:
            continue
        value = node.value
        try:
            out[name] = ast.literal_eval(value)
        except ValueError:  # e.g. PRESETS = {"paper": dict(...)}: its keys are enough
            if isinstance(value, ast.Dict) and all(isinstance(k, ast.Constant) for k in value.keys):
                out[name] = [k.value for k in value.keys]
    return out
