"""Texts longer than an encoder reads: which pieces a classifier sees of each (``LongText``).

An encoder of ``max_len`` positions reads ``n = max_len - 2`` pieces of a text (``collate_sequences``
adds bos and eos). A text of ``L <= n`` pieces is read whole whatever the policy; when ``L > n``:

- ``head``: the first ``n`` pieces (BERT's truncation; the default);
- ``tail``: the last ``n`` pieces;
- ``head+tail``: the first ``max_len // 4`` pieces and the last ``n - max_len // 4``, joined (Sun et
  al. 2019, "How to Fine-Tune BERT for Text Classification?": 128 + 382 at ``max_len`` 512);
- ``windows``: windows of ``n`` pieces starting every ``stride`` pieces, at ``0, s, 2s, …`` up to the
  first that reaches the end of the text (it may be shorter than ``n``), so every piece is in at least
  one window; ``stride=0`` means ``n // 2`` (each piece in about two windows). Each window is
  classified on its own and the text's logits are the **mean of its windows' logits**
  (``pool_windows``). For training, each window is an example with its text's label.

``LongText.rows`` gives every text's rows and the text each row came from; ``pool_windows`` brings
the rows' logits back to one row per text (the identity for the one-row policies).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from aiayn.errors import ConfigError

POLICIES = ("head", "tail", "head+tail", "windows")


@dataclass(frozen=True)
class LongText:
    """What a classifier reads of a text longer than ``max_len - 2`` pieces (module docstring)."""

    how: str = "head"  # "head", "tail", "head+tail" or "windows"
    stride: int = 0  # windows: pieces from one window's start to the next; 0 = half a window

    def __post_init__(self) -> None:
        if self.how not in POLICIES:
            raise ConfigError(f"long_text={self.how!r} is not one of {POLICIES}")
        if isinstance(self.stride, bool) or not isinstance(self.stride, int) or self.stride < 0:
            raise ConfigError(f"window_stride={self.stride!r} must be an integer ≥ 0 (0 = half a window)")

    def check(self, max_len: int) -> None:
        """A ``ConfigError`` if windows of ``max_len - 2`` pieces with this stride would skip pieces."""
        n = max_len - 2
        if self.stride > n:
            raise ConfigError(
                f"window_stride={self.stride} is over a window's max_len - 2 = {n} pieces: the pieces "
                f"between windows would be read by none; use at most {n} (0 = half a window)"
            )

    def window_starts(self, length: int, n: int) -> list[int]:
        """Where the windows of a text of ``length`` pieces start (``[0]`` if it fits one)."""
        if length <= n:
            return [0]
        step = self.stride or max(n // 2, 1)
        return list(range(0, length - n + step, step))  # the last is the first start ≥ length - n

    def pieces(self, ids: np.ndarray, max_len: int) -> list[np.ndarray]:
        """The rows the encoder reads of one text: one row, or one per window."""
        self.check(max_len)
        n = max_len - 2
        if len(ids) <= n:
            return [ids]
        if self.how == "head":
            return [ids[:n]]
        if self.how == "tail":
            return [ids[len(ids) - n :]]
        if self.how == "head+tail":
            head = max_len // 4
            return [np.concatenate([ids[:head], ids[len(ids) - (n - head) :]])]
        return [ids[s : s + n] for s in self.window_starts(len(ids), n)]

    def rows(self, texts: Sequence[np.ndarray], max_len: int) -> tuple[list[np.ndarray], np.ndarray]:
        """Every text's rows in order, and the index of the text each row came from.

        Shape: N texts -> W rows, owner (W,) with values in 0..N-1"""
        rows: list[np.ndarray] = []
        owner: list[int] = []
        for i, ids in enumerate(texts):
            mine = self.pieces(ids, max_len)
            rows += mine
            owner += [i] * len(mine)
        return rows, np.asarray(owner, np.int64)


def pool_windows(logits: Tensor, owner: Tensor, n_texts: int) -> Tensor:
    """Each text's logits: the mean of its rows' logits, ``z_t = (1 / |W_t|) sum_{w in W_t} z_w``.

    Shape: logits (W, C), owner (W,) -> (n_texts, C)"""
    sums = logits.new_zeros(n_texts, logits.size(-1)).index_add_(0, owner, logits)
    counts = torch.bincount(owner, minlength=n_texts).clamp(min=1).to(logits.dtype)  # (n_texts,)
    return sums / counts[:, None]
