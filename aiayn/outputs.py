"""What a command may write over: the one rule for every output (``check_output``), and for a folder of
figures (``check_figure_dir``).

Never a command's own inputs nor anything inside an input directory; a directory that holds a model or
a training run only when told to (``--force``), and never one that is not ours (``holds_model`` looks
at what is there, not only at its names); never anything but a regular file, where a FIFO, a terminal
or ``/dev/null`` is written into directly (``aiayn.atomic.output_target``). The writing itself is
``aiayn.atomic``'s: temporary name, then rename.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

from aiayn.atomic import output_target
from aiayn.errors import OutputError
from aiayn.temporaries import TMP_PREFIX, recover, temporary_name

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
    "subword", ".train.lock",  # a run's subword samples; the lock a killed run left
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
