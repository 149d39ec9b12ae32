"""Building blocks of the Transformer: attention, embeddings, normalisation, feed-forward, layers."""

from aiayn.modules.attention import MultiHeadAttention, scaled_dot_product_attention
from aiayn.modules.embedding import (
    LearnedPositionalEmbedding,
    OutputProjection,
    PositionalEncoding,
    TokenEmbedding,
    TransformerEmbedding,
)
from aiayn.modules.feed_forward import FeedForward
from aiayn.modules.kv_cache import DecoderCache, KVCache
from aiayn.modules.layers import Decoder, DecoderContext, DecoderLayer, Encoder, EncoderLayer
from aiayn.modules.norm import LayerNorm

__all__ = [
    "Decoder",
    "DecoderCache",
    "DecoderContext",
    "DecoderLayer",
    "Encoder",
    "EncoderLayer",
    "FeedForward",
    "KVCache",
    "LayerNorm",
    "LearnedPositionalEmbedding",
    "MultiHeadAttention",
    "OutputProjection",
    "PositionalEncoding",
    "TokenEmbedding",
    "TransformerEmbedding",
    "scaled_dot_product_attention",
]
