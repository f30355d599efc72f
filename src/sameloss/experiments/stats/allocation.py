"""Seeds spent where the answer is still open: an internal pilot, then only the forks of the
comparisons still short of their power (issue 35).

A paired study's comparisons need very different numbers of seeds: the seeds a comparison
needs for a minimum detectable effect ``target`` grow with the square of its paired spread.
Spending seeds evenly runs every fork on every seed; this module runs every fork on the
first ``pilot`` seeds, estimates each comparison's paired SD from them, and plans for each
comparison the seeds its MDE target needs (``needed_seeds``: the noncentral-t MDE, as the
verdicts use), capped at the study's seeds (and at what a budget buys). Every later seed
runs its base and only the forks of the comparisons still short (``Allocation.active``);
each comparison's test then uses all of its seeds.

The final test is Stein's two-stage test (Stein 1945; ``stats.paired_difference`` with
``pilot``): the mean over every seed, its spread from the pilot's seeds alone on k − 1
degrees of freedom. The plan reads the pilot's spread, never its mean; but a t test whose
spread came from all the seeds would be too liberal — a pilot whose spread came out small
plans few seeds, and those few keep the small spread — which the simulation showed (type-I
error 0.06–0.08 for a pilot of 6 and a planned ~8 seeds); Stein's statistic is exactly t
whatever the pilot drew, and the seeds are planned by its own power bound
(``stats.stein_mde``), so the MDE target holds with at least 80 % power whatever the true
spread. ``bench/isoloss_allocation.py`` simulates whole studies through this code and the
study's decision code. Stopping a comparison early because its pilot effect
is large (a group-sequential design with an alpha-spending boundary) would save more seeds
but needs the boundaries in every verdict; it is not done here.

A comparison marked ``exempt`` (the adversary: its effect is several points) is tested on
the pilot's seeds only. Everything here is fixed in the preset before any data: the pilot's
size, the target, the cap, the exempt comparisons.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..reports.document import Column, Section, Table
from .inference import minimum_detectable_effect, stein_mde


def needed_seeds(sd: float, target: float, start: int = 2, level: float = 0.95, power: float = 0.8,
                 limit: int = 10_000, pilot: int | None = None) -> int | None:
    """The fewest seeds (≥ ``start``) whose paired test has an MDE at or below ``target``
    given the paired SD ``sd``: the ordinary t test's (``stats.minimum_detectable_effect``),
    or with ``pilot`` = k the MDE of Stein's two-stage test whose spread ``sd`` is the
    pilot's (``stats.stein_mde``: what an adaptive study's final test is); ``None`` when
    ``sd`` is not a finite positive number (nothing to plan with) or ``limit`` seeds do not
    reach it. The MDE falls monotonically with n: a doubling search, then bisection."""
    if not (math.isfinite(sd) and sd > 0) or target <= 0:
        return None
    start = max(start, 2)

    def ok(n: int) -> bool:
        if pilot is not None:
            return stein_mde(sd, n, pilot, level, power) <= target
        return minimum_detectable_effect(sd, n, level, power) <= target

    if ok(start):
        return start
    high = start
    while not ok(high):
        if high >= limit:
            return None
        high = min(2 * high, limit)
    low = max(start, high // 2)  # not ok(low) unless low == start, which was checked
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if ok(mid) else (mid, high)
    return high


@dataclass(frozen=True)
class Allocation:
    """The plan of an adaptive study: per test (``"comparison @ point"``) the pilot's paired
    SD, the seeds its MDE target needs at ``level`` (Holm's first step in the primary family:
    ``1 − α/m``; ``None``: not reachable, or no spread to plan with), and the seeds planned —
    the needed ones capped at ``cap`` seeds (the study's, or fewer where a budget cut it),
    never fewer than the pilot's; exempt tests and tests outside ``family`` get the pilot's."""

    pilot: int
    target: float
    cap: int
    sds: dict[str, float]
    needed: dict[str, int | None]
    planned: dict[str, int]
    exempt: tuple[str, ...] = ()
    budget_note: str = ""
    costs: dict[str, float] = field(default_factory=dict)  # CPU seconds per later seed, by test (what a seed costs)
    family: tuple[str, ...] = ()  # the tests planned (the primary family; the rest ride along)
    level: float = 0.95  # the two-sided level the family's tests are planned at (1 − α/m)

    def active(self, index: int) -> list[str]:
        """The tests the seed at position ``index`` (0-based) of the study's seeds runs."""
        return [t for t, n in self.planned.items() if n > index]

    @property
    def seeds(self) -> int:
        """How many of the study's seeds run anything."""
        return max([self.pilot, *self.planned.values()])


def allocate(sds: dict[str, float], pilot: int, cap: int, target: float, exempt: tuple[str, ...] = (),
             family: tuple[str, ...] | None = None, alpha: float = 0.05) -> Allocation:
    """``Allocation`` from the pilot's paired SDs (``sds`` by test): each test of ``family``
    (the primary family fixed before the data; ``None``: every test) planned for its power
    after Holm — at Holm's first step ``α/m``, m the family's size (its exempt tests counted),
    a lower bound of Holm's power; the others get the pilot's seeds."""
    family = tuple(sds) if family is None else tuple(family)
    level = 1 - alpha / max(len(family), 1)
    needed, planned = {}, {}
    for test, sd in sds.items():
        skip = _is_exempt(test, exempt) or test not in family
        n = None if skip else needed_seeds(sd, target, start=pilot, level=level, pilot=pilot)
        needed[test] = n
        if skip or not (math.isfinite(sd) and sd > 0):
            planned[test] = pilot  # exempt, not a claim, or nothing to plan with (no spread, or too few pairs)
        else:
            planned[test] = cap if n is None else min(cap, n)
    return Allocation(pilot, target, cap, dict(sds), needed, planned, tuple(exempt), family=family, level=level)


def _is_exempt(test: str, exempt: tuple[str, ...]) -> bool:
    return test.split(" @ ")[0] in exempt


def afford(alloc: Allocation, seed_cost, pilot_seconds: float, budget_seconds: float, workers: int
           ) -> Allocation:
    """The allocation cut to what a budget buys: later seeds are added in order, each costing
    ``seed_cost(tests)`` CPU seconds for the tests it runs, shared out over ``workers`` at
    once (wall ≈ summed CPU / workers), after the pilot's ``pilot_seconds`` of wall time;
    the seeds past the last affordable one are dropped (every test planned beyond it is cut
    to it)."""
    wall = pilot_seconds
    last = alloc.pilot  # seeds affordable in all
    for index in range(alloc.pilot, alloc.seeds):
        tests = alloc.active(index)
        cost = seed_cost(tests) / max(workers, 1)
        if wall + cost > budget_seconds:
            break
        wall += cost
        last = index + 1
    planned = {t: min(n, last) for t, n in alloc.planned.items()}
    note = (f"a budget of {budget_seconds / 60:.0f} min buys {last} seeds (the pilot's {alloc.pilot} and "
            f"{last - alloc.pilot} more; estimated {wall / 60:.0f} min with {workers} at once)")
    return Allocation(alloc.pilot, alloc.target, alloc.cap, alloc.sds, alloc.needed, planned, alloc.exempt, note,
                      family=alloc.family, level=alloc.level)


def allocation_table(section: Section, alloc: Allocation, used: dict[str, int], source: str) -> list[dict]:
    """The plan in the report: per test the pilot's paired SD, the seeds the target needs, the
    seeds planned and used."""
    rows = [{"test": t, "pilot_sd": alloc.sds[t],
             "needed": alloc.needed[t] if alloc.needed[t] is not None else math.nan,
             "planned": alloc.planned[t], "used": used.get(t, 0),
             "note": ("exempt: tested on the pilot" if _is_exempt(t, alloc.exempt) else
                      "not a claim: the seeds its forks run on" if t not in alloc.family else
                      "no spread in the pilot to plan with" if not (math.isfinite(alloc.sds[t]) and alloc.sds[t] > 0)
                      else f"the target needs more than the {alloc.cap} seeds" if alloc.needed[t] is None
                      or alloc.needed[t] > alloc.cap else
                      "cut by the budget" if alloc.planned[t] < alloc.needed[t] else "")}
            for t in alloc.planned]
    section.files[source] = rows
    section.tables.append(Table(
        f"Seeds where the answer is open: a pilot of {alloc.pilot} seeds ran every fork; from its effective SD of "
        f"the primary accuracy (the weighted estimate's standard error × √n) each claim of the primary family was "
        f"planned the seeds its MDE target ({alloc.target:g} points, 80% power after Holm: Stein's test at level "
        f"α = {1 - alloc.level:.3g}, α/m over the {len(alloc.family)} tests of the family) needs, at most "
        f"{alloc.cap}; every later seed ran only the forks of the claims still short"
        + (f"; {alloc.budget_note}" if alloc.budget_note else ""),
        [Column("pilot effective SD", "pilot_sd", fmt=".3g"), Column("seeds needed", "needed", fmt="d"),
         Column("planned", "planned", fmt="d"), Column("used", "used", fmt="d"), Column("note", "note", text=True)],
        rows, source=source, key="test", key_header="comparison @ fork point"))
    return rows


# ---- the claims a budget can decide (issues 46, 52) -------------------------------------------------
@dataclass(frozen=True)
class ClaimPlan:
    """What a budget buys for a family of claims (``plan_claims``): the claims that fit — the
    primary family, Holm over these — with each one's seeds and planned power against the
    target after Holm, and the claims left out with the seeds they would need."""

    family: tuple[str, ...]
    seeds: dict[str, int]
    power: dict[str, float]
    left_out: dict[str, int | None]  # seeds each would need in the final family (None: more than the cap)
    level: float  # 1 − α/m: Holm's first step, the level planned for
    cost: float  # seconds the plan costs (the pilot's seeds and the later ones)
    pilot: int = 0


def plan_cost(seeds: dict[str, int], seed_cost, pilot: int = 0, every: list[str] | None = None) -> float:
    """Seconds of a plan: seed i runs the tests planned beyond it (``seed_cost(tests)``); the
    first ``pilot`` seeds run ``every`` test (default: those of ``seeds``)."""
    last = max([pilot, *seeds.values()], default=0)
    every = list(seeds) if every is None else every
    return sum(seed_cost(every) if i < pilot else seed_cost([t for t, n in seeds.items() if n > i])
               for i in range(last))


def plan_claims(sds: dict[str, float], seed_cost, budget: float, target: float | dict[str, float], pilot: int = 0,
                cap: int = 10_000, alpha: float = 0.05, power: float = 0.8) -> ClaimPlan:
    """The claims a budget can decide and the seeds each gets: ``sds`` the paired SD of each
    claim (``"comparison @ point"``: a prior, or a pilot's), ``seed_cost(tests)`` the seconds
    of one seed that runs those claims' forks (``fork_seed_cost`` builds one from the cost
    per fork), ``budget`` seconds, ``target`` the effect to detect with ``power`` after Holm
    over the claims kept (points, or one per claim, e.g. a positive control's expected
    effect; each test at α/m: Stein's test on a pilot of ``pilot`` seeds, else the t test).
    A claim without a prior spread, or that needs more than ``cap`` seeds, is
    left out; while the plan costs more than the budget, the claim whose removal saves the
    most is left out, and the others are planned again at the smaller family's level (a
    smaller m asks fewer seeds of each)."""
    targets = target if isinstance(target, dict) else dict.fromkeys(sds, target)
    family = [t for t, sd in sds.items() if math.isfinite(sd) and sd > 0]
    left: dict[str, int | None] = {t: None for t in sds if t not in family}
    while True:
        level = 1 - alpha / max(len(family), 1)
        need = {t: needed_seeds(sds[t], targets[t], start=max(pilot, 2), level=level, power=power,
                                pilot=pilot if pilot >= 2 else None, limit=cap) for t in family}
        if None in need.values():
            drop = max((t for t in family if need[t] is None), key=lambda t: sds[t])
        else:
            cost = plan_cost(need, seed_cost, pilot)
            if cost <= budget or not family:
                break
            drop = min(family, key=lambda t: plan_cost({u: need[u] for u in family if u != t}, seed_cost, pilot))
        family.remove(drop)
        left[drop] = need[drop]
    powers = {t: _planned_power(sds[t], targets[t], n, level, pilot) for t, n in need.items()}
    return ClaimPlan(tuple(family), dict(need), powers, left, level, cost, pilot)


def _planned_power(sd: float, target: float, n: int, level: float, pilot: int) -> float:
    """The power against ``target`` of the t test over ``n`` seeds at ``level`` (Stein's: the
    t test on the pilot's degrees of freedom, a close approximation)."""
    from .inference import t_test_power

    df = pilot - 1 if pilot >= 2 else n - 1
    return t_test_power(target * math.sqrt(n) / sd, df, level)


def fork_seed_cost(fork_seconds: dict[str, float], forks: dict[str, tuple[str, ...]], base: float = 0.0):
    """``seed_cost`` for ``plan_claims`` from the seconds per fork (``fork_seconds``: every
    fork a seed may run, e.g. ``"late|noreg"``), the forks each test compares (``forks``) and
    a seed's fixed cost (``base``: its base run and gate): a fork shared by two tests is paid
    once."""
    def seed_cost(tests: list[str]) -> float:
        return base + sum(fork_seconds[f] for f in {f for t in tests for f in forks[t]})
    return seed_cost


# ---- a study across languages (issue 36) -------------------------------------------------------
TAUS = (0.0, 0.1, 0.2)  # between-language spreads of the true effects the forecast shows (points)


def pooled_forecast(tests: list[str], sds: dict[str, float], languages: int, seeds: int, target: float,
                    source: str, exempt: tuple[str, ...] = (), taus: tuple[float, ...] = TAUS) -> str:
    """What a study of ``languages`` languages × ``seeds`` seeds each plans for its pooled
    verdicts (``pooling.pooled_mde``: the HKSJ test of the language estimates): per test the prior
    paired SD (``sds``, measured on one language: ``source``) and the pooled MDE at each
    between-language spread τ of ``taus``; then, for the test with the largest SD, the fewest seeds
    per language that reach ``target`` for each number of languages — the trade the study's
    scale was chosen from (languages buy more than seeds: the t quantile on L − 1 degrees of
    freedom, and τ², which no number of seeds shrinks)."""
    from .pooling import pooled_mde

    if not any(math.isfinite(sds.get(t, math.nan)) for t in tests):
        return (f"Pooled verdicts across languages ({languages} languages × {seeds} seeds each): no prior paired SDs "
                "of the primary accuracy, so no pooled MDE to plan with (pooling.pooled_mde plans it from one "
                "language's measured SDs and the spread τ of the true effects between languages)")
    lines = [f"Pooled verdicts across languages ({languages} languages × {seeds} seeds each; prior paired SDs of the "
             f"primary accuracy: {source}; the pooled MDE at 80 % power of the random-effects (HKSJ) test, for a "
             f"spread τ of the true effects between languages):",
             f"{'comparison @ point':<28} {'prior SD':>9} " + " ".join(f"{f'MDE τ={t:g}':>11}" for t in taus)]
    planned = [t for t in tests if not t.startswith(tuple(f"{x} @" for x in exempt))]
    for test in planned:
        sd = sds.get(test, math.nan)
        cells = " ".join(f"{pooled_mde(sd, tau, languages, seeds):>11.2f}" if math.isfinite(sd) else f"{'no prior':>11}"
                         for tau in taus)
        lines.append(f"{test:<28} {sd:>9.3g} {cells}")
    known = {t: sds[t] for t in planned if math.isfinite(sds.get(t, math.nan))}
    if known:
        worst = max(known, key=known.get)
        row = []
        for n_lang in range(3, 9):
            cells = []
            for tau in taus:
                m = next((m for m in range(2, 201) if pooled_mde(known[worst], tau, n_lang, m) <= target), None)
                cells.append(f"τ={tau:g}: {m if m else '>200'}")
            row.append(f"{n_lang} languages: " + ", ".join(cells))
        lines.append(f"seeds per language for a pooled MDE ≤ {target:g} on {worst} (the largest prior SD): "
                     + "; ".join(row))
    return "\n".join(lines)
