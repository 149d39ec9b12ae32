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


class _FusedLabelSmoothedCE(torch.autograd.Function):
    """The same loss with its gradient written out, so that no (N, V) log-probabilities, one-hot
    targets or per-term gradients are materialised: the backward allocates one (N, V) tensor.

    With z the logits, lse = log Σ_v exp(z_v) and q the smoothed target distribution,
        loss_i = lse_i − Σ_v q_iv z_iv = lse_i − (1 − ε) z_iy − (ε / V') (Σ_v z_iv − z_i,pad)
        ∂loss_i / ∂z_iv = softmax(z_i)_v − q_iv
    """

    @staticmethod
    def forward(ctx, logits: Tensor, target: Tensor, keep: Tensor, epsilon: float, exclude: int | None):
        z = _at_least_float32(logits)
        lse = torch.logsumexp(z, dim=-1)  # (N,)
        z_y = z.gather(-1, target.unsqueeze(-1)).squeeze(-1)
        n_classes = z.size(-1) - (exclude is not None)
        z_sum = z.sum(-1) - (z[:, exclude] if exclude is not None else 0.0)
        nll = lse - z_y
        loss = nll + epsilon * (z_y - z_sum / n_classes)  # = lse − (1−ε) z_y − (ε/V') Σ' z
        ctx.save_for_backward(logits, lse, target, keep)
        ctx.epsilon, ctx.exclude, ctx.n_classes = epsilon, exclude, n_classes
        keep_f = keep.to(loss.dtype)
        return (loss * keep_f).sum(), (nll * keep_f).sum()

    @staticmethod
    def backward(ctx, grad_loss: Tensor, grad_nll: Tensor):
        logits, lse, target, keep = ctx.saved_tensors
        eps, exclude, n_classes = ctx.epsilon, ctx.exclude, ctx.n_classes
        grad = (_at_least_float32(logits) - lse.unsqueeze(-1)).exp_()  # softmax(z): the only (N, V) tensor
        grad.sub_(eps / n_classes)  # − q: ε/V' everywhere …
        if exclude is not None:
            grad[:, exclude] += eps / n_classes  # … but not on the padding id …
        rows = torch.arange(grad.size(0), device=grad.device)
        grad[rows, target] -= 1.0 - eps  # … and 1 − ε more on the target
        keep_f = keep.to(grad.dtype)
        grad.mul_((keep_f * grad_loss).unsqueeze(-1))
        if bool((grad_nll != 0).any()):  # only if the summed NLL was back-propagated too
            nll_grad = (_at_least_float32(logits) - lse.unsqueeze(-1)).exp_()  # softmax − onehot
            nll_grad[rows, target] -= 1.0
            grad.add_(nll_grad.mul_((keep_f * grad_nll).unsqueeze(-1)))
        return grad.to(logits.dtype), None, None, None, None


def fused_label_smoothed_nll_loss(
    logits: Tensor,
    target: Tensor,
    epsilon: float,
    ignore_index: int | None = None,
    smoothing_exclude: int | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """``label_smoothed_nll_loss`` (same arguments and results) with a hand-written backward:
    less memory and time for large vocabularies. The summed NLL is for logging; back-propagating
    through it is supported but costs a second (N, V) tensor.

    Shape:
        logits: (N, V), target: (N,) -> three scalars
    """
    keep = torch.ones_like(target, dtype=torch.bool) if ignore_index is None else target != ignore_index
    loss, nll = _FusedLabelSmoothedCE.apply(logits, target.clamp(min=0), keep, epsilon, smoothing_exclude)
    return loss, nll, keep.sum()
