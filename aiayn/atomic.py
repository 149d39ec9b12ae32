"""Atomic writes: a file or directory appears complete under its name, or not at all.

Every file the package writes goes through here. The content is written under a temporary name in
the same folder (``.tmp-NAME-PID``) and renamed into place with ``os.replace``, which is atomic on
POSIX and Windows, so a crash, a full disk or a Ctrl-C never leaves half a file behind, and the
previous version stays intact until the new one is complete. ``check_output`` is the one rule for
what a command may write over: never its own inputs, a model or run only when told to (``--force``),
never a directory that is not ours.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

from aiayn.errors import OutputError

TMP_PREFIX = ".tmp-"


def temporary_name(path: Path) -> Path:
    """A private name beside ``path`` (same folder, so the final rename stays on one file system)."""
    return path.with_name(f"{TMP_PREFIX}{path.name}-{os.getpid()}")


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path to write ``path``'s content to; rename it into place on success.

    For writers that take a file name (``safetensors.save_file``, sentencepiece)."""
    path = Path(path)
    tmp = temporary_name(path)
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_bytes(path: str | os.PathLike, data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def write_json(path: str | os.PathLike, data: object) -> None:
    """``data`` as indented JSON with sorted keys, atomically."""
    write_text(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike, keep: Callable[[Path], bool] | None = None) -> Iterator[Path]:
    """Yield an empty temporary directory; on success it replaces ``path`` (an existing directory
    there is removed only after the new one is complete). On failure nothing changes.

    ``keep(path)``, asked once the new directory is complete, may keep what is there instead: a
    content-addressed cache entry that another process published meanwhile is as good as ours,
    and replacing it would pull it from under that process."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_name(path)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        yield tmp
        if keep is not None and keep(path):
            return
        if path.is_dir() and not path.is_symlink():
            old = path.with_name(f"{TMP_PREFIX}old-{path.name}-{os.getpid()}")
            os.rename(path, old)
            os.rename(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def remove_temporaries(folder: str | os.PathLike) -> None:
    """Delete what an interrupted atomic write left in ``folder``."""
    for p in Path(folder).glob(TMP_PREFIX + "*"):
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)


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
    "source_vocabulary.json", "target_vocabulary.json",
}  # fmt: skip


def holds_model(directory: Path) -> bool:
    """Whether ``directory`` holds a model (aiayn's or HF's), a checkpoint or a training run, and
    nothing else: only such a directory may be replaced as a whole, and only with ``--force``."""
    names = [p.name for p in directory.iterdir()]
    ours = all(n in MODEL_ENTRIES or n.startswith(("step-", TMP_PREFIX)) for n in names)
    return ours and any(n in MODEL_MARKERS or n.startswith("step-") for n in names)


def _within(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def check_output(
    path: str | os.PathLike,
    inputs: tuple[str | os.PathLike | None, ...] = (),
    *,
    directory: bool = False,
    force: bool = False,
    option: str = "output",
) -> Path:
    """The one rule for every output a command writes; raises ``OutputError`` naming ``option``.

    - Never an input of the same command (paths resolved, symlinks followed), a file inside an
      input directory that exists already, nor a directory that contains an input.
    - A file output needs an existing folder and must not be a directory.
    - A directory output (replaced as a whole by ``atomic_dir``) may be missing or empty; one that
      holds a model or a run is replaced only with ``force``; anything else is not ours, and is
      never written into.
    Returns the path as given.
    """
    given = Path(path)
    out = given.resolve()
    for item in inputs:
        if item is None:
            continue
        src = Path(item).resolve()
        clash = out == src or (src.is_dir() and _within(out, src) and out.exists())
        if clash or (directory and _within(src, out)):
            raise OutputError(
                f"{option} {given} would overwrite {item}, an input of this command; choose another {option}"
            )
    if not directory:
        if out.is_dir():
            raise OutputError(f"{option} {given} is a directory; give a file name")
        if not out.parent.is_dir():
            raise OutputError(f"{option} {given}: folder {given.parent} does not exist; create it first")
        return given
    if given.is_symlink():
        raise OutputError(f"{option} {given} is a symbolic link; give the directory it points to")
    if out.exists() and not out.is_dir():
        raise OutputError(f"{option} {given} is a file; give a directory")
    if out.is_dir() and any(out.iterdir()):
        if not holds_model(out):
            raise OutputError(
                f"{option} {given} is a non-empty directory that holds no model (or more than one); "
                "choose a new or empty one"
            )
        if not force:
            raise OutputError(f"{option} {given} already holds a model; pass --force to replace it")
    return given
