"""The iso-loss study's figures, drawn with ``plots``' kinds (each writes
``<stem>.data.csv`` with its plotted numbers): the forest of paired differences, Fig. 1
within seeds, one seed's KL curves with each fork's stretch, and the flatness forks'
dose-response where the study has them. The forks are named by their labels, as the report
names them; a study whose gate failed says so on each figure."""

from __future__ import annotations

import math

import numpy as np

from ...stats import paired
from ...reports.document import Section
from .design import IsolossPreset, regression_without


def figures(records, section: Section, p: IsolossPreset, rows: list[dict], diffs: list[dict],
            results: list[dict], seeds: list[int], lead: Section | None = None) -> None:
    """The figures (module docstring: three, and the dose-response with flatness forks), a
    language's named by its tag in a study of several; the forest plot in ``lead`` (the
    verdicts' section: it opens the report), the others in ``section``."""
    from ...reports.plots import drawing

    stem = f"{p.tag}-" if p.tag else ""
    ok = all(res["gate"]["ok"] for res in results)
    with drawing(caveat=None if ok else "no headroom (a seed's base failed the gate): every verdict is "
                                        "uninformative"):
        _forest(records, lead if lead is not None else section, p, diffs, seeds, stem)
        _scatter(records, section, p, rows, seeds, stem)
        _curves(records, section, p, results, seeds, stem)
        _dose(records, section, p, seeds, stem)


def forest_label(r: dict, p: IsolossPreset) -> str:
    """A forest row's name: the recipe and its reference as the forks' labels say them, the
    fork point and the pairs used (``differences`` row ``r``)."""
    labels = _labels(p)
    return (f"{labels.get(r['recipe'], r['recipe'])} vs {labels.get(r['reference'], r['reference'])} · "
            f"{r['point']} · {r['n_used']} pairs")


def _on(p: IsolossPreset, text: str) -> str:
    """A figure's title or caption, named by its language in a study of several (``p.tag``): the
    four languages' figures of one kind look alike, and a page or gallery may show them apart
    from their report's sections."""
    if not p.tag:
        return text
    return f"On {p.tag}, {text if text.startswith('Fig.') else text[0].lower() + text[1:]}"


def _labels(p: IsolossPreset) -> dict[str, str]:
    """The forks' labels by name: the legends name forks as the report does."""
    return {f.name: f.label for f in p.forks}


def _points_word(m: float) -> str:
    return "point" if m == 1 else "points"


def _points(p: IsolossPreset) -> list[str]:
    return [p.point_name(k) for k in sorted(p.fork_points, reverse=True)]


def _forest(records, section: Section, p: IsolossPreset, diffs: list[dict], seeds: list[int], stem: str) -> None:
    """The forest of paired differences at one KL, per comparison and fork point."""
    from ...reports.plots import TRACE_FISHER, Forest, Ref, forest_plot

    primary = [r for r in diffs if r["family"] == "primary"]
    trace = {(r["comparison"], r["point"]): r for r in diffs if r["family"] == "trace"}
    forest = []
    for r in primary:
        t = trace[(r["comparison"], r["point"])]
        forest.append({"label": forest_label(r, p), "acc": r["mean"], "acc_n": r["n_used"],
                       "acc_low": r["t_low"], "acc_high": r["t_high"], "acc_mde": r["mde"], "trace": t["mean"],
                       "trace_n": t["n_used"], "trace_low": t["t_low"], "trace_high": t["t_high"],
                       "trace_mde": t["mde"]})
    by_margin: dict[float, list[str]] = {}
    for r in primary:
        by_margin.setdefault(float(r["margin"]), []).append(r["comparison"])
    margins = sorted(by_margin, reverse=True)
    margin = tuple(Ref(s * m, (f"±δ = {m:g} {_points_word(m)} ({', '.join(dict.fromkeys(by_margin[m]))})" if s > 0
                               else ""),
                       axis="x", color=str(0.35 + 0.2 * i), style="--")
                   for i, m in enumerate(margins) for s in (-1, 1))
    interval = "95 % t interval over the seeds' pairs, each fork estimated at the pair's target KL"
    fig = forest_plot(forest, "label", [
        Forest("acc", "primary accuracy, recipe − reference (points)", interval=interval, refs=margin),
        Forest("trace", f"{TRACE_FISHER}, recipe − reference", interval=interval)],
        _on(p, "Paired differences at one KL, recipe − reference "
               "(rows: recipe vs reference · fork point · pairs used)"))
    section.figures.append(records.figure(
        fig, stem + "forest",
        shows=_on(p, "Forest plot: per comparison and fork point, the mean paired difference (recipe − reference) "
              "at one KL of (a) the primary probe accuracy (points) and (b) the trace of Hessian (Fisher estimator); a "
              "solid line at 0 (no difference), a light band over ± the row's minimum detectable effect (80 % "
              "power), in (a) dashed lines at ± each claim's margin δ ("
              + "; ".join(f"{m:g} {_points_word(m)}: {', '.join(dict.fromkeys(by_margin[m]))}" for m in margins) + ")"),
        sample=f"{len(seeds)} seeds; per row the pairs used (n in the row's name: every pair unless a fork's "
               f"estimate lies more than {p.verdicts.extrapolation_limit:.1e} nats outside its measured KL range)",
        claim="training recipes change downstream accuracy and the trace at the same pre-training loss, with the "
              "paper's signs (Tables 1–2, Figs. 2–5)"))


def _scatter(records, section: Section, p: IsolossPreset, rows: list[dict], seeds: list[int], stem: str) -> None:
    """Fig. 1 within seeds: accuracy against trace, each minus its seed's mean."""
    from ...reports.plots import TRACE_FISHER, XY, Encoding, Fit, interval_text, scatter_plot

    points = _points(p)
    scatter = []
    for pt in points:
        models = paired.fork_means(rows, p.primary_key, pt, regression_without(p))
        by_seed: dict[int, list[dict]] = {}
        for m in models:
            by_seed.setdefault(m["seed"], []).append(m)
        for s, ms in by_seed.items():
            ma = float(np.mean([m["acc"] for m in ms]))
            mt = float(np.mean([m["trace"] for m in ms]))
            for m in ms:  # keys per fork point: each panel draws its own point's models
                scatter.append({"fork": m["fork"], "seed": s, f"dtrace_{pt}": m["trace"] - mt,
                                f"dacc_{pt}": m["acc"] - ma})
    slopes = {r["point"]: r for r in section.files.get("regression.csv", []) if "trace" in r["coefficient"]}
    panels = []
    for pt in points:
        b = slopes.get(pt)
        fit = None if b is None or not math.isfinite(b["estimate"]) else Fit(
            b["estimate"], 0.0, f"{pt}: within-seed slope {interval_text(b['estimate'], b['low'], b['high'])} "
                                "points per unit of trace (95 % cluster bootstrap, KL held fixed)")
        panels.append(XY(f"dtrace_{pt}", f"{TRACE_FISHER} − seed mean, fork point {pt}", f"dacc_{pt}",
                         "primary accuracy − seed mean (points)", fit=fit))
    labels = _labels(p)
    fig = scatter_plot(scatter, panels, _on(p, "Fig. 1 within seeds"),
                       encoding=Encoding(colour_by=None, marker_by=lambda r: labels.get(r["fork"], r["fork"]),
                                         colour_markers=True))
    section.figures.append(records.figure(
        fig, stem + "scatter",
        shows=_on(p, "Fig. 1 within seeds: every fork's primary probe accuracy (points) against its trace of Hessian "
              "(Fisher estimator), each the mean of the fork's measured checkpoints minus its seed's mean over the "
              "forks of one size at that fork point "
              "(without the adversarial fork and the flatness forks: the dose-response is theirs), one panel per "
              "fork point; marker = fork; line = the within-seed "
              "slope of accuracy on trace through 0 (seed fixed effects, holding KL fixed; regression.csv)"),
        sample=f"{len(seeds)} seeds × {len({r['fork'] for r in scatter})} forks per fork point",
        claim="flatter models (smaller trace) transfer better at the same loss (Fig. 1, §4)"))


def _curves(records, section: Section, p: IsolossPreset, results: list[dict], seeds: list[int], stem: str) -> None:
    """The first seed's KL curves, each fork's stretch and its measured KL range."""
    from ...reports.plots import Panel, Ref, series_plot

    points = _points(p)
    labels = _labels(p)
    first = results[0]
    series: dict[str, list[dict]] = {}
    for name, kl in first["curves"].items():
        if name == "base":  # drawn in every panel
            series.setdefault("base", []).extend({"step": s, **{f"kl_{pt}": v for pt in points}}
                                                 for s, v in sorted(kl.items()))
            continue
        pt, fork = name.split("-", 1)
        series.setdefault(labels.get(fork, fork), []).extend({"step": s, f"kl_{pt}": v} for s, v in sorted(kl.items()))
    for name in series:
        series[name].sort(key=lambda r: r["step"])
    # the base first and plain: a solid dark line without markers, under the forks it starts
    series = {**({"base": series.pop("base")} if "base" in series else {}), **series}
    probed = {}  # the measured checkpoints' KL range per fork point: where the targets lie
    for r in first["rows"]:
        probed.setdefault(r["point"], []).append(float(r["kl"]))
    curve_panels = []
    for k in sorted(p.fork_points, reverse=True):
        pt = p.point_name(k)
        # both ends of the range in one legend entry: two entries drawn alike told nothing apart
        target = tuple(Ref(v, f"seed {seeds[0]}'s measured KL range (its lowest and highest)", color="0.3",
                           style=":") for v in (min(probed[pt]), max(probed[pt]))) if pt in probed else ()
        curve_panels.append(Panel(f"kl_{pt}", f"exact KL, fork point {pt} (nats)", log=True, refs=target))
    fig = series_plot(series, "step", curve_panels, _on(p, f"Seed {seeds[0]}: exact KL of the base and its forks"),
                      styles={"base": {"color": "0.15", "marker": "", "style": "-", "width": 1.8}})
    section.figures.append(records.figure(
        fig, stem + "curves",
        shows=_on(p, f"Training curves of seed {seeds[0]}: the exact KL to the true conditionals (log axis; "
              f"held-out set of {p.eval_sentences} sentences) against step, for the base and every fork, one panel "
              "per fork point; "
              "KL is evaluated only where it is read (the base, a solid dark line: its evaluations; each fork's "
              f"stretch at {p.schedule.final_lr_factor:g} × lr, every {p.schedule.match_every} steps on this seed: "
              "a fork's line is its stretch, a few of its points marked); "
              "dotted: the lowest and highest KL of the seed's measured checkpoints (every comparison's target "
              "lies between them)"),
        sample=f"1 seed ({seeds[0]}) of {len(seeds)}: {len(first['curves'])} runs",
        claim="none directly: it shows that the matched checkpoints lie where the KL moves smoothly at one "
              "learning rate (the design of the iso-loss comparison)"))


def _dose(records, section: Section, p: IsolossPreset, seeds: list[int], stem: str) -> None:
    """Flatness by assigned arm: each pair's primary difference against its arm's λ with the
    trend through AdamW's arm (the test), and — exploratory, no line — against the trace
    change the arm realised."""
    from ...reports.plots import XY, Encoding, Fit, Ref, interval_text, scatter_plot

    trend = {r["point"]: r for r in section.files.get("flatness_trend.csv", [])}
    pts = section.files.get("dose_points.csv", [])
    if not pts:
        return
    pt = next(x for x in _points(p) if x in trend)
    rows = [{"fork": r["fork"], "seed": r["seed"], "lam": r["lam"], "x": 100 * r["x"], "y": r["y"]}
            for r in pts if r["point"] == pt]
    b = trend[pt]
    fit = None if not math.isfinite(b["slope"]) else Fit(
        b["slope"], 0.0, f"trend: {interval_text(b['slope'], b['low'], b['high'])} points per 1e-4 of λ (through "
                         "AdamW's arm; 95 % t over seeds)")
    zero = (Ref(0.0, "no difference", color="0.6", style="-"),)
    panels = [XY("lam", "assigned penalty weight λ (1e-4; 0 = AdamW)", "y", "primary accuracy, arm − AdamW (points)",
                 fit=fit, refs=zero),
              XY("x", "exploratory: realised trace change at the target KL (%)", "y",
                 "primary accuracy, arm − AdamW (points)", refs=zero)]
    labels = _labels(p)
    fig = scatter_plot(rows, panels, _on(p, f"Flatness as the treatment, by assigned arm (fork point {pt})"),
                       encoding=Encoding(colour_by=None, marker_by=lambda r: labels.get(r["fork"], r["fork"]),
                                         colour_markers=True))
    section.figures.append(records.figure(
        fig, stem + "dose",
        shows=_on(p, "Flatness as the treatment (a trace penalty λ × the Fisher trace in training; λ < 0 "
              "sharpens), by assigned arm: (a) per seed and arm the paired primary probe accuracy difference "
              "(arm − AdamW, points, "
              "at the pair's target KL) against the arm's λ, with the trend through AdamW's arm (flatness_trend.csv: "
              "the test); (b) exploratory, no test: the same differences against the trace change each pair "
              "realised (arm ÷ AdamW − 1, %), a mediator measured with error; marker = arm"),
        sample=f"{len({r['seed'] for r in rows})} seeds × {len({r['fork'] for r in rows})} arms at fork point {pt} "
               "(every pair with a line to read)",
        claim="the thesis as a treatment: at the same loss, a flattening arm (λ > 0) transfers better, a sharpening "
              "arm worse (a positive trend in λ)"))


def pooled_forest(records, section: Section, tags: list[str]) -> None:
    """The study across languages as one forest: per pooled claim each language's paired
    difference at one KL and, below them, the pooled estimate of the stratified fixed-effects
    model — the rows of ``replication.csv`` (``section.files``), the claims only (each
    language's forest has the rest, and the adversary: reported per language only, its size
    is the language's, and its −28 points would set this plot's scale)."""
    from ...reports.plots import Forest, Ref, forest_plot
    from ...stats.replication import NOT_POOLED

    pooled = [r for r in section.files.get("replication.csv", []) if r.get("pooled_verdict") != NOT_POOLED]
    claims = [r for r in pooled if r.get("holm_family") == "claims"] or pooled
    rows = []
    for r in claims:
        for t in tags:
            if f"{t}_mean" in r:
                n = r.get(f"{t}_used", 0)
                rows.append({"label": f"{r['test']} · {t} ({n})", "acc": r[f"{t}_mean"],
                             "acc_low": r[f"{t}_low"], "acc_high": r[f"{t}_high"], "acc_n": n})
        k = r.get("pooled_languages", 0)
        try:
            shown = math.isfinite(float(r.get("pooled")))
        except (TypeError, ValueError):
            shown = False
        rows.append({"label": f"{r['test']} · POOLED ({k})" + ("" if shown else ": none"),
                     "acc": r.get("pooled"), "acc_low": r.get("pooled_low"), "acc_high": r.get("pooled_high")})
    if not rows:
        return
    margins = sorted({float(r["margin"]) for r in claims if math.isfinite(float(r.get("margin", math.nan)))},
                     reverse=True)
    refs = tuple(Ref(s * m, f"±δ = {m:g} {_points_word(m)}" if s > 0 else "", axis="x", color=str(0.35 + 0.2 * i),
                     style="--") for i, m in enumerate(margins) for s in (-1, 1))
    fig = forest_plot(rows, "label", [Forest(
        "acc", "primary accuracy, recipe − reference (points)", refs=refs,
        interval="each language: 95 % t interval over its seeds' pairs; POOLED: the stratified fixed-effects "
                 "model's 95 % t interval (t on Σn − k)")],
        "The claims across the languages: each language, then pooled (rows: comparison @ fork point · language "
        "(pairs used) or POOLED (languages pooled))")
    section.figures.append(records.figure(
        fig, "pooled-forest",
        shows="Forest plot across the languages: per claim (comparison @ fork point) each language's mean paired "
              "difference of the primary probe accuracy (recipe − reference, points) at one KL with its 95 % t "
              "interval, then the pooled estimate of the pre-registered stratified fixed-effects model (language a "
              "stratum) with its interval; a solid line at 0, dashed lines at ± each claim's margin δ; the "
              "adversary is reported per language only (its size is the language's: each language's forest)",
        sample=f"{len(tags)} languages ({', '.join(tags)}); in brackets: a language row's pairs used, a pooled "
               "row's languages pooled",
        claim="the paper's claims hold across languages: the same effect, or none beyond ±δ, on each language and "
              "pooled"))
