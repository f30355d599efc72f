"""Progress reports for ``pretrain``, ``measure`` and ``reproduce``.

On a terminal: a tqdm bar. Written to a file or a pipe (a log of a batch job), a bar's
carriage-return redraws pile up into one huge line, so instead a plain line
``desc: 120/400 steps (30%), 4.1 step/s, loss=2.31`` is printed at most every
``SAMELOSS_PROGRESS_SECONDS`` seconds (default 10) and once at the end. ``Progress``:
plain lines for a step that turns out slow (parsing a large grammar, its tables).
"""

from __future__ import annotations

import os
import sys
import time

INTERVAL_ENV = "SAMELOSS_PROGRESS_SECONDS"
DEFAULT_INTERVAL = 10.0


def _interval() -> float:
    try:
        value = float(os.environ.get(INTERVAL_ENV, DEFAULT_INTERVAL))
    except ValueError:
        return DEFAULT_INTERVAL
    return value if value >= 0 else DEFAULT_INTERVAL


def progress_bar(iterable=None, *, total: int | None = None, desc: str = "", unit: str = "it", initial: int = 0,
                 disable: bool = False, leave: bool = True, file=None):
    """A tqdm bar when ``file`` (default stderr) is a terminal, else ``PlainProgress``."""
    stream = file if file is not None else sys.stderr
    if total is None and iterable is not None and hasattr(iterable, "__len__"):
        total = len(iterable)
    isatty = getattr(stream, "isatty", None)
    if not disable and isatty is not None and isatty():
        from tqdm import tqdm
        return tqdm(iterable, total=total, desc=desc, unit=unit, initial=initial, leave=leave,
                    dynamic_ncols=True, file=stream)
    return PlainProgress(iterable, total=total, desc=desc, unit=unit, initial=initial, disable=disable,
                         file=stream)


class PlainProgress:
    """The subset of tqdm's interface sameloss uses, printing a plain line now and then."""

    def __init__(self, iterable=None, *, total=None, desc="", unit="it", initial=0, disable=False, file=None):
        self.iterable, self.total, self.desc, self.unit = iterable, total, desc, unit
        self.n, self.disable, self.file = initial, disable, file if file is not None else sys.stderr
        self.interval = _interval()
        self.postfix = ""
        self._start_n, self._start = initial, time.monotonic()
        self._last = self._start
        self._printed = initial  # the count of the last line printed (close repeats no line)
        self._closed = False

    def __iter__(self):
        try:
            for item in self.iterable:
                yield item
                self.update(1)
        finally:
            self.close()

    def __len__(self):
        return self.total if self.total is not None else len(self.iterable)

    def update(self, n: int = 1) -> None:
        self.n += n
        now = time.monotonic()
        if not self.disable and now - self._last >= self.interval:
            self._last = now
            self._print(now)

    def set_postfix(self, values: dict | None = None, refresh: bool = True, **kwargs) -> None:
        values = {**(values or {}), **kwargs}
        self.postfix = ", ".join(f"{k}={v}" for k, v in values.items())

    def write(self, message: str, file=None) -> None:
        print(message, file=file or self.file, flush=True)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if not self.disable and self.n > self._start_n and self.n != self._printed:
            self._print(time.monotonic())

    def _print(self, now: float) -> None:
        self._printed = self.n
        done = f"{self.n}/{self.total}" if self.total else f"{self.n}"
        share = f" ({self.n / self.total:.0%})" if self.total else ""
        rate = (self.n - self._start_n) / max(now - self._start, 1e-9)
        text = f"{self.desc}: {done} {self.unit}s{share}, {rate:.3g} {self.unit}/s"
        if self.postfix:
            text += f", {self.postfix}"
        print(text, file=self.file, flush=True)


class Progress:
    """Plain progress lines on stderr for a step that turns out slow.

    Silent for the first ``after`` seconds (fast steps print nothing), then one line at
    most every ``every`` seconds, and a last line with the time taken. Plain lines, not
    a bar, so a log file reads the same as a terminal.
    """

    def __init__(self, what: str, total: int | None = None, after: float = 2.0, every: float = 5.0):
        self.what, self.total, self.after, self.every = what, total, after, every
        self.start = self.last = time.monotonic()
        self.printed = False

    def __call__(self, done: int) -> None:
        now = time.monotonic()
        if now - self.start >= self.after and now - self.last >= (self.every if self.printed else self.after):
            of = f"/{self.total}" if self.total is not None else ""
            print(f"{self.what}: {done}{of} ({now - self.start:.0f} s)", file=sys.stderr, flush=True)
            self.last, self.printed = now, True

    def close(self) -> None:
        elapsed = time.monotonic() - self.start
        if self.printed or elapsed >= self.after:
            print(f"{self.what}: done in {elapsed:.1f} s", file=sys.stderr, flush=True)
