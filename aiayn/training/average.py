"""Checkpoint averaging (paper §6.1: the base model averages the last 5 checkpoints).

The average of K checkpoints' parameters, written as a new model directory (config and tokenizer
files copied from the newest, and what its ``config.json`` says besides the model: the task, a
classifier's labels and long-text policy, the languages). The checkpoints must share the model's
config and their tokenizer files byte for byte. Averaging is done in float64 to avoid rounding drift.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from aiayn.atomic import atomic_dir
from aiayn.errors import ModelDirError
from aiayn.models.io import CONFIG_FILE, WEIGHTS_FILE, load_model, read_config, save_model
from aiayn.training.checkpoint import STATE_JSON, STATE_TENSORS, step_dirs
from aiayn.training.rundir import TRAIN_CONFIG, read_run_config


def average_checkpoints(paths: list[Path], out_dir: str | os.PathLike) -> Path:
    """Average the weights of ``paths`` (same architecture) into ``out_dir``."""
    if not paths:
        raise ModelDirError("no checkpoints to average")
    metas = [read_config(p) for p in paths]
    configs = [m["config"] for m in metas]
    if (other := next((p for p, c in zip(paths, configs) if c != configs[0]), None)) is not None:
        raise ModelDirError(f"{other} and {paths[0]} hold different model configs; average one model")
    check_same_files(paths)  # before any weights load: a few small files
    total: dict[str, torch.Tensor] = {}
    shapes: dict[str, tuple] | None = None  # the newest's (checked by load_model): every other's too
    for p in reversed(paths):
        try:
            weights = load_file(str(p / WEIGHTS_FILE))
        except (OSError, SafetensorError) as e:
            raise ModelDirError(f"{p / WEIGHTS_FILE} is missing, truncated or corrupt ({e})") from None
        now = {name: tuple(t.shape) for name, t in weights.items()}
        shapes = shapes or now
        if now != shapes:  # a tensor missing would be averaged over fewer, another shape broadcast
            name = sorted(k for k in shapes.keys() | now.keys() if shapes.get(k) != now.get(k))[0]
            was, has = shapes.get(name, "missing"), now.get(name, "missing")
            raise ModelDirError(f"{p / WEIGHTS_FILE}: {name} is {has}, in {paths[-1]} {was}: average one "
                                "run's checkpoints")  # fmt: skip
        for name, tensor in weights.items():
            if not tensor.is_floating_point():  # ids (an output layer's pieces): the same in every one
                if name in total and not torch.equal(total[name], tensor):
                    raise ModelDirError(
                        f"{p} and {paths[-1]} differ in {name}: average one run's checkpoints"
                    )
                total[name] = tensor
                continue
            total[name] = total.get(name, 0) + tensor.double()
    model = load_model(paths[-1])
    model.load_state_dict({k: (v / len(paths)).float() if v.is_floating_point() else v
                           for k, v in total.items()}, strict=False)  # fmt: skip
    out_dir = Path(out_dir)
    with atomic_dir(out_dir) as tmp:
        shutil.copytree(paths[-1], tmp, dirs_exist_ok=True, ignore=shutil.ignore_patterns(*NOT_COPIED))
        # the newest's fields besides the model's own (save_model writes those), e.g. a classifier's
        # labels, without which the averaged model would not load as one
        extra = {k: v for k, v in metas[-1].items() if k not in ("kind", "config", "aiayn_version")}
        save_model(model, tmp, **{**extra, "averaged": [str(p) for p in paths]})
    return out_dir


NOT_COPIED = (CONFIG_FILE, WEIGHTS_FILE, STATE_JSON, STATE_TENSORS)


def check_same_files(paths: list[Path]) -> None:
    """Refuse checkpoints whose other files (the tokenizer's) differ from the newest's, which the
    average is written with: weights trained on one vocabulary, read with another's pieces, would
    translate into nonsense without a word of warning."""

    def files(folder: Path) -> dict[str, bytes]:
        return {str(f.relative_to(folder)): f.read_bytes() for f in sorted(folder.rglob("*"))
                if f.is_file() and f.name not in NOT_COPIED}  # fmt: skip

    newest = files(paths[-1])
    for p in paths[:-1]:
        theirs = files(p)
        if name := next(
            (n for n in sorted(newest.keys() | theirs.keys()) if newest.get(n) != theirs.get(n)), None
        ):
            raise ModelDirError(
                f"{p} and {paths[-1]} hold different {name} (the average is written with the newest's): "
                "average one run's checkpoints"
            )


def last_checkpoints(run_dir: str | os.PathLike, k: int) -> list[Path]:
    """The newest ``k`` checkpoints of a run, oldest first (fewer if it kept fewer). The best one,
    which ``prune`` keeps past the run's ``keep_last``, is not among them when it is older than those:
    it would average a far earlier model in."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ModelDirError(f"{run_dir} does not exist (or is not a directory); give a training run")
    found = [p for _, p in step_dirs(run_dir)]
    if not found:
        raise ModelDirError(f"{run_dir} holds no step-* checkpoints")
    keep_last = None
    if (run_dir / TRAIN_CONFIG).is_file():  # its keep_last tells a best checkpoint kept past it
        fix = "restore it: it says which checkpoints the run kept"
        keep_last = read_run_config(run_dir, fix=fix).get("keep_last")
    best = run_dir / "best"
    if isinstance(keep_last, int) and keep_last > 0 and best.is_symlink():
        older = found[:-keep_last]
        found = [p for p in found if p not in older or p.resolve() != best.resolve()]
    return found[-k:]
