"""Label-smoothed cross-entropy (paper §5.4, ε_ls = 0.1), as a pure function.

The target distribution puts 1 − ε on the reference token and spreads ε uniformly over the
vocabulary *without the padding id* (padding is never a prediction), so with V' = V − 1 classes

    loss = −(1 − ε) log p(y) − (ε / V') Σ_{v ≠ pad} log p(v)

No one-hot targets are built: log p(y) is gathered and Σ log p(v) is one reduction. Positions whose
target is ``ignore_index`` contribute nothing. With ``smoothing_exclude=None`` the mass is spread
over all V classes, which is exactly ``F.cross_entropy(..., label_smoothing=ε)``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def _at_least_float32(x: Tensor) -> Tensor:
    return x.to(torch.promote_types(x.dtype, torch.float32))


def label_smoothed_nll_loss(
    logits: Tensor,
    target: Tensor,
    epsilon: float,
    ignore_index: int | None = None,
    smoothing_exclude: int | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Summed label-smoothed loss, summed NLL (for perplexity) and the number of target tokens.

    ``smoothing_exclude`` is the id that receives no smoothing mass (the pad id).
    Log-probabilities are computed in float32 whatever the logits' dtype.

    Shape:
        logits: (..., V), target: (...) -> three scalars
    """
    lprobs = F.log_softmax(_at_least_float32(logits), dim=-1)  # (..., V)
    vocab = lprobs.size(-1)
    keep = torch.ones_like(target, dtype=torch.bool) if ignore_index is None else target != ignore_index
    nll = -lprobs.gather(-1, target.clamp(min=0).unsqueeze(-1)).squeeze(-1)  # (...) −log p(y)
    smooth = -lprobs.sum(-1)  # (...) −Σ_v log p(v)
    n_classes = vocab
    if smoothing_exclude is not None:
        smooth = smooth + lprobs[..., smoothing_exclude]
        n_classes = vocab - 1
    loss = (1.0 - epsilon) * nll + (epsilon / n_classes) * smooth
    zero = torch.zeros((), dtype=loss.dtype, device=loss.device)
    return (
        torch.where(keep, loss, zero).sum(),
        torch.where(keep, nll, zero).sum(),
        keep.sum(),
    )


class _LinearLabelSmoothedCE(torch.autograd.Function):
    """Output projection and label-smoothed loss together, over chunks of rows.

    logits = (h Wᵀ) · scale + b are never stored whole: the forward keeps one (rows, V) chunk at a
    time (loss terms and log Σ exp per row), and the backward recomputes each chunk's logits to
    form softmax − q and multiply it out into ∂h, ∂W and ∂b. Memory for the loss drops from
    O(N·V) to O(chunk·V), and each chunk is reused while it is still in cache: one extra matrix
    product buys fewer passes over memory (the "cut cross-entropy" idea).
    """

    @staticmethod
    def forward(ctx, h, weight, bias, target, keep, scale, epsilon, exclude, chunk):
        n_classes = weight.size(0) - (exclude is not None)
        lse = torch.empty(h.size(0), dtype=torch.float32, device=h.device)
        loss = torch.zeros((), dtype=torch.float32, device=h.device)
        nll = torch.zeros((), dtype=torch.float32, device=h.device)
        keep_f = keep.float()
        for i in range(0, h.size(0), chunk):
            z = _chunk_logits(h[i : i + chunk], weight, bias, scale)  # (rows, V) float32
            t = target[i : i + chunk]
            lse_c = torch.logsumexp(z, dim=-1)
            z_y = z.gather(-1, t.unsqueeze(-1)).squeeze(-1)
            z_sum = z.sum(-1) - (z[:, exclude] if exclude is not None else 0.0)
            nll_c = lse_c - z_y
            loss_c = nll_c + epsilon * (z_y - z_sum / n_classes)
            lse[i : i + chunk] = lse_c
            loss += (loss_c * keep_f[i : i + chunk]).sum()
            nll += (nll_c * keep_f[i : i + chunk]).sum()
        ctx.save_for_backward(h, weight, bias, target, keep_f, lse)
        ctx.scale, ctx.epsilon, ctx.exclude, ctx.chunk, ctx.n_classes = (
            scale,
            epsilon,
            exclude,
            chunk,
            n_classes,
        )
        return loss, nll

    @staticmethod
    def backward(ctx, grad_loss, grad_nll):
        h, weight, bias, target, keep_f, lse = ctx.saved_tensors
        eps, exclude, chunk, q = ctx.epsilon, ctx.exclude, ctx.chunk, ctx.epsilon / ctx.n_classes
        with_nll = bool((grad_nll != 0).any())
        grad_h = torch.empty_like(h)
        grad_w = torch.zeros_like(weight, dtype=torch.float32)
        grad_b = None if bias is None else torch.zeros_like(bias, dtype=torch.float32)
        w = weight.float()
        for i in range(0, h.size(0), chunk):
            hc = h[i : i + chunk].float()
            t, k = target[i : i + chunk], keep_f[i : i + chunk]
            rows = torch.arange(t.size(0), device=h.device)
            g = _chunk_logits(hc, weight, bias, ctx.scale).sub_(lse[i : i + chunk, None]).exp_()  # softmax
            if with_nll:
                p_y = g[rows, t].clone()
            g.sub_(q)  # softmax − q: ε/V' off the target …
            if exclude is not None:
                g[:, exclude] += q  # … none on padding …
            g[rows, t] -= 1.0 - eps  # … and 1 − ε more on the target
            g.mul_((k * grad_loss).unsqueeze(-1))
            if with_nll:  # the NLL's own gradient: softmax − onehot
                extra = (k * grad_nll).unsqueeze(-1)
                soft = _chunk_logits(hc, weight, bias, ctx.scale).sub_(lse[i : i + chunk, None]).exp_()
                soft[rows, t] = p_y - 1.0
                g.add_(soft.mul_(extra))
            if grad_b is not None:
                grad_b += g.sum(0)
            g.mul_(ctx.scale)
            grad_h[i : i + chunk] = (g @ w).to(h.dtype)
            grad_w.addmm_(g.t(), hc)
        grad_b = None if grad_b is None else grad_b.to(bias.dtype)
        return grad_h, grad_w.to(weight.dtype), grad_b, None, None, None, None, None, None


def _chunk_logits(h: Tensor, weight: Tensor, bias: Tensor | None, scale: float) -> Tensor:
    z = h.float() @ weight.float().t()
    if scale != 1.0:
        z.mul_(scale)
    return z if bias is None else z.add_(bias.float())


def linear_label_smoothed_nll_loss(
    h: Tensor,
    weight: Tensor,
    target: Tensor,
    epsilon: float,
    bias: Tensor | None = None,
    scale: float = 1.0,
    ignore_index: int | None = None,
    smoothing_exclude: int | None = None,
    chunk_bytes: int = 8 << 20,
) -> tuple[Tensor, Tensor, Tensor]:
    """``label_smoothed_nll_loss((h Wᵀ)·scale + b, target, …)`` without materialising the logits.

    ``chunk_bytes`` bounds the float32 logits held at once. Computed in float32 whatever the
    autocast state (the loss is where precision matters, and on CPUs without AMX bfloat16 matrix
    products are no faster).

    Shape:
        h: (N, d_model), weight: (V, d_model), target: (N,) -> three scalars
    """
    keep = torch.ones_like(target, dtype=torch.bool) if ignore_index is None else target != ignore_index
    chunk = max(16, chunk_bytes // (4 * weight.size(0)))
    with torch.autocast(h.device.type, enabled=False):
        loss, nll = _LinearLabelSmoothedCE.apply(
            h, weight, bias, target.clamp(min=0), keep, scale, epsilon, smoothing_exclude, chunk
        )
    return loss, nll, keep.sum()
