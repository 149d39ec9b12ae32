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
from torch.autograd.function import once_differentiable


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


def r_drop_loss(
    logits_a: Tensor,
    logits_b: Tensor,
    target: Tensor,
    epsilon: float,
    alpha: float,
    smoothing_exclude: int | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """R-Drop (Liang et al. 2021, eq. 3) for two forward passes of the same batch through different
    dropout masks: L = L_a + L_b + α · ½ (KL(P_a ‖ P_b) + KL(P_b ‖ P_a)), each L the label-smoothed
    loss. Returned halved, so that the loss and NLL read per pass as without R-Drop (α keeps the
    paper's meaning relative to the cross-entropy): summed loss, the passes' mean summed NLL, and
    the number of targets of one pass.

    Shape:
        logits_a, logits_b: (N, V), target: (N,) -> three scalars
    """
    loss_a, nll_a, n = label_smoothed_nll_loss(logits_a, target, epsilon, smoothing_exclude=smoothing_exclude)
    loss_b, nll_b, _ = label_smoothed_nll_loss(logits_b, target, epsilon, smoothing_exclude=smoothing_exclude)
    lp_a = F.log_softmax(_at_least_float32(logits_a), dim=-1)  # (N, V)
    lp_b = F.log_softmax(_at_least_float32(logits_b), dim=-1)
    kl = ((lp_a.exp() - lp_b.exp()) * (lp_a - lp_b)).sum()  # KL(P_a ‖ P_b) + KL(P_b ‖ P_a), summed over N
    return (loss_a + loss_b) / 2 + (alpha / 4) * kl, (nll_a + nll_b) / 2, n


def fused_r_drop_loss(
    logits: Tensor,
    target: Tensor,
    epsilon: float,
    alpha: float,
    smoothing_exclude: int | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """``r_drop_loss(logits[:N], logits[N:], …)`` with its gradient written out, for training: the
    two passes' logits come stacked, softmax and log-softmax take one exponential pass, and
    ∂loss/∂logits is formed in the forward in place of log P (autograd through the formula makes
    more passes and allocations over these (2N, V) tensors). The NLL carries no gradient.

    Shape:
        logits: (2N, V), target: (N,) -> three scalars
    """
    loss, nll = _RDropLoss.apply(logits, target, epsilon, alpha, smoothing_exclude)
    return loss, nll, torch.tensor(target.numel(), device=target.device)


class _RDropLoss(torch.autograd.Function):
    """Forward of ``r_drop_loss`` on the two passes' logits stacked (2N, V), and its gradient:
    per pass (softmax − q) / 2 from the cross-entropy, and from S = Σ (P_a − P_b)(log P_a − log P_b)
    with d = log P_a − log P_b, ∂S/∂z_a = P_a ⊙ (d − E_{P_a}[d] + 1) − P_b and
    ∂S/∂z_b = P_b ⊙ (E_{P_b}[d] − d + 1) − P_a (so S = Σ E_{P_a}[d] − Σ E_{P_b}[d]), times α/4."""

    @staticmethod
    def forward(ctx, logits, target, epsilon, alpha, exclude):
        n = logits.size(0) // 2
        n_classes = logits.size(-1) - (exclude is not None)
        z = _at_least_float32(logits)
        top = z.amax(-1, keepdim=True)  # (2N, 1)
        p = torch.sub(z, top).exp_()
        total = p.sum(-1, keepdim=True)
        p.div_(total)  # (2N, V) softmax
        lp = torch.sub(z, top.add_(total.log_()))  # (2N, V) log-softmax
        targets = target.repeat(2)  # (2N,)
        lp_y = lp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # (2N,)
        lp_sum = lp.sum(-1) - (lp[:, exclude] if exclude is not None else 0.0)  # Σ_{k ≠ pad} log p(k)
        ce = -(1.0 - epsilon) * lp_y.sum() - (epsilon / n_classes) * lp_sum.sum()
        d = lp[:n] - lp[n:]  # (N, V) log P_a − log P_b
        mean_a = torch.linalg.vecdot(p[:n], d).unsqueeze(-1)  # (N, 1) E_{P_a}[d]
        mean_b = torch.linalg.vecdot(p[n:], d).unsqueeze(-1)
        kl = mean_a.sum() - mean_b.sum()  # KL(P_a ‖ P_b) + KL(P_b ‖ P_a)
        g = lp  # log P is no longer needed: ∂loss/∂logits is built in its place
        torch.sub(d, mean_a - 1.0, out=g[:n]).mul_(p[:n]).sub_(p[n:])
        torch.sub(mean_b + 1.0, d, out=g[n:]).mul_(p[n:]).sub_(p[:n])
        g.mul_(alpha / 4).add_(p, alpha=0.5)  # + softmax / 2
        q = epsilon / n_classes
        g.sub_(q / 2)
        if exclude is not None:
            g[:, exclude] += q / 2
        g[torch.arange(2 * n, device=g.device), targets] -= (1.0 - epsilon) / 2
        ctx.save_for_backward(g)
        ctx.dtype = logits.dtype
        nll = -lp_y.sum() / 2
        ctx.mark_non_differentiable(nll)
        return ce / 2 + (alpha / 4) * kl, nll

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_loss, grad_nll):
        (g,) = ctx.saved_tensors
        return (g * grad_loss).to(ctx.dtype), None, None, None, None  # g intact for a retained graph


class _LinearLabelSmoothedCE(torch.autograd.Function):
    """Output projection and label-smoothed loss together, over chunks of rows.

    logits = (h Wᵀ) · scale + b are never stored whole: each (rows, V) chunk is formed, reduced to
    its loss terms and, when a gradient will be needed, at once turned into ∂loss/∂logits and
    multiplied out into ∂loss/∂h, ∂W and ∂b while it is still held (on the CPU: in cache); the
    backward then only scales those by the incoming gradient. Memory for the loss drops from O(N·V)
    to O(chunk·V), and the projection costs three matrix products, as with stored logits (the "cut
    cross-entropy" idea).
    The products run in ``dtype`` (float32, or autocast's bfloat16/float16); everything between
    them (softmax, loss terms, ∂logits) is float32. The rare backward through the summed NLL (never
    taken in training), or a second backward through a retained graph, recomputes the chunks.

    Each chunk takes few passes over its (rows, V) values, since on the CPU these passes cost as much
    as the products once the products run in bfloat16: one sum, one max, PyTorch's softmax in place
    (one kernel, faster than its own ``exp``), one more max for log Σ exp, and the target's −(1 − ε).
    The smoothing's uniform −q in ∂loss/∂logits is a rank-one term and is added once, at the end
    (``_Grads``). ``keep`` is None when every row is a target (the models pass real targets only).
    """

    @staticmethod
    def forward(ctx, h, weight, bias, target, keep, scale, epsilon, exclude, chunk, want_grads, dtype):
        n_classes = weight.size(0) - (exclude is not None)
        q = epsilon / n_classes
        lse = torch.empty(h.size(0), dtype=torch.float32, device=h.device)
        loss = torch.zeros((), dtype=torch.float32, device=h.device)
        nll = torch.zeros((), dtype=torch.float32, device=h.device)
        keep_f = None if keep is None else keep.float()
        grads = _Grads(h, weight, bias, dtype, q, exclude, keep_f) if want_grads else None
        w = weight.to(dtype) if grads is None else grads.weight  # converted once, not per chunk
        buffer = torch.empty(min(chunk, h.size(0)), weight.size(0), dtype=torch.float32, device=h.device)
        for i in range(0, h.size(0), chunk):
            hc = h[i : i + chunk].to(dtype)  # (rows, d_model), the products' dtype
            z = _chunk_logits(hc, w, bias, scale, buffer)  # (rows, V) float32
            t = target[i : i + chunk]
            k = None if keep_f is None else keep_f[i : i + chunk]
            z_y = z.gather(-1, t.unsqueeze(-1)).squeeze(-1)
            z_sum = z.sum(-1) - (z[:, exclude] if exclude is not None else 0.0)
            p, lse_c = _softmax_(z)  # z is overwritten
            nll_c = lse_c - z_y
            loss_c = nll_c + epsilon * (z_y - z_sum / n_classes)
            lse[i : i + chunk] = lse_c
            loss += loss_c.sum() if k is None else loss_c @ k
            nll += nll_c.sum() if k is None else nll_c @ k
            if grads is not None:  # z becomes softmax − (1 − ε)·onehot in place: ∂loss/∂logits + q
                g = _smoothed_grad(p, t, epsilon, 0.0, None)
                grads.add(i, g if k is None else g.mul_(k[:, None]), hc)
        ctx.save_for_backward(h, weight, bias, target, keep_f, lse)
        ctx.grads, ctx.scale, ctx.epsilon, ctx.exclude, ctx.chunk = grads, scale, epsilon, exclude, chunk
        ctx.n_classes, ctx.dtype = n_classes, dtype
        return loss, nll

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_loss, grad_nll):
        h, weight, bias, target, keep_f, lse = ctx.saved_tensors
        grads, ctx.grads = ctx.grads, None  # freed with this backward, as saved tensors are
        if grads is None or bool((grad_nll != 0).any()):  # recompute, the NLL's own gradient included
            grads = _Grads(h, weight, bias, ctx.dtype)
            eps, q = ctx.epsilon, ctx.epsilon / ctx.n_classes
            for i in range(0, h.size(0), ctx.chunk):
                t = target[i : i + ctx.chunk]
                k = 1.0 if keep_f is None else keep_f[i : i + ctx.chunk, None]
                hc = h[i : i + ctx.chunk].to(ctx.dtype)
                p = _chunk_logits(hc, grads.weight, bias, ctx.scale)
                p = p.sub_(lse[i : i + ctx.chunk, None]).exp_()  # softmax
                g = _smoothed_grad(p.clone(), t, eps, q, ctx.exclude).mul_(k * grad_loss)
                g += _smoothed_grad(p, t, 0.0, 0.0, None).mul_(k * grad_nll)  # softmax − onehot
                grads.add(i, g, hc)
            grad_loss = 1.0
        return (*grads.result(h, weight, bias, grad_loss, ctx.scale), *[None] * 8)


def _softmax_(z: Tensor) -> tuple[Tensor, Tensor]:
    """softmax(z) in place, and log Σ exp z per row. PyTorch's softmax kernel writes its output
    over its input safely (each element is read before it is written) and takes one cached pass
    per row; its largest output is exp(0) / Σ exp(z − max) exactly, so log Σ exp z = max − log of
    it, with no extra exponential pass (``torch.logsumexp`` makes a shifted copy and exponentiates).

    Shape:
        z: (rows, V) -> softmax (rows, V) (z itself), lse (rows,)
    """
    top = z.amax(-1)  # (rows,)
    p = torch.softmax(z, -1, out=z)
    return p, top - p.amax(-1).log()


def _smoothed_grad(p: Tensor, target: Tensor, epsilon: float, q: float, exclude: int | None) -> Tensor:
    """∂loss/∂logits of the label-smoothed loss, in place on the softmax ``p``: p − q everywhere
    (q = ε/V'), no smoothing mass on ``exclude``, and 1 − ε more taken off the target."""
    rows = torch.arange(target.size(0), device=p.device)
    if q:
        p.sub_(q)
        if exclude is not None:
            p[:, exclude] += q
    p[rows, target] -= 1.0 - epsilon
    return p


class _Grads:
    """∂h, ∂W and ∂b accumulated chunk by chunk from ∂logits (float32, cast back at the end); the
    products ∂logits·W and ∂logitsᵀ·h run in ``dtype``.

    With ``q``, the chunks come without the smoothing's −q on every column but ``exclude`` (of every
    kept row: ``keep``, None for all): that term is u·kᵀ with u the columns' indicator and k the
    rows', so its share of ∂h is −q·k (uᵀW), of ∂W −q·u (kᵀh) and of ∂b −q·u Σk; ``result`` adds
    them, and no pass over the chunks is spent on it."""

    def __init__(self, h, weight, bias, dtype, q: float = 0.0, exclude=None, keep: Tensor | None = None):
        self.dtype, self.q, self.exclude, self.keep = dtype, q, exclude, keep
        self.weight = weight.to(dtype)  # once, not per chunk
        self.h = torch.empty_like(h)
        self.w = torch.zeros_like(weight, dtype=torch.float32)
        self.b = None if bias is None else torch.zeros_like(bias, dtype=torch.float32)
        self.h_sum = torch.zeros(h.size(1), dtype=torch.float32, device=h.device)  # kᵀh

    def add(self, i: int, g: Tensor, hc: Tensor) -> None:
        """Rows i … i + len(g) of ∂logits (rows, V), with those rows of h in ``dtype`` (``hc``)."""
        if self.b is not None:
            self.b += g.sum(0)
        g = g.to(self.dtype)  # rounded as autocast rounds a layer's inputs (float32: no copy)
        self.h[i : i + g.size(0)] = (g @ self.weight).to(self.h.dtype)
        if self.dtype == torch.float32:
            self.w.addmm_(g.t(), hc)
        else:  # addmm_ wants one dtype: each chunk's ∂W is summed in float32
            self.w += g.t() @ hc
        if self.q:
            k = None if self.keep is None else self.keep[i : i + g.size(0)]
            self.h_sum += hc.float().sum(0) if k is None else k @ hc.float()

    def result(self, h: Tensor, weight: Tensor, bias: Tensor | None, factor, scale: float) -> tuple:
        """(∂h, ∂W, ∂b) times ``factor`` (the incoming gradient of the summed loss); ∂h and ∂W also
        times the logits' ``scale``."""
        if self.q:
            u = torch.ones(weight.size(0), dtype=torch.float32, device=h.device)  # (V,)
            if self.exclude is not None:
                u[self.exclude] = 0.0
            w_u = u @ self.weight.float()  # (d_model,) uᵀW
            k = torch.ones(h.size(0), device=h.device) if self.keep is None else self.keep
            self.h.addr_(k.to(self.h.dtype), w_u.to(self.h.dtype), alpha=-self.q)
            self.w.addr_(u, self.h_sum, alpha=-self.q)
            if self.b is not None:
                self.b.add_(u, alpha=-self.q * float(k.sum()))
        g_h, g_w = self.h * (factor * scale), (self.w * (factor * scale)).to(weight.dtype)
        return g_h, g_w, None if self.b is None else (self.b * factor).to(bias.dtype)


def _chunk_logits(h: Tensor, weight: Tensor, bias: Tensor | None, scale: float, out: Tensor | None = None):
    """(h Wᵀ) · scale + b in float32, written into ``out[:rows]`` when a buffer is given: the forward
    reuses one (chunk, V) buffer for every chunk, since allocating a fresh one each time made the loss
    measurably slower (docs/results.md has the figure).
    h and W share a dtype; a bfloat16/float16 product (accumulated in float32 by the kernel) is
    rounded to its dtype once, then widened."""
    out = None if out is None else out[: h.size(0)]
    if h.dtype == torch.float32:
        z = torch.mm(h, weight.t(), out=out)
    else:
        z = torch.mm(h, weight.t())
        z = z.float() if out is None else out.copy_(z)
    if scale != 1.0:
        z.mul_(scale)
    return z if bias is None else z.add_(bias.float())


# the float32 logits a chunk of linear_label_smoothed_nll_loss holds, per device type
CHUNK_BYTES = {"cpu": 8 << 20, "accelerator": 256 << 20}


def chunk_rows(device: str, vocab: int, chunk_bytes: int | None = None) -> int:
    """Rows per chunk of ``linear_label_smoothed_nll_loss`` on a ``device`` type: ``chunk_bytes`` of
    float32 logits (``CHUNK_BYTES`` of the device by default), at least 16."""
    chunk_bytes = chunk_bytes or CHUNK_BYTES.get(device, CHUNK_BYTES["accelerator"])
    return max(16, chunk_bytes // (4 * vocab))


def _autocast_dtype(device: str) -> torch.dtype:
    """The dtype autocast gives matrix products on ``device`` now; float32 where it is off. PyTorch
    asks per device from 2.4 on; before (the package accepts 2.1), for the CPU and CUDA apart."""
    if hasattr(torch, "get_autocast_dtype"):
        return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else torch.float32
    if device == "cpu":
        return torch.get_autocast_cpu_dtype() if torch.is_autocast_cpu_enabled() else torch.float32
    return torch.get_autocast_gpu_dtype() if torch.is_autocast_enabled() else torch.float32


def linear_label_smoothed_nll_loss(
    h: Tensor,
    weight: Tensor,
    target: Tensor,
    epsilon: float,
    bias: Tensor | None = None,
    scale: float = 1.0,
    ignore_index: int | None = None,
    smoothing_exclude: int | None = None,
    chunk_bytes: int | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """``label_smoothed_nll_loss((h Wᵀ)·scale + b, target, …)`` without materialising the logits.

    ``chunk_bytes`` bounds the float32 logits held at once; by default ``CHUNK_BYTES`` of ``h``'s
    device: a few MiB on the CPU, where a chunk that stays in cache is the point, and far more on a
    GPU, where each chunk costs a dozen kernel launches from Python and chunks of the CPU's size made
    the loss most of a step (docs/results.md, "Training speed on a GPU"). The three matrix products follow
    autocast, as an ``nn.Linear`` would: under bfloat16 autocast (``precision=bf16``) they take
    bfloat16 inputs, so each logit is rounded to within 2⁻⁸ of its size, as the logits of an autocast
    output layer are; the softmax, the loss and ∂logits stay float32. Outside autocast everything is
    float32. On CPUs with AVX512_BF16 the products are most of this loss's time, and bfloat16 ones
    run well ahead of float32 ones at the loss's shapes (docs/results.md, "The output layer's
    products in bfloat16 too", has the figures).

    Shape:
        h: (N, d_model), weight: (V, d_model), target: (N,) -> three scalars
    """
    keep = None if ignore_index is None else target != ignore_index
    chunk = chunk_rows(h.device.type, weight.size(0), chunk_bytes)
    tensors = (h, weight) if bias is None else (h, weight, bias)
    want_grads = torch.is_grad_enabled() and any(t.requires_grad for t in tensors)  # not in evaluation
    device = h.device.type
    dtype = _autocast_dtype(device)
    with torch.autocast(device, enabled=False):
        loss, nll = _LinearLabelSmoothedCE.apply(
            h, weight, bias, target.clamp(min=0), keep, scale, epsilon, smoothing_exclude, chunk, want_grads,
            dtype,
        )  # fmt: skip
    count = torch.tensor(target.numel(), device=target.device) if keep is None else keep.sum()
    return loss, nll, count
