"""Dynamic int8 quantization of a trained model, for faster CPU inference.

Every Linear — the attention projections, the feed-forward layers and the output projection — gets
int8 weights (one scale per output row) and quantizes its input on the fly, per batch (PyTorch's
dynamic quantization, fbgemm/x86 kernels). Embeddings, LayerNorm and softmax stay float32. A tied
output projection gets an int8 copy of the embedding matrix; the embedding itself is untouched.

Quantized models are for inference only: they cannot be trained or saved back as checkpoints.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

from aiayn.errors import ConfigError
from aiayn.modules.attention import MultiHeadAttention
from aiayn.modules.embedding import OutputProjection

QUANTIZATIONS = ("none", "int8")


def quantize(model: nn.Module, name: str = "int8") -> nn.Module:
    """Quantize ``model`` in place (``name="int8"``) and return it in eval mode; "none" does nothing."""
    if name not in QUANTIZATIONS:
        raise ConfigError(f"--quantize={name!r} is not one of {QUANTIZATIONS}")
    model.eval()
    if name == "none":
        return model
    if next(model.parameters()).device.type != "cpu":
        raise ConfigError("--quantize int8 runs on the CPU only: load the model with --device cpu")
    split_sliced_weights(model)
    with warnings.catch_warnings():  # torch.ao's dynamic quantization warns of a future deprecation
        warnings.simplefilter("ignore")
        qconfig = torch.ao.quantization.per_channel_dynamic_qconfig
        torch.ao.quantization.quantize_dynamic(model, {nn.Linear: qconfig}, dtype=torch.qint8, inplace=True)
    return model


def split_sliced_weights(model: nn.Module, self_attention: bool = True) -> None:
    """Give every weight slice a module applies its own ``nn.Linear``, so that converting Linears
    (int8, oneDNN packing) reaches them: cross-attention's row blocks of ``w_qkv`` and an
    ``output_pieces`` head's piece rows. ``self_attention=False`` leaves self-attention whole (its
    forward never slices ``w_qkv``). Outputs are unchanged."""
    for path, m in model.named_modules():
        if isinstance(m, MultiHeadAttention) and (self_attention or not path.endswith("self_attn")):
            m.split_row_blocks()
        elif isinstance(m, OutputProjection):
            m.split_pieces()


def is_quantized(model: nn.Module) -> bool:
    return any(type(m).__module__.startswith("torch.ao.nn.quantized") for m in model.modules())
