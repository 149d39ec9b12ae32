"""GPT-2 in and out: the checkpoint conversion (``convert.py``) and the byte-level BPE tokenizer
(``tokenizer.py``), side by side as one model family."""

from aiayn.interop.gpt2.convert import (
    check_exportable,
    config_from_gpt2,
    default_pad_id,
    export_gpt2,
    load_gpt2,
    name_map,
)
from aiayn.interop.gpt2.tokenizer import GPT2Tokenizer, load_gpt2_tokenizer

__all__ = [
    "GPT2Tokenizer",
    "check_exportable",
    "config_from_gpt2",
    "default_pad_id",
    "export_gpt2",
    "load_gpt2",
    "load_gpt2_tokenizer",
    "name_map",
]
