"""Random layered PCFGs shaped like the released one (``random_layered``): the grammars of
the ``pcfg`` language's named sizes and of ``language.params`` (the fields of
``GrammarShape`` are the settings a user may change, by name)."""

from __future__ import annotations

import dataclasses

import torch

from ..errors import UserError
from .pcfg_grammar import Grammar


@dataclasses.dataclass(frozen=True)
class GrammarShape:
    """The shape of a layered random grammar (``random_layered``); the defaults give the
    paper's sizes: 200 words, 1 + 9 + 5*8 = 50 non-terminals, sentences <= 32 tokens.
    Its fields are what ``language.params`` may change (``pcfg.PARAMS``), so they are the
    keywords ``PCFG.random`` and the sizes (``pcfg.PRESETS``) give by name."""

    n_words: int = 200
    n_roots: int = 9
    n_levels: int = 5
    symbols_per_level: int = 8
    binary_rules_per_symbol: int = 20
    emit_prob: float = 0.1
    words_per_emission: int = 1
    words_per_last_symbol: int = 80
    concentration: float = 1.0


def random_layered(shape: GrammarShape = GrammarShape(), seed: int = 0) -> Grammar:
    """A layered random grammar of ``shape``, drawn from ``seed``, shaped like the released one.

    ``S -> S_i`` (``n_roots`` roots, Dirichlet weights of ``concentration``);
    ``S_i -> L1_a L1_b`` (one fixed pair); a symbol of level ``k < n_levels`` rewrites to a
    pair of level ``k+1`` symbols (``binary_rules_per_symbol`` distinct pairs) or, with
    total probability ``emit_prob``, to one of ``words_per_emission`` words; last-level
    symbols emit ``words_per_last_symbol`` words. Sentences have between 2 and
    ``2**n_levels`` words, trees depth at most ``n_levels + 2`` (S, S_i, levels, word).
    """
    for name in ("n_words", "n_roots", "n_levels", "symbols_per_level", "binary_rules_per_symbol",
                 "words_per_emission", "words_per_last_symbol"):
        if getattr(shape, name) < 1:
            raise UserError(f"random grammar: {name} must be >= 1, got {getattr(shape, name)}")
    if not 0.0 <= shape.emit_prob < 1.0:
        raise UserError(f"random grammar: emit_prob must be in [0, 1), got {shape.emit_prob}")
    if shape.binary_rules_per_symbol > shape.symbols_per_level**2:
        raise UserError("random grammar: binary_rules_per_symbol exceeds the number of symbol pairs")
    if max(shape.words_per_emission, shape.words_per_last_symbol) > shape.n_words:
        raise UserError("random grammar: a symbol cannot emit more distinct words than n_words")
    if 2 * shape.n_roots < shape.symbols_per_level:
        raise UserError("random grammar: 2 * n_roots must be >= symbols_per_level so every symbol is reachable")
    # every draw from torch's global generator, seeded with ``seed`` and restored after
    # (``fork_rng``): torch's Gamma sampler takes no generator of its own
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        words, lines = _draw(shape)
    grammar = Grammar.from_text("\n".join(lines), source="<random grammar>")
    return _with_word_order(grammar, words)


def _draw(shape: GrammarShape) -> tuple[list[str], list[str]]:
    """The words and the rules (text lines) of ``random_layered``'s grammar, drawn from torch's
    global generator."""
    n_words, n_roots, n_levels = shape.n_words, shape.n_roots, shape.n_levels
    symbols_per_level, binary_rules_per_symbol = shape.symbols_per_level, shape.binary_rules_per_symbol
    emit_prob, words_per_emission = shape.emit_prob, shape.words_per_emission
    words_per_last_symbol, concentration = shape.words_per_last_symbol, shape.concentration

    def dirichlet(k: int) -> list[float]:
        alpha = torch.full((k,), concentration, dtype=torch.float64)
        g = torch.distributions.Gamma(alpha, 1.0, validate_args=False).sample()
        return (g / g.sum()).tolist()

    def pick(k: int, n: int) -> list[int]:
        return torch.randperm(n)[:k].tolist()

    words = [f"w{i}" for i in range(n_words)]
    lines = ["root S"]
    for i, p in enumerate(dirichlet(n_roots)):
        lines.append(f"S -> S{i + 1} {p!r}")
    # every level-1 symbol gets used by some root (when there are enough root slots)
    slots = torch.randperm(symbols_per_level).tolist()
    slots += torch.randint(symbols_per_level, (max(2 * n_roots - len(slots), 0),)).tolist()
    slots = [slots[i] for i in torch.randperm(len(slots)).tolist()]
    for i in range(n_roots):
        lines.append(f"S{i + 1} -> L1_{slots[2 * i]} L1_{slots[2 * i + 1]} 1.0")
    for level in range(1, n_levels):
        rule_pairs = [pick(binary_rules_per_symbol, symbols_per_level**2) for _ in range(symbols_per_level)]
        _ensure_every_child_used(rule_pairs, symbols_per_level)
        for s, pairs in enumerate(rule_pairs):
            for pair, p in zip(pairs, dirichlet(len(pairs))):
                lb, rb = divmod(pair, symbols_per_level)
                lines.append(f"L{level}_{s} -> L{level + 1}_{lb} L{level + 1}_{rb} {p * (1 - emit_prob)!r}")
            if emit_prob > 0:
                for w, p in zip(pick(words_per_emission, n_words), dirichlet(words_per_emission)):
                    lines.append(f'L{level}_{s} -> "{words[w]}" {p * emit_prob!r}')
    for s in range(symbols_per_level):
        for w, p in zip(pick(words_per_last_symbol, n_words), dirichlet(words_per_last_symbol)):
            lines.append(f'L{n_levels}_{s} -> "{words[w]}" {p!r}')
    return words, lines


def _ensure_every_child_used(rule_pairs: list[list[int]], k: int) -> None:
    """Rewrite left children so every next-level symbol appears in some rule (an
    unused symbol would be unreachable). Pairs are ``left * k + right``."""
    used = {p // k for pairs in rule_pairs for p in pairs} | {p % k for pairs in rule_pairs for p in pairs}
    missing = [c for c in range(k) if c not in used]
    slots = [(s, j) for j in range(max(map(len, rule_pairs))) for s in range(len(rule_pairs)) if j < len(rule_pairs[s])]
    for c, (s, j) in zip(missing, slots):
        new = c * k + rule_pairs[s][j] % k
        if new not in rule_pairs[s]:
            rule_pairs[s][j] = new
    used = {p // k for pairs in rule_pairs for p in pairs} | {p % k for pairs in rule_pairs for p in pairs}
    if len(used) < k:
        raise UserError("random grammar: too few binary rules to use every symbol of the next level")


def _with_word_order(g: Grammar, words: list[str]) -> Grammar:
    """Reindex words as w0..w{n-1} (words never emitted still get an id, so the
    vocabulary size is exactly ``n_words``)."""
    order = {w: i for i, w in enumerate(words)}
    emission = torch.zeros(g.n_nonterminals, len(words), dtype=torch.float64)
    for j, w in enumerate(g.words):
        emission[:, order[w]] = g.emission[:, j]
    return dataclasses.replace(g, words=tuple(words), emission=emission)
