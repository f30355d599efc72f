"""Flatness as the treatment (``isoloss``'s trace-penalty forks), analysed by assigned arm.

Each arm is a penalty weight λ (a flattening λ > 0, a sharpening λ < 0) forked from the same
base as AdamW (λ = 0), so within a seed every arm's paired difference at its target KL
against AdamW, ``d_a`` (points), is a randomised contrast. λ is the instrument; the realised
trace change is a mediator measured with error, never the regressor of a test:

* **each arm against AdamW**: the comparisons' own rows (``paired.differences``), with the
  trace change each arm achieved (``arm_changes``: the relative change at the target, its
  t interval over seeds) — and, where measured, the weight norm and the adaptive
  (reparametrisation-invariant) trace, so that "flatter" is not a rescaling;
* **the trend over λ** (``trend``): per seed the least-squares slope through the origin of its
  arms' differences on λ (``b_s = Σ λ d / Σ λ²``: the origin is AdamW's own arm, so the line
  through it is the design, not an assumption), t over seeds on n − 1 degrees of freedom;
  the paper's direction positive (a flatter arm transfers better); its margin is the claims'
  δ at the strongest arm (δ / max |λ|);
* **the effect of the trace per unit** (``wald``): the trend in accuracy over the trend in
  relative trace change (2SLS with λ the instrument: the Wald ratio of the two per-seed
  slopes), with Fieller's interval (t on n − 1; unbounded where the trace's trend is not
  distinguishable from 0).

Every pair with a line to read is used (no extrapolation limit, no floor on the trace
change: the analysis is by assignment). The per-pair scatter of accuracy difference on
realised trace change is kept for an exploratory figure only (``dose_points``), labelled so."""

from __future__ import annotations

import math

import numpy as np

from .inference import t_quantile
from .paired import UNINFORMATIVE, Comparison, Design, TestKey, after_holm, holm_counted
from .weighted import tost_p

LAMBDA_UNIT = 1e-4  # λ is shown (and the trend's slope read) per this unit of penalty weight


def _readable(pairs: list[dict], c: Comparison, point: str) -> list[dict]:
    return [p for p in pairs if p["comparison"] == c.name and p["point"] == point
            and p["readable"] in (True, "True")]


def dose_points(pairs: list[dict], comparisons: list[Comparison], point: str, key: str,
                lambdas: dict[str, float]) -> list[dict]:
    """One row per readable pair of the flatness comparisons at ``point``: its seed, arm, λ
    (in ``LAMBDA_UNIT``), the relative trace change at the target (``x``: recipe ÷ reference
    − 1, nan where the reference's trace is 0) and the paired primary difference (``y``,
    points)."""
    out = []
    for c in comparisons:
        for p in _readable(pairs, c, point):
            ref = float(p["reference_trace_fisher"])
            x = float(p["recipe_trace_fisher"]) / ref - 1 if ref else math.nan
            row = {"seed": int(p["seed"]), "fork": c.recipe, "comparison": c.name, "point": point,
                   "lam": lambdas[c.recipe] / LAMBDA_UNIT, "x": x, "y": 100.0 * float(p[f"d_{key}"])}
            for extra in ("weight_norm_sq", "adaptive_trace"):
                if f"recipe_{extra}" in p and float(p[f"reference_{extra}"]):
                    row[f"x_{extra}"] = float(p[f"recipe_{extra}"]) / float(p[f"reference_{extra}"]) - 1
            out.append(row)
    return out


def _t_interval(values: list[float]) -> tuple[float, float, float, int]:
    """Mean, 95% t interval and n of ``values`` (nan where n < 2)."""
    v = np.asarray([x for x in values if math.isfinite(x)], dtype=float)
    n = v.size
    if n < 2:
        return (float(v.mean()) if n else math.nan), math.nan, math.nan, n
    half = t_quantile(0.975, n - 1) * float(v.std(ddof=1)) / math.sqrt(n)
    return float(v.mean()), float(v.mean()) - half, float(v.mean()) + half, n


def arm_changes(points: list[dict]) -> list[dict]:
    """Per arm and fork point, the relative change against AdamW at the target (mean, 95% t
    interval over seeds) of the trace — and of the weight norm and the adaptive trace where
    measured: what each arm achieved."""
    out = []
    for (point, fork) in dict.fromkeys((r["point"], r["fork"]) for r in points):
        mine = [r for r in points if r["point"] == point and r["fork"] == fork]
        row = {"test": str(TestKey(mine[0]['comparison'], point)), "fork": fork, "point": point, "lam": mine[0]["lam"]}
        for key, name in (("x", "trace"), ("x_weight_norm_sq", "weight_norm_sq"),
                          ("x_adaptive_trace", "adaptive_trace")):
            if any(key in r for r in mine):
                m, lo, hi, n = _t_interval([r.get(key, math.nan) for r in mine])
                row.update({f"{name}_change": m, f"{name}_low": lo, f"{name}_high": hi, f"{name}_n": n})
        out.append(row)
    return out


def _per_seed(points: list[dict], value: str) -> dict[int, float]:
    """Each seed's slope through the origin of ``value`` on λ over its arms."""
    by: dict[int, list[dict]] = {}
    for r in points:
        if math.isfinite(r[value]):
            by.setdefault(r["seed"], []).append(r)
    return {s: sum(r["lam"] * r[value] for r in rs) / sum(r["lam"] ** 2 for r in rs) for s, rs in by.items()}


def trend(points: list[dict], margin: float, design: Design) -> dict:
    """The trend of the primary difference over λ at one fork point (``points``: that
    point's ``dose_points``): the mean over seeds of each seed's slope through the origin
    (points per ``LAMBDA_UNIT`` of λ), its t interval, p, TOST p against ``margin`` / max |λ|
    and the verdict (the paper's direction positive)."""
    from .inference import PairedDifference, power_verdict

    slopes = _per_seed(points, "y")
    v = np.asarray(list(slopes.values()), dtype=float)
    n = v.size
    strongest = max((abs(r["lam"]) for r in points), default=math.nan)
    trend_margin = margin / strongest if strongest else math.nan
    row = {"n_seeds": n, "arms": ", ".join(dict.fromkeys(r["fork"] for r in points)), "margin": trend_margin,
           "slope": float(v.mean()) if n else math.nan}
    nan = math.nan
    if n < 2:
        row.update(low=nan, high=nan, p_value=nan, tost_p=nan,
                   verdict=UNINFORMATIVE if not design.headroom else f"no interval: {n} seed(s)")
        return row
    sd = float(v.std(ddof=1))
    se = sd / math.sqrt(n)
    half = t_quantile(0.975, n - 1) * se
    eq = t_quantile(0.95, n - 1) * se
    pd = PairedDifference(n, row["slope"], sd, row["slope"] - half, row["slope"] + half, nan, nan, nan, nan,
                          degenerate=not se > 0, eq_low=row["slope"] - eq, eq_high=row["slope"] + eq, df=n - 1)
    from scipy.stats import t as student_t

    p = float(2 * student_t.sf(abs(row["slope"]) / se, n - 1)) if se > 0 else nan
    row.update(low=pd.t_low, high=pd.t_high, p_value=p, tost_p=tost_p(row["slope"], se, n - 1, trend_margin),
               verdict=power_verdict(pd, +1, trend_margin) if design.headroom else UNINFORMATIVE)
    return row


def fieller(a: np.ndarray, b: np.ndarray, level: float = 0.95) -> tuple[float, float, float]:
    """The ratio ``mean(a) / mean(b)`` of two paired samples (one value each per seed) with
    Fieller's interval at ``level`` (t on n − 1): the β with ``(ā − βb̄)² ≤ t² Var(ā − βb̄)``;
    ``(−inf, inf)`` where the denominator's mean is not distinguishable from 0 at ``level``
    (the set is then unbounded)."""
    n = a.size
    if n < 2:
        return math.nan, math.nan, math.nan
    ma, mb = float(a.mean()), float(b.mean())
    cov = np.cov(np.stack([a, b]), ddof=1) / n
    va, vb, c = float(cov[0, 0]), float(cov[1, 1]), float(cov[0, 1])
    t2 = t_quantile(0.5 + level / 2, n - 1) ** 2
    ratio = ma / mb if mb else math.nan
    qa, qb, qc = mb * mb - t2 * vb, -2 * (ma * mb - t2 * c), ma * ma - t2 * va
    disc = qb * qb - 4 * qa * qc
    if qa <= 0 or disc < 0:
        return ratio, -math.inf, math.inf
    root = math.sqrt(disc)
    return ratio, (-qb - root) / (2 * qa), (-qb + root) / (2 * qa)


def wald(points: list[dict]) -> dict:
    """The effect of the trace per unit at one fork point, λ the instrument: the per-seed
    trend of the accuracy difference over the per-seed trend of the relative trace change
    (points per unit of relative trace change; ``per_10pc_lower``: per 10 % lower trace), with
    Fieller's interval over the seeds that have both."""
    ys, xs = _per_seed(points, "y"), _per_seed(points, "x")
    seeds = sorted(set(ys) & set(xs))
    a = np.array([ys[s] for s in seeds], dtype=float)
    b = np.array([xs[s] for s in seeds], dtype=float)
    ratio, low, high = fieller(a, b)
    bounded = math.isfinite(low) and math.isfinite(high)
    return {"wald": ratio, "wald_low": low if bounded else math.nan, "wald_high": high if bounded else math.nan,
            "wald_interval": "" if bounded or not math.isfinite(ratio) else
            "unbounded: the trace's trend is within its noise", "wald_seeds": len(seeds),
            "trace_trend": float(b.mean()) if b.size else math.nan}


def dose_response(pairs: list[dict], comparisons: list[Comparison], points: list[str], key: str, design: Design,
                  lambdas: dict[str, float], margin: float) -> tuple[list[dict], list[dict], list[dict]]:
    """Flatness by assigned arm at every fork point (module docstring): the trend tests (Holm
    over the fork points) with the Wald ratio beside each, the changes each arm achieved, and
    the per-pair points (the exploratory figure's). ``comparisons``: each flatness arm
    against AdamW; ``lambdas``: each arm's λ; ``margin``: the flatness claims' δ (points)."""
    out, changes, every = [], [], []
    for point in points:
        pts = dose_points(pairs, comparisons, point, key, lambdas)
        every += pts
        changes += arm_changes(pts)
        row = {"test": f"flatness trend @ {point}", "point": point, **trend(pts, margin, design), **wald(pts)}
        out.append(row)
    for r, q, qe in zip(out, holm_counted([r["p_value"] for r in out]), holm_counted([r["tost_p"] for r in out])):
        r["holm_p"], r["tost_holm_p"] = q, qe
        r["after_holm"] = after_holm(r["verdict"], q, qe)
    return out, changes, every
