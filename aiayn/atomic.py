"""Atomic writes: a file or directory appears complete under its name, or not at all.

Every file the package writes goes through here. The content is written under a temporary name in
the same folder (``.tmp-NAME-PID-RANDOM``, NAME cut short so that any legal name fits) and renamed
into place, so a crash, a full disk, a Ctrl-C or a SIGKILL never leaves half a file behind, and
the previous version stays intact until the new one is complete. A directory is swapped in with
one ``renameat2(RENAME_EXCHANGE)`` where Linux has it, else in two renames recorded in a journal
that the next writer in that folder replays (``recover``); temporaries whose process is dead are
removed then too. What a command may write over at all is ``aiayn.outputs``' rule; a FIFO, a terminal or
``/dev/null`` is written into directly (``output_target``), never renamed over.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import json
import os
import shutil
import stat
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from safetensors import SafetensorError

from aiayn.errors import OutputError
from aiayn.temporaries import JOURNAL, OLD, TMP_PREFIX, recover, temporary_name, usual_mode


class WriteError(OutputError):
    """An output could not be written (a full disk); ``reason`` is the writer's own message."""

    def __init__(self, path: Path, reason: str):
        super().__init__(f"cannot write {path}: {reason}; nothing was written there")
        self.reason = reason


@contextlib.contextmanager
def _writing(path: Path) -> Iterator[None]:
    """A writer's failure as one error naming ``path`` (the outermost output, where writes nest);
    a full disk reaches safetensors as its own exception type."""
    try:
        yield
    except WriteError as e:
        raise WriteError(path, e.reason) from None
    except SafetensorError as e:
        raise WriteError(path, str(e)) from None
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            raise WriteError(path, e.strerror or str(e)) from None
        ours = e.filename is not None and Path(e.filename).name.startswith(TMP_PREFIX)  # not an input's
        if ours and e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):  # a lost race stays the caller's
            raise WriteError(path, e.strerror or str(e)) from None
        raise


def output_target(path: str | os.PathLike) -> tuple[Path, bool]:
    """Where an output named ``path`` is written, and whether it is streamed into directly.

    A regular file (or a new name) is replaced atomically at the file a symbolic link points to, so
    the link stays; a FIFO, a character device (a terminal, ``/dev/null``) or a file reached through
    ``/proc`` or ``/dev`` (``/dev/stdout``) is written into directly and never renamed over; a link
    to a directory (a run's ``best``) or to nothing is itself replaced; anything else is refused."""
    path = Path(path)
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return path, False
    real, special = os.path.realpath(path), ("/proc/", "/dev/")  # /dev/stdout >> log: log's to keep
    through = os.path.abspath(path).startswith(special) or real.startswith(special)
    if stat.S_ISREG(mode) and os.path.isfile(real) and not through:
        return Path(real), False
    if stat.S_ISFIFO(mode) or stat.S_ISCHR(mode) or stat.S_ISREG(mode):  # a device, or an open file
        return path, True
    if stat.S_ISDIR(mode) and path.is_symlink():
        return path, False
    kind = "a directory" if stat.S_ISDIR(mode) else "not a regular file"
    raise OutputError(f"{path} is {kind}; give a file name")


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path to write ``path``'s content to; rename it into place on success.

    For writers that take a file name (``safetensors.save_file``, sentencepiece)."""
    target, stream = output_target(path)
    if stream:
        with _writing(target):
            yield target
        return
    tmp = temporary_name(target)
    try:
        with _writing(target):
            yield tmp
            usual_mode(tmp)
            os.replace(tmp, target)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


@contextlib.contextmanager
def open_output(path: str | os.PathLike | None) -> Iterator[BinaryIO]:
    """A binary stream to write an output to piece by piece: stdout for ``None`` or ``-``, else
    ``path`` as ``atomic_path`` writes it (whole once the block ends without an error)."""
    if path is None or str(path) == "-":
        try:
            yield sys.stdout.buffer
            sys.stdout.buffer.flush()
        except OSError as e:  # a file the caller read or wrote meanwhile: its own error; a reader that
            if e.filename is not None or isinstance(e, BrokenPipeError):  # left: the CLI ends quietly
                raise
            raise OutputError(f"cannot write to standard output: {e.strerror or e}") from None
        return
    streamed = output_target(path)[1]  # appended to: /dev/stdout opened "w" would truncate a >> log
    with atomic_path(path) as tmp, open(tmp, "ab" if streamed else "wb") as f:
        yield f


def write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    write_bytes(path, text.encode("utf-8"))


def write_bytes(path: str | os.PathLike, data: bytes) -> None:
    with open_output(path) as f:
        f.write(data)


def write_json(path: str | os.PathLike, data: object) -> None:
    """``data`` as indented JSON with sorted keys, atomically."""
    write_text(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


@functools.cache
def _renameat2() -> Callable | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):  # a libc without it (glibc < 2.28, musl < 1.2.4)
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    return fn


def exchange(a: Path, b: Path) -> bool:
    """Swap ``a`` and ``b`` in one atomic step (Linux ``renameat2(RENAME_EXCHANGE)``); False where
    the system or the file system cannot."""
    fn = _renameat2()
    if fn is None:
        return False
    at_fdcwd, rename_exchange = -100, 2
    if fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def replace_dir(new: Path, path: Path) -> None:
    """Put the complete directory ``new`` at ``path``, whole: at every instant ``path`` is the old
    directory or the new one. Without ``exchange``, two renames with a journal that ``recover``
    replays if this process dies between them."""
    if not path.is_dir() or path.is_symlink():
        os.replace(new, path)
    elif exchange(new, path):  # ``new`` now holds the old directory
        shutil.rmtree(new, ignore_errors=True)
    else:
        journal, old = new.with_name(new.name + JOURNAL), new.with_name(new.name + OLD)
        journal.write_text(json.dumps({"target": path.name, "new": new.name}), encoding="utf-8")
        os.rename(path, old)
        os.rename(new, path)
        shutil.rmtree(old, ignore_errors=True)
        journal.unlink()


def sync(path: Path) -> None:
    """Flush ``path`` (a file, or a directory's entries) to the disk. A file system that cannot sync
    a directory (some network ones) is left to its own order."""
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if path.is_dir() else 0))
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EBADF) or not path.is_dir():
            raise
    finally:
        os.close(fd)


def _sync_tree(folder: Path) -> None:
    """Every file and folder under ``folder``, and ``folder``, flushed to the disk (innermost first)."""
    for root, dirs, files in os.walk(folder, topdown=False):
        for name in [*files, *dirs]:
            if not os.path.islink(os.path.join(root, name)):
                sync(Path(root, name))
    sync(folder)


@contextlib.contextmanager
def atomic_dir(
    path: str | os.PathLike, keep: Callable[[Path], bool] | None = None, durable: bool = False
) -> Iterator[Path]:
    """Yield an empty temporary directory; on success it replaces ``path`` (``replace_dir``). On
    failure nothing changes. What killed writers left in the folder is cleaned first (``recover``).

    ``keep(path)``, asked once the new directory is complete, may keep what is there instead: a
    content-addressed cache entry that another process published meanwhile is as good as ours,
    and replacing it would pull it from under that process.

    ``durable``: the new directory's content is on the disk before it takes the name, and the name
    once this returns, so that a machine that crashes after (a power cut, not only a killed process)
    finds it whole: what a writer that deletes older copies next (checkpoints) needs. A rename alone
    may reach the disk before the data it names."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    recover(path.parent)
    tmp = temporary_name(path)
    tmp.mkdir()
    try:
        with _writing(path):
            yield tmp
            if keep is not None and keep(path):
                return
            if durable:
                _sync_tree(tmp)
            replace_dir(tmp, path)
            if durable:
                sync(path.parent)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
