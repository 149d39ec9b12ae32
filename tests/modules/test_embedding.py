"""Positional encodings and token embeddings against hand-computed values; an output layer that scores
some pieces against nn.Linear and F.cross_entropy."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from aiayn.errors import ConfigError
from aiayn.modules import (
    LearnedPositionalEmbedding,
    PositionalEncoding,
    TokenEmbedding,
    TransformerEmbedding,
)
from aiayn.modules import dropout as dropout_module
from aiayn.modules.embedding import OutputProjection, sinusoidal_table
from tests.helpers import assert_close


def test_sinusoidal_layout_is_interleaved_sin_cos_as_in_the_paper():
    """Tutorial pitfall: sin on the first half and cos on the second half is a different layout."""
    d = 16
    table = sinusoidal_table(50, d)
    expected = torch.tensor(
        [
            [(math.sin if i % 2 == 0 else math.cos)(pos / 10000 ** ((i - i % 2) / d)) for i in range(d)]
            for pos in range(50)
        ]
    )
    assert_close("PositionalEncoding vs math.sin/math.cos by hand", table, expected)
    assert table[0, 0::2].abs().max() == 0 and (table[0, 1::2] == 1).all()


def test_large_positions_are_exact():
    table = sinusoidal_table(5001, 8)
    assert abs(table[5000, 0].item() - math.sin(5000)) < 1e-6


def test_positional_encoding_adds_offset_positions_and_grows():
    pe = PositionalEncoding(8, max_len=4)
    x = torch.zeros(2, 3, 8)
    torch.testing.assert_close(pe(x, start=2)[0], sinusoidal_table(5, 8)[2:5])
    y = pe(torch.zeros(1, 10, 8))  # past max_len: the table grows
    torch.testing.assert_close(y[0], sinusoidal_table(10, 8))
    assert pe.pe.size(0) >= 10 and "pe" not in pe.state_dict()


def test_odd_d_model_is_a_clear_error():
    with pytest.raises(ValueError, match="even d_model, got 7"):
        PositionalEncoding(7)


def test_learned_positions_raise_past_max_len():
    pe = LearnedPositionalEmbedding(8, max_len=4)
    x = torch.zeros(1, 3, 8)
    torch.testing.assert_close(pe(x, start=1)[0], pe.weight[1:4].detach())
    with pytest.raises(ValueError, match="max_len=4"):
        pe(x, start=2)


def test_embeddings_are_scaled_by_sqrt_d_model():
    """Tutorial pitfall: forgetting × √d_model leaves embeddings tiny next to the positions."""
    emb = TokenEmbedding(10, 64, pad_id=0, scale="emb")
    ids = torch.tensor([[1, 2, 0]])
    assert_close("TokenEmbedding vs E[ids]·√d_model", emb(ids), emb.weight[ids] * 8.0)
    assert (emb(ids)[0, 2] == 0).all()  # padding row
    none = TokenEmbedding(10, 64, scale="none")
    torch.testing.assert_close(none(ids), none.weight[ids])
    with pytest.raises(ValueError, match="emb_scale='sqrt'"):
        TokenEmbedding(10, 64, scale="sqrt")


def test_transformer_embedding_is_scaled_tokens_plus_positions():
    emb = TransformerEmbedding(10, 8, dropout=0.0)
    ids = torch.tensor([[4, 5, 6]])
    expected = emb.tokens.weight[ids] * math.sqrt(8) + sinusoidal_table(3, 8)
    assert_close("TransformerEmbedding vs E·√d + PE by hand", emb(ids), expected)


def test_embedding_dropout_applies_to_the_sum_of_tokens_and_positions(monkeypatch):
    """§5.4: "we apply dropout to the sums of the embeddings and the positional encodings" (every
    mask made a constant 0.5 here, so that where it applies shows)."""
    monkeypatch.setattr(dropout_module, "_scaled_mask", lambda x, p: torch.full_like(x, 0.5))
    emb = TransformerEmbedding(10, 8, dropout=0.1).train()
    ids = torch.tensor([[4, 5, 6]])
    expected = 0.5 * (emb.tokens.weight[ids] * math.sqrt(8) + sinusoidal_table(3, 8))
    assert_close("TransformerEmbedding dropout vs 0.5·(E·√d + PE)", emb(ids), expected)


def test_grown_table_keeps_the_module_dtype():
    pe = PositionalEncoding(8, max_len=4).to(torch.bfloat16)
    assert pe(torch.zeros(1, 10, 8, dtype=torch.bfloat16)).dtype == torch.bfloat16
    assert pe.pe.dtype == torch.bfloat16 and pe.pe.size(0) >= 10


def _pieces_head(bias: bool, scale: float = 1.0) -> tuple[OutputProjection, torch.Tensor]:
    torch.manual_seed(0)
    head = OutputProjection(8, 30, bias=bias, scale=scale, n_pieces=12, fallback=3)
    nn.init.normal_(head.proj.weight)
    if bias:
        nn.init.normal_(head.bias)
    pieces = torch.tensor([2, 3, 5, 7, 8, 11, 13, 17, 19, 23, 24, 29])
    head.set_pieces(pieces.flip(0))  # any order: kept sorted
    return head, pieces


@pytest.mark.parametrize(("bias", "scale"), [(False, 1.0), (True, 0.5)])
def test_output_pieces_score_like_a_linear_layer_on_those_rows(bias, scale):
    head, pieces = _pieces_head(bias, scale)
    ref = nn.Linear(8, 30, bias=bias)  # the plain layer these rows come from
    with torch.no_grad():
        ref.weight.copy_(head.proj.weight * scale)
        if bias:
            ref.bias.copy_(head.bias)
    h = torch.randn(2, 5, 8)
    logits = head(h)
    assert torch.equal(head.pieces, pieces)
    assert_close("pieces' logits vs nn.Linear", logits[..., pieces], ref(h)[..., pieces])
    others = torch.ones(30, dtype=torch.bool)
    others[pieces] = False
    assert torch.isneginf(logits[..., others]).all()  # probability 0
    assert_close("softmax over the pieces", logits.softmax(-1)[..., pieces], ref(h)[..., pieces].softmax(-1))
    full = nn.Linear(8, 30)  # the exporters' form: the whole matrix with full_bias
    with torch.no_grad():
        full.weight.copy_(ref.weight)
        full.bias.copy_(head.full_bias())
    torch.testing.assert_close(full(h).softmax(-1), logits.softmax(-1))


@pytest.mark.parametrize("bias", [False, True])
def test_output_pieces_loss_is_cross_entropy_over_the_pieces(bias):
    head, pieces = _pieces_head(bias)
    h = torch.randn(7, 8, requires_grad=True)
    target = torch.tensor([2, 29, 13, 4, 0, 24, 5])  # 4 and 0 are no pieces: they count as unk (3)
    column = torch.tensor([0, 11, 6, 1, 1, 10, 2])  # their columns among the sorted pieces
    loss, nll, n = head.loss(h, target, 0.1, smoothing_exclude=0)
    g_h, g_w = torch.autograd.grad(loss, (h, head.proj.weight))

    h_ref = h.detach().clone().requires_grad_()
    w_ref = head.proj.weight.detach().clone().requires_grad_()
    z = h_ref @ w_ref[pieces].t() + (head.bias.detach()[pieces] if bias else 0.0)
    ref = F.cross_entropy(z, column, label_smoothing=0.1, reduction="sum")  # ε over the 12 pieces
    r_h, r_w = torch.autograd.grad(ref, (h_ref, w_ref))
    assert_close("loss over the pieces vs F.cross_entropy", loss, ref, atol=1e-4)
    assert_close("NLL over the pieces", nll, F.cross_entropy(z, column, reduction="sum"), atol=1e-4)
    assert n == 7
    assert_close("∂h", g_h, r_h)
    assert_close("∂W (rows outside the pieces get none)", g_w, r_w)
    assert (g_w.abs().sum(1) > 0).sum() == len(pieces)


def test_set_pieces_says_what_is_wrong():
    head = OutputProjection(8, 30, n_pieces=4, fallback=3)
    for ids, message in (([3, 4, 5], "got 3 distinct ids; .* built for 4"), ([3, 4, 5, 30], r"\[0, 30\)"),
                         ([4, 5, 6, 7], "fallback id 3")):  # fmt: skip
        with pytest.raises(ConfigError, match=message):
            head.set_pieces(torch.tensor(ids))
    with pytest.raises(ConfigError, match="built for 0"):
        OutputProjection(8, 30).set_pieces(torch.tensor([3]))


@pytest.mark.parametrize(("bias", "scale"), [(False, 1.0), (True, 0.5)])
def test_r_drop_loss_spans_the_pieces_as_the_plain_loss_does(bias, scale):
    head, pieces = _pieces_head(bias, scale)
    h_a, h_b = torch.randn(7, 8), torch.randn(7, 8)
    target = torch.tensor([2, 29, 13, 4, 0, 24, 5])  # 4 and 0 are no pieces: they count as unk (3)
    column = torch.tensor([0, 11, 6, 1, 1, 10, 2])
    loss, nll, n = head.r_drop_loss(h_a, h_b, target, 0.1, alpha=2.0, smoothing_exclude=0)
    z_a, z_b = head(h_a)[:, pieces], head(h_b)[:, pieces]  # checked against nn.Linear above
    ce = [F.cross_entropy(z, column, label_smoothing=0.1, reduction="sum") for z in (z_a, z_b)]
    kl = [F.kl_div(q.log_softmax(-1), p.log_softmax(-1), log_target=True, reduction="sum")
          for p, q in ((z_a, z_b), (z_b, z_a))]  # fmt: skip
    assert_close("R-Drop over the pieces", loss, (ce[0] + ce[1] + 2.0 * 0.5 * (kl[0] + kl[1])) / 2, atol=1e-4)
    plain = [head.loss(h, target, 0.1, smoothing_exclude=0)[1] for h in (h_a, h_b)]
    assert_close("R-Drop NLL vs the plain loss's", nll, (plain[0] + plain[1]) / 2, atol=1e-4)
    assert n == 7
