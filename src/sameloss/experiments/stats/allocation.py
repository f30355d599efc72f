"""The design rule of every scale, claims first: a design is fixed before the data from the
prior paired SDs (a pilot's, on other seeds) and the cost of a seed, for a budget.

Every claim (``ClaimSpec``: a test with its prior SD, its margin δ — the smallest effect of
interest, from the paper — and the effect it is planned for) is planned the seeds at which it
is *decided* with 80 % power whichever way the truth lies: detected at its planned effect, and
— unless it is a positive control — "no effect beyond ±δ" (TOST) at a true 0, both at Holm's
first step over the claims planned, α/m (a lower bound of Holm's power: the power of the claim
as the report makes it). While the plan costs more than the budget, the claim whose removal
saves the most is left out, and the others are planned again at the smaller family's level;
other comparisons get the budget left (``plan_design``). Across L languages pooled by the
stratified fixed-effects model a claim's standard error is ``sd/√(L n)`` on ``L(n − 1)``
degrees of freedom (``pooling.stratified``); a comparison reported per language only is planned
per language. ``bench/isoloss_power.py`` simulates the designs through the study's own
decision code (its error rates and power after Holm).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class ClaimSpec:
    """One test as a design plans it: its prior paired SD of the primary accuracy (points),
    its margin δ (the smallest effect of interest, from the paper), the effect it is planned to
    detect (δ, or a positive control's expected effect), and whether it is a positive control
    (planned to detect its effect only: no "no effect" is expected of it); ``pooled``: pooled
    across languages (False: its effect is the language's, each language's own test is planned)."""

    test: str
    sd: float
    margin: float
    effect: float
    control: bool = False
    pooled: bool = True


def decide_power(c: ClaimSpec, n: int, alpha: float, languages: int = 1) -> tuple[float, float]:
    """The power of ``c``'s verdicts on ``n`` seeds (× ``languages``, pooled by the stratified
    fixed-effects model: se = sd/√(Ln) on L(n − 1) degrees of freedom) at Holm's first step
    ``alpha``: to detect its planned effect (two-sided), and TOST's at a true 0 against its margin."""
    from .inference import t_test_power, tost_power

    languages = languages if c.pooled else 1
    df = languages * (n - 1)
    if n < 2 or not (math.isfinite(c.sd) and c.sd > 0):
        return math.nan, math.nan
    se = c.sd / math.sqrt(languages * n)
    return t_test_power(c.effect / se, df, 1 - alpha), tost_power(c.margin, se, df, alpha)


def seeds_to_decide(c: ClaimSpec, alpha: float, languages: int = 1, start: int = 2, cap: int = 10_000,
                    power: float = 0.8) -> int | None:
    """The fewest seeds (≥ ``start``; per language) at which ``c`` is *decided* with ``power``
    whichever way the truth lies: detected at its planned effect, and — unless it is a positive
    control — "no effect beyond ±δ" at a true 0 (TOST), both at Holm's first step ``alpha``;
    ``None`` without a prior spread or beyond ``cap``."""
    if not (math.isfinite(c.sd) and c.sd > 0):
        return None

    def ok(n: int) -> bool:
        detect, null = decide_power(c, n, alpha, languages)
        return detect >= power and (c.control or null >= power)

    n = max(start, 2)
    while n <= cap:
        if ok(n):
            return n
        n += 1
    return None


@dataclass(frozen=True)
class DesignPlan:
    """What ``plan_design`` fixed before the data: per test the seeds it runs on (``seeds``:
    the claims, then the other comparisons the budget left room for), the claims planned (the
    Holm family, ``level`` = 1 − α/m), each claim's planned power to detect and to show no
    effect (``power``), the tests left out with what each would need (``left``), and the
    forecast wall seconds."""

    seeds: dict[str, int]
    claims: tuple[str, ...]
    power: dict[str, tuple[float, float]]
    left: dict[str, str]
    wall: float
    level: float


def plan_design(claims: list[ClaimSpec], others: list[ClaimSpec], wall, budget: float, *, languages: int = 1,
                start: int = 3, cap: int = 48, alpha: float = 0.05) -> DesignPlan:
    """The claims first: every claim with a prior spread is planned the seeds that decide it
    (``seeds_to_decide``) at Holm's first step over the claims planned (α/m); while the plan's
    wall time (``wall(seeds)``: seconds of a plan ``{test: seeds}``) exceeds ``budget``, the
    claim whose removal shortens it most is left out (a positive control, ``ClaimSpec.control``,
    only once no other claim is left) and the others are planned again at the
    smaller family's level. Then, with the budget left, the other comparisons (``others``,
    planned alike within their own family), cheapest first. A test left out is named with the
    seeds it would need and the minutes it would add."""
    family = [c for c in claims if math.isfinite(c.sd) and c.sd > 0]
    left = {c.test: "no prior paired SD to plan with" for c in claims if c not in family}
    need: dict[str, int] = {}
    dropped: list[ClaimSpec] = []  # left out for the budget alone
    while family:
        a = alpha / len(family)
        found = {c.test: seeds_to_decide(c, a, languages, start, cap) for c in family}
        beyond = [c for c in family if found[c.test] is None]
        if beyond:
            for c in beyond:
                family.remove(c)
                left[c.test] = f"more than {cap} seeds" + (" a language" if languages > 1 else "")
            continue
        need = {t: int(n) for t, n in found.items()}
        if wall(need) <= budget:
            break
        # a positive control is left out last: without it no null of the design can be read as the
        # assay's (it shows that an effect of the paper's size is seen)
        candidates = [c for c in family if not c.control] or family
        drop = min(candidates, key=lambda c: (wall({t: n for t, n in need.items() if t != c.test}), -need[c.test]))
        family.remove(drop)
        dropped.append(drop)
    if not family:
        need = {}
    level_alpha = alpha / max(len(family), 1)
    for c in dropped:  # what each claim left out for the budget would need beside the ones planned
        n = seeds_to_decide(c, alpha / (len(family) + 1), languages, start, cap)
        extra = (wall({**need, c.test: n}) - wall(need)) / 60
        left[c.test] = f"{n} seeds" + (" a language" if languages > 1 else "") + f", +{extra:.0f} min: beyond the budget"
    seeds = dict(need)
    pool = [c for c in others if math.isfinite(c.sd) and c.sd > 0]
    other_alpha = alpha / max(len(pool), 1)
    for c in sorted(pool, key=lambda c: (wall({**seeds, c.test: seeds_to_decide(c, other_alpha, languages, start, cap)
                                                or cap}), c.test)):
        n = seeds_to_decide(c, other_alpha, languages, start, cap)
        if n is not None and wall({**seeds, c.test: n}) <= budget:
            seeds[c.test] = n
    power = {c.test: decide_power(c, need[c.test], level_alpha, languages) for c in family}
    return DesignPlan(seeds, tuple(c.test for c in family), power, left, wall(seeds), 1 - level_alpha)
