"""Pretrained checkpoints in, Hugging Face directories out: OPUS-MT (MarianMT), GPT-2 and BERT.

``from_pretrained(path)`` loads a local HF directory onto aiayn's own modules (strictly: every
tensor mapped, shapes checked); ``export_hf(model, out)`` writes the directory ``transformers``
loads; ``load_marian_tokenizers(path)``, ``load_gpt2_tokenizer(path)`` and
``load_bert_tokenizer(path)`` give OPUS-MT's, GPT-2's and BERT's tokenization behind aiayn's
tokenizer interface, so that ``aiayn translate``, ``aiayn generate``, ``aiayn classify`` and
``aiayn fill-mask`` run downloaded checkpoints. Logits agree with ``transformers`` to float32
rounding (``tests/interop``); see docs/interop.md.
"""

from aiayn.interop.bert import WordPieceTokenizer, load_bert_tokenizer
from aiayn.interop.gpt2 import GPT2Tokenizer, load_gpt2_tokenizer
from aiayn.interop.marian import MarianTokenizer, load_marian_tokenizers
from aiayn.interop.model_dir import load_lm_dir, load_translation_dir
from aiayn.interop.pretrained import (
    export_hf,
    from_pretrained,
    hf_model_type,
    load_gpt2_generation,
    load_marian_translation,
)

__all__ = [
    "GPT2Tokenizer",
    "MarianTokenizer",
    "WordPieceTokenizer",
    "export_hf",
    "from_pretrained",
    "hf_model_type",
    "load_bert_tokenizer",
    "load_gpt2_generation",
    "load_gpt2_tokenizer",
    "load_marian_tokenizers",
    "load_lm_dir",
    "load_marian_translation",
    "load_translation_dir",
]
