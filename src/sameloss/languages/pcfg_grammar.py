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
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import InputFileError, UserError
from ..progress import say

# The released grammar's rule sets sum to 1 only up to rounding (worst: A4_1, 0.99977).
# Sums within this tolerance are renormalised exactly (and listed in
# ``Grammar.renormalised``); anything further off is an error.
NORMALISATION_TOL = 1e-3


# Up to this many non-terminals the branching-process numbers of ``length_report`` come
# from dense linear algebra (exact); above it, from iterations over the sparse rules.
DENSE_SYMBOLS = 500

# A critical grammar has spectral radius exactly 1; allow for the rounding of eigvals.
CRITICAL_TOL = 1e-9


class Progress:
    """Plain progress lines (``progress.say``) for a step that turns out slow.

    Silent for the first ``after`` seconds (fast steps print nothing), then one line at
    most every ``every`` seconds, and a last line with the time taken. Plain lines, not
    a bar, so a log file reads the same as a terminal.
    """

    def __init__(self, what: str, total: int | None = None, after: float = 2.0, every: float = 5.0):
        self.what, self.total, self.after, self.every = what, total, after, every
        self.start = self.last = time.monotonic()
        self.printed = False

    def __call__(self, done: int) -> None:
        now = time.monotonic()
        if now - self.start >= self.after and now - self.last >= (self.every if self.printed else self.after):
            of = f"/{self.total}" if self.total is not None else ""
            say(f"{self.what}: {done}{of} ({now - self.start:.0f} s)")
            self.last, self.printed = now, True

    def close(self) -> None:
        elapsed = time.monotonic() - self.start
        if self.printed or elapsed >= self.after:
            say(f"{self.what}: done in {elapsed:.1f} s")


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

    # ---- derived tables -------------------------------------------------------------
    def length_table(self, max_len: int) -> torch.Tensor:
        """``[N, max_len + 1]`` float64: P(symbol A derives a string of exactly l words).

        The inside algorithm on lengths (every word read as "any word"): ``f[A, 1]`` is
        A's emission mass and ``f[A, l] = sum over A -> B C and splits m of
        P(A -> B C) f[B, m] f[C, l - m]``; one step per length, vectorised over rules.
        """
        f = torch.zeros(self.n_nonterminals, max_len + 1, dtype=torch.float64)
        f[:, 1] = self.emission.sum(dim=1)
        for length in range(2, max_len + 1):
            left = f[self.rule_left, 1:length]  # the left child's m = 1 .. l-1 words
            right = f[self.rule_right, 1:length].flip(1)  # the right child's l-m words
            f[:, length].index_add_(0, self.rule_parent, self.rule_prob * (left * right).sum(dim=1))
        return f

    def shortest_yields(self) -> torch.Tensor:
        """``[N]`` float64: the fewest words each symbol can derive (inf: none)."""
        best = torch.where(self.emission.sum(dim=1) > 0, 1.0, math.inf).double()
        live = self.rule_prob > 0
        parent, left, right = self.rule_parent[live], self.rule_left[live], self.rule_right[live]
        while True:  # Bellman-Ford: at most N rounds, each O(rules)
            new = best.scatter_reduce(0, parent, best[left] + best[right], reduce="amin")
            if torch.equal(new, best):
                return best
            best = new

    def offspring_matrix(self) -> torch.Tensor:
        """``[N, N]`` float64 (sparse COO above ``DENSE_SYMBOLS`` symbols): the expected
        number of B children of one A node. Its spectral radius decides whether
        derivations die out surely with finite mean size (< 1), surely with infinite mean
        size (= 1), or run forever with positive probability (> 1)."""
        n = self.n_nonterminals
        rows = torch.cat([self.rule_parent, self.rule_parent])
        cols = torch.cat([self.rule_left, self.rule_right])
        vals = torch.cat([self.rule_prob, self.rule_prob])
        if n > DENSE_SYMBOLS:
            return torch.sparse_coo_tensor(torch.stack([rows, cols]), vals, (n, n), check_invariants=True).coalesce()
        return torch.zeros(n, n, dtype=torch.float64).index_put_((rows, cols), vals, accumulate=True)

    def termination_probabilities(self) -> torch.Tensor:
        """``[N]`` float64: P(a derivation from A is finite), the least fixed point of
        ``q_A = emit_A + sum over A -> B C of P(A -> B C) q_B q_C``.

        Newton's method from 0 converges monotonically to the least fixed point of such
        a monotone polynomial system when every symbol is productive (Esparza, Kiefer &
        Luttenberger 2010), and fast even at criticality, where plain iteration crawls.
        Above ``DENSE_SYMBOLS`` symbols plain iteration is used (5000 rounds): exact to
        rounding away from criticality, within about 1e-3 at it.
        """
        emit = self.emission.sum(dim=1)
        n = self.n_nonterminals
        x = torch.zeros(n, dtype=torch.float64)

        def step(x):
            return emit.index_add(0, self.rule_parent, self.rule_prob * x[self.rule_left] * x[self.rule_right])

        if n <= DENSE_SYMBOLS:
            eye = torch.eye(n, dtype=torch.float64)
            for _ in range(200):
                jac = torch.zeros(n, n, dtype=torch.float64)
                jac.index_put_((self.rule_parent, self.rule_left), self.rule_prob * x[self.rule_right], accumulate=True)
                jac.index_put_((self.rule_parent, self.rule_right), self.rule_prob * x[self.rule_left], accumulate=True)
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

    def length_report(self, max_len: int) -> LengthReport:
        """Sentence-length numbers from the grammar's generating function: the exact
        length distribution up to ``max_len`` (``length_table``), the probability that a
        derivation terminates, the branching regime and the expected length."""
        reach = self.reachable()
        start = self.start / self.start.sum()
        length_probs = start @ self.length_table(max_len)
        m = self.offspring_matrix()
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
            emit = self.emission.sum(dim=1)
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
        shortest = float(self.shortest_yields()[start > 0].min())
        return LengthReport(
            max_len=max_len,
            length_probs=length_probs,
            fit=float(length_probs.sum()),
            terminates=float(start @ self.termination_probabilities()),
            spectral_radius=rho,
            regime=regime,
            expected_length=expected,
            shortest=int(shortest),
        )

    def reachable(self) -> torch.Tensor:
        """``[N]`` bool: symbols some derivation from the root uses."""
        reached = self.start > 0
        reached[self.root] = True
        live = self.rule_prob > 0
        while True:
            new = reached.clone()
            used = reached[self.rule_parent] & live
            new[self.rule_left[used]] = True
            new[self.rule_right[used]] = True
            if torch.equal(new, reached):
                return reached
            reached = new

    def possible_lengths(self, max_len: int) -> torch.Tensor:
        """``[N, max_len + 1]`` bool: can symbol A yield a string of length l?

        Used to skip, exactly, every (span length, split) pair in which a rule cannot
        take part — for layered grammars this removes most of the chart work.
        """
        n = self.n_nonterminals
        can = torch.zeros(n, max_len + 1, dtype=torch.bool)
        can[:, 1] = self.emission.sum(dim=1) > 0
        for length in range(2, max_len + 1):
            for m in range(1, length):
                ok = can[self.rule_left, m] & can[self.rule_right, length - m]
                can[self.rule_parent[ok], length] = True
        return can


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
    # the first entry is a marker: the root's name, then the declared vocabulary (if any)
    root_name = rules[0].rhs[0][0]
    declared_words = [name for name, _ in rules[0].rhs[1:]]
    rules = rules[1:]
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

    # symbols: non-terminals in order of first appearance; words likewise
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

    nt_index = {n: i for i, n in enumerate(nts)}
    w_index = {w: i for i, w in enumerate(words)}
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
    root = nt_index[root_name]
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
        root=root,
        renormalised=renormalised,
    )
    unreachable = _unreachable(grammar)
    if unreachable and strict:
        name = unreachable[0]
        raise InputFileError(f"symbol {name!r} is unreachable from the root", source, first_line.get(name))
    _check_productive(grammar, first_line, source)
    return dataclasses.replace(grammar, unreachable=tuple(unreachable))


def _unreachable(g: Grammar) -> list[str]:
    reached = g.reachable()
    return [name for i, name in enumerate(g.nonterminals) if not reached[i]]


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


# ---- random layered grammars --------------------------------------------------------
def random_layered(
    n_words: int = 200,
    n_roots: int = 9,
    n_levels: int = 5,
    symbols_per_level: int = 8,
    binary_rules_per_symbol: int = 20,
    emit_prob: float = 0.1,
    words_per_emission: int = 1,
    words_per_last_symbol: int = 80,
    concentration: float = 1.0,
    seed: int = 0,
) -> Grammar:
    """A layered random grammar shaped like the released one.

    ``S -> S_i`` (``n_roots`` roots, Dirichlet weights); ``S_i -> L1_a L1_b`` (one fixed
    pair); a symbol of level ``k < n_levels`` rewrites to a pair of level ``k+1``
    symbols (``binary_rules_per_symbol`` distinct pairs) or, with total probability
    ``emit_prob``, to one of ``words_per_emission`` words; last-level symbols emit
    ``words_per_last_symbol`` words. Sentences have between 2 and ``2**n_levels`` words,
    trees depth at most ``n_levels + 2`` (S, S_i, levels, word). The defaults give the
    paper's sizes: 200 words, 1 + 9 + 5*8 = 50 non-terminals, sentences <= 32 tokens.
    """
    for name, value in [("n_words", n_words), ("n_roots", n_roots), ("n_levels", n_levels),
                        ("symbols_per_level", symbols_per_level),
                        ("binary_rules_per_symbol", binary_rules_per_symbol),
                        ("words_per_emission", words_per_emission),
                        ("words_per_last_symbol", words_per_last_symbol)]:
        if value < 1:
            raise UserError(f"random grammar: {name} must be >= 1, got {value}")
    if not 0.0 <= emit_prob < 1.0:
        raise UserError(f"random grammar: emit_prob must be in [0, 1), got {emit_prob}")
    if binary_rules_per_symbol > symbols_per_level**2:
        raise UserError("random grammar: binary_rules_per_symbol exceeds the number of symbol pairs")
    if max(words_per_emission, words_per_last_symbol) > n_words:
        raise UserError("random grammar: a symbol cannot emit more distinct words than n_words")
    if 2 * n_roots < symbols_per_level:
        raise UserError("random grammar: 2 * n_roots must be >= symbols_per_level so every symbol is reachable")
    gen = torch.Generator().manual_seed(seed)

    def dirichlet(k: int) -> list[float]:
        g = torch._standard_gamma(torch.full((k,), concentration, dtype=torch.float64), generator=gen)
        return (g / g.sum()).tolist()

    def pick(k: int, n: int) -> list[int]:
        return torch.randperm(n, generator=gen)[:k].tolist()

    words = [f"w{i}" for i in range(n_words)]
    lines = ["root S"]
    for i, p in enumerate(dirichlet(n_roots)):
        lines.append(f"S -> S{i + 1} {p!r}")
    # every level-1 symbol gets used by some root (when there are enough root slots)
    slots = torch.randperm(symbols_per_level, generator=gen).tolist()
    slots += torch.randint(symbols_per_level, (max(2 * n_roots - len(slots), 0),), generator=gen).tolist()
    slots = [slots[i] for i in torch.randperm(len(slots), generator=gen).tolist()]
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
    grammar = Grammar.from_text("\n".join(lines), source="<random grammar>")
    return _with_word_order(grammar, words)


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
