"""Writing a command's figures: each drawn to PNG bytes first, then every file written whole (by
rename), so a figure that fails to draw leaves no file behind and a crash never a half-written one."""

from __future__ import annotations

import io
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from aiayn.atomic import write_bytes  # noqa: E402

DPI = 100


def png_bytes(fig: plt.Figure) -> bytes:
    """The figure as PNG; the figure is closed."""
    buf = io.BytesIO()
    try:
        fig.savefig(buf, dpi=DPI, format="png")
    finally:
        plt.close(fig)
    return buf.getvalue()


def write_figures(out_dir: Path, pngs: dict[Path, bytes]) -> list[Path]:
    """Write every ``path: png`` (the folder made if need be); return the paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for path, data in pngs.items():
        write_bytes(path, data)
    return list(pngs)
