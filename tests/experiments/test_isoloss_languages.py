"""The iso-loss study on any language (issue 24): ``--language NAME[:SIZE][:key=value,...]``
parsed and checked before anything runs, the span probe and the oracle of a PCFG span
task, a study of several languages (one folder per language's seeds, files named by the
language) ending in the replication table, the inverse-variance pooling against hand
computation, and a held-out language without headroom reported as such."""

from __future__ import annotations

import csv
import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from sameloss.cli import main
from sameloss.errors import UserError
from sameloss.experiments.stats import paired
from sameloss.experiments import Job, Options, reproduce
from sameloss.experiments.stats.paired import UNINFORMATIVE
from sameloss.experiments.stats.replication import (REPLICATION_UNINFORMATIVE, agreement, replication,
    replication_verdict)
from sameloss.experiments.recipes import isoloss
from sameloss.experiments.reports.document import Section
from sameloss.experiments.stats.inference import (DEGENERATE, DETECTED, DETECTED_AGAINST, EQUIVALENT, INCONCLUSIVE,
    minimum_detectable_effect)
from sameloss.experiments.stats.pooling import pool_inverse_variance, pooled_mde, pooled_verdict
from sameloss.languages import PCFG, make_language
from sameloss.measures.representations import reference_representation

from .test_reproduce import check_tables, run_cli


def read(path):
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


# ---- --language ---------------------------------------------------------------------------------
def test_a_language_is_named_by_name_size_and_settings():
    c = isoloss.parse_language("pcfg:headroom")
    assert (c.name, c.size, c.task, c.seed, c.params) == ("pcfg", "headroom", "span-1", None, None)
    assert isoloss.task_span(c) == (0, 1)
    c = isoloss.parse_language("hmm")  # the size defaults to headroom, the task to the HMM's task-5
    assert c == isoloss.PRESETS["tiny"].choice and isoloss.task_span(c) == (4, 5)
    c = isoloss.parse_language("hmm:micro:seed=7,task=task-3")
    assert (c.size, c.seed, c.task, c.tag) == ("micro", 7, "task-3", "hmm-micro-seed7-task-3")
    assert isoloss.task_span(c) == (2, 3)
    assert isoloss.parse_language(c.spec) == c  # a spec reads back as the same language
    # constructor settings: a language in no preset (HMM.random's keywords over the size's own)
    c = isoloss.parse_language("hmm:micro:n_states=5,emission_concentration=0.8,seed=3")
    assert (c.seed, c.params, c.task) == (3, "n_states=5,emission_concentration=0.8", "task-5")
    cfg = isoloss.base_run(isoloss.with_languages(isoloss.PRESETS["smoke"], [c.spec]), 0).config()
    assert (cfg.language.size, cfg.language.seed, cfg.language.params) == ("micro", 3, c.params)
    from sameloss.languages import HMM
    from sameloss.languages.hmm import PRESETS as HMM_SIZES
    built = make_language("hmm", preset="micro", seed=3, params=c.params)
    want = HMM.random(**{**HMM_SIZES["micro"], "seed": 3, "n_states": 5, "emission_concentration": 0.8})
    assert torch.equal(built.emission, want.emission) and built.transition.shape == (5, 5)
    with pytest.raises(UserError, match="takes no 'n_hidden'"):
        isoloss.parse_language("hmm:micro:n_hidden=5")
    # the preset's own language gives the probes the study always had: the hidden state's position
    p = isoloss.PRESETS["quick"]
    assert dict(p.fewshot(0).views)["pos"].positions == (4,)
    assert isoloss.folder_suffix(p) == "" and isoloss.folder_suffix(isoloss.with_languages(p, ["hmm:headroom"])) == ""
    assert isoloss.folder_suffix(isoloss.with_languages(p, ["pcfg"])) == "-pcfg-headroom"
    both = isoloss.with_languages(p, ["hmm:headroom", "pcfg:headroom"])
    assert isoloss.folder_suffix(both) == "-hmm-headroom+pcfg-headroom"
    studies = isoloss.language_studies(both)
    assert [(q.tag, q.task, q.span) for q in studies] == [("hmm-headroom", "task-5", (4, 5)),
                                                          ("pcfg-headroom", "span-1", (0, 1))]
    # a language's runs carry its draw: another seed of the size is another language
    seed7 = isoloss.with_languages(p, ["hmm:headroom:seed=7"])
    assert isoloss.base_run(seed7, 0).config().language.seed == 7
    assert isoloss.base_run(p, 0).config().language.seed is None


@pytest.mark.parametrize("spec, words", [
    ("nope", "unknown language 'nope'"),
    ("hmm:huge", "hmm has no size 'huge'"),
    ("hmm:headroom:seed=x", "seed='x' is not a number"),
    ("hmm:headroom:seed=1.5", "seed must be a non-negative integer"),
    ("hmm:headroom:task=task-3,task=task-5", "give task=NAME once"),
    ("hmm:headroom:seed", "'seed' is not key=value"),
    ("hmm:headroom:seed=1,seed=2", "seed is given twice"),
    ("hmm:headroom:task=task-99", "has no task 'task-99'"),
    ("pcfg:headroom:task=A", "spans to the end of each sentence"),
    ("hmm:a:b:c", "expected NAME[:SIZE]"),
])
def test_a_bad_language_is_one_line_naming_it(spec, words):
    with pytest.raises(UserError) as err:
        isoloss.parse_language(spec)
    assert words in str(err.value) and "\n" not in str(err.value)
    assert f"--language {spec!r}" in str(err.value)


def test_language_is_refused_by_a_recipe_that_runs_its_own(tmp_path):
    with pytest.raises(UserError, match="the option is isoloss's"):
        run_cli(["steps", "--scale", "smoke", "--out", str(tmp_path), "--language", "hmm"])
    with pytest.raises(UserError, match="unknown language 'klingon'"):
        run_cli(["isoloss", "--scale", "smoke", "--out", str(tmp_path), "--language", "klingon"])
    assert not any(tmp_path.iterdir())  # refused before any file


# ---- the span probe's oracle ----------------------------------------------------------------------
def test_the_oracle_of_a_pcfg_span_task_is_its_posterior_at_the_span():
    language = make_language("pcfg", preset="headroom")
    task = language.tasks["span-1"]
    tokens = language.sample(50, torch.Generator().manual_seed(0)).tokens
    h = reference_representation("oracle", language, None, tokens, task=task)
    assert h.shape == (50, tokens.shape[1], task.n_classes)
    assert torch.equal(h[:, 0], task.posterior(tokens).float())
    assert not h[:, 1:].any()
    # its argmax is the label the probes learn (the oracle knows the answer)
    keep = task.label(language.sample(50, torch.Generator().manual_seed(0))) >= 0
    labels = task.label(language.sample(50, torch.Generator().manual_seed(0)))
    assert torch.equal(h[keep, 0].argmax(1), labels[keep])
    # without a task there is no oracle for a PCFG: one line
    with pytest.raises(UserError, match="no true posteriors"):
        reference_representation("oracle", language, None, tokens)
    # the HMM keeps its hidden states' posteriors at every position
    hmm = make_language("hmm", preset="headroom")
    tok = hmm.sample(20, torch.Generator().manual_seed(1)).tokens
    assert torch.equal(reference_representation("oracle", hmm, None, tok, task=hmm.tasks["task-5"]),
                       hmm.posteriors(tok).float())
    assert isinstance(language, PCFG)


# ---- pooling and replication ----------------------------------------------------------------------
# statsmodels warns that it has no sample sizes for the single studies' own intervals (not compared here)
@pytest.mark.filterwarnings("ignore::statsmodels.tools.sm_exceptions.InvalidTestWarning")
def test_inverse_variance_pooling_against_hand_computation_and_statsmodels():
    m, se = [1.0, 3.0, 2.0], [0.5, 1.0, 0.25]
    w = [1 / s ** 2 for s in se]
    assert w == [4.0, 1.0, 16.0]
    fixed = (4 * 1 + 1 * 3 + 16 * 2) / 21
    q = 4 * (1 - fixed) ** 2 + 1 * (3 - fixed) ** 2 + 16 * (2 - fixed) ** 2
    c = 21 - (16 + 1 + 256) / 21
    tau2 = max(0.0, (q - 2) / c)
    wr = [1 / (s ** 2 + tau2) for s in se]
    random = sum(a * b for a, b in zip(wr, m)) / sum(wr)
    # Hartung–Knapp–Sidik–Jonkman: the weighted residual variance, a t interval on k − 1 = 2 df
    hk = math.sqrt(sum(a * (b - random) ** 2 for a, b in zip(wr, m)) / (2 * sum(wr)))
    p = pool_inverse_variance(m, se)
    assert p.fixed == pytest.approx(fixed) and p.fixed_se == pytest.approx(21 ** -0.5)
    assert p.fixed_low == pytest.approx(fixed - 1.959964 * 21 ** -0.5, rel=1e-6)
    assert p.q == pytest.approx(q) and p.i2 == pytest.approx(max(0.0, (q - 2) / q))
    assert p.tau2 == pytest.approx(tau2) and p.random == pytest.approx(random)
    assert p.random_se == pytest.approx(hk) and p.random_low == pytest.approx(random - 4.302653 * hk, rel=1e-6)
    from scipy.stats import chi2
    assert p.q_p == pytest.approx(chi2.sf(q, 2))
    # statsmodels (a test dependency): DerSimonian–Laird, and its "random effect wls" row is HKSJ
    from statsmodels.stats.meta_analysis import combine_effects
    rng = np.random.default_rng(4)
    for k in (2, 3, 6):
        # heterogeneous draws: statsmodels leaves a negative DerSimonian–Laird τ² untruncated (the
        # estimator truncates it at 0, as pool_inverse_variance does), so compare where τ² > 0
        mm, ss = rng.normal(0.5, 1.5, k), rng.uniform(0.1, 0.3, k)
        ours = pool_inverse_variance(mm, ss)
        fit = combine_effects(mm, ss ** 2, method_re="dl", use_t=True)
        assert fit.tau2 > 0 and ours.tau2 == pytest.approx(fit.tau2, rel=1e-10)
        ref = fit.summary_frame()
        hksj = ref.loc["random effect wls"]
        assert ours.random == pytest.approx(hksj["eff"], rel=1e-10)
        assert (ours.random_low, ours.random_high) == pytest.approx((hksj["ci_low"], hksj["ci_upp"]), rel=1e-8)
        assert ours.fixed == pytest.approx(ref.loc["fixed effect", "eff"], rel=1e-10)
    # equal estimates: no heterogeneity, random = fixed
    same = pool_inverse_variance([0.4, 0.4], [0.1, 0.2])
    assert same.q == pytest.approx(0) and same.i2 == 0 and same.tau2 == 0 and same.random == pytest.approx(0.4)
    with pytest.raises(ValueError):
        pool_inverse_variance([1.0], [0.0])


def test_the_pooled_verdict_and_the_planned_pooled_mde():
    """The verdict about languages reads the HKSJ interval; the planned pooled MDE (L languages ×
    m seeds, within-language sd, between-language τ) is the effect the HKSJ test detects 80 % of
    the time — checked by simulating whole cross-language studies through ``pool_inverse_variance``."""
    # five languages agreeing on +1 with small errors: detected; near 0 with small errors: within ±δ
    assert pooled_verdict(pool_inverse_variance([1.0, 1.1, 0.9, 1.2, 1.0], [0.1] * 5), 1, 0.35)[0] == DETECTED
    assert pooled_verdict(pool_inverse_variance([1.0, 1.1, 0.9, 1.2, 1.0], [0.1] * 5), -1, 0.35)[0] \
        == DETECTED_AGAINST
    assert pooled_verdict(pool_inverse_variance([0.02, -0.03, 0.01, 0.0, 0.04], [0.05] * 5), 1, 0.35)[0] \
        == EQUIVALENT
    verdict, mde = pooled_verdict(pool_inverse_variance([0.3, -0.2], [0.2, 0.2]), 1, 0.35)
    assert verdict == INCONCLUSIVE and mde > 1  # two languages: t on one degree of freedom
    L, m, sd, tau = 5, 5, 0.46, 0.1
    mde = pooled_mde(sd, tau, L, m)
    assert mde == pytest.approx(minimum_detectable_effect(math.sqrt(tau ** 2 + sd ** 2 / m), L))
    assert pooled_mde(sd, tau, L, 50) < mde < pooled_mde(sd, tau, L, 2)  # more seeds help, less than languages
    assert pooled_mde(sd, tau, 8, m) < pooled_mde(sd, tau, L, 2 * m)
    rng = np.random.default_rng(0)
    hits = 0
    for _ in range(2000):
        truth = mde + rng.normal(0, tau, L)  # each language's true effect
        est = truth + rng.normal(0, sd / math.sqrt(m), L)  # its estimate over m seeds
        pooled = pool_inverse_variance(est, np.full(L, sd / math.sqrt(m)))
        hits += pooled_verdict(pooled, 1, 0.35)[0] == DETECTED
    assert hits / 2000 == pytest.approx(0.80, abs=0.035)


def test_the_replication_verdict_gives_the_pooled_verdict_then_each_languages_agreement():
    both = "2 of 2 languages detect it in the paper's direction"
    assert agreement([DETECTED, DETECTED]) == both
    assert agreement([DETECTED_AGAINST, DETECTED_AGAINST]) == "2 of 2 languages detect it against the paper"
    # a rule asking every language to detect has power 0.8^k: the agreement is said, not a verdict
    assert agreement([DETECTED, INCONCLUSIVE, DETECTED]) == \
        "2 of 3 languages detect it in the paper's direction, 1 inconclusive"
    assert replication_verdict(DETECTED, [DETECTED, INCONCLUSIVE, DETECTED]) == \
        f"pooled: {DETECTED} — 2 of 3 languages detect it in the paper's direction, 1 inconclusive"
    # a degenerate language is called degenerate, one without headroom so, one with a pair too few so
    assert agreement([DETECTED, DEGENERATE]) == \
        "1 of 2 languages detect it in the paper's direction, 1 degenerate (the differences have no spread)"
    assert agreement([DETECTED, UNINFORMATIVE, "no interval: 1 pair(s)"]) == \
        "1 of 3 languages detect it in the paper's direction, 1 no interval (n ≤ 1 pairs), 1 without headroom"
    assert agreement([DETECTED, DETECTED_AGAINST, DETECTED]).endswith("(contradicted: detections in both directions)")
    assert agreement([EQUIVALENT, INCONCLUSIVE]) == "1 of 2 languages show no effect beyond ±δ, 1 inconclusive"


def _diff(comparison, point, mean, sd, n, verdict):
    half = 2.0 * sd / math.sqrt(n)
    return {"comparison": comparison, "point": point, "family": "primary", "mean": mean, "sd": sd, "n_used": n,
            "t_low": mean - half, "t_high": mean + half, "verdict": verdict, "expected_sign": 1, "margin": 0.35}


def test_the_replication_table_pools_the_languages_with_headroom():
    a = {"language": "hmm:headroom", "tag": "hmm", "ok": True, "tests": ["size @ late", "noreg @ late"],
         "diffs": [_diff("size", "late", 1.0, 0.8, 16, DETECTED), _diff("noreg", "late", 0.1, 0.4, 16, EQUIVALENT)]}
    b = {"language": "pcfg:headroom", "tag": "pcfg", "ok": True, "tests": ["size @ late", "noreg @ late"],
         "diffs": [_diff("size", "late", 0.6, 1.2, 9, DETECTED), _diff("noreg", "late", -0.3, 0.6, 9, INCONCLUSIVE)]}
    c = {"language": "hmm:micro", "tag": "micro", "ok": False, "tests": ["size @ late", "noreg @ late"], "diffs": []}
    section = Section("")
    out = {r["test"]: r for r in replication(section, [a, b])}
    size = out["size @ late"]
    assert size["replication"] == replication_verdict(size["pooled_verdict"], [DETECTED, DETECTED])
    assert size["replication"].endswith("2 of 2 languages detect it in the paper's direction")
    assert size["pooled_languages"] == 2
    # each language's standard error is sd/√n of its used pairs (not backed out of its t interval)
    ref = pool_inverse_variance([1.0, 0.6], [0.8 / 4, 1.2 / 3])
    assert size["pooled"] == pytest.approx(ref.fixed) and size["i2"] == pytest.approx(ref.i2)
    assert (size["random_low"], size["random_high"]) == pytest.approx((ref.random_low, ref.random_high))
    assert size["hmm_verdict"] == DETECTED and size["pcfg_mean"] == 0.6
    # the verdict about languages comes from the HKSJ interval (two languages: t on 1 df, wide)
    assert size["pooled_verdict"] == pooled_verdict(ref, 1, 0.35)[0] == INCONCLUSIVE
    assert section.tables[0].columns[0].key == "pooled_verdict"  # the table leads with it
    assert out["noreg @ late"]["replication"].endswith("1 of 2 languages show no effect beyond ±δ, 1 inconclusive")
    assert section.files["replication.csv"] and section.tables[0].source == "replication.csv"
    # a language without headroom is listed as uninformative and not pooled: one language left replicates nothing
    out = {r["test"]: r for r in replication(Section(""), [a, c])}
    assert out["size @ late"]["micro_verdict"] == UNINFORMATIVE and out["size @ late"]["pooled_languages"] == 1
    assert out["size @ late"]["replication"] == (f"pooled: {REPLICATION_UNINFORMATIVE} — 1 of 2 languages detect it "
                                                 "in the paper's direction, 1 without headroom")
    assert math.isnan(out["size @ late"]["pooled"])  # one language with headroom: nothing to pool
    # both languages detect against the paper: said so
    against = [dict(s, diffs=[_diff("size", "late", -1.0, 0.8, 16, DETECTED_AGAINST)]) for s in (a, b)]
    assert replication(Section(""), against)[0]["replication"].endswith("2 of 2 languages detect it against the paper")
    # a language whose differences have no spread is degenerate, not "without headroom", and not pooled
    flat = dict(b, diffs=[_diff("size", "late", 0.5, 0.0, 9, DEGENERATE)])
    row = replication(Section(""), [a, flat, dict(b, tag="pcfg2")])[0]
    assert row["pooled_languages"] == 2 and "1 degenerate (the differences have no spread)" in row["replication"]


# ---- end to end ---------------------------------------------------------------------------------------
def test_the_study_on_two_languages_end_to_end(tmp_path):
    run_cli(["isoloss", "--scale", "smoke", "--out", str(tmp_path), "--no-progress", "--launcher", "inprocess",
             "--language", "hmm:headroom", "--language", "pcfg:headroom"])
    root = tmp_path / "isoloss-smoke-hmm-headroom+pcfg-headroom"
    p = isoloss.PRESETS["smoke"]
    report = (root / "report.md").read_text()
    # each language's verdicts, then the replication table that pools them, all before the Runs table
    assert report.index("## Verdicts — hmm:headroom") < report.index("## Verdicts — pcfg:headroom") \
        < report.index("## Replication across languages") < report.index("## Runs")
    assert "--language hmm:headroom --language pcfg:headroom" in report
    assert check_tables(root) > 300  # every printed number against its file
    for tag in ("hmm-headroom", "pcfg-headroom"):
        assert sorted(d.name for d in (root / "seeds" / tag).iterdir()) == [f"seed{s}" for s in p.seeds]
        for stem in ("forest", "scatter", "curves"):
            assert (root / f"{tag}-{stem}.png").exists() and (root / f"{tag}-{stem}.data.csv").exists()
    # the replication table reads each language's own differences
    rep = {r["test"]: r for r in read(root / "replication.csv")}
    for tag in ("hmm-headroom", "pcfg-headroom"):
        primary = [r for r in read(root / f"{tag}-differences.csv") if r["family"] == "primary"]
        assert len(primary) == len(rep)
        for r in primary:
            row = rep[f"{r['comparison']} @ {r['point']}"]
            if int(r["n_used"]) >= 2:
                assert float(row[f"{tag}_mean"]) == pytest.approx(float(r["mean"]))
    # `sameloss replicate` reads the finished folder back to the same table
    assert main(["replicate", str(root), "--csv", str(tmp_path / "again.csv")]) == 0
    again = {r["test"]: r for r in read(tmp_path / "again.csv")}
    assert again.keys() == rep.keys()
    for test, row in rep.items():
        assert {k: v for k, v in again[test].items()} == row, test
    # every language's models and runs are in the one results.csv and runs.csv, none merged away
    results = read(root / "results.csv")
    models = [r for r in results if r.get("point")]
    assert {r["language"] for r in models} == {"hmm:headroom:task=task-5", "pcfg:headroom:task=span-1"}
    assert len({r["model"] for r in models}) == len(models)
    runs = read(root / "runs.csv")
    assert {r["run"].split("-s")[0] for r in runs} == {"hmm-headroom", "pcfg-headroom"}
    per_language = len([r for r in runs if r["run"].startswith("hmm-headroom")])
    assert per_language == len([r for r in runs if r["run"].startswith("pcfg-headroom")]) > len(p.seeds)
    # the PCFG's probes read its span task, with the oracle from inside–outside
    headroom = read(root / "pcfg-headroom-headroom.csv")
    oracle = next(r for r in headroom if r["baseline"].startswith("oracle"))
    assert float(oracle[p.primary_key]) > float(headroom[0][p.primary_key])  # above the majority class


def test_a_held_out_language_without_headroom_says_so(tmp_path, monkeypatch):
    """A language the study was never tuned on, given by its constructor's seed: with no
    headroom the gate stops it and the replication table marks it uninformative."""
    smoke = isoloss.PRESETS["smoke"]
    p = dataclasses.replace(smoke, verdicts=dataclasses.replace(smoke.verdicts, headroom_margin=60.0,
                                                                on_no_headroom="stop"))
    monkeypatch.setitem(isoloss.PRESETS, "smoke", p)
    reproduce(Job("isoloss", "smoke", out=tmp_path, languages=["hmm:micro:seed=11,task=task-3", "pcfg:headroom"]),
              Options(progress=False))
    root = tmp_path / "isoloss-smoke-hmm-micro-seed11-task-3+pcfg-headroom"
    report = (root / "report.md").read_text()
    assert report.count("**No verdict: no headroom**") == 2
    rep = read(root / "replication.csv")
    assert rep and {r["replication"] for r in rep} == {f"pooled: {REPLICATION_UNINFORMATIVE} — 2 of 2 languages "
                                                      "without headroom"}
    assert {r["hmm-micro-seed11-task-3_verdict"] for r in rep} == {UNINFORMATIVE}
    assert all(r["pooled"] == "" or math.isnan(float(r["pooled"])) for r in rep)
    # each language's seeds trained their base and nothing else
    for tag, name in (("hmm-micro-seed11-task-3", "hmm-micro-seed11-task-3"), ("pcfg-headroom", "pcfg-headroom")):
        for seed in p.seeds:
            assert sorted(d.name for d in (root / "seeds" / tag / f"seed{seed}" / "runs").iterdir()) == \
                [f"{name}-s{seed}-base"]
    assert np.isfinite(float(read(root / "pcfg-headroom-headroom.csv")[-1][p.primary_key]))
    assert paired.UNINFORMATIVE in report
    # read back by `sameloss replicate`: both languages there, both without headroom
    studies = isoloss.finished_studies(root)
    assert [(o["tag"], o["ok"], o["diffs"]) for o in studies] == [("hmm-micro-seed11-task-3", False, []),
                                                                    ("pcfg-headroom", False, [])]


def test_the_planner_takes_the_languages():
    from sameloss.experiments.engine.plan import dry_plan

    plan = dry_plan("isoloss", "smoke", languages=["hmm:headroom", "pcfg:headroom"])
    assert plan.root.name == "isoloss-smoke-hmm-headroom+pcfg-headroom"
    own = dry_plan("isoloss", "smoke")
    names = {r.name.split("-s")[0] for r in plan.runs}
    assert {"hmm-headroom", "pcfg-headroom"} <= names
    assert len(plan.runs) > len(own.runs)


# ---- sameloss replicate: studies run apart ----------------------------------------------------------
def _study(folder, diffs, results_language=None, gate=True):
    """A finished one-language study folder as `reproduce isoloss` leaves it (the files
    replicate reads): ``diffs`` None is a study the gate stopped (its gate table says so)."""
    folder.mkdir(parents=True)
    (folder / "report.md").write_text("# isoloss\n")
    (folder / "headroom.csv").write_text("baseline,pos_lbfgs_n200\nmajority class,0.4\n")
    if gate:
        passed = diffs is not None
        (folder / "gate.csv").write_text(f"seed,trained,ok\n0,0.8,True\n1,0.8,{passed}\n")
    if diffs is not None:
        with (folder / "differences.csv").open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(diffs[0]))
            w.writeheader()
            w.writerows(diffs)
    if results_language:
        (folder / "results.csv").write_text(f"model,language\nm0,{results_language}\nm1,{results_language}\n")
    return folder


def test_replicate_combines_studies_run_apart(tmp_path, capsys):
    a = _study(tmp_path / "a", [_diff("size", "late", 1.0, 0.8, 16, DETECTED),
                                _diff("noreg", "late", 0.1, 0.4, 16, EQUIVALENT)], "hmm:headroom:task=task-5")
    b = _study(tmp_path / "b", [_diff("size", "late", 0.6, 1.2, 9, DETECTED),
                                _diff("noreg", "late", -0.3, 0.6, 9, INCONCLUSIVE)])
    out = tmp_path / "rep.csv"
    assert main(["replicate", str(a), f"pcfg={b}", "--csv", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "## Replication across languages" in printed and f"pcfg ← {b}" in printed
    rows = {r["test"]: r for r in read(out)}
    # a by the language its results.csv names (tagged as a joint study tags it); b by its label;
    # the numbers as the joint study computes them
    assert "hmm-headroom_verdict" in next(iter(rows.values()))
    want = {r["test"]: r for r in replication(Section(""), [
        {"language": "hmm-headroom", "tag": "hmm-headroom", "ok": True,
         "diffs": read(a / "differences.csv")},
        {"language": "pcfg", "tag": "pcfg", "ok": True, "diffs": read(b / "differences.csv")}])}
    assert rows.keys() == want.keys() == {"size @ late", "noreg @ late"}
    assert rows["size @ late"]["replication"] == want["size @ late"]["replication"]
    assert rows["size @ late"]["replication"].endswith("2 of 2 languages detect it in the paper's direction")
    assert float(rows["size @ late"]["pooled"]) == pytest.approx(want["size @ late"]["pooled"])
    assert float(rows["noreg @ late"]["pcfg_mean"]) == -0.3
    # a study the gate stopped (headroom table only) is there, uninformative, never pooled
    c = _study(tmp_path / "c", None)
    assert main(["replicate", str(a), f"held-out={c}", "--csv", str(tmp_path / "rep2.csv")]) == 0
    size = {r["test"]: r for r in read(tmp_path / "rep2.csv")}["size @ late"]
    assert size["held-out_verdict"] == UNINFORMATIVE
    assert size["replication"].startswith(f"pooled: {REPLICATION_UNINFORMATIVE} — ")
    assert size["pooled_languages"] == "1" and math.isnan(float(size["pooled"]))
    # its own --csv is replaced; a user's file only with --force
    assert main(["replicate", str(a), f"pcfg={b}", "--csv", str(tmp_path / "rep2.csv")]) == 0
    assert {r["test"]: r for r in read(tmp_path / "rep2.csv")} == rows
    (tmp_path / "mine.csv").write_text("a user's table\n")
    assert main(["replicate", str(a), f"pcfg={b}", "--csv", str(tmp_path / "mine.csv")]) == 2
    assert (tmp_path / "mine.csv").read_text() == "a user's table\n"
    assert main(["replicate", str(a), f"pcfg={b}", "--csv", str(tmp_path / "mine.csv"), "--force"]) == 0
    assert {r["test"]: r for r in read(tmp_path / "mine.csv")} == rows


@pytest.mark.parametrize("args, words", [
    (["{tmp}/nowhere", "{tmp}/a"], "no such study folder"),
    (["{tmp}/unfinished", "{tmp}/a"], "not a finished isoloss study (no report.md"),
    (["{tmp}/other", "{tmp}/a"], "not an isoloss study folder (no headroom.csv"),
    (["{tmp}/bad", "{tmp}/a"], "lacks the columns"),
    (["{tmp}/a"], "one language is nothing to replicate"),
    (["{tmp}/a", "{tmp}/a2"], "two studies are named"),
    (["=x", "{tmp}/a"], "needs a label before '='"),
    (["{tmp}/a", "x={tmp}/a2", "--csv", "{tmp}/mine.csv"], "exists and was not written by sameloss"),
    (["{tmp}/a", "x={tmp}/a2", "--csv", "{tmp}/link.csv", "--force"], "is a symbolic link; sameloss never replaces"),
    (["{tmp}/a", "x={tmp}/a2", "--csv", "{tmp}/nowhere/r.csv"], "no folder"),
    (["{tmp}/a", "x={tmp}/a2", "--csv", "/proc/sameloss-r.csv"], "cannot write"),  # no one may write there
    (["{tmp}/garbled", "{tmp}/a"], "cannot be read"),
    # a missing file is never read as "no headroom"
    (["{tmp}/nogate", "{tmp}/a"], "no gate.csv"),
    (["{tmp}/lost", "{tmp}/a"], "every seed passed the headroom gate but differences.csv is missing"),
])
def test_replicate_refuses_in_one_line(tmp_path, capsys, args, words):
    lang = "hmm:headroom:task=task-5"
    _study(tmp_path / "a", [_diff("size", "late", 1.0, 0.8, 16, DETECTED)], lang)
    _study(tmp_path / "a2", [_diff("size", "late", 0.5, 0.8, 16, DETECTED)], lang)
    (tmp_path / "unfinished").mkdir()
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "report.md").write_text("# figure1\n")
    _study(tmp_path / "bad", [{"comparison": "size", "mean": 1.0}])
    (tmp_path / "mine.csv").write_text("a user's file")
    (tmp_path / "link.csv").symlink_to(tmp_path / "mine.csv")
    _study(tmp_path / "garbled", None)
    (tmp_path / "garbled" / "differences.csv").write_bytes(bytes(range(128, 256)))
    _study(tmp_path / "nogate", [_diff("size", "late", 1.0, 0.8, 16, DETECTED)], gate=False)
    _study(tmp_path / "lost", [_diff("size", "late", 1.0, 0.8, 16, DETECTED)])
    (tmp_path / "lost" / "differences.csv").unlink()
    assert main(["replicate", *(a.format(tmp=tmp_path) for a in args)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0], err
    assert (tmp_path / "mine.csv").read_text() == "a user's file"
