"""What a study's main log says while its units run: ``StudyProgress`` (units done, time
elapsed and left: a bar on a terminal, else words on each finished unit's line) and, for
local workers, ``WorkerStages`` (what each running worker is doing: the last line of its own
log, every ``STAGE_SECONDS`` at most)."""

from __future__ import annotations

import os
import time
from typing import Any, Callable

# how often, at most, the main log says what each running worker is doing (its log's last line)
STAGE_SECONDS = 30.0


class WorkerStages:
    """What the running local workers are doing, in the main log: every ``STAGE_SECONDS`` at
    most, each worker whose stage changed gets a line — its unit's name and the last line
    its own log holds (``run …: training N steps``, ``measure …``) — with the units done, so
    a study that runs for half an hour in workers is not silent where the user looks."""

    def __init__(self, log: Callable[[str], None], every: float | None = None):
        self.log, self.every = log, STAGE_SECONDS if every is None else every
        self.last = time.monotonic()
        self.shown: dict[str, str] = {}

    def report(self, running: dict[str, Any], done: int, total: int) -> None:
        if time.monotonic() - self.last < self.every:
            return
        self.last = time.monotonic()
        for name, job in running.items():
            line = last_line(getattr(getattr(job, "paths", None), "stdout", None))
            if line and self.shown.get(name) != line:
                self.shown[name] = line
                self.log(f"[{done}/{total} done] {name}: {line}")


def last_line(path) -> str:
    """The last non-empty line of a worker's log (``""``: none yet), read from its end."""
    if path is None:
        return ""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 4096))
            tail = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    lines = [x.strip() for x in tail.replace("\r", "\n").splitlines() if x.strip()]
    return lines[-1][:160] if lines else ""


class StudyProgress:
    """Progress across a study's units, with an estimate of the time left: a tqdm bar on a
    terminal (``bar``: over the runs' own bars), else ``finished()`` returns the words a
    launcher adds to its line per finished unit ("study 3/16 units, 4 min elapsed, about
    12 min left"). Units are counted alike (a seed's chain, or a run)."""

    def __init__(self, total: int, terminal: bool):
        self.total, self.done, self.start = total, 0, time.monotonic()
        self.bar = None
        if terminal and total > 1:
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc="study", unit="unit", position=0, leave=True, dynamic_ncols=True,
                            bar_format="{desc}: {n}/{total} units |{bar}| {elapsed} elapsed, about {remaining} left")

    def finished(self) -> str:
        self.done += 1
        if self.bar is not None:
            self.bar.update(1)
            return ""
        elapsed = time.monotonic() - self.start
        left = elapsed / self.done * (self.total - self.done)
        return (f"study {self.done}/{self.total} units, {_minutes(elapsed)} elapsed"
                + (f", about {_minutes(left)} left" if self.done < self.total else ""))

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def _minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"
