"""Dropout: the CPU uniform-mask path keeps nn.Dropout's semantics (§5.4)."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from aiayn.modules.dropout import Dropout, dropout

P = 0.3


def test_survivors_are_scaled_and_the_keep_rate_is_one_minus_p():
    torch.manual_seed(0)
    x = torch.rand(1000, 1000) + 0.5  # no zeros of its own
    y = dropout(x, P)
    kept = y != 0
    torch.testing.assert_close(y[kept], x[kept] / (1 - P), rtol=1e-6, atol=0)
    # 10^6 Bernoulli(0.7) draws: standard deviation of the rate ≈ 4.6e-4
    assert abs(kept.float().mean().item() - (1 - P)) < 3e-3
    # the expected value is unchanged, as with F.dropout
    ref = F.dropout(x, P, training=True)
    assert abs(y.mean().item() - x.mean().item()) < 5e-3
    assert abs(ref.mean().item() - x.mean().item()) < 5e-3


@pytest.mark.parametrize("p", [0.001, 0.1, 0.5, 0.999], ids=["float-uniforms", "15-bit", "half", "near-one"])
def test_keep_rate_holds_in_every_lane_of_the_64_bit_draws(p):
    """Elements i ≡ j (mod 4) come from lane j of the 64-bit draws: each lane must keep at 1 − p (the
    top lane's sign bit is always zero: left in, it would keep everything there or nothing)."""
    torch.manual_seed(0)
    n = 4 * 300_000 + 1  # not a multiple of 4: the last draw is only partly used
    kept = (dropout(torch.ones(n), p) != 0).float()
    assert kept.shape == (n,)
    sd = ((1 - p) * p / 300_000) ** 0.5
    for lane in range(4):
        assert abs(kept[lane::4].mean().item() - (1 - p)) < 6 * sd + 1e-5, lane


def test_masks_are_independent_across_calls_and_elements():
    torch.manual_seed(0)
    x = torch.ones(200_000)
    a, b = dropout(x, P) != 0, dropout(x, P) != 0
    assert not torch.equal(a, b)
    both = (a & b).float().mean().item()  # P(keep twice) = 0.49 if independent
    assert abs(both - (1 - P) ** 2) < 5e-3


def test_backward_is_the_same_mask_and_scale():
    torch.manual_seed(0)
    x = torch.randn(64, 33, requires_grad=True)
    g = torch.randn(64, 33)
    y = dropout(x, P)
    y.backward(g)
    keep = (y != 0).float()
    torch.testing.assert_close(x.grad, g * keep / (1 - P))


def test_gradcheck_with_a_fixed_mask():
    x = torch.randn(5, 7, dtype=torch.double, requires_grad=True)

    def fixed(t):
        torch.manual_seed(3)  # the same mask on every call
        return dropout(t, P)

    assert torch.autograd.gradcheck(fixed, (x,))


def test_eval_mode_and_p_zero_are_the_identity():
    x = torch.randn(4, 5)
    m = Dropout(P).eval()
    assert m(x) is x
    assert dropout(x, 0.0) is x
    assert dropout(x, P, training=False) is x


def test_p_one_drops_everything():
    assert torch.count_nonzero(dropout(torch.randn(10, 10), 1.0)) == 0


@pytest.mark.parametrize("p", [-0.1, 1.5])
def test_invalid_probability_is_rejected(p):
    with pytest.raises(ValueError, match=r"dropout probability must be in \[0, 1\]"):
        Dropout(p)
    with pytest.raises(ValueError, match=r"dropout probability must be in \[0, 1\]"):
        dropout(torch.ones(2), p)


def test_bf16_input_keeps_its_dtype_and_the_exact_rate():
    torch.manual_seed(0)
    y = dropout(torch.ones(500_000, dtype=torch.bfloat16), P)
    assert y.dtype == torch.bfloat16
    # a bf16 uniform would round p = 0.3 to 0.30078; the float32 mask does not
    assert abs((y != 0).float().mean().item() - (1 - P)) < 3e-3


def test_module_is_a_drop_in_for_nn_dropout():
    m, ref = Dropout(P), nn.Dropout(P)
    assert m.state_dict() == ref.state_dict() == {}
    assert repr(m) == "Dropout(p=0.3)"
    assert m.training and not m.eval().training


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_add_is_the_residual_plus_dropout_with_one_mask_in_both_passes(dtype):
    torch.manual_seed(0)
    r = torch.randn(300, 257, requires_grad=True)  # the residual stream stays float32 under autocast
    x = (torch.rand(300, 257) + 0.5).to(dtype).requires_grad_()  # no zeros of its own
    y = Dropout(P).add(r, x)
    dropped = (y - r).detach()  # x · keep / (1 − p)
    kept = dropped != 0
    assert abs(kept.float().mean().item() - (1 - P)) < 1e-2
    torch.testing.assert_close(dropped[kept], (x.detach().float() / (1 - P))[kept], rtol=1e-2, atol=0)
    g = torch.randn(300, 257)
    y.backward(g)
    assert torch.equal(r.grad, g) and x.grad.dtype == dtype
    torch.testing.assert_close(x.grad.float(), (g * kept / (1 - P)).to(dtype).float(), rtol=1e-2, atol=1e-2)
    m = Dropout(P).eval()
    assert torch.equal(m.add(r, x), r + x)
