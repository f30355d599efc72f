"""One folder per extension: a throw-away language and a throw-away recipe, written to a
temporary folder and registered through the public hooks (``sameloss.registry``, loaded
from ``SAMELOSS_PLUGINS``), are used by ``language describe``, ``pretrain`` and
``reproduce`` with no other edit; an unregistered language is refused, never built as a
PCFG."""

from __future__ import annotations

import csv
import os
import subprocess
import sys

import pytest

from sameloss.errors import UserError

PLUGIN = '''
"""A throw-away language (a tiny HMM of two sizes) and a throw-away recipe."""
from dataclasses import dataclass

from sameloss import registry
from sameloss.languages.hmm import HMM


class Toy(HMM):
    name = "toy"


SIZES = {"small": dict(n_states=2, n_words=3, length=4), "large": dict(n_states=3, n_words=5, length=6)}


def build(size="small", seed=None):
    return Toy.random(**SIZES[size], seed=seed or 0)


@dataclass(frozen=True)
class ToyPreset:
    steps: int
    device: str = "cpu"


TITLE = "A throw-away recipe"
PRESETS = {"smoke": ToyPreset(steps=4)}


def runs(p, language, seed):
    from sameloss.experiments.engine.runspec import RunSpec

    return [RunSpec(f"{language}-run", (("language.name", language), ("language.size", "small"), ("steps", p.steps),
                                        ("batch_size", 8), ("eval.n_sentences", 16), ("model.size", "micro"),
                                        ("seed", seed), ("device", p.device)), label="toy", group="toy")]


def measures():
    from sameloss.measures.run import MeasureSpec

    return MeasureSpec(loss=True, loss_sentences=16)


def units(setup, p):
    from sameloss.experiments.engine.declare import run_unit

    return [run_unit(spec, measures(), experiment="toyrecipe", language="toy") for spec in runs(p, "toy", setup.seed)]


def report(records, p):
    from sameloss.experiments.presets.common import measured_runs
    from sameloss.experiments.reports.document import Column, Section, Table

    section = Section(TITLE)
    for run in measured_runs(records, "toyrecipe"):
        section.runs.append(run.info)
        section.rows += run.rows
    section.tables.append(Table("toy models", [Column("KL", "kl", fmt=".3g")], section.rows))
    return section


registry.register_language("toy", build, sizes=tuple(SIZES), settings=("size", "seed"))
registry.register_recipe("toyrecipe", __name__, summary="a throw-away recipe")
'''


def sameloss(tmp_path, *args, plugins=True):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), *sys.path]), OMP_NUM_THREADS="1")
    env.pop("SAMELOSS_PLUGINS", None)
    if plugins:
        env["SAMELOSS_PLUGINS"] = "toyplugin"
    return subprocess.run([sys.executable, "-m", "sameloss.cli", *args], capture_output=True, text=True, env=env,
                          cwd=tmp_path)


def test_a_plugin_language_and_recipe_need_no_other_edit(tmp_path):
    (tmp_path / "toyplugin.py").write_text(PLUGIN)
    described = sameloss(tmp_path, "language", "describe", "toy", "--size", "large", "--n-sentences", "64")
    assert described.returncode == 0, described.stderr
    assert "language    toy (size large)" in described.stdout and "5 words" in described.stdout

    trained = sameloss(tmp_path, "pretrain", "language.name=toy", "language.size=small", "steps=3", "batch_size=8",
                       "model.size=micro", "eval.n_sentences=16", "--out", "runs", "--no-progress")
    assert trained.returncode == 0, trained.stderr
    assert 'name = "toy"' in (tmp_path / "runs" / "pretrain" / "config.toml").read_text()

    listed = sameloss(tmp_path, "reproduce", "--help")
    assert "toyrecipe" in listed.stdout and "a throw-away recipe" in listed.stdout
    reproduced = sameloss(tmp_path, "reproduce", "toyrecipe", "--scale", "smoke", "--out", "out", "--no-progress")
    assert reproduced.returncode == 0, reproduced.stderr
    root = tmp_path / "out" / "toyrecipe-smoke"
    assert "# A throw-away recipe" in (root / "report.md").read_text()
    rows = list(csv.DictReader((root / "results.csv").open()))
    assert [r["model"] for r in rows] == ["toy-run@4"] and float(rows[0]["kl"]) > 0

    # without the plugin nothing knows them: one line, exit code 2
    for args in (["language", "describe", "toy"], ["pretrain", "language.name=toy", "--out", "runs"],
                 ["reproduce", "toyrecipe", "--scale", "smoke"]):
        refused = sameloss(tmp_path, *args, plugins=False)
        assert refused.returncode == 2 and "toy" in refused.stderr, args
        assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr


def test_an_unregistered_language_is_refused_not_built_as_a_pcfg():
    from sameloss.languages import make_language

    with pytest.raises(UserError, match="unknown language 'pcfgg'; choose from"):
        make_language("pcfgg", preset="micro")
    with pytest.raises(UserError, match="language.grammar applies to the pcfg language only"):
        make_language("hmm", preset="micro", grammar="g.txt")


def test_a_plugin_that_cannot_be_imported_is_one_line(tmp_path):
    result = subprocess.run([sys.executable, "-m", "sameloss.cli", "language", "describe", "hmm"], capture_output=True,
                            text=True, env=dict(os.environ, SAMELOSS_PLUGINS="no_such_plugin_module"))
    assert result.returncode == 2
    assert result.stderr.strip() == ("sameloss: error: SAMELOSS_PLUGINS: cannot import plugin 'no_such_plugin_module' "
                                     "(No module named 'no_such_plugin_module')")
