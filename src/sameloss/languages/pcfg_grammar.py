"""PCFG grammars: the data structure, the two text formats, validation, random generation.

A grammar here is in Chomsky normal form with one exception: the root may have unary
rules ``S -> X`` (the released grammar has ``S -> S1 .. S9``). Those are folded into a
*start distribution* over non-terminals, so the parser only ever sees binary rules
``A -> B C`` and emissions ``A -> word``.

Two text formats are read (``Grammar.from_file`` tells them apart by ``->``):

* **released** — the authors' ``rule_deep_mlm.txt``: one rule per line,
  ``LHS RHS1 [RHS2] PROB``; a one-symbol right-hand side that is not the left-hand side
  of any rule is a word; repeated rules add their probabilities; the root is ``S``.
* **sameloss** — ours, written by ``Grammar.save``::

      # comments and blank lines are allowed
      root S
      S  -> S1         0.25      # unary rules only from the root
      S1 -> A B        1.0
      A  -> "walk"     0.5       # words are double-quoted
      A  -> B B        0.5

  Words are quoted, so a word can never be mistaken for a non-terminal; repeated rules
  add their probabilities here too. An optional ``words "w0" "w1" ...`` line fixes the
  word ids (in that order, including words no rule emits); otherwise words are numbered
  in order of first appearance.

Every problem a user can put in a file (malformed line, bad probability, rules that do
not sum to one, a symbol with no rules, an unreachable symbol, ...) raises
``InputFileError`` naming the file and line.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import InputFileError, UserError
from ..progress import Progress
from . import pcfg_lengths
from .pcfg_lengths import LengthReport

# The released grammar's rule sets sum to 1 only up to rounding (worst: A4_1, 0.99977).
# Sums within this tolerance are renormalised exactly (and listed in
# ``Grammar.renormalised``); anything further off is an error.
NORMALISATION_TOL = 1e-3


@dataclass(frozen=True)
class Grammar:
    """A PCFG with unary rules folded into ``start``.

    nonterminals: names, index = symbol id. words: names, index = word id.
    start: ``[N]`` float64, probability that the tree's top symbol is each non-terminal.
    rule_parent, rule_left, rule_right: ``[R]`` long, the binary rules ``A -> B C``.
    rule_prob: ``[R]`` float64, ``P(A -> B C | A)`` (renormalised for the root when it
        also has unary rules, so that each row of a sampling table sums to one).
    emission: ``[N, W]`` float64, ``P(A -> w | A)`` (renormalised likewise).
    root: index of the root symbol.
    renormalised: symbols whose rule probabilities summed to 1 only up to rounding,
        with the sum found in the file (they were divided by it).
    unreachable: symbols no derivation from the root uses. An error in our format; in the
        released format it is tolerated because the released grammar has one (``A1_9``):
        the symbol is kept, so task class ids match the file, but never occurs.
    """

    nonterminals: tuple[str, ...]
    words: tuple[str, ...]
    start: torch.Tensor
    rule_parent: torch.Tensor
    rule_left: torch.Tensor
    rule_right: torch.Tensor
    rule_prob: torch.Tensor
    emission: torch.Tensor
    root: int
    renormalised: tuple[tuple[str, float], ...] = ()
    unreachable: tuple[str, ...] = ()

    @property
    def n_nonterminals(self) -> int:
        return len(self.nonterminals)

    @property
    def n_words(self) -> int:
        return len(self.words)

    @property
    def n_rules(self) -> int:
        return int(self.rule_parent.numel())

    @property
    def start_symbols(self) -> list[int]:
        """Non-terminals a tree can start from (S1..S9 for the released grammar)."""
        return [int(i) for i in torch.nonzero(self.start > 0).flatten()]

    # ---- reading --------------------------------------------------------------------
    @staticmethod
    def from_file(path: str | Path) -> Grammar:
        path = Path(path)
        if not path.exists():
            raise UserError(f"grammar file not found: {path}")
        try:
            # utf-8-sig: a byte-order mark some editors put at the start is not a symbol
            text = path.read_text(encoding="utf-8-sig")
        except (OSError, UnicodeDecodeError) as exc:
            raise UserError(f"cannot read grammar file {path}: {exc}") from None
        return Grammar.from_text(text, source=str(path))

    @staticmethod
    def from_text(text: str, source: str = "<grammar>") -> Grammar:
        text = text.removeprefix("\ufeff")
        if not any(_strip_comment(line) for line in text.splitlines()):
            what = "the file is empty" if not text.strip() else "only comments and blank lines"
            raise InputFileError(f"the grammar has no rules ({what})", source)
        ours = any("->" in _strip_comment(line) for line in text.splitlines())
        progress = Progress(f"grammar {source}: reading line", text.count("\n") + 1)
        rules = _parse_ours(text, source, progress) if ours else _parse_released(text, source, progress)
        grammar = _build(rules, source, strict=ours)
        progress.close()
        return grammar

    # ---- writing --------------------------------------------------------------------
    def to_text(self) -> str:
        """The grammar in the sameloss format (round-trips through ``from_text``)."""
        nts, root = self.nonterminals, self.nonterminals[self.root]
        quoted = " ".join('"' + w.replace("\\", "\\\\").replace('"', '\\"') + '"' for w in self.words)
        lines = ["# sameloss PCFG", f"root {root}", f"words {quoted}"]
        root_keep = float(self.start[self.root])
        for x in self.start_symbols:
            if x != self.root:
                lines.append(f"{root} -> {nts[x]} {float(self.start[x])!r}")
        for a in range(self.n_nonterminals):
            scale = root_keep if a == self.root else 1.0
            for r in torch.nonzero(self.rule_parent == a).flatten().tolist():
                b, c = int(self.rule_left[r]), int(self.rule_right[r])
                lines.append(f"{nts[a]} -> {nts[b]} {nts[c]} {float(self.rule_prob[r]) * scale!r}")
            for w in torch.nonzero(self.emission[a] > 0).flatten().tolist():
                word = self.words[w].replace("\\", "\\\\").replace('"', '\\"')
                lines.append(f'{nts[a]} -> "{word}" {float(self.emission[a, w]) * scale!r}')
        return "\n".join(lines) + "\n"

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_text(), encoding="utf-8")

    # ---- derived tables (``pcfg_lengths``) ------------------------------------------------
    def length_table(self, max_len: int) -> torch.Tensor:
        """``[N, max_len + 1]`` float64: P(symbol A derives a string of exactly l words)."""
        return pcfg_lengths.length_table(self, max_len)

    def shortest_yields(self) -> torch.Tensor:
        """``[N]`` float64: the fewest words each symbol can derive (inf: none)."""
        return pcfg_lengths.shortest_yields(self)

    def offspring_matrix(self) -> torch.Tensor:
        """``[N, N]``: the expected number of B children of one A node."""
        return pcfg_lengths.offspring_matrix(self)

    def termination_probabilities(self) -> torch.Tensor:
        """``[N]`` float64: P(a derivation from A is finite)."""
        return pcfg_lengths.termination_probabilities(self)

    def length_report(self, max_len: int) -> LengthReport:
        """Sentence-length numbers from the grammar's generating function."""
        return pcfg_lengths.length_report(self, max_len)

    def reachable(self) -> torch.Tensor:
        """``[N]`` bool: symbols some derivation from the root uses."""
        return pcfg_lengths.reachable(self)

    def possible_lengths(self, max_len: int) -> torch.Tensor:
        """``[N, max_len + 1]`` bool: can symbol A yield a string of length l?"""
        return pcfg_lengths.possible_lengths(self, max_len)


# ---- parsing ------------------------------------------------------------------------
@dataclass
class _Rule:
    lhs: str
    rhs: tuple[tuple[str, bool], ...]  # (name, is_word or None-if-unknown)
    prob: float
    line: int


_QUOTED = re.compile(r'"((?:[^"\\]|\\.)*)"')


def _strip_comment(line: str) -> str:
    # a '#' inside a quoted word is part of the word
    out, in_quote, escaped = [], False, False
    for ch in line:
        if ch == "#" and not in_quote:
            break
        out.append(ch)
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == '"':
            in_quote = not in_quote
    return "".join(out).strip()


def _unquote(match: re.Match, source: str, line: int) -> str:
    word = re.sub(r"\\(.)", r"\1", match.group(1))
    if not word:
        # an empty word would be an invisible token in every sentence and in the vocabulary
        raise InputFileError('empty word "": a word needs at least one character', source, line)
    return word


def _parse_prob(text: str, source: str, line: int) -> float:
    try:
        p = float(text)
    except ValueError:
        raise InputFileError(f"probability {text!r} is not a number", source, line) from None
    if math.isnan(p) or math.isinf(p):
        raise InputFileError(f"probability is {text}, not a finite number", source, line)
    if p < 0:
        raise InputFileError(f"probability {text} is negative", source, line)
    return p


def _parse_released(text: str, source: str, progress: Progress | None = None) -> list[_Rule]:
    rules = []
    for no, raw in enumerate(text.splitlines(), start=1):
        if progress is not None and no % 4096 == 0:
            progress(no)
        fields = raw.split()
        if not fields:
            continue
        if len(fields) not in (3, 4):
            raise InputFileError(
                f"expected 'LHS RHS1 [RHS2] PROB', got {len(fields)} fields: {raw.strip()!r}", source, no)
        prob = _parse_prob(fields[-1], source, no)
        # whether a one-symbol RHS is a word is decided once all LHS names are known
        rules.append(_Rule(fields[0], tuple((f, None) for f in fields[1:-1]), prob, no))
    lhs_names = {r.lhs for r in rules}
    for r in rules:
        if len(r.rhs) == 1:
            name = r.rhs[0][0]
            r.rhs = ((name, name not in lhs_names),)
        else:
            r.rhs = tuple((name, False) for name, _ in r.rhs)
    if not rules:
        raise InputFileError("the grammar has no rules", source)
    rules.insert(0, _Rule("", (("S", False),), 1.0, 0))  # marker: root is S
    return rules


def _quoted_words(text: str, source: str, line: int) -> list[str]:
    words, pos = [], 0
    while pos < len(text):
        if text[pos].isspace():
            pos += 1
            continue
        m = _QUOTED.match(text, pos)
        if not m:
            raise InputFileError("expected double-quoted words after 'words'", source, line)
        words.append(_unquote(m, source, line))
        pos = m.end()
    return words


def _parse_ours(text: str, source: str, progress: Progress | None = None) -> list[_Rule]:
    rules, root, vocabulary = [], None, []
    for no, raw in enumerate(text.splitlines(), start=1):
        if progress is not None and no % 4096 == 0:
            progress(no)
        line = _strip_comment(raw)
        if not line:
            continue
        if line.startswith("words ") or line == "words":
            vocabulary += _quoted_words(line[5:], source, no)
            continue
        if line.startswith("root ") or line == "root":
            parts = line.split()
            if len(parts) != 2:
                raise InputFileError("expected 'root SYMBOL'", source, no)
            if root is not None:
                raise InputFileError("the root is declared twice", source, no)
            root = parts[1]
            continue
        if "->" not in line:
            raise InputFileError(f"expected 'LHS -> RHS1 [RHS2] PROB', got {line!r}", source, no)
        lhs, rest = (s.strip() for s in line.split("->", 1))
        if not lhs or len(lhs.split()) != 1:
            raise InputFileError(f"bad left-hand side {lhs!r}", source, no)
        tokens = []
        pos = 0
        while pos < len(rest):
            if rest[pos].isspace():
                pos += 1
                continue
            m = _QUOTED.match(rest, pos)
            if m:
                tokens.append((_unquote(m, source, no), True))
                pos = m.end()
            elif rest[pos] == '"':
                raise InputFileError("unterminated quoted word", source, no)
            else:
                end = pos
                while end < len(rest) and not rest[end].isspace():
                    end += 1
                tokens.append((rest[pos:end], False))
                pos = end
        if len(tokens) not in (2, 3) or tokens[-1][1]:
            raise InputFileError(f"expected 'LHS -> RHS1 [RHS2] PROB', got {line!r}", source, no)
        prob = _parse_prob(tokens[-1][0], source, no)
        rhs = tuple(tokens[:-1])
        if len(rhs) == 2 and any(is_word for _, is_word in rhs):
            raise InputFileError("a binary rule must rewrite to two non-terminals (no quoted words)", source, no)
        rules.append(_Rule(lhs, rhs, prob, no))
    if not rules:
        raise InputFileError("the grammar has no rules", source)
    rules.insert(0, _Rule("", ((root or "S", False),) + tuple((w, True) for w in vocabulary), 1.0, 0))
    return rules


def _build(rules: list[_Rule], source: str, strict: bool = True) -> Grammar:
    """The grammar of parsed ``rules`` (the first entry a marker: the root's name, then the
    declared vocabulary, if any), checked: normalised, every symbol with rules, unary
    rules from the root only, every symbol reachable (``strict``) and productive."""
    root_name = rules[0].rhs[0][0]
    declared_words = [name for name, _ in rules[0].rhs[1:]]
    rules = rules[1:]
    first_line, totals, renormalised = _normalise(rules, root_name, source)
    nts, words = _symbols(rules, root_name, declared_words, totals, source)
    nt_index = {n: i for i, n in enumerate(nts)}
    start, emission, binary = _tables(rules, nt_index, {w: i for i, w in enumerate(words)}, nt_index[root_name],
                                      source)
    keys = list(binary)
    grammar = Grammar(
        nonterminals=tuple(nts),
        words=tuple(words),
        start=start,
        rule_parent=torch.tensor([k[0] for k in keys], dtype=torch.long),
        rule_left=torch.tensor([k[1] for k in keys], dtype=torch.long),
        rule_right=torch.tensor([k[2] for k in keys], dtype=torch.long),
        rule_prob=torch.tensor([binary[k] for k in keys], dtype=torch.float64),
        emission=emission,
        root=nt_index[root_name],
        renormalised=renormalised,
    )
    unreachable = _unreachable(grammar)
    if unreachable and strict:
        name = unreachable[0]
        raise InputFileError(f"symbol {name!r} is unreachable from the root", source, first_line.get(name))
    _check_productive(grammar, first_line, source)
    return dataclasses.replace(grammar, unreachable=tuple(unreachable))


def _normalise(rules: list[_Rule], root_name: str, source: str
               ) -> tuple[dict[str, int], dict[str, float], tuple[tuple[str, float], ...]]:
    """Each symbol's rules divided by their sum (in place), refused beyond
    ``NORMALISATION_TOL``: the first line of each symbol, the sums, and those that were
    renormalised (off 1 by more than rounding)."""
    first_line: dict[str, int] = {}
    totals: dict[str, float] = {}
    for r in rules:
        first_line.setdefault(r.lhs, r.line)
        totals[r.lhs] = totals.get(r.lhs, 0.0) + r.prob
    if root_name not in totals:
        raise InputFileError(f"the root symbol {root_name!r} has no rules", source)
    for name, total in totals.items():
        if abs(total - 1.0) > NORMALISATION_TOL:
            raise InputFileError(
                f"the rules of {name!r} sum to {total:.9g}, not 1 (non-normalised grammar)", source, first_line[name])
    renormalised = tuple((name, total) for name, total in totals.items() if abs(total - 1.0) > 1e-12)
    for r in rules:
        r.prob /= totals[r.lhs]
    return first_line, totals, renormalised


def _symbols(rules: list[_Rule], root_name: str, declared_words: list[str], totals: dict[str, float], source: str
             ) -> tuple[list[str], list[str]]:
    """The non-terminals and the words, each in order of first appearance (declared words
    first); every symbol used must have rules, and only the root may rewrite to one."""
    nts: OrderedDict[str, None] = OrderedDict()
    words: OrderedDict[str, None] = OrderedDict((w, None) for w in declared_words)
    nts[root_name] = None
    for r in rules:
        nts.setdefault(r.lhs, None)
    for r in rules:
        for name, is_word in r.rhs:
            if is_word:
                words.setdefault(name, None)
            elif name not in totals:
                raise InputFileError(f"symbol {name!r} has no rules", source, r.line)
    for r in rules:
        if len(r.rhs) == 1 and not r.rhs[0][1]:
            target = r.rhs[0][0]
            if r.lhs != root_name:
                raise InputFileError(
                    f"unary rule {r.lhs} -> {target}: only the root may have unary rules", source, r.line)
            if target == root_name:
                raise InputFileError(f"unary rule {r.lhs} -> {target} rewrites the root to itself", source, r.line)
    if not words:
        raise InputFileError("the grammar emits no words", source)
    return list(nts), list(words)


def _tables(rules: list[_Rule], nt_index: dict[str, int], w_index: dict[str, int], root: int, source: str
            ) -> tuple[torch.Tensor, torch.Tensor, OrderedDict]:
    """The start distribution (the root's unary rules folded into it), the emission table
    and the binary rules ``{(parent, left, right): probability}``."""
    n_nt, n_w = len(nt_index), len(w_index)
    start = torch.zeros(n_nt, dtype=torch.float64)
    emission = torch.zeros(n_nt, n_w, dtype=torch.float64)
    binary: OrderedDict[tuple[int, int, int], float] = OrderedDict()
    unary_targets = {r.rhs[0][0] for r in rules if len(r.rhs) == 1 and not r.rhs[0][1]}
    for r in rules:
        a = nt_index[r.lhs]
        if len(r.rhs) == 2:
            key = (a, nt_index[r.rhs[0][0]], nt_index[r.rhs[1][0]])
            binary[key] = binary.get(key, 0.0) + r.prob
        elif r.rhs[0][1]:
            emission[a, w_index[r.rhs[0][0]]] += r.prob
        else:
            start[nt_index[r.rhs[0][0]]] += r.prob
    unary_mass = float(start.sum())
    for t in unary_targets:
        if any(len(r.rhs) == 1 and not r.rhs[0][1] for r in rules if r.lhs == t):
            raise InputFileError(f"unary chain through {t!r}: unary rules are only allowed from the root", source)
    # the root keeps the mass of its own binary/emission rules; those are renormalised
    # so the root's sampling table is a distribution
    keep = 1.0 - unary_mass
    start[root] = max(keep, 0.0)
    if start[root] > NORMALISATION_TOL:
        emission[root] /= keep
        for key in list(binary):
            if key[0] == root:
                binary[key] /= keep
    else:
        start[root] = 0.0
        emission[root] = 0.0
        for key in [k for k in binary if k[0] == root]:
            del binary[key]
    return start, emission, binary


def _unreachable(g: Grammar) -> list[str]:
    reached = g.reachable()
    return [name for i, name in enumerate(g.nonterminals) if not reached[i]]


def _check_productive(g: Grammar, first_line: dict[str, int], source: str) -> None:
    """Every non-terminal must derive some finite string, else its rules are dead weight
    and the inside probabilities of trees through it are silently zero."""
    productive = g.emission.sum(dim=1) > 0
    while True:
        ok = productive[g.rule_left] & productive[g.rule_right] & (g.rule_prob > 0)
        new = productive.clone()
        new[g.rule_parent[ok]] = True
        if torch.equal(new, productive):
            break
        productive = new
    dead = [name for i, name in enumerate(g.nonterminals)
            # the root of a grammar with unary root rules has no rules of its own
            if not productive[i] and not (i == g.root and g.start[g.root] == 0)]
    if dead:
        names = ", ".join(repr(d) for d in dead)
        verb = "derives" if len(dead) == 1 else "derive"
        raise InputFileError(f"symbol{'s' if len(dead) > 1 else ''} {names} {verb} no finite string",
                             source, first_line.get(dead[0]))
    if not bool((productive & (g.start > 0)).any()):
        raise InputFileError("the root derives no finite string", source)
