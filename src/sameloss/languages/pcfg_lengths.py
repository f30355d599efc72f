"""What a PCFG's rules say about its sentences before any is sampled: the exact length
distribution (the inside algorithm on lengths), the fewest words each symbol yields, the
branching process of derivations (expected offspring, termination, regime, expected
length) and the symbols reachable from the root. ``pcfg_grammar.Grammar``'s methods of the
same names; ``g`` is a ``Grammar``."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

# Up to this many non-terminals the branching-process numbers of ``length_report`` come
# from dense linear algebra (exact); above it, from iterations over the sparse rules.
DENSE_SYMBOLS = 500

# A critical grammar has spectral radius exactly 1; allow for the rounding of eigvals.
CRITICAL_TOL = 1e-9


@dataclass(frozen=True)
class LengthReport:
    """Sentence lengths as the grammar's generating function gives them (see
    ``Grammar.length_report``). Probabilities are of one derivation drawn from the start
    distribution, before any length cap."""

    max_len: int
    length_probs: torch.Tensor  # [max_len + 1] float64: P(the sentence has exactly l words)
    fit: float  # P(the sentence has at most max_len words): the sampler's acceptance rate
    terminates: float  # P(the derivation is finite)
    spectral_radius: float  # of the expected-offspring matrix over the reachable symbols
    regime: str  # "subcritical" (< 1), "critical" (= 1) or "supercritical" (> 1)
    expected_length: float  # E[words]; infinite unless subcritical
    shortest: int  # fewest words any sentence has

    def describe(self) -> str:
        """The numbers, in words, for an error message."""
        rho = f"{self.regime}, spectral radius {self.spectral_radius:.6g}"
        if self.regime == "subcritical":
            return f"{rho}, expected length {self.expected_length:.4g} words"
        if self.regime == "critical":
            return f"{rho}: expected length infinite"
        return f"{rho}: a derivation terminates with probability {self.terminates:.3g}"


def length_table(g, max_len: int) -> torch.Tensor:
    """``[N, max_len + 1]`` float64: P(symbol A derives a string of exactly l words).

    The inside algorithm on lengths (every word read as "any word"): ``f[A, 1]`` is
    A's emission mass and ``f[A, l] = sum over A -> B C and splits m of
    P(A -> B C) f[B, m] f[C, l - m]``; one step per length, vectorised over rules.
    """
    f = torch.zeros(g.n_nonterminals, max_len + 1, dtype=torch.float64)
    f[:, 1] = g.emission.sum(dim=1)
    for length in range(2, max_len + 1):
        left = f[g.rule_left, 1:length]  # the left child's m = 1 .. l-1 words
        right = f[g.rule_right, 1:length].flip(1)  # the right child's l-m words
        f[:, length].index_add_(0, g.rule_parent, g.rule_prob * (left * right).sum(dim=1))
    return f

def shortest_yields(g) -> torch.Tensor:
    """``[N]`` float64: the fewest words each symbol can derive (inf: none)."""
    best = torch.where(g.emission.sum(dim=1) > 0, 1.0, math.inf).double()
    live = g.rule_prob > 0
    parent, left, right = g.rule_parent[live], g.rule_left[live], g.rule_right[live]
    while True:  # Bellman-Ford: at most N rounds, each O(rules)
        new = best.scatter_reduce(0, parent, best[left] + best[right], reduce="amin")
        if torch.equal(new, best):
            return best
        best = new

def offspring_matrix(g) -> torch.Tensor:
    """``[N, N]`` float64 (sparse COO above ``DENSE_SYMBOLS`` symbols): the expected
    number of B children of one A node. Its spectral radius decides whether
    derivations die out surely with finite mean size (< 1), surely with infinite mean
    size (= 1), or run forever with positive probability (> 1)."""
    n = g.n_nonterminals
    rows = torch.cat([g.rule_parent, g.rule_parent])
    cols = torch.cat([g.rule_left, g.rule_right])
    vals = torch.cat([g.rule_prob, g.rule_prob])
    if n > DENSE_SYMBOLS:
        return torch.sparse_coo_tensor(torch.stack([rows, cols]), vals, (n, n), check_invariants=True).coalesce()
    return torch.zeros(n, n, dtype=torch.float64).index_put_((rows, cols), vals, accumulate=True)

def termination_probabilities(g) -> torch.Tensor:
    """``[N]`` float64: P(a derivation from A is finite), the least fixed point of
    ``q_A = emit_A + sum over A -> B C of P(A -> B C) q_B q_C``.

    Newton's method from 0 converges monotonically to the least fixed point of such
    a monotone polynomial system when every symbol is productive (Esparza, Kiefer &
    Luttenberger 2010), and fast even at criticality, where plain iteration crawls.
    Above ``DENSE_SYMBOLS`` symbols plain iteration is used (5000 rounds): exact to
    rounding away from criticality, within about 1e-3 at it.
    """
    emit = g.emission.sum(dim=1)
    n = g.n_nonterminals
    x = torch.zeros(n, dtype=torch.float64)

    def step(x):
        return emit.index_add(0, g.rule_parent, g.rule_prob * x[g.rule_left] * x[g.rule_right])

    if n <= DENSE_SYMBOLS:
        eye = torch.eye(n, dtype=torch.float64)
        for _ in range(200):
            jac = torch.zeros(n, n, dtype=torch.float64)
            jac.index_put_((g.rule_parent, g.rule_left), g.rule_prob * x[g.rule_right], accumulate=True)
            jac.index_put_((g.rule_parent, g.rule_right), g.rule_prob * x[g.rule_left], accumulate=True)
            try:
                new = (x + torch.linalg.solve(eye - jac, step(x) - x)).clamp(0.0, 1.0)
            except RuntimeError:  # singular only at the fixed point itself: done
                break
            if torch.allclose(new, x, rtol=0.0, atol=1e-15):
                return new
            x = new
    for _ in range(5000):  # plain iteration: large grammars, or polishing after Newton
        new = step(x).clamp(0.0, 1.0)
        if torch.allclose(new, x, rtol=0.0, atol=1e-15):
            return new
        x = new
    return x

def length_report(g, max_len: int) -> LengthReport:
    """Sentence-length numbers from the grammar's generating function: the exact
    length distribution up to ``max_len`` (``length_table``), the probability that a
    derivation terminates, the branching regime and the expected length."""
    reach = reachable(g)
    start = g.start / g.start.sum()
    length_probs = start @ length_table(g, max_len)
    m = offspring_matrix(g)
    if m.is_sparse:
        rho = _spectral_radius_sparse(m, reach)
    else:
        sub = m[reach][:, reach]
        rho = float(torch.linalg.eigvals(sub).abs().max()) if sub.numel() else 0.0
    regime = ("subcritical" if rho < 1 - CRITICAL_TOL else
              "critical" if rho <= 1 + CRITICAL_TOL else "supercritical")
    expected = math.inf
    if regime == "subcritical":
        # expected words = expected visits to each symbol (start (I - M)^-1) times its emission mass
        emit = g.emission.sum(dim=1)
        if m.is_sparse:
            visits = start.clone()
            for _ in range(10_000):
                new = start + torch.sparse.mm(m.t(), visits[:, None]).flatten()
                if torch.allclose(new, visits, rtol=1e-13, atol=0.0):
                    break
                visits = new
        else:  # over the reachable symbols: an unreachable part may be (super)critical
            sub = m[reach][:, reach]
            visits = torch.zeros_like(start)
            visits[reach] = torch.linalg.solve(torch.eye(sub.shape[0], dtype=torch.float64) - sub.T, start[reach])
        expected = float(visits @ emit)
    shortest = float(shortest_yields(g)[start > 0].min())
    return LengthReport(
        max_len=max_len,
        length_probs=length_probs,
        fit=float(length_probs.sum()),
        terminates=float(start @ termination_probabilities(g)),
        spectral_radius=rho,
        regime=regime,
        expected_length=expected,
        shortest=int(shortest),
    )

def reachable(g) -> torch.Tensor:
    """``[N]`` bool: symbols some derivation from the root uses."""
    reached = g.start > 0
    reached[g.root] = True
    live = g.rule_prob > 0
    while True:
        new = reached.clone()
        used = reached[g.rule_parent] & live
        new[g.rule_left[used]] = True
        new[g.rule_right[used]] = True
        if torch.equal(new, reached):
            return reached
        reached = new

def possible_lengths(g, max_len: int) -> torch.Tensor:
    """``[N, max_len + 1]`` bool: can symbol A yield a string of length l?

    Used to skip, exactly, every (span length, split) pair in which a rule cannot
    take part — for layered grammars this removes most of the chart work.
    """
    n = g.n_nonterminals
    can = torch.zeros(n, max_len + 1, dtype=torch.bool)
    can[:, 1] = g.emission.sum(dim=1) > 0
    for length in range(2, max_len + 1):
        for m in range(1, length):
            ok = can[g.rule_left, m] & can[g.rule_right, length - m]
            can[g.rule_parent[ok], length] = True
    return can


def _spectral_radius_sparse(m: torch.Tensor, keep: torch.Tensor, iterations: int = 2000) -> float:
    """Spectral radius of a large non-negative sparse matrix restricted to ``keep``, by
    power iteration on ``M + I`` (same Perron vector, radius shifted by 1, and no
    periodic oscillation); the Collatz-Wielandt ratio max_i (Ax)_i / x_i bounds it from
    above and tightens as x converges."""
    x = keep.double()
    bound = math.inf
    for _ in range(iterations):
        y = (torch.sparse.mm(m, x[:, None]).flatten() + x) * keep
        pos = x > 0
        previous, bound = bound, float((y[pos] / x[pos]).max()) - 1.0
        if abs(bound - previous) <= 1e-13 * max(bound, 1.0):
            break
        x = y / y.max()
    return max(bound, 0.0)
