"""Dropout (Srivastava et al. 2014; paper §5.4) with a faster mask on the CPU.

In training each element is zeroed with probability p and the survivors are scaled by 1/(1 − p), so
the expected output equals the input; in evaluation dropout is the identity.

Why not ``nn.Dropout`` everywhere: on the CPU PyTorch draws the mask with ``bernoulli_``, a scalar
loop, while drawing uniform numbers and comparing them with p is vectorised; a small Transformer's
training step runs two dozen dropouts, so the mask is a visible part of it (the measurements are in
docs/results.md). The uniform numbers are 15-bit: each 64-bit draw of the generator gives four,
where a float32 uniform costs one 32-bit draw, so the mask costs less than half as much; the drop
probability is then p rounded to a multiple of 2⁻¹⁵ (0.1 → 0.100006), for 1/256 ≤ p ≤ 255/256 —
outside that range float32 uniforms keep p exact. Other devices keep PyTorch's fused kernel.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.errors import ConfigError


def _keep_mask(shape: torch.Size, p: float) -> Tensor:
    """Bool mask, True with probability 1 − p (p rounded to 15 bits where that is close, see above)."""
    if not 1 / 256 <= p <= 255 / 256:
        return torch.rand(shape) >= p  # float32 whatever x's dtype: bf16 would round p to 8 bits
    n = shape.numel()
    words = torch.empty((n + 3) // 4, dtype=torch.int64).random_()  # 63 uniform bits each
    # four 16-bit lanes per word; the low 15 bits of each are uniform (the top lane's 16th bit is 0)
    lanes = words.view(torch.int16)[:n].bitwise_and_(0x7FFF)
    return (lanes >= round(p * 32768)).view(shape)


def _scaled_mask(x: Tensor, p: float) -> Tensor:
    """m = keep / (1 − p) in x's dtype, as ``nn.Dropout`` keeps its mask on the CPU: multiplying by a
    bool mask would convert it to x's dtype on every use, which costs more than drawing it."""
    return _keep_mask(x.shape, p).to(x.dtype).mul_(1.0 / (1.0 - p))


class _UniformMaskDropout(torch.autograd.Function):
    """y = x · m (``_scaled_mask``); m is saved for the backward."""

    @staticmethod
    def forward(ctx, x: Tensor, p: float) -> Tensor:
        m = _scaled_mask(x, p)
        ctx.save_for_backward(m)
        return x * m

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:
        (m,) = ctx.saved_tensors
        return grad * m, None


class _UniformMaskDropoutAdd(torch.autograd.Function):
    """y = r + x · m in one pass: the residual connection's r + Dropout(x)."""

    @staticmethod
    def forward(ctx, r: Tensor, x: Tensor, p: float) -> Tensor:
        m = _scaled_mask(x, p)
        ctx.save_for_backward(m)
        return torch.addcmul(r, x, m)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, Tensor, None]:
        (m,) = ctx.saved_tensors
        return grad, grad * m, None


def _check(p: float) -> None:
    if not 0.0 <= p <= 1.0:
        raise ConfigError(f"dropout probability must be in [0, 1], got {p}")


def _dropout(x: Tensor, p: float, training: bool) -> Tensor:
    if not training or p == 0.0:
        return x
    if p == 1.0 or x.device.type != "cpu":
        return F.dropout(x, p, training)
    return _UniformMaskDropout.apply(x, p)


def _dropout_add(r: Tensor, x: Tensor, p: float, training: bool) -> Tensor:
    if training and 0.0 < p < 1.0 and x.device.type == "cpu" and r.shape == x.shape:
        return _UniformMaskDropoutAdd.apply(r, x, p)
    return r + _dropout(x, p, training)


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

    def add(self, r: Tensor, x: Tensor) -> Tensor:
        """r + self(x), in one pass on the CPU (the residual connection around a sublayer)."""
        return _dropout_add(r, x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"
