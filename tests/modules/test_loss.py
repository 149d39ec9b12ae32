"""The label-smoothed loss against hand-computed values and F.cross_entropy."""

import math

import pytest
import torch
import torch.nn.functional as F

from aiayn.modules.loss import (
    fused_r_drop_loss,
    label_smoothed_nll_loss,
    linear_label_smoothed_nll_loss,
    r_drop_loss,
)
from tests.helpers import assert_close


def test_matches_cross_entropy_with_label_smoothing_when_smoothing_all_classes():
    logits, target = torch.randn(6, 11), torch.randint(0, 11, (6,))
    target[2] = 0  # pad, ignored
    loss, nll, n = label_smoothed_nll_loss(logits, target, 0.1, ignore_index=0)
    ref = F.cross_entropy(logits, target, ignore_index=0, label_smoothing=0.1, reduction="sum")
    assert_close("label_smoothed_nll_loss vs F.cross_entropy(label_smoothing)", loss, ref)
    assert_close(
        "NLL vs F.cross_entropy", nll, F.cross_entropy(logits, target, ignore_index=0, reduction="sum")
    )
    assert n == 5


def test_pad_gets_no_smoothing_mass_hand_computed():
    # V = 4, pad = 0, ε = 0.3: target distribution over {1,2,3}: y gets 0.7 + 0.1, others 0.1, pad 0
    logits = torch.tensor([[0.5, 1.0, -1.0, 2.0]])
    p = [math.exp(v) for v in logits[0].tolist()]
    logp = [math.log(v / sum(p)) for v in p]
    expected = -(0.7 * logp[3] + 0.1 * (logp[1] + logp[2] + logp[3]))
    loss, nll, n = label_smoothed_nll_loss(
        logits, torch.tensor([3]), 0.3, ignore_index=0, smoothing_exclude=0
    )
    assert_close("label_smoothed_nll_loss vs hand-computed (pad excluded)", loss, torch.tensor(expected))
    assert abs(nll.item() + logp[3]) < 1e-6 and n == 1


def test_padding_targets_contribute_nothing_and_gradients_flow():
    logits = torch.randn(2, 3, 7, requires_grad=True)
    target = torch.tensor([[1, 2, 0], [3, 0, 0]])
    loss, _, n = label_smoothed_nll_loss(logits, target, 0.1, ignore_index=0, smoothing_exclude=0)
    loss.backward()
    assert n == 3 and (logits.grad[0, 2] == 0).all() and (logits.grad[1, 1:] == 0).all()
    assert logits.grad[0, 0].abs().sum() > 0


def test_bf16_logits_are_scored_in_float32():
    logits, target = torch.randn(5, 9), torch.randint(1, 9, (5,))
    a = label_smoothed_nll_loss(logits.bfloat16(), target, 0.1)[0]
    assert a.dtype == torch.float32
    assert abs(a.item() - label_smoothed_nll_loss(logits.bfloat16().float(), target, 0.1)[0].item()) < 1e-5


@pytest.mark.parametrize(
    ("bias", "scale", "chunk_bytes", "exclude", "ignore"),
    [
        (False, 1.0, 4 << 20, 0, 0),
        (True, 0.25, 200, 0, 0),
        (False, 1.0, 200, None, 0),
        (True, 0.5, 200, 3, None),  # no ignored rows: as the models call it
    ],
)
def test_linear_loss_equals_projection_then_reference_loss(bias, scale, chunk_bytes, exclude, ignore):
    torch.manual_seed(1)
    h = torch.randn(53, 8, dtype=torch.float64, requires_grad=True)
    w = torch.randn(19, 8, dtype=torch.float64, requires_grad=True)
    b = torch.randn(19, dtype=torch.float64, requires_grad=True) if bias else None
    target = torch.randint(0, 19, (53,))
    target[::7] = 0
    logits = h @ w.T * scale + (b if bias else 0)
    ref = label_smoothed_nll_loss(logits, target, 0.1, ignore_index=ignore, smoothing_exclude=exclude)
    ours = linear_label_smoothed_nll_loss(
        h, w, target, 0.1, b, scale, ignore_index=ignore, smoothing_exclude=exclude, chunk_bytes=chunk_bytes
    )
    for a, r, name in zip(ours, ref, ("loss", "nll", "count")):
        assert_close(f"linear label-smoothed {name} vs projection + reference", a.double(), r.double(), 1e-4)
    with torch.no_grad():  # evaluation: no gradients formed in the forward, the same figures
        options = dict(ignore_index=ignore, smoothing_exclude=exclude, chunk_bytes=chunk_bytes)
        again = linear_label_smoothed_nll_loss(h, w, target, 0.1, b, scale, **options)
    assert all(torch.equal(a, o) for a, o in zip(again, ours))
    inputs = (h, w, b) if bias else (h, w)
    for combo in ((1.0, 0.0), (0.5, 2.0), (3.0, 0.0)):  # gradients from the forward, recomputed, reused
        g_ref = torch.autograd.grad(combo[0] * ref[0] + combo[1] * ref[1], inputs, retain_graph=True)
        g_ours = torch.autograd.grad(combo[0] * ours[0] + combo[1] * ours[1], inputs, retain_graph=True)
        for a, r, name in zip(g_ours, g_ref, ("h", "W", "b")):
            assert_close(f"linear label-smoothed ∂{name} vs autograd of the reference", a, r, 1e-4)


@pytest.mark.parametrize("chunk_bytes", [8 << 20, 2000])
def test_linear_loss_under_bf16_autocast_is_an_autocast_linear_then_the_float32_loss(chunk_bytes):
    """Under bfloat16 autocast the fused loss is what an autocast ``F.linear`` (bfloat16 logits)
    followed by the float32 reference loss gives, gradients included; not the float32 figures."""
    torch.manual_seed(3)
    h = torch.randn(64, 32, requires_grad=True)
    w = torch.randn(50, 32, requires_grad=True)
    target = torch.randint(1, 50, (64,))
    target[::9] = 0
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ours = linear_label_smoothed_nll_loss(
            h, w, target, 0.1, ignore_index=0, smoothing_exclude=0, chunk_bytes=chunk_bytes
        )
        logits = F.linear(h, w)  # (64, 50) bfloat16
    assert logits.dtype == torch.bfloat16
    ref = label_smoothed_nll_loss(logits.float(), target, 0.1, ignore_index=0, smoothing_exclude=0)
    fp32 = label_smoothed_nll_loss(h @ w.T, target, 0.1, ignore_index=0, smoothing_exclude=0)
    for a, r, f, name in zip(ours[:2], ref[:2], fp32[:2], ("loss", "NLL")):
        assert abs(a.item() / r.item() - 1) < 1e-6, f"bf16 fused {name} {a.item()}, autocast: {r.item()}"
        assert abs(a.item() / f.item() - 1) > 1e-5, f"the {name}'s products were not taken in bfloat16"
    g_ours = torch.autograd.grad(ours[0], (h, w))
    g_ref = torch.autograd.grad(ref[0], (h, w))
    g_fp32 = torch.autograd.grad(fp32[0], (h, w))
    for a, r, f, name in zip(g_ours, g_ref, g_fp32, ("h", "W")):
        assert a.dtype == torch.float32
        assert_close(f"bf16 fused ∂{name} vs autograd through the autocast linear (relative)",
                     (a - r).norm() / r.norm(), torch.tensor(0.0), 5e-3)  # fmt: skip
        error = ((a - f).norm() / f.norm()).item()
        assert 1e-4 < error < 2e-2, f"∂{name}: relative error {error:.3g} against float32 (bfloat16: ≈ 5e-3)"


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # the pre-2.4 calls, still present and deprecated
def test_autocast_dtype_is_read_the_same_way_on_torch_before_2_4(monkeypatch):
    from aiayn.modules import loss

    assert loss._autocast_dtype("cpu") == torch.float32
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert loss._autocast_dtype("cpu") == torch.bfloat16
        monkeypatch.delattr(torch, "get_autocast_dtype")  # as on torch 2.1–2.3
        assert loss._autocast_dtype("cpu") == torch.bfloat16
    assert loss._autocast_dtype("cpu") == torch.float32


def test_r_drop_loss_is_the_papers_equation_halved():
    """Liang et al. (2021) eq. 3, L = CE_a + CE_b + α · ½ (KL(P_a‖P_b) + KL(P_b‖P_a)), against
    F.cross_entropy and F.kl_div, with their gradients; returned halved (per pass)."""
    torch.manual_seed(0)
    a, b = torch.randn(9, 13, requires_grad=True), torch.randn(9, 13, requires_grad=True)
    target = torch.randint(0, 13, (9,))
    loss, nll, n = r_drop_loss(a, b, target, 0.1, alpha=5.0)
    ce = F.cross_entropy(a, target, label_smoothing=0.1, reduction="sum") + F.cross_entropy(
        b, target, label_smoothing=0.1, reduction="sum"
    )
    la, lb = a.log_softmax(-1), b.log_softmax(-1)
    kl_ab = F.kl_div(lb, la, log_target=True, reduction="sum")  # KL(P_a ‖ P_b)
    kl_ba = F.kl_div(la, lb, log_target=True, reduction="sum")
    ref = (ce + 5.0 * 0.5 * (kl_ab + kl_ba)) / 2
    assert kl_ab > 0.1 and kl_ba > 0.1  # the consistency term is not negligible here
    assert_close("R-Drop loss vs F.cross_entropy + F.kl_div", loss, ref)
    nll_ref = (F.cross_entropy(a, target, reduction="sum") + F.cross_entropy(b, target, reduction="sum")) / 2
    assert_close("R-Drop NLL: the passes' mean", nll, nll_ref)
    assert n == 9
    for got, want in zip(torch.autograd.grad(loss, (a, b)), torch.autograd.grad(ref, (a, b))):
        assert_close("R-Drop gradient", got, want)


def test_r_drop_loss_of_equal_passes_is_the_plain_loss():
    logits, target = torch.randn(5, 7), torch.tensor([1, 0, 3, 6, 2])
    plain = label_smoothed_nll_loss(logits, target, 0.1, smoothing_exclude=0)
    got = r_drop_loss(logits, logits.clone(), target, 0.1, alpha=3.0, smoothing_exclude=0)
    for name, x, y in zip(("loss", "nll"), got, plain):
        assert_close(f"R-Drop {name} with equal passes", x, y)


@pytest.mark.parametrize("exclude", [None, 0])
def test_fused_r_drop_loss_equals_the_formula_and_its_autograd_gradient(exclude):
    torch.manual_seed(1)
    a, b = torch.randn(8, 17, requires_grad=True), torch.randn(8, 17, requires_grad=True)
    target = torch.randint(1, 17, (8,))
    got = fused_r_drop_loss(torch.cat([a, b]), target, 0.1, 3.0, smoothing_exclude=exclude)
    ref = r_drop_loss(a, b, target, 0.1, 3.0, smoothing_exclude=exclude)
    for name, x, y in zip(("loss", "nll", "count"), got, ref):
        assert_close(f"fused R-Drop {name} vs the formula", x, y)
    upstream = 0.7  # the trainer scales the loss before backward
    for got_g, ref_g in zip(torch.autograd.grad(got[0] * upstream, (a, b)),
                            torch.autograd.grad(ref[0] * upstream, (a, b))):  # fmt: skip
        assert_close("fused R-Drop ∂logits vs autograd of the formula", got_g, ref_g)


def test_a_gpu_takes_few_large_chunks_and_the_cpu_cache_sized_ones():
    """Each chunk is a dozen kernel launches from Python: on a GPU a base model's batch took hundreds
    of chunks at the CPU's size (docs/results.md, "Training speed on a GPU"); now a handful. The CPU
    keeps chunks that stay in its cache."""
    from aiayn.modules.loss import chunk_rows

    tokens, vocab = 15_000, 37_000
    assert chunk_rows("cpu", vocab) == (8 << 20) // (4 * vocab) == 56
    assert -(-tokens // chunk_rows("cuda", vocab)) <= 9
    assert chunk_rows("xpu", vocab) == chunk_rows("cuda", vocab) and chunk_rows("cpu", 10**7) == 16
    assert chunk_rows("cuda", vocab, chunk_bytes=2000) == 16
