"""The iso-loss study on any language (issue 24): ``--language NAME[:SIZE][:key=value,...]``
parsed and checked before anything runs, the span probe and the oracle of a PCFG span
task, a study of several languages (one folder per language's seeds, files named by the
language) ending in the replication table, the inverse-variance pooling against hand
computation, and a held-out language without headroom reported as such."""

from __future__ import annotations

import csv
import dataclasses
import math

import numpy as np
import pytest
import torch

from sameloss.cli import main
from sameloss.errors import UserError
from sameloss.experiments.stats import paired
from sameloss.experiments import Job, Options, reproduce
from sameloss.experiments.stats.paired import UNINFORMATIVE
from sameloss.experiments.stats.replication import NOT_POOLED, REPLICATION_UNINFORMATIVE, agreement, replication
from sameloss.experiments.recipes import isoloss
from sameloss.experiments.stats.inference import (DEGENERATE, DETECTED, DETECTED_AGAINST, EQUIVALENT, INCONCLUSIVE,
    paired_difference)
from sameloss.experiments.stats.pooling import pool_inverse_variance, stratified
from sameloss.experiments.stats.weighted import Fits
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
    # Hartung–Knapp–Sidik–Jonkman truncated at max(1, q*): a t interval on k − 1 = 2 df
    q_star = sum(a * (b - random) ** 2 for a, b in zip(wr, m)) / 2
    hk = math.sqrt(max(1.0, q_star) / sum(wr))
    p = pool_inverse_variance(m, se)
    assert p.fixed == pytest.approx(fixed) and p.fixed_se == pytest.approx(21 ** -0.5)
    assert p.q == pytest.approx(q) and p.i2 == pytest.approx(max(0.0, (q - 2) / q))
    assert p.tau2 == pytest.approx(tau2) and p.random == pytest.approx(random) and p.hksj_q == pytest.approx(q_star)
    assert p.random_se == pytest.approx(hk) and p.random_low == pytest.approx(random - 4.302653 * hk, rel=1e-6)
    # statsmodels (a test dependency): DerSimonian–Laird, its "random effect wls" row the untruncated HKSJ,
    # its "random effect" row the plain one: the truncated interval is the wider of the two
    from statsmodels.stats.meta_analysis import combine_effects
    rng = np.random.default_rng(4)
    truncated = 0
    for k in (2, 3, 3, 3, 6):
        mm, ss = rng.normal(0.5, 1.5, k), rng.uniform(0.1, 0.3, k)
        ours = pool_inverse_variance(mm, ss)
        fit = combine_effects(mm, ss ** 2, method_re="dl", use_t=True)
        ref = fit.summary_frame()
        hksj, plain = ref.loc["random effect wls"], ref.loc["random effect"]
        assert ours.random == pytest.approx(hksj["eff"], rel=1e-10)
        wider = max(hksj["ci_upp"] - hksj["ci_low"], (plain["ci_upp"] - plain["ci_low"]))
        assert ours.random_high - ours.random_low == pytest.approx(wider, rel=1e-6)
        truncated += ours.hksj_q < 1
    assert truncated >= 1  # the truncation was exercised
    same = pool_inverse_variance([0.4, 0.4], [0.1, 0.2])
    assert same.q == pytest.approx(0) and same.i2 == 0 and same.tau2 == 0 and same.random == pytest.approx(0.4)
    with pytest.raises(ValueError):
        pool_inverse_variance([1.0], [0.0])


def _fits(y, lev=None, rss=None):
    """A language's pairs as a study reads them: differences, leverages (equal by default),
    no checkpoint noise unless ``rss``."""
    y = np.asarray(y, dtype=float)
    n = y.size
    return Fits(y, np.full(n, 2 / 3) if lev is None else np.asarray(lev, float), np.full(n, 2 / 3),
                np.zeros(n) if rss is None else np.asarray(rss, float), np.full(n, 2.0))


def test_the_stratified_model_is_least_squares_with_a_stratum_each():
    """Equal weights: the estimate is the mean over every pair, its scale the residual variance of
    OLS on the languages' dummies (statsmodels) on Σn − k df, the interaction the one-way ANOVA F
    (scipy); unequal weights: WLS with language dummies, by hand; one language: its own estimate."""
    import statsmodels.api as sm
    from scipy.stats import f_oneway

    rng = np.random.default_rng(9)
    langs = [rng.normal(mu, 0.5, n) for mu, n in ((0.2, 5), (0.5, 7), (-0.1, 6))]
    fe = stratified([_fits(y) for y in langs])
    y = np.concatenate(langs)
    dummies = np.zeros((y.size, 3))
    start = 0
    for j, part in enumerate(langs):
        dummies[start:start + part.size, j] = 1
        start += part.size
    ols = sm.OLS(y, dummies).fit()
    n = y.size
    assert (fe.k, fe.n, fe.df) == (3, 18, 15) and fe.estimate == pytest.approx(y.mean())
    assert fe.se == pytest.approx(math.sqrt(ols.mse_resid / n), rel=1e-10)
    assert fe.interaction_p == pytest.approx(f_oneway(*langs).pvalue, rel=1e-8)
    assert fe.means == pytest.approx(tuple(float(part.mean()) for part in langs))
    # unequal leverages with checkpoint noise: WLS with language dummies at w = 1/(τ² + σ²L)
    lev = [rng.uniform(0.7, 6, part.size) for part in langs]
    rss = [rng.chisquare(2, part.size) * 0.02 for part in langs]
    fw = stratified([_fits(a, b, c) for a, b, c in zip(langs, lev, rss)])
    sigma2 = sum(c.sum() for c in rss) / (2 * n)
    q = c = 0.0
    for part, lv in zip(langs, lev):  # DerSimonian–Laird's moments about each language's own mean, by hand
        w0 = 1 / (sigma2 * lv)
        q += (w0 * (part - (w0 * part).sum() / w0.sum()) ** 2).sum()
        c += w0.sum() - (w0 ** 2).sum() / w0.sum()
    tau2 = max(0.0, (q - 15) / c)
    w = np.concatenate([1 / (tau2 + sigma2 * lv) for lv in lev])
    wls = sm.WLS(y, dummies, weights=w).fit()
    wsum = np.array([(1 / (tau2 + sigma2 * lv)).sum() for lv in lev])
    assert fw.estimate == pytest.approx(float((wsum * wls.params).sum() / wsum.sum()), rel=1e-10)
    assert fw.se == pytest.approx(math.sqrt(wls.scale / wsum.sum()), rel=1e-10) and fw.df == 15
    one = stratified([_fits(langs[0])])
    t = paired_difference(langs[0], n_boot=0)
    assert (one.estimate, one.low, one.high, one.df) == pytest.approx((t.mean, t.t_low, t.t_high, 4))
    assert math.isnan(one.interaction_p)


def test_the_stratified_models_size_holds_at_zero_and_at_the_margin_with_three_languages():
    """Simulated studies of 3 languages × 6 seeds with unequal spreads, weighted as a study
    weighs them, effects equal or unequal across languages: the detection's type-I error at 0
    and TOST's at the margin stay near 0.05 (the untruncated HKSJ's TOST did not: 7.5–8.2 %)."""
    rng = np.random.default_rng(10)
    margin, sds = 0.5, (0.4, 0.7, 1.0)
    for effects in ((0.0, 0.0, 0.0), (-0.3, 0.0, 0.3)):
        detect = tost = 0
        for _ in range(2000):
            strata = [_fits(rng.normal(e, s, 6)) for e, s in zip(effects, sds)]
            detect += stratified(strata).p_value <= 0.05
            edge = [_fits(rng.normal(margin + e, s, 6)) for e, s in zip(effects, sds)]
            tost += stratified(edge).tost_p(margin) <= 0.05
        assert detect / 2000 <= 0.065 and tost / 2000 <= 0.065, (effects, detect, tost)


def test_the_replication_verdict_gives_the_pooled_verdict_then_each_languages_agreement():
    assert agreement([DETECTED, DETECTED]) == "2 of 2 languages detect it in the paper's direction"
    assert agreement([DETECTED_AGAINST, DETECTED_AGAINST]) == "2 of 2 languages detect it against the paper"
    assert agreement([DETECTED, INCONCLUSIVE, DETECTED]) == \
        "2 of 3 languages detect it in the paper's direction, 1 inconclusive"
    assert agreement([DETECTED, DEGENERATE]) == \
        "1 of 2 languages detect it in the paper's direction, 1 degenerate (the differences have no spread)"
    assert agreement([DETECTED, UNINFORMATIVE, "no interval: 1 pair(s)"]) == \
        "1 of 3 languages detect it in the paper's direction, 1 no interval (n ≤ 1 pairs), 1 without headroom"
    assert agreement([DETECTED, DETECTED_AGAINST, DETECTED]).endswith("(contradicted: detections in both directions)")
    assert agreement([EQUIVALENT, INCONCLUSIVE]) == "1 of 2 languages show no effect beyond ±δ, 1 inconclusive"


def _language(tag, effects, ok=True, comparison="size", pooled=True, margin=1.0):
    """A language's differences row and pairs (each pair's difference in points/100, equal leverage)."""
    d = np.asarray(effects, dtype=float)
    t = paired_difference(d, n_boot=0)
    pairs = [{"test": f"{comparison} @ late", "used": True, "seed": s, "d_acc": v / 100, "leverage": 2 / 3,
              "leverage_mean": 2 / 3, "rss_acc": 0.0, "rss_df": 2} for s, v in enumerate(d)]
    row = {"comparison": comparison, "point": "late", "family": "primary", "quantity": "acc", "mean": t.mean,
           "sd": t.sd, "n_used": t.n, "t_low": t.t_low, "t_high": t.t_high,
           "verdict": paired.power_verdict(t, 1, margin), "expected_sign": 1, "margin": margin,
           "holm_family": "claims", "pooled": pooled}
    return {"language": tag, "tag": tag, "ok": ok, "tests": [f"{comparison} @ late"],
            "diffs": [row] if ok else [], "pairs": pairs if ok else []}


def test_the_replication_pools_by_the_stratified_model_and_never_pools_a_languages_own_effect():
    rng = np.random.default_rng(11)
    a, b = rng.normal(1.5, 0.5, 8), rng.normal(1.0, 0.8, 8)
    out = replication([_language("hmm", a), _language("pcfg", b)])[0]
    fe = stratified([_fits(a), _fits(b)])
    assert out["pooled"] == pytest.approx(fe.estimate) and out["pooled_df"] == 14
    assert (out["pooled_low"], out["pooled_high"]) == pytest.approx((fe.low, fe.high))
    assert out["pooled_verdict"] == fe.verdict(1, 1.0) and out["interaction_p"] == pytest.approx(fe.interaction_p)
    assert out["agreement"].startswith("2 of 2 languages") and out["pooled_languages"] == 2
    # one claim of one family: Holm over one test, the power of its verdict as made
    assert out["pooled_holm_p"] == pytest.approx(fe.p_value)
    # the adversary's effect is the language's own: per language only, not pooled, not in Holm's count
    adv = replication([_language("hmm", a, comparison="adv", pooled=False),
                       _language("pcfg", b, comparison="adv", pooled=False)])[0]
    assert adv["pooled_verdict"] == NOT_POOLED and "pooled" not in adv and "pooled_holm_p" not in adv
    # a language without headroom is listed as uninformative and not pooled: one left pools nothing
    alone = replication([_language("hmm", a), _language("micro", [], ok=False)])[0]
    assert alone["micro_verdict"] == UNINFORMATIVE and alone["pooled_languages"] == 1
    assert alone["pooled_verdict"] == REPLICATION_UNINFORMATIVE and math.isnan(alone["pooled"])


# ---- end to end ---------------------------------------------------------------------------------------
def test_the_study_on_two_languages_end_to_end(tmp_path):
    run_cli(["isoloss", "--scale", "smoke", "--out", str(tmp_path), "--no-progress", "--launcher", "inprocess",
             "--language", "hmm:headroom", "--language", "pcfg:headroom"])
    root = tmp_path / "isoloss-smoke-hmm-headroom+pcfg-headroom"
    p = isoloss.PRESETS["smoke"]
    report = (root / "report.md").read_text()
    # the pooled answer and table first, before the Runs table; then each language's verdicts and study
    assert report.index("## Across the languages") < report.index("## Runs") \
        < report.index("## Verdicts — hmm:headroom") < report.index("## Verdicts — pcfg:headroom")
    assert "--language hmm:headroom --language pcfg:headroom" in report
    assert check_tables(root) > 300  # every printed number against its file
    for tag in ("hmm-headroom", "pcfg-headroom"):
        assert sorted(d.name for d in (root / "seeds" / tag).iterdir()) == [f"seed{s}" for s in p.seeds]
        for stem in ("forest", "scatter", "curves"):
            assert (root / f"{tag}-{stem}.png").exists() and (root / f"{tag}-{stem}.data.csv").exists()
    # the replication table reads each language's own differences and pairs
    rep = {r["test"]: r for r in read(root / "replication.csv")}
    assert all(r["pooled_verdict"] for r in rep.values())
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
    assert rep and {r["pooled_verdict"] for r in rep} == {REPLICATION_UNINFORMATIVE}
    assert {r["agreement"] for r in rep} == {"2 of 2 languages without headroom"}
    assert {r["hmm-micro-seed11-task-3_verdict"] for r in rep} == {UNINFORMATIVE}
    assert all(r.get("pooled", "") == "" or math.isnan(float(r["pooled"])) for r in rep)
    # each language's seeds trained their base and nothing else
    for tag, name in (("hmm-micro-seed11-task-3", "hmm-micro-seed11-task-3"), ("pcfg-headroom", "pcfg-headroom")):
        for seed in p.seeds:
            assert sorted(d.name for d in (root / "seeds" / tag / f"seed{seed}" / "runs").iterdir()) == \
                [f"{name}-s{seed}-base"]
    assert np.isfinite(float(read(root / "pcfg-headroom-headroom.csv")[-1][p.primary_key]))
    assert paired.UNINFORMATIVE in report
    # read back by `sameloss replicate`: both languages there, both without headroom
    studies = isoloss.finished_studies(root)
    assert [(o["tag"], o["ok"], o["diffs"], o["pairs"]) for o in studies] == [
        ("hmm-micro-seed11-task-3", False, [], []), ("pcfg-headroom", False, [], [])]


def test_the_planner_takes_the_languages():
    from sameloss.experiments.engine.plan import dry_plan

    plan = dry_plan("isoloss", "smoke", languages=["hmm:headroom", "pcfg:headroom"])
    assert plan.root.name == "isoloss-smoke-hmm-headroom+pcfg-headroom"
    own = dry_plan("isoloss", "smoke")
    names = {r.name.split("-s")[0] for r in plan.runs}
    assert {"hmm-headroom", "pcfg-headroom"} <= names
    assert len(plan.runs) > len(own.runs)


# ---- sameloss replicate: studies run apart ----------------------------------------------------------
def _write(path, rows):
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def _study(folder, language, results_language=None, gate=True):
    """A finished one-language study folder as `reproduce isoloss` leaves it (the files
    replicate reads: the report, headroom, gate, differences and pairs): ``language`` (a
    ``_language`` dict) None is a study the gate stopped (its gate table says so)."""
    folder.mkdir(parents=True)
    (folder / "report.md").write_text("# isoloss\n")
    (folder / "headroom.csv").write_text("baseline,pos_lbfgs_n200\nmajority class,0.4\n")
    if gate:
        passed = language is not None
        (folder / "gate.csv").write_text(f"seed,trained,ok\n0,0.8,True\n1,0.8,{passed}\n")
    if language is not None:
        _write(folder / "differences.csv", language["diffs"])
        _write(folder / "pairs.csv", language["pairs"])
    if results_language:
        (folder / "results.csv").write_text(f"model,language\nm0,{results_language}\nm1,{results_language}\n")
    return folder


def test_replicate_combines_studies_run_apart(tmp_path, capsys):
    rng = np.random.default_rng(12)
    one, two = _language("hmm", rng.normal(1.5, 0.6, 8)), _language("pcfg", rng.normal(1.0, 0.9, 8))
    a = _study(tmp_path / "a", one, "hmm:headroom:task=task-5")
    b = _study(tmp_path / "b", two)
    out = tmp_path / "rep.csv"
    assert main(["replicate", str(a), f"pcfg={b}", "--csv", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("**Across the languages (2 pooled):**")
    assert "## Across the languages" in printed and f"pcfg ← {b}" in printed
    rows = {r["test"]: r for r in read(out)}
    # a by the language its results.csv names (tagged as a joint study tags it); b by its label; the
    # numbers as the joint study computes them, from the files read back
    assert "hmm-headroom_verdict" in next(iter(rows.values()))
    want = replication([dict(one, tag="hmm-headroom"), dict(two, tag="pcfg")])[0]
    assert float(rows["size @ late"]["pooled"]) == pytest.approx(want["pooled"])
    assert rows["size @ late"]["pooled_verdict"] == want["pooled_verdict"]
    # a study the gate stopped (headroom table only) is there, uninformative, never pooled
    c = _study(tmp_path / "c", None)
    assert main(["replicate", str(a), f"held-out={c}", "--csv", str(tmp_path / "rep2.csv")]) == 0
    size = {r["test"]: r for r in read(tmp_path / "rep2.csv")}["size @ late"]
    assert size["held-out_verdict"] == UNINFORMATIVE and size["pooled_verdict"] == REPLICATION_UNINFORMATIVE
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
    # a cut, empty or folder differences.csv, or no pairs, is never read as an answer (issue 63 item 3)
    (["{tmp}/cut", "{tmp}/a"], "cut short"),
    (["{tmp}/empty", "{tmp}/a"], "differences.csv: empty"),
    (["{tmp}/folder", "{tmp}/a"], "cannot be read"),
    (["{tmp}/nopairs", "{tmp}/a"], "pairs.csv: missing, empty or cut short"),
])
def test_replicate_refuses_in_one_line(tmp_path, capsys, args, words):
    lang = "hmm:headroom:task=task-5"
    good = _language("hmm", [1.0, 1.5, 0.7, 1.2])
    _study(tmp_path / "a", good, lang)
    _study(tmp_path / "a2", _language("hmm", [0.5, 0.8, 0.2, 0.4]), lang)
    (tmp_path / "unfinished").mkdir()
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "report.md").write_text("# figure1\n")
    _study(tmp_path / "bad", {"diffs": [{"comparison": "size", "mean": 1.0}], "pairs": good["pairs"]})
    (tmp_path / "mine.csv").write_text("a user's file")
    (tmp_path / "link.csv").symlink_to(tmp_path / "mine.csv")
    _study(tmp_path / "garbled", None)
    (tmp_path / "garbled" / "differences.csv").write_bytes(bytes(range(128, 256)))
    _study(tmp_path / "nogate", good, gate=False)
    _study(tmp_path / "lost", good)
    (tmp_path / "lost" / "differences.csv").unlink()
    text = (_study(tmp_path / "cut", good) / "differences.csv").read_text()
    (tmp_path / "cut" / "differences.csv").write_text(text[:len(text) * 2 // 3])
    (_study(tmp_path / "empty", good) / "differences.csv").write_text("")
    (_study(tmp_path / "folder", good) / "differences.csv").unlink()
    (tmp_path / "folder" / "differences.csv").mkdir()
    (_study(tmp_path / "nopairs", good) / "pairs.csv").unlink()
    assert main(["replicate", *(a.format(tmp=tmp_path) for a in args)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0], err
    assert (tmp_path / "mine.csv").read_text() == "a user's file"
