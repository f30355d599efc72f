"""Shared fixtures."""

from __future__ import annotations

import pytest
import torch

from sameloss import config as configlib
from sameloss.training import PretrainConfig, pretrain
from sameloss.training.checkpoint import complete_checkpoints

from helpers.safety import tiny_config as _safety_config


@pytest.fixture(autouse=True, scope="session")
def one_thread():
    """The tests use tiny tensors, where intra-op threads only add synchronisation —
    and on a shared 2-core machine they slow tiny ops down many times over."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(autouse=True, scope="session")
def private_data_cache(tmp_path_factory):
    """The recipes build generators and stand-in tasks in the data cache
    (``$SAMELOSS_DATA``, default ``~/.cache/sameloss/data``): the tests use their own, never
    the user's."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SAMELOSS_DATA", str(tmp_path_factory.mktemp("sameloss_data")))
        yield


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory):
    """A micro transformer pre-trained for 120 steps on the tiny HMM."""
    run = tmp_path_factory.mktemp("micro_hmm_run")
    cfg = configlib.load(PretrainConfig, None, [
        "steps=120", "batch_size=64", "model.size=micro", "language.name=hmm", "eval.every=0",
        "eval.n_sentences=64", "save_every=1000", "log_every=40", "optim.warmup_steps=20", "device=cpu"])
    pretrain(cfg, run, progress=False)
    return complete_checkpoints(run)[-1]


@pytest.fixture(scope="session")
def steps_smoke(tmp_path_factory):
    """``sameloss reproduce steps --scale smoke`` once per session: the folder holding
    ``steps-smoke/`` (tests copy it before changing anything)."""
    from sameloss.cli import main

    out = tmp_path_factory.mktemp("steps_smoke")
    assert main(["reproduce", "steps", "--scale", "smoke", "--out", str(out), "--no-progress"]) == 0
    return out


@pytest.fixture(scope="session")
def runs(tmp_path_factory):
    """``finished``: 6 steps with checkpoints 3 and 6 and summary.json; ``interrupted``:
    8 steps stopped after step 6, checkpoints 3 and 6, no summary."""
    root = tmp_path_factory.mktemp("safety_runs")
    pretrain(_safety_config("name=finished", "steps=6", "checkpoints=[3]", "log_every=2"), root / "finished",
             progress=False)
    pretrain(_safety_config("name=interrupted", "steps=8", "checkpoints=[3]", "log_every=2", "save_every=100"),
             root / "interrupted", progress=False, stop_after=6)
    return root

