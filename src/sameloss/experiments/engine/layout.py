"""Where everything of an experiment lives, in one place: the experiment folder's name and
the folders inside it. ``core.Study`` (which writes them), ``plan.Record`` (which names
them without writing), ``declare`` (a unit's folder), ``folder.py`` (what sameloss owns
there) and ``orchestrate.Job`` (``reproduce``, ``plan``) all ask here.

``<out>/<experiment>-<scale>[-seed<N>][<recipe's suffix>][-<dropout draws>]/``::

    runs/<run>/                       a pre-training run (``training.runfolder``)
    embedded/<run>-step<N>-into-<shape>[-optimizer]/   a checkpoint embedded into a larger shape
    seeds/seed<N>/  or  seeds/<group>/seed<N>/          a seed's study, laid out the same way
    measured.csv, costs.csv           the engine's tidy tables of the study's records
    cost.json                         a seed unit's CPU seconds, kept from the call that computed it
"""

from __future__ import annotations

from pathlib import Path

RUNS, EMBEDDED, SEEDS = "runs", "embedded", "seeds"
# the study's tidy tables at the top of its folder: every tagged measured row with its tags, and
# every unit's CPU seconds per part (``orchestrate.write_tables``)
MEASURED_TABLE, COSTS_TABLE = "measured.csv", "costs.csv"
# a seed unit's CPU as the call that computed it measured it (``walk.keep_first_cost``)
COST_FILE = "cost.json"


def experiment_dir_name(experiment: str, scale: str, seed: int) -> str:
    """``<experiment>-<scale>``, and ``-seed<N>`` for another ``--seed``."""
    return f"{experiment}-{scale}" + (f"-seed{seed}" if seed else "")


def experiment_dir(out: str | Path, experiment: str, scale: str, seed: int, suffix: str = "",
                   dropout_draws: str = "global") -> Path:
    """The experiment folder under ``out``: its name (``experiment_dir_name``), the recipe's
    ``folder_suffix`` of the preset (isoloss's languages, ``-even``) and, for runs with
    keyed dropout masks, ``-keyed`` (other runs: another folder)."""
    return Path(out) / (experiment_dir_name(experiment, scale, seed) + suffix
                        + ("" if dropout_draws == "global" else f"-{dropout_draws}"))


def run_dir(root: str | Path, run: str) -> Path:
    """The folder of run ``run`` in the study folder ``root``."""
    return Path(root) / RUNS / run


def run_folder(run: str) -> str:
    """``runs/<run>``: a run's folder relative to its study (a unit's lock)."""
    return f"{RUNS}/{run}"


def embedded_name(run: str, step: int, shape: str, optimizer: str = "fresh") -> str:
    """The folder (under ``embedded/``) of run ``run``'s checkpoint at ``step`` embedded into
    ``shape`` (``declare.Embedded.shape``), ``-optimizer`` when its moments are mapped too."""
    return f"{run}-step{step}-into-{shape}" + ("-optimizer" if optimizer != "fresh" else "")


def embedded_dir(root: str | Path, name: str) -> Path:
    """The folder of the embedded checkpoint ``name`` (``embedded_name``) in the study folder ``root``."""
    return Path(root) / EMBEDDED / name


def seed_folder(seed: int, group: str = "") -> str:
    """``seeds/seed<N>`` (``group``: ``seeds/<group>/seed<N>``): a seed's study folder,
    relative to the experiment folder."""
    return f"{SEEDS}/{group}/seed{seed}" if group else f"{SEEDS}/seed{seed}"
