"""Layer normalisation (Ba et al. 2016), written out.

LayerNorm(x) = γ ⊙ (x − μ) / √(σ² + ε) + β, with μ and σ² the mean and the *biased* variance over
the last dimension. Two details the tutorials got wrong: the variance is biased (divide by n, as
``torch.nn.LayerNorm`` does, not by n−1 as ``Tensor.std()`` does by default), and ε goes inside the
square root, not added to the standard deviation.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class LayerNorm(nn.Module):
    """Normalise each vector to zero mean and unit variance, then scale by γ and shift by β.

    Shape:
        x: (..., d_model) -> (..., d_model)
    """

    def __init__(self, d_model: int, eps: float = 1e-5, bias: bool = True):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))  # γ
        self.bias = nn.Parameter(torch.zeros(d_model)) if bias else None  # β

    def forward(self, x: Tensor) -> Tensor:
        dtype = x.dtype
        x = x.float()  # statistics in float32 even under bf16/fp16 autocast
        mean = x.mean(dim=-1, keepdim=True)
        var = (x - mean).pow(2).mean(dim=-1, keepdim=True)  # biased: divide by n
        y = (x - mean) * torch.rsqrt(var + self.eps) * self.weight
        if self.bias is not None:
            y = y + self.bias
        return y.to(dtype)
