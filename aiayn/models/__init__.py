"""The models: encoder–decoder (and its bidirectional variant), encoder-only, decoder-only."""

from aiayn.models.bidirectional import (
    BidirectionalOutput,
    BidirectionalTransformer,
    R2LMemory,
    build_transformer,
)
from aiayn.models.encoder import EncoderModel
from aiayn.models.lm import LanguageModel
from aiayn.models.transformer import Transformer

__all__ = [
    "BidirectionalOutput",
    "BidirectionalTransformer",
    "EncoderModel",
    "LanguageModel",
    "R2LMemory",
    "Transformer",
    "build_transformer",
]
