"""Config validation: every failure names the field, the value and the fix."""

import pytest

from aiayn.models.config import EncoderConfig, LMConfig, TransformerConfig


def test_defaults_are_the_paper_base_model():
    c = TransformerConfig()
    assert (c.n_encoder_layers, c.n_decoder_layers, c.d_model, c.n_heads, c.d_ff) == (6, 6, 512, 8, 2048)
    assert (c.dropout, c.norm_first, c.positional, c.emb_scale) == (0.1, False, "sinusoidal", "emb")
    assert c.share_embeddings and c.tie_output


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"d_model": 510}, r"TransformerConfig.d_model=510 must be divisible by n_heads=8; choose"),
        ({"n_heads": 0}, r"n_heads=0 must be a positive integer; set n_heads"),
        ({"d_ff": 2.5}, r"d_ff=2.5 must be a positive integer"),
        ({"dropout": 1.0}, r"dropout=1.0 must be in \[0, 1\); set dropout"),
        ({"attn_dropout": -0.1}, r"attn_dropout=-0.1 must be in \[0, 1\)"),
        ({"activation": "swish"}, r"activation='swish' is not one of \('relu', 'gelu', 'gelu_tanh', 'silu"),
        ({"positional": "rope"}, r"positional='rope' is not one of"),
        ({"emb_scale": "yes"}, r"emb_scale='yes' is not one of"),
        ({"d_model": 9, "n_heads": 3}, r"d_model=9 is odd; sinusoidal positions need an even d_model"),
        ({"src_vocab_size": 100}, r"share_embeddings=True needs src_vocab_size == tgt_vocab_size"),
        ({"pad_id": 2}, r"pad_id=2 equals eos_id=2; give padding its own id"),
        ({"unk_id": 0}, r"pad_id=0 equals unk_id=0; give padding its own id"),
        ({"src_vocab_size": 3, "tgt_vocab_size": 3}, r"unk_id=3 is outside the vocabulary"),
        ({"n_decoder_layers": 0}, r"n_decoder_layers=0 must be a positive integer"),
        ({"ln_eps": 0.0}, r"ln_eps=0.0 must be a positive float"),
        (
            {"bidirectional": True, "bos_id": 0},
            r"pad_id=0 equals bos_id=0 with bidirectional=True: the right",
        ),
    ],
)
def test_invalid_values_raise_naming_field_value_and_fix(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TransformerConfig(**kwargs)


def test_free_d_k_allows_indivisible_width_and_odd_width_with_learned_positions():
    TransformerConfig(d_model=510, d_k=64, d_v=64)
    LMConfig(d_model=9, n_heads=3, positional="learned", vocab_size=20)


def test_other_configs_validate_their_own_fields():
    with pytest.raises(ValueError, match="EncoderConfig.n_classes=-1"):
        EncoderConfig(n_classes=-1)
    with pytest.raises(ValueError, match="LMConfig.n_layers=0"):
        LMConfig(n_layers=0)
    with pytest.raises(ValueError, match=r"EncoderConfig.pad_id=0 equals bos_id=0: the padding mask"):
        EncoderConfig(bos_id=0, unk_id=3)
    TransformerConfig(bos_id=0)  # a decoder may start from pad (Marian's decoder_start_token_id)


def test_round_trip_and_unknown_keys():
    c = TransformerConfig(d_model=64, n_heads=2, src_vocab_size=50, tgt_vocab_size=50)
    assert TransformerConfig.from_dict(c.to_dict()) == c
    with pytest.raises(ValueError, match=r"unknown field\(s\) \['d_modle'\]"):
        TransformerConfig.from_dict({"d_modle": 64})
