"""Fault injection for the fault tests of ``reproduce`` (``tests/experiments/test_faults.py``).

Python imports ``sitecustomize`` at start-up from ``PYTHONPATH``: a test puts this folder
there for the CLI it starts, and so for its local workers, which inherit the environment.
``SAMELOSS_TEST_FAULT="RUN:STEP:ACTION[:FILE]"`` then acts in whichever process saves
checkpoint STEP (``first``: the first checkpoint it saves of that run) of the run folder
named RUN, right after the save:

* ``kill``: the process kills itself with SIGKILL (a worker killed mid-run);
* ``hang``: the process writes its pid and the step to FILE and waits for ever (until the
  test kills it, or its parent — and so, through ``launch.die_with``, it).

The hook waits for ``sameloss.training.checkpoint`` to be imported (an import hook), so a
process that never trains pays nothing and torch is not imported before its time.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import signal
import sys
import threading
from pathlib import Path

TARGET = "sameloss.training.checkpoint"
SPEC = os.environ.get("SAMELOSS_TEST_FAULT")


def _patch(module) -> None:
    run, step, action, *rest = SPEC.split(":", 3)
    original = module.save

    def save(run_dir, at, *args, **kwargs):
        path = original(run_dir, at, *args, **kwargs)
        if Path(run_dir).name == run and (step == "first" or at == int(step)):
            if action == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            elif action == "hang":
                Path(rest[0]).write_text(f"{os.getpid()} {at}")
                threading.Event().wait()
        return path

    module.save = save


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != TARGET:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return None
        exec_module = spec.loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            _patch(module)

        spec.loader.exec_module = exec_and_patch
        return spec


if SPEC:
    sys.meta_path.insert(0, _Finder())
