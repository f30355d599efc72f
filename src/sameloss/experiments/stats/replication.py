"""One comparison on several languages (``isoloss --language`` more than once): each
language's verdict, the random-effects pooled estimate with the Hartung–Knapp–Sidik–Jonkman
interval, and the replication verdict — the pooled verdict first, then how each language
agrees ("pooled: detected in the paper's direction — 2 of 3 languages detect it in the
paper's direction, 1 inconclusive"). A rule that asks every language to detect has power
0.8^k; the pooled test is the claim about languages, the agreement says how it came about."""

from __future__ import annotations

import math
from collections import Counter

from .paired import UNINFORMATIVE
from ..reports.document import Column, Section, Table
from .pooling import pool_inverse_variance, pooled_verdict
from .inference import DEGENERATE, DETECTED, DETECTED_AGAINST, EQUIVALENT, INCONCLUSIVE

REPLICATION_UNINFORMATIVE = "uninformative: fewer than two languages with headroom and an estimate"
# how a language's verdict reads in the agreement, in the order counted
AGREEMENT = ((DETECTED, "detect it in the paper's direction"), (DETECTED_AGAINST, "detect it against the paper"),
             (EQUIVALENT, "show no effect beyond ±δ"), (INCONCLUSIVE, "inconclusive"),
             (DEGENERATE, "degenerate (the differences have no spread)"), ("no interval", "no interval (n ≤ 1 pairs)"),
             (UNINFORMATIVE, "without headroom"))


def agreement(verdicts: list[str]) -> str:
    """How the languages' verdicts agree: "2 of 3 languages detect it in the paper's
    direction, 1 inconclusive" — the largest group first, a degenerate language called
    degenerate, a language without headroom said so; "contradicted" where detections point
    both ways."""
    order = [text for _, text in AGREEMENT]
    kinds = Counter(next((text for label, text in AGREEMENT if v.startswith(label)), v) for v in verdicts)
    parts = [f"{n} {text}" for text, n in sorted(kinds.items(), key=lambda kv: (
        -kv[1], order.index(kv[0]) if kv[0] in order else len(order)))]
    if not parts:
        return "no language"
    head = parts[0].split(" ", 1)
    out = f"{head[0]} of {len(verdicts)} languages {head[1]}" + "".join(f", {p}" for p in parts[1:])
    if DETECTED in verdicts and DETECTED_AGAINST in verdicts:
        out += " (contradicted: detections in both directions)"
    return out


def replication_verdict(pooled: str, verdicts: list[str]) -> str:
    """The pooled verdict first, then each language's agreement (``agreement``)."""
    return f"pooled: {pooled} — {agreement(verdicts)}"


def _language(s: dict, r: dict | None) -> tuple[dict, str, float, float]:
    """One language's cells of a comparison's row, its verdict, and its estimate and standard
    error for pooling (nan where it has none: no headroom, n ≤ 1, no spread)."""
    n = 0 if r is None else int(r["n_used"])
    mean, low, high, sd = ((float(r[k]) for k in ("mean", "t_low", "t_high", "sd")) if n >= 2 else (math.nan,) * 4)
    se = sd / math.sqrt(n) if n >= 2 else math.nan
    if not s["ok"]:
        verdict = UNINFORMATIVE
    elif n < 2:
        verdict = f"no interval: {n} pair(s)"
    else:
        verdict = r["verdict"]
    cells = {f"{s['tag']}_mean": mean, f"{s['tag']}_low": low, f"{s['tag']}_high": high,
             f"{s['tag']}_verdict": verdict, f"{s['tag']}_used": n}
    poolable = s["ok"] and math.isfinite(se) and se > 0
    return cells, verdict, (mean if poolable else math.nan), (se if poolable else math.nan)


def _pool(row: dict, by: dict, means: list[float], ses: list[float]) -> None:
    """The pooled estimate over the languages with an estimate (``row``, in place)."""
    row["pooled_languages"] = len(means)
    row.update(dict.fromkeys(("pooled", "pooled_low", "pooled_high", "random", "random_low", "random_high",
                              "random_p", "random_mde", "q", "q_p", "i2", "tau2"), math.nan))
    row["pooled_verdict"] = REPLICATION_UNINFORMATIVE
    if len(means) < 2:  # one language is nothing to pool
        return
    pooled = pool_inverse_variance(means, ses)
    # the comparison's direction and δ, as every language's study fixed them (a study of an
    # earlier version did not write them: its pooled estimate stands without a verdict)
    first = next(iter(by.values()))
    if first.get("expected_sign") not in (None, "") and first.get("margin") not in (None, ""):
        row["pooled_verdict"], row["random_mde"] = pooled_verdict(
            pooled, int(float(first["expected_sign"])), float(first["margin"]))
    else:
        row["pooled_verdict"] = "no verdict: the studies did not record the direction and δ (rerun them)"
    row.update(pooled=pooled.fixed, pooled_low=pooled.fixed_low, pooled_high=pooled.fixed_high,
               random=pooled.random, random_low=pooled.random_low, random_high=pooled.random_high,
               random_p=pooled.random_p, q=pooled.q, q_p=pooled.q_p, i2=pooled.i2, tau2=pooled.tau2)


def replication(section: Section, studies: list[dict], family: str = "primary") -> list[dict]:
    """The replication table: per comparison and fork point of ``family``, the pooled verdict
    (random effects over the languages with headroom and an estimate, each with its standard
    error sd/√n; HKSJ interval), each language's mean [t 95 %] and verdict, the replication
    verdict (``replication_verdict``), the fixed effect and the heterogeneity (Cochran's Q,
    I², τ²). ``studies``: per language ``{"language": spec, "tag": str, "ok": headroom
    passed, "diffs": its differences rows, "tests": the names of its comparisons,
    "comparison @ point"}``."""
    tests: dict[str, dict] = {}
    for s in studies:
        for name in s.get("tests", ()):  # a language without headroom tested nothing: listed all the same
            tests.setdefault(name, {})
        for r in s["diffs"]:
            if r["family"] == family:
                tests.setdefault(f"{r['comparison']} @ {r['point']}", {})[s["tag"]] = r
    out = []
    for test, by in tests.items():
        row: dict = {"test": test}
        verdicts, means, ses = [], [], []
        for s in studies:
            cells, verdict, mean, se = _language(s, by.get(s["tag"]))
            row.update(cells)
            verdicts.append(verdict)
            if math.isfinite(se):
                means.append(mean)
                ses.append(se)
        _pool(row, by, means, ses)
        row["replication"] = replication_verdict(row["pooled_verdict"], verdicts)
        out.append(row)
    _table(section, studies, out, family)
    return out


def _table(section: Section, studies: list[dict], out: list[dict], family: str) -> None:
    name = "replication.csv" if family == "primary" else f"replication_{family}.csv"
    section.files[name] = out
    columns = [Column("pooled verdict (random effects, HKSJ)", "pooled_verdict", text=True),
               Column("pooled, random (HKSJ) [95%]", "random", ci=("random_low", "random_high"), fmt=".2f"),
               Column("pooled MDE", "random_mde", fmt=".2f"), Column("languages pooled", "pooled_languages", fmt="d")]
    for s in studies:
        columns += [Column(f"{s['tag']} [95%]", f"{s['tag']}_mean", ci=(f"{s['tag']}_low", f"{s['tag']}_high"),
                           fmt=".2f"),
                    Column(f"{s['tag']} verdict", f"{s['tag']}_verdict", text=True)]
    columns += [Column("replication", "replication", text=True),
                Column("pooled, fixed [95%]", "pooled", ci=("pooled_low", "pooled_high"), fmt=".2f"),
                Column("Q", "q", fmt=".2f"), Column("p(Q)", "q_p", fmt=".2g"), Column("I²", "i2", fmt=".2f"),
                Column("τ²", "tau2", fmt=".3g")]
    what = "primary accuracy (points)" if family == "primary" else family
    section.tables.append(Table(
        f"Replication across languages: per comparison and fork point, first the verdict about languages — the "
        "random-effects pooled estimate over the languages with headroom and an estimate, when there are at least "
        "two (each language's standard error sd/√n of its used pairs; DerSimonian–Laird τ²), with the "
        "Hartung–Knapp–Sidik–Jonkman t interval on k − 1 degrees of freedom: detected where its 95 % interval "
        "excludes 0, no effect beyond ±δ where its 90 % interval lies inside the study's δ, and its MDE at 80 % "
        f"power — then the {what} difference on each language, the replication verdict (the pooled verdict, then "
        "how many languages detect it and which way, how many are inconclusive, degenerate or without headroom), "
        "the fixed effect and the heterogeneity (Cochran's Q, I², τ²)", columns, out, source=name, key="test",
        key_header="comparison @ fork point"))
