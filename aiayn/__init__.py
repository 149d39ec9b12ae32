"""aiayn: the Transformer of "Attention Is All You Need", written from scratch and verified.

Mask convention (everywhere in this package): a mask is a bool tensor broadcastable to the
attention scores (B, h, T_q, T_k); True means "may attend". Combine masks with ``&``.

The names below are imported on first use (PEP 562), so that ``import aiayn.cli.main`` does not
import torch: the command line imports it inside ``main``, where Ctrl-C is one line, not a traceback.
"""

from importlib import import_module

from aiayn.version import __version__

_WHERE = {  # name -> the module that defines it
    "causal_mask": "aiayn.masks",
    "padding_mask": "aiayn.masks",
    "BidirectionalTransformer": "aiayn.models",
    "EncoderModel": "aiayn.models",
    "LanguageModel": "aiayn.models",
    "Transformer": "aiayn.models",
    "build_transformer": "aiayn.models",
    "EncoderConfig": "aiayn.models.config",
    "LMConfig": "aiayn.models.config",
    "TransformerConfig": "aiayn.models.config",
    "LayerConfig": "aiayn.modules.config",
    "from_pretrained": "aiayn.interop",  # needs sentencepiece besides torch
}

__all__ = [  # noqa: F822 (defined by __getattr__)
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
    if name in _WHERE:
        return getattr(import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'aiayn' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_WHERE])
