"""glibc's malloc, told to keep the memory a training or decoding step frees for the next step.

PyTorch's CPU tensors come from ``malloc``. glibc serves a block above its mmap threshold (which it
raises as such blocks are freed, to at most 32 MiB) with a fresh ``mmap`` and returns it to the kernel
on ``free``; it also returns the top of its heap once more than its trim threshold is free there. A
step allocates and frees the same blocks every time, so the kernel maps, zeroes and faults in the
same memory every step, page by page. ``tune_malloc`` raises the mmap threshold to 64 MiB, the trim
threshold to 128 MiB and the heap's padding to 64 MiB (``mallopt``, as glibc's ``MALLOC_*_``
variables would at start), so such blocks are reused from the heap: a fraction of the page faults
and a faster beam search, training level (docs/results.md, "glibc's malloc"). PyTorch's CPU tuning
guide advises jemalloc or tcmalloc for the same reason; a Python package cannot switch allocators
once it runs. The cost is memory held rather than returned: up to the trim threshold and the padding
(192 MiB) per malloc arena beyond what the process uses at the time.

The commands (``aiayn.cli.main``) call it first, before torch is imported; a library user may too.
It leaves malloc alone where the user chose: any ``MALLOC_*_`` tunable or ``LD_PRELOAD`` (another
allocator) in the environment, or ``AIAYN_MALLOC_TUNING=0``; and where the C library is not glibc.
"""

from __future__ import annotations

import ctypes
import os
import platform

# mallopt's parameter numbers (glibc's malloc.h) and the values: bytes
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3
TUNING = {M_MMAP_THRESHOLD: 64 << 20, M_TRIM_THRESHOLD: 128 << 20, M_TOP_PAD: 64 << 20}
# what the user may have set instead (glibc reads these at start; another allocator ignores mallopt)
USER_CHOICES = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "LD_PRELOAD")
OFF = "AIAYN_MALLOC_TUNING"


def is_glibc() -> bool:
    """Whether this process's C library is glibc (the only malloc ``TUNING`` is written for)."""
    return platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"


def tune_malloc() -> bool:
    """Apply ``TUNING`` to this process's malloc; whether it was applied (see the module's text)."""
    if os.environ.get(OFF, "1") == "0" or any(os.environ.get(name) for name in USER_CHOICES):
        return False
    if not is_glibc():
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return all(mallopt(param, value) == 1 for param, value in TUNING.items())
