"""Dropout (Srivastava et al. 2014; paper §5.4) with a faster mask on the CPU.

In training each element is zeroed with probability p and the survivors are scaled by 1/(1 − p), so
the expected output equals the input; in evaluation dropout is the identity.

Why not ``nn.Dropout`` everywhere: on the CPU PyTorch draws the mask with ``bernoulli_``, a scalar
loop, while drawing uniform numbers and comparing them with p is vectorised; a small Transformer's
training step runs two dozen dropouts, so the mask is a visible part of it (the measurements are in
docs/results.md). Other devices keep PyTorch's fused kernel.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.errors import ConfigError


class _UniformMaskDropout(torch.autograd.Function):
    """y = x · keep / (1 − p) with keep = (u ≥ p), u ~ U[0, 1) in float32; saves keep as bool."""

    @staticmethod
    def forward(ctx, x: Tensor, p: float) -> Tensor:
        # float32 uniforms whatever x's dtype: bf16 ones would round p to 8 bits
        keep = torch.rand(x.shape, device=x.device) >= p
        ctx.save_for_backward(keep)
        ctx.scale = 1.0 / (1.0 - p)
        return x * keep * ctx.scale

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:
        (keep,) = ctx.saved_tensors
        return grad * keep * ctx.scale, None


def _check(p: float) -> None:
    if not 0.0 <= p <= 1.0:
        raise ConfigError(f"dropout probability must be in [0, 1], got {p}")


def _dropout(x: Tensor, p: float, training: bool) -> Tensor:
    if not training or p == 0.0:
        return x
    if p == 1.0 or x.device.type != "cpu":
        return F.dropout(x, p, training)
    return _UniformMaskDropout.apply(x, p)


def dropout(x: Tensor, p: float, training: bool = True) -> Tensor:
    """``F.dropout(x, p, training)``, with the uniform-mask kernel on the CPU."""
    _check(p)
    return _dropout(x, p, training)


class Dropout(nn.Module):
    """Drop-in replacement for ``nn.Dropout`` (same ``p``, same train/eval behaviour).

    Shape:
        x: (*) -> (*)
    """

    def __init__(self, p: float = 0.5):
        super().__init__()
        _check(p)  # once here, not on every call
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        return _dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"
