"""The PCFG language: sampling, exact masked-token conditionals, parse-tree tasks.

Grammars come from a file (``PCFG.from_file``: the authors' released format or ours,
see ``pcfg_grammar``), from ``PCFG.random`` (a layered random grammar), or from a preset
(``PCFG.preset("tiny" | "paper")``).

Conditionals are exact given the sentence length (the model sees the padding, so it
knows the length too); sentences longer than ``max_len`` are rejected at sampling time,
which conditions on the length and so leaves those conditionals unchanged.
"""

from __future__ import annotations

import math
import weakref
from pathlib import Path

import torch

from ..errors import UserError
from ..progress import say
from ..registry import keyword_types, language_params
from .base import Batch, Language, Task
from .inside_outside import InsideOutside, by_length
from .pcfg_grammar import Grammar, LengthReport
from .pcfg_random import GrammarShape, random_layered

# the registry reads this from the file (``sameloss.registry``); sizes: the keys of PRESETS
LANGUAGE = {"name": "pcfg", "build": "build", "settings": ("size", "seed", "params", "grammar"), "describe": True}

# The ``GrammarShape`` of each preset, by field name.
PRESETS: dict[str, dict] = {
    # The paper's sizes (App. A.1): 200 words, 50 non-terminals, sentences <= 32 tokens.
    "paper": dict(n_words=200, n_roots=9, n_levels=5, symbols_per_level=8,
                  binary_rules_per_symbol=20, emit_prob=0.1, words_per_last_symbol=80),
    # Small enough that a ~100k-parameter model saturates on a 2-core CPU in minutes:
    # 24 words, 3 roots, 3 levels of 4 symbols, sentences of 2..8 tokens.
    "tiny": dict(n_words=24, n_roots=3, n_levels=3, symbols_per_level=4,
                 binary_rules_per_symbol=3, emit_prob=0.2, words_per_last_symbol=6),
    # Smaller still, for runs that must reach the saturation regime (KL < 0.01) on a CPU:
    # 12 words, 2 roots, 3 levels of 3 symbols, sentences of 2..8 tokens.
    "micro": dict(n_words=12, n_roots=2, n_levels=3, symbols_per_level=3,
                  binary_rules_per_symbol=2, emit_prob=0.2, words_per_last_symbol=4),
    # The winner of a search for probe headroom (issue 24): 6 words, 2 roots, 2 levels of 4
    # symbols, 3 binary rules each, emission 0.3 above the last level, 5 words per last-level
    # symbol, peaked rules (Dirichlet 0.5), grammar seed 6 (PRESET_SEEDS); sentences of 2..4
    # words. How it was found and what it measures: docs/results/pcfg.md.
    "headroom": dict(n_words=6, n_roots=2, n_levels=2, symbols_per_level=4, binary_rules_per_symbol=3,
                     emit_prob=0.3, words_per_last_symbol=5, concentration=0.5),
}

# The span task of the ``headroom`` size: the most likely symbol over the first word given
# the sentence (longer spans of these small grammars sit near the ceiling for every model).
HEADROOM_TASK = "span-1"

# The preset's own seed where 0 is not the best draw (micro seed 0 has an 84% majority
# class on task A).
PRESET_SEEDS = {"micro": 1, "headroom": 6}

# The sampler draws whole derivations and rejects those longer than max_len, so it needs
# 1 / P(fit) draws per sentence. Below this acceptance rate a grammar is refused up front:
# measured on a 2-core CPU, `language describe` (12k sentences) took 37 s at P(fit) = 0.01,
# 2 min at 0.002 and 4 min at 0.001, and training draws fresh sentences every step.
MIN_FIT = 1e-2

# Exact conditionals cost one inside + outside pass per sentence. Above NOTE_FLOPS per
# sentence (at the expected length) a note (``progress.say``) states the cost; above MAX_FLOPS the
# grammar is refused (one core does about 5 GFLOP/s of these float64 passes, so that is
# over an hour per 1000 sentences). The released grammar costs 0.4 MFLOP per sentence; a
# fully connected 300-symbol grammar (90,000 rules) 200 MFLOP.
NOTE_FLOPS = 5e7
MAX_FLOPS = 2e10
FLOPS_PER_SECOND = 5e9

# Most derivations drawn in one redraw round (rounds keep every alive item in memory).
REDRAW_CHUNK = 1 << 15

# Tasks of the released code: the symbol over the first k tokens (k = None: the root).
RELEASED_TASKS = {"A": None, "B": 4, "C": 2}


class PCFG(Language):
    name = "pcfg"

    def __init__(self, grammar: Grammar, max_len: int = 32, paper_spans: tuple[int, int, int] | None = None,
                 source: str | None = None):
        if max_len < 1:
            raise UserError(f"max_len must be >= 1, got {max_len}")
        self.grammar = grammar
        self.max_len = max_len
        # before any table is built: a grammar whose sentences (almost) never fit would
        # otherwise make the sampler loop forever
        self.length_report = grammar.length_report(max_len)
        check_lengths(self.length_report, source)
        self.n_words = grammar.n_words
        self.words = list(grammar.words)
        # the paper's tasks A, B, C: spans [0, L) with L = 32, 16, 8 at max_len 32
        self.paper_spans = paper_spans or (max_len, max(max_len // 2, 1), max(max_len // 4, 1))
        self.parser = InsideOutside(grammar, max_len, source=source)
        check_cost(self.parser, self.length_report, source)
        self._build_sampling_tables()

    # ---- construction ---------------------------------------------------------------
    @classmethod
    def from_file(cls, path: str | Path, max_len: int | None = None) -> PCFG:
        """Read a grammar file: the released ``rule_deep_mlm.txt`` format, or sameloss's own
        (``sameloss language describe pcfg --save-grammar``).

        Args:
            path: the grammar file (a malformed one is a ``UserError`` naming its line).
            max_len: the longest sentence (default: the longest the grammar can yield,
                capped at 32, the paper's limit, for recursive grammars).

        Returns:
            the PCFG, with its exact inside–outside parser.
        """
        grammar = Grammar.from_file(path)
        return cls(grammar, max_len or _longest_yield(grammar, cap=32), source=str(path))

    @classmethod
    def random(cls, seed: int = 0, max_len: int | None = None, **kwargs) -> PCFG:
        """A layered random grammar, as the paper's.

        Args:
            seed: fixes the grammar.
            max_len: the longest sentence (default: the longest the grammar can yield,
                capped at 32).
            **kwargs: the fields of its ``pcfg_random.GrammarShape``: words, levels, symbols
                per level, rules per symbol, emission probability.

        Returns:
            the PCFG.
        """
        grammar = random_layered(GrammarShape(**kwargs), seed=seed)
        return cls(grammar, max_len if max_len is not None else _longest_yield(grammar, cap=32))

    @classmethod
    def preset(cls, name: str, seed: int | None = None, params: str | dict | None = None) -> PCFG:
        """A named random grammar; ``seed`` draws another of the same shape (default:
        the preset's own: 1 for micro, 6 for headroom, 0 otherwise); ``params`` (``language.params``:
        ``"n_words=30,emit_prob=0.3"`` or a dict) changes fields of its
        ``GrammarShape`` and ``max_len`` (``PARAMS``) from the size's own."""
        if name not in PRESETS:
            raise UserError(f"unknown PCFG size {name!r}; choose from {', '.join(sorted(PRESETS))}")
        kwargs = {**PRESETS[name], **language_params(params, PARAMS, "pcfg")}
        if seed is None:
            seed = PRESET_SEEDS.get(name, 0)
        return cls.random(seed=seed, **kwargs)

    def _build_sampling_tables(self) -> None:
        """Per non-terminal, one categorical over its outcomes: binary rules first, then
        emissions. Outcome tables are padded to the widest symbol."""
        g = self.grammar
        n = g.n_nonterminals
        outcomes: list[list[tuple[int, int, float]]] = [[] for _ in range(n)]  # (left, right or -1-word, p)
        for r in range(g.n_rules):
            outcomes[int(g.rule_parent[r])].append((int(g.rule_left[r]), int(g.rule_right[r]), float(g.rule_prob[r])))
        for a, w in torch.nonzero(g.emission > 0).tolist():
            outcomes[a].append((-1, w, float(g.emission[a, w])))
        width = max(len(o) for o in outcomes)
        self._cdf = torch.ones(n, width, dtype=torch.float64)
        self._left = torch.full((n, width), -1, dtype=torch.long)
        self._right = torch.zeros(n, width, dtype=torch.long)
        for a, outs in enumerate(outcomes):
            if not outs:
                continue
            probs = torch.tensor([p for _, _, p in outs], dtype=torch.float64)
            cdf = probs.cumsum(0) / probs.sum()
            self._cdf[a, : len(outs)] = cdf
            self._left[a, : len(outs)] = torch.tensor([l for l, _, _ in outs])
            self._right[a, : len(outs)] = torch.tensor([r for _, r, _ in outs])
            # outcomes past the end are unreachable (cdf already 1); copy the last one
            self._left[a, len(outs):] = self._left[a, len(outs) - 1]
            self._right[a, len(outs):] = self._right[a, len(outs) - 1]
        start = g.start / g.start.sum()
        self._start_cdf = start.cumsum(0)

    # ---- sampling -------------------------------------------------------------------
    def sample(self, n: int, generator: torch.Generator | None = None) -> Batch:
        """``n`` sentences of length <= ``max_len``; latent = constituents
        ``(sentence, start, end, symbol)``.

        Trees are grown top-down, all sentences at once: the frontier is one flat tensor
        of items in left-to-right order, and each round replaces every non-terminal by
        its one or two children with ``repeat_interleave`` (which keeps the order).
        Sentences that grow past ``max_len`` are dropped and redrawn.

        Runs on the generator's device (the CPU without one; a CUDA generator's stream
        differs from the CPU's). Growing trees reads a few numbers back per round (whether
        any non-terminal is left, how many items there are): their shapes depend on them.
        """
        tokens, lengths, latents, have, drawn = [], [], [], 0, 0
        fit = self.length_report.fit
        # the number of accepted draws is binomial(drawn, fit): falling short of n after
        # this many draws (twice the expected number, plus slack) means the sampler and
        # the length distribution disagree, not bad luck
        limit = math.ceil((2 * n + 100) / fit)
        chunk = max(n, REDRAW_CHUNK)
        while have < n:
            if drawn >= limit:
                raise UserError(
                    f"sampling: {drawn} derivations drawn but only {have} of {n} sentences fit max_len "
                    f"{self.max_len}, where P(fit) = {fit:.3g} predicts {drawn * fit:.0f}")
            # redraws (after rejections) ask for what the acceptance rate says is missing
            want = n if not drawn else min(max(math.ceil((n - have) / fit * 1.1), 16), chunk)
            batch = self._sample_round(want, generator)
            drawn += want
            keep = min(len(batch), n - have)
            spans = batch.latent[batch.latent[:, 0] < keep]
            spans[:, 0] += have
            tokens.append(batch.tokens[:keep])
            lengths.append(batch.lengths[:keep])
            latents.append(spans)
            have += keep
        return Batch(torch.cat(tokens), torch.cat(lengths), torch.cat(latents))

    def _sample_round(self, n: int, generator: torch.Generator | None) -> Batch:
        nt = self.grammar.n_nonterminals
        device = generator.device if generator is not None else torch.device("cpu")
        start_cdf, cdf_table, left_table, right_table = self._sampling_tables(device)
        u = torch.rand(n, generator=generator, dtype=torch.float64, device=device)
        sym = torch.searchsorted(start_cdf, u[:, None]).flatten().clamp(max=nt - 1)
        sent = torch.arange(n, device=device)
        # item codes: 0..nt-1 non-terminals, nt + w for word w
        alive = torch.ones(n, dtype=torch.bool, device=device)
        # per round, how items map back to the previous round's items (and, for an
        # expansion, which items were expanded) — used to recover constituent spans
        history = []
        while True:
            is_nt = sym < nt
            if not is_nt.any():
                break
            idx = torch.nonzero(is_nt).flatten()
            a = sym[idx]
            u = torch.rand(idx.numel(), generator=generator, dtype=torch.float64, device=device)
            choice = torch.searchsorted(cdf_table[a], u[:, None]).flatten().clamp(max=cdf_table.shape[1] - 1)
            left, right = left_table[a, choice], right_table[a, choice]
            emits = left < 0
            counts = torch.ones_like(sym)
            counts[idx] = torch.where(emits, 1, 2)
            new_index = torch.repeat_interleave(torch.arange(sym.numel(), device=device), counts)
            first = torch.cumsum(counts, 0) - counts  # position of each item's first child
            new_sym = sym[new_index].clone()
            new_sym[first[idx]] = torch.where(emits, nt + right, left)
            binary = idx[~emits]
            new_sym[first[binary] + 1] = right[~emits]
            history.append(("expand", new_index, (sent[idx], a, idx)))
            sym, sent = new_sym, sent[new_index]
            # drop sentences that are already too long (items only ever multiply)
            too_long = torch.bincount(sent, minlength=n) > self.max_len
            if too_long.any():
                alive &= ~too_long
                kept = torch.nonzero(alive[sent]).flatten()
                sym, sent = sym[kept], sent[kept]
                history.append(("filter", kept, None))
        return self._assemble(n, sym - nt, sent, alive, history)

    def _assemble(self, n, words, sent, alive, history) -> Batch:
        """Turn the final flat list of words into padded sentences, and the recorded
        rounds into constituent spans (the leaves under each expanded item)."""
        lengths_all = torch.bincount(sent, minlength=n)
        device = sent.device
        order_in_sentence = torch.arange(sent.numel(), device=device) - (torch.cumsum(lengths_all, 0) - lengths_all)[sent]
        # map each final leaf back through the rounds to its ancestor item in each round
        spans = []
        leaf_item = torch.arange(sent.numel(), device=device)  # the leaf's ancestor in the current round
        big = torch.iinfo(torch.long).max
        for kind, to_previous, expanded in reversed(history):
            leaf_item = to_previous[leaf_item]  # ancestor one round earlier
            if kind == "filter":
                continue
            s, a, idx = expanded
            n_previous = int(to_previous.max()) + 1
            owner = torch.full((n_previous,), -1, dtype=torch.long, device=device)
            owner[idx] = torch.arange(idx.numel(), device=device)
            owner = owner[leaf_item]  # which expanded item each leaf descends from
            has = owner >= 0
            lo = torch.full((idx.numel(),), big, dtype=torch.long, device=device).scatter_reduce(
                0, owner[has], order_in_sentence[has], reduce="amin")
            hi = torch.full((idx.numel(),), -1, dtype=torch.long, device=device).scatter_reduce(
                0, owner[has], order_in_sentence[has], reduce="amax")
            spans.append(torch.stack([s, lo, hi + 1, a], dim=1))
        latent = torch.cat(spans) if spans else torch.zeros(0, 4, dtype=torch.long, device=device)
        # renumber the surviving sentences 0..k-1
        new_id = torch.cumsum(alive, 0) - 1
        latent = latent[alive[latent[:, 0]]]
        latent[:, 0] = new_id[latent[:, 0]]
        k = int(alive.sum())
        lengths = lengths_all[alive]
        tokens = torch.full((k, self.max_len), self.pad_id, dtype=torch.long, device=device)
        tokens[new_id[sent], order_in_sentence] = words
        return Batch(tokens, lengths, latent)

    def _sampling_tables(self, device: torch.device) -> tuple[torch.Tensor, ...]:
        """``(start cdf, outcome cdfs, left, right)`` on ``device`` (copied there once)."""
        tables = (self._start_cdf, self._cdf, self._left, self._right)
        if device.type == "cpu":
            return tables
        cache = self.__dict__.setdefault("_tables_on", {})
        if device not in cache:
            cache[device] = tuple(t.to(device) for t in tables)
        return cache[device]

    # ---- exact conditionals ---------------------------------------------------------
    def _check_tokens(self, tokens: torch.Tensor) -> None:
        if tokens.dim() != 2 or tokens.shape[1] > self.max_len:
            raise ValueError(f"tokens must be [n, T] with T <= {self.max_len}, got {tuple(tokens.shape)}")

    def conditionals(self, tokens, masked, query=None) -> torch.Tensor:
        """Exact conditionals (see ``Language.conditionals``): one inside and one outside
        pass per distinct sentence length in the batch. A context no sentence of the
        grammar matches gives a row of NaN."""
        self._check_tokens(tokens)
        query = masked if query is None else query
        lengths = self.lengths_of(tokens)
        rows = torch.zeros_like(query, dtype=torch.long)
        rows[query] = torch.arange(int(query.sum()))  # output row of each query position
        result = torch.empty(int(query.sum()), self.n_words, dtype=torch.float64)
        for length, idx in by_length(lengths, self.parser):
            q = query[idx, :length]
            if not q.any():
                continue
            leaf, _ = self.parser.leaves(tokens[idx, :length], masked[idx, :length])
            out = self.parser.outside(self.parser.inside(leaf))
            result[rows[idx, :length][q]] = self.parser.leaf_conditionals(out, q)
        return result

    def log_likelihood(self, tokens: torch.Tensor, masked: torch.Tensor | None = None) -> torch.Tensor:
        """``[n]`` exact log P(sentence) (masked words summed out)."""
        self._check_tokens(tokens)
        masked = torch.zeros_like(tokens, dtype=torch.bool) if masked is None else masked
        result = torch.empty(tokens.shape[0], dtype=torch.float64)
        for length, idx in by_length(self.lengths_of(tokens), self.parser):
            result[idx] = self.parser.log_likelihood(tokens[idx, :length], masked[idx, :length])
        return result

    # ---- tasks ----------------------------------------------------------------------
    def span_inside(self, tokens: torch.Tensor, span: int | None) -> torch.Tensor:
        """``[n, N]`` inside score (up to a per-sentence constant) of every symbol for
        the first ``span`` tokens read as a string of their own (``span=None``: the whole
        sentence) — the released code's labels. Zero rows: no symbol derives them, or
        the sentence is shorter than ``span``."""
        lengths = self.lengths_of(tokens)
        width = lengths if span is None else torch.full_like(lengths, span)
        result = torch.zeros(tokens.shape[0], self.grammar.n_nonterminals, dtype=torch.float64)
        for length, idx in by_length(width, self.parser):
            idx = idx[lengths[idx] >= length]
            if idx.numel() == 0 or length > tokens.shape[1]:
                continue
            leaf, _ = self.parser.leaves(tokens[idx, :length], torch.zeros(idx.numel(), length, dtype=torch.bool))
            result[idx] = self.parser.inside(leaf)[length][:, :, 0].T
        return result

    def span_posterior(self, tokens: torch.Tensor, span: int) -> torch.Tensor:
        """``[n, N]`` P(symbol A spans [0, span) | sentence), exactly; a row sums to the
        probability that [0, span) is a constituent at all (zero: it cannot be, or the
        sentence is shorter than ``span``)."""
        if not 1 <= span <= self.max_len:
            raise ValueError(f"span must be in 1..{self.max_len}, got {span}")
        return self.prefix_posteriors(tokens)[:, span - 1]

    def prefix_posteriors(self, tokens: torch.Tensor) -> torch.Tensor:
        """``[n, max_len, N]``: entry ``[:, k - 1]`` is ``span_posterior(tokens, k)``, every
        prefix span from one inside and one outside pass.

        The span tasks (one per prefix length) all read this, so the result for the last
        ``tokens`` tensor is kept while that tensor lives and is unchanged (``describe``
        labels one batch with every task: one pass instead of one per task)."""
        self._check_tokens(tokens)
        memo = getattr(self, "_prefix_memo", None)
        if memo is not None and memo[0]() is tokens and memo[1] == tokens._version:
            return memo[2]
        lengths = self.lengths_of(tokens)
        n_nt = self.grammar.n_nonterminals
        result = torch.zeros(tokens.shape[0], self.max_len, n_nt, dtype=torch.float64)
        start = self.grammar.start
        for length, idx in by_length(lengths, self.parser):
            leaf, _ = self.parser.leaves(tokens[idx, :length], torch.zeros(idx.numel(), length, dtype=torch.bool))
            ins = self.parser.inside(leaf)
            out = self.parser.outside(ins)
            z = start @ ins[length][:, :, 0]
            for k in range(1, length + 1):
                result[idx, k - 1] = (ins[k][:, :, 0] * out[k][:, :, 0]).T / z[:, None]
        # a weak reference: the memo (and its result) goes when the tensor does
        self._prefix_memo = (weakref.ref(tokens, lambda _: setattr(self, "_prefix_memo", None)),
                             tokens._version, result)
        return result

    def _argmax_label(self, scores: torch.Tensor, classes: list[int] | None = None) -> torch.Tensor:
        if classes is not None:
            scores = scores[:, classes]
        labels = scores.argmax(dim=1)
        return torch.where(scores.amax(dim=1) > 0, labels, torch.full_like(labels, -1))

    @staticmethod
    def _normalised(scores: torch.Tensor) -> torch.Tensor:
        """Rows scaled to sum to one (zero rows stay zero)."""
        total = scores.sum(dim=1, keepdim=True)
        return scores / torch.where(total > 0, total, torch.ones_like(total))

    def _sampled_span_label(self, batch: Batch, span: int) -> torch.Tensor:
        """``[n]`` the symbol the sampler drew over ``[0, span)`` (``batch.latent``), ``-1``
        where the drawn tree has no constituent there (the outermost symbol where a unary
        chain of a grammar file spans it: the latent lists a tree's rounds deepest first)."""
        if batch.latent is None:
            raise ValueError(f"span-{span}-sampled needs the sampled parse trees (batch.latent)")
        lat = batch.latent
        rows = torch.nonzero((lat[:, 1] == 0) & (lat[:, 2] == span)).flatten()
        last = torch.full((batch.tokens.shape[0],), -1, dtype=torch.long, device=lat.device)
        last.scatter_reduce_(0, lat[rows, 0], rows, reduce="amax")
        return torch.where(last >= 0, lat[last.clamp(min=0), 3], last)

    @property
    def tasks(self) -> dict[str, Task]:
        """The released code's A, B, C (argmax inside score of the root / the first k
        words read as a string of their own), the paper's A/B/C-paper, and ``span-k`` for
        every k < max_len: the most likely symbol spanning the first k words given the
        whole sentence (the paper's kind of task, at any span; ``span-{max_len}`` would be
        ``A-paper``). Each task's ``posterior`` is the vector its label is the argmax of:
        the normalised inside scores for A, B, C, ``span_posterior`` for the others.

        ``span-k-sampled`` (issue 36): the symbol the sampler actually drew over the first
        k words, on the sentences whose drawn tree has that constituent. Its oracle is the
        posterior given the sentence and that the span is a constituent (``span_posterior``
        normalised), whose argmax is right only as often as the sentence determines the
        symbol: its Bayes accuracy, below 100 % wherever the yield and its context leave the
        symbol ambiguous — the argmax labels of ``span-k`` are a linear function of the
        oracle's features (≈ 99 % for every grammar searched), these leave room above a
        trained model. (An HMM's ``task-k-sampled`` is the same idea.)"""
        g = self.grammar
        n_nt = g.n_nonterminals
        roots = g.start_symbols
        tasks = {
            "A": Task("A", len(roots),
                      lambda b: self._argmax_label(self.span_inside(b.tokens, None), roots),
                      "released code: argmax inside probability of the start symbol (S1..) of the sentence",
                      span=(0, None), posterior=lambda tok: self._normalised(self.span_inside(tok, None)[:, roots])),
        }
        for name in ("B", "C"):
            k = RELEASED_TASKS[name]
            tasks[name] = Task(
                name, n_nt, lambda b, k=k: self._argmax_label(self.span_inside(b.tokens, k)),
                f"released code: argmax inside probability of the symbol over the first {k} tokens",
                span=(0, k), posterior=lambda tok, k=k: self._normalised(self.span_inside(tok, k)))
        spans = [(f"{name}-paper", span, "paper") for name, span in zip(("A", "B", "C"), self.paper_spans)]
        spans += [(f"span-{k}", k, "paper's kind") for k in range(1, self.max_len)]
        for name, span, what in spans:
            tasks[name] = Task(
                name, n_nt, lambda b, s=span: self._argmax_label(self.span_posterior(b.tokens, s)),
                f"{what}: most likely symbol spanning [0, {span}) given the sentence (posterior argmax)",
                span=(0, span), posterior=lambda tok, s=span: self.span_posterior(tok, s))
        for k in range(1, self.max_len):
            tasks[f"span-{k}-sampled"] = Task(
                f"span-{k}-sampled", n_nt, lambda b, s=k: self._sampled_span_label(b, s),
                f"the symbol the sampler drew over [0, {k}) (sentences whose tree has that constituent); "
                "Bayes accuracy below 1 where the sentence leaves it ambiguous",
                span=(0, k), posterior=lambda tok, s=k: self._normalised(self.span_posterior(tok, s)))
        return tasks


def check_lengths(report: LengthReport, source: str | None = None) -> None:
    """Refuse a grammar whose sentences (almost) never fit ``max_len`` (P(fit) < MIN_FIT),
    with the numbers that say why."""
    if report.fit >= MIN_FIT:
        return
    where = f"grammar {source}" if source else "grammar"
    if report.shortest > report.max_len or report.fit <= 0:
        problem = (f"no sentence fits max_len {report.max_len} (the shortest has {report.shortest} words); "
                   "sampling would not finish")
    else:
        problem = (f"P(a sentence fits max_len {report.max_len}) = {report.fit:.2g} ({report.describe()}); "
                   f"sampling would need about {1 / report.fit:.2g} draws per sentence, refused above "
                   f"{1 / MIN_FIT:.0f}")
    raise UserError(f"{where}: {problem} (change the rules or raise max_len)")


def check_cost(parser: InsideOutside, report: LengthReport, source: str | None = None) -> None:
    """State (``progress.say``) the cost of exact conditionals for an expensive grammar, and
    refuse one that would take hours for a thousand sentences."""
    p = report.length_probs[1:] / report.length_probs[1:].sum()
    per_sentence = sum(float(p[t - 1]) * parser.flops(t) for t in range(1, report.max_len + 1) if p[t - 1] > 0)
    if per_sentence < NOTE_FLOPS:
        return
    where = f"grammar {source}" if source else "grammar"
    a, b, c = max((blk.rules.shape for blocks in parser.blocks for blk in blocks), key=lambda s: s[0] * s[1] * s[2])
    cost = (f"exact conditionals cost about {per_sentence / 1e6:.0f} MFLOP per sentence (dense rule blocks up to "
            f"{a} x {b} x {c}), about {per_sentence * 1000 / FLOPS_PER_SECOND / 60:.1f} min per 1000 sentences on one core")
    if per_sentence > MAX_FLOPS:
        raise UserError(f"{where}: {cost}; refusing a grammar this expensive (fewer symbols per rule group, "
                        f"or shorter sentences, make it cheaper)")
    say(f"{where}: note: {cost}")


def _longest_yield(grammar: Grammar, cap: int) -> int:
    can = grammar.possible_lengths(cap)
    top = can[grammar.start > 0].any(dim=0)
    lengths = torch.nonzero(top).flatten()
    return int(lengths.max()) if lengths.numel() else cap


# what ``language.params`` may change: the grammar's shape (the fields of ``GrammarShape``;
# its seed is language.seed) and the sentence length limit
PARAMS = {**keyword_types(GrammarShape), "max_len": int}


def build(size: str = "tiny", seed: int | None = None, grammar: str | None = None,
          params: str | None = None) -> PCFG:
    """The PCFG of ``language.size`` (``seed``: another draw of its shape; ``params``: other
    constructor settings than the size's own), or the grammar file ``grammar`` (read as it
    is; it overrides the size)."""
    if grammar is not None and params is not None:
        raise UserError("language.params changes the random grammar of language.size; a grammar file "
                        "(language.grammar) is read as it is: give one or the other")
    return PCFG.from_file(grammar) if grammar is not None else PCFG.preset(size, seed=seed, params=params)
