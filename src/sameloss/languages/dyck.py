"""The bracket language of the paper's §5 (a variant of Dyck).

Pre-training distribution (§5, "Pre-training Distribution"): the vocabulary is the two
brackets ``(`` and ``)`` (words 0 and 1), every sentence has the same even length
``T``, and a sentence is drawn *uniformly over all strings with as many ``(`` as
``)``*. The paper calls these sentences "balanced" and "valid"; the only condition it
states is that the two counts are equal, so ``)(`` is a sentence of this language even
though it is not properly nested. That is the default here (``nested=False``), with
``C(T, T/2)`` equally likely sentences.

``nested=True`` gives the classical Dyck language instead: uniform over the properly
nested strings (every prefix has at least as many ``(`` as ``)``), of which there are
Catalan(T/2). It is not what the paper analyses; it is offered for comparison.

Exact conditionals.

* Equal counts: given the observed words and the number ``m`` of hidden positions
  (the other masked positions plus the query position itself), the hidden words are a
  uniform arrangement of the brackets still needed, so
  ``P(x_t = '(') = (T/2 - #observed '(') / m``.
* Nested: a forward/backward count of lattice paths (heights ``0..T/2``) over the
  positions, vectorised over the batch; ``P(x_t = '(' )`` is proportional to
  ``Σ_h F_t(h) B_{t+1}(h+1)``, where ``F_t`` counts consistent prefixes before ``t``
  ending at height ``h`` and ``B_{t+1}`` consistent suffixes after ``t`` starting there.

A context that no sentence of the language agrees with (probability zero, e.g. three
visible ``(`` in a sentence of length 4) has no conditional: its row is ``NaN`` in
both columns. Rows are computed independently, so one such context does not disturb
the others; callers that may pass such contexts (e.g. strings from the task
distribution, which are mostly not sentences of the language) should check
``torch.isnan``. Sentences drawn from :meth:`Dyck.sample` never produce ``NaN``.

Downstream task (§5, "Downstream Task"; App. G): ``g*(x) = #')' - #'('`` on strings
drawn uniformly from ``{(, )}^T`` (each bracket i.i.d. fair), *not* from the
pre-training distribution — the task's ``sample`` field draws them. The class index
is ``(g* + T) / 2`` (= the number of ``)``), so there are ``T + 1`` classes.

Input encoding of the theory model (§5, "Encoding of the Inputs"): see
:meth:`Dyck.encode_signed`.
"""

from __future__ import annotations

import math
import operator

import torch

from sameloss.errors import UserError
from sameloss.languages.base import Batch, Language, Task

OPEN, CLOSE = 0, 1

# the registry reads this from the file (``sameloss.registry``); sizes: the keys of PRESETS
LANGUAGE = {"name": "dyck", "build": "build", "settings": ("size", "seed"), "describe": True}

#: Named configurations. The paper fixes no length (Theorem 5.1 needs ``T >= 6``);
#: ``paper`` takes ``T = 16``: C(16, 8) = 12,870 sentences, small enough to enumerate,
#: large enough that the pre-training set is not memorised trivially.
PRESETS: dict[str, dict] = {
    "tiny": {"length": 8},
    "paper": {"length": 16},
}


def _check_length(length) -> int:
    if isinstance(length, bool):
        raise UserError(f"dyck: length must be an even integer >= 2, got {length!r}")
    try:
        T = operator.index(length)
    except TypeError:
        if isinstance(length, float) and length.is_integer():
            T = int(length)
        else:
            raise UserError(f"dyck: length must be an even integer >= 2, got {length!r}") from None
    if T < 2 or T % 2:
        raise UserError(f"dyck: length must be an even integer >= 2, got {T}")
    return T


class Dyck(Language):
    """Fixed-length bracket strings with equal counts (the paper's Theorem 5.1 setting) or
    properly nested.

    Args:
        length: the sentence length T (even).
        nested: properly nested strings instead of equal counts only.

    Example:
        >>> Dyck(length=8).sample(1).tokens.shape
        torch.Size([1, 8])
    """

    name = "dyck"
    n_words = 2
    words = ["(", ")"]

    def __init__(self, length: int = 16, nested: bool = False):
        self.length = _check_length(length)
        if not isinstance(nested, bool):
            raise UserError(f"dyck: nested must be true or false, got {nested!r}")
        self.nested = nested
        self.max_len = self.length

    @classmethod
    def preset(cls, name: str, nested: bool = False) -> "Dyck":
        if name not in PRESETS:
            valid = ", ".join(sorted(PRESETS))
            raise UserError(f"dyck: unknown size {name!r} (valid: {valid})")
        return cls(**PRESETS[name], nested=nested)

    def __repr__(self) -> str:
        return f"Dyck(length={self.length}, nested={self.nested})"

    # ---- counting ---------------------------------------------------------------------
    @property
    def n_sentences(self) -> int:
        """Size of the support: C(T, T/2), or Catalan(T/2) when nested."""
        T = self.length
        c = math.comb(T, T // 2)
        return c // (T // 2 + 1) if self.nested else c

    # ---- sampling ---------------------------------------------------------------------
    def sample(self, n: int, generator: torch.Generator | None = None) -> Batch:
        """``n`` sentences, uniform over the language; ``latent`` is ``None``."""
        T = self.length
        if self.nested:
            tokens = self._sample_nested(n, generator)
        else:
            # a uniform random permutation of the multiset {T/2 x '(', T/2 x ')'}:
            # argsort of i.i.d. noise is a uniform permutation of 0..T-1
            noise = torch.rand(n, T, generator=generator, dtype=torch.float64)
            tokens = (noise.argsort(dim=1) >= T // 2).long()
        return Batch(tokens=tokens, lengths=torch.full((n,), T, dtype=torch.long))

    def _sample_nested(self, n: int, generator: torch.Generator | None) -> torch.Tensor:
        # Sequential exact sampler: at height h with r steps left, the fraction of Dyck
        # completions that start with '(' is (r - h)(h + 2) / (2 r (h + 1)).
        T = self.length
        u = torch.rand(n, T, generator=generator, dtype=torch.float64)
        tokens = torch.empty(n, T, dtype=torch.long)
        h = torch.zeros(n, dtype=torch.float64)
        for t in range(T):
            r = float(T - t)
            p_up = (r - h) * (h + 2) / (2 * r * (h + 1))
            up = u[:, t] < p_up
            tokens[:, t] = torch.where(up, OPEN, CLOSE)
            h = h + torch.where(up, 1.0, -1.0)
        return tokens

    def sample_uniform(self, n: int, generator: torch.Generator | None = None) -> Batch:
        """``n`` strings with i.i.d. fair brackets: the downstream distribution."""
        T = self.length
        tokens = torch.randint(0, 2, (n, T), generator=generator)
        return Batch(tokens=tokens, lengths=torch.full((n,), T, dtype=torch.long))

    # ---- conditionals -----------------------------------------------------------------
    def _check_inputs(self, tokens, masked, query):
        T = self.length
        if tokens.dim() != 2 or tokens.shape[1] != T:
            raise ValueError(f"dyck: tokens must be [n, {T}], got {list(tokens.shape)}")
        if masked.shape != tokens.shape:
            raise ValueError(f"dyck: masked {list(masked.shape)} != tokens {list(tokens.shape)}")
        if query is None:
            query = masked
        if query.shape != tokens.shape:
            raise ValueError(f"dyck: query {list(query.shape)} != tokens {list(tokens.shape)}")
        masked = masked.bool()
        query = query.bool()
        tokens = tokens.long()
        bad = ~masked & ((tokens < 0) | (tokens >= self.n_words))
        if bad.any():
            i, t = bad.nonzero()[0].tolist()
            raise ValueError(
                f"dyck: unmasked position ({i}, {t}) holds id {int(tokens[i, t])}, not a bracket"
            )
        return tokens, masked, query

    def conditionals(
        self, tokens: torch.Tensor, masked: torch.Tensor, query: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Exact ``P(x_t | unmasked words other than t)``, float64 ``[Q, 2]``.

        Rows follow ``query.nonzero()``. A context of probability zero gives a ``NaN``
        row (see the module docstring). Ids at masked positions are ignored; every
        unmasked position must hold a bracket (else ``ValueError``) — a visible query
        position's word is left out of its own row but observed by the other rows.
        """
        tokens, masked, query = self._check_inputs(tokens, masked, query)
        if self.nested:
            return self._conditionals_nested(tokens, masked, query)
        return self._conditionals_counts(tokens, masked, query)

    def _conditionals_counts(self, tokens, masked, query) -> torch.Tensor:
        half = self.length // 2
        rows, cols = query.nonzero(as_tuple=True)
        is_open = (tokens == OPEN) & ~masked
        opens = is_open.sum(dim=1)
        hidden = masked.sum(dim=1)
        self_seen = ~masked[rows, cols]  # query position visible: hide it as well
        m = hidden[rows] + self_seen.long()
        o = opens[rows] - (self_seen & is_open[rows, cols]).long()
        need = half - o  # '(' among the m hidden positions
        p_open = need.double() / m.double()
        out = torch.stack([p_open, 1.0 - p_open], dim=1)
        impossible = (need < 0) | (need > m)
        out[impossible] = float("nan")
        return out

    def _conditionals_nested(self, tokens, masked, query) -> torch.Tensor:
        rows, cols = query.nonzero(as_tuple=True)
        out = torch.empty(rows.numel(), 2, dtype=torch.float64)
        if rows.numel() == 0:
            return out
        T = self.length
        H = T // 2 + 1  # heights 0..T/2; higher prefixes cannot close in time
        n = tokens.shape[0]
        chunk = max(1, (1 << 22) // ((T + 1) * H))
        # rows are sorted by sentence, so each chunk of sentences is a contiguous block
        for start in range(0, n, chunk):
            stop = min(n, start + chunk)
            sel = (rows >= start) & (rows < stop)
            if not sel.any():
                continue
            F, B = self._paths(tokens[start:stop], masked[start:stop], H)
            r, c = rows[sel] - start, cols[sel]
            f = F[c, r]  # [q, H] prefixes before t
            b = B[c + 1, r]  # [q, H] suffixes after t
            up = (f[:, :-1] * b[:, 1:]).sum(dim=1)
            down = (f[:, 1:] * b[:, :-1]).sum(dim=1)
            z = up + down
            block = torch.stack([up / z, down / z], dim=1)  # 0/0 = NaN for impossible
            out[sel] = block
        return out

    def _paths(self, tokens, masked, H):
        """Forward/backward path counts, each rescaled per step (only ratios matter).

        ``F[t, i, h]``: prefixes ``x_0..x_{t-1}`` consistent with sentence ``i`` ending
        at height ``h``; ``B[t, i, h]``: suffixes ``x_t..x_{T-1}`` consistent with it
        from height ``h`` to 0, never below 0. A query position that is not masked
        still constrains the others' paths through its word, as it should: F_t and
        B_{t+1} never look at position ``t`` itself.
        """
        T = self.length
        n = tokens.shape[0]
        up_ok = (masked | (tokens == OPEN)).double()
        down_ok = (masked | (tokens == CLOSE)).double()
        F = torch.zeros(T + 1, n, H, dtype=torch.float64)
        B = torch.zeros(T + 1, n, H, dtype=torch.float64)
        F[0, :, 0] = 1.0
        for t in range(T):
            f = F[t]
            nxt = torch.zeros_like(f)
            nxt[:, 1:] += up_ok[:, t, None] * f[:, :-1]
            nxt[:, :-1] += down_ok[:, t, None] * f[:, 1:]
            F[t + 1] = nxt / nxt.sum(dim=1, keepdim=True).clamp_min(1e-300)
        B[T, :, 0] = 1.0
        for t in range(T - 1, -1, -1):
            b = B[t + 1]
            prv = torch.zeros_like(b)
            prv[:, :-1] += up_ok[:, t, None] * b[:, 1:]
            prv[:, 1:] += down_ok[:, t, None] * b[:, :-1]
            B[t] = prv / prv.sum(dim=1, keepdim=True).clamp_min(1e-300)
        return F, B

    # ---- downstream -------------------------------------------------------------------
    def mismatch(self, tokens: torch.Tensor) -> torch.Tensor:
        """``g*(x) = #')' - #'('`` per sentence (long ``[n]``), counting words only:
        on a sentence with one masked position this is the paper's MLM target
        (+1 if the hidden word is ``(``, -1 if it is ``)``)."""
        return (tokens == CLOSE).sum(dim=1) - (tokens == OPEN).sum(dim=1)

    def _label_mismatch(self, batch: Batch) -> torch.Tensor:
        tok = batch.tokens
        T = self.length
        if tok.dim() != 2 or tok.shape[1] != T:
            raise ValueError(f"dyck: tokens must be [n, {T}], got {list(tok.shape)}")
        labels = (self.mismatch(tok) + T) // 2
        complete = ((tok == OPEN) | (tok == CLOSE)).all(dim=1)
        return torch.where(complete, labels, torch.full_like(labels, -1))

    @property
    def tasks(self) -> dict[str, Task]:
        T = self.length
        return {
            "mismatch": Task(
                name="mismatch",
                n_classes=T + 1,
                label=self._label_mismatch,
                description=(
                    f"g*(x) = #')' - #'(' in {{-{T}, ..., {T}}} on uniform i.i.d. strings of "
                    f"length {T}; class (g*+{T})/2 = #')'; strings with a non-bracket token "
                    "are left out (-1)"
                ),
                sample=self.sample_uniform,
            )
        }

    # ---- the theory model's input -----------------------------------------------------
    def encode_signed(
        self,
        tokens: torch.Tensor,
        masked: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> torch.Tensor:
        """The §5 encoding, ``[n, T, 2T]``: ``x_t = +e_t`` for ``(``, ``-e_t`` for ``)``,
        and a masked position ``t`` becomes ``±e_{T+t}`` with a fair random sign (drawn
        from ``generator``; one draw per position, masked or not, so the stream does not
        depend on the mask). ``masked=None`` means nothing is masked (downstream input).
        Unmasked positions must hold brackets (else ``ValueError``)."""
        T = self.length
        if tokens.dim() != 2 or tokens.shape[1] != T:
            raise ValueError(f"dyck: tokens must be [n, {T}], got {list(tokens.shape)}")
        n = tokens.shape[0]
        if masked is None:
            masked = torch.zeros(n, T, dtype=torch.bool)
        elif masked.shape != tokens.shape:
            raise ValueError(f"dyck: masked {list(masked.shape)} != tokens {list(tokens.shape)}")
        masked = masked.bool()
        tokens = tokens.long()
        if (~masked & (tokens != OPEN) & (tokens != CLOSE)).any():
            raise ValueError("dyck: an unmasked position holds a non-bracket id")
        signs = torch.randint(0, 2, (n, T), generator=generator).to(dtype) * 2 - 1
        word_sign = torch.where(tokens == OPEN, 1.0, -1.0).to(dtype)
        value = torch.where(masked, signs, word_sign)
        pos = torch.arange(T)
        index = torch.where(masked, pos + T, pos.expand(n, T))
        out = torch.zeros(n, T, 2 * T, dtype=dtype)
        out.scatter_(2, index[..., None], value[..., None])
        return out


def build(size: str = "tiny", seed: int | None = None) -> Dyck:
    """The Dyck language of ``language.size`` (nothing random about it: ``seed`` changes
    nothing, and is accepted so that ``language describe dyck --seed N`` seeds the samples)."""
    return Dyck.preset(size)
