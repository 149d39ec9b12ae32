"""Data: corpora in, padded batches of token ids out.

``files`` (reading and checking text files) -> ``corpus`` (datasets by name or path, filters) ->
``tokenizer`` (sentencepiece subwords, characters) -> ``cache`` (encoded, memory-mapped corpora;
``subword``: re-segmented each epoch for BPE-dropout) -> ``batching`` (token-budget and window
samplers, collate). See docs/data.md.
"""

from aiayn.data.batching import (
    CorpusEpochs,
    LMBatch,
    TokenBatchSampler,
    TranslationBatch,
    WindowSampler,
    collate_translation,
    lm_batch,
    non_pad_fraction,
    reverse_targets,
    sequential_windows,
)
from aiayn.data.cache import EncodedParallel, EncodedText, Ragged, encode_parallel, encode_text
from aiayn.data.corpus import (
    CorpusFilter,
    FilterStats,
    ParallelCorpus,
    TextCorpus,
    has_splits,
    load_parallel,
    load_text,
)
from aiayn.data.files import DataError, FileInfo, cache_dir, check_file, data_dir
from aiayn.data.tokenizer import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    UNK_ID,
    CharTokenizer,
    SentencePieceTokenizer,
    Tokenizer,
    load_tokenizer,
    load_translation_tokenizers,
    save_translation_tokenizers,
    train_translation_tokenizers,
)

__all__ = [
    "BOS_ID",
    "EOS_ID",
    "PAD_ID",
    "UNK_ID",
    "CharTokenizer",
    "CorpusEpochs",
    "CorpusFilter",
    "DataError",
    "EncodedParallel",
    "EncodedText",
    "FileInfo",
    "FilterStats",
    "ParallelCorpus",
    "Ragged",
    "SentencePieceTokenizer",
    "TextCorpus",
    "TokenBatchSampler",
    "Tokenizer",
    "LMBatch",
    "TranslationBatch",
    "WindowSampler",
    "cache_dir",
    "check_file",
    "collate_translation",
    "data_dir",
    "encode_parallel",
    "encode_text",
    "lm_batch",
    "has_splits",
    "load_parallel",
    "load_text",
    "load_tokenizer",
    "load_translation_tokenizers",
    "non_pad_fraction",
    "reverse_targets",
    "save_translation_tokenizers",
    "sequential_windows",
    "train_translation_tokenizers",
]
