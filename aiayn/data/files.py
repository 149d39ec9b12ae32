"""Where data lives and how a text file is read: checked once, then streamed line by line.

This module finds the bundled ``data/`` folder and the cache folder, and reads plain or gzipped
UTF-8 text files. ``check_file`` makes one streaming pass over a file (never holding it whole) that
rejects a missing path, a directory, an empty or all-blank file, a broken gzip stream or invalid
UTF-8 with a ``DataError`` naming the file (and the 1-based line), and returns the line count,
character count and a SHA-256 of the decompressed bytes (the cache key; ``checked_files`` gathers
those of a training run's data, which its checkpoints record). ``iter_lines`` splits
on ``"\\n"`` only (plus one ``"\\r"`` before it), never on the other characters ``str.splitlines``
treats as line breaks, so line i of a source file stays aligned with line i of its target file,
and ``open_bytes`` skips a UTF-8 byte-order mark (``BOM``, which Excel's "CSV UTF-8" and Notepad write)
before the text, which would otherwise hide a header and enter the vocabulary. It does not
tokenize, filter or pair lines; see ``corpus.py``.
"""

from __future__ import annotations

import codecs
import contextlib
import contextvars
import gzip
import hashlib
import io
import os
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from aiayn.errors import DataError

BLOCK = 1 << 20  # bytes read at a time: memory stays flat whatever the file size
GZIP_MAGIC = b"\x1f\x8b"
BOM = b"\xef\xbb\xbf"  # U+FEFF encoded: a byte-order mark some editors put before a UTF-8 file's text


def repo_root() -> Path:
    """The checkout this package was installed from (``pip install -e .``)."""
    return Path(__file__).resolve().parents[2]


def data_dir() -> Path:
    """The bundled datasets: ``$AIAYN_DATA_DIR`` if set, else ``<repo>/data``."""
    env = os.environ.get("AIAYN_DATA_DIR")
    path = Path(env) if env else repo_root() / "data"
    if not path.is_dir():
        where = "AIAYN_DATA_DIR points to" if env else "the bundled data folder is"
        raise DataError(
            f"{where} {path}, which is not a folder; install aiayn from its git checkout "
            "(pip install -e .) or set AIAYN_DATA_DIR to a folder holding multi30k/ and "
            "tinyshakespeare/"
        )
    return path


def cache_dir() -> Path:
    """Where encoded corpora go: ``$AIAYN_CACHE_DIR`` if set, else ``<repo>/.cache/aiayn``."""
    env = os.environ.get("AIAYN_CACHE_DIR")
    return Path(env) if env else repo_root() / ".cache" / "aiayn"


@dataclass(frozen=True)
class FileInfo:
    """A checked text file: what ``check_file`` learnt in its one pass."""

    path: Path
    n_lines: int  # "\n" count, plus one for an unterminated last line
    n_chars: int  # Unicode code points in the decompressed text
    sha256: str  # of the decompressed bytes: same text, same key, whatever the compression


def open_bytes(path: Path) -> BinaryIO:
    """Open for binary reading, decompressing when the file starts with the gzip magic bytes, past
    a ``BOM`` at the start of the text (so no reader, count or cache key ever sees one)."""
    f = open(path, "rb")  # noqa: SIM115 -- returned to the caller, who closes it
    if f.read(2) == GZIP_MAGIC:
        f.close()  # the outer buffer makes line iteration run in C, not through GzipFile.readline
        f = io.BufferedReader(gzip.open(path, "rb"), buffer_size=BLOCK)  # noqa: SIM115 -- likewise
    else:
        f.seek(0)
    if f.peek(len(BOM)).startswith(BOM):
        f.read(len(BOM))
    return f


def read_error(path: str | os.PathLike, e: Exception) -> DataError:
    return DataError(f"{path}: cannot read it ({e}); if it is gzipped, check it with gzip -t")


_RECORD: contextvars.ContextVar[list[FileInfo] | None] = contextvars.ContextVar("checked_files", default=None)


@contextlib.contextmanager
def checked_files() -> Iterator[list[FileInfo]]:
    """The files ``check_file`` checks inside the block, in order: the data a training run reads,
    whose digests a resumed run compares with the ones it was trained on."""
    seen: list[FileInfo] = []
    token = _RECORD.set(seen)
    try:
        yield seen
    finally:
        _RECORD.reset(token)


def check_file(path: str | os.PathLike) -> FileInfo:
    """Check that ``path`` is a readable, non-empty UTF-8 text file (plain or gzip); count and hash."""
    path = Path(path)
    if not path.exists():
        raise DataError(f"{path}: no such file; check the path (or the dataset name)")
    if path.is_dir():
        raise DataError(f"{path} is a directory; give the text file inside it")
    if not path.is_file():  # a pipe or a device: read more than once here (counted, then read)
        raise DataError(f"{path} is not a regular file (a pipe?); save it to a file first")
    h, decoder = hashlib.sha256(), codecs.getincrementaldecoder("utf-8")("strict")
    n_bytes = n_newlines = n_chars = 0
    last, has_text = b"\n", False
    try:
        with open_bytes(path) as f:
            while block := f.read(BLOCK):
                h.update(block)
                n_bytes += len(block)
                has_text = has_text or bool(block.strip())
                n_newlines += block.count(b"\n")
                n_chars += len(decoder.decode(block))
                last = block[-1:]
            n_chars += len(decoder.decode(b"", final=True))
    except UnicodeDecodeError:
        raise DataError(
            f"{path}: line {_first_bad_line(path)} is not valid UTF-8; re-encode the file "
            "(e.g. iconv -f latin1 -t utf-8) or remove that line (from both sides of a parallel corpus)"
        ) from None
    except (OSError, EOFError, zlib.error) as e:
        raise read_error(path, e) from None
    if n_bytes == 0:
        raise DataError(f"{path} is empty; give a file with one sentence (or text) per line")
    n_lines = n_newlines + (last != b"\n")
    if not has_text:
        raise DataError(
            f"{path} holds only blank lines ({n_lines} lines, no text); give a file with one sentence "
            "(or text) per line"
        )
    info = FileInfo(path=path, n_lines=n_lines, n_chars=n_chars, sha256=h.hexdigest())
    if (seen := _RECORD.get()) is not None:
        seen.append(info)
    return info


def record_file(path: str | os.PathLike, sha256: str) -> None:
    """Count a file that is not text (a model's weights a run reads, already hashed) among the files
    ``checked_files`` records, so that a resumed run is refused when it changed."""
    if (seen := _RECORD.get()) is not None:
        seen.append(FileInfo(path=Path(path), n_lines=0, n_chars=0, sha256=sha256))


def _first_bad_line(path: Path) -> int:
    with open_bytes(path) as f:
        for i, raw in enumerate(f, start=1):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError:
                return i
    return 0  # unreachable when called after a decode error


def split_lines(text: str) -> list[str]:
    """``text`` cut at ``"\n"`` only (one ``"\r"`` before it dropped), as ``iter_lines`` reads a file:
    ``str.splitlines`` would also cut at U+0085, U+2028, form feeds…, which scraped text holds."""
    return [line[:-1] if line.endswith("\r") else line for line in text.split("\n")]


def iter_lines(path: Path) -> Iterator[str]:
    """The lines of a checked file, without their ``"\\n"`` / ``"\\r\\n"`` ending (the last line's
    ``"\\r"`` too where the file ends without a newline, as ``split_lines`` reads it)."""
    try:
        with open_bytes(path) as f:
            for i, raw in enumerate(f, start=1):
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError:
                    raise DataError(f"{path}: line {i} is not valid UTF-8 (file changed?)") from None
                line = line.removesuffix("\n")
                yield line.removesuffix("\r")
    except (OSError, EOFError, zlib.error) as e:
        raise read_error(path, e) from None


def iter_text(path: Path, start: int, stop: int, size: int = BLOCK) -> Iterator[str]:
    """Characters ``start:stop`` of a checked file, in pieces of about ``size`` characters, each
    ending after a newline where the piece has one (so a subword tokenizer sees whole lines)."""
    decoder = codecs.getincrementaldecoder("utf-8")("strict")
    pos, pending = 0, ""
    try:
        with open_bytes(path) as f:
            while pos < stop and (block := f.read(size)):
                text = decoder.decode(block)
                lo, hi = max(start - pos, 0), min(stop - pos, len(text))
                pos += len(text)
                pending += text[lo:hi] if lo < hi else ""
                cut = pending.rfind("\n") + 1
                if cut == 0 and len(pending) < 4 * size:  # no newline yet: wait for one, a while
                    continue
                cut = cut or len(pending)
                yield pending[:cut]
                pending = pending[cut:]
    except (OSError, EOFError, zlib.error) as e:
        raise read_error(path, e) from None
    if pending:
        yield pending
