"""Shared fixtures, and the caches every test (and every process a test starts) writes to:
a folder of this test session's own, never the user's home (``pytest_configure``)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

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


# Where sameloss and the libraries it drives keep caches outside a run folder (issue 63:
# the suite wrote a causal language into the user's ~/.cache/sameloss, and a test passed or
# failed by what an earlier command had left there). Set before any test module is imported
# (tests/helpers/processes.py copies os.environ for the child processes it starts) and
# inherited by every child process and xdist worker.
CACHE_VARIABLES = {
    "SAMELOSS_DATA": "sameloss-data",  # the recipes' generators and stand-in tasks, `data fetch`
    "XDG_CACHE_HOME": "cache",  # ~/.cache of everything that follows the XDG rule (wandb, platformdirs)
    "MPLCONFIGDIR": "matplotlib",  # matplotlib's font cache
    "TORCHINDUCTOR_CACHE_DIR": "torchinductor",
    "TRITON_CACHE_DIR": "triton",
    "TORCH_HOME": "torch",
    "HF_HOME": "huggingface",  # the hub, datasets
    "WANDB_DIR": "wandb",
    "WANDB_CACHE_DIR": "wandb-cache",
    "WANDB_CONFIG_DIR": "wandb-config",
    "WANDB_DATA_DIR": "wandb-data",
}
SESSION_CACHES = "SAMELOSS_TEST_CACHES"  # the folder, passed on to xdist workers


def pytest_configure(config):
    root = os.environ.get(SESSION_CACHES)
    if root is None:  # the first process of the session: it makes the folder and removes it
        root = tempfile.mkdtemp(prefix="sameloss-test-caches-")
        os.environ[SESSION_CACHES] = root
        config.stash[_OWNED] = root
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")  # a worker's own: none shares a cache build
    for variable, name in CACHE_VARIABLES.items():
        path = Path(root) / worker / name
        path.mkdir(parents=True, exist_ok=True)
        os.environ[variable] = str(path)


def pytest_unconfigure(config):
    root = config.stash.get(_OWNED, None)
    if root is not None:
        shutil.rmtree(root, ignore_errors=True)
        os.environ.pop(SESSION_CACHES, None)


_OWNED = pytest.StashKey[str]()


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

