"""aiayn: the Transformer of "Attention Is All You Need", written from scratch and verified.

Mask convention (everywhere in this package): a mask is a bool tensor broadcastable to the
attention scores (B, h, T_q, T_k); True means "may attend". Combine masks with ``&``.
"""

from aiayn.masks import causal_mask, padding_mask
from aiayn.models import BidirectionalTransformer, EncoderModel, LanguageModel, Transformer, build_transformer
from aiayn.models.config import EncoderConfig, LMConfig, TransformerConfig
from aiayn.modules.config import LayerConfig
from aiayn.version import __version__

__all__ = [
    "BidirectionalTransformer",
    "EncoderConfig",
    "EncoderModel",
    "LMConfig",
    "LanguageModel",
    "LayerConfig",
    "Transformer",
    "TransformerConfig",
    "__version__",
    "build_transformer",
    "causal_mask",
    "from_pretrained",
    "padding_mask",
]


def __getattr__(name: str):
    if name == "from_pretrained":  # imported on first use: aiayn.interop needs sentencepiece
        from aiayn.interop import from_pretrained

        return from_pretrained
    raise AttributeError(f"module 'aiayn' has no attribute {name!r}")
