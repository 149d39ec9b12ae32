"""Decoding: greedy, beam search and sampling over a KV-cached model, and text-level wrappers.

``adapters`` (one interface to both models) -> ``greedy`` / ``beam`` / ``sampling`` (search
strategies, batched) -> ``search`` (``SearchConfig`` picks one) -> ``translator`` / ``generator``
(text in, text out, from a model directory). See docs/inference.md.
"""

from aiayn.decoding.adapters import IncrementalDecoder, LMAdapter, Seq2SeqAdapter, adapter_for
from aiayn.decoding.beam import beam_search
from aiayn.decoding.generator import Generator
from aiayn.decoding.greedy import greedy_search
from aiayn.decoding.model_dir import load_lm_dir, load_translation_dir
from aiayn.decoding.sampling import filter_logits, sample
from aiayn.decoding.scoring import Hypothesis, length_penalty
from aiayn.decoding.search import SearchConfig, search
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
    "load_lm_dir",
    "load_translation_dir",
    "sample",
    "search",
]
