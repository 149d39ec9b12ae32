"""LayerNorm and the feed-forward network against torch.nn."""

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


@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_feed_forward_is_two_linears_around_the_activation(activation):
    ff = FeedForward(8, 32, activation=activation)
    x = torch.randn(2, 3, 8)
    act = F.relu if activation == "relu" else F.gelu
    expected = act(x @ ff.w_1.weight.T + ff.w_1.bias) @ ff.w_2.weight.T + ff.w_2.bias
    assert_close(f"FeedForward({activation}) vs max(0, xW1+b1)W2+b2", ff(x), expected)
    with pytest.raises(ValueError, match="activation='swish'"):
        FeedForward(8, 32, activation="swish")
