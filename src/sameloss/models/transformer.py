"""A BERT-style masked-language-model encoder, in one file you can read top to bottom.

The paper (App. A.4, B.4) trains BERT encoders with the implementation of Izsak et al.
(2021): token + learned position embeddings, blocks of multi-head self-attention and a
GELU MLP with residual connections and LayerNorm, and an output layer tied to the input
embedding. This module is that model and nothing else.

Layout (``norm="post"``, the default, exactly BERT / the formulas of App. B.4)::

    h0 = LN_emb(E[x] + P[:T])                 emb_norm
    v  = LN(h + Attn(h))                      blocks.l.attn,  blocks.l.attn_norm
    h' = LN(v + W_down GELU(W_up v + b))      blocks.l.mlp,   blocks.l.mlp_norm
    logits = E · LN(GELU(D h_L)) + b          head.dense, head.norm, head.bias (tied E)

``norm="pre"`` moves each block's LayerNorm in front of its sub-layer
(``h' = h + Attn(LN(h))``), drops the embedding LayerNorm and adds one ``final_norm``
after the last block, as GPT-2 does: in a pre-LN stack the residual stream is never
normalised, so the final LayerNorm is what puts the features (and the MLM head's input)
on a fixed scale; an embedding LayerNorm would only rescale the stream's first term.

Parameter names are explicit and stable because ``sameloss.models.embed`` builds a
larger model from a smaller one by replicating weights (App. B.4):

* ``tok_emb.weight`` ``[V, d]`` — the input embedding *and* the output weight (tied);
* ``pos_emb.weight`` ``[max_len, d]``; ``emb_norm`` (post-LN only);
* ``blocks.{l}.attn.qkv`` — one ``nn.Linear(d, 3d)``: output rows ``[0, d)`` are the
  queries, ``[d, 2d)`` the keys, ``[2d, 3d)`` the values, and inside each, head ``k`` owns
  rows ``[k·d_head, (k+1)·d_head)``. One fused matrix multiply is faster than three;
  ``qkv_weights`` splits it back into Q, K, V views;
* ``blocks.{l}.attn.out`` (O), ``blocks.{l}.mlp.up`` (``d → d_inter``),
  ``blocks.{l}.mlp.down`` (``d_inter → d``), ``blocks.{l}.attn_norm``, ``blocks.{l}.mlp_norm``;
* ``final_norm`` (pre-LN only); ``head.dense``, ``head.norm`` (if
  ``mlm_head_transform``) and ``head.bias`` ``[V]``.

There is no token-type (segment) embedding: the languages here have one segment. Pads
(``pad_id``, on the right, see ``sameloss.languages.base``) are never attended to, so
non-pad outputs do not depend on pad positions or on how much padding a batch has.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from sameloss.errors import UserError
from sameloss.models.dropout import Dropout, dropout_mask

MODEL_KIND = "transformer"  # model.kind=transformer (``KIND``, at the end; read from this file by sameloss.registry)


@dataclass(frozen=True)
class TransformerConfig:
    """Shape and regularisation of a ``TransformerMLM``.

    vocab_size: words + special tokens. max_len: longest input (position embeddings).
    d_model, n_heads, n_layers, d_inter: the columns of the paper's Tables 3 and 4.
    pad_id: the padding token; keys holding it are masked out of attention.
    dropout: on the embeddings and on each sub-layer's output before the residual add
        (BERT's ``hidden_dropout_prob``); attn_dropout: on the attention probabilities.
    norm: ``"post"`` (BERT, App. B.4) or ``"pre"`` (LayerNorm before each sub-layer).
    mlm_head_transform: BERT's ``dense → GELU → LayerNorm`` before the tied decoder.
        App. B.4 writes the output as ``W_Eᵀ h_L`` (no transform); Izsak et al.'s code
        and BERT have it. The B.4 width replication extends to it (dense like any square
        weight, LayerNorm repeated), so it is on by default.
    layer_norm_eps: 1e-12 as BERT; small enough that replicating features (which
        leaves mean and variance unchanged) keeps LayerNorm outputs equal.
    init_std: std of the normal initialisation of every weight matrix and embedding.
    """

    vocab_size: int
    max_len: int
    d_model: int
    n_heads: int
    n_layers: int
    d_inter: int
    pad_id: int
    dropout: float = 0.1
    attn_dropout: float = 0.1
    norm: str = "post"
    mlm_head_transform: bool = True
    layer_norm_eps: float = 1e-12
    init_std: float = 0.02

    def __post_init__(self) -> None:
        for name in ("vocab_size", "max_len", "d_model", "n_heads", "n_layers", "d_inter"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise UserError(f"transformer {name} must be a positive integer, got {value!r}")
        if self.d_model % self.n_heads:
            raise UserError(
                f"transformer d_model ({self.d_model}) must be a multiple of n_heads ({self.n_heads})"
            )
        if not 0 <= self.pad_id < self.vocab_size:
            raise UserError(f"pad_id {self.pad_id} is outside the vocabulary [0, {self.vocab_size})")
        for name in ("dropout", "attn_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise UserError(f"transformer {name} must be in [0, 1), got {getattr(self, name)}")
        if self.norm not in ("post", "pre"):
            raise UserError(f"transformer norm must be 'post' or 'pre', got {self.norm!r}")

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads


class SelfAttention(nn.Module):
    """Multi-head self-attention with a key-padding mask (PyTorch's fused SDPA kernel)."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.n_heads, self.d_head = cfg.n_heads, cfg.d_head
        self.attn_dropout = cfg.attn_dropout
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.out = nn.Linear(cfg.d_model, cfg.d_model)

    def forward(self, x: torch.Tensor, attend: torch.Tensor) -> torch.Tensor:
        """x: ``[n, T, d]``; attend: ``[n, 1, 1, T]`` bool, True for keys that may be seen."""
        n, T, d = x.shape
        # [n, T, 3, heads, d_head] -> three [n, heads, T, d_head]
        q, k, v = self.qkv(x).view(n, T, 3, self.n_heads, self.d_head).permute(2, 0, 3, 1, 4)
        p = self.attn_dropout if self.training else 0.0
        if p > 0 and x.device.type == "cpu":  # SDPA's own dropout draws its mask with bernoulli_
            y = _attention_with_dropout(q, k, v, attend, p)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=attend, dropout_p=p)
        return self.out(y.transpose(1, 2).reshape(n, T, d))


def _attention_with_dropout(q, k, v, attend, p: float) -> torch.Tensor:
    """SDPA's math path, ``softmax(q kᵀ/√d, keys masked) · v``, with the attention
    probabilities dropped by ``dropout.dropout_mask`` (the CPU's cheap mask) instead of
    ``bernoulli_``."""
    scores = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5
    probs = torch.softmax(scores.masked_fill(~attend, float("-inf")), dim=-1)
    keep, scale = dropout_mask(probs.shape, p)
    return (probs * (keep.to(probs.dtype) * scale)) @ v


class MLP(nn.Module):
    """Position-wise ``down(GELU(up(x)))``; exact (erf) GELU as BERT."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.up = nn.Linear(cfg.d_model, cfg.d_inter)
        self.down = nn.Linear(cfg.d_inter, cfg.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.up(x)))


class Block(nn.Module):
    """Attention then MLP, each with a residual connection, dropout and a LayerNorm
    placed after the residual add (post-LN) or before the sub-layer (pre-LN)."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.pre_norm = cfg.norm == "pre"
        self.attn = SelfAttention(cfg)
        self.attn_norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.mlp = MLP(cfg)
        self.mlp_norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.drop = Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, attend: torch.Tensor) -> torch.Tensor:
        if self.pre_norm:
            x = x + self.drop(self.attn(self.attn_norm(x), attend))
            return x + self.drop(self.mlp(self.mlp_norm(x)))
        x = self.attn_norm(x + self.drop(self.attn(x, attend)))
        return self.mlp_norm(x + self.drop(self.mlp(x)))


class MLMHead(nn.Module):
    """Optional BERT transform, then the decoder whose weight is the token embedding
    (passed in, not owned, so there is exactly one ``[V, d]`` parameter) plus a bias."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.transform = cfg.mlm_head_transform
        if self.transform:
            self.dense = nn.Linear(cfg.d_model, cfg.d_model)
            self.norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.bias = nn.Parameter(torch.zeros(cfg.vocab_size))

    def forward(self, h: torch.Tensor, embedding: torch.Tensor) -> torch.Tensor:
        if self.transform:
            h = self.norm(F.gelu(self.dense(h)))
        return F.linear(h, embedding, self.bias)


class TransformerMLM(nn.Module):
    """BERT-style MLM encoder: ``forward(tokens)`` gives logits ``[n, T, vocab_size]``,
    ``features(tokens)`` the final hidden states ``[n, T, d_model]`` (a probe's input)."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.config = cfg = config
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.max_len, cfg.d_model)
        if cfg.norm == "post":
            self.emb_norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.drop = Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        if cfg.norm == "pre":
            self.final_norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.head = MLMHead(cfg)
        self.reset_parameters()

    @property
    def d_features(self) -> int:
        """Width of ``features``' last axis."""
        return self.config.d_model

    @property
    def output_weight(self) -> nn.Parameter:
        """The decoder's weight: the token embedding itself (tied)."""
        return self.tok_emb.weight

    def reset_parameters(self) -> None:
        """BERT initialisation: weights and embeddings N(0, init_std), biases 0,
        LayerNorm gains 1. (The pad row is initialised like any other; it never reaches
        a non-pad position.)"""
        std = self.config.init_std
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=std)
            if isinstance(module, nn.Linear):
                nn.init.zeros_(module.bias)
            elif isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
        nn.init.zeros_(self.head.bias)

    def attention_mask(self, tokens: torch.Tensor) -> torch.Tensor:
        """``[n, 1, 1, T]`` bool: True where the key is not padding. A row that is all
        padding may attend everywhere (its outputs are meaningless anyway), which keeps
        the softmax free of NaN."""
        real = tokens != self.config.pad_id
        real = real | ~real.any(dim=1, keepdim=True)
        return real[:, None, None, :]

    def features(self, tokens: torch.Tensor) -> torch.Tensor:
        """Final hidden states ``[n, T, d_model]`` for token ids ``[n, T]``."""
        T = tokens.shape[1]
        if T > self.config.max_len:
            raise ValueError(f"sequence length {T} exceeds max_len {self.config.max_len}")
        x = self.tok_emb(tokens) + self.pos_emb.weight[:T]
        if self.config.norm == "post":
            x = self.emb_norm(x)
        x = self.drop(x)
        attend = self.attention_mask(tokens)
        for block in self.blocks:
            x = block(x, attend)
        if self.config.norm == "pre":
            x = self.final_norm(x)
        return x

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """MLM logits ``[n, T, vocab_size]``."""
        return self.head(self.features(tokens), self.tok_emb.weight)

    def qkv_weights(self, layer: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Views ``(W_Q, W_K, W_V)``, each ``[d_model, d_model]`` (rows = outputs), of
        block ``layer``'s fused ``qkv.weight``; writing into them writes the model."""
        return self.blocks[layer].attn.qkv.weight.chunk(3, dim=0)

    def num_parameters(self, embeddings: bool = True) -> int:
        """Number of parameters, counting the tied embedding once; ``embeddings=False``
        leaves out the token and position embeddings."""
        total = sum(p.numel() for p in self.parameters())
        if not embeddings:
            total -= self.tok_emb.weight.numel() + self.pos_emb.weight.numel()
        return total


# ---- the kind ------------------------------------------------------------------------------
def flops_per_token(m) -> float:
    """FLOPs of one forward pass per token of a full-length padded sentence (every position
    goes through the blocks and the tied decoder): per layer 2·(4d² + 2·d·d_inter) for the
    Q/K/V/output and MLP matmuls plus 4·T·d for the attention scores and their weighted
    sum; the MLM head 2·(d² + V·d) (dense transform and tied decoder). Element-wise work
    (LayerNorm, GELU, softmax) is not counted. Checked against ``torch.utils.flop_counter``
    (``tests/experiments/test_plan.py``, within a few %)."""
    d, T = m.d_model, m.max_len
    per_layer = 2 * (4 * d * d + 2 * d * m.d_inter) + 4 * T * d
    head = 2 * (d * d if m.mlm_head_transform else 0) + 2 * m.vocab * d
    return m.n_layers * per_layer + head


def activations_per_token(config: TransformerConfig, max_len: int) -> int:
    """What the backward pass keeps per token (a lower bound): per block the inputs of its
    linear maps and norms, the MLP's hidden layer and the attention weights of each head."""
    return config.n_layers * (8 * config.d_model + 2 * config.d_inter + 2 * config.n_heads * max_len)


def _kind():
    from .kind import ModelKind
    from .sizes import TRANSFORMER_ALIASES, TRANSFORMER_SIZES

    # the paper's "dropout 0.1" is BERT's: hidden and attention-probability dropout
    return ModelKind("transformer", TransformerConfig, TransformerMLM, TRANSFORMER_SIZES, TRANSFORMER_ALIASES,
                     flops_per_token, activations_per_token, dropout_fields=("dropout", "attn_dropout"),
                     settings=("norm",))


KIND = _kind()
