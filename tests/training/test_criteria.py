"""The translation objectives of ``aiayn.training.criteria`` against their formulas (the bidirectional
loss is tested beside the model, tests/models/test_bidirectional.py)."""

import torch
import torch.nn.functional as F

from aiayn import Transformer, TransformerConfig
from aiayn.data.batching import TranslationBatch
from aiayn.training import criteria
from tests.helpers import assert_close


def _transformer(**kw) -> Transformer:
    cfg = TransformerConfig(src_vocab_size=50, tgt_vocab_size=50, n_encoder_layers=2, n_decoder_layers=2,
                            d_model=32, n_heads=4, d_ff=64, **{"dropout": 0.0, **kw})  # fmt: skip
    return Transformer(cfg)


def _batch() -> TranslationBatch:
    torch.manual_seed(0)
    src, tgt = torch.randint(4, 50, (3, 6)), torch.randint(4, 50, (3, 5))
    tgt[0, 3:] = 0  # padding
    targets = torch.cat([tgt[:, 1:], torch.full((3, 1), 0)], 1)
    return TranslationBatch(src, tgt, targets)


def test_label_smoothed_loss_is_cross_entropy_at_the_real_targets():
    model, b = _transformer().eval(), _batch()
    loss, nll, n = criteria.label_smoothed_loss(model, b, 0.1)
    logits, real = model(b.src, b.tgt_in), b.tgt_out != 0
    # the smoothing mass spreads over every class but padding (fairseq's and the paper's ε_ls)
    lprobs = logits[real].log_softmax(-1)
    ref_nll = F.nll_loss(lprobs, b.tgt_out[real], reduction="sum")
    smooth = -(lprobs[:, 1:].sum(-1)).sum() / 49
    assert_close("NLL at the real targets", nll, ref_nll, atol=1e-4)
    assert_close("label-smoothed loss", loss, 0.9 * ref_nll + 0.1 * smooth, atol=1e-4)
    assert int(n) == int(real.sum())


def test_r_drop_runs_the_batch_twice_through_different_dropout_masks():
    b = _batch()
    model = _transformer().train()  # dropout 0: both passes equal, no consistency term
    assert_close("R-Drop without dropout vs the plain loss", criteria.r_drop_loss(model, b, 0.0, 5.0).loss,
                 criteria.label_smoothed_loss(model, b, 0.0).loss)  # fmt: skip
    model = _transformer(dropout=0.3).train()
    losses = []
    for alpha in (1e-9, 1.0, 2.0):  # the same masks each time: the loss is linear in α
        torch.manual_seed(1)
        losses.append(criteria.r_drop_loss(model, b, 0.1, alpha).loss)
    kl_term = losses[1] - losses[0]
    assert kl_term > 1e-3  # two different masks
    assert_close("the KL term doubles with α", losses[2] - losses[0], 2 * kl_term)
