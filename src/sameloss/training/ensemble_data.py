"""The members' batches drawn ahead, in worker processes, for an ensemble on a GPU.

Drawing batch ``step`` of one seed (``data.global_batch``: sentences and masks, on the host)
takes about a millisecond for the tiny preset (``bench/bench_ensemble.py`` prints it); an
ensemble of S seeds needs S of them per step, which on a GPU would take longer than the
batched step itself.
Batches are a pure function of ``(seed, step)``, so worker processes (``torch.utils.data``'s
``DataLoader`` over an iterable of steps, worker k drawing steps ``first + k``, ``first + k + n``,
…, handed back in step order) draw them ahead while the GPU trains: the same batches, sooner.

Used by ``loop.Trainer`` under the ``vmap`` strategy on CUDA (on the CPU there is nothing to
overlap: one thread computes both). A stream is made for one set of seeds and steps and
replaced when members join or leave; if its workers fail (a language that cannot be drawn in
a forked process), the loop draws inline, as without it (``get`` returns ``None``).
"""

from __future__ import annotations

import os

from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from .data import global_batch


class _Steps(IterableDataset):
    """Steps ``first..last`` of ``seeds``, each worker its share (``draw``: batch size, mask
    rate, mask replacement)."""

    def __init__(self, language, seeds: list[int], first: int, last: int, draw: tuple):
        super().__init__()
        self.language, self.seeds, self.first, self.last, self.draw = language, seeds, first, last, draw

    def __iter__(self):
        info = get_worker_info()
        k, n = (info.id, info.num_workers) if info is not None else (0, 1)
        for step in range(self.first + k, self.last + 1, n):
            yield step, {s: global_batch(self.language, s, step, *self.draw) for s in self.seeds}


def default_workers() -> int:
    """Worker processes drawing ahead: a quarter of the host's cores, 1 to 4."""
    return max(1, min(4, (os.cpu_count() or 1) // 4))


class Ahead:
    """Batches of ``seeds`` for steps ``first..last`` (``draw``: ``global_batch``'s batch size,
    mask rate and mask replacement), drawn by ``workers`` processes."""

    def __init__(self, language, seeds: list[int], first: int, last: int, draw: tuple, workers: int | None = None):
        self.broken = False
        workers = default_workers() if workers is None else workers
        data = _Steps(language, sorted(set(seeds)), first, last, draw)
        self._it = iter(DataLoader(data, batch_size=None, num_workers=workers, prefetch_factor=4,
                                   multiprocessing_context="fork" if workers else None))

    def get(self, step: int) -> dict | None:
        """``{seed: MaskedBatch}`` of ``step``; ``None`` when the stream cannot give it."""
        if self.broken:
            return None
        try:
            got, batches = next(self._it)
        except Exception:  # noqa: BLE001 (a worker that cannot draw: the loop draws inline instead)
            self.close()
            return None
        if got != step:
            self.close()
            return None
        return batches

    def close(self) -> None:
        self.broken = True
        self._it = None  # the DataLoader's iterator shuts its workers down when collected
