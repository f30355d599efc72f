"""One comparison on several languages (``isoloss --language`` more than once, or the
languages scale): each language's verdict, the pooled verdict of the pre-registered primary
analysis — the one-stage stratified fixed-effects model over seed pairs (``pooling.stratified``:
language a stratum, df = Σn − k), its claim about *these* languages — with the language ×
treatment interaction test beside it, and random effects as the secondary (truncated HKSJ).
A comparison whose effect is the language's own (``Comparison.pooled`` False: the adversary,
whose objective is aimed at each language's task) is reported per language only, never as
one pooled number. Holm over the pooled claims, as within one language."""

from __future__ import annotations

import math
from collections import Counter

from .inference import DEGENERATE, DETECTED, DETECTED_AGAINST, EQUIVALENT, INCONCLUSIVE, t_test_power, tost_power
from .paired import HOLM_LEVEL, UNINFORMATIVE, TestKey, after_holm, holm_counted
from .pooling import pool_inverse_variance, stratified
from .weighted import fits_of

REPLICATION_UNINFORMATIVE = "uninformative: fewer than two languages with headroom and an estimate"
NOT_POOLED = "not pooled: its size is the language's (reported per language)"
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


def _language(s: dict, r: dict | None) -> tuple[dict, str]:
    """One language's cells of a comparison's row and its verdict."""
    n = 0 if r is None else int(float(r["n_used"]))
    mean, low, high = ((float(r[k]) for k in ("mean", "t_low", "t_high")) if n >= 2 else (math.nan,) * 3)
    if not s["ok"]:
        verdict = UNINFORMATIVE
    elif n < 2:
        verdict = f"no interval: {n} pair(s)"
    else:
        verdict = r["verdict"]
    return ({f"{s['tag']}_mean": mean, f"{s['tag']}_low": low, f"{s['tag']}_high": high,
             f"{s['tag']}_verdict": verdict, f"{s['tag']}_used": n}, verdict)


def _fits(s: dict, test: str, key: str):
    """A language's used pairs of ``test`` (``weighted.Fits``), from its pairs rows (in a study,
    or ``pairs.csv`` read back)."""
    used = [p for p in s.get("pairs", ()) if p["test"] == test and p["used"] in (True, "True")]
    return fits_of(used, key, 100.0)


def _pool(row: dict, first: dict, strata: list, estimates: list[tuple[float, float]]) -> None:
    """The pooled cells of ``row`` (in place): the stratified fixed-effects estimate and
    verdict over ``strata`` (each language's pairs), the interaction test, and random
    effects over ``estimates`` (each language's mean and standard error)."""
    nan = math.nan
    row.update(dict.fromkeys(("pooled", "pooled_low", "pooled_high", "pooled_df", "pooled_p", "pooled_tost_p",
                              "pooled_se", "interaction_p", "random", "random_low", "random_high", "i2", "tau2"),
                             nan))
    row["pooled_languages"] = len(strata)
    if len(strata) < 2:
        row["pooled_verdict"] = REPLICATION_UNINFORMATIVE
        return
    sign, margin = int(float(first["expected_sign"])), float(first["margin"])
    fe = stratified(strata)
    row.update(pooled=fe.estimate, pooled_low=fe.low, pooled_high=fe.high, pooled_df=fe.df, pooled_p=fe.p_value,
               pooled_se=fe.se, pooled_tost_p=fe.tost_p(margin), interaction_p=fe.interaction_p,
               pooled_verdict=fe.verdict(sign, margin))
    if len(estimates) >= 2:
        re = pool_inverse_variance([m for m, _ in estimates], [se for _, se in estimates])
        row.update(random=re.random, random_low=re.random_low, random_high=re.random_high, i2=re.i2, tau2=re.tau2)


def replication(studies: list[dict], family: str = "primary") -> list[dict]:
    """Per comparison and fork point of ``family``, the pooled verdict (the stratified
    fixed-effects model over the languages with headroom and at least two used pairs), the
    interaction test, the random-effects estimate (secondary), each language's estimate and
    verdict, and how they agree; Holm over the pooled tests of each Holm family (the claims,
    the other comparisons) with the power of each pooled verdict as made. ``studies``: per
    language ``{"language": spec, "tag": str, "ok": headroom passed, "diffs": its differences
    rows, "pairs": its pairs rows, "tests": the names of its comparisons}``."""
    tests: dict[str, dict] = {}
    for s in studies:
        for name in s.get("tests", ()):  # a language without headroom tested nothing: listed all the same
            tests.setdefault(name, {})
        for r in s["diffs"]:
            if r["family"] == family:
                tests.setdefault(str(TestKey.of(r)), {})[s["tag"]] = r
    out = []
    for test, by in tests.items():
        row: dict = {"test": test}
        verdicts, strata, estimates = [], [], []
        first = next(iter(by.values()), None)
        for s in studies:
            cells, verdict = _language(s, by.get(s["tag"]))
            row.update(cells)
            verdicts.append(verdict)
            r = by.get(s["tag"])
            if s["ok"] and r is not None and int(float(r["n_used"])) >= 2:
                strata.append(_fits(s, test, r["quantity"]))
                if float(r["sd"]) > 0:
                    estimates.append((float(r["mean"]), float(r["sd"]) / math.sqrt(int(float(r["n_used"])))))
        row["holm_family"] = first.get("holm_family", "primary") if first else "primary"
        if first is not None and str(first.get("pooled", True)) in ("False", "0"):
            row.update(pooled_languages=0, pooled_verdict=NOT_POOLED)
        elif first is not None:
            row["margin"], row["expected_sign"] = float(first["margin"]), int(float(first["expected_sign"]))
            _pool(row, first, strata, estimates)
        else:
            row["pooled_verdict"] = REPLICATION_UNINFORMATIVE
        row["agreement"] = agreement(verdicts)
        out.append(row)
    _holm(out)
    return out


def _holm(out: list[dict]) -> None:
    """Holm over the pooled tests of each family (a comparison not pooled is not counted),
    whether each pooled verdict survives, and its power as made at α/m."""
    for family in dict.fromkeys(r["holm_family"] for r in out):
        members = [r for r in out if r["holm_family"] == family and r["pooled_verdict"] != NOT_POOLED]
        if not members:
            continue
        alpha = HOLM_LEVEL / len(members)
        for r, q, qe in zip(members, holm_counted([r.get("pooled_p", math.nan) for r in members]),
                            holm_counted([r.get("pooled_tost_p", math.nan) for r in members])):
            r["pooled_holm_p"], r["pooled_tost_holm_p"] = q, qe
            r["pooled_after_holm"] = after_holm(r["pooled_verdict"], q, qe)
            r["pooled_decided"] = r["pooled_after_holm"] == "survives"
            se, df, margin = r.get("pooled_se", math.nan), r.get("pooled_df", math.nan), r.get("margin", math.nan)
            ok = math.isfinite(se) and se > 0 and math.isfinite(df) and df >= 1
            r["pooled_power"] = (math.nan if not ok else tost_power(margin, se, df, alpha)
                                 if r["pooled_verdict"] == EQUIVALENT else t_test_power(margin / se, df, 1 - alpha))
