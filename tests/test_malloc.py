"""``aiayn.malloc``: glibc keeps a freed 40 MiB block for the next one (the kernel's page-fault counter
says so), and the tuning stays off where the user chose an allocator or its settings."""

import os
import subprocess
import sys

import pytest

from aiayn import malloc

# Ten 40 MiB tensors allocated and freed in turn (above glibc's largest dynamic mmap threshold, 32 MiB),
# after a step's worth of smaller ones: the minor page faults they cost, and whether the tuning applied.
PROBE = """
import resource
from aiayn.malloc import tune_malloc
applied = tune_malloc()  # before torch is imported, as the commands call it
import torch
for _ in range(10):
    x = torch.ones(8 << 18); del x
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    x = torch.ones(40 << 18); del x
print(applied, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _probe(**env: str) -> tuple[bool, int]:
    clean = {k: v for k, v in os.environ.items() if k not in (*malloc.USER_CHOICES, malloc.OFF)}
    out = subprocess.run([sys.executable, "-c", PROBE], env={**clean, **env}, capture_output=True, text=True,
                         check=True, timeout=120).stdout.split()  # fmt: skip
    return out[0] == "True", int(out[1])


@pytest.mark.skipif(not malloc.is_glibc(), reason="glibc's malloc only")
def test_a_freed_block_is_reused_from_the_heap_instead_of_mapped_again():
    applied, tuned = _probe()
    off, default = _probe(**{malloc.OFF: "0"})
    assert applied and not off
    pages = 10 * (40 << 20) // os.sysconf("SC_PAGE_SIZE")  # what mapping each block afresh faults in
    assert default >= pages // 2  # glibc's default: every block mapped, zeroed and faulted in again
    assert tuned < default // 4


@pytest.mark.parametrize("name", [*malloc.USER_CHOICES, malloc.OFF])
def test_the_users_choice_of_allocator_or_settings_is_left_alone(monkeypatch, name):
    for other in (*malloc.USER_CHOICES, malloc.OFF):
        monkeypatch.delenv(other, raising=False)
    monkeypatch.setenv(name, "0" if name == malloc.OFF else "1")
    calls = []
    monkeypatch.setattr(malloc.ctypes, "CDLL", lambda *a: calls.append(a))
    assert malloc.tune_malloc() is False and calls == []
