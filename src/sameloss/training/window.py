"""The log windows of a stack's members: what each member's next ``metrics.jsonl`` line sums.

Per member, since its last log line: the summed cross-entropy and each objective's logged
value (``Objective.window_key``), the first step whose loss was not finite, and the last
gradient norm stay on the device, added without reading anything back (a step never waits
for the device); the targets, tokens and steps are host counts. They are read once per log
line, evaluation or checkpoint (``read``). The sums are float64 in step order, so a line
holds exactly the numbers of a run alone. A checkpoint saves a member's window (``state``)
and a resumed member continues it (``of``), so ``metrics.jsonl`` after a resume reads as an
uninterrupted run's.
"""

from __future__ import annotations

import math
import time

import torch

from .objectives.base import ordered


def window_keys() -> tuple[str, ...]:
    """The sums a window keeps besides the loss: every registered objective's."""
    return tuple(k for k in (c.window_key() for c in ordered()) if k and k != "loss")


class Windows:
    """The windows of S members (module docstring)."""

    def __init__(self, n: int, device):
        f64 = dict(dtype=torch.float64, device=device)
        self.keys = ("loss", *window_keys())
        self.sums = {k: torch.zeros(n, **f64) for k in self.keys}
        self.diverged = torch.full((n, 2), float("nan"), **f64)  # (step, loss) of the first non-finite loss
        self.grad_norm: torch.Tensor | None = None  # [S], of the last step that computed them
        self.has_norm = [False] * n
        self.tokens, self.targets, self.steps = [0] * n, [0] * n, [0] * n
        self.started = [time.perf_counter()] * n
        self._host: dict | None = None  # the device values read back once (``read``), until the next change

    @classmethod
    def of(cls, saved: list[dict], device) -> Windows:
        """The windows of members that continue ``saved`` ones (``state``; ``{}``: a new window)."""
        out = cls(len(saved), device)
        now = time.perf_counter()
        for i, s in enumerate(saved):
            for k in out.keys:
                out.sums[k][i] = float(s.get(k, 0.0))
            out.tokens[i], out.targets[i], out.steps[i] = int(s.get("tokens", 0)), s.get("targets", 0), s.get("steps", 0)
            out.started[i] = now - s.get("seconds", 0.0)
        return out

    def state(self, i: int) -> dict:
        """Member ``i``'s window as a checkpoint saves it."""
        host = self.read()
        return {"tokens": self.tokens[i], **{k: float(host[k][i]) for k in self.keys}, "targets": self.targets[i],
                "steps": self.steps[i], "seconds": time.perf_counter() - self.started[i]}

    def regroup(self, keep: list[int], joining: list[dict]) -> Windows:
        """The windows of members ``keep`` (their indices here) then of ``joining`` (saved states)."""
        out, n = Windows.of([{}] * len(keep) + joining, self.diverged.device), len(keep)
        index = torch.tensor(keep, dtype=torch.long, device=self.diverged.device)
        for k in self.keys:
            out.sums[k][:n] = self.sums[k][index]
        out.diverged[:n] = self.diverged[index]
        for name in ("tokens", "targets", "steps", "started", "has_norm"):
            getattr(out, name)[:n] = [getattr(self, name)[i] for i in keep]
        if self.grad_norm is not None:
            out.grad_norm = torch.cat([self.grad_norm[index], self.grad_norm.new_full((len(joining),), float("nan"))])
        return out

    def read(self) -> dict:
        """The device values on the host, read once (one wait for the device per check)."""
        if self._host is None:
            values = {**self.sums, "diverged": self.diverged}
            if self.grad_norm is not None:
                values["grad_norm"] = self.grad_norm
            self._host = {k: v.cpu() for k, v in values.items()}
        return self._host

    def add(self, out, step: int, world_size: int = 1) -> None:
        """A step's ``StepOut`` (``world_size``: a DDP process's sums stand for the processes')."""
        self._host = None
        summed = out.logged["loss"].detach().double()
        for k, v in out.logged.items():
            self.sums[k] += v.detach().double() * world_size if k == "loss" else v.detach().double()
        for i, (n_tokens, n_targets) in enumerate(zip(out.tokens, out.n_targets)):
            self.tokens[i] += n_tokens * world_size
            self.targets[i] += n_targets
            self.steps[i] += 1
        if out.grad_norm is not None:
            self.grad_norm = out.grad_norm.detach()
            self.has_norm = [True] * len(self.has_norm)
        first = torch.isnan(self.diverged[:, 0]) & ~torch.isfinite(summed)
        here = torch.stack([torch.full_like(summed, step), summed], dim=1)
        self.diverged = torch.where(first[:, None], here, self.diverged)

    def diverged_members(self) -> list[tuple[int, int, float]]:
        """``(i, step, loss)`` of every member whose loss was not finite (one read)."""
        div = self.read()["diverged"]
        return [(i, int(div[i, 0]), float(div[i, 1])) for i in range(div.shape[0]) if not math.isnan(div[i, 0])]

    def record(self, i: int, step: int, lr: float, logs: list) -> dict:
        """Member ``i``'s log record, its window then starting again; ``logs``: the
        objectives whose logged mean it holds (``Objective.logs``)."""
        host = self.read()
        elapsed = time.perf_counter() - self.started[i]
        steps = self.steps[i]
        record = {"step": step, "lr": lr, "train_loss": float(host["loss"][i]) / max(self.targets[i], 1),
                  "tokens_per_s": self.tokens[i] / max(elapsed, 1e-9), "steps_per_s": steps / max(elapsed, 1e-9)}
        if self.has_norm[i] and "grad_norm" in host:
            record["grad_norm"] = float(host["grad_norm"][i])
        for cls in logs:
            record[cls.logs] = float(host[cls.window_key()][i]) / steps
        self._reset(i)
        return record

    def _reset(self, i: int) -> None:
        """Member ``i``'s window empty again (on the device, and in the host copy already read)."""
        for values in (self.sums, self._host or {}):
            for k in self.keys:
                values[k][i] = 0.0
        for diverged in (self.diverged, (self._host or {}).get("diverged")):
            if diverged is not None:
                diverged[i] = float("nan")
        self.tokens[i] = self.targets[i] = self.steps[i] = 0
        self.has_norm[i] = False
        self.started[i] = time.perf_counter()
