"""The measures' keywords before their settings objects (issue 62): ``trace_hutchinson`` and
``top_eigenvalue`` took the fixed batch's settings one by one (now ``FixedBatch``),
``trace_fisher`` its contexts' (now ``FisherContexts``; its old ``contexts=`` was the batch),
and ``probe_features``, ``linear_probe`` and ``lookup_table_probe`` the probe's (now
``ProbeSettings``). A call with the old keywords still works: they are gathered into the
settings object, with a ``DeprecationWarning`` that says what to write instead
(CHANGELOG.md, 0.2.0). Old and new together are a ``TypeError``."""

from __future__ import annotations

import functools
import warnings
from typing import Callable


def old_keywords(setting: str, position: int, build: Callable, names: tuple[str, ...], *,
                 rename: dict[str, tuple[str, Callable]] | None = None,
                 positional: tuple[str, type, bool] | None = None) -> Callable:
    """A decorator: ``fn`` also takes the keywords ``names`` it took before ``setting`` (the
    parameter at ``position``) gathered them, building ``setting`` as ``build(**old)``.

    Args:
        setting: the new parameter's name (``fixed``, ``contexts``, ``settings``).
        position: its index among the positional parameters.
        build: what makes it from the old keywords (a settings class, or its ``of``).
        names: the old keywords.
        rename: an old keyword whose name the new signature reuses, e.g. ``contexts``:
            ``{old: (its name for build, a test that the value is the old kind)}``.
        positional: ``(old name, type, into_setting)``: the old parameter that stood at
            ``position`` (a probe's ``method``, ``probe_features``' ``measure``), taken as that
            keyword when the value there is of that type — one of the old keywords
            (``into_setting``) or still one of ``fn``'s own.
    """
    rename = rename or {}

    def wrap(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def inner(*args, **kwargs):
            old = {k: kwargs.pop(k) for k in names if k in kwargs}
            for key, (as_name, is_old) in rename.items():
                if key in kwargs and is_old(kwargs[key]):
                    old[as_name] = kwargs.pop(key)
            moved = ""
            if positional and len(args) > position and isinstance(args[position], positional[1]):
                name, _, into_setting = positional
                if into_setting:
                    old[name] = args[position]
                else:  # the old parameter is still one of fn's, by keyword now
                    kwargs[name] = args[position]
                    moved = f"{name} is now a keyword (its place is {setting}'s)"
                args = args[:position] + args[position + 1:]
            if not old:
                if moved:
                    warnings.warn(f"{fn.__name__}: {moved} (CHANGELOG.md)", DeprecationWarning, stacklevel=2)
                return fn(*args, **kwargs)
            if setting in kwargs or len(args) > position:
                raise TypeError(f"{fn.__name__}: give {setting}= or the old keywords ({', '.join(old)}), not both")
            what = build.__qualname__.replace(".of", "")  # FixedBatch, FisherContexts, ProbeSettings(.of)
            warnings.warn(f"{fn.__name__}: the keywords {', '.join(old)} are deprecated: pass "
                          f"{setting}={build.__qualname__}({', '.join(f'{k}=...' for k in old)}) instead, a {what} "
                          "(CHANGELOG.md)", DeprecationWarning, stacklevel=2)
            return fn(*args, **{**kwargs, setting: build(**old)})

        return inner

    return wrap


# the old keywords of each settings object
FIXED_BATCH = ("params", "batch", "n_sentences", "mask_rate", "seed", "engine", "micro_batch")
FISHER_CONTEXTS = ("n_contexts", "params", "seed", "block_size", "max_chunk_bytes", "ghost_norms", "engine", "hooks")
PROBE = ("method", "seeds", "epochs", "lr", "batch_size", "weight_decay", "l2", "max_iter", "projection_dim")
