"""Embed a small ``TransformerMLM`` function-preservingly into a wider and deeper one (App. B.4).

The paper compares the trace of Hessian of models of different sizes as parameter
configurations of one large architecture (Figure 5): a small transformer becomes a large
one by replicating its weights (width) and adding blocks that act as the identity
(depth). This module builds that large model. Notation: ``d``, ``n``, ``d_head = d/n``,
``d_i`` and ``L`` are the small model's width, heads, head width, MLP width and depth;
the large one has ``D = k·d``, ``k·n`` heads (so ``d_head`` is unchanged), ``d_i' ≥ d_i``
and ``L + L'`` blocks. ``R(v) = [v; v; …; v]`` (k copies) and ``J = ones(k, k)``.

Width (exact for post-LN and pre-LN, up to floating-point rounding)
    Every hidden state of the large model is ``R(h)`` of the small one's:

    * token and position embeddings ``Ẽ = [E, E, …, E]`` (feature axis tiled, NOT scaled),
      so ``Ẽ[x] + P̃ = R(E[x] + P)``;
    * a hidden → hidden weight ``W̃ = (J/k) ⊗ W`` (each ``d × d`` block is ``W/k``): it maps
      ``R(h)`` to ``R(Wh)``; its bias is ``R(b)``. This covers Q, K, V (the fused ``qkv``
      gets it per row block, so large head ``j`` is a copy of small head ``j mod n``), the
      attention output ``O``, and ``head.dense``;
    * MLP: intermediate unit ``u`` of the large model copies small unit ``s(u) = u mod d_i``
      (round robin; ``d_i' = m·d_i`` is plain m-fold replication). ``up``: row ``u`` is
      ``[W_up[s(u)]/k, …, W_up[s(u)]/k]``, bias ``b_up[s(u)]``; ``down``: column ``u`` is
      ``R(W_down[:, s(u)]) / c(s(u))`` with ``c(j)`` the number of copies of unit j, bias
      ``R(b_down)``. GELU acts unit-wise, so the MLP maps ``R(v)`` to ``R(MLP(v))``;
    * LayerNorm gains and biases ``R(γ)``, ``R(β)``: a replicated vector has the same mean
      and variance, so ``LN(R(z)) = R(LN(z))`` exactly (same ε);
    * attention: the scores of each large head are those of the small head it copies
      (same ``d_head``, same ``1/√d_head``), its output is that head's output, so the
      concatenation is ``R(y)``;
    * the tied decoder: ``Ẽ · R(g) = k · E g``, so the LayerNorm that produces the
      decoder's input — ``head.norm`` with the MLM head transform, otherwise the model's
      last LayerNorm — gets ``R(γ)/k`` and ``R(β)/k``; its output is ``R(g)/k`` and the
      logits ``Ẽ R(g)/k + b = E g + b`` are unchanged. The output bias is copied.

    So ``features`` of the large model are ``R(features)`` (``R(features)/k`` without
    the head transform) and the logits are equal. The paper's choice ``Ẽ = ½[E, E]`` (the
    embedding scaled by 1/k, undone by the embedding LayerNorm) is exact only in the limit
    ε → 0 and only for post-LN: in a pre-LN stack the scaled embedding would shrink the
    residual stream against the unscaled sub-layer outputs.

Depth (``L'`` blocks appended after the last small block)
    * pre-LN: every weight and bias of an added block is zero, LayerNorms (1, 0): both
      sub-layers output exactly 0, ``x + 0 = x``. Exact, also in floating point.
    * post-LN: a block computes ``LN_m(v + MLP(v))`` with ``v = LN_a(x + Attn(x))``, so with
      zero sub-layers it is ``LN_m(LN_a(x))``, which is not the identity on ``x = γ⊙n + β``
      (the output of the LayerNorm before it) unless γ is constant and β is constant:
      the variance of ``γ⊙n + β`` depends on n. Zeroing the LayerNorm gains, as the
      released script does, kills the signal. The exact construction moves the last
      LayerNorm's affine part past the added blocks: block L's ``mlp_norm`` becomes
      (1, 0), so it outputs the normalised ``n``; the added blocks have zero sub-layers
      and LayerNorms (1, 0) except the last added ``mlp_norm``, which takes (γ, β). Since
      a LayerNorm maps a normalised vector to itself, the output is ``γ⊙n + β`` as before
      — up to ε: ``n = (z - μ)/sqrt(σ² + ε)`` has variance ``σ²/(σ² + ε)``, so
      ``LN(n) = n / sqrt(σ²/(σ²+ε) + ε)``, a relative change of about ``ε(1/σ² - 1)/2``
      (σ² the variance of the LayerNorm's input z; ≈ 1e-12 for ε = 1e-12 and σ² near 1,
      seen as ~1e-12 differences in float64). Exact as ε → 0.

The trace of Hessian is not preserved by this (or by the paper's) construction in
general; see ``tests/models/test_embed.py`` for what does hold: for the Gauss–Newton /
Fisher part, each large parameter that is one of ``m`` copies of a small parameter scaled
by ``α`` has gradient ``g/(α m)``, so a group's trace changes by ``1/(α² m)`` — 1 for the
hidden → hidden weights (``k/c`` and ``c/k`` for ``up``/``down`` when ``d_i' = c·d_i``),
``1/k`` for biases, LayerNorm parameters and embeddings, ``k`` for ``head.norm`` and 1
for the output bias. The total therefore goes down (near a minimiser, where the Hessian
is the Gauss–Newton matrix, by 0.69 (post-LN) and 0.83 (pre-LN) for k = 2 on a tiny model).
Added blocks contribute their residual-stream biases (and, post-LN, their LayerNorms).

Optimiser state (``embed_map``, ``embed_gradient``, ``embed_second_moment``)
    Each large parameter entry copies one small entry ``j`` scaled by ``α`` (or is a
    constant of an added block): ``θ̃ = E θ + c`` with ``E`` one ``α`` per row. At the
    embedded point the copies share the small gradient: ``g̃ = E (g / d)`` with
    ``d_j = Σ α²`` over the copies of ``j`` (``E^T E = diag(d)``, and ``E^T g̃ = g``: the
    chain rule through the embedding; tested against the large model's own gradient). So
    the moments that are averages of gradients (Adam's ``exp_avg``, SGD's momentum) map
    like ``g``, those of squared gradients (``exp_avg_sq``) like ``g²``: the large model
    continues with the moments of the gradients it would have seen along the small
    model's trajectory, and Adam's per-entry update ``m/√v`` of a copy equals the small
    entry's. An added block's entries have no source: zero moments.

``embed_checkpoint`` writes the embedded model of a saved small model as a checkpoint
(``sameloss.training.checkpoint`` format) whose config describes the large model.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

from sameloss.errors import UserError
from sameloss.models.transformer import TransformerConfig, TransformerMLM

__all__ = [
    "EmbedMap",
    "EmbedPlan",
    "embed",
    "embed_gradient",
    "embed_map",
    "embed_second_moment",
    "embedded_config",
    "embedded_param_count",
    "check_embeddable",
    "plan_embedding",
    "target_plan",
]


@dataclasses.dataclass(frozen=True)
class EmbedPlan:
    """How a small shape maps into a large one: width factor k, added blocks, MLP width
    and head count of the large model."""

    width_factor: int
    extra_layers: int
    d_inter: int
    n_heads: int


def _positive_int(value: Any, name: str, minimum: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise UserError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def check_embeddable(small: Any) -> TransformerConfig:
    if not isinstance(small, TransformerMLM):
        kind = type(small).__name__
        raise UserError(f"only transformers can be embedded (App. B.4), got a {kind}")
    return small.config


def plan_embedding(
    small: TransformerConfig,
    width_factor: int = 1,
    extra_layers: int = 0,
    n_heads: int | None = None,
    d_inter: int | None = None,
) -> EmbedPlan:
    """Check and complete a width/depth request for a small config (``UserError`` if the
    large shape cannot hold the small model)."""
    k = _positive_int(width_factor, "width factor", 1)
    extra = _positive_int(extra_layers, "extra layers", 0)
    heads = k * small.n_heads if n_heads is None else _positive_int(n_heads, "n_heads", 1)
    if heads != k * small.n_heads:
        raise UserError(
            f"a {k}x wider model must have {k * small.n_heads} heads (each head copied {k} times, "
            f"head width {small.d_head} kept so attention scores are unchanged), got {heads}"
        )
    inter = k * small.d_inter if d_inter is None else _positive_int(d_inter, "d_inter", 1)
    if inter < small.d_inter:
        raise UserError(
            f"the large MLP width d_inter ({inter}) is smaller than the small model's ({small.d_inter})"
        )
    return EmbedPlan(width_factor=k, extra_layers=extra, d_inter=inter, n_heads=heads)


def embedded_config(small: TransformerConfig, plan: EmbedPlan) -> TransformerConfig:
    """The large model's config: the small one's with the shape of ``plan``."""
    return dataclasses.replace(
        small,
        d_model=plan.width_factor * small.d_model,
        n_heads=plan.n_heads,
        n_layers=small.n_layers + plan.extra_layers,
        d_inter=plan.d_inter,
    )


def embedded_param_count(small: TransformerConfig, plan: EmbedPlan) -> int:
    """Number of parameters of the large model (tied embedding counted once), without
    building it."""
    big = embedded_config(small, plan)
    D, V, T, I = big.d_model, big.vocab_size, big.max_len, big.d_inter
    ln = 2 * D
    block = (3 * D * D + 3 * D) + (D * D + D) + (D * I + I) + (I * D + D) + 2 * ln
    head = V + ((D * D + D) + ln if big.mlm_head_transform else 0)
    return V * D + T * D + ln + big.n_layers * block + head  # one LN: emb_norm or final_norm


def _tile_cols(w: torch.Tensor, k: int) -> torch.Tensor:
    """``[E, E, …, E]`` along the last axis."""
    return w.repeat(*([1] * (w.dim() - 1)), k)


def _hidden_square(w: torch.Tensor, k: int) -> torch.Tensor:
    """``(J/k) ⊗ W``: maps ``R(h)`` to ``R(W h)``."""
    return w.repeat(k, k) / k


def _identity_blocks(large: TransformerMLM, L: int, move_last_norm: bool) -> None:
    """The blocks of ``large`` after its first ``L`` made the identity (zero sub-layers,
    LayerNorms (1, 0)); ``move_last_norm`` (post-LN with added blocks): the last original
    LayerNorm's affine part moved past them (module docstring)."""
    for blk in large.blocks[L:]:
        for module in blk.modules():
            if isinstance(module, nn.Linear):
                module.weight.zero_()
                module.bias.zero_()
            elif isinstance(module, nn.LayerNorm):
                module.weight.fill_(1.0)
                module.bias.zero_()
    if move_last_norm:
        last, new_last = large.blocks[L - 1].mlp_norm, large.blocks[-1].mlp_norm
        new_last.weight.copy_(last.weight)
        new_last.bias.copy_(last.bias)
        last.weight.fill_(1.0)
        last.bias.zero_()


@torch.no_grad()
def embed(
    small: TransformerMLM,
    width_factor: int = 1,
    extra_layers: int = 0,
    n_heads: int | None = None,
    d_inter: int | None = None,
) -> TransformerMLM:
    """A larger ``TransformerMLM`` that computes the same logits as ``small`` (the paper's
    App. B.4; module docstring: exact for both LayerNorm placements, post-LN depth up to
    LayerNorm's ε).

    Args:
        small: the model to embed.
        width_factor: the larger model's width and heads, × ``small``'s.
        extra_layers: blocks added after the last one (acting as the identity).
        n_heads: the larger model's heads (default ``width_factor`` × ``small``'s).
        d_inter: its MLP units (default ``width_factor`` × ``small``'s).

    Returns:
        the larger model: same dtype and device as ``small``, same train/eval mode.
    """
    cfg = check_embeddable(small)
    plan = plan_embedding(cfg, width_factor, extra_layers, n_heads, d_inter)
    k, L = plan.width_factor, cfg.n_layers
    big_cfg = embedded_config(cfg, plan)
    ref = small.tok_emb.weight
    large = TransformerMLM(big_cfg).to(device=ref.device, dtype=ref.dtype)
    src = dict(small.named_parameters())

    def ln(dst: nn.LayerNorm, name: str, scale: float = 1.0) -> None:
        dst.weight.copy_(_tile_cols(src[f"{name}.weight"], k) * scale)
        dst.bias.copy_(_tile_cols(src[f"{name}.bias"], k) * scale)

    def square(dst: nn.Linear, name: str) -> None:
        dst.weight.copy_(_hidden_square(src[f"{name}.weight"], k))
        dst.bias.copy_(_tile_cols(src[f"{name}.bias"], k))

    large.tok_emb.weight.copy_(_tile_cols(small.tok_emb.weight, k))
    large.pos_emb.weight.copy_(_tile_cols(small.pos_emb.weight, k))
    if cfg.norm == "post":
        ln(large.emb_norm, "emb_norm")
    else:
        ln(large.final_norm, "final_norm")

    unit = torch.arange(plan.d_inter, device=ref.device) % cfg.d_inter  # small unit of each large unit
    copies = torch.bincount(unit, minlength=cfg.d_inter).to(ref.dtype)
    for l in range(L):
        p, blk = f"blocks.{l}", large.blocks[l]
        qkv_w = src[f"{p}.attn.qkv.weight"].chunk(3, dim=0)
        qkv_b = src[f"{p}.attn.qkv.bias"].chunk(3, dim=0)
        blk.attn.qkv.weight.copy_(torch.cat([_hidden_square(w, k) for w in qkv_w], dim=0))
        blk.attn.qkv.bias.copy_(torch.cat([_tile_cols(b, k) for b in qkv_b], dim=0))
        square(blk.attn.out, f"{p}.attn.out")
        up_w, up_b = src[f"{p}.mlp.up.weight"], src[f"{p}.mlp.up.bias"]
        blk.mlp.up.weight.copy_(_tile_cols(up_w, k)[unit] / k)
        blk.mlp.up.bias.copy_(up_b[unit])
        down_w, down_b = src[f"{p}.mlp.down.weight"], src[f"{p}.mlp.down.bias"]
        blk.mlp.down.weight.copy_((down_w[:, unit] / copies[unit]).repeat(k, 1))
        blk.mlp.down.bias.copy_(_tile_cols(down_b, k))
        ln(blk.attn_norm, f"{p}.attn_norm")
        ln(blk.mlp_norm, f"{p}.mlp_norm")

    _identity_blocks(large, L, move_last_norm=cfg.norm == "post" and bool(plan.extra_layers))

    # the tied decoder sees k copies: the LayerNorm feeding it outputs R(g)/k
    if cfg.mlm_head_transform:
        square(large.head.dense, "head.dense")
        ln(large.head.norm, "head.norm", scale=1.0 / k)
    else:
        out_norm = large.blocks[-1].mlp_norm if cfg.norm == "post" else large.final_norm
        out_norm.weight.div_(k)
        out_norm.bias.div_(k)
    large.head.bias.copy_(small.head.bias)
    large.train(small.training)
    return large


# ----------------------------------------------------------------------------- target shapes


def target_plan(cfg: TransformerConfig, into: str | None, width_factor: int | None,
                 extra_layers: int) -> tuple[EmbedPlan, str | None]:
    """The plan for ``embed_checkpoint`` and the size name of the large shape, if any."""
    from sameloss.models.sizes import TRANSFORMER_ALIASES, TRANSFORMER_SIZES, size_names

    _positive_int(extra_layers, "extra layers", 0)
    if width_factor is not None:
        _positive_int(width_factor, "width factor", 1)
    if into is not None:
        name = TRANSFORMER_ALIASES.get(into, into)
        if name not in TRANSFORMER_SIZES:
            raise UserError(f"unknown transformer size {into!r}; valid sizes: {', '.join(size_names('transformer'))}")
        shape = TRANSFORMER_SIZES[name]
        small = f"d_model {cfg.d_model}, {cfg.n_heads} heads, {cfg.n_layers} layers, d_inter {cfg.d_inter}"
        if shape["d_model"] % cfg.d_model:
            raise UserError(f"cannot embed the small model ({small}) into {into}: its d_model "
                            f"{shape['d_model']} is not a multiple of {cfg.d_model}")
        k = shape["d_model"] // cfg.d_model
        if shape["n_heads"] != k * cfg.n_heads:
            raise UserError(f"cannot embed the small model ({small}) into {into}: widening {k}x needs "
                            f"{k * cfg.n_heads} heads of width {cfg.d_head}, {into} has {shape['n_heads']}")
        if shape["n_layers"] < cfg.n_layers:
            raise UserError(f"cannot embed the small model ({small}) into {into}: it has fewer layers "
                            f"({shape['n_layers']} < {cfg.n_layers})")
        if shape["d_inter"] < cfg.d_inter:
            raise UserError(f"cannot embed the small model ({small}) into {into}: its MLP is narrower "
                            f"(d_inter {shape['d_inter']} < {cfg.d_inter})")
        extra = shape["n_layers"] - cfg.n_layers
        if width_factor is not None and width_factor != k:
            raise UserError(f"width factor {width_factor} contradicts --into {into} (which means {k})")
        if extra_layers and extra_layers != extra:
            raise UserError(f"{extra_layers} extra layers contradicts --into {into} (which means {extra})")
        return plan_embedding(cfg, k, extra, shape["n_heads"], shape["d_inter"]), name
    plan = plan_embedding(cfg, 1 if width_factor is None else width_factor, extra_layers)
    big = embedded_config(cfg, plan)
    wanted = {"d_model": big.d_model, "n_heads": big.n_heads, "n_layers": big.n_layers, "d_inter": big.d_inter}
    name = next((n for n, s in TRANSFORMER_SIZES.items() if s == wanted), None)
    return plan, name


# ----------------------------------------------------------------------------- optimiser state


@dataclasses.dataclass(frozen=True)
class EmbedMap:
    """Per large parameter name: the flat index of the small entry each entry copies
    (into the small parameters concatenated in ``named_parameters`` order; -1: none) and
    its scale ``α``; ``d``: ``Σ α²`` over the copies of each small entry (module docstring)."""

    source: dict[str, torch.Tensor]
    alpha: dict[str, torch.Tensor]
    d: torch.Tensor
    small_names: tuple[str, ...]


@torch.no_grad()
def embed_map(small: TransformerMLM, width_factor: int = 1, extra_layers: int = 0, n_heads: int | None = None,
              d_inter: int | None = None) -> EmbedMap:
    """Where each entry of ``embed(small, ...)`` comes from, read off the construction
    itself (no second copy of its rules): the embedding is affine in the small weights,
    so ``embed(ones) − embed(zeros)`` gives each entry's ``α``, and embedding the small
    entries' ids (float64, exact) gives its source."""
    import copy

    names = tuple(n for n, _ in small.named_parameters())
    probe = copy.deepcopy(small).to(torch.float64)
    params = dict(probe.named_parameters())

    def embedded(fill) -> dict[str, torch.Tensor]:
        offset = 0
        for n in names:
            p = params[n]
            p.copy_(fill(offset, p))
            offset += p.numel()
        large = embed(probe, width_factor, extra_layers, n_heads, d_inter)
        return {n: q.detach().clone() for n, q in large.named_parameters()}

    with torch.random.fork_rng(devices=[]):  # embed() initialises a model first: no global side effect
        zero = embedded(lambda o, p: torch.zeros_like(p))
        one = embedded(lambda o, p: torch.ones_like(p))
        ids = embedded(lambda o, p: torch.arange(o + 1, o + 1 + p.numel(), dtype=torch.float64).reshape(p.shape))
    total = sum(params[n].numel() for n in names)
    source, alpha = {}, {}
    d = torch.zeros(total, dtype=torch.float64)
    for n in zero:
        a = (one[n] - zero[n]).reshape(-1)
        src = torch.full_like(a, -1, dtype=torch.long)
        has = a != 0
        src[has] = torch.round((ids[n] - zero[n]).reshape(-1)[has] / a[has]).long() - 1
        source[n], alpha[n] = src, a
        d.index_add_(0, src[has], a[has] ** 2)
    return EmbedMap(source, alpha, d, names)


def _flat_small(m: EmbedMap, tensors: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([tensors[n].detach().reshape(-1).to(torch.float64) for n in m.small_names])


def _spread(m: EmbedMap, flat: torch.Tensor, shapes: dict[str, torch.Size], square: bool) -> dict[str, torch.Tensor]:
    out = {}
    for n, src in m.source.items():
        has = src >= 0
        scale = torch.zeros_like(m.alpha[n])
        scale[has] = m.alpha[n][has] / m.d[src[has]]
        v = torch.zeros_like(scale)
        v[has] = (scale[has] ** 2 if square else scale[has]) * flat[src[has]]
        out[n] = v.reshape(shapes[n])
    return out


def embed_gradient(m: EmbedMap, small: dict[str, torch.Tensor], shapes: dict[str, torch.Size]
                   ) -> dict[str, torch.Tensor]:
    """A gradient-like tensor per small parameter (a gradient, Adam's ``exp_avg``, SGD's
    momentum) as the large model's: ``E (g / d)``, float64, ``shapes`` the large ones."""
    return _spread(m, _flat_small(m, small), shapes, square=False)


def embed_second_moment(m: EmbedMap, small: dict[str, torch.Tensor], shapes: dict[str, torch.Size]
                        ) -> dict[str, torch.Tensor]:
    """A tensor of squared gradients per small parameter (Adam's ``exp_avg_sq``) as the
    large model's: ``(α / d)² v`` at each copy."""
    return _spread(m, _flat_small(m, small), shapes, square=True)
