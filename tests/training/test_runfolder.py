"""``runfolder.plan``: the one decision of what to do with a run folder, for every mode and
every state a folder can be in, and the one definition of a resumable config change."""

from __future__ import annotations

import json

import pytest

from sameloss import files
from sameloss.errors import UserError
from sameloss.training import pretrain
from sameloss.training.runfolder import plan, trajectory_changes

from helpers.safety import copy_run, tiny_config

FINISHED = ("name=finished", "steps=6", "checkpoints=[3]", "log_every=2")  # the `runs` fixture's settings
INTERRUPTED = ("name=interrupted", "steps=8", "checkpoints=[3]", "log_every=2", "save_every=100")


def _decision(p) -> tuple[str, str]:
    return p.action, p.status


def test_a_finished_run_in_each_mode(runs, tmp_path):
    run = copy_run(runs, "finished", tmp_path)
    same = tiny_config(*FINISHED)
    assert _decision(plan(run, same, "auto")) == ("reuse", "reused")
    assert plan(run, same, "resume").message == f"{run} is complete (step 6 of 6); nothing to do"
    assert _decision(plan(run, same, "fresh")) == ("replace", "trained")
    with pytest.raises(UserError, match="already holds a run; pass --resume"):
        plan(run, same, "new")
    # more steps at a constant lr: extended, in a Study and with --resume alike
    longer = tiny_config(*FINISHED, "steps=10", "log_every=5")
    assert _decision(plan(run, longer, "auto")) == ("resume", "extended")
    assert "steps" in plan(run, longer, "auto").message and "log_every" in plan(run, longer, "auto").message
    assert _decision(plan(run, longer, "resume")) == ("resume", "extended")
    # fewer steps than it has: refused, naming where it is
    with pytest.raises(UserError, match="is at step 6, past steps=4; pass --fresh to redo"):
        plan(run, tiny_config(*FINISHED, "steps=4"), "auto", fresh_hint="pass --fresh to redo")
    # a change of trajectory: refused, naming the key and its two values
    with pytest.raises(UserError, match=r"finished run .*config key 'optim.lr' was .* and is now 0.05"):
        plan(run, tiny_config(*FINISHED, "optim.lr=0.05"), "auto")


def test_steps_is_resumable_only_while_the_schedule_does_not_use_them(tmp_path):
    """The Study used to call a finished run with more steps "extendable" whatever the
    schedule, and the loop then refused it; now both read one rule."""
    decayed = tiny_config("name=d", "steps=6", "optim.decay_steps=3")
    pretrain(decayed, tmp_path / "d", progress=False)
    more = tiny_config("name=d", "steps=10", "optim.decay_steps=3")
    assert trajectory_changes({"steps": 6, "optim": {"decay_steps": 3}}, {"steps": 10, "optim": {"decay_steps": 3}}) \
        == ["config key 'steps' was 6 and is now 10"]
    assert trajectory_changes({"steps": 6}, {"steps": 10}) == []
    # the stretch at the final lr sits at the run's end: more steps move it (reproduce isoloss)
    assert trajectory_changes({"steps": 6, "optim": {"final_steps": 2}}, {"steps": 10, "optim": {"final_steps": 2}}) \
        == ["config key 'steps' was 6 and is now 10"]
    # evaluating at the kept checkpoints too changes no update: a run resumes across it
    assert trajectory_changes({"eval": {"at_checkpoints": False}}, {"eval": {"at_checkpoints": True}}) == []
    for mode in ("auto", "resume"):
        with pytest.raises(UserError, match="config key 'steps' was 6 and is now 10"):
            plan(tmp_path / "d", more, mode)


def test_an_interrupted_run_is_resumed_unless_its_trajectory_changed(runs, tmp_path):
    run = copy_run(runs, "interrupted", tmp_path)
    cfg = tiny_config(*INTERRUPTED)
    assert _decision(plan(run, cfg, "auto")) == ("resume", "resumed")
    assert _decision(plan(run, cfg, "resume")) == ("resume", "resumed")
    with pytest.raises(UserError, match="cannot resume the run in .*config key 'optim.lr'.*pass --fresh"):
        plan(run, tiny_config(*INTERRUPTED, "optim.lr=0.05"), "resume")


def test_a_run_killed_before_its_first_checkpoint(tmp_path):
    run = tmp_path / "r"
    run.mkdir()
    files.mark(run, files.RUN_MARKER, "sameloss run r")
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    cfg = tiny_config("name=r", "steps=6")
    assert _decision(plan(run, cfg, "auto")) == ("replace", "trained")  # nothing in it to keep
    with pytest.raises(UserError, match="nothing to resume"):
        plan(run, cfg, "resume")
    with pytest.raises(UserError, match="already holds a run"):
        plan(run, cfg, "new")


@pytest.mark.parametrize("mode", ["new", "resume", "fresh", "auto"])
def test_a_folder_sameloss_did_not_write_is_refused_in_every_mode(tmp_path, mode):
    folder = tmp_path / "r"
    folder.mkdir()
    (folder / "thesis.tex").write_text("mine")
    with pytest.raises(UserError, match="is not a sameloss run folder"):
        plan(folder, tiny_config("name=r"), mode)
    assert (folder / "thesis.tex").read_text() == "mine"


def test_an_empty_or_missing_folder_is_a_new_run_and_a_file_is_refused(tmp_path):
    cfg = tiny_config("name=r", "steps=6")
    assert _decision(plan(tmp_path / "missing", cfg, "new")) == ("train", "trained")
    (tmp_path / "empty").mkdir()
    assert _decision(plan(tmp_path / "empty", cfg, "auto")) == ("train", "trained")
    with pytest.raises(UserError, match="nothing to resume"):
        plan(tmp_path / "empty", cfg, "resume")
    (tmp_path / "file").write_text("x")
    with pytest.raises(UserError, match="exists and is not a run folder"):
        plan(tmp_path / "file", cfg, "auto")


def test_a_damaged_summary_is_named_not_passed_over(runs, tmp_path):
    run = copy_run(runs, "finished", tmp_path)
    (run / "summary.json").write_text("{not json")
    with pytest.raises(UserError, match=r"summary\.json: unreadable"):
        plan(run, tiny_config(*FINISHED), "auto")


def test_pretrain_carries_out_its_own_plan(runs, tmp_path):
    """Without a plan, ``pretrain`` plans from resume/fresh: a second plain call on a run is
    refused (it used to write a new config over the run and train on top of it)."""
    run = copy_run(runs, "finished", tmp_path)
    before = (run / "config.toml").read_bytes()
    with pytest.raises(UserError, match="already holds a run"):
        pretrain(tiny_config(*FINISHED, "optim.lr=0.05"), run, progress=False)
    assert (run / "config.toml").read_bytes() == before
    assert pretrain(tiny_config(*FINISHED), run, progress=False, resume=True) == \
        json.loads((run / "summary.json").read_text())["eval"]
