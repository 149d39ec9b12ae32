"""BERT in and out: the checkpoint conversion (``convert.py``) and the WordPiece tokenizer
(``tokenizer.py``), side by side as one model family."""

from aiayn.interop.bert.convert import (
    bert_labels,
    bert_tokenizer,
    check_exportable,
    config_from_bert,
    export_bert,
    is_classifier,
    kept_fields,
    load_bert,
    load_bert_dir,
    name_map,
    special_ids,
)
from aiayn.interop.bert.tokenizer import WordPieceTokenizer, load_bert_tokenizer

__all__ = [
    "WordPieceTokenizer",
    "bert_labels",
    "bert_tokenizer",
    "check_exportable",
    "config_from_bert",
    "export_bert",
    "is_classifier",
    "kept_fields",
    "load_bert",
    "load_bert_dir",
    "load_bert_tokenizer",
    "name_map",
    "special_ids",
]
