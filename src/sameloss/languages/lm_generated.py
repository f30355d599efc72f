"""Text sampled from a causal language model, with exact masked-token conditionals.

The paper's third data source (§2.2, App. A.1/A.3): sentences sampled from OPT-125M,
restricted to its K most frequent tokens, of fixed length T, starting after the bos
token. The generator's joint is known, so the MLM conditionals are exact:

    P(x) = ∏_s q(x_s | bos, x_<s),   q = the generator's next-token softmax renormalised
                                         over the K allowed tokens,
    P(x_t = w | x_−t) ∝ P(x_1..x_{t−1}, w, x_{t+1}..x_T)
                      ∝ q(w | x_<t) · ∏_{s>t} q(x_s | x_<t, w, x_{t+1..s−1}).

Any local Hugging Face causal LM folder works (GPT-2, OPT, Llama-style):
``CausalLM.from_pretrained(DIR, k=K, length=T)``. Language ids ``0..K−1`` follow the
order of ``tokens`` (generator ids), then pad/mask/cls as in every language.

Fast exact conditionals (``conditionals``):

* one pass over ``[bos, x_1..x_{T−1}]`` gives every prefix term ``q(· | x_<t)`` and, in
  its KV cache, the cached prefix of every position (causal attention: the cache of
  ``bos..x_{t−1}`` is the first ``t`` entries of the full one);
* per position ``t``, that prefix cache is repeated K ways and the K continuations
  ``w, x_{t+1}, …`` run on top of it, in chunks of at most ``chunk_tokens`` tokens;
* only the K rows of the output head that the allowed tokens need are applied (the
  base model's last hidden state already carries the model's final norm).

Exactness has a price beyond one masked position: marginalising m hidden words costs
K^m continuations, so ``conditionals`` refuses that (``UserError``) — pre-train with
``masking=single``. Hidden positions *after* every observed one are free (the sum over
a causal model's continuations is 1), so trailing pads are fine.

Allowed tokens: explicit generator ids, or the K most frequent tokens of the
unrestricted generator (``expected_token_counts``), cached in the generator folder so a
language is reproducible (``lm_tokens.py``).

Training sentences may come from a stored pool (``from_pretrained(pool=DIR)``,
``language.pool``; written by ``sameloss causal-lm sample``, ``lm_train.py``):
``sample_train`` draws its rows with the step's generator; ``sample`` (held-out
evaluation, measures) stays ancestral. Text goes through the generator's own tokenizer
(``encode_generator``, ``generator_to_language``) for GLUE-format tasks
(``measures/glue.py``).

``transformers`` is an optional dependency (``pip install 'sameloss[hf]'``); loading it, reading a generator
folder and its KV cache across transformers releases are ``lm_generator.py``'s.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from sameloss.errors import UserError
from sameloss.errors import first_line as _one_line
from sameloss.files import sha256_of
from sameloss.libraries import quiet_transformers
from sameloss.languages.base import Batch, Language, Task
from sameloss.languages.lm_generator import (cache_keyword, check_causal, kv_pairs, make_cache, parse_device,
                                             parse_dtype, require_transformers, returned_cache)
from sameloss.languages.lm_tokens import TOKENIZER_FILES, frequent_tokens, load_tokens, save_tokens, tokenizer_words

# the registry reads this from the file (``sameloss.registry``)
LANGUAGE = {"name": "causal", "build": "build", "settings": ("generator", "k", "length", "pool", "device"),
            "describe": False}
DEFAULTS = {"k": 2000, "length": 24}  # the paper's OPT data (App. A.1)

SAMPLE_BLOCK = 1024  # sentences per sampling block
POOL_META = "meta.json"  # a token pool (``sameloss causal-lm sample``, ``lm_train.write_pool``)
POOL_TOKENS = "tokens.npy"
LOGIT_CHECK_TOL = {torch.float64: 1e-9, torch.float32: 1e-4}  # restricted head vs the model's logits


@dataclass(frozen=True)
class CausalSettings:
    """The causal language's own ``language.*`` settings (``make_language(..., causal=)``):
    the generator folder, K allowed tokens and the sentence length T (``None``: the
    paper's, ``DEFAULTS``), and a token pool its training sentences are drawn from."""

    generator: str | None = None
    k: int | None = None
    length: int | None = None
    pool: str | None = None


@dataclass(frozen=True)
class LoadSettings:
    """How ``CausalLM.from_pretrained`` works with the generator beyond K and T: the
    ``frequency_sentences`` ancestral samples (seeded by ``frequency_seed``) whose expected
    token counts rank the K most frequent tokens when none are given, and the
    ``chunk_tokens`` of one continuation pass in ``conditionals``."""

    frequency_sentences: int = 4096
    frequency_seed: int = 0
    chunk_tokens: int = 1 << 15


class _PrefixPass(NamedTuple):
    """One pass of ``conditionals`` over the sentences it needs: the KV cache as pairs and
    as returned (``kv``, ``past``), and their words in generator and language ids."""

    kv: list
    past: object
    gen_words: torch.Tensor
    words: torch.Tensor


class CausalLM(Language):
    """Fixed-length sentences from a causal LM restricted to K allowed tokens.

    ``model``: a Hugging Face ``*ForCausalLM`` (moved to ``device``/``dtype``, eval mode);
    ``tokens``: the K allowed generator ids, in language-id order; ``length``: T;
    ``bos_id``: the generator id every sentence starts after. ``chunk_tokens`` bounds the
    tokens (rows × positions) of one continuation forward pass in ``conditionals``.
    """

    name = "causal"

    def __init__(self, model, tokens: Sequence[int], length: int, bos_id: int, words: list[str] | None = None,
                 chunk_tokens: int = 1 << 15, source: str | None = None):
        head = model.get_output_embeddings()
        if head is None or not hasattr(head, "weight"):
            raise UserError("the generator has no linear output head (get_output_embeddings() is None)")
        vocab = int(head.weight.shape[0])
        if isinstance(length, bool) or not isinstance(length, int) or length < 1:
            raise UserError(f"causal language length must be a positive integer, got {length!r}")
        tokens = [int(t) for t in tokens]
        if not tokens:
            raise UserError("causal language needs at least one allowed token")
        if len(set(tokens)) != len(tokens):
            raise UserError("causal language allowed tokens must be distinct")
        bad = [t for t in tokens if not 0 <= t < vocab]
        if bad:
            raise UserError(f"allowed token {bad[0]} is outside the generator's vocabulary 0..{vocab - 1}")
        if not 0 <= bos_id < vocab:
            raise UserError(f"the generator's bos token {bos_id} is outside its vocabulary 0..{vocab - 1}")
        positions = getattr(model.config, "max_position_embeddings", None) or getattr(model.config, "n_positions", None)
        if positions is not None and length + 1 > positions:
            raise UserError(f"length {length} + bos exceeds the generator's {positions} positions")
        self.model = model.eval().requires_grad_(False)
        self.base = model.base_model
        self._cache_keyword = cache_keyword(self.base)
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.n_words = len(tokens)
        self.max_len = length
        self.bos_id = int(bos_id)
        self.source = source
        self.chunk_tokens = int(chunk_tokens)
        self.tokens = torch.tensor(tokens, dtype=torch.long)
        self._ids = self.tokens.to(self.device)  # language id -> generator id
        # the K rows of the output head the allowed tokens need (copied: contiguous for mm)
        self._head_w = head.weight.detach()[self._ids].contiguous()
        bias = getattr(head, "bias", None)
        self._head_b = None if bias is None else bias.detach()[self._ids].contiguous()
        self.words = self._word_names(words)
        self.pool: np.ndarray | None = None  # [N, T] sentences for sample_train (from_pretrained(pool=))
        self._tokenizer = None
        self._check_head()

    def _word_names(self, words):
        if words is not None:
            words = [str(w) for w in words]
            if len(words) != self.n_words or len(set(words)) != len(words):
                words = None
        return words or [f"<{t}>" for t in self.tokens.tolist()]

    # ---- construction -----------------------------------------------------------------
    @classmethod
    def from_pretrained(cls, path, k: int, length: int, tokens: Sequence[int] | str | Path | None = None,
                        device="cpu", dtype=torch.float32, pool=None, settings: LoadSettings = LoadSettings()
                        ) -> CausalLM:
        """Load a local HF causal LM folder as a language of K tokens and length T.

        ``tokens``: allowed generator ids (a list, or a JSON file written by
        ``save_tokens``); ``None``: the K most frequent tokens of the unrestricted
        generator (see the module docstring; the list is cached in the folder).
        ``pool``: a folder of ``sameloss causal-lm sample`` that ``sample_train`` draws
        from (``sameloss.languages.lm_train``). ``settings``: how the frequent tokens are
        estimated and how large a pass of ``conditionals`` is (``LoadSettings``).
        """
        transformers = require_transformers()
        for label, v in (("k", k), ("length", length)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise UserError(f"causal language {label} must be a positive integer, got {v!r}")
        folder = Path(path)
        if not folder.is_dir():
            raise UserError(f"generator folder not found: {folder}")
        device, dtype = parse_device(device), parse_dtype(dtype)
        try:
            with quiet_transformers(transformers):  # a weight-loading bar per language build is noise
                check_causal(transformers.AutoConfig.from_pretrained(str(folder), local_files_only=True), folder)
                model = transformers.AutoModelForCausalLM.from_pretrained(str(folder), local_files_only=True)
        except UserError:
            raise
        except Exception as exc:  # transformers raises OSError, ValueError, KeyError, ... for bad folders
            raise UserError(f"cannot load a causal LM from {folder}: {_one_line(exc)}") from None
        model = model.to(device=device, dtype=dtype)
        vocab = int(model.get_output_embeddings().weight.shape[0])
        if k > vocab:
            raise UserError(f"k={k} is larger than the generator's vocabulary of {vocab} tokens")
        positions = getattr(model.config, "max_position_embeddings", None) or getattr(model.config, "n_positions", None)
        if positions is not None and length + 1 > positions:  # before the frequent tokens are estimated at T
            raise UserError(f"length {length} + bos exceeds the generator's {positions} positions")
        config = model.config
        bos = config.bos_token_id if config.bos_token_id is not None else config.eos_token_id
        if isinstance(bos, (list, tuple)):
            bos = bos[0] if bos else None
        if bos is None:
            raise UserError(f"the generator in {folder} has neither a bos nor an eos token id in its config")
        if isinstance(tokens, (str, Path)):
            tokens = load_tokens(tokens, k=k)
        elif tokens is None:
            tokens = frequent_tokens(model, folder, k, length, int(bos), settings.frequency_sentences,
                                     settings.frequency_seed, expected_token_counts)
        tokens = [int(t) for t in tokens]
        if len(tokens) != k:
            raise UserError(f"k={k} but {len(tokens)} allowed tokens were given")
        lm = cls(model, tokens, length, int(bos), words=tokenizer_words(transformers, folder, tokens),
                 chunk_tokens=settings.chunk_tokens, source=str(folder))
        if pool is not None:
            lm.pool = load_pool(pool, k, length, tokens)
        return lm

    def save_tokens(self, path) -> None:
        """Write the allowed generator ids (language-id order) as JSON (never overwrites)."""
        save_tokens(path, self.tokens.tolist(), self.max_len, self.bos_id, self.source)

    load_tokens = staticmethod(load_tokens)  # (``lm_tokens.load_tokens``)

    # ---- the generator's pieces ---------------------------------------------------------
    def _forward(self, ids: torch.Tensor, past=None):
        """Base-model pass: (last hidden state ``[n, L, d]``, KV cache)."""
        out = self.base(input_ids=ids, use_cache=True, **{self._cache_keyword: past})
        return out[0], returned_cache(out)

    def _restricted_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits of the K allowed tokens only (K rows of the head), ``[..., K]``."""
        logits = hidden @ self._head_w.t()
        return logits if self._head_b is None else logits + self._head_b

    def _check_head(self) -> None:
        """The restricted head must reproduce the model's own logits: refuse architectures
        whose head is more than a linear map of the base model's output (soft-capping,
        logit scales), where the K-row shortcut would be wrong."""
        ids = torch.cat([torch.tensor([self.bos_id]), self.tokens[:2]])[None].to(self.device)
        with torch.no_grad():
            full = self.model(input_ids=ids).logits[..., self._ids]
            mine = self._restricted_logits(self._forward(ids)[0])
        tol = LOGIT_CHECK_TOL.get(self.dtype, 1e-2) * max(1.0, float(full.abs().max()))
        if not torch.allclose(mine, full, rtol=0, atol=tol):
            raise UserError("the generator's logits are not a linear head on its base model's output "
                            "(soft-capping or logit scaling?); this architecture is not supported")

    def _generator_ids(self, tokens: torch.Tensor) -> torch.Tensor:
        return self._ids[tokens.to(self.device)]

    def _inputs(self, tokens: torch.Tensor) -> torch.Tensor:
        """``[bos, x_1 .. x_{T−1}]`` in generator ids (language ids in ``tokens``)."""
        gen = self._generator_ids(tokens)
        bos = torch.full((gen.shape[0], 1), self.bos_id, dtype=torch.long, device=self.device)
        return torch.cat([bos, gen[:, :-1]], dim=1)

    @torch.no_grad()
    def next_log_probs(self, tokens: torch.Tensor, full_head: bool = False) -> torch.Tensor:
        """``log q(· | bos, x_<s)`` for s = 1..T, float64 ``[n, T, K]`` (CPU).

        ``full_head=True`` takes the model's full-vocabulary logits and renormalises their
        K allowed entries (the reference for the restricted head)."""
        ids = self._inputs(tokens)
        if full_head:
            logits = self.model(input_ids=ids).logits[..., self._ids]
        else:
            logits = self._restricted_logits(self._forward(ids)[0])
        return torch.log_softmax(logits.double(), dim=-1).cpu()

    def log_prob(self, tokens: torch.Tensor, full_head: bool = False) -> torch.Tensor:
        """``log P(x)``, float64 ``[n]``."""
        lq = self.next_log_probs(tokens, full_head)
        return lq.gather(2, tokens.long().cpu()[..., None]).squeeze(2).sum(dim=1)

    # ---- sampling ---------------------------------------------------------------------
    @torch.no_grad()
    def sample(self, n: int, generator: torch.Generator | None = None) -> Batch:
        """Ancestral sampling by inverse CDF with the KV cache, batched over sentences.
        The uniforms come from ``generator`` on the CPU, so a seed fixes the sentences
        (up to the device's arithmetic)."""
        u = torch.rand(n, self.max_len, generator=generator, dtype=torch.float64)
        out = torch.empty(n, self.max_len, dtype=torch.long)
        for start in range(0, n, SAMPLE_BLOCK):
            block = u[start:start + SAMPLE_BLOCK].to(self.device)
            out[start:start + block.shape[0]] = _ancestral(self, block, restricted=True).cpu()
        return Batch(tokens=out, lengths=torch.full((n,), self.max_len, dtype=torch.long))

    def sample_train(self, n: int, generator: torch.Generator | None = None) -> Batch:
        """Training sentences: ``n`` rows of the pool drawn uniformly with replacement by
        ``generator`` (a pure function of its state), or ``sample`` without a pool. The
        pool holds samples of the same joint, so nothing exact changes."""
        if self.pool is None:
            return self.sample(n, generator)
        rows = torch.randint(self.pool.shape[0], (n,), generator=generator)
        tokens = torch.from_numpy(self.pool[rows.numpy()].astype(np.int64))
        return Batch(tokens=tokens, lengths=torch.full((n,), self.max_len, dtype=torch.long))

    # ---- exact conditionals -------------------------------------------------------------
    def _hidden_positions(self, tokens: torch.Tensor, masked: torch.Tensor | None) -> torch.Tensor:
        if tokens.ndim != 2:
            raise ValueError(f"tokens must be [n, T], got shape {tuple(tokens.shape)}")
        if tokens.shape[1] > self.max_len:
            raise ValueError(f"sentences of {tokens.shape[1]} positions exceed the language's length {self.max_len}")
        hidden = (tokens == self.pad_id) | (tokens == self.mask_id)
        if masked is not None:
            if masked.shape != tokens.shape:
                raise ValueError(f"masked {tuple(masked.shape)} does not match tokens {tuple(tokens.shape)}")
            hidden = hidden | masked.bool()
        words = tokens.masked_fill(hidden, 0)
        if ((words < 0) | (words >= self.n_words)).any():
            raise ValueError(f"token ids must be words 0..{self.n_words - 1}, pad or mask")
        return hidden

    def _query_spans(self, hidden: torch.Tensor, query: torch.Tensor):
        """Per query row: sentence, position and the last position whose term counts
        (the last observed one, or the query's own). Refuses hidden words that would
        have to be marginalised (before that last position)."""
        T = hidden.shape[1]
        qi, qt = query.nonzero(as_tuple=True)
        pos = torch.arange(T)
        last_observed = torch.where(~hidden, pos, -1).max(dim=1).values if T else torch.zeros(0, dtype=torch.long)
        last = torch.maximum(qt, last_observed[qi])
        inner = hidden[qi] & (pos[None, :] < last[:, None]) & (pos[None, :] != qt[:, None])
        if inner.any():
            m = int(inner.sum(dim=1).max()) + 1
            raise UserError(
                f"the causal language's exact conditionals take one masked position per sentence; a sentence "
                f"here has {m} hidden positions, which would cost K^{m} = {self.n_words}^{m} = "
                f"{float(self.n_words) ** m:.3g} forward passes (pre-train with masking=single)")
        return qi, qt, last

    @torch.no_grad()
    def conditionals(self, tokens: torch.Tensor, masked: torch.Tensor,
                     query: torch.Tensor | None = None) -> torch.Tensor:
        """Exact ``P(x_t = w | unmasked words other than t)``, float64 ``[Q, K]`` (CPU),
        rows following ``query.nonzero()`` (``query`` defaults to ``masked``).

        Each query may have hidden (masked/pad) words only after every observed word;
        anything else needs marginalising and raises ``UserError`` (module docstring)."""
        if query is None:
            query = masked
        if query.shape != tokens.shape:
            raise ValueError(f"query {tuple(query.shape)} does not match tokens {tuple(tokens.shape)}")
        tokens = tokens.long().cpu()
        hidden = self._hidden_positions(tokens, masked.cpu() if masked is not None else None)
        qi, qt, last = self._query_spans(hidden, query.bool().cpu())
        K, T = self.n_words, tokens.shape[1]
        out = torch.empty(qi.shape[0], K, dtype=torch.float64)
        if qi.numel() == 0:
            return out
        words = tokens.masked_fill(hidden, 0)  # hidden words: any valid id (see _query_spans)
        needed = torch.unique(qi)  # only sentences with a query go through the model
        remap = torch.full((tokens.shape[0],), -1, dtype=torch.long)
        remap[needed] = torch.arange(needed.numel())
        words_n = words[needed]
        hidden_states, past = self._forward(self._inputs(words_n))
        prefix = torch.log_softmax(self._restricted_logits(hidden_states).double(), dim=-1)  # [n, T, K]
        prefix_pass = _PrefixPass(kv_pairs(past), past, self._generator_ids(words_n), words_n.to(self.device))
        for t in range(T):  # a loop over positions; everything inside is batched
            rows = (qt == t).nonzero(as_tuple=True)[0]
            if rows.numel() == 0:
                continue
            sent = remap[qi[rows]].to(self.device)
            score = prefix[sent, t].clone()  # [b, K]: log q(w | x_<t)
            stop = int(last[rows].max())  # continuation predicts x_{t+1} .. x_stop
            if stop > t:
                score += self._continuations(prefix_pass, sent, t, stop, last[rows].to(self.device))
            out[rows] = torch.softmax(score, dim=-1).cpu()
        return out

    def _continuations(self, prefix_pass: _PrefixPass, sent, t: int, stop: int, last) -> torch.Tensor:
        """``Σ_{s=t+1}^{last} log q(x_s | x_<t, w, x_{t+1..s−1})`` for every candidate w,
        float64 ``[b, K]``: the prefix cache (bos..x_{t−1}, ``t + 1`` entries) repeated K
        ways under the continuations ``w, x_{t+1} .. x_{stop−1}``, in chunks."""
        K = self.n_words
        b = sent.shape[0]
        length = stop - t
        past = prefix_pass.past
        prefix_kv = [(k_[sent, :, :t + 1], v_[sent, :, :t + 1]) for k_, v_ in prefix_pass.kv]
        suffix = prefix_pass.gen_words[sent, t + 1:stop]  # [b, length − 1]
        targets = prefix_pass.words[sent, t + 1:stop + 1]  # [b, length]
        cand = self._ids  # [K]: the candidate at the position, in generator ids
        counts = (torch.arange(t + 1, stop + 1, device=self.device)[None, :] <= last[:, None]).double()
        total = torch.empty(b * K, dtype=torch.float64, device=self.device)
        rows_per_chunk = max(1, self.chunk_tokens // (t + 1 + length))
        for lo in range(0, b * K, rows_per_chunk):
            r = torch.arange(lo, min(lo + rows_per_chunk, b * K), device=self.device)
            s, w = r // K, r % K  # sentence (within the b) and candidate of each row
            ids = torch.cat([cand[w][:, None], suffix[s]], dim=1)
            cache = make_cache([(k_[s], v_[s]) for k_, v_ in prefix_kv], past, self.model.config)
            h, _ = self._forward(ids, cache)
            logq = torch.log_softmax(self._restricted_logits(h).double(), dim=-1)  # [rows, length, K]
            picked = logq.gather(2, targets[s][..., None]).squeeze(2)
            total[lo:lo + r.shape[0]] = (picked * counts[s]).sum(dim=1)
        return total.view(b, K)

    @torch.no_grad()
    def conditionals_reference(self, tokens: torch.Tensor, query: torch.Tensor, chunk_rows: int = 256) -> torch.Tensor:
        """The plain computation: for every query, score the K full sentences (the word at
        ``t`` replaced by each candidate) independently, without a KV cache, from the
        model's full-vocabulary logits. Same rows as ``conditionals(tokens, none masked,
        query)``; a reference for tests and the benchmark."""
        tokens = tokens.long().cpu()
        qi, qt = query.bool().cpu().nonzero(as_tuple=True)
        K = self.n_words
        sentences = tokens[qi].repeat_interleave(K, dim=0)  # [Q·K, T]
        sentences[torch.arange(sentences.shape[0]), qt.repeat_interleave(K)] = torch.arange(K).repeat(qi.numel())
        scores = torch.cat([self.log_prob(sentences[i:i + chunk_rows], full_head=True)
                            for i in range(0, sentences.shape[0], chunk_rows)]) if len(sentences) else \
            torch.empty(0, dtype=torch.float64)
        return torch.softmax(scores.view(-1, K), dim=-1)

    # ---- text through the generator's tokenizer (GLUE downstream tasks) ---------------------
    def tokenizer(self):
        """The generator folder's own tokenizer (``UserError`` when it has none)."""
        if self._tokenizer is None:
            transformers = require_transformers()
            folder = Path(self.source) if self.source else None
            try:
                if folder is None:
                    raise OSError("the language was not loaded from a folder")
                # without its files, AutoTokenizer may quietly build another tokenizer from the config
                if not any((folder / f).exists() for f in TOKENIZER_FILES):
                    raise OSError(f"none of {', '.join(TOKENIZER_FILES)} in the folder")
                with quiet_transformers(transformers):
                    self._tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
            except Exception as exc:  # transformers raises several kinds for a folder without a tokenizer
                raise UserError(f"re-tokenising text needs the generator's tokenizer, and none loads from "
                                f"{folder}: {_one_line(exc)}") from None
        return self._tokenizer

    def encode_generator(self, texts: Sequence[str]) -> list[list[int]]:
        """Generator token ids of each text (its own tokenizer, no special tokens)."""
        return self.tokenizer()(list(texts), add_special_tokens=False)["input_ids"]

    def generator_to_language(self) -> torch.Tensor:
        """``[vocab]`` language id of every generator id, −1 outside the K allowed."""
        vocab = int(self.model.get_output_embeddings().weight.shape[0])
        table = torch.full((vocab,), -1, dtype=torch.long)
        table[self.tokens] = torch.arange(self.n_words)
        return table

    # ---- downstream tasks -------------------------------------------------------------
    @property
    def tasks(self) -> dict[str, Task]:
        """None: the paper's downstream tasks for this data are GLUE sets (SST-2, QNLI)
        re-tokenised with the generator's tokenizer, which come from files
        (``--probe glue:sst2=DIR``; ``sameloss.measures.glue``)."""
        return {}


@torch.no_grad()
def _ancestral(lm_or_model, u: torch.Tensor, restricted: bool, bos: int | None = None,
               accumulate: torch.Tensor | None = None) -> torch.Tensor:
    """Sample ``u.shape`` tokens by inverse CDF with the KV cache. ``restricted``: over
    the language's K tokens (returns language ids; ``lm_or_model`` is a ``CausalLM``);
    else over the full vocabulary of a bare HF model (returns generator ids) and adds
    each step's next-token probabilities into ``accumulate``."""
    n, T = u.shape
    if restricted:
        lm = lm_or_model
        base, head = lm.base, lm._restricted_logits
        bos, to_gen, device = lm.bos_id, lm._ids, lm.device
    else:
        model = lm_or_model
        base, head, to_gen = model.base_model, model.get_output_embeddings(), None
        device = u.device
    ids = torch.full((n, 1), bos, dtype=torch.long, device=device)
    out = torch.empty(n, T, dtype=torch.long, device=device)
    past = None
    keyword = cache_keyword(base)
    for s in range(T):
        o = base(input_ids=ids, use_cache=True, **{keyword: past})
        past = returned_cache(o)
        p = torch.softmax(head(o[0][:, -1]).double(), dim=-1)
        if accumulate is not None:
            accumulate += p.sum(dim=0).cpu()
        cdf = p.cumsum(dim=1)
        cdf = cdf / cdf[:, -1:]
        pick = torch.searchsorted(cdf, u[:, s:s + 1].contiguous(), right=True)[:, 0].clamp(max=p.shape[1] - 1)
        out[:, s] = pick
        ids = (to_gen[pick] if to_gen is not None else pick)[:, None]
    return out


def expected_token_counts(model, bos: int, length: int, n_sentences: int, seed: int) -> torch.Tensor:
    """Expected number of times each generator token occurs in ``n_sentences`` sentences
    of ``length`` from the unrestricted model: its next-token probabilities summed along
    seeded ancestral samples (an unbiased, lower-variance version of counting them),
    float64 ``[vocab]``."""
    vocab = int(model.get_output_embeddings().weight.shape[0])
    device = next(model.parameters()).device
    counts = torch.zeros(vocab, dtype=torch.float64)
    gen = torch.Generator().manual_seed(seed)
    u = torch.rand(n_sentences, length, generator=gen, dtype=torch.float64)
    for start in range(0, n_sentences, SAMPLE_BLOCK // 4):
        _ancestral(model, u[start:start + SAMPLE_BLOCK // 4].to(device), restricted=False, bos=bos, accumulate=counts)
    return counts


def load_pool(folder, k: int, length: int, tokens: Sequence[int]) -> np.ndarray:
    """The pool's sentences ``[N, T]`` (language ids, kept in the file's compact dtype),
    checked against the language."""
    folder = Path(folder)
    meta_path = folder / POOL_META
    if not meta_path.is_file():
        raise UserError(f"{folder} is not a token pool (no {POOL_META}); write one with 'sameloss causal-lm sample'")
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        want = meta["tokens_sha256"]
        if not isinstance(want, str) or not isinstance(meta.get("tokens", []), list):
            raise TypeError
    except (ValueError, KeyError, TypeError):  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise UserError(f"{meta_path} is not a pool's meta.json") from None
    path = folder / POOL_TOKENS
    if not path.is_file() or sha256_of(path) != want:
        raise UserError(f"{path} is missing or does not match its checksum in {POOL_META}")
    if meta.get("k") != k or meta.get("length") != length:
        raise UserError(f"pool {folder} holds K={meta.get('k')}, T={meta.get('length')} sentences; the language has "
                        f"K={k}, T={length}")
    if meta.get("tokens") != [int(t) for t in tokens]:
        raise UserError(f"pool {folder} was sampled with other allowed tokens than this language's")
    try:  # a truncated or foreign file (also one whose checksum was updated to match)
        data = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise UserError(f"{path} is damaged (not a token array: {_one_line(exc)}); sample the pool again") from None
    if not isinstance(data, np.ndarray) or data.ndim != 2 or data.shape[1] != length or data.shape[0] < 1 \
            or data.dtype.kind not in "iu" or int(data.max()) >= k or int(data.min()) < 0:
        raise UserError(f"{path}: not a [N, {length}] array of ids below {k}")
    n = meta.get("n")
    if isinstance(n, bool) or not isinstance(n, int) or n != data.shape[0]:
        # the metadata describes another array than this one: which one is right cannot be told
        raise UserError(f"{meta_path} says n = {n!r} sentences, but {path} holds {data.shape[0]}; sample the pool "
                        "again")
    return data


def build(generator: str | None = None, k: int | None = None, length: int | None = None, pool: str | None = None,
          device: str = "cpu") -> CausalLM:
    """The causal language of the generator folder ``language.generator`` (``k``, ``length``:
    the paper's 2000 and 24 by default), run on ``device``, its training sentences from
    ``pool`` if given."""
    if generator is None:
        raise UserError("the causal language needs language.generator=DIR (a local Hugging Face causal LM folder)")
    return CausalLM.from_pretrained(generator, k=DEFAULTS["k"] if k is None else k,
                                    length=DEFAULTS["length"] if length is None else length, device=device, pool=pool)
