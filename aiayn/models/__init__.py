"""The three models: encoder–decoder, encoder-only, decoder-only."""

from aiayn.models.encoder import EncoderModel
from aiayn.models.lm import LanguageModel
from aiayn.models.transformer import Transformer

__all__ = ["EncoderModel", "LanguageModel", "Transformer"]
