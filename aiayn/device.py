"""Turning a device name (``"auto"``, ``"cpu"``, ``"cuda:1"``, …) into a ``torch.device`` that exists.

Every command that takes ``--device`` (and ``TrainConfig.device``) goes through ``resolve_device``,
so a typo or a GPU that is not there is one ``DeviceError`` naming the value and the fix, before
any work starts, instead of PyTorch's assertion deep inside the first ``.to(device)``.
``bf16_speedup`` measures whether this device's bfloat16 matrix products are faster than its
float32 ones (CPUs with AVX512_BF16 or AMX, most GPUs) or emulated and slower: training's
``precision="auto"`` and decoding's ``--quantize bf16`` read it. ``cpu_flags`` reads the CPU's
instruction-set flags (``/proc/cpuinfo``), for what measurement cannot tell as cheaply.
``in_passing_thread`` and ``set_threads`` keep PyTorch's CPU threads off a server's main thread.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import torch

from aiayn.errors import DeviceError

KNOWN = ("auto", "cpu", "cuda", "cuda:N", "mps")
T = TypeVar("T")


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    """``"auto"`` is the local CUDA device when there is one, else the CPU; ``"cuda"`` under
    torchrun is the process's own GPU (``local_rank``)."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError, TypeError):
        raise DeviceError(f"device={name!r} is not a device name; use one of {', '.join(KNOWN)}") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise DeviceError(
                f"device={name!r}, but this PyTorch ({torch.__version__}) sees no CUDA GPU; "
                "use device cpu (or auto)"
            )
        if device.index is None:
            device = torch.device("cuda", local_rank)
        if device.index >= torch.cuda.device_count():
            raise DeviceError(f"device={name!r}, but only {torch.cuda.device_count()} CUDA device(s) exist")
    elif device.type == "mps":
        if not torch.backends.mps.is_available():
            raise DeviceError(f"device={name!r}, but MPS is not available here; use device cpu")
    elif device.type != "cpu":
        raise DeviceError(f"device={name!r} is not supported; use one of {', '.join(KNOWN)}")
    return device


# oneDNN keeps a primitive (and ideep a computation) per input shape it has seen: with decoding's
# ever-changing row counts both caches grow by their default 1,024 entries' worth of buffers.
ONEDNN_CACHE_ENTRIES = {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "64", "LRU_CACHE_CAPACITY": "64"}


def cpu_flags(cpuinfo: str | None = None) -> set[str]:
    """The first processor's ``flags`` in ``/proc/cpuinfo`` (or in the text ``cpuinfo``); empty
    where they cannot be read (another OS), so callers fall back to what every CPU has."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        except OSError:
            return set()
    for line in cpuinfo.split("\n\n", 1)[0].splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return set(value.split())
    return set()


def bound_onednn_caches() -> None:
    """Bound oneDNN's caches to ``ONEDNN_CACHE_ENTRIES`` unless the user set them. They are read at
    oneDNN's first use in the process: call this before it (decoding's packed or bfloat16 weights)."""
    for name, entries in ONEDNN_CACHE_ENTRIES.items():
        os.environ.setdefault(name, entries)


def bf16_speedup(device: torch.device, tokens: int, d_model: int, d_ff: int) -> float:
    """float32 time / bfloat16 time of a (tokens × d_model) · (d_model × d_ff) product on this
    device now, each the best of 5 after one warm-up call (a fraction of a second on a CPU)."""

    def best(dtype: torch.dtype) -> float:
        x = torch.randn(tokens, d_model, device=device, dtype=dtype)
        w = torch.randn(d_ff, d_model, device=device, dtype=dtype)
        times = []
        for _ in range(6):  # the first call warms up and is not counted
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            torch.nn.functional.linear(x, w)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            times.append(time.perf_counter() - t0)
        return min(times[1:])

    return best(torch.float32) / best(torch.bfloat16)


def max_threads() -> int:
    """The most CPU threads a run may ask for: four per CPU (far more only fails, or crashes, inside
    the thread libraries)."""
    return 4 * (os.cpu_count() or 1)


def set_threads(threads: int) -> None:
    """PyTorch's CPU threads for the calling thread's operations; 0 leaves PyTorch's default."""
    if threads:
        torch.set_num_threads(threads)


def in_passing_thread(fn: Callable[[], T], threads: int = 0) -> T:
    """``fn()`` run on a thread of its own with ``threads`` CPU threads, which ends when it returns.

    A thread that runs parallel operations keeps a team of OpenMP threads for as long as it lives.
    GNU OpenMP (PyTorch's) stops spinning between parallel regions once its threads outnumber the
    CPUs, so a server whose main thread had loaded the models with two threads ran its worker's
    small decoding products at half the speed, each waiting to be woken (docs/serve.md). Loading on a
    passing thread leaves no team behind; its exception is raised here."""
    out: list = []

    def run() -> None:
        set_threads(threads)
        try:
            out.append((True, fn()))
        except BaseException as e:  # re-raised on the calling thread
            out.append((False, e))

    thread = threading.Thread(target=run, name="aiayn-load")
    thread.start()
    thread.join()
    ok, value = out[0]
    if not ok:
        raise value
    return value
