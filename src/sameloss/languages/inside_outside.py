"""Batched inside–outside for a PCFG in Chomsky normal form.

Why this is exact and fast:

* **Scaled probabilities instead of logs.** Inside and outside scores are multilinear in
  the leaf emission vectors: every tree covering a span uses exactly one emission per
  leaf. Dividing leaf ``t``'s emission vector by a constant ``s_t`` therefore divides
  every score by the product of the ``s`` of the leaves it involves — a per-sentence
  (or per-leaf) constant that cancels in every quantity we report (conditionals,
  span posteriors, argmax labels) and is added back as ``sum(log s)`` for the
  log-likelihood. This is log-space arithmetic with the exponent factored out, and it
  keeps the hot loop in plain multiply–adds on float64.
* **Pruned splits.** ``Grammar.possible_lengths`` tells which yield lengths each symbol
  can have; a rule ``A -> B C`` only takes part in a (span length ``l``, split ``m``)
  pair when ``B`` can yield ``m`` words and ``C`` ``l - m``. For a layered grammar this
  skips most of the chart.
* **Batch-vectorised.** The Python loops run over span lengths and splits (the chart
  shape), never over sentences, tokens or rules.

* **Dense blocks per span length.** The rules of one group (see ``_child_groups``)
  that can build spans of one length form a dense ``[parents, lefts, rights]`` block;
  each (length, block) costs one matrix multiply over the whole batch plus one outer
  product per split.

Chart layout: ``chart[l]`` is ``[N, batch, T - l + 1]``, the score of symbol ``A`` over
the span ``[i, i + l)`` (index 0 unused). Symbol-major, so gathering and scattering
symbols touch contiguous rows.

The outside score of a leaf does not involve that leaf's own word, so one outside
pass gives ``P(x_t = w | the other unmasked words)`` at every position at once.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from ..errors import UserError
from ..progress import Progress
from .pcfg_grammar import Grammar

# Refuse a grammar whose dense rule blocks (all span lengths together) would exceed this.
MAX_BLOCK_BYTES = 2 * 2**30

# Working memory one inside + outside pass may use; larger batches are split.
WORK_BYTES = 512 * 2**20


@dataclass(frozen=True)
class _Block:
    """The rules of one group that can build a span of one length, as a dense block.

    ``splits``: the left-child lengths ``m`` at which some rule of the block applies.
    ``top_only``: every parent only ever tops a tree (needed on the whole sentence only).
    ``parents``, ``lefts``, ``rights``: the distinct symbols involved (index tensors).
    ``rules``: ``[|A|, |B|, |C|]`` float64, ``P(A -> B C)``.

    A rule that cannot apply at some split contributes exact zeros there (its children's
    chart entries for that length are zero), so one block serves every split of the
    length: the inside pass sums the children's outer products over splits *before*
    the one matrix multiply with ``rules``, and the outside pass multiplies the parent
    scores by ``rules`` once and reuses that for every split.
    """

    splits: tuple[int, ...]
    top_only: bool
    parents: torch.Tensor | slice
    lefts: torch.Tensor | slice
    rights: torch.Tensor | slice
    rules: torch.Tensor


def _as_index(symbols: torch.Tensor) -> torch.Tensor | slice:
    """A run of consecutive symbol ids becomes a slice: indexing with it is a view, not
    a copy, and adding into it needs no scatter. (Levels of a layered grammar are
    numbered consecutively, so this is the common case.)"""
    lo = int(symbols[0])
    if torch.equal(symbols, torch.arange(lo, lo + len(symbols))):
        return slice(lo, lo + len(symbols))
    return symbols


def _make_block(splits, parent, left, right, prob, top_only: bool) -> _Block:
    parents, a = torch.unique(parent, return_inverse=True)
    lefts, b = torch.unique(left, return_inverse=True)
    rights, c = torch.unique(right, return_inverse=True)
    rules = torch.zeros(len(parents), len(lefts), len(rights), dtype=torch.float64)
    rules.index_put_((a, b, c), prob, accumulate=True)
    return _Block(tuple(splits), top_only, _as_index(parents), _as_index(lefts), _as_index(rights), rules)


def _pair_count(blk: _Block) -> int:
    """Child pairs of a block: the outer products of one pass are this times batch x starts."""
    return blk.rules.shape[1] * blk.rules.shape[2]


def _child_groups(grammar: Grammar) -> torch.Tensor:
    """``[R]`` group id per rule: rules whose children are connected (share a symbol,
    transitively) form one group. One dense block per group keeps blocks small: in a
    layered grammar each level is its own group, instead of one block spanning
    every level's parents times every level's child pairs."""
    parent = list(range(grammar.n_nonterminals))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for b, c in zip(grammar.rule_left.tolist(), grammar.rule_right.tolist()):
        parent[find(b)] = find(c)
    return torch.tensor([find(b) for b in grammar.rule_left.tolist()], dtype=torch.long)


class InsideOutside:
    """Inside and outside passes over a batch of sentences that all have length ``T``.

    Equal lengths (the caller buckets sentences by length, see ``by_length``) mean no
    chart cell is spent on padding, the root span is always ``[0, T)``, and rules whose
    parents can only ever be the top of a tree (``S1 .. S9`` of the released grammar)
    are evaluated on that one span only.
    """

    def __init__(self, grammar: Grammar, max_len: int, source: str | None = None):
        self.grammar = grammar
        self.max_len = max_len
        g = grammar
        where = f"grammar {source}" if source else "grammar"
        progress = Progress(f"{where}: parser tables, span length", max_len)
        can = grammar.possible_lengths(max_len)
        groups = _child_groups(g)
        is_child = torch.zeros(g.n_nonterminals, dtype=torch.bool)
        is_child[g.rule_left] = True
        is_child[g.rule_right] = True
        top_only = ~is_child  # never inside a tree: only over the whole sentence
        # which rules make up each (length, group) block; a recursive grammar uses the
        # same rules at most lengths, and those lengths share one dense tensor
        plans: list[list[tuple[tuple[int, ...], torch.Tensor]]] = [[] for _ in range(max_len + 1)]
        distinct: dict[bytes, tuple[int, int, int]] = {}
        for length in range(2, max_len + 1):
            # usable[r, m]: rule r can build a span of this length with split m
            usable = torch.stack([can[g.rule_left, m] & can[g.rule_right, length - m] & (g.rule_prob > 0)
                                  for m in range(1, length)], dim=1)
            any_split = usable.any(dim=1)
            for group in torch.unique(groups[any_split]).tolist():
                sel = torch.nonzero(any_split & (groups == group)).flatten()
                splits = tuple(m + 1 for m in torch.nonzero(usable[sel].any(dim=0)).flatten().tolist())
                plans[length].append((splits, sel))
                key = sel.numpy().tobytes()
                if key not in distinct:
                    distinct[key] = tuple(len(torch.unique(x[sel])) for x in (g.rule_parent, g.rule_left, g.rule_right))
            progress(length)
        # the dense blocks are |parents| x |lefts| x |rights|: a large, sparsely connected
        # grammar (many symbols, few rules each) makes them huge; refuse before allocating
        block_bytes = 8 * sum(a * b * c for a, b, c in distinct.values())
        if block_bytes > MAX_BLOCK_BYTES:
            a, b, c = max(distinct.values(), key=lambda s: s[0] * s[1] * s[2])
            raise UserError(
                f"{where}: the parser's dense rule blocks would take {block_bytes / 2**30:.1f} GiB (largest "
                f"{a} parents x {b} x {c} children), over the {MAX_BLOCK_BYTES / 2**30:.0f} GiB limit; "
                f"this parser suits grammars whose rules connect few symbols each")
        shared: dict[bytes, _Block] = {}
        self.blocks: list[list[_Block]] = [[] for _ in range(max_len + 1)]
        for length in range(2, max_len + 1):
            for splits, sel in plans[length]:
                key = sel.numpy().tobytes()
                if key not in shared:
                    shared[key] = _make_block((), g.rule_parent[sel], g.rule_left[sel], g.rule_right[sel],
                                              g.rule_prob[sel], top_only=bool(top_only[g.rule_parent[sel]].all()))
                self.blocks[length].append(dataclasses.replace(shared[key], splits=splits))
        progress.close()
        self._rows: dict[int, int] = {}
        self.emission = g.emission  # [N, W]
        self.emission_total = g.emission.sum(dim=1)  # [N]: a masked leaf, any word

    def flops(self, T: int) -> int:
        """Floating-point operations of one inside + outside pass over one sentence of
        length ``T`` (the block matrix multiplies and child-pair products)."""
        total = 0
        for length in range(2, min(T, self.max_len) + 1):
            for blk in self._blocks(length, T):
                n_a, n_b, n_c = blk.rules.shape
                total += (T - length + 1) * (4 * n_a * n_b * n_c + 5 * len(blk.splits) * n_b * n_c)
        return total

    def rows_per_pass(self, T: int) -> int:
        """How many sentences of length ``T`` one inside + outside pass may take so that
        its working memory (the charts, and the per-block child-pair products) stays under
        ``WORK_BYTES``: callers split larger batches."""
        if T not in self._rows:
            chart = 2 * self.grammar.n_nonterminals * T * (T + 1) // 2  # inside + outside cells
            pairs = max((3 * _pair_count(blk) * (T - length + 1)
                         for length in range(2, min(T, self.max_len) + 1) for blk in self._blocks(length, T)),
                        default=0)
            self._rows[T] = max(1, WORK_BYTES // (8 * (chart + pairs)))
        return self._rows[T]

    def _blocks(self, length: int, T: int) -> list[_Block]:
        return [b for b in self.blocks[length] if length == T or not b.top_only]

    # ---- leaves ---------------------------------------------------------------------
    def leaves(self, tokens: torch.Tensor, masked: torch.Tensor):
        """Scaled leaf scores ``[N, B, T]`` and their log scale factors ``[B, T]``.

        Observed word: ``P(A -> w)``; masked: ``sum_w P(A -> w)``.
        """
        n_words = self.emission.shape[1]
        leaf = self.emission.T[tokens.clamp(0, n_words - 1)]  # [B, T, N]
        leaf = torch.where(masked[..., None], self.emission_total.expand_as(leaf), leaf)
        scale = leaf.sum(dim=-1)
        # a word no symbol emits keeps scale 1: the sentence's scores are then all zero
        scale = torch.where(scale > 0, scale, torch.ones_like(scale))
        return (leaf / scale[..., None]).permute(2, 0, 1).contiguous(), scale.log()

    # ---- passes ---------------------------------------------------------------------
    def inside(self, leaf: torch.Tensor) -> list[torch.Tensor | None]:
        """``chart[l][A, b, i]`` = scaled P(A yields words i..i+l-1 of sentence b)."""
        n, batch, T = leaf.shape
        chart: list[torch.Tensor | None] = [None, leaf]
        for length in range(2, T + 1):
            starts = T - length + 1
            acc = leaf.new_zeros(n, batch, starts)
            for blk in self._blocks(length, T):
                pairs = None  # sum over splits of outer(left child, right child)
                for m in blk.splits:
                    left = chart[m][:, :, :starts][blk.lefts]
                    right = chart[length - m][:, :, m:m + starts][blk.rights]
                    outer = left[:, None] * right[None, :]
                    pairs = outer if pairs is None else pairs.add_(outer)
                scores = blk.rules.reshape(blk.rules.shape[0], -1) @ pairs.reshape(-1, batch * starts)
                # parents within a block are distinct: gather-add-scatter is an exact,
                # and on CPU much faster, index_add_
                acc[blk.parents] += scores.view(-1, batch, starts)
            chart.append(acc)
        return chart

    def outside(self, inside: list[torch.Tensor | None]) -> list[torch.Tensor | None]:
        """``chart[l][A, b, i]`` = scaled P(words outside [i, i+l), A spans [i, i+l)).

        The root span ``[0, T)`` gets the start distribution.
        """
        leaf = inside[1]
        n, batch, T = leaf.shape
        out: list[torch.Tensor | None] = [None] + [leaf.new_zeros(n, batch, T - l + 1) for l in range(1, T + 1)]
        out[T][:, :, 0] = self.grammar.start.to(leaf.dtype)[:, None]
        for length in range(T, 1, -1):
            starts = T - length + 1
            for blk in self._blocks(length, T):
                n_a, n_b, n_c = blk.rules.shape
                parent = out[length][blk.parents].reshape(n_a, -1)
                # through[B, C] = sum_A P(A -> B C) * outside(A): shared by every split
                through = (blk.rules.reshape(n_a, -1).T @ parent).view(n_b, n_c, batch, starts)
                for m in blk.splits:
                    left_in = inside[m][:, :, :starts][blk.lefts]
                    right_in = inside[length - m][:, :, m:m + starts][blk.rights]
                    left_out = out[m][:, :, :starts]
                    left_out[blk.lefts] += (through * right_in[None, :]).sum(dim=1)
                    right_out = out[length - m][:, :, m:m + starts]
                    right_out[blk.rights] += (through * left_in[:, None]).sum(dim=0)
        return out

    # ---- derived quantities ---------------------------------------------------------
    def leaf_conditionals(self, outside: list[torch.Tensor | None], query: torch.Tensor) -> torch.Tensor:
        """``[Q, W]`` P(x_t = w | rest) at the query positions (rows of ``query.nonzero()``)."""
        unnorm = outside[1].permute(1, 2, 0)[query] @ self.emission
        return unnorm / unnorm.sum(dim=-1, keepdim=True)

    def log_likelihood(self, tokens: torch.Tensor, masked: torch.Tensor) -> torch.Tensor:
        """``[B]`` log P(the unmasked words at their positions, sentence length T), exact
        (masked words summed out)."""
        leaf, log_scale = self.leaves(tokens, masked)
        chart = self.inside(leaf)
        z = self.grammar.start.to(leaf.dtype) @ chart[-1][:, :, 0]
        return z.log() + log_scale.sum(dim=1)


def by_length(lengths: torch.Tensor, parser: InsideOutside | None = None):
    """Yield ``(length, row indices)`` for each distinct sentence length; with a
    ``parser``, in pieces of at most ``parser.rows_per_pass(length)`` rows."""
    for length in torch.unique(lengths).tolist():
        idx = torch.nonzero(lengths == length).flatten()
        rows = parser.rows_per_pass(int(length)) if parser is not None else idx.numel()
        for piece in idx.split(max(rows, 1)):
            yield int(length), piece
