"""Distributed data parallel setup for ``torchrun``: gloo on CPU, nccl on CUDA.

``torchrun --nproc_per_node=N -m aiayn train …`` sets RANK, LOCAL_RANK and WORLD_SIZE; without
them everything here is a no-op and the run is a single process. Only rank 0 writes files.
"""

from __future__ import annotations

import datetime
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import torch
import torch.distributed as dist

from aiayn.errors import ConfigError

T = TypeVar("T")
GLOO_DRAIN_S = 0.05  # shutdown: the GIL released for gloo's worker thread to drop its last collective


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def init_distributed(device: torch.device, name: str = "", timeout: float = 1800.0) -> DistInfo:
    """Join the process group that torchrun describes in the environment (if any). ``name``: the
    config's device, refused (``ConfigError``) before any process joins where the processes could not
    share it: a numbered GPU (``cuda:1``: every process on that one; ``cuda`` gives each its
    ``LOCAL_RANK``'s), or MPS (no process-group backend). ``timeout``: seconds a collective waits for
    the other ranks (``ddp_timeout``)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return DistInfo()
    if device.type == "mps" or (device.type == "cuda" and ":" in name):
        raise ConfigError(f"device={name or str(device)!r} under torchrun: give device=cuda (each process "
                          "takes its LOCAL_RANK's GPU) or device=cpu")  # fmt: skip
    info = DistInfo(int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0")), world)
    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout))
    return info


def barrier(info: DistInfo) -> None:
    if info.enabled:
        dist.barrier()


def main_first(info: DistInfo, build: Callable[[], T]) -> T:
    """Rank 0 runs ``build`` (e.g. filling an on-disk cache), then the other ranks do (a cache hit)."""
    result = build() if info.is_main else None
    barrier(info)
    return build() if not info.is_main else result


def all_reduce_sum(value: torch.Tensor, info: DistInfo) -> torch.Tensor:
    if info.enabled:
        dist.all_reduce(value, op=dist.ReduceOp.SUM)
    return value


def all_reduce_max(value: torch.Tensor, info: DistInfo) -> torch.Tensor:
    if info.enabled:
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return value


def all_gather(value: torch.Tensor, info: DistInfo, device: torch.device) -> list[torch.Tensor]:
    """Every rank's ``value`` (one shape on every rank) in rank order, on the CPU; moved through
    ``device`` on the way (NCCL gathers CUDA tensors only)."""
    if not info.enabled:
        return [value]
    moved = value.to(device)
    out = [torch.empty_like(moved) for _ in range(info.world_size)]
    dist.all_gather(out, moved)
    return [t.cpu() for t in out]


def disagreement(value: int, info: DistInfo, device: torch.device) -> list[int] | None:
    """Every rank's ``value`` in rank order where they differ; None where all hold the same."""
    values = [int(v) for v in all_gather(torch.tensor([value]), info, device)]
    return values if len(set(values)) > 1 else None


def shutdown(info: DistInfo) -> None:
    """Tear the process group down once every rank is done with it (after a normal end only: a
    rank that raised would leave the others waiting at the barrier).

    The pause after the barrier is for gloo: its worker thread drops each finished collective
    after waking the caller, and that drop takes the GIL (the collective's tensors belong to
    Python). Destroying the group joins that thread while holding the GIL, so a destruction that
    came first deadlocked now and then at the end of 2-process runs (py-spy: the main thread in
    ~ProcessGroupGloo joining, the worker waiting for the GIL); sleeping releases the GIL for the
    worker to finish."""
    if info.enabled and dist.is_initialized():
        dist.barrier()
        time.sleep(GLOO_DRAIN_S)
        dist.destroy_process_group()
