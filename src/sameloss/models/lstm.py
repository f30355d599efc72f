"""A bidirectional LSTM masked language model (the paper's HMM experiments, App. A.4).

    e      = E[x]                                    tok_emb      [n, T, d_model]
    h      = BiLSTM(e)                               lstm         [n, T, 2·d_hidden]
    logits = E · (P h + p) + b                       proj, bias   [n, T, V]

The paper uses "the implementation of PyTorch" with d_hidden in {128, 256, 512, 768, 1024}
and {4, 6, 8, 12, 16} layers; ``nn.LSTM(bidirectional=True)`` is that. A masked LM must
see both sides of a position, hence bidirectional: d_hidden is the size *per direction*.

Output layer. ``proj`` maps the ``2·d_hidden`` LSTM output to ``d_model``, the width of
the token embedding, so the decoder can always be tied to the embedding as in the
transformer (``tie_weights=True``, default). With ``tie_weights=False`` there is a separate
``decoder = nn.Linear(d_model, V)`` instead of ``bias``.

Features. ``features`` returns the top LSTM layer's output (both directions
concatenated, ``[n, T, 2·d_hidden]``, see ``d_features``): that is the model's final
hidden state; ``proj`` is a linear map of it and belongs to the MLM head.

Padding. Sentences are right-padded with ``pad_id`` (``sameloss.languages.base``). A plain
bidirectional LSTM would read the pads into the backward direction's state; packing the
batch (``pack_padded_sequence`` with each sentence's length) starts the backward pass at
the last real token, so non-pad outputs do not depend on the padding. Pad positions get
zero features. (On CUDA, cuDNN's packed LSTM has no double backward; Hessian-vector
products of an LSTM need the CPU or ``torch.backends.cudnn.flags(enabled=False)``.)

Unrolled mode (``with model.unrolled():``). Packed sequences and the fused LSTM kernels
support neither ``torch.func.vmap`` nor forward-mode AD, so per-sample gradients and
Hessian-vector products of ``nn.LSTM`` would need a Python loop over sentences. Inside
``unrolled()`` the same parameters run through an LSTM written in plain tensor
operations (a loop over the T time steps, batched over sentences; the backward
direction reads each sentence reversed within its own length by a gather), which every
``torch.func`` transform supports; outputs equal the packed kernel's to float rounding
(tested in float64). The curvature measures switch to it (``measures.curvature.base.
measuring``); training keeps the fused kernel.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from sameloss.errors import UserError
from sameloss.models.dropout import Dropout

MODEL_KIND = "lstm"  # model.kind=lstm (``KIND``, at the end; read from this file by sameloss.registry)


@dataclass(frozen=True)
class LSTMConfig:
    """Shape and regularisation of an ``LSTMMLM``.

    d_model: token-embedding width (also the decoder's input width).
    d_hidden: LSTM state size per direction. n_layers: stacked bidirectional layers.
    dropout: on the embeddings, between LSTM layers and on the LSTM output.
    max_len: longest input accepted (the LSTM itself has no limit; kept so every model
        config describes the data it was built for).
    tie_weights: decoder weight = token embedding (plus an output bias).
    init_std: std of the normal initialisation of the embedding, ``proj`` and decoder;
        the LSTM keeps PyTorch's uniform(±1/√d_hidden) initialisation.
    """

    vocab_size: int
    max_len: int
    d_model: int
    d_hidden: int
    n_layers: int
    pad_id: int
    dropout: float = 0.1
    tie_weights: bool = True
    init_std: float = 0.02

    def __post_init__(self) -> None:
        for name in ("vocab_size", "max_len", "d_model", "d_hidden", "n_layers"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise UserError(f"lstm {name} must be a positive integer, got {value!r}")
        if not 0 <= self.pad_id < self.vocab_size:
            raise UserError(f"pad_id {self.pad_id} is outside the vocabulary [0, {self.vocab_size})")
        if not 0.0 <= self.dropout < 1.0:
            raise UserError(f"lstm dropout must be in [0, 1), got {self.dropout}")


class LSTMMLM(nn.Module):
    """Bidirectional LSTM MLM with the transformer's interface: ``forward(tokens)`` gives
    logits ``[n, T, vocab_size]``, ``features(tokens)`` ``[n, T, 2·d_hidden]``."""

    def __init__(self, config: LSTMConfig):
        super().__init__()
        self.config = cfg = config
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.lstm = nn.LSTM(
            cfg.d_model,
            cfg.d_hidden,
            num_layers=cfg.n_layers,
            batch_first=True,
            bidirectional=True,
            dropout=cfg.dropout if cfg.n_layers > 1 else 0.0,
        )
        self.drop = Dropout(cfg.dropout)
        self._unrolled = False
        self.proj = nn.Linear(2 * cfg.d_hidden, cfg.d_model)
        if cfg.tie_weights:
            self.bias = nn.Parameter(torch.zeros(cfg.vocab_size))
        else:
            self.decoder = nn.Linear(cfg.d_model, cfg.vocab_size)
        self.reset_parameters()

    @property
    def d_features(self) -> int:
        """Width of ``features``' last axis."""
        return 2 * self.config.d_hidden

    @property
    def output_weight(self) -> nn.Parameter:
        """The decoder's weight (the token embedding when tied)."""
        return self.tok_emb.weight if self.config.tie_weights else self.decoder.weight

    def reset_parameters(self) -> None:
        std = self.config.init_std
        nn.init.normal_(self.tok_emb.weight, std=std)
        nn.init.normal_(self.proj.weight, std=std)
        nn.init.zeros_(self.proj.bias)
        self.lstm.reset_parameters()
        if self.config.tie_weights:
            nn.init.zeros_(self.bias)
        else:
            nn.init.normal_(self.decoder.weight, std=std)
            nn.init.zeros_(self.decoder.bias)

    def features(self, tokens: torch.Tensor) -> torch.Tensor:
        """Top-layer LSTM outputs ``[n, T, 2·d_hidden]``; zero at pad positions."""
        n, T = tokens.shape
        if T > self.config.max_len:
            raise ValueError(f"sequence length {T} exceeds max_len {self.config.max_len}")
        # right padding: a sentence's length is its number of non-pad tokens
        lengths = (tokens != self.config.pad_id).sum(dim=1).clamp(min=1)
        x = self.drop(self.tok_emb(tokens))
        if self._unrolled:
            return self._lstm_unrolled(x, lengths)
        lengths = lengths.cpu()
        packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        out, _ = self.lstm(packed)
        h, _ = pad_packed_sequence(out, batch_first=True, total_length=T)
        return h

    @contextlib.contextmanager
    def unrolled(self) -> Iterator[None]:
        """While active, the LSTM runs as plain tensor operations (see the module
        docstring): slower than the fused kernel, but ``torch.func`` can vmap it."""
        before = self._unrolled
        self._unrolled = True
        try:
            yield
        finally:
            self._unrolled = before

    def _lstm_unrolled(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """``nn.LSTM`` on right-padded ``x [n, T, d]`` with sentence ``lengths [n]``, as the
        packed kernel computes it: zero output at pads, the backward direction starting at
        each sentence's last token."""
        lstm = self.lstm
        n, T, _ = x.shape
        t = torch.arange(T, device=x.device)
        valid = t < lengths[:, None]  # [n, T]
        # reverses each sentence within its length and leaves pads in place: an involution
        rev = torch.where(valid, lengths[:, None] - 1 - t, t.expand(n, T))
        h_in = x
        for layer in range(lstm.num_layers):
            if layer > 0 and self.training and lstm.dropout > 0:
                h_in = F.dropout(h_in, lstm.dropout)
            outs = []
            for suffix in ("", "_reverse"):
                w_ih = getattr(lstm, f"weight_ih_l{layer}{suffix}")
                w_hh = getattr(lstm, f"weight_hh_l{layer}{suffix}")
                bias = getattr(lstm, f"bias_ih_l{layer}{suffix}") + getattr(lstm, f"bias_hh_l{layer}{suffix}")
                seq = h_in if not suffix else _gather_time(h_in, rev)
                pre = seq @ w_ih.T + bias  # [n, T, 4H], gates i, f, g, o
                h = seq.new_zeros(n, lstm.hidden_size)
                c = seq.new_zeros(n, lstm.hidden_size)
                states = []
                for s in range(T):
                    i, f, g, o = (pre[:, s] + h @ w_hh.T).chunk(4, dim=-1)
                    c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
                    h = torch.sigmoid(o) * torch.tanh(c)
                    states.append(h)
                out = torch.stack(states, dim=1)
                outs.append(out if not suffix else _gather_time(out, rev))
            h_in = torch.cat(outs, dim=-1) * valid[..., None].to(x.dtype)
        return h_in

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """MLM logits ``[n, T, vocab_size]``."""
        z = self.proj(self.drop(self.features(tokens)))
        if self.config.tie_weights:
            return F.linear(z, self.tok_emb.weight, self.bias)
        return self.decoder(z)

    def num_parameters(self, embeddings: bool = True) -> int:
        """Number of parameters (the tied embedding counted once); ``embeddings=False``
        leaves out the token embedding."""
        total = sum(p.numel() for p in self.parameters())
        return total if embeddings else total - self.tok_emb.weight.numel()


def _gather_time(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``x[i, index[i, t]]`` for ``x [n, T, d]`` and ``index [n, T]``."""
    return torch.gather(x, 1, index[..., None].expand(-1, -1, x.shape[-1]))


# ---- the kind ------------------------------------------------------------------------------
def flops_per_token(m) -> float:
    """FLOPs of one forward pass per token: 2·(4·h·(d+h)) per direction of the first layer,
    2·(4·h·2h) of each further one (its input is both directions), the projection to
    d_model when it differs from h, and the tied decoder 2·V·d. Not checked against
    torch's counter (it does not count the fused LSTM kernel)."""
    d, h = m.d_model, m.d_hidden
    layers = 2 * 4 * h * (d + h) + 2 * 4 * h * (h + h) * (m.n_layers - 1)
    return layers + 2 * (h * d if h != d else 0) + 2 * m.vocab * d


def activations_per_token(config: LSTMConfig, max_len: int) -> int:
    """What the backward pass keeps per token (a lower bound): four gates and two states
    per direction and layer, and the embeddings."""
    return config.n_layers * 2 * 6 * config.d_hidden + 2 * config.d_model


def _kind():
    from .kind import ModelKind
    from .sizes import LSTM_ALIASES, LSTM_SIZES

    return ModelKind("lstm", LSTMConfig, LSTMMLM, LSTM_SIZES, LSTM_ALIASES, flops_per_token, activations_per_token)


KIND = _kind()
