"""MarianMT (OPUS-MT) in and out: the checkpoint conversion (``convert.py``) and the tokenizer
(``tokenizer.py``), side by side as one model family."""

from aiayn.interop.marian.convert import (
    check_exportable,
    config_from_marian,
    export_marian,
    halves_permutation,
    load_marian,
    name_map,
    permute_residual,
    shares_embeddings,
)
from aiayn.interop.marian.tokenizer import MarianTokenizer, load_marian_tokenizers, save_marian_tokenizer

__all__ = [
    "MarianTokenizer",
    "check_exportable",
    "config_from_marian",
    "export_marian",
    "halves_permutation",
    "load_marian",
    "load_marian_tokenizers",
    "name_map",
    "permute_residual",
    "save_marian_tokenizer",
    "shares_embeddings",
]
