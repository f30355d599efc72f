"""Our post-LN transformer against Hugging Face's BertForMaskedLM (as minGPT checks GPT-2).

The weights are copied into BERT's eager (plain matmul + softmax) attention, so the
reference shares neither our fused QKV nor the SDPA kernel.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from models.model_test_utils import MAX_LEN, PAD, VOCAB, padded_batch

pytest.importorskip("transformers")

from sameloss.models import build_model  # noqa: E402
from sameloss.hf.bert import to_hf_bert  # noqa: E402


def randomised(size: str):
    """A model whose LayerNorm gains and all biases are random too, so that a swapped
    or forgotten parameter cannot hide behind the ones/zeros of the initialisation."""
    torch.manual_seed(0)
    model = build_model("transformer", size, VOCAB, MAX_LEN)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.normal_(1.0 if name.endswith("norm.weight") else 0.0, 0.1)
    return model


@pytest.mark.parametrize("size", ["micro", "tiny"])
def test_logits_match_bert(size):
    model = randomised(size).eval()
    hf = to_hf_bert(model, attn_implementation="eager").eval()
    tokens = padded_batch(8, MAX_LEN, seed=4)
    ours = model(tokens)
    theirs = hf(input_ids=tokens, attention_mask=(tokens != PAD).long()).logits
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5)


def test_gradients_match_bert():
    model = randomised("micro").eval()
    hf = to_hf_bert(model, attn_implementation="eager").eval()
    tokens = padded_batch(8, MAX_LEN, seed=5)
    targets = torch.randint(0, 20, tokens.shape)
    real = tokens != PAD
    F.cross_entropy(model(tokens)[real], targets[real]).backward()
    logits = hf(input_ids=tokens, attention_mask=real.long()).logits
    F.cross_entropy(logits[real], targets[real]).backward()
    pairs = {
        "embedding": (model.tok_emb.weight, hf.bert.embeddings.word_embeddings.weight),
        "value": (model.qkv_weights(0)[2], hf.bert.encoder.layer[0].attention.self.value.weight),
        "mlp.up": (model.blocks[0].mlp.up.weight, hf.bert.encoder.layer[0].intermediate.dense.weight),
        "head bias": (model.head.bias, hf.cls.predictions.bias),
    }
    for name, (ours, theirs) in pairs.items():
        grad = ours.grad if name != "value" else model.blocks[0].attn.qkv.weight.grad.chunk(3)[2]
        torch.testing.assert_close(grad, theirs.grad, rtol=1e-4, atol=1e-6, msg=name)
