"""Dropout whose mask costs what the arithmetic it guards costs, on the CPU.

``torch.nn.Dropout`` on the CPU draws its mask with ``bernoulli_``, one double-precision
uniform per element: at the tiny isoloss design it was 11–15 % of a training step (the
profile of issue 45), more than the matmuls of the layer it guards. Here the mask is read
off 15-bit integers cut from 64-bit random words (``random_`` on ``int64``: four lanes per
word), kept where the integer is at least ``round(p · 2¹⁵)``: the drop rate is ``p`` to
within 2⁻¹⁶ (0.1 → 0.100006) and the kept values are scaled by the exact ``1/(1 − p')``
of that rate, so the layer's expectation is its input's. Measured on the 2-core CPU at
``[256, 10, 64]``: ``F.dropout`` 2.7 ms, this ~0.9 ms.

The draws come from the global CPU generator as ``nn.Dropout``'s do (a run's checkpoint
saves its state: resume stays bit-identical), but they are other draws: a run's numbers
differ from ``nn.Dropout``'s. Off the CPU (CUDA's fused Philox kernel is already cheap)
and in eval mode it is ``nn.Dropout`` exactly.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

_LEVELS = 1 << 15


def dropout_mask(shape: torch.Size, p: float) -> tuple[torch.Tensor, float]:
    """A boolean keep-mask of ``shape`` (each element kept with probability ``1 − p'``,
    ``p' = round(p · 2¹⁵) / 2¹⁵``) and the scale ``1/(1 − p')`` of the kept values."""
    n = 1
    for s in shape:
        n *= int(s)
    words = torch.empty((n + 3) // 4, dtype=torch.int64).random_()
    lanes = words.view(torch.int16)[:n].bitwise_and(_LEVELS - 1)  # 15 uniform bits per lane
    threshold = round(p * _LEVELS)
    return (lanes >= threshold).view(shape), _LEVELS / (_LEVELS - threshold)


class Dropout(nn.Dropout):
    """``nn.Dropout`` with the CPU mask of ``dropout_mask`` (module docstring)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0 or x.device.type != "cpu" or self.p >= 1:
            return F.dropout(x, self.p, self.training, self.inplace)
        keep, scale = dropout_mask(x.shape, self.p)
        return x * (keep.to(x.dtype) * scale)
