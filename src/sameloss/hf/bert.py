"""Copy a post-LN ``TransformerMLM`` into Hugging Face's ``BertForMaskedLM``.

Used by ``sameloss export`` (``sameloss.hf.export``), by the reference test (our logits
must equal BERT's, as minGPT checks itself against GPT-2) and by
``bench/bench_transformer_vs_hf.py``. ``transformers`` is optional: it is
imported only when these functions are called.

The correspondence is one to one except for BERT's token-type embedding, which we do not
have: the HF model gets one token type whose embedding is zero.
"""

from __future__ import annotations

import torch

from sameloss.models.transformer import TransformerConfig, TransformerMLM


def bert_config(cfg: TransformerConfig, attn_implementation: str = "sdpa"):
    """The ``transformers.BertConfig`` of the same shape as ``cfg`` (post-LN only)."""
    from transformers import BertConfig

    if cfg.norm != "post" or not cfg.mlm_head_transform:
        raise ValueError("BERT is post-LN with an MLM head transform")
    hf_cfg = BertConfig(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.d_model,
        num_hidden_layers=cfg.n_layers,
        num_attention_heads=cfg.n_heads,
        intermediate_size=cfg.d_inter,
        hidden_act="gelu",
        hidden_dropout_prob=cfg.dropout,
        attention_probs_dropout_prob=cfg.attn_dropout,
        max_position_embeddings=cfg.max_len,
        type_vocab_size=1,
        initializer_range=cfg.init_std,
        layer_norm_eps=cfg.layer_norm_eps,
        pad_token_id=cfg.pad_id,
        tie_word_embeddings=True,
    )
    hf_cfg._attn_implementation = attn_implementation
    return hf_cfg


@torch.no_grad()
def to_hf_bert(model: TransformerMLM, attn_implementation: str = "sdpa"):
    """A ``BertForMaskedLM`` computing the same function as ``model`` (weights copied).

    Call it as ``hf(input_ids=tokens, attention_mask=(tokens != pad_id).long())``.

    Args:
        model: a post-LN sameloss transformer.
        attn_implementation: transformers' attention (``sdpa`` or ``eager``).

    Returns:
        the ``BertForMaskedLM``.
    """
    from transformers import BertForMaskedLM

    cfg = model.config
    hf = BertForMaskedLM(bert_config(cfg, attn_implementation))
    hf.to(dtype=model.tok_emb.weight.dtype)
    emb = hf.bert.embeddings
    emb.word_embeddings.weight.copy_(model.tok_emb.weight)
    emb.position_embeddings.weight.copy_(model.pos_emb.weight)
    emb.token_type_embeddings.weight.zero_()
    _copy_norm(emb.LayerNorm, model.emb_norm)
    d = cfg.d_model
    for ours, theirs in zip(model.blocks, hf.bert.encoder.layer, strict=True):
        w, b = ours.attn.qkv.weight, ours.attn.qkv.bias
        att = theirs.attention
        for i, lin in enumerate((att.self.query, att.self.key, att.self.value)):
            lin.weight.copy_(w[i * d : (i + 1) * d])
            lin.bias.copy_(b[i * d : (i + 1) * d])
        _copy_linear(att.output.dense, ours.attn.out)
        _copy_norm(att.output.LayerNorm, ours.attn_norm)
        _copy_linear(theirs.intermediate.dense, ours.mlp.up)
        _copy_linear(theirs.output.dense, ours.mlp.down)
        _copy_norm(theirs.output.LayerNorm, ours.mlp_norm)
    pred = hf.cls.predictions
    _copy_linear(pred.transform.dense, model.head.dense)
    _copy_norm(pred.transform.LayerNorm, model.head.norm)
    pred.bias.copy_(model.head.bias)
    if pred.decoder.weight is not emb.word_embeddings.weight:  # tie, whatever the version
        pred.decoder.weight = emb.word_embeddings.weight
    if getattr(pred.decoder, "bias", None) is not None:
        pred.decoder.bias = pred.bias
    return hf


def _copy_linear(dst: torch.nn.Linear, src: torch.nn.Linear) -> None:
    dst.weight.copy_(src.weight)
    dst.bias.copy_(src.bias)


def _copy_norm(dst: torch.nn.LayerNorm, src: torch.nn.LayerNorm) -> None:
    dst.weight.copy_(src.weight)
    dst.bias.copy_(src.bias)
