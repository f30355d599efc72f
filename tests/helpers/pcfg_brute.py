"""Brute force for small PCFGs: every tree, every string, by explicit enumeration.

Independent of the chart code: trees are built recursively as nested tuples, so every
probability here is a plain sum over explicit trees.
"""

from __future__ import annotations

from collections import defaultdict
from functools import lru_cache

from sameloss.languages.pcfg_grammar import Grammar


def enumerate_trees(g: Grammar, max_len: int):
    """All trees of yield length <= max_len, as ``{string: [(prob, constituents)]}``
    with constituents a frozenset of ``(start, end, symbol)`` (the unary root S itself
    is left out, as in the chart)."""
    emissions = defaultdict(list)
    for a in range(g.n_nonterminals):
        for w in range(g.n_words):
            p = float(g.emission[a, w])
            if p > 0:
                emissions[a].append((w, p))
    rules = defaultdict(list)
    for r in range(g.n_rules):
        rules[int(g.rule_parent[r])].append((int(g.rule_left[r]), int(g.rule_right[r]), float(g.rule_prob[r])))

    @lru_cache(maxsize=None)
    def trees(a: int, length: int):
        """[(string, prob, constituents relative to 0)] for symbol a yielding `length` words."""
        out = []
        if length == 1:
            for w, p in emissions[a]:
                out.append(((w,), p, frozenset({(0, 1, a)})))
            return out
        for b, c, p in rules[a]:
            for m in range(1, length):
                for s1, p1, k1 in trees(b, m):
                    for s2, p2, k2 in trees(c, length - m):
                        shifted = frozenset((i + m, j + m, x) for i, j, x in k2)
                        out.append((s1 + s2, p * p1 * p2, k1 | shifted | {(0, length, a)}))
        return out

    by_string = defaultdict(list)
    for a in range(g.n_nonterminals):
        pa = float(g.start[a])
        if pa == 0:
            continue
        for length in range(1, max_len + 1):
            for s, p, k in trees(a, length):
                by_string[s].append((pa * p, k))
    return by_string, trees


def string_probs(by_string) -> dict[tuple[int, ...], float]:
    return {s: sum(p for p, _ in ts) for s, ts in by_string.items()}


def conditional(probs, sentence, masked, t, n_words):
    """P(x_t = w | words at unmasked positions other than t), same length."""
    n = len(sentence)
    hidden = set(masked) | {t}
    out = [0.0] * n_words
    for s, p in probs.items():
        if len(s) != n:
            continue
        if all(s[i] == sentence[i] for i in range(n) if i not in hidden):
            out[s[t]] += p
    total = sum(out)
    return [x / total for x in out]


# A recursive grammar (A -> A B), unary root rules *and* root rules of its own, words
# emitted at several levels: the cases the layered grammars do not cover.
RECURSIVE = """
root S
S -> X 0.3
S -> Y 0.2
S -> A B 0.5            # the root's own binary rule
X -> A B 0.6
X -> "a" 0.4
Y -> B A 0.7
Y -> Y Y 0.1
Y -> "c" 0.2
A -> A B 0.3
A -> "a" 0.5
A -> "b" 0.2
B -> "b" 0.6
B -> "c" 0.3
B -> "d" 0.1
"""
