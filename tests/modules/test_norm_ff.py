"""LayerNorm and the feed-forward network against torch.nn."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from aiayn.modules import FeedForward, LayerNorm
from tests.helpers import assert_close, copy_layer_norm


@pytest.mark.parametrize("explicit", [True, False], ids=["explicit", "fused"])
@pytest.mark.parametrize("d", [4, 512])
def test_layer_norm_matches_nn_layer_norm(d, explicit):
    ref = nn.LayerNorm(d)
    with torch.no_grad():
        ref.weight.normal_()
        ref.bias.normal_()
    ours = LayerNorm(d, explicit=explicit)
    copy_layer_norm(ours, ref)
    x = torch.randn(3, 5, d) * 3 + 1
    assert_close(f"LayerNorm[{'explicit' if explicit else 'fused'}] vs nn.LayerNorm", ours(x), ref(x))


def test_std_based_layer_norm_would_fail():
    """Tutorial pitfall: (x - mean) / (x.std() + eps) uses the unbiased std and eps outside the root."""
    x = torch.randn(8, 4)
    pitfall = (x - x.mean(-1, keepdim=True)) / (x.std(-1, keepdim=True) + 1e-6)
    ours = LayerNorm(4, explicit=True)(x)
    assert (ours - pitfall).abs().max() > 1e-2  # the difference our reference test would catch
    assert_close("LayerNorm vs F.layer_norm", ours, F.layer_norm(x, (4,)))


def test_layer_norm_eps_inside_the_square_root():
    x = torch.tensor([[1.0, 1.0 + 1e-3]])  # tiny variance: eps placement matters
    torch.testing.assert_close(LayerNorm(2, eps=1e-5, explicit=True)(x), F.layer_norm(x, (2,), eps=1e-5))


def test_layer_norm_without_bias_and_under_bf16():
    x = torch.randn(2, 16)
    assert LayerNorm(16, bias=False).bias is None
    y = LayerNorm(16, explicit=True)(x.bfloat16())
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y.float(), F.layer_norm(x.bfloat16().float(), (16,)), atol=2e-2, rtol=0)


# each activation by its paper's formula: ReLU; GELU x·Φ(x) and its tanh approximation (Hendrycks and
# Gimpel 2016; GPT-2's and BERT's "gelu_new"); SiLU x·σ(x) (Elfwing et al. 2017; Marian's "swish")
FORMULAS = {
    "relu": lambda h: h.clamp(min=0),
    "gelu": lambda h: 0.5 * h * (1 + torch.erf(h / math.sqrt(2))),
    "gelu_tanh": lambda h: 0.5 * h * (1 + torch.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h**3))),
    "silu": lambda h: h / (1 + torch.exp(-h)),
}


@pytest.mark.parametrize("activation", list(FORMULAS))
def test_feed_forward_is_two_linears_around_the_activation(activation):
    """Inputs wide enough (|xW1 + b1| up to ~10) that the two GELUs differ by up to 5e-4 (their
    difference peaks near 2.7): each one is told from the others at the tolerance used here."""
    ff = FeedForward(8, 32, activation=activation).double()
    x = 3 * torch.randn(2, 3, 8, dtype=torch.float64)
    h = x @ ff.w_1.weight.T + ff.w_1.bias
    expected = FORMULAS[activation](h) @ ff.w_2.weight.T + ff.w_2.bias
    assert_close(f"FeedForward({activation}) vs its formula", ff(x), expected, atol=1e-9)
    for other, formula in FORMULAS.items():
        if other != activation:
            assert not torch.allclose(ff(x), formula(h) @ ff.w_2.weight.T + ff.w_2.bias, atol=1e-6), other
    with pytest.raises(ValueError, match="activation='swish'"):
        FeedForward(8, 32, activation="swish")
