"""``sameloss plot RUN...`` (training curves of any run) and ``--format`` of ``reproduce``:
what is drawn, the files written, and the one-line errors of the house rules (a missing or
damaged metrics file, a file that is not sameloss's at ``--out``, a folder that does not
exist, a full disk)."""

from __future__ import annotations

import argparse
import json

import pytest
from helpers.datacli import error_line, leftovers, run_cli
from helpers.figures import check_data
from helpers.processes import Holder

from sameloss.cli import main
from sameloss.experiments.engine.core import Study, StudySettings
from sameloss.experiments.engine.folder import foreign_entries, listed_outputs
from sameloss.experiments.cli import add_reproduce_parser


@pytest.fixture
def runs(checkpoint, tmp_path):
    """A trained run (exact KL) and a corpus-like run (held-out cross-entropy, no KL)."""
    exact = checkpoint.parent.parent
    corpus = tmp_path / "corpus-run"
    corpus.mkdir()
    records = [{"step": s, "lr": 1e-3, "train_loss": 5.0 - s / 100, "tokens_per_s": 1.0} for s in (10, 20, 30)]
    records[-1]["eval"] = {"loss": 4.6, "loss_std": 0.1, "kl": None, "kl_std": None, "kl_note": "not defined"}
    (corpus / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return exact, corpus


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("sameloss: error: "), err
    return err[0]


def test_plot_draws_the_training_curves_of_runs(runs, tmp_path, capsys):
    exact, corpus = runs
    out = tmp_path / "curves.png"
    assert main(["plot", str(exact), str(corpus), "--out", str(out)]) == 0
    assert capsys.readouterr().out.splitlines() == [f"wrote {out}", f"wrote {tmp_path / 'curves.data.csv'}"]
    rows = check_data(tmp_path / "curves.data.csv")
    axes = [r for r in rows if r["kind"] == "axes"]
    assert [(a["y_quantity"], a["y_scale"]) for a in axes] == [("train_loss", "linear"), ("kl", "log"),
                                                                ("loss", "linear"), ("lr", "linear")]
    logged = [json.loads(line) for line in (exact / "metrics.jsonl").read_text().splitlines()]
    drawn = [(float(r["x"]), float(r["y"])) for r in rows if r["kind"] == "point" and r["panel"] == "0"
             and r["series"] == exact.name]
    assert drawn == [(float(r["step"]), r["train_loss"]) for r in logged]  # one line per run, named by its folder
    (kl,) = [float(r["y"]) for r in rows if r["kind"] == "point" and r["panel"] == "1"]
    assert kl == logged[-1]["eval"]["kl"]
    assert {r["series"] for r in rows if r["kind"] == "point" and r["panel"] == "2"} == {"corpus-run"}
    assert [float(r["y"]) for r in rows if r["kind"] == "ref-y"] == [pytest.approx(logged[-1]["eval"]["entropy"])]

    # a second call replaces its own files, and says so
    assert main(["plot", str(exact), "--out", str(out)]) == 0
    assert capsys.readouterr().out.splitlines() == [f"replaced {out}", f"replaced {tmp_path / 'curves.data.csv'}"]


def test_plot_formats(runs, tmp_path, capsys):
    exact, _ = runs
    assert main(["plot", str(exact), "--out", str(tmp_path / "a.pdf")]) == 0
    assert (tmp_path / "a.pdf").read_bytes().startswith(b"%PDF")
    assert main(["plot", str(exact), "--out", str(tmp_path / "b"), "--format", "svg,png"]) == 0
    assert {p.name for p in tmp_path.iterdir()} >= {"b.svg", "b.png", "b.data.csv", "a.data.csv"}


def test_plot_never_overwrites_a_file_it_did_not_write(runs, tmp_path, capsys):
    exact, _ = runs
    mine = tmp_path / "figure.png"
    mine.write_bytes(b"my own figure")
    assert main(["plot", str(exact), "--out", str(mine)]) == 2
    assert "figure.png exists and was not written by sameloss; not replacing it (choose another name, or pass " \
           "--force to replace it)" in _one_line(capsys)
    assert mine.read_bytes() == b"my own figure" and not (tmp_path / "figure.data.csv").exists()
    # nor a data file of the user's beside a new figure
    (tmp_path / "other.data.csv").write_text("my,numbers\n")
    assert main(["plot", str(exact), "--out", str(tmp_path / "other.png")]) == 2
    assert "other.data.csv exists and was not written by sameloss" in _one_line(capsys)
    assert not (tmp_path / "other.png").exists()
    # a link, never, not even with --force; the user's files with --force
    (tmp_path / "link.png").symlink_to(mine)
    assert main(["plot", str(exact), "--out", str(tmp_path / "link.png"), "--force"]) == 2
    assert "link.png is a symbolic link; sameloss never replaces a link with a file" in _one_line(capsys)
    assert mine.read_bytes() == b"my own figure" and (tmp_path / "link.png").is_symlink()
    assert main(["plot", str(exact), "--out", str(mine), "--force"]) == 0
    assert mine.read_bytes().startswith(b"\x89PNG") and capsys.readouterr().out.startswith(f"replaced {mine}")


def test_plot_errors_are_one_line(runs, tmp_path, capsys):
    exact, _ = runs
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    (damaged / "metrics.jsonl").write_text('{"step": 1, "train_loss": 2.0}\nnot json\n')
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "metrics.jsonl").write_text("")
    experiment = tmp_path / "figure1-smoke"
    (experiment / "runs").mkdir(parents=True)
    cases = [
        ([str(tmp_path / "nope")], f"no such run folder: {tmp_path / 'nope'}"),
        ([str(experiment)], f"{experiment} has no metrics.jsonl: not a run folder of sameloss pretrain; its runs "
                            f"are in {experiment / 'runs'}/*"),
        ([str(damaged)], f"{damaged / 'metrics.jsonl'}:2: not a metrics record"),
        ([str(empty)], f"{empty / 'metrics.jsonl'} holds no record yet"),
        ([str(exact), "--out", str(tmp_path / "no" / "x.png")], f"cannot write {tmp_path / 'no' / 'x.png'}: no folder"),
        ([str(exact), "--out", str(tmp_path / "x.jpg")], "sameloss writes .png, .pdf, .svg (not .jpg)"),
        ([str(exact), "--out", str(tmp_path / "x.pdf"), "--format", "png"], "ends in .pdf but --format asks for png"),
    ]
    for args, message in cases:
        assert main(["plot", *args]) == 2, args
        assert message in _one_line(capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus-run", "damaged", "empty", "figure1-smoke"]


def test_plot_on_a_full_disk_is_one_line_and_leaves_nothing(runs, tmp_path):
    exact, _ = runs
    result = run_cli(["plot", exact, "--out", tmp_path / "c.png"], fsize=4000)  # the PNG is larger
    assert "cannot write" in error_line(result) and "c.png" in error_line(result)
    assert not (tmp_path / "c.png").exists() and leftovers(tmp_path) == []


def test_plot_into_an_experiment_folder_is_listed_as_sameloss_and_waits_for_its_lock(runs, tmp_path, capsys):
    """The files are sameloss's to --fresh (listed in the marker); while another process
    writes the experiment, the plot is refused naming it, and nothing is written."""
    exact, _ = runs
    root = tmp_path / "steps-smoke"
    Study(root, StudySettings(progress=False)).close()  # a marked, empty experiment folder
    with Holder(root, tmp_path / "scratch") as holder:
        assert main(["plot", str(exact), "--out", str(root / "curves.png")]) == 2
        assert f"pid {holder.pid}" in _one_line(capsys)
    assert sorted(p.name for p in root.iterdir()) == [".sameloss-experiment"]
    assert main(["plot", str(exact), "--out", str(root / "curves.png")]) == 0
    assert listed_outputs(root) == {"curves.png", "curves.data.csv"} and foreign_entries(root) == []


@pytest.mark.parametrize("args", [["plot", "nope", "--format", "pdf"], ["reproduce", "steps", "--format", "pdf"]])
def test_a_bad_omp_num_threads_is_our_line_only_with_figure_options(args, tmp_path):
    """Building the parser (plot's default name) and reading --format import no torch, so
    OMP_NUM_THREADS is checked before libgomp reads it (and prints its own lines)."""
    result = run_cli(args, cwd=tmp_path, env={"OMP_NUM_THREADS": "abc"})
    assert "OMP_NUM_THREADS='abc'" in error_line(result) and "libgomp" not in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_reproduce_takes_figure_formats():
    parser = argparse.ArgumentParser()
    add_reproduce_parser(parser.add_subparsers(dest="command"))
    assert parser.parse_args(["reproduce", "steps"]).formats == ("png",)
    assert parser.parse_args(["reproduce", "steps", "--format", "pdf,png"]).formats == ("pdf", "png")


def test_a_bad_format_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["reproduce", "steps", "--format", "gif"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown figure format 'gif'" in err[0]
