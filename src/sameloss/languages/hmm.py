"""A hidden Markov model language with exact masked-token conditionals.

The paper's first synthetic language (Liu et al., ICML 2023): sentences of fixed length
``T`` emitted by an HMM with ``S`` hidden states and ``W`` words. Pre-training is masked
language modelling; the downstream tasks ask for a hidden state (task-6, task-10).

Everything exact is one batched *scaled forward–backward* pass (a loop over the ``T``
time steps, vectorised over sentences and states; sentences go in cache-sized blocks):

* a masked (or padded) position contributes emission likelihood 1 for every state, which
  marginalises its word;
* the conditional of position ``t`` is ``P(z_t | x_{<t}) · P(x_{>t} | z_t)`` — the
  forward message *before* ``t``'s own emission times the backward message from
  ``t + 1`` — pushed through the emission matrix. It never involves ``x_t``, so query
  positions need not be masked, and one pass gives every position.

Messages are renormalised at every step (each is only needed up to a constant), which
keeps 100 states × length 16 (or much longer) far away from underflow.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from sameloss.errors import UserError
from sameloss.languages.base import Batch, Language, Task
from sameloss.registry import keyword_types, language_params

# the registry reads this from the file (``sameloss.registry``); sizes: the keys of PRESETS
LANGUAGE = {"name": "hmm", "build": "build", "settings": ("size", "seed", "params"), "describe": True}

ROW_SUM_TOL = 1e-8
BLOCK = 512  # sentences per forward–backward block (cache-sized messages)

PRESETS: dict[str, dict] = {
    # The paper's size with ``HMM.random``'s defaults: each state has a handful of likely
    # successors and a few likely words. Optimal MLM loss ≈ 3.2 nats (log 200 ≈ 5.3);
    # the posterior mode recovers the sampled 6th/10th state ≈ 95% of the time; the
    # stationary distribution is close to uniform (no class dominates the tasks).
    "paper": dict(n_states=100, n_words=200, length=16, seed=0),
    # Small enough that a ~100k-parameter transformer fits it on a laptop CPU. Optimal
    # MLM loss ≈ 1.37 nats (log 16 ≈ 2.77); Bayes accuracy of task-5/task-8 ≈ 95%,
    # majority class ≈ 20%. (The seed was chosen among a few: with 8 states a draw can
    # have a nearly absorbing state, e.g. seed 0 at these concentrations.)
    "tiny": dict(n_states=8, n_words=16, length=12, seed=1, concentration=0.2,
                 emission_concentration=0.1),
    # Smaller still, for runs that must reach the saturation regime (KL < 0.01) on a
    # CPU with a ~100k-parameter model: 4 states, 8 words, length 8.
    "micro": dict(n_states=4, n_words=8, length=8, seed=3, concentration=0.2,
                  emission_concentration=0.1),
    # ``micro`` with flatter emissions (concentration 1.0): words reveal the state much less,
    # so the hidden-state tasks keep headroom (task-5: majority ≈ 38 %, a trained ~0.1M
    # model well below the oracle) while that model still reaches KL < 0.01 in minutes on a
    # CPU — the ``isoloss`` study's language.
    "headroom": dict(n_states=4, n_words=8, length=8, seed=3, concentration=0.2,
                     emission_concentration=1.0),
}


def _as_matrix(name: str, value, ndim: int) -> torch.Tensor:
    try:
        t = torch.as_tensor(np.asarray(value, dtype=np.float64))
    except (TypeError, ValueError) as exc:
        raise UserError(f"HMM {name} must be numeric: {exc}") from None
    if t.ndim != ndim:
        raise UserError(f"HMM {name} must be {ndim}-dimensional, got shape {tuple(t.shape)}")
    if t.numel() == 0:
        raise UserError(f"HMM {name} is empty (shape {tuple(t.shape)})")
    if not torch.isfinite(t).all():
        raise UserError(f"HMM {name} contains NaN or infinite entries")
    if (t < 0).any():
        raise UserError(f"HMM {name} has negative entries (min {float(t.min()):.3g})")
    sums = t.sum(dim=-1)
    bad = (sums - 1).abs() > ROW_SUM_TOL
    if bad.any():
        where = "" if ndim == 1 else f" row {int(bad.nonzero()[0, 0])}"
        worst = float(sums.reshape(-1)[bad.reshape(-1)][0])
        raise UserError(f"HMM {name}{where} sums to {worst:.10g}, not 1 (tolerance {ROW_SUM_TOL:g})")
    return t


def default_task_positions(length: int) -> list[int]:
    """1-based positions of the hidden-state tasks.

    Length 16 gives the paper's 6 and 10; other lengths use the same relative places
    (3/8 and 5/8 of the way in), deduplicated.
    """
    ks = [max(1, min(length, int(3 * length / 8 + 0.5))), max(1, min(length, int(5 * length / 8 + 0.5)))]
    return sorted(set(ks))


class HMM(Language):
    """Fixed-length sentences from a hidden Markov model.

    ``initial [S]``, ``transition [S, S]`` (row = current state) and ``emission [S, W]``
    are probability vectors / row-stochastic matrices, stored in float64. Every sentence
    has exactly ``length`` words; ``Batch.latent`` holds the hidden states ``[n, T]``.

    ``task_positions``: 1-based hidden-state positions offered as tasks (default: 6 and
    10 for length 16, see ``default_task_positions``).
    """

    name = "hmm"

    def __init__(self, initial, transition, emission, length: int, words: list[str] | None = None,
                 task_positions: list[int] | None = None):
        self.initial = _as_matrix("initial distribution", initial, 1)
        self.transition = _as_matrix("transition matrix", transition, 2)
        self.emission = _as_matrix("emission matrix", emission, 2)
        s = self.initial.shape[0]
        if self.transition.shape != (s, s):
            raise UserError(
                f"HMM transition matrix must be [{s}, {s}] to match the {s}-state initial "
                f"distribution, got {list(self.transition.shape)}")
        if self.emission.shape[0] != s:
            raise UserError(
                f"HMM emission matrix must have {s} rows (one per state), got {self.emission.shape[0]}")
        if isinstance(length, bool) or not isinstance(length, (int, np.integer)) or length < 1:
            raise UserError(f"HMM sentence length must be a positive integer, got {length!r}")
        self.n_states = s
        self.n_words = int(self.emission.shape[1])
        self.max_len = int(length)
        if words is None:
            words = [f"w{i}" for i in range(self.n_words)]
        words = [str(w) for w in words]
        if len(words) != self.n_words:
            raise UserError(f"HMM has {self.n_words} words but {len(words)} word names were given")
        if len(set(words)) != len(words):
            raise UserError("HMM word names must be distinct")
        self.words = words
        if task_positions is None:
            task_positions = default_task_positions(self.max_len)
        for k in task_positions:
            if not 1 <= int(k) <= self.max_len:
                raise UserError(f"HMM task position {k} is outside 1..{self.max_len} (1-based)")
        self.task_positions = [int(k) for k in task_positions]
        # inverse-CDF tables for sampling, last entry exactly 1 (see ``_inverse_cdf``)
        self._cdf_initial = _cdf(self.initial[None])[0]
        self._cdf_transition = _cdf(self.transition)
        self._cdf_emission = _cdf(self.emission)

    # ---- construction -----------------------------------------------------------------
    @classmethod
    def random(cls, n_states: int = 100, n_words: int = 200, length: int = 16, seed: int = 0,
               concentration: float = 0.05, emission_concentration: float = 0.02,
               smoothing: float = 1e-4) -> HMM:
        """A random HMM with structure.

        * initial: Dirichlet(1) (any state can start);
        * each transition row: Dirichlet(``concentration``) — small values make each state
          move to a handful of successors, so context predicts the next state;
        * each emission row: Dirichlet(``emission_concentration``) — a few dominant words
          per state, so the word usually reveals the state (up to shared words);
        * every row is then mixed with ``smoothing`` × uniform, so every sentence has
          positive probability and conditionals are defined for any input.

        Small concentrations have a cost on few states: the chain can end up with a nearly
        absorbing state (check ``describe()``'s task majority rates).

        Drawn with numpy's ``default_rng(seed)`` (PCG64), so a seed fixes the language
        (numpy does not promise identical Dirichlet streams across major versions).

        Args:
            n_states: hidden states.
            n_words: the vocabulary (words; special tokens are added after them).
            length: words per sentence (every sentence has exactly this many).
            seed: fixes the language.
            concentration: Dirichlet concentration of each transition row.
            emission_concentration: Dirichlet concentration of each emission row.
            smoothing: the share of uniform mixed into every row, in [0, 1).

        Returns:
            the HMM, its tasks the hidden states at ``default_task_positions``.

        Example:
            >>> hmm = HMM.random(n_states=4, n_words=8, length=8, seed=0)
            >>> hmm.sample(2).tokens.shape
            torch.Size([2, 8])
        """
        for label, v in (("n_states", n_states), ("n_words", n_words), ("length", length)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise UserError(f"HMM {label} must be a positive integer, got {v!r}")
        for label, v in (("concentration", concentration), ("emission_concentration", emission_concentration)):
            if not (math.isfinite(v) and v > 0):
                raise UserError(f"HMM {label} must be positive, got {v!r}")
        if not 0 <= smoothing < 1:
            raise UserError(f"HMM smoothing must be in [0, 1), got {smoothing!r}")
        rng = np.random.default_rng(seed)

        def rows(k: int, alpha: float, n_rows: int) -> np.ndarray:
            p = rng.dirichlet(np.full(k, alpha), size=n_rows)
            p = (1 - smoothing) * p + smoothing / k
            return p / p.sum(axis=-1, keepdims=True)

        initial = rows(n_states, 1.0, 1)[0]
        transition = rows(n_states, concentration, n_states)
        emission = rows(n_words, emission_concentration, n_states)
        return cls(initial, transition, emission, length)

    @classmethod
    def preset(cls, name: str, seed: int | None = None, params: str | dict | None = None) -> HMM:
        """Named configurations: ``paper`` (100 states, 200 words, length 16) and ``tiny``.
        ``seed`` draws another HMM of the same shape (default: the preset's own seed);
        ``params`` (``language.params``: ``"n_states=6,concentration=0.5"`` or a dict)
        changes keyword arguments of ``random`` (``PARAMS``) from the size's own."""
        if name not in PRESETS:
            raise UserError(f"unknown HMM size {name!r}; valid sizes: {', '.join(sorted(PRESETS))}")
        kwargs = {**PRESETS[name], **language_params(params, PARAMS, "hmm")}
        if seed is not None:
            kwargs["seed"] = seed
        return cls.random(**kwargs)

    # ---- sampling ---------------------------------------------------------------------
    def sample(self, n: int, generator: torch.Generator | None = None) -> Batch:
        """Ancestral sampling by inverse CDF, vectorised over sentences (loop over time).

        Runs on the generator's device (the CPU without one): a CUDA generator samples on
        the GPU without reading anything back (its stream differs from the CPU's)."""
        device = generator.device if generator is not None else torch.device("cpu")
        cdf_initial, cdf_transition, cdf_emission = self._sampling_tables(device)
        u = torch.rand(n, self.max_len, 2, generator=generator, dtype=torch.float64, device=device)
        states = torch.empty(n, self.max_len, dtype=torch.long, device=device)
        tokens = torch.empty(n, self.max_len, dtype=torch.long, device=device)
        for t in range(self.max_len):
            if t == 0:
                cdf = cdf_initial.expand(n, -1)
            else:
                cdf = cdf_transition[states[:, t - 1]]
            states[:, t] = _inverse_cdf(cdf, u[:, t, 0])
            tokens[:, t] = _inverse_cdf(cdf_emission[states[:, t]], u[:, t, 1])
        lengths = torch.full((n,), self.max_len, dtype=torch.long, device=device)
        return Batch(tokens=tokens, lengths=lengths, latent=states)

    def _sampling_tables(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The inverse-CDF tables on ``device`` (copied there once)."""
        if device.type == "cpu":
            return self._cdf_initial, self._cdf_transition, self._cdf_emission
        cache = self.__dict__.setdefault("_tables_on", {})
        if device not in cache:
            cache[device] = (self._cdf_initial.to(device), self._cdf_transition.to(device),
                             self._cdf_emission.to(device))
        return cache[device]

    # ---- exact inference ----------------------------------------------------------------
    def _observations(self, tokens: torch.Tensor, masked: torch.Tensor | None) -> torch.Tensor:
        """Row of ``_likelihood`` per position, ``[n, T]``: the word, or ``n_words`` (all
        ones) where unobserved — masked, pad or mask id. Sentences may be shorter than
        ``max_len``: an HMM has no end state, so a prefix is the marginal of its words."""
        if tokens.ndim != 2:
            raise ValueError(f"tokens must be [n, T], got shape {tuple(tokens.shape)}")
        tokens = tokens.long()
        unobserved = (tokens == self.pad_id) | (tokens == self.mask_id)
        if masked is not None:
            if masked.shape != tokens.shape:
                raise ValueError(f"masked {tuple(masked.shape)} does not match tokens {tuple(tokens.shape)}")
            unobserved |= masked.bool()
        rows = tokens.masked_fill(unobserved, self.n_words)
        if ((rows < 0) | (rows > self.n_words)).any():
            raise ValueError(f"token ids must be words 0..{self.n_words - 1}, pad or mask")
        return rows

    @property
    def _likelihood(self) -> torch.Tensor:
        """``[W + 1, S]``: row ``w`` is ``P(w | state)``; the extra last row (all ones) is
        the likelihood of an unobserved position, which marginalises its word."""
        return torch.cat([self.emission.t(), torch.ones(1, self.n_states, dtype=torch.float64)])

    def _blocks(self, rows: torch.Tensor, own_word: bool, out: torch.Tensor | None = None):
        """Scaled forward–backward, yielding ``(first sentence, states)`` per block of
        ``BLOCK`` sentences, where ``states [m, T, S]`` is ``P(z_t | observed words)`` —
        the words other than ``t`` (``own_word=False``, for conditionals) or all of them
        (``own_word=True``, the usual posterior). ``states`` is a slice of ``out`` if
        given, else a reused buffer: consume it before asking for the next block.

        Forward: ``states[:, t] ∝ P(z_t | observed x_{<t})``, the filtered state before
        ``t``'s own word. Backward: multiply in ``β_t ∝ P(observed x_{>t} | z_t)`` (and
        the own word's likelihood if asked). Every message is renormalised over states
        (each is needed only up to a constant), so nothing underflows; evidence of
        probability zero gives 0/0 = NaN.

        Blocks keep the ``[block, S]`` messages in cache, and everything is in place
        (matrix products write straight into ``states``): on small CPUs streaming
        through fresh memory costs as much as the arithmetic.
        """
        n, T = rows.shape
        S = self.n_states
        like = self._likelihood
        transition_t = self.transition.t().contiguous()
        size = min(n, BLOCK)
        buf = torch.empty(size, T, S, dtype=torch.float64) if out is None else None
        a = torch.empty(size, S, dtype=torch.float64)
        beta = torch.empty_like(a)
        for start in range(0, n, BLOCK):
            r = rows[start:start + BLOCK]
            m = r.shape[0]
            o = buf[:m] if out is None else out[start:start + m]
            a_, b_ = a[:m], beta[:m]
            o[:, 0] = self.initial
            for t in range(T - 1):
                torch.index_select(like, 0, r[:, t], out=a_)
                a_ *= o[:, t]
                a_ /= a_.sum(dim=1, keepdim=True)
                torch.mm(a_, self.transition, out=o[:, t + 1])
            b_.fill_(1.0 / S)
            for t in range(T - 1, -1, -1):
                q = o[:, t]
                q *= b_
                if own_word or t:
                    torch.index_select(like, 0, r[:, t], out=a_)
                if own_word:
                    q *= a_
                q /= q.sum(dim=1, keepdim=True)
                if t:
                    a_ *= b_
                    torch.mm(a_, transition_t, out=b_)
                    b_ /= b_.sum(dim=1, keepdim=True)
            yield start, o

    def conditionals(self, tokens: torch.Tensor, masked: torch.Tensor,
                     query: torch.Tensor | None = None) -> torch.Tensor:
        """Exact ``P(x_t = w | unmasked words other than t)``, float64 ``[Q, n_words]``.

        Rows follow ``query.nonzero()``; ``query`` defaults to ``masked``. Each is the
        state distribution given the other words pushed through the emission matrix
        (whose rows sum to 1, so these rows do too).
        """
        if query is None:
            query = masked
        if query.shape != tokens.shape:
            raise ValueError(f"query {tuple(query.shape)} does not match tokens {tuple(tokens.shape)}")
        query = query.bool()
        out = torch.empty(int(query.sum()), self.n_words, dtype=torch.float64)
        row = 0
        for start, states in self._blocks(self._observations(tokens, masked), own_word=False):
            q = query[start:start + states.shape[0]]
            k = int(q.sum())
            chosen = states.reshape(-1, self.n_states) if k == q.numel() else states[q]
            torch.mm(chosen, self.emission, out=out[row:row + k])
            row += k
        return out

    def posteriors(self, tokens: torch.Tensor, masked: torch.Tensor | None = None) -> torch.Tensor:
        """``P(z_t = s | unmasked words)``, float64 ``[n, T, S]``."""
        rows = self._observations(tokens, masked)
        out = torch.empty(*rows.shape, self.n_states, dtype=torch.float64)
        for _ in self._blocks(rows, own_word=True, out=out):
            pass
        return out

    # ---- downstream tasks -------------------------------------------------------------
    @property
    def tasks(self) -> dict[str, Task]:
        """``task-k``: the k-th hidden state (1-based), labelled by its posterior mode
        given the whole sentence — the Bayes-optimal label, so the task is learnable to
        the extent the sentence determines the state. ``task-k-sampled``: the state the
        sampler actually drew (``batch.latent``), which is noisier (Bayes accuracy < 1).
        """
        out: dict[str, Task] = {}
        for k in self.task_positions:
            # both are about the state at position k; its posterior is the oracle's representation
            about = dict(span=(k - 1, k), posterior=self._state_posterior(k))
            out[f"task-{k}"] = Task(
                name=f"task-{k}", n_classes=self.n_states, label=self._posterior_label(k),
                description=f"posterior mode of hidden state {k} (1-based) given the sentence", **about)
            out[f"task-{k}-sampled"] = Task(
                name=f"task-{k}-sampled", n_classes=self.n_states, label=self._sampled_label(k),
                description=f"sampled hidden state {k} (1-based), from the batch's latent states", **about)
        return out

    def _state_posterior(self, k: int):
        def posterior(tokens: torch.Tensor) -> torch.Tensor:
            return self.posteriors(tokens)[:, k - 1]
        return posterior

    def _posterior_label(self, k: int):
        def label(batch: Batch) -> torch.Tensor:
            return self.posteriors(batch.tokens)[:, k - 1].argmax(dim=1)
        return label

    def _sampled_label(self, k: int):
        def label(batch: Batch) -> torch.Tensor:
            if batch.latent is None:
                raise ValueError(f"task-{k}-sampled needs the sampled hidden states (batch.latent)")
            return batch.latent[:, k - 1].long()
        return label


def _cdf(p: torch.Tensor) -> torch.Tensor:
    c = p.cumsum(dim=1)
    return c / c[:, -1:]


def _inverse_cdf(cdf: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Index ``i`` with ``cdf[i-1] <= u < cdf[i]`` per row for ``u`` in [0, 1).

    ``right=True`` skips zero-probability entries (flat steps of the cdf); the last
    cdf entry is exactly 1, so ``u < 1`` always lands on a positive-probability index."""
    idx = torch.searchsorted(cdf.contiguous(), u[:, None].contiguous(), right=True)[:, 0]
    return idx.clamp(max=cdf.shape[1] - 1)


# what ``language.params`` may change: the keyword arguments of ``HMM.random`` but its seed
PARAMS = keyword_types(HMM.random)


def build(size: str = "tiny", seed: int | None = None, params: str | None = None) -> HMM:
    """The HMM of ``language.size`` (``seed``: another draw of its shape; ``params``: other
    constructor settings than the size's own)."""
    return HMM.preset(size, seed=seed, params=params)
