"""Sequence packing for masked-LM pre-training: documents -> one id stream -> full blocks.

BERT's pre-training inputs and RoBERTa's FULL-SENTENCES (Liu et al. 2019, §4.2): the documents are
concatenated into one stream, each followed by a separator (the tokenizer's ``eos``), and the stream
is cut into blocks of ``max_len - 2`` ids; collated (``collate_sequences``) a block becomes
``[bos] + ids + [eos]``, so every block but the last holds exactly ``max_len`` ids and no position is
padding. Blocks cross document boundaries: documents share a block, separated by ``eos``, and a
document longer than a block continues in the next one. No id is dropped: the blocks' ids in order
are the stream, and the stream cut at the separators gives back every document. The separator being
a special, ``mask_tokens`` never chooses it and whole-word masking starts a new word after it.

``encode_documents`` builds the stream of a text file (one document per non-blank line) through
``cache.encode_text``, memory-mapped and cached like a language model's text; ``join_documents``
builds it from documents already in memory (a table's texts). This module does not mask or batch.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence

import numpy as np

from aiayn.data.cache import encode_text
from aiayn.data.corpus import TextCorpus
from aiayn.data.files import split_lines
from aiayn.data.tokenizer import Tokenizer


def join_documents(documents: Iterable[Sequence[int]], sep: int) -> np.ndarray:
    """The stream: each non-empty document's ids followed by ``sep``.

    Shape: documents of lengths L_i -> (sum_i (L_i + 1),)"""
    parts: list[np.ndarray] = []
    for doc in documents:
        if len(doc):
            parts += [np.asarray(doc, np.int32), np.array([sep], np.int32)]
    return np.concatenate(parts) if parts else np.zeros(0, np.int32)


class DocumentIds:
    """``tok`` as ``encode_text`` sees it: a text of one document per line encodes to the stream of
    its non-blank lines (``join_documents``). ``model_bytes`` names the separator as well, so the cached
    stream never stands in for a language model's plain encoding of the same file. ``encode_text``
    reads a file in pieces that end after a newline, so a document is cut only if it is one line of
    several million characters."""

    def __init__(self, tok: Tokenizer, sep: int):
        self.tok, self.sep, self.vocab_size = tok, sep, tok.vocab_size

    def model_bytes(self) -> bytes:
        return self.tok.model_bytes() + f"\0documents (lines cut at \\n), separator {self.sep}".encode()

    def encode(self, text: str) -> np.ndarray:
        lines = [line for line in split_lines(text) if line.strip()]
        return join_documents(self.tok.encode_batch(lines), self.sep)


def encode_documents(
    corpus: TextCorpus, tok: Tokenizer, cache: str | os.PathLike | None = None
) -> np.ndarray:
    """The stream of a text split, one document per line, separated by ``tok.eos_id`` (memory-mapped)."""
    return encode_text(corpus, DocumentIds(tok, tok.eos_id), cache).tokens


class PackedBlocks:
    """A stream cut into blocks of ``size`` ids: block i is ``stream[i * size : (i + 1) * size]``, a
    numpy view (the last block may be shorter). Indexed and measured like a list of encoded
    sentences, so the encoder tasks batch blocks as they batch sentences."""

    def __init__(self, stream: np.ndarray, size: int):
        if size < 1:
            raise ValueError(f"size={size} must be at least 1 id per block")
        self.stream, self.size = stream, size

    def __len__(self) -> int:
        return -(-len(self.stream) // self.size)

    def __getitem__(self, i: int) -> np.ndarray:
        if not 0 <= i < len(self):
            raise IndexError(f"block {i} of {len(self)}")
        return self.stream[i * self.size : (i + 1) * self.size]

    def __iter__(self) -> Iterator[np.ndarray]:
        return (self[i] for i in range(len(self)))
