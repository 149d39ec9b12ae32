"""Pretrained checkpoints in, Hugging Face directories out: OPUS-MT (MarianMT) and GPT-2.

``from_pretrained(path)`` loads a local HF directory onto aiayn's own modules (strictly: every
tensor mapped, shapes checked); ``export_hf(model, out)`` writes the directory ``transformers``
loads; ``load_marian_tokenizers(path)`` and ``load_gpt2_tokenizer(path)`` give OPUS-MT's and
GPT-2's tokenization behind aiayn's tokenizer interface, so that ``aiayn translate`` and
``aiayn generate`` run downloaded checkpoints. Logits agree with ``transformers`` to float32
rounding (``tests/interop``); see docs/interop.md.
"""

from aiayn.interop.model_dir import load_lm_dir, load_translation_dir
from aiayn.interop.pretrained import (
    export_hf,
    from_pretrained,
    hf_model_type,
    load_gpt2_generation,
    load_marian_translation,
)
from aiayn.interop.tokenizers import (
    GPT2Tokenizer,
    MarianTokenizer,
    load_gpt2_tokenizer,
    load_marian_tokenizers,
)

__all__ = [
    "GPT2Tokenizer",
    "MarianTokenizer",
    "export_hf",
    "from_pretrained",
    "hf_model_type",
    "load_gpt2_generation",
    "load_gpt2_tokenizer",
    "load_marian_tokenizers",
    "load_lm_dir",
    "load_marian_translation",
    "load_translation_dir",
]
