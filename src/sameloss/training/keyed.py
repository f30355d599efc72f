"""Keyed dropout draws (``dropout_draws = "keyed"``): every dropout mask a pure function of
``(seed, step, pass, site, position)``, instead of draws from torch's global RNG.

Why. A run's default dropout (``"global"``) draws its masks from the global generator,
seeded with the run's seed and advanced by every draw in order. That stream cannot be
reproduced by a batched ensemble (``training.ensemble``): members would have to take turns
on one generator (a launch per member and dropout site: the cost batching removes), and on
CUDA the fused dropout kernels lay their random numbers out by their own vectorisation.
A keyed mask is computed from integers by a hash, elementwise, so S members draw theirs in
one batched operation (the key a per-member tensor under ``vmap``) and each member's masks
equal those of its one-model run with the same config — on any device, whatever else is in
the ensemble. It is an option of the run's config, not a silent change: every recipe's runs
keep ``"global"`` (their numbers are pinned), and a run with ``"keyed"`` is another run.

The draw. ``site_keys`` gives a 32-bit key per ``(seed, step, pass, site)`` (numpy's wrapping
uint64 arithmetic: splitmix64 of the mixed integers; stream 6, apart from the data stream 0,
evaluation 1, adversarial 3–4 and flatness 5). An element at flat position ``i`` of a mask
is kept iff ``h(h(i) ^ key) ≥ ⌊p·2³²⌋`` for the 32-bit integer hash ``h`` (two rounds of
xor-shift-multiply, in int64 tensors with every product below 2⁶³: no overflow) — kept with
probability ``1 − p`` to 2⁻³², and scaled by ``1/(1 − p)`` as ``F.dropout`` does. ``h(i)`` is
cached per mask size. Passes: the update forward (0), SAM's ascent forward (1) and the
adversarial objective's features (2) draw apart, as the global stream's successive draws do;
so do the successive calls of one site in a pass (a block's one ``nn.Dropout`` after its
attention and after its MLP: the k-th call's key is offset by k times the golden ratio).

Where. ``install(model)`` swaps every ``nn.Dropout`` of a model for a ``KeyedDropout`` site
(numbered in module order) and the transformer's attention for ``KeyedSelfAttention`` (the
same parameters; in training, the math attention with a keyed mask on its probabilities —
SDPA draws its own); state dicts are unchanged. Outside training (evaluation, measures)
both behave as the originals. The masks of a step come from the ``draws`` context, which
the loop opens around each forward pass (one model: ``one_model``; an ensemble: inside
its ``vmap``, with per-member keys, rates and scales). A multi-layer LSTM with dropout is
refused: its fused kernel draws the between-layer dropout itself.

Cost: a few integer operations per masked element (``bench/bench_ensemble.py`` prints a
keyed step against a global one on this CPU).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from ..errors import UserError

STREAM_DROPOUT = 6
PASS_UPDATE, PASS_ASCENT, PASS_ADVERSARIAL = 0, 1, 2
N_PASSES = 3
MASK32 = 0xFFFFFFFF
_MUL = 0x45D9F3B  # < 2^27: a product with a 32-bit value stays below 2^63
_GOLDEN = 0x9E3779B1
_M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash of int64 ``x`` holding values in ``[0, 2³²)`` (elementwise)."""
    x = x ^ (x >> 16)
    x = (x * _MUL) & MASK32
    x = x ^ (x >> 16)
    x = (x * _MUL) & MASK32
    return x ^ (x >> 16)


def _splitmix(z: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser on uint64 arrays (numpy wraps modulo 2⁶⁴)."""
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def site_keys(seeds, step: int, n_sites: int) -> np.ndarray:
    """``[len(seeds), N_PASSES, n_sites]`` int64 keys in ``[0, 2³²)`` of one step."""
    seeds = np.asarray(seeds, dtype=np.int64).astype(np.uint64)
    passes = np.arange(N_PASSES, dtype=np.uint64)
    sites = np.arange(n_sites, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = (seeds[:, None, None] * np.uint64(0x9E3779B97F4A7C15) + np.uint64(step) * np.uint64(0xD1B54A32D192ED03)
             + passes[None, :, None] * np.uint64(0x8CB92BA72F3D8DD7) + sites[None, None, :] * np.uint64(0xABC98388FB8FAC03)
             + np.uint64(STREAM_DROPOUT) * np.uint64(0x9FB21C651E98DF25))
    return (_splitmix(z & _M64) & np.uint64(MASK32)).astype(np.int64)


def threshold(rate: float) -> int:
    """The smallest kept hash value: ``⌊rate·2³²⌋`` (exact: a power-of-two product)."""
    return int(math.floor(rate * 2.0**32))


_POSITIONS: dict[tuple[int, str], torch.Tensor] = {}


def _positions(numel: int, device: torch.device) -> torch.Tensor:
    """``h(i)`` for ``i < numel`` (cached: masks of one size share it)."""
    if numel >= 2**32:
        raise ValueError(f"a keyed dropout mask of {numel} elements is too large (at most 2^32)")
    key = (numel, str(device))
    if key not in _POSITIONS:
        if len(_POSITIONS) > 64:
            _POSITIONS.clear()
        _POSITIONS[key] = _mix32(torch.arange(numel, dtype=torch.int64, device=device))
    return _POSITIONS[key]


@dataclass
class Draws:
    """The masks of one forward pass: ``keys [n_sites]`` int64, ``threshold`` int64 and
    ``scale`` (``1/(1 − p)``, float64) 0-d tensors — per member under ``vmap``; ``off``:
    every rate is 0 (the sites pass their input through: the same as a mask of ones)."""

    keys: torch.Tensor
    threshold: torch.Tensor
    scale: torch.Tensor
    off: bool = False
    calls: dict[int, int] = field(default_factory=dict)  # per site, its calls so far in this pass


_CURRENT: list[Draws] = []


@contextlib.contextmanager
def draws(d: Draws):
    """The masks the ``KeyedDropout`` sites use while open."""
    _CURRENT.append(d)
    try:
        yield
    finally:
        _CURRENT.pop()


def mask_scale(site: int, shape: torch.Size, dtype: torch.dtype, device: torch.device) -> torch.Tensor | None:
    """``scale`` where kept, 0 where dropped, for a tensor of ``shape`` at ``site`` of the
    open ``draws`` (``None``: every rate is 0)."""
    if not _CURRENT:
        raise RuntimeError("a keyed dropout site ran in training without draws (training.keyed.draws)")
    d = _CURRENT[-1]
    if d.off:
        return None
    # a site called again in one pass (a block's dropout after attention and after the MLP)
    # draws anew: its k-th call's key is the site's key + k·golden ratio (mod 2³²)
    call = d.calls.get(site, 0)
    d.calls[site] = call + 1
    key = d.keys[site] if call == 0 else (d.keys[site] + call * _GOLDEN) & MASK32
    h = _mix32(_positions(math.prod(shape), device) ^ key).view(shape)
    return torch.where(h >= d.threshold, d.scale.to(dtype), torch.zeros((), dtype=dtype, device=device))


class KeyedDropout(nn.Module):
    """``nn.Dropout`` with a keyed mask (module docstring); the rate is the open draws'."""

    def __init__(self, site: int):
        super().__init__()
        self.site = site

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return x
        scale = mask_scale(self.site, x.shape, x.dtype, x.device)
        return x if scale is None else x * scale


def _keyed_attention_class():
    from ..models.transformer import SelfAttention

    class KeyedSelfAttention(SelfAttention):
        """``SelfAttention`` whose training forward is the math attention with a keyed mask on
        the attention probabilities (``prob_site``); as the original outside training."""

        prob_site = 0

        def forward(self, x: torch.Tensor, attend: torch.Tensor) -> torch.Tensor:
            if not self.training:
                return super().forward(x, attend)
            n, T, d = x.shape
            q, k, v = self.qkv(x).view(n, T, 3, self.n_heads, self.d_head).permute(2, 0, 3, 1, 4)
            scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.d_head))
            probs = torch.softmax(scores.masked_fill(~attend, float("-inf")), dim=-1)
            scale = mask_scale(self.prob_site, probs.shape, probs.dtype, probs.device)
            y = (probs if scale is None else probs * scale) @ v
            return self.out(y.transpose(1, 2).reshape(n, T, d))

    return KeyedSelfAttention


def install(model: nn.Module, rate: float | None) -> int:
    """Make ``model``'s dropout keyed (module docstring); returns its number of sites.
    ``rate``: the run's ``model.dropout``, which every site must have (the masks take the
    rate of the open draws; ``None``: not checked, an ensemble's template). ``UserError``
    for a model whose dropout cannot be keyed."""
    from ..models.transformer import SelfAttention

    lstm = getattr(model, "lstm", None)
    if isinstance(lstm, nn.LSTM) and lstm.num_layers > 1 and lstm.dropout > 0:
        raise UserError("dropout_draws = keyed: a multi-layer LSTM's fused kernel draws its between-layer dropout "
                        "itself; use model.dropout = 0 or dropout_draws = global")
    if hasattr(model, "keyed_sites"):
        return model.keyed_sites
    keyed_attention = _keyed_attention_class()
    site = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Dropout):
                if rate is not None and child.p != rate:
                    raise ValueError(f"dropout site {name} has rate {child.p}, not the run's {rate}")
                setattr(parent, name, KeyedDropout(site).train(child.training))
                site += 1
    for module in model.modules():
        if isinstance(module, SelfAttention):
            if rate is not None and module.attn_dropout != rate:
                raise ValueError(f"attention dropout {module.attn_dropout} is not the run's {rate}")
            module.__class__ = keyed_attention  # the same parameters and state; another forward
            module.prob_site = site
            site += 1
    model.keyed_sites = site
    return site


def one_model(seed: int, step: int, pass_: int, rate: float, n_sites: int, device: torch.device) -> Draws:
    """The draws of one model's forward pass ``pass_`` at ``step``."""
    keys = torch.from_numpy(site_keys([seed], step, n_sites)[0, pass_]).to(device)
    return Draws(keys, torch.tensor(threshold(rate), device=device),
                 torch.tensor(1.0 / (1.0 - rate), dtype=torch.float64, device=device), off=rate == 0)


def stacked(seeds, step: int, rates, n_sites: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    """``(keys [S, N_PASSES, n_sites], thresholds [S], scales [S])`` of S members at ``step``
    (a ``Draws`` per member and pass is built from their rows inside ``vmap``)."""
    keys = torch.from_numpy(site_keys(seeds, step, n_sites)).to(device)
    thresholds = torch.tensor([threshold(r) for r in rates], dtype=torch.int64, device=device)
    scales = torch.tensor([1.0 / (1.0 - r) for r in rates], dtype=torch.float64, device=device)
    return keys, thresholds, scales

