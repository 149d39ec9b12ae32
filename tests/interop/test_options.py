"""The module options interop added: Marian's sinusoid layout and SiLU, against transformers."""

import torch

from aiayn.interop.marian import halves_permutation
from aiayn.modules import FeedForward, PositionalEncoding
from aiayn.modules.embedding import sinusoidal_table
from tests.helpers import assert_close
from tests.interop.hf_builders import transformers


def test_sinusoidal_halves_is_marians_table():
    hf = transformers.models.marian.modeling_marian.MarianSinusoidalPositionalEmbedding(300, 64)
    ref = hf.create_weight()
    assert_close(
        "sinusoidal_halves vs MarianSinusoidalPositionalEmbedding", sinusoidal_table(300, 64, True), ref
    )
    pe = PositionalEncoding(64, max_len=8, halves=True)  # grows in the same layout
    assert_close("sinusoidal_halves (grown) vs Marian", pe(torch.zeros(1, 300, 64))[0], ref)


def test_halves_are_a_permutation_of_the_paper_layout():
    perm = halves_permutation(16)
    assert torch.equal(sinusoidal_table(50, 16)[:, perm], sinusoidal_table(50, 16, halves=True))


def test_silu_is_hf_swish():
    ff = FeedForward(8, 16, activation="silu")
    x = torch.randn(2, 3, 8)
    ref = ff.w_2(transformers.activations.ACT2FN["swish"](ff.w_1(x)))
    assert_close("FeedForward(silu) vs transformers ACT2FN['swish']", ff(x), ref, atol=1e-6)
