"""Encoded corpora on disk: token ids memory-mapped, so a second run starts without re-encoding and
a corpus larger than RAM can be trained on.

``encode_parallel`` streams a ``ParallelCorpus`` through its tokenizers in chunks, drops pairs by
a ``CorpusFilter`` (counting them in ``FilterStats``) and writes, per side, the ids of all kept
sentences concatenated (``{side}.ids``: uint16, or int32 for vocabularies over 65,536) and their
start offsets (``{side}.offsets``: int64, one more than there are sentences), plus ``meta.json``.
``encode_text`` writes one flat ``tokens.ids`` array for a ``TextCorpus``; ``cache_sequences`` stores
sequences a caller computes from such a corpus (a model's translations of its sources), keyed by
whatever made them. The folder name holds a
SHA-256 of the corpus text, the tokenizer model bytes and the filter options: any change gives a
new folder, never a stale hit. A folder is built under a temporary name and renamed into place
with ``os.replace``, so a crash or a concurrent run never leaves a half-written cache behind.
The cache folder is ``$AIAYN_CACHE_DIR`` or ``<repo>/.cache/aiayn`` unless an argument says
otherwise; delete it at any time. This module does not batch; see ``batching.py``.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict
from pathlib import Path

import numpy as np

from aiayn.atomic import atomic_dir
from aiayn.data.corpus import CorpusFilter, FilterStats, ParallelCorpus, TextCorpus
from aiayn.data.files import DataError, cache_dir
from aiayn.data.tokenizer import Tokenizer

FORMAT = 1  # bump when the on-disk layout changes: old folders then simply stop matching
META_FILE = "meta.json"
CHUNK_PAIRS = 10_000  # pairs encoded at a time: bounds memory whatever the corpus size


def _dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.int32)


def _key(*parts: bytes | str | dict) -> str:
    h = hashlib.sha256()
    for part in (FORMAT, *parts):
        b = part if isinstance(part, bytes) else json.dumps(part, sort_keys=True).encode()
        h.update(len(b).to_bytes(8, "little") + b)
    return h.hexdigest()


def _map(path: Path, dtype: np.dtype) -> np.ndarray:
    """A read-only memory map (numpy cannot map an empty file: that becomes an empty array)."""
    return np.memmap(path, dtype=dtype, mode="r") if path.stat().st_size else np.zeros(0, dtype)


class Ragged:
    """Variable-length sequences stored flat: sequence i is ``ids[offsets[i]:offsets[i + 1]]``."""

    def __init__(self, ids: np.ndarray, offsets: np.ndarray):
        if len(offsets) < 1 or offsets[-1] != len(ids):
            raise DataError(f"offsets end at {offsets[-1:]}, ids have {len(ids)}: corrupt cache")
        self.ids, self.offsets = ids, offsets

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> np.ndarray:
        i = i + len(self) if i < 0 else i
        return self.ids[self.offsets[i] : self.offsets[i + 1]]

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)


def _ragged(directory: Path, side: str, dtype: np.dtype) -> Ragged:
    return Ragged(_map(directory / f"{side}.ids", dtype), _map(directory / f"{side}.offsets", "<i8"))


class _RaggedWriter:
    def __init__(self, directory: Path, name: str, dtype: np.dtype):
        self.dtype, self.total = dtype, 0
        self.ids = open(directory / f"{name}.ids", "wb")  # noqa: SIM115 -- closed in close()
        self.offsets = open(directory / f"{name}.offsets", "wb")  # noqa: SIM115
        np.zeros(1, np.int64).tofile(self.offsets)

    def write(self, seqs: list[list[int]]) -> None:
        lengths = np.fromiter(map(len, seqs), np.int64, len(seqs))
        n = int(lengths.sum())
        np.fromiter(itertools.chain.from_iterable(seqs), self.dtype, n).tofile(self.ids)
        (self.total + np.cumsum(lengths)).tofile(self.offsets)
        self.total += n

    def close(self) -> None:
        self.ids.close()
        self.offsets.close()


def _read_meta(directory: Path, kind: str) -> dict | None:
    try:
        meta = json.loads((directory / META_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return meta if meta.get("format") == FORMAT and meta.get("kind") == kind else None


class EncodedParallel:
    """An encoded parallel corpus: a map-style dataset whose item i is ``(src_ids, tgt_ids)``, two
    numpy views into the memory maps (no bos/eos: ``collate_translation`` adds them)."""

    def __init__(self, directory: str | os.PathLike):
        self.directory = Path(directory)
        meta = _read_meta(self.directory, "parallel")
        if meta is None:
            raise DataError(f"{self.directory}: not an encoded parallel corpus (no valid meta.json)")
        self.meta, self.stats = meta, FilterStats(**meta["stats"])
        dt = np.dtype(meta["dtype"])
        self.src, self.tgt = (_ragged(self.directory, side, dt) for side in ("src", "tgt"))
        if not len(self.src) == len(self.tgt) == self.stats.kept:
            raise DataError(f"{self.directory}: sides hold different numbers of sentences: corrupt")

    def __len__(self) -> int:
        return len(self.src)

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        return self.src[i], self.tgt[i]

    def __reduce__(self):  # DataLoader workers re-open the maps instead of copying the arrays
        return type(self), (self.directory,)


class EncodedText:
    """An encoded text corpus: one flat, memory-mapped array of token ids (``tokens``)."""

    def __init__(self, directory: str | os.PathLike):
        self.directory = Path(directory)
        meta = _read_meta(self.directory, "text")
        if meta is None:
            raise DataError(f"{self.directory}: not an encoded text corpus (no valid meta.json)")
        self.meta = meta
        self.tokens = _map(self.directory / "tokens.ids", np.dtype(meta["dtype"]))
        if len(self.tokens) != meta.get("n_tokens", len(self.tokens)):  # a file cut short: not an entry
            raise DataError(f"{self.directory}: {len(self.tokens)} tokens of {meta['n_tokens']}: corrupt")

    def __len__(self) -> int:
        return len(self.tokens)

    def __reduce__(self):
        return type(self), (self.directory,)


def _cached(final: Path, cls: type):
    """``cls(final)`` if that folder holds a complete, readable cache entry, else None."""
    try:
        return cls(final)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _build(final: Path, cls: type, write: Callable[[Path], None]):
    """``cls(final)``, written first by ``write(folder)`` unless a complete entry is there.

    Processes that need the same entry at once (a recipe's members, a run's ranks) each write a
    private folder; the first to finish publishes it and the others use that copy, whether they
    notice before their own rename or by its failure (a directory cannot replace a non-empty one)."""
    if (hit := _cached(final, cls)) is not None:
        return hit
    try:
        # durable: an entry is trusted for as long as its key holds, so a power cut must not leave one
        # whose name reached the disk before its data
        with atomic_dir(final, keep=lambda path: _cached(path, cls) is not None, durable=True) as tmp:
            write(tmp)
    except OSError:
        if (hit := _cached(final, cls)) is None:
            raise
        return hit
    return cls(final)


def _write_meta(directory: Path, kind: str, name: str, origin: dict, dtype: np.dtype, **info):
    meta = dict(format=FORMAT, kind=kind, name=name, **origin, dtype=dtype.str, **info)
    (directory / META_FILE).write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")


def _batched(items: Iterable, n: int) -> Iterator[list]:
    it = iter(items)
    while chunk := list(itertools.islice(it, n)):
        yield chunk


def encode_parallel(
    corpus: ParallelCorpus,
    src_tok: Tokenizer,
    tgt_tok: Tokenizer,
    corpus_filter: CorpusFilter | None = None,
    cache: str | os.PathLike | None = None,
    chunk_pairs: int = CHUNK_PAIRS,
) -> EncodedParallel:
    """Encode and filter ``corpus`` into the cache (or find it there); ``.stats`` says what was
    dropped (``corpus_filter`` defaults to ``CorpusFilter()``). Raises ``DataError`` if the
    filter drops every pair."""
    filt = corpus_filter or CorpusFilter()
    tokens = (src_tok.model_bytes(), tgt_tok.model_bytes())
    key = _key("parallel", corpus.src.sha256, corpus.tgt.sha256, *tokens, asdict(filt))
    final = Path(cache or cache_dir()) / f"{corpus.name}-{key[:20]}"
    dtype = _dtype(max(src_tok.vocab_size, tgt_tok.vocab_size))

    def write(tmp: Path) -> None:
        stats = FilterStats()
        src_out, tgt_out = _RaggedWriter(tmp, "src", dtype), _RaggedWriter(tmp, "tgt", dtype)
        for chunk in _batched(corpus, chunk_pairs):
            srcs, tgts = zip(*chunk)
            src_ids, tgt_ids = src_tok.encode_batch(srcs), tgt_tok.encode_batch(tgts)
            keep = filt.keep(srcs, tgts, src_ids, tgt_ids, stats)
            src_out.write([src_ids[i] for i in keep])
            tgt_out.write([tgt_ids[i] for i in keep])
        src_out.close()
        tgt_out.close()
        if stats.kept == 0:
            raise DataError(
                f"{corpus.src.path} and {corpus.tgt.path}: every pair was filtered out ({stats});"
                " relax the CorpusFilter (max_len, max_ratio, drop_empty)"
            )
        files = dict(src_file=str(corpus.src.path), tgt_file=str(corpus.tgt.path))
        _write_meta(tmp, "parallel", corpus.name, files, dtype, filter=asdict(filt), stats=asdict(stats))

    return _build(final, EncodedParallel, write)


def encode_text(corpus: TextCorpus, tok: Tokenizer, cache: str | os.PathLike | None = None) -> EncodedText:
    """Encode a text split into one flat id array in the cache (or find it there)."""
    key = _key("text", corpus.fingerprint, tok.model_bytes())
    final = Path(cache or cache_dir()) / f"{corpus.name}-{key[:20]}"
    dtype = _dtype(tok.vocab_size)

    def write(tmp: Path) -> None:
        n = 0
        with open(tmp / "tokens.ids", "wb") as f:
            for piece in corpus.chunks():
                ids = np.asarray(tok.encode(piece), dtype=dtype)
                ids.tofile(f)
                n += len(ids)
        span = dict(file=str(corpus.file.path), start=corpus.start, stop=corpus.stop)
        _write_meta(tmp, "text", corpus.name, span, dtype, n_tokens=n)

    return _build(final, EncodedText, write)


class EncodedSequences(Ragged):
    """Sequences ``cache_sequences`` stored (``seqs.ids`` / ``seqs.offsets``), one per item of the
    corpus they were made from; ``meta`` says what made them."""

    def __init__(self, directory: str | os.PathLike):
        self.directory = Path(directory)
        meta = _read_meta(self.directory, "sequences")
        if meta is None:
            raise DataError(f"{self.directory}: not a cache of sequences (no valid meta.json)")
        self.meta = meta
        seqs = _ragged(self.directory, "seqs", np.dtype(meta["dtype"]))
        super().__init__(seqs.ids, seqs.offsets)
        if len(self) != meta["n"]:
            raise DataError(f"{self.directory}: {len(self)} sequences, meta.json says {meta['n']}: corrupt")


def cache_sequences(
    name: str,
    key: dict,
    vocab_size: int,
    make: Callable[[], Iterable[list[list[int]]]],
    cache: str | os.PathLike | None = None,
) -> EncodedSequences:
    """The sequences stored under ``key`` (a JSON-able description of everything that made them),
    or, on a miss, those ``make()`` yields (in chunks, in item order), written first. A hit never
    calls ``make``; any change of ``key`` is a new folder."""
    final = Path(cache or cache_dir()) / f"{name}-{_key('sequences', key)[:20]}"
    dtype = _dtype(vocab_size)

    def write(tmp: Path) -> None:
        out, n = _RaggedWriter(tmp, "seqs", dtype), 0
        for chunk in make():
            out.write(chunk)
            n += len(chunk)
        out.close()
        _write_meta(tmp, "sequences", name, {"made_by": key}, dtype, n=n)

    return _build(final, EncodedSequences, write)
