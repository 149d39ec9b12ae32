"""Attention heat-maps: one PNG per layer and attention kind, one panel per head.

Panel (i, j) of head h shows the weight softmax(q_i k_jᵀ / √d_k)_j that query token i (rows)
gives key token j (columns); each row sums to 1. The weights come from a model's
``attention_weights(...)``; this module only draws them (matplotlib, Agg backend: no display).
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)
from torch import Tensor  # noqa: E402

from aiayn.viz.figures import png_bytes, write_figures  # noqa: E402

KINDS = {  # kind -> (title, which labels are the queries, which the keys)
    "encoder": ("encoder self-attention", "src", "src"),
    "decoder_self": ("decoder self-attention", "tgt", "tgt"),
    "cross": ("cross-attention (decoder → encoder)", "tgt", "src"),
    "cross_r2l": ("fourth sublayer (decoder → right-to-left decoder)", "tgt", "r2l"),
    "r2l_self": ("right-to-left decoder self-attention", "r2l", "r2l"),
    "r2l_cross": ("right-to-left decoder cross-attention", "r2l", "src"),
}


def plot_heads(weights: Tensor, queries: list[str], keys: list[str], title: str) -> plt.Figure:
    """A grid of heat-maps, one per head, with tokens on the axes.

    Shape:
        weights: (h, T_q, T_k); queries: T_q labels; keys: T_k labels
    """
    n_heads, t_q, t_k = weights.shape
    cols = min(n_heads, 4)
    rows = math.ceil(n_heads / cols)
    cell = 0.22  # inches per token
    w, h = max(2.5, 1.2 + cell * t_k), max(2.5, 1.2 + cell * t_q)
    fig, axes = plt.subplots(rows, cols, figsize=(cols * w + 0.8, rows * h + 0.6), squeeze=False)
    image = None
    for i, ax in enumerate(axes.flat):
        if i >= n_heads:
            ax.axis("off")
            continue
        image = ax.imshow(weights[i].float().cpu().numpy(), cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
        ax.set_title(f"head {i}", fontsize=9)
        ax.set_xticks(range(t_k), _plain(keys), rotation=90, fontsize=7)
        ax.set_yticks(range(t_q), _plain(queries), fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    if image is not None:  # one scale for every head: the weight a colour stands for
        fig.colorbar(image, ax=axes.ravel().tolist(), shrink=0.8, label="attention weight")
    return fig


def _plain(labels: list[str]) -> list[str]:
    """Token labels as text: matplotlib reads a label with two ``$`` as a formula (a piece ``$$``)."""
    return [label.replace("$", r"\$") for label in labels]


def is_attention_map(name: str) -> bool:
    """Whether a file name is one that ``save_attention_maps`` writes (``{kind}_layer{l}.png``)."""
    return re.fullmatch(rf"({'|'.join(KINDS)})_layer\d+\.png", name) is not None


def save_attention_maps(
    maps: dict[str, list[Tensor]], labels: dict[str, list[str]], out_dir: str | os.PathLike, example: int = 0
) -> list[Path]:
    """Write ``{kind}_layer{l}.png`` for every kind and layer of ``maps``; return the paths.

    ``maps`` is a model's ``attention_weights`` output (``{kind: [L × (B, h, T_q, T_k)]}``);
    ``labels`` maps ``"src"`` / ``"tgt"`` (/ ``"r2l"``) to the token strings; ``example`` picks the batch row.
    Every figure is drawn before the first is written, and each is written whole (by rename); maps of
    an earlier run in ``out_dir`` that this one does not draw (another model's layers) are deleted.
    """
    out_dir = Path(out_dir)
    pngs = {}
    for kind, layers in maps.items():
        title, q, k = KINDS[kind]
        for layer, weights in enumerate(layers):
            fig = plot_heads(weights[example], labels[q], labels[k], f"{title}, layer {layer}")
            pngs[out_dir / f"{kind}_layer{layer}.png"] = png_bytes(fig)
    return write_figures(out_dir, pngs, replaces=is_attention_map)
