"""Atomic writes: a file or directory appears complete under its name, or not at all.

Every file the package writes goes through here. The content is written under a temporary name in
the same folder (``.tmp-NAME-PID-RANDOM``, NAME cut short so that any legal name fits) and renamed
into place, so a crash, a full disk, a Ctrl-C or a SIGKILL never leaves half a file behind, and
the previous version stays intact until the new one is complete. A directory is swapped in with
one ``renameat2(RENAME_EXCHANGE)`` where Linux has it, else in two renames recorded in a journal
that the next writer in that folder replays (``recover``); temporaries whose process is dead are
removed then too. ``check_output`` is the one rule for what a command may write over: never its
own inputs nor anything inside an input directory, a model or run only when told to (``--force``),
never a directory that is not ours, and never anything but a regular file: a FIFO, a terminal or
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


# -- what a command may write over ---------------------------------------------------------------

MODEL_MARKERS = (
    "config.json",
    "model.safetensors",
    "train_config.json",
    "model.bin",
)  # aiayn's, HF's, CTranslate2's
# every name a model directory, a checkpoint or a run of aiayn's (or an HF export) may hold
MODEL_ENTRIES = {
    *MODEL_MARKERS, "generation_config.json", "tokenizer.json", "spm.model", "src", "tgt", "tokenizer",
    "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt", "source.spm",
    "target.spm", "trainer_state.json", "trainer_state.safetensors", "metrics.jsonl", "best", "averaged",
    "tensorboard", "loss.png", "lr.png", "bleu.png", "accuracy.png", ".aiayn-demo", "shared_vocabulary.json",
    "source_vocabulary.json", "target_vocabulary.json", "vocab.txt", "aiayn_tokenizer",
    "target_vocab.json",  # a Marian export's target side, where the vocabularies differ
}  # fmt: skip


# the folders of a model, checkpoint or run whose contents are model entries too (a tensorboard folder
# holds its event files; best is a link)
MODEL_FOLDERS = {"src", "tgt", "tokenizer", "aiayn_tokenizer", "averaged"}


def _only_model_entries(directory: Path, depth: int = 0) -> bool:
    """Every entry of ``directory`` a name that models, checkpoints and runs use, down through
    their own folders (a ``src`` folder of C files is not a tokenizer)."""
    for entry in directory.iterdir():
        name = entry.name
        if name.startswith(TMP_PREFIX):
            continue
        if name not in MODEL_ENTRIES and not name.startswith("step-"):
            return False
        looked_into = name in MODEL_FOLDERS or name.startswith("step-")
        if (
            looked_into
            and entry.is_dir()
            and not entry.is_symlink()
            and (depth >= 3 or not _only_model_entries(entry, depth + 1))
        ):
            return False
    return True


def _model_config(path: Path) -> bool:
    """Whether ``path`` is a model's ``config.json``: aiayn's (``kind`` and ``config``), HF's
    (``model_type``) or CTranslate2's (beside its ``model.bin``), not any JSON file of that name."""
    try:
        if path.stat().st_size > 1 << 20:
            return False
        meta = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError):
        return False
    if not isinstance(meta, dict):
        return False
    return {"kind", "config"} <= meta.keys() or "model_type" in meta or (path.parent / "model.bin").is_file()


def holds_model(directory: Path) -> bool:
    """Whether ``directory`` holds a model (aiayn's or HF's), a checkpoint or a training run, and
    nothing else: only such a directory may be replaced as a whole, and only with ``--force``. Names
    alone do not tell (a project's ``config.json`` and ``src``): folders are looked into, and a
    ``config.json`` counts only as a model's."""
    if not _only_model_entries(directory):
        return False
    names = {p.name for p in directory.iterdir()}
    markers = names & {"model.safetensors", "train_config.json", "model.bin"}
    return (
        bool(markers)
        or any(n.startswith("step-") for n in names)
        or ("config.json" in names and _model_config(directory / "config.json"))
    )


def _within(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def check_output(
    path: str | os.PathLike,
    inputs: tuple[str | os.PathLike | None, ...] = (),
    *,
    directory: bool = False,
    force: bool = False,
    option: str = "output",
    runs: bool = True,
) -> Path:
    """The one rule for every output a command writes; raises ``OutputError`` naming ``option``.

    ``inputs`` are all the paths the command reads (model directories, input files, references).
    - Never an input (paths resolved, symlinks followed), nor anything already inside an input
      directory, nor (for a directory output) a directory that contains an input.
    - A file output needs an existing folder and is a regular file or a new name; a FIFO or a
      character device is streamed into (``output_target``); ``-`` is stdout.
    - A directory output (replaced as a whole by ``atomic_dir``) may be missing or empty; one that
      holds a model or a run is replaced only with ``force`` (a run never, with ``runs=False``: an
      output that is a model, written over a run's checkpoints by mistake); anything else is not
      ours, and is never written into.
    Returns the path as given.
    """
    given = Path(path)
    if not directory and str(path) == "-":
        return given
    out = given.resolve()
    for item in inputs:
        if item is None:
            continue
        src = Path(item).resolve()
        inside = _within(out, src) and (out == src or os.path.lexists(out))
        if inside or (directory and _within(src, out)):
            raise OutputError(
                f"{option} {given} would overwrite {item}, an input of this command; choose another {option}"
            )
    if not directory:
        if out.is_dir():
            raise OutputError(f"{option} {given} is a directory; give a file name")
        if given.is_symlink() and not given.exists():
            raise OutputError(f"{option} {given} is a symbolic link to nothing; give a file name")
        try:
            _, stream = output_target(given)
        except OutputError as e:
            raise OutputError(f"{option} {e}") from None
        if not out.parent.is_dir():
            raise OutputError(f"{option} {given}: folder {given.parent} does not exist; create it first")
        if not stream:  # a file renamed into place there (a FIFO or device is written into)
            _check_writable(out.parent, option, given)
        return given
    if given.is_symlink():
        raise OutputError(f"{option} {given} is a symbolic link; give the directory it points to")
    if out.exists() and not out.is_dir():
        raise OutputError(f"{option} {given} is a file; give a directory")
    recover(out.parent)
    if out.is_dir() and any(out.iterdir()):
        if not holds_model(out):
            raise OutputError(
                f"{option} {given} is a non-empty directory that holds no model (or more than one); "
                "choose a new or empty one"
            )
        if not runs and any(p.name.startswith("step-") or p.name == "metrics.jsonl" for p in out.iterdir()):
            raise OutputError(f"{option} {given} is a training run: its checkpoints would be lost; choose "
                              "another directory")  # fmt: skip
        run_files = ("metrics.jsonl", "train_config.json")
        if not runs and out.name.startswith("step-") and any((out.parent / n).exists() for n in run_files):
            raise OutputError(f"{option} {given} is a checkpoint of the training run {given.parent}: it "
                              "would be lost; choose another directory")  # fmt: skip
        if not force:
            raise OutputError(f"{option} {given} already holds a model; pass --force to replace it")
    if out.parent.is_dir():  # a missing parent is atomic_dir's to make
        _check_writable(out.parent, option, given)
    return given


def _check_writable(folder: Path, option: str, given: Path) -> None:
    """An ``OutputError`` now, where ``folder`` takes no new file, rather than after the work."""
    probe = temporary_name(folder / given.name)
    try:
        os.close(os.open(probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        probe.unlink()
    except OSError as e:
        raise OutputError(f"{option} {given}: cannot write in {folder} ({e.strerror or e})") from None


def check_figure_dir(
    path: str | os.PathLike,
    figure: Callable[[str], bool],
    inputs: tuple[str | os.PathLike | None, ...] = (),
    *,
    option: str = "--out",
) -> Path:
    """The output rule for a folder of figures, each written whole (by rename) and named by the
    command (``aiayn attention``, ``aiayn plot --out``); raises ``OutputError`` naming ``option``.

    The folder may be new, empty, or hold only names ``figure`` accepts (the same command's
    figures, which a rerun replaces); never an input, nor inside one, nor a folder that holds
    anything else (it is not this command's). Returns the path as given."""
    given = Path(path)
    out = given.resolve()
    for item in inputs:
        if item is not None and _within(out, Path(item).resolve()):
            raise OutputError(
                f"{option} {given} is inside {item}, an input of this command; choose another {option}"
            )
    if out.exists() and not out.is_dir():
        raise OutputError(f"{option} {given} is a file; give a folder")
    entries = out.iterdir() if out.is_dir() else ()
    others = sorted(p.name for p in entries if not (p.is_file() and figure(p.name)))
    if others:
        raise OutputError(
            f"{option} {given} holds files this command does not write ({', '.join(others[:3])}"
            f"{', …' if len(others) > 3 else ''}); choose a new or empty folder"
        )
    return given
