"""Shared test helpers: comparisons that remember the largest difference seen per reference,
and copying weights from torch.nn modules into aiayn's."""

from __future__ import annotations

import torch
from torch import nn

from aiayn.modules import EncoderLayer, MultiHeadAttention
from aiayn.modules.layers import DecoderLayer, Residual

# reference name -> largest max-abs difference measured; printed at the end of the test run
MAX_DIFFS: dict[str, float] = {}


def assert_close(name: str, ours: torch.Tensor, ref: torch.Tensor, atol: float = 1e-5) -> None:
    assert ours.shape == ref.shape, f"{name}: shape {tuple(ours.shape)} != {tuple(ref.shape)}"
    assert torch.isfinite(ours).all(), f"{name}: non-finite values"
    diff = (ours.double() - ref.double()).abs().max().item() if ours.numel() else 0.0
    MAX_DIFFS[name] = max(MAX_DIFFS.get(name, 0.0), diff)
    assert diff <= atol, f"{name}: max abs diff {diff:.3g} > {atol}"


def randomise_reference_(ref: nn.Module, seed: int = 0) -> None:
    """Random biases and LayerNorm gains in a torch.nn reference, in place. PyTorch starts attention
    biases at 0 and LayerNorms at (1, 0), so a copy that sliced a bias wrongly or swapped two
    sublayers' norms would still match; with random values it cannot. The copy helpers call it."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in ref.modules():
            if isinstance(module, nn.LayerNorm) and module.weight is not None:
                module.weight.copy_(1 + 0.2 * torch.randn(module.weight.shape, generator=g))
            for name, param in module.named_parameters(recurse=False):
                if "bias" in name:
                    param.copy_(0.1 * torch.randn(param.shape, generator=g))


def randomise_(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """HF initialises LayerNorms to (1, 0) and Marian's final_logits_bias to 0, as aiayn does its
    own LayerNorms: a mapping that mixed them up would still pass. Give every norm's gain and every
    bias (that buffer included) random values instead, in HF's models and aiayn's alike."""
    g = torch.Generator().manual_seed(seed)
    gains = {f"{name}.weight" for name, m in model.named_modules() if "norm" in type(m).__name__.lower()}
    with torch.no_grad():
        for name, t in [*model.named_parameters(), *model.named_buffers()]:
            if name in gains:
                t.copy_(1 + 0.2 * torch.randn(t.shape, generator=g))
            elif name.endswith(("bias", "final_logits_bias")) and "embed_positions" not in name:
                t.copy_(0.1 * torch.randn(t.shape, generator=g))
    return model.eval()


def copy_mha(ours: MultiHeadAttention, ref: nn.MultiheadAttention, randomise: bool = True) -> None:
    """nn.MultiheadAttention stacks W^Q, W^K, W^V as in_proj in the same order as our w_qkv."""
    if randomise:
        randomise_reference_(ref)
    with torch.no_grad():
        ours.w_qkv.weight.copy_(ref.in_proj_weight)
        ours.w_qkv.bias.copy_(ref.in_proj_bias)
        ours.w_o.weight.copy_(ref.out_proj.weight)
        ours.w_o.bias.copy_(ref.out_proj.bias)


def _copy_norm(ours: Residual, ref: nn.LayerNorm) -> None:
    with torch.no_grad():
        ours.norm.weight.copy_(ref.weight)
        ours.norm.bias.copy_(ref.bias)


def _copy_ff(ours, ref) -> None:
    with torch.no_grad():
        for mine, theirs in ((ours.ff.w_1, ref.linear1), (ours.ff.w_2, ref.linear2)):
            mine.weight.copy_(theirs.weight)
            mine.bias.copy_(theirs.bias)


def copy_encoder_layer(ours: EncoderLayer, ref: nn.TransformerEncoderLayer) -> None:
    randomise_reference_(ref)  # each sublayer its own values, so that a swap shows
    copy_mha(ours.self_attn, ref.self_attn, randomise=False)
    _copy_ff(ours, ref)
    _copy_norm(ours.self_attn_res, ref.norm1)
    _copy_norm(ours.ff_res, ref.norm2)


def copy_decoder_layer(ours: DecoderLayer, ref: nn.TransformerDecoderLayer) -> None:
    randomise_reference_(ref)  # each sublayer its own values, so that a swap shows
    copy_mha(ours.self_attn, ref.self_attn, randomise=False)
    copy_mha(ours.cross_attn, ref.multihead_attn, randomise=False)
    _copy_ff(ours, ref)
    _copy_norm(ours.self_attn_res, ref.norm1)
    _copy_norm(ours.cross_attn_res, ref.norm2)
    _copy_norm(ours.ff_res, ref.norm3)


def copy_layer_norm(ours, ref: nn.LayerNorm) -> None:
    randomise_reference_(ref)
    with torch.no_grad():
        ours.weight.copy_(ref.weight)
        ours.bias.copy_(ref.bias)


def random_mask(*shape: int, p: float = 0.3, empty_rows: int = 2, seed: int = 0) -> torch.Tensor:
    """A random bool mask (True = may attend) with ``empty_rows`` fully masked query rows."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(*shape, generator=g) > p
    flat = mask.view(-1, shape[-2], shape[-1])
    for i in range(empty_rows):
        flat[i % flat.size(0), (3 * i) % shape[-2]] = False
    return mask
