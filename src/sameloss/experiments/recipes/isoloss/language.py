"""The language an iso-loss study runs on, by name (``--language NAME[:SIZE][:key=value,...]``):
``LanguageChoice`` (a registered language, its size, the task probed, another draw or
constructor settings), ``parse_language`` (the flag's text, refused in one line before anything
runs) and ``task_span`` (the fixed span of positions the study probes)."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

from ....errors import UserError
from ....measures.headroom import span_task
from ...engine.runspec import Setting

# the task probed on a language named without ``task=``: the one its headroom size was made for
DEFAULT_TASKS = {"hmm": "task-5", "pcfg": "span-1"}


@dataclass(frozen=True)
class LanguageChoice:
    """A language of the study: registered name, size, the task probed (one with a span and
    a posterior), and optionally another draw (``seed``) or constructor settings
    (``params``: ``language.params``, e.g. ``n_states=6,emission_concentration=0.5``)."""

    name: str
    size: str
    task: str
    seed: int | None = None
    params: str | None = None
    # a registered language's name (``found``: ``hmm:search-1``), which names its folders
    label: str = ""
    # the seeds a study of it runs (the languages scale: those whose base passed the language's
    # recorded gate, known before the study; the gate is on the base, before any fork, so this
    # selects on nothing a fork does); empty: the preset's
    seeds: tuple[int, ...] = ()

    @property
    def spec(self) -> str:
        """As ``--language`` takes it: ``NAME:SIZE[:key=value,...]``."""
        extra = [*([f"seed={self.seed}"] if self.seed is not None else []),
                 *([self.params] if self.params else []), f"task={self.task}"]
        return f"{self.name}:{self.size}:" + ",".join(extra)

    @property
    def tag(self) -> str:
        """A folder-safe name: ``hmm-headroom``, ``hmm-headroom-seed7-n_states6-task-5``; a
        registered language's its name's (``hmm-search-1``)."""
        if self.label:
            return self.label.replace(":", "-")
        parts = [self.name, self.size, *([f"seed{self.seed}"] if self.seed is not None else []),
                 *(x.replace("=", "") for x in (self.params or "").split(",") if x)]
        if self.task != DEFAULT_TASKS.get(self.name):
            parts.append(self.task)
        return "-".join(parts).replace("/", "_").replace(":", "_")

    def settings(self) -> tuple[Setting, ...]:
        return (*((("language.seed", self.seed),) if self.seed is not None else ()),
                *((("language.params", self.params),) if self.params else ()))


def parse_language(text: str) -> LanguageChoice:
    """``NAME[:SIZE][:key=value,...]`` → a ``LanguageChoice`` (``UserError`` naming what is
    wrong). Keys: ``task`` (default ``DEFAULT_TASKS``), ``seed`` (another draw of the size's
    shape), anything else a constructor setting of the language (``language.params``). The
    size defaults to ``headroom``; the language is built here, so a bad setting or a task
    without a span and posterior is refused before anything runs. A registered name
    (``found``: ``hmm:search-1``) is its record's spec, labelled with the name."""
    from .... import registry
    from ....found import lookup
    from ....registry import parse_params

    found = lookup(text)
    if found is not None:
        return dataclasses.replace(parse_language(found.spec), label=found.name)

    parts = text.strip().split(":")
    if not parts[0] or len(parts) > 3:
        raise UserError(f"--language {text!r}: expected NAME[:SIZE][:key=value,...], e.g. hmm:headroom, "
                        "pcfg:headroom, hmm:headroom:seed=7,emission_concentration=0.5")
    name = parts[0]
    known = registry.languages()
    if name not in known:
        raise UserError(f"--language {text!r}: unknown language {name!r}; choose from {', '.join(known)}")
    size = parts[1] if len(parts) > 1 and parts[1] else "headroom"
    if size not in known[name].sizes:
        raise UserError(f"--language {text!r}: {name} has no size {size!r}; its sizes: "
                        f"{', '.join(known[name].sizes) or '(none)'}")
    # task= names a task (text); every other key is a number: registry.parse_params reads them
    # (the syntax of language.params: key=value, names once, integers or finite decimals)
    items = parts[2].split(",") if len(parts) > 2 and parts[2] else []
    tasks = [item.partition("=")[2].strip() for item in items if item.partition("=")[0].strip() == "task"]
    numbers = [item for item in items if item.partition("=")[0].strip() != "task"]
    if len(tasks) > 1 or (tasks and not tasks[0]):
        raise UserError(f"--language {text!r}: give task=NAME once")
    try:
        values = parse_params(",".join(numbers), what=f"--language {text!r}") if numbers else {}
    except ValueError as exc:
        raise UserError(str(exc)) from None
    task = tasks[0] if tasks else DEFAULT_TASKS.get(name)
    if task is None:
        raise UserError(f"--language {text!r}: say which task to probe (task=NAME: one about a latent at fixed "
                        "positions, with a span and a posterior)")
    seed = values.pop("seed", None)
    if seed is not None and (not isinstance(seed, int) or seed < 0):
        raise UserError(f"--language {text!r}: seed must be a non-negative integer, got {seed!r}")
    params = ",".join(f"{k}={v}" for k, v in values.items()) or None
    choice = LanguageChoice(name, size, task, seed, params)
    try:
        task_span(choice)  # builds the language: a bad setting or task is one line now
    except UserError as exc:
        raise UserError(f"--language {text!r}: {exc}") from None
    return choice


@functools.lru_cache(maxsize=32)
def task_span(choice: LanguageChoice) -> tuple[int, int]:
    """The span ``[start, end)`` of the choice's task (built once per process). The study
    probes a fixed span (every labelled sentence covers it), so ``end`` must be fixed."""
    from ....languages import make_language

    language = make_language(choice.name, preset=choice.size, seed=choice.seed, params=choice.params)
    task = span_task(language, choice.task)
    start, end = task.span
    if end is None:
        raise UserError(f"task {choice.task!r} of {choice.name} spans to the end of each sentence: the study probes "
                        "a fixed span (a task about fixed positions, e.g. an HMM's task-k or a PCFG's span-k)")
    return int(start), int(end)
