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
    lprobs = F.log_softmax(logits.float(), dim=-1)  # (..., V)
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
