"""Turning a device name (``"auto"``, ``"cpu"``, ``"cuda:1"``, …) into a ``torch.device`` that exists.

Every command that takes ``--device`` (and ``TrainConfig.device``) goes through ``resolve_device``,
so a typo or a GPU that is not there is one ``DeviceError`` naming the value and the fix, before
any work starts, instead of PyTorch's assertion deep inside the first ``.to(device)``.
"""

from __future__ import annotations

import torch

from aiayn.errors import DeviceError

KNOWN = ("auto", "cpu", "cuda", "cuda:N", "mps")


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
