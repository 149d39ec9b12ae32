"""Layer normalisation (Ba et al. 2016), written out.

LayerNorm(x) = γ ⊙ (x − μ) / √(σ² + ε) + β, with μ and σ² the mean and the *biased* variance over
the last dimension. Two details the tutorials got wrong: the variance is biased (divide by n, as
``torch.nn.LayerNorm`` does, not by n−1 as ``Tensor.std()`` does by default), and ε goes inside the
square root, not added to the standard deviation.

``layer_norm_explicit`` is that equation, op by op. ``LayerNorm`` runs the same computation through
PyTorch's fused kernel (one pass instead of six) unless ``explicit=True``; a test holds both paths
to ``nn.LayerNorm``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def layer_norm_explicit(x: Tensor, weight: Tensor, bias: Tensor | None, eps: float) -> Tensor:
    """γ ⊙ (x − μ) / √(σ² + ε) + β, statistics in float32 even under bf16/fp16 autocast.

    Shape:
        x: (..., d_model) -> (..., d_model)
    """
    dtype = x.dtype
    x = x.float()
    mean = x.mean(dim=-1, keepdim=True)  # μ
    var = (x - mean).pow(2).mean(dim=-1, keepdim=True)  # σ², biased: divide by n
    y = (x - mean) * torch.rsqrt(var + eps) * weight  # ε inside the square root
    if bias is not None:
        y = y + bias
    return y.to(dtype)


class LayerNorm(nn.Module):
    """Normalise each vector to zero mean and unit variance, then scale by γ and shift by β.

    Shape:
        x: (..., d_model) -> (..., d_model)
    """

    def __init__(self, d_model: int, eps: float = 1e-5, bias: bool = True, explicit: bool = False):
        super().__init__()
        self.eps, self.explicit = eps, explicit
        self.weight = nn.Parameter(torch.ones(d_model))  # γ
        self.bias = nn.Parameter(torch.zeros(d_model)) if bias else None  # β

    def forward(self, x: Tensor) -> Tensor:
        if self.explicit:
            return layer_norm_explicit(x, self.weight, self.bias, self.eps)
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, self.eps)
