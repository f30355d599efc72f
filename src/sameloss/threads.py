"""How many CPU threads torch uses: one policy for every compute command.

``--threads N`` wins; otherwise ``OMP_NUM_THREADS`` when it is set; otherwise
``DEFAULT_THREADS`` = 1. Why 1 and not torch's own default (one thread per core): the
models and batches of the CPU scales are small, so each operation is a few microseconds
of work between OpenMP barriers. When another process takes a core, one of torch's
threads is descheduled and every barrier waits for it: training collapsed from 33 to
0.27 steps/s on a shared 2-core machine (issue 10). One thread has no barrier to wait
on and only loses its share of the CPU. ``bench/bench_threads.py`` (tiny transformer,
micro PCFG, batch 256, 2-core CPU shared with other jobs, load average 1.7-3.1) measured
1 thread vs 2: alone 23.4 vs 32.2 steps/s (one thread costs 28%); beside one niced busy
process 21.7 vs 27.5; beside two, 20.1 vs 0.65 steps/s (2 threads collapse 50x, one
thread slows 1.2x). A bounded loss against an unbounded one: pass ``--threads`` (or set
``OMP_NUM_THREADS``) on a machine whose cores are yours.
"""

from __future__ import annotations

import argparse
import contextlib
import os

from .errors import UserError

ENV = "OMP_NUM_THREADS"
DEFAULT_THREADS = 1
# more threads than any machine here has cores (torch overflows past 2^31 - 1 with a
# traceback, and thousands of OpenMP threads only wait on each other)
MAX_THREADS = 1024

_interop_tried = False


def parse_threads(text: str) -> int:
    """An argparse type for ``--threads``: a whole number >= 1 (one-line usage error otherwise)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= MAX_THREADS:
        raise argparse.ArgumentTypeError(f"expected a whole number of threads >= 1 (at most {MAX_THREADS}), "
                                         f"got {text!r}")
    return value


def add_threads_argument(parser: argparse.ArgumentParser) -> None:
    """Add ``--threads N`` to a compute command's parser (the same flag on every command)."""
    parser.add_argument("--threads", type=parse_threads, default=None, metavar="N",
                        help=f"CPU threads for torch (default: ${ENV} if set, else {DEFAULT_THREADS}: "
                             "more are faster only while the cores are otherwise idle, and stall each other "
                             "when another process runs)")


def threads_from_env(environ=None) -> int | None:
    """The thread count ``OMP_NUM_THREADS`` asks for, or None when it is unset or blank.

    OpenMP allows a list per nesting level (``4,2``); torch's pool is the outer level."""
    text = (os.environ if environ is None else environ).get(ENV, "").strip()
    if not text:
        return None
    first = text.split(",")[0].strip()
    try:
        value = int(first)
    except ValueError:
        value = 0
    if value < 1:
        raise UserError(f"{ENV}={text!r} is not a whole number of threads >= 1 (unset it or pass --threads N)")
    if value > MAX_THREADS:
        raise UserError(f"{ENV}={text!r} asks for more than {MAX_THREADS} threads (unset it or pass --threads N)")
    return value


def check_env_before_torch(requested: int | None = None, environ=None) -> None:
    """Make ``OMP_NUM_THREADS`` one that libgomp can read, before torch is imported:
    libgomp parses it when torch loads it and prints two lines of its own for a value it
    cannot read (``abc``, ``0``, a blank), before any error of ours. ``--threads N``
    (``requested``) replaces it by N — the count this process uses, which its child
    processes inherit too; a blank value means unset and is removed; any other value that
    is not a whole number >= 1 is one ``UserError`` line. The variable is changed only in
    a process that has not imported torch yet (where it still matters)."""
    import sys

    environ = os.environ if environ is None else environ
    if requested is None:
        threads_from_env(environ)  # one line for a value that is not a thread count
    if "torch" in sys.modules:
        return
    if requested is not None:
        environ[ENV] = str(requested)
    elif ENV in environ and not environ[ENV].strip():
        del environ[ENV]


def configure_threads(requested: int | None = None, environ=None) -> int:
    """Set torch's intra-op threads (and, once per process, its inter-op threads) by the
    policy above; returns the number of intra-op threads now in use."""
    global _interop_tried
    import torch

    if requested is not None and (isinstance(requested, bool) or not isinstance(requested, int) or requested < 1):
        raise UserError(f"--threads must be a whole number >= 1, got {requested!r}")
    n = requested if requested is not None else threads_from_env(environ)
    if n is None:
        n = DEFAULT_THREADS
    torch.set_num_threads(n)
    if not _interop_tried:
        _interop_tried = True
        # torch allows this only once per process and only before any inter-op work has
        # started (it raises RuntimeError otherwise, e.g. when cli.main runs twice in one
        # process). The inter-op pool is idle in sameloss's code paths, so a pool that
        # is already sized is harmless: keep it.
        try:
            torch.set_num_interop_threads(n)
        except RuntimeError:
            pass
    return torch.get_num_threads()


@contextlib.contextmanager
def for_children(n: int):
    """``OMP_NUM_THREADS=n`` in the environment of the processes started in the block
    (``experiments.launch``'s local workers): libgomp reads it when a child imports torch,
    before the child's own ``configure_threads`` runs — a spawned worker is a fresh
    interpreter, which torch would start at one thread per core, and two such workers
    beside each other (or beside any busy process) collapse ~50× on a 2-core CPU (see
    above). The variable is restored afterwards."""
    before = os.environ.get(ENV)
    os.environ[ENV] = str(n)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = before
