"""Shared fixtures."""

from __future__ import annotations

import pytest
import torch

from sameloss import config as configlib
from sameloss.training import PretrainConfig, pretrain
from sameloss.training.checkpoint import complete_checkpoints


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
