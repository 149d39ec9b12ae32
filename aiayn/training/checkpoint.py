"""Training checkpoints: a model directory plus everything needed to resume exactly.

A checkpoint ``RUN/step-000500/`` holds
    config.json, model.safetensors   the model (``aiayn.models.io``), loadable on its own
    tokenizer files                  written by the tokenizer's own ``save``
    trainer_state.json               step, data position, best score, optimizer hyper-parameters,
                                     Python RNG state, the data files' digests, the number of
                                     processes, anything else JSON can hold
    trainer_state.safetensors        optimizer moments and torch RNG states
Nothing is pickled. A checkpoint is written into ``RUN/.tmp-…`` and renamed into place only when
complete (``aiayn.atomic``), so a run killed mid-write leaves the previous checkpoints intact (the
stray temporary directory is removed at the next start). ``RUN/best`` is a symlink to the best
checkpoint, swapped atomically. The last ``keep_last`` checkpoints are kept, plus the best.
"""

from __future__ import annotations

import os
import random
import re
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from aiayn.atomic import atomic_dir, sync, write_json
from aiayn.errors import ModelDirError
from aiayn.models.io import save_model
from aiayn.temporaries import remove_tree, temporary_name, usual_mode
from aiayn.textfiles import read_json

STATE_JSON = "trainer_state.json"
STATE_TENSORS = "trainer_state.safetensors"
STEP_DIR = re.compile(r"^step-(\d+)$")


def step_dirs(run_dir: Path, complete: bool = True) -> list[tuple[int, Path]]:
    """Complete checkpoints of a run (``complete=False``: the ``step-N`` folders that lack their
    trainer state), oldest first."""
    found = []
    if run_dir.is_dir():
        for p in run_dir.iterdir():
            m = STEP_DIR.match(p.name)
            if m and p.is_dir() and (p / STATE_JSON).is_file() == complete:
                found.append((int(m.group(1)), p))
    return sorted(found)


def latest_checkpoint(run_dir: str | os.PathLike) -> Path | None:
    dirs = step_dirs(Path(run_dir))
    return dirs[-1][1] if dirs else None


# -- optimizer and RNG state as tensors + JSON ----------------------------------------------------


def _split_optimizer(opt: torch.optim.Optimizer) -> tuple[dict, dict[str, torch.Tensor]]:
    sd = opt.state_dict()
    tensors, scalars = {}, {}
    for pid, state in sd["state"].items():
        for name, value in state.items():
            if torch.is_tensor(value):
                tensors[f"optimizer.{pid}.{name}"] = value.detach().cpu().contiguous()
            else:
                scalars[f"{pid}.{name}"] = value
    return {"param_groups": sd["param_groups"], "scalars": scalars}, tensors


def _join_optimizer(meta: dict, tensors: dict[str, torch.Tensor]) -> dict:
    state: dict[int, dict] = {}
    for key, value in tensors.items():
        if key.startswith("optimizer."):
            _, pid, name = key.split(".", 2)
            state.setdefault(int(pid), {})[name] = value
    for key, value in meta["scalars"].items():
        pid, name = key.split(".", 1)
        state.setdefault(int(pid), {})[name] = value
    return {"state": state, "param_groups": meta["param_groups"]}


def _rng_state() -> tuple[dict, dict[str, torch.Tensor]]:
    tensors = {"rng.torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"rng.cuda.{i}"] = s
    if torch.backends.mps.is_available():  # an Apple GPU's dropout draws from its own generator
        tensors["rng.mps"] = torch.mps.get_rng_state()
    version, state, gauss = random.getstate()
    return {"version": version, "state": list(state), "gauss": gauss}, tensors


def _set_rng_state(meta: dict, tensors: dict[str, torch.Tensor]) -> None:
    torch.set_rng_state(tensors["rng.torch"])
    if torch.cuda.is_available():  # the devices both runs see: a resume may see fewer (or none)
        for i in range(torch.cuda.device_count()):
            if f"rng.cuda.{i}" in tensors:
                torch.cuda.set_rng_state(tensors[f"rng.cuda.{i}"], i)
    if "rng.mps" in tensors and torch.backends.mps.is_available():
        torch.mps.set_rng_state(tensors["rng.mps"])
    random.setstate((meta["version"], tuple(meta["state"]), meta["gauss"]))


def rank_rng_state(device: torch.device) -> torch.Tensor:
    """This process's random state as one uint8 vector: the CPU generator's, then on CUDA or MPS its
    device's (dropout draws from the generator of the device the model runs on)."""
    parts = [torch.get_rng_state()]
    if device.type == "cuda":
        parts.append(torch.cuda.get_rng_state(device))
    elif device.type == "mps":
        parts.append(torch.mps.get_rng_state())
    return torch.cat(parts)


def _set_rank_rng_state(state: torch.Tensor, device: torch.device) -> None:
    n = torch.get_rng_state().numel()
    torch.set_rng_state(state[:n].clone())
    if state.numel() > n and device.type in ("cuda", "mps"):  # none where the run saved it on the CPU
        if device.type == "cuda":
            torch.cuda.set_rng_state(state[n:].clone(), device)
        else:
            torch.mps.set_rng_state(state[n:].clone())


# -- save / load ------------------------------------------------------------------------------------


def save_checkpoint(
    run_dir: str | os.PathLike,
    step: int,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    state: dict,
    write_extra: Callable[[Path], None] | None = None,
    model_meta: dict | None = None,
    rank_rngs: list[torch.Tensor] | None = None,
) -> Path:
    """Write ``RUN/step-{step}`` atomically and durably (on the disk before ``prune`` deletes an
    older one); ``state`` is the trainer's JSON-able state.

    ``write_extra(dir)`` writes further files (the tokenizer) into the temporary directory;
    ``model_meta`` goes into ``config.json`` (e.g. the languages of a translation model);
    ``rank_rngs``: every rank's ``rank_rng_state`` under torchrun (each rank's own dropout stream,
    which a resumed rank continues).
    """
    run_dir = Path(run_dir)
    final = run_dir / f"step-{step:06d}"
    with atomic_dir(final, durable=True) as tmp:
        save_model(model, tmp, step=step, **(model_meta or {}))
        if write_extra is not None:
            write_extra(tmp)
        opt_meta, tensors = _split_optimizer(optimizer)
        rng_meta, rng_tensors = _rng_state()
        rng_tensors.update({f"{RANK_RNG}{r}": t for r, t in enumerate(rank_rngs or [])})
        save_file({**tensors, **rng_tensors}, str(tmp / STATE_TENSORS))
        usual_mode(tmp / STATE_TENSORS)  # safetensors makes it 0o600, its directory's other files not
        write_json(tmp / STATE_JSON, {**state, "step": step, "optimizer": opt_meta, "rng": rng_meta})
    return final


RANK_RNG = "rng.rank."  # + the rank: that process's rank_rng_state
STATE_KEYS = ("step", "best", "bad_evals", "elapsed", "sampler", "optimizer", "rng")


def _the_checkpoints_fault(e: BaseException) -> bool:
    """Whether a failure to read a checkpoint says the checkpoint cannot be used (a missing, truncated
    or foreign file: ``--resume`` then tries an older one) rather than that the machine failed: out of
    memory, an I/O error, a permission. Those propagate: going back to an older checkpoint would throw
    updates away, and under torchrun leave that rank alone on another step."""
    if isinstance(e, torch.OutOfMemoryError):
        return False
    if isinstance(e, OSError):
        return isinstance(e, (FileNotFoundError, NotADirectoryError, IsADirectoryError))
    return isinstance(e, (SafetensorError, RuntimeError, ValueError, KeyError, TypeError))


def _read_state(checkpoint: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """The trainer state's JSON and tensors, checked; ``ModelDirError`` naming the bad file."""
    path = checkpoint / STATE_JSON
    meta = read_json(path, "the checkpoint is incomplete")
    missing = [k for k in STATE_KEYS if k not in meta]
    if missing:
        raise ModelDirError(f"{path} lacks {', '.join(missing)}: it is not a complete trainer state")
    named = checkpoint.name.removeprefix("step-")  # the step its folder is named after
    step = meta["step"]
    if not named.isdigit() or type(step) is not int or step != int(named):
        raise ModelDirError(f"{path}: step={step!r} is not the update its folder {checkpoint.name} names")
    elapsed, bad = meta["elapsed"], meta["bad_evals"]
    if not isinstance(elapsed, (int, float)) or isinstance(elapsed, bool) or not 0 <= elapsed < float("inf"):
        raise ModelDirError(f"{path}: elapsed={elapsed!r} is not a number of seconds")
    if type(bad) is not int or bad < 0:
        raise ModelDirError(f"{path}: bad_evals={bad!r} is not a count")
    try:
        tensors = load_file(str(checkpoint / STATE_TENSORS))
    except (OSError, SafetensorError) as e:
        if not _the_checkpoints_fault(e):
            raise
        raise ModelDirError(f"{checkpoint / STATE_TENSORS} is truncated or corrupt ({e})") from None
    return meta, tensors


def load_checkpoint(checkpoint: Path, model: nn.Module, optimizer: torch.optim.Optimizer, rank: int = 0,
                    device: torch.device | None = None) -> dict:  # fmt: skip
    """Restore model weights, optimizer and RNG states; return the trainer's JSON state, with
    ``"rank_rng": True`` when the random state restored is ``rank``'s own (saved by every rank of a
    torchrun run; otherwise it is rank 0's, which only rank 0 should continue).

    A checkpoint that cannot be used raises ``ModelDirError`` naming the file; its trainer state
    is read and checked before anything is restored (``--resume`` then tries an older checkpoint,
    which restores everything anew).
    """
    from safetensors.torch import load_model

    meta, tensors = _read_state(checkpoint)
    weights = checkpoint / "model.safetensors"
    try:
        load_model(model, weights, strict=True)
        optimizer.load_state_dict(_join_optimizer(meta.pop("optimizer"), tensors))
        _set_rng_state(meta.pop("rng"), tensors)
        own = tensors.get(f"{RANK_RNG}{rank}")
        if own is not None:
            _set_rank_rng_state(own, device or torch.device("cpu"))
        meta["rank_rng"] = own is not None or rank == 0
    except (OSError, SafetensorError, RuntimeError, ValueError, KeyError, TypeError) as e:
        if not _the_checkpoints_fault(e):
            raise
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ModelDirError(f"{checkpoint} does not fit this run or is corrupt ({first})") from None
    return meta


def mark_best(run_dir: Path, checkpoint: Path) -> None:
    """Point ``RUN/best`` at ``checkpoint``: a new link renamed over the name ``best`` itself (an
    atomic swap that never follows what ``best`` points to: a planted link to a file elsewhere is
    replaced, not its target)."""
    best = run_dir / "best"
    if best.exists() and not best.is_symlink():
        raise ModelDirError(f"{best} is not the link aiayn keeps to the best checkpoint; remove it")
    tmp = temporary_name(best)
    tmp.symlink_to(checkpoint.name)
    try:
        os.replace(tmp, best)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    sync(run_dir)  # the new link on the disk before prune deletes what the old one named


def prune(run_dir: Path, keep_last: int) -> None:
    """Delete all but the last ``keep_last`` checkpoints, never the one ``best`` points to."""
    best = run_dir / "best"
    best_target = best.resolve() if best.is_symlink() else None
    dirs = step_dirs(run_dir)
    for _, path in dirs[: max(len(dirs) - keep_last, 0)]:
        if best_target is None or path.resolve() != best_target:
            remove_tree(path)  # never a step directory without its trainer state


def after_resume(
    run_dir: Path, loaded: Path, skipped: list[Path], is_best: bool, best_step: int | None = None
) -> None:
    """Put a resumed run's directory in order: checkpoints newer than the one it resumes from that did
    not load are renamed ``step-N.unloaded-PID`` (kept to inspect, but no longer counted by ``prune`` or
    resumed from), and ``best`` points at ``loaded`` where its state says it was the best (a kill came
    between writing it and marking it). Where ``best`` pointed at one set aside or at nothing, it points
    at the best checkpoint ``loaded``'s state names (``best_step``), else at ``loaded``."""
    for path in skipped:
        if path.is_dir():
            path.rename(path.with_name(f"{path.name}.unloaded-{os.getpid()}"))
    best = run_dir / "best"  # a link to a checkpoint renamed aside resolves to nothing
    if is_best and best.resolve() != loaded.resolve():
        mark_best(run_dir, loaded)
    elif not best.exists():
        named = run_dir / f"step-{best_step:06d}" if best_step is not None else None
        mark_best(run_dir, named if named is not None and (named / STATE_JSON).is_file() else loaded)
