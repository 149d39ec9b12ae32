"""Training curves from a run's ``metrics.jsonl``: loss, learning rate, and BLEU (translation) or
accuracy (masked-LM, classification) against step."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from aiayn.errors import ModelDirError  # noqa: E402
from aiayn.textfiles import read_text  # noqa: E402
from aiayn.viz.figures import png_bytes, write_figures  # noqa: E402

MAX_PLOTTED = 1e300  # a value's magnitude at most: past it, an axis' span overflows float64


def read_metrics(path: str | os.PathLike) -> list[dict]:
    path = Path(path)
    if path.is_dir():
        path = path / "metrics.jsonl"
    text = read_text(path, "is this a training run directory?", fix="not a metrics file")
    lines = text.splitlines()
    records = []
    for i, line in enumerate(lines, 1):
        if line.strip():
            try:
                record = json.loads(line)
            except (ValueError, RecursionError):  # not JSON, a number of 4300+ digits, nested too deep
                torn = i == len(lines) and not text.endswith("\n")  # a run killed mid-write (resume drops it)
                if torn:
                    print(f"aiayn: warning: {path}: line {i} is cut short: left out", file=sys.stderr)
                    break
                raise ModelDirError(
                    f"{path}: line {i} is not valid JSON: give a run directory or its metrics.jsonl"
                ) from None
            if not isinstance(record, dict):
                raise ModelDirError(
                    f"{path}: line {i} is not a JSON object: give a run directory or its metrics.jsonl"
                )
            records.append(record)
    return records


def _series(records: list[dict], split: str, key: str) -> tuple[list, list]:
    def number(v) -> bool:  # and one an axis can span: ±inf or 1e308 is a gap, as NaN is
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            return False
        try:
            return not abs(float(v)) >= MAX_PLOTTED
        except OverflowError:  # an int past float's range
            return False

    pts = [(r["step"], r[key]) for r in records
           if r.get("split") == split and number(r.get(key)) and number(r.get("step"))]  # fmt: skip
    return [p[0] for p in pts], [p[1] for p in pts]


# (PNG name, y label, [(split, metric, legend)]): what plot_curves draws where the metrics have it
PANELS = [
    ("loss", "loss (per token)", [("train", "loss", "train"), ("valid", "loss", "valid"),
                                  ("valid", "nll", "valid NLL")]),
    ("lr", "learning rate", [("train", "lr", "lr")]),
    ("bleu", "validation BLEU", [("valid", "bleu", "greedy BLEU")]),
    ("accuracy", "validation accuracy (%)", [("valid", "accuracy", "accuracy"),
                                             ("valid", "macro_f1", "macro-F1")]),
]  # fmt: skip


def is_curve(name: str) -> bool:
    """Whether a file name is one that ``plot_curves`` writes."""
    return name in {f"{panel}.png" for panel, _, _ in PANELS}


def plot_curves(run_dir: str | os.PathLike, out_dir: str | os.PathLike | None = None) -> list[Path]:
    """Write loss.png, lr.png, and bleu.png or accuracy.png where the metrics have them; return
    their paths. Every figure is drawn before the first is written, and each is written whole."""
    records = read_metrics(run_dir)
    out = Path(out_dir or (Path(run_dir) if Path(run_dir).is_dir() else Path(run_dir).parent))
    pngs = {}
    for name, ylabel, lines in PANELS:
        fig, ax = plt.subplots(figsize=(6, 4))
        drawn = False
        for split, key, label in lines:
            x, y = _series(records, split, key)
            if x:
                ax.plot(x, y, label=label, marker="o" if split == "valid" else None, markersize=3)
                drawn = True
        if not drawn:
            plt.close(fig)
            continue
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        pngs[out / f"{name}.png"] = png_bytes(fig)
    if not pngs:
        raise ModelDirError(f"{run_dir}: metrics hold nothing to plot yet; train for a few steps first")
    return write_figures(out, pngs, replaces=is_curve)  # another task's curve of an earlier run goes
