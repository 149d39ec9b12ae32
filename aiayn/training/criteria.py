"""The training objectives, kept apart from the models as fairseq keeps its criterions.

Each function takes a model (the bare model: the loop wraps the task's objective, never the model
itself, so any method of the model may be called here), a batch and ε_ls, and returns ``LossSums``:
the summed training loss, the summed NLL and the number of targets, with the output projection and
the softmax computed at the scored positions only (``OutputProjection.loss``, the fused projection
+ loss). The loop divides by the number of targets of the whole update.

Translation (no smoothing mass on padding):

- ``label_smoothed_loss``: the paper's (§5.4);
- ``r_drop_loss``: R-Drop (Liang et al. 2021): the batch runs twice, through two dropout masks, and
  the loss adds α · ½ (KL(P_a‖P_b) + KL(P_b‖P_a)) (``OutputProjection.r_drop_loss``);
- ``bidirectional_loss``: L_l2r + λ · L_r2l of a ``BidirectionalTransformer`` (Zhang et al. 2018);
  the left-to-right decoder's memory is the states of a cached right-to-left translation
  (``cached_memory_input``, Su et al. 2019), of the right-to-left decoder's own greedy translation
  (``greedy_memory_input``, decoded in the step) or of the reversed reference.

The other tasks: ``next_token_loss`` (a language model, every position), ``masked_lm_loss`` (BERT's,
at the chosen positions only), ``replaced_token_loss`` (ELECTRA's discriminator, every real
position), ``classification_loss`` (the pooled classifier, class-weighted) and its R-Drop,
``classification_r_drop_loss``, its mixup of pooled vectors, ``classification_mixup_loss``, and its
adversarial training on the embedded input, ``classification_adversarial_loss``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from aiayn.data.batching import (
    ClassifyBatch,
    LMBatch,
    MaskedBatch,
    TranslationBatch,
    reverse_targets,
)
from aiayn.data.replacing import DetectionBatch
from aiayn.decoding.bidirectional import memory_limits, memory_search, r2l_translation
from aiayn.models import BidirectionalTransformer, EncoderModel, LanguageModel, R2LMemory, Transformer
from aiayn.modules.embedding import OutputProjection
from aiayn.modules.loss import r_drop_loss as r_drop_loss_of_logits


class LossSums(NamedTuple):
    """Sums over the real targets of a batch (the loop normalises by the update's target count)."""

    loss: Tensor  # the training loss (label-smoothed, plus any extra term)
    nll: Tensor  # the negative log-likelihood, for perplexity
    n: Tensor  # the number of real targets


def smoothed_sums(
    head: OutputProjection, h: Tensor, targets: Tensor, epsilon: float, pad_id: int
) -> LossSums:
    """The label-smoothed loss of ``head(h)`` at the positions whose target is not ``pad_id``.

    Shape: h (B, T, d_model), targets (B, T) -> three scalars
    """
    real = targets != pad_id  # (B, T)
    return LossSums(*head.loss(h[real], targets[real], epsilon, smoothing_exclude=pad_id))


def label_smoothed_loss(model: Transformer, batch: TranslationBatch, epsilon: float) -> LossSums:
    """The paper's loss: label-smoothed cross-entropy of the teacher-forced decoder."""
    h = model.hidden(batch.src, batch.tgt_in)  # (B, T, d_model)
    return smoothed_sums(model.head, h, batch.tgt_out, epsilon, model.config.pad_id)


def r_drop_loss(model: Transformer, batch: TranslationBatch, epsilon: float, alpha: float) -> LossSums:
    """R-Drop's loss: the batch twice (one (2B, ·) pass, so two dropout masks), the two passes'
    label-smoothed losses plus α times their symmetric KL; the loss and NLL are per pass, as without
    it. In evaluation (no dropout) both passes are equal: use ``label_smoothed_loss`` there."""
    src, tgt_in, tgt_out = (t.repeat(2, 1) for t in batch[:3])  # (2B, ·): the first pass's rows first
    h = model.hidden(src, tgt_in)  # (2B, T, d_model)
    pad = model.config.pad_id
    real = tgt_out != pad
    h_a, h_b = h[real].chunk(2)  # (N, d_model) each
    return LossSums(*model.head.r_drop_loss(h_a, h_b, tgt_out[real][: len(h_a)], epsilon, alpha,
                                            smoothing_exclude=pad))  # fmt: skip


def bidirectional_loss(
    model: BidirectionalTransformer,
    batch: TranslationBatch,
    epsilon: float,
    r2l_weight: float = 1.0,
    memory: R2LMemory | None = None,
    r2l_target: str = "reference",
) -> tuple[LossSums, LossSums]:
    """L = L_l2r + r2l_weight · L_r2l, and the right-to-left decoder's own sums (for its NLL).

    The right-to-left decoder is teacher-forced on ``[bos] +`` its target and learns ``target +
    [eos]``: the reversed reference (``r2l_target="reference"``, ``reverse_targets``) or the batch's
    cached right-to-left translation (``"pseudo"``: ``batch.r2l``, Su et al. 2019). The left-to-right
    decoder reads the states of ``memory.tgt`` or, without it, those of that same pass
    (``BidirectionalTransformer.hidden``); with ``memory.frozen`` the right-to-left pass has no loss
    (its sums are zero) and no gradient.
    """
    pad = model.config.pad_id
    if r2l_target == "pseudo":
        r2l_in, r2l_out = cached_memory_input(batch, model.config), batch.r2l
    else:
        r2l_in, r2l_out = reverse_targets(batch.tgt_out)  # (B, T) each
    out = model.hidden(batch.src, batch.tgt_in, r2l_in, memory)
    l2r = smoothed_sums(model.head, out.l2r, batch.tgt_out, epsilon, pad)
    if memory is not None and memory.frozen:  # nothing to learn there: no right-to-left projection
        return l2r, LossSums(*(torch.zeros((), device=l2r.loss.device),) * 3)
    r2l = smoothed_sums(model.head, out.r2l, r2l_out, epsilon, pad)
    return LossSums(l2r.loss + r2l_weight * r2l.loss, l2r.nll, l2r.n), r2l


def shifted_input(tgt_out: Tensor, bos_id: int, eos_id: int, pad_id: int) -> Tensor:
    """A decoder's input for its targets ``tokens + [eos]`` (padded): ``[bos] + tokens``, padded alike.

    Shape: tgt_out (B, T) -> (B, T)
    """
    shifted = torch.cat([torch.full_like(tgt_out[:, :1], bos_id), tgt_out[:, :-1]], 1)
    return shifted.masked_fill(shifted == eos_id, pad_id)


def cached_memory_input(batch: TranslationBatch, config) -> Tensor:
    """``[bos] +`` the batch's cached right-to-left translation: the memory ``r2l_memory_from="cache"``
    reads. Shape: batch.r2l (B, T') -> (B, T')"""
    return shifted_input(batch.r2l, config.bos_id, config.eos_id, config.pad_id)


@torch.compiler.disable  # a search loop: never traced, whatever wraps the objective
def greedy_memory_input(model: BidirectionalTransformer, src: Tensor) -> Tensor:
    """``[bos] +`` the right-to-left decoder's greedy translation of ``src`` (no dropout, no gradient;
    ``memory_search`` and ``memory_limits``, so at most the source's length + ``R2L_MARGIN`` tokens,
    and no more than learned positions allow): the sequence whose states the left-to-right decoder
    reads at decoding time with ``r2l_beam=1`` (a wider backward beam reads a better translation).

    Shape: src (B, S) -> (B, 1 + longest translation)
    """
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            limit = memory_limits(src, model.config.pad_id)  # (B,)
            _, r2l_in = r2l_translation(model, src, model.context(src), memory_search(1), limit)
    finally:
        model.train(was_training)
    return r2l_in


def next_token_loss(model: LanguageModel, batch: LMBatch, epsilon: float) -> LossSums:
    """A language model's label-smoothed loss at every position (the smoothing mass spread over the
    whole vocabulary). Shape: ids, targets (B, T) -> three scalars"""
    h = model.hidden(batch.ids)[0]  # (B, T, d_model)
    return LossSums(*model.head.loss(h.flatten(0, 1), batch.targets.flatten(), epsilon))


def masked_lm_loss(model: EncoderModel, batch: MaskedBatch, epsilon: float) -> LossSums:
    """BERT's loss: only the chosen positions (``targets`` not ``pad_id``) go through the vocabulary
    projection (after BERT's transform, if the model has one). Shape: ids, targets (B, T) -> three scalars"""
    return _encoder_loss(model, batch.ids, batch.targets, epsilon)


def causal_encoder_loss(model: EncoderModel, batch: LMBatch, epsilon: float) -> LossSums:
    """A causal encoder's next-piece loss at every position whose target is not padding (the
    smoothing mass spread over the whole vocabulary). Shape: ids, targets (B, T) -> three scalars"""
    return _encoder_loss(model, batch.ids, batch.targets, epsilon)


def _encoder_loss(model: EncoderModel, ids: Tensor, targets: Tensor, epsilon: float) -> LossSums:
    """The vocabulary loss at the positions whose target is not padding; only those states go through
    the projection. Shape: ids, targets (B, T) -> three scalars"""
    h = model.encode(ids)[0]  # (B, T, d_model)
    chosen = targets != model.config.pad_id  # (B, T)
    return LossSums(*model.head.loss(model.token_states(h[chosen]), targets[chosen], epsilon))


def replaced_token_loss(model: EncoderModel, batch: DetectionBatch, epsilon: float) -> LossSums:
    """ELECTRA's discriminator loss: binary cross-entropy of "replaced" at every scored position
    (labels ≥ 0), its targets smoothed towards 1/2 by ``epsilon``.
    Shape: ids, labels (B, T) -> three scalars"""
    scored = batch.labels >= 0  # (B, T)
    logits = model.detect(batch.ids)[scored].float()  # (N,)
    y = batch.labels[scored].to(logits.dtype)
    loss = F.binary_cross_entropy_with_logits(logits, y * (1 - epsilon) + epsilon / 2, reduction="sum")
    nll = F.binary_cross_entropy_with_logits(logits.detach(), y, reduction="sum")
    return LossSums(loss, nll, scored.sum())


def _weighted_cross_entropy(
    logits: Tensor, labels: Tensor, epsilon: float, class_weight: Tensor | None
) -> Tensor:
    """Σ_n w[y_n] · CE_ε(logits_n, y_n): each text's label-smoothed loss weighed by its own class's
    weight. ``F.cross_entropy(weight=w, label_smoothing=ε)`` would weigh the smoothing term of every
    class c by w[c] instead, pushing a frequent class's texts towards the rare classes' (with the
    weights of a 90/10 split, to p(rare) = 0.32 at the optimum, not ε/2). Shape: (B, C), (B,) -> ()"""
    per_text = F.cross_entropy(logits, labels, reduction="none", label_smoothing=epsilon)  # (B,)
    return (per_text if class_weight is None else per_text * class_weight[labels]).sum()


def classification_loss(
    model: EncoderModel, batch: ClassifyBatch, epsilon: float, class_weight: Tensor | None = None
) -> LossSums:
    """Cross-entropy of the pooled classifier's logits; ``class_weight`` (n_classes,) weighs each
    text's loss by its class (``_weighted_cross_entropy``), not the NLL.
    Shape: ids (B, T), labels (B,) -> three scalars"""
    logits = model.classify(batch.ids).float()  # (B, n_classes)
    loss = _weighted_cross_entropy(logits, batch.labels, epsilon, class_weight)
    nll = F.cross_entropy(logits.detach(), batch.labels, reduction="sum")
    return LossSums(loss, nll, batch.labels.new_tensor(batch.labels.numel()))


def classification_mixup_loss(
    model: EncoderModel, batch: ClassifyBatch, epsilon: float, alpha: float
) -> LossSums:
    """Mixup of the pooled sentence vectors (senMixup, Guo et al. 2019; Zhang et al. 2018): with
    λ ~ Beta(α, α) and a permutation π of the batch, the classifier reads λ·h_i + (1 − λ)·h_π(i)
    and the loss is λ·CE(y_i) + (1 − λ)·CE(y_π(i)) (the NLL likewise, without smoothing). λ and π
    come from torch's generator, so a resumed run draws the same. Training only.
    Shape: ids (B, T), labels (B,) -> three scalars"""
    lam = float(torch.distributions.Beta(alpha, alpha).sample())
    perm = torch.randperm(len(batch.labels)).to(batch.ids.device)
    pooled = model.pool(batch.ids, model.encode(batch.ids)[0])  # (B, d_model)
    logits = model.classifier(lam * pooled + (1 - lam) * pooled[perm]).float()  # (B, n_classes)
    y, y_perm = batch.labels, batch.labels[perm]
    ce = lambda target, s: F.cross_entropy(logits, target, reduction="sum", label_smoothing=s)  # noqa: E731
    loss = lam * ce(y, epsilon) + (1 - lam) * ce(y_perm, epsilon)
    with torch.no_grad():
        nll = lam * ce(y, 0.0) + (1 - lam) * ce(y_perm, 0.0)
    return LossSums(loss, nll, y.new_tensor(y.numel()))


def classification_r_drop_loss(
    model: EncoderModel, batch: ClassifyBatch, epsilon: float, alpha: float
) -> LossSums:
    """R-Drop for the classifier: the batch twice in one (2B, T) pass (two dropout masks), the two
    passes' label-smoothed losses plus α times their symmetric KL, per pass as without it
    (``aiayn.modules.loss.r_drop_loss``). Training only: in evaluation both passes are equal."""
    logits_a, logits_b = model.classify(batch.ids.repeat(2, 1)).chunk(2)  # (B, n_classes) each
    return LossSums(*r_drop_loss_of_logits(logits_a, logits_b, batch.labels, epsilon, alpha))


def classification_adversarial_loss(
    model: EncoderModel,
    batch: ClassifyBatch,
    epsilon: float,
    radius: float,
    class_weight: Tensor | None = None,
) -> LossSums:
    """Adversarial training (Miyato et al. 2017, "Adversarial training methods for semi-supervised
    text classification"; Goodfellow et al. 2015's fast gradient method on embeddings): with x the
    embedded input and g_i = ∂L/∂x_i each text's gradient of the loss, the loss adds the loss at
    x_i + r_i, r_i = radius · g_i / ‖g_i‖₂ (the norm over the text's T × d_model values), the step that
    raises the loss most to first order; r is a constant (no gradient through it). The NLL is the
    clean pass's. Costs a backward pass to x and a second forward per update. Training only.
    Shape: ids (B, T), labels (B,) -> three scalars"""
    ce = lambda logits, s: _weighted_cross_entropy(logits, batch.labels, s, class_weight)  # noqa: E731
    x = model.embed(batch.ids)  # (B, T, d_model)
    logits = model.classify(batch.ids, embedded=x).float()  # (B, n_classes)
    loss = ce(logits, epsilon)
    (g,) = torch.autograd.grad(loss, x, retain_graph=True)  # (B, T, d_model)
    norm = g.float().flatten(1).norm(dim=1).clamp(min=1e-12)  # (B,)
    r = (radius * g.float() / norm[:, None, None]).to(x.dtype)
    adversarial = model.classify(batch.ids, embedded=x + r).float()
    nll = F.cross_entropy(logits.detach(), batch.labels, reduction="sum")
    return LossSums(loss + ce(adversarial, epsilon), nll, batch.labels.new_tensor(batch.labels.numel()))
