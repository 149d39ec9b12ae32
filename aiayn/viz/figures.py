"""Writing a command's figures: each drawn to PNG bytes first, then every file written whole (by
rename), so a figure that fails to draw leaves no file behind and a crash never a half-written one."""

from __future__ import annotations

import io
from collections.abc import Callable
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


def write_figures(
    out_dir: Path, pngs: dict[Path, bytes], replaces: Callable[[str], bool] | None = None
) -> list[Path]:
    """Write every ``path: png`` (the folder made if need be); return the paths. ``replaces(name)``:
    the names of the same command's figures, which this set replaces as a whole: those of an earlier
    run that this one does not write (another model's layers) are deleted once the new ones are in."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for path, data in pngs.items():
        write_bytes(path, data)
    if replaces is not None:
        names = {p.name for p in pngs}
        for old in out_dir.iterdir():
            if old.is_file() and replaces(old.name) and old.name not in names:
                old.unlink()
    return list(pngs)
