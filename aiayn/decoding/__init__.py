"""Decoding: greedy, beam search and sampling over a KV-cached model, and text-level wrappers.

``adapters`` (one interface to both models) -> ``greedy`` / ``beam`` / ``sampling`` (search
strategies, batched) -> ``search`` (``SearchConfig`` picks one) -> ``translator`` / ``generator``
(text in, text out, from a model directory read by ``aiayn.interop.model_dir``). See docs/inference.md.
"""

from aiayn.decoding.adapters import IncrementalDecoder, LMAdapter, Seq2SeqAdapter, adapter_for
from aiayn.decoding.beam import beam_search
from aiayn.decoding.generator import Generator
from aiayn.decoding.greedy import greedy_search
from aiayn.decoding.options import SearchConfig
from aiayn.decoding.sampling import filter_logits, sample
from aiayn.decoding.scoring import Hypothesis, length_penalty
from aiayn.decoding.search import search
from aiayn.decoding.translator import Translator

__all__ = [
    "Generator",
    "Hypothesis",
    "IncrementalDecoder",
    "LMAdapter",
    "SearchConfig",
    "Seq2SeqAdapter",
    "Translator",
    "adapter_for",
    "beam_search",
    "filter_logits",
    "greedy_search",
    "length_penalty",
    "sample",
    "search",
]
