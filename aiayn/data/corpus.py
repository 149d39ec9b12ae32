"""Corpora by name or by path: parallel sentence pairs for translation, plain text for an LM.

``load_parallel`` resolves a dataset name (``multi30k``), a ``(src_file, tgt_file)`` pair, a folder
holding ``{split}.{lang}`` files or a path prefix (``corpus/train`` -> ``corpus/train.de``), checks
both files (``files.check_file``) and their line counts, and returns a ``ParallelCorpus`` that
streams ``(src, tgt)`` string pairs. ``load_text`` does the same for one text file and cuts it by
characters into train/valid (nanoGPT's protocol: the first 90% of characters train, the rest valid).
``CorpusFilter`` says which pairs to drop (empty, too long, extreme length ratio); it is applied
when a corpus is encoded (``cache.encode_parallel``), which counts the drops in ``FilterStats``.
Nothing here tokenizes or batches.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from aiayn.data.files import FileInfo, check_file, data_dir, iter_lines, iter_text
from aiayn.errors import ConfigError, DataError

SPLITS = ("train", "valid", "test")
SPLIT_ALIASES = {"train": ("train",), "valid": ("valid", "val", "dev"), "test": ("test",)}
MULTI30K_FILES = {"train": "train", "valid": "val", "test": "test_2016_flickr"}
MULTI30K_LANGS = ("de", "en")
TEXT_DATASETS = {"shakespeare": "tinyshakespeare/input.txt.gz"}

Source = str | os.PathLike | tuple[str | os.PathLike, str | os.PathLike]


def _check_split(split: str, allowed: tuple[str, ...] = SPLITS) -> None:
    if split not in allowed:
        raise DataError(f"split={split!r} is not one of {', '.join(allowed)}")


@dataclass(frozen=True)
class ParallelCorpus:
    """Two checked files with the same number of lines; line i of ``src`` translates line i of
    ``tgt``. Iterating yields ``(src, tgt)`` strings, streamed from disk."""

    name: str  # for messages and cache folder names
    src: FileInfo
    tgt: FileInfo
    src_lang: str
    tgt_lang: str

    def __len__(self) -> int:
        return self.src.n_lines

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return zip(iter_lines(self.src.path), iter_lines(self.tgt.path), strict=True)

    def sentences(self, side: str = "both") -> Iterator[str]:
        """Source, target or both sides' sentences, e.g. to train a (joint) vocabulary."""
        if side not in ("src", "tgt", "both"):
            raise ValueError(f"side={side!r} is not one of src, tgt, both")
        if side in ("src", "both"):
            yield from iter_lines(self.src.path)
        if side in ("tgt", "both"):
            yield from iter_lines(self.tgt.path)


@dataclass(frozen=True)
class TextCorpus:
    """Characters ``start:stop`` of one checked text file: a language-modelling split."""

    name: str
    file: FileInfo
    start: int
    stop: int

    def __len__(self) -> int:
        return self.stop - self.start

    def chunks(self, size: int = 1 << 20) -> Iterator[str]:
        """The text in pieces of about ``size`` characters, cut after a newline where possible."""
        return iter_text(self.file.path, self.start, self.stop, size)

    def text(self) -> str:
        """The whole split as one string (fine for tiny-shakespeare; stream ``chunks`` otherwise)."""
        return "".join(self.chunks())

    @property
    def fingerprint(self) -> str:
        return hashlib.sha256(f"{self.file.sha256}:{self.start}:{self.stop}".encode()).hexdigest()


def _find(stem: Path, lang: str) -> Path:
    """``stem.lang`` or ``stem.lang.gz``, whichever exists (the plain name if neither does)."""
    plain = stem.with_name(f"{stem.name}.{lang}")
    gz = plain.with_name(plain.name + ".gz")
    return gz if gz.exists() and not plain.exists() else plain


def _parallel_paths(source: Source, split: str, src_lang: str, tgt_lang: str) -> tuple[Path, Path, str]:
    """The two files, and a short label for messages and cache folder names."""
    if isinstance(source, tuple | list):
        if len(source) != 2:
            raise DataError(f"expected (src_file, tgt_file), got {len(source)} paths")
        return Path(source[0]), Path(source[1]), Path(source[0]).name.split(".")[0]
    if source == "multi30k":
        for lang in (src_lang, tgt_lang):
            if lang not in MULTI30K_LANGS:
                raise DataError(f"multi30k has languages de and en, not {lang!r}")
        folder = data_dir() / "multi30k"
        stem = folder / MULTI30K_FILES[split]
        return _find(stem, src_lang), _find(stem, tgt_lang), f"multi30k.{split}"
    path = Path(source)
    if path.is_dir():  # a folder of {split}.{lang}[.gz] files; "valid" may be called val or dev
        stems = [path / alias for alias in SPLIT_ALIASES[split]]
        stem = next((s for s in stems if _find(s, src_lang).exists()), stems[0])
        return _find(stem, src_lang), _find(stem, tgt_lang), f"{path.resolve().name}.{split}"
    return _find(path, src_lang), _find(path, tgt_lang), path.name


def has_splits(source: Source) -> bool:
    """Whether ``source`` holds its own train / valid / test splits: ``"multi30k"`` and a folder do; a
    prefix or a pair of files is one corpus, whose ``valid`` split would be its training pairs again."""
    return source == "multi30k" or (isinstance(source, str | Path) and Path(source).is_dir())


def load_parallel(
    source: Source, split: str = "train", src_lang: str = "de", tgt_lang: str = "en"
) -> ParallelCorpus:
    """A checked parallel corpus.

    ``source`` is ``"multi30k"`` (bundled; splits train/valid/test = train/val/test_2016_flickr,
    languages de and en either way), a ``(src_file, tgt_file)`` pair (``split`` is then ignored),
    a folder with ``{split}.{lang}`` files (``valid`` may be named ``val`` or ``dev``), or a prefix
    such that ``{prefix}.{lang}`` are the files. Each file may be gzipped (``.gz`` is tried too).
    """
    _check_split(split)
    if src_lang == tgt_lang:
        raise DataError(f"src_lang and tgt_lang are both {src_lang!r}; give two different sides")
    src_path, tgt_path, label = _parallel_paths(source, split, src_lang, tgt_lang)
    src, tgt = check_file(src_path), check_file(tgt_path)
    if src.n_lines != tgt.n_lines:
        raise DataError(
            f"{src.path} has {src.n_lines} lines but {tgt.path} has {tgt.n_lines}; a parallel "
            "corpus needs one sentence per line on both sides, line i translating line i"
        )
    return ParallelCorpus(f"{label}.{src_lang}-{tgt_lang}", src, tgt, src_lang, tgt_lang)


def load_text(
    source: str | os.PathLike = "shakespeare",
    split: str = "train",
    valid_fraction: float = 0.1,
    whole_lines: bool = False,
) -> TextCorpus:
    """A checked text corpus for language modelling, cut by characters: ``train`` is the first
    ``1 - valid_fraction`` of the characters, ``valid`` the rest, ``all`` everything; with
    ``whole_lines``, the cut moves on to the next line's start, so that no line (a sentence or a
    document of a one-per-line file) is cut in two and read half in each split.

    ``source`` is ``"shakespeare"`` (bundled tiny-shakespeare) or a path to a plain or gzipped
    UTF-8 text file. For separate train and valid files, load each with ``split="all"``.
    """
    _check_split(split, ("train", "valid", "all"))
    if not 0 < valid_fraction < 1:
        raise DataError(f"valid_fraction={valid_fraction} must be between 0 and 1 (exclusive)")
    key = str(source)
    path = data_dir() / TEXT_DATASETS[key] if key in TEXT_DATASETS else Path(source)
    info = check_file(path)
    cut = int(info.n_chars * (1 - valid_fraction))  # as nanoGPT: data[:int(n * 0.9)]
    if whole_lines and split != "all":
        cut = _line_start(info, cut)
    start, stop = {"train": (0, cut), "valid": (cut, info.n_chars), "all": (0, info.n_chars)}[split]
    if start == stop:
        whole = "; the cut falls in its last line, which is not cut in two: give a separate validation file"
        raise DataError(f"{path}: the {split} split is empty ({info.n_chars} characters in all"
                        f"{whole if whole_lines and cut == info.n_chars else ''})")  # fmt: skip
    return TextCorpus(f"{Path(key).name}.{split}", info, start, stop)


def _line_start(info: FileInfo, cut: int) -> int:
    """The first character at or after ``cut`` that begins a line (``info.n_chars`` if none does)."""
    offset = cut - 1
    for chunk in iter_text(info.path, cut - 1, info.n_chars):  # from the character before the cut
        if (i := chunk.find("\n")) >= 0:
            return offset + i + 1
        offset += len(chunk)
    return info.n_chars


@dataclass(frozen=True)
class CorpusFilter:
    """Which pairs to drop when a parallel corpus is encoded. Lengths are in tokens of each side's
    tokenizer, before the bos/eos that batching adds. The defaults keep every pair of the standard
    Multi30k splits (longest side 57 BPE tokens, largest ratio 5.3 with a joint 8k vocabulary)."""

    drop_empty: bool = True  # a side that is empty or only whitespace: nothing to learn from
    max_len: int | None = 256  # longest side allowed; None = no limit
    max_ratio: float | None = 9.0  # longer/shorter side (Moses clean-corpus uses 9); None = off

    def __post_init__(self) -> None:
        if self.max_len is not None and self.max_len < 1:
            raise ConfigError(f"max_len={self.max_len} must be at least 1 (or None for no limit)")
        if self.max_ratio is not None and self.max_ratio < 1:
            raise ConfigError(f"max_ratio={self.max_ratio} must be at least 1 (or None for off)")

    def reason(self, src: str, tgt: str, n_src: int, n_tgt: int) -> str | None:
        """Why the pair is dropped (a ``FilterStats`` field name), or None to keep it."""
        if self.drop_empty and (not src.strip() or not tgt.strip() or not n_src or not n_tgt):
            return "empty"
        if self.max_len is not None and max(n_src, n_tgt) > self.max_len:
            return "too_long"
        if self.max_ratio is not None:
            lo, hi = sorted((max(n_src, 1), max(n_tgt, 1)))
            if hi / lo > self.max_ratio:
                return "bad_ratio"
        return None

    def keep(self, srcs: Sequence[str], tgts: Sequence[str], src_ids: Sequence[Sequence[int]],
             tgt_ids: Sequence[Sequence[int]], stats: FilterStats) -> list[int]:  # fmt: skip
        """Indices of the encoded pairs to keep; ``stats`` counts them and why the others went."""
        keep = []
        for i, (s, t, a, b) in enumerate(zip(srcs, tgts, src_ids, tgt_ids)):
            if why := self.reason(s, t, len(a), len(b)):
                setattr(stats, why, getattr(stats, why) + 1)
            else:
                keep.append(i)
        stats.total += len(srcs)
        stats.kept += len(keep)
        return keep


@dataclass
class FilterStats:
    """How many pairs an encoding pass read, kept and dropped (by reason)."""

    total: int = 0
    kept: int = 0
    empty: int = 0
    too_long: int = 0
    bad_ratio: int = 0

    def __str__(self) -> str:
        return (
            f"kept {self.kept} of {self.total} pairs (dropped {self.empty} empty, "
            f"{self.too_long} over max_len, {self.bad_ratio} over max_ratio)"
        )
