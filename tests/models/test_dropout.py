"""The CPU's cheap dropout mask (``models.dropout``): its rate and scale, its gradient, and
the attention path that uses it agrees with PyTorch's SDPA."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from sameloss.models.dropout import Dropout, dropout_mask
from sameloss.models.transformer import _attention_with_dropout


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_the_mask_keeps_one_minus_p_and_scales_by_the_exact_rate(p):
    torch.manual_seed(0)
    keep, scale = dropout_mask(torch.Size([400, 500]), p)
    levels = 1 << 15
    rate = round(p * levels) / levels
    assert abs(rate - p) <= 2**-16 and scale == pytest.approx(1 / (1 - rate), rel=1e-15)
    n = keep.numel()
    kept = float(keep.double().mean())
    assert abs(kept - (1 - rate)) < 5 * math.sqrt(rate * (1 - rate) / n), (kept, 1 - rate)
    # every lane of the 64-bit words is uniform: the four lanes' rates agree
    lanes = keep.reshape(-1)[: n - n % 4].reshape(-1, 4).double().mean(dim=0)
    assert float((lanes - (1 - rate)).abs().max()) < 5 * math.sqrt(rate * (1 - rate) / (n / 4))


def test_the_layer_keeps_the_expectation_and_its_gradient_is_the_mask():
    torch.manual_seed(1)
    layer = Dropout(0.1)
    x = torch.randn(64, 10, 32, requires_grad=True)
    y = layer(x)
    kept = y != 0
    assert torch.allclose(y[kept], x[kept] * (1 << 15) / ((1 << 15) - round(0.1 * (1 << 15))))
    y.sum().backward()
    assert torch.equal(x.grad != 0, kept)
    big = layer(torch.ones(2000, 1000))
    assert float(big.mean()) == pytest.approx(1.0, abs=5e-3)
    layer.eval()
    assert layer(x) is x or torch.equal(layer(x), x)


def test_draws_follow_the_global_generator():
    layer = Dropout(0.3)
    x = torch.ones(100, 100)
    torch.manual_seed(7)
    a = layer(x)
    torch.manual_seed(7)
    assert torch.equal(a, layer(x))
    assert not torch.equal(a, layer(x))


def test_attention_with_the_cheap_mask_is_sdpa_where_nothing_is_dropped():
    """With a rate that rounds to 0 the mask keeps everything: the math path equals SDPA."""
    torch.manual_seed(2)
    q, k, v = (torch.randn(3, 2, 6, 8, dtype=torch.float64) for _ in range(3))
    attend = torch.ones(3, 1, 1, 6, dtype=torch.bool)
    attend[0, ..., 4:] = False
    ours = _attention_with_dropout(q, k, v, attend, 1e-9)
    theirs = F.scaled_dot_product_attention(q, k, v, attn_mask=attend)
    assert torch.allclose(ours, theirs, atol=1e-12)
