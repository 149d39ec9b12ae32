"""Positional encodings and token embeddings against hand-computed values."""

import math

import pytest
import torch

from aiayn.modules import (
    LearnedPositionalEmbedding,
    PositionalEncoding,
    TokenEmbedding,
    TransformerEmbedding,
)
from aiayn.modules.embedding import sinusoidal_table
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


def test_grown_table_keeps_the_module_dtype():
    pe = PositionalEncoding(8, max_len=4).to(torch.bfloat16)
    assert pe(torch.zeros(1, 10, 8, dtype=torch.bfloat16)).dtype == torch.bfloat16
    assert pe.pe.dtype == torch.bfloat16 and pe.pe.size(0) >= 10
