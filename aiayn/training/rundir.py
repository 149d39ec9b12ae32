"""A run directory (``out_dir``): whose it is, whether it may be resumed, and its metrics log.

A run writes ``train_config.json`` (its ``TrainConfig`` and a ``run_id``), ``metrics.jsonl`` (one
JSON record per log line), its tokenizers and its checkpoints (``aiayn.training.checkpoint``).
Nothing here trains; it decides what may be written where, so that a run never writes into a
directory that is not its own and a resumed run computes what the first one would have.
While a run trains, rank 0 holds ``RunLock`` on its directory, so a second run on the same
``out_dir`` stops with the first one's PID instead of interleaving with it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
import stat
import sys
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path

import torch

from aiayn.atomic import write_json, write_text
from aiayn.data.subword import SAMPLES_DIR
from aiayn.data.tokenizer import META_FILE as TOKENIZER_META
from aiayn.data.tokenizer import load_tokenizer
from aiayn.errors import AiaynError, ConfigError, ModelDirError, OutputError
from aiayn.models.io import read_config
from aiayn.temporaries import remove_temporaries
from aiayn.textfiles import absent, read_json
from aiayn.training import checkpoint as ckpt
from aiayn.training.config import TrainConfig, default_dict, inert_fields, to_dict
from aiayn.training.distributed import DistInfo, all_reduce_max
from aiayn.training.task import TOKENIZER_DIR, get_task

TRAIN_CONFIG = "train_config.json"
METRICS = "metrics.jsonl"
# fields that may change when a run is resumed: they do not change what is computed (max_steps and
# max_minutes unless they set where a cosine ends, which check_resume_compatible refuses to move;
# dataset, another spelling of the same data, which the digests of its files in a checkpoint check;
# not eval_max_sentences: it sets the validation set that best and patience compare scores on, unless
# eval_bleu=false; check_resume_compatible also lets pass any field inert_fields finds without effect)
# (short_budget acts once, at update SPEED_UPDATES; a run past it keeps what it decided, which its checkpoints
# hold, so a run started before the field existed resumes under a recipe that sets it)
RESUMABLE_CHANGES = {"max_steps", "max_epochs", "max_minutes", "patience", "eval_every", "log_every",
                     "keep_last", "progress", "device", "threads", "ddp_timeout", "tensorboard", "compile",
                     "out_dir", "short_budget", "dataset"}  # fmt: skip
# what a run that never reached a checkpoint leaves; removed when it is started again (its subword
# samples too: drawn with its tokenizer, they would feed a restarted run with other settings old ids)
RUN_FILES = (TRAIN_CONFIG, METRICS, TOKENIZER_DIR, SAMPLES_DIR, "tensorboard")
LOCK = ".train.lock"  # held (flock) by the run training in the directory; holds that process's PID


class RunLock:
    """An exclusive ``flock`` on ``run_dir/LOCK``, taken by rank 0 before it looks at the directory
    and held until ``release``. The OS drops it when the holder dies (even by SIGKILL), so a lock
    of a dead process is never in the way; the PID in the file is only for the message.
    ``made``: the folders this lock had to make, outermost first, which a run that never starts
    removes again (``remove_made``)."""

    def __init__(self, run_dir: Path, out_dir: str):
        if run_dir.exists() and not run_dir.is_dir():
            raise OutputError(f"out_dir={out_dir!r} is a file; choose a directory for the run")
        self.run_dir, self.path, self.fd, self.made = run_dir, run_dir / LOCK, None, []
        try:
            target = run_dir.absolute()
            for folder in reversed([target, *target.parents]):  # outermost first
                if not folder.exists():
                    with contextlib.suppress(FileExistsError):  # made by another process: not ours
                        folder.mkdir()
                        self.made.append(folder)
            self.fd = self._lock(run_dir)
        except BaseException:
            self.remove_made()
            raise
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, f"{os.getpid()}\n".encode(), 0)

    def _lock(self, run_dir: Path) -> int:
        while True:
            try:  # never through a link: the lock is truncated and written (a planted link's target would be)
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
            except OSError as e:
                if e.errno != errno.ELOOP:
                    raise
                raise OutputError(f"{self.path} is a symbolic link, not aiayn's lock; remove it") from None
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                os.close(fd)
                raise OutputError(f"{self.path} is not a regular file (not aiayn's lock file); remove it")
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
                os.close(fd)
                raise OutputError(
                    f"{run_dir} is in use by another training (PID {holder}, lock {self.path}); wait for "
                    f"it to end or stop it (kill {holder}), or choose another out_dir"
                ) from None
            try:  # the file we locked may have been removed by its last holder: lock the new one
                same = os.path.samestat(os.fstat(fd), os.stat(self.path))
            except FileNotFoundError:
                same = False
            if same:
                return fd
            os.close(fd)

    def remove_made(self) -> None:
        """Remove the run directory if this lock made it, and then each folder above it that it made
        while that is empty: a parent made for this run (``sweep/`` of ``sweep/a``) may meanwhile hold
        another run's directory, which is never touched."""
        if self.made and self.made[-1] == self.run_dir.absolute():  # made last, innermost
            shutil.rmtree(self.run_dir, ignore_errors=True)  # ours: this lock keeps other runs out
        for folder in reversed(self.made):  # innermost first
            try:
                folder.rmdir()
            except FileNotFoundError:
                continue
            except OSError:  # not empty: someone else's now
                break

    def release(self) -> None:
        """Remove the lock file and drop the lock (removing it while held is safe: a process that
        locked the removed file sees that it is no longer ``LOCK`` and takes the new one)."""
        if self.fd is not None:
            self.path.unlink(missing_ok=True)
            os.close(self.fd)
            self.fd = None

    def __del__(self) -> None:  # a Trainer dropped without fit() (tests) frees its directory
        if getattr(self, "fd", None) is not None:
            os.close(self.fd)


def claim_run_dir(run_dir: Path, out_dir: str, dist: DistInfo, device: torch.device) -> RunLock | None:
    """Rank 0's ``RunLock`` on ``run_dir`` (None on the other ranks); when rank 0 cannot take it,
    every rank raises, so none waits for the others forever."""
    lock, error = None, None
    if dist.is_main:
        try:
            lock = RunLock(run_dir, out_dir)
        except (OutputError, OSError) as e:
            error = e
    failed = all_reduce_max(torch.tensor([float(error is not None)], device=device), dist)
    if error is not None:
        raise error
    if failed.item():
        raise OutputError(f"{run_dir}: rank 0 could not lock the run directory (see its message)")
    return lock


def read_run_config(run_dir: Path, fix: str = "resume cannot go on") -> dict:
    """The ``train_config.json`` of a run (its ``TrainConfig`` fields and ``run_id``); ``fix``, what
    an unreadable one means to the caller."""
    return read_json(run_dir / TRAIN_CONFIG, f"{run_dir} is not a training run", fix=fix)


def model_fields(cfg: TrainConfig, model: dict) -> dict:
    """A ``[model]`` table with its model config's defaults filled in (a field written out at its
    default is no change), or as written where it no longer makes a config."""
    task = get_task(cfg.task)
    vocab = task.vocab_placeholder(max(cfg.vocab_size, 256))  # the same on both sides of a comparison
    try:
        return task.model_config.from_dict({**model, **vocab}).to_dict()
    except ValueError:
        return dict(model)


def check_resume_compatible(saved: dict, cfg: TrainConfig, run_dir: Path) -> None:
    """Only the fields in ``RESUMABLE_CHANGES``, and those the config leaves without effect
    (``inert_fields``), may differ from the run's: the others change what is computed. The run is known
    by its ``run_id``, not its path, so a moved run resumes. A cosine keeps its end: ``max_steps``
    moves it when ``decay_steps=0`` (which may then name the old end instead), and ``max_minutes``
    under ``horizon="budget"``."""
    now, default = to_dict(cfg), default_dict(cfg)  # a field added since the run: its default
    was = {k: saved.get(k, default[k]) for k in now}
    if not isinstance(was["model"], dict):
        raise ModelDirError(f"{run_dir / TRAIN_CONFIG}: 'model' is {type(was['model']).__name__}, not the "
                            "run's [model] table; restore the file or start a new run")  # fmt: skip
    models = [model_fields(cfg, fields.pop("model")) for fields in (was, now)]  # compared field by field
    for f in sorted(models[0].keys() | models[1].keys()):
        was[f"model.{f}"], now[f"model.{f}"] = (model.get(f, "unset") for model in models)
    free = RESUMABLE_CHANGES | inert_fields(cfg).keys()  # inert: its switch, if changed, is named instead
    # a different task first: its model's fields differ too, but because of it
    changed = sorted((k for k in now if k not in free and was[k] != now[k]), key=lambda k: (k != "task", k))
    if now["schedule"] == was["schedule"] == "cosine":
        end = was["decay_steps"] or was["max_steps"]
        if end == (now["decay_steps"] or now["max_steps"]):
            changed = [k for k in changed if k != "decay_steps"]  # decay_steps=<the old max_steps>: the same
        elif "decay_steps" not in changed:
            budget = (
                " (under horizon='budget' that adds updates only to a run that stopped at max_steps: "
                "one that used up its max_minutes stops at once; start a new run in another out_dir)"
            )
            raise ConfigError(f"cannot resume {run_dir}: max_steps sets where this run's cosine ends "
                              f"(decay_steps=0): set decay_steps={end} to extend it"
                              f"{budget if was['horizon'] == 'budget' else ''}")  # fmt: skip
        if now["horizon"] == was["horizon"] == "budget" and now["max_minutes"] != was["max_minutes"]:
            minutes = was["max_minutes"]
            raise ConfigError(f"cannot resume {run_dir}: max_minutes sets where this run's cosine ends "
                              f"(horizon='budget'): resume with max_minutes={minutes}")  # fmt: skip
    if changed:
        k = changed[0]
        raise ConfigError(
            f"cannot resume {run_dir}: {k} was {was[k]!r}, now {now[k]!r} "
            f"({len(changed)} incompatible field(s): {', '.join(changed)}); resume with the run's "
            f"settings (its {TRAIN_CONFIG}), or start a new run in another out_dir"
        )


def check_data_files(run_dir: Path, saved: list[list[str]], now: list[list[str]]) -> None:
    """The data files a run reads now (``[path, sha256]``, in the order the task checks them) hold
    what its checkpoint's did; their paths may be spelt otherwise. A ``ConfigError`` names the first
    that changed."""
    if [digest for _, digest in saved] == [digest for _, digest in now]:
        return
    changed = [(was, path) for (was, a), (path, b) in zip(saved, now) if a != b]
    if changed:
        was, path = changed[0]
        detail = f"{path} differs from " + ("what the run read" if path == was else f"the run's {was}")
    else:
        detail = f"the run read {len(saved)} data file(s), this reads {len(now)}"
    raise ConfigError(
        f"cannot resume {run_dir}: the data changed: {detail} (sha256); restore the data the run was "
        "trained on, or train a new run in another out_dir"
    )


def plan_run_dir(run_dir: Path, cfg: TrainConfig, resume: bool) -> tuple[str, list[Path], bool]:
    """What ``out_dir`` holds and what to do with it: ``(run_id, checkpoints newest first, restart)``.

    A run with checkpoints continues only with ``--resume`` and compatible settings; a run that
    stopped before its first checkpoint is started again (``restart``: its files are ours to
    replace); anything else that is not empty is not ours, and is never written into.
    """
    if run_dir.exists() and not run_dir.is_dir():
        raise OutputError(f"out_dir={cfg.out_dir!r} is a file; choose a directory for the run")
    checkpoints = [p for _, p in reversed(ckpt.step_dirs(run_dir))]
    saved_models = any(run_dir.glob("step-*")) or (run_dir / "best").is_symlink()
    if saved_models and not resume:
        raise OutputError(f"{run_dir} already holds a run: pass --resume, or choose another out_dir")
    if checkpoints:
        saved = read_run_config(run_dir)
        check_resume_compatible(saved, cfg, run_dir)
        return str(saved.get("run_id") or uuid.uuid4().hex), checkpoints, False  # a run from before ids: new
    if saved_models:
        raise OutputError(f"{run_dir} holds models but no trainer state to resume; choose another out_dir")
    if (run_dir / TRAIN_CONFIG).is_file():
        return uuid.uuid4().hex, [], True
    if resume:
        config = run_dir / TRAIN_CONFIG
        raise ModelDirError(f"cannot resume: {config} {absent(config)} ({run_dir} holds no run)")
    if run_dir.is_dir() and any(p.name != LOCK for p in run_dir.iterdir()):
        raise OutputError(f"out_dir={cfg.out_dir!r} is not empty and holds no run; choose a new directory")
    return uuid.uuid4().hex, [], False


def prepare_run_dir(run_dir: Path, cfg: TrainConfig, run_id: str, restart: bool) -> None:
    """Rank 0's writes before training (after ``plan_run_dir``): a restarted run's files removed,
    the directory made, stray temporaries of a killed checkpoint write removed, the config written."""
    if restart:
        print(f"aiayn train: {run_dir} has no checkpoint: starting it again", file=sys.stderr)
        for name in RUN_FILES:
            path = run_dir / name
            shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
    run_dir.mkdir(parents=True, exist_ok=True)
    remove_temporaries(run_dir)
    write_json(run_dir / TRAIN_CONFIG, {**to_dict(cfg), "run_id": run_id})


def _record(line: str) -> dict | None:
    """A metrics line as a dict, or None for a torn or foreign one (a run killed mid-write)."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        return None
    return record if isinstance(record, dict) and isinstance(record.get("step", 0), int) else None


def truncate_metrics(run_dir: Path, step: int) -> None:
    """Drop the metrics lines logged after update ``step`` (a resumed run redoes them), and torn ones."""
    path = run_dir / METRICS
    if path.exists():
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        kept = [ln for ln in lines if (r := _record(ln)) is not None and r.get("step", 0) <= step]
        write_text(path, "".join(ln + "\n" for ln in kept))


def check_resumed_tokenizers(run_dir: Path, path: Path, save_tokenizers: Callable[[Path], None]) -> None:
    """The tokenizers the run reads now (``save_tokenizers`` writes them as into a checkpoint) define
    the vocabularies (``model_bytes``) that the checkpoint ``path`` was trained with: a run copied
    without its tokenizer folder trains it again when resumed, and another sentencepiece version may
    cut the same text into other pieces of the same count, which the weights would load on without a
    word. Compared where both hold an aiayn tokenizer (``tokenizer.json``); the files' bytes are not
    (a later save format is no other vocabulary)."""
    with tempfile.TemporaryDirectory() as tmp:
        save_tokenizers(Path(tmp))
        for meta in sorted(Path(tmp).rglob(TOKENIZER_META)):
            where = meta.parent.relative_to(tmp)
            try:
                ours, saved = load_tokenizer(meta.parent), load_tokenizer(path / where)
            except (AiaynError, OSError):  # none there (an older layout), or not aiayn's: nothing to compare
                continue
            if ours.model_bytes() != saved.model_bytes():
                raise ConfigError(
                    f"cannot resume {run_dir}: its tokenizer ({run_dir / TOKENIZER_DIR}) is not the one "
                    f"{path.name} was trained with (the vocabulary in {path / where} differs: trained "
                    "again, or replaced); put the run's own back (checkpoints hold a copy beside their "
                    "config.json)"
                )


def check_resumed_data(run_dir: Path, path: Path, meta_now: dict, data_files: list) -> None:
    """What the checkpoint ``path`` recorded of the data (``task.model_meta``: a classifier's labels;
    its files' digests) is what the data gives now (``meta_now``, ``data_files``); a change (a label new
    in the training data, a file edited) is named, not loaded. The dataset may be spelt otherwise where
    the files are the same."""
    saved = read_config(path)
    files = read_json(path / ckpt.STATE_JSON, "the checkpoint is incomplete").get("data_files")
    for key, now in meta_now.items():
        was = saved.get(key, now)
        if was == now or (key == "dataset" and files is not None):  # the files' digests say
            continue
        if isinstance(was, list) and isinstance(now, list):
            change = [f"{x!r} is new" for x in now if x not in was] + [
                f"{x!r} is gone" for x in was if x not in now
            ]
            change_text = ", ".join(change) or "their order changed"
            detail = f"{key}: {change_text} (the run was trained on {', '.join(map(repr, was))})"
        else:
            detail = f"{key} is {now!r}, the run's is {was!r}"
        raise ConfigError(
            f"cannot resume {run_dir}: in the training data now, {detail}; restore the data the "
            "run was trained on, or train a new run in another out_dir"
        )
    if files is not None:
        check_data_files(run_dir, files, data_files)
