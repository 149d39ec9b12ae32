"""How a finished hypothesis is scored, and the type every search returns.

A hypothesis Y has a log-probability log P(Y|X) = Σ_t log p(y_t | y_<t, X) and a *score*

    score(Y) = log P(Y|X) / lp(|Y|),   lp(L) = ((5 + L) / 6)^α   (GNMT, Wu et al. 2016, eq. 14)
                                       lp(L) = L^α               (``kind="simple"``)

where |Y| counts the generated tokens, eos included. α = 0 scores by log-probability alone; α > 0
favours longer outputs, which raw log-probabilities (sums of negative terms) penalise. lp is
monotone in L for every α, which is what beam search's stopping rule relies on (``beam.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

PENALTIES = ("gnmt", "simple")


def length_penalty(length: Tensor | int, alpha: float = 0.6, kind: str = "gnmt") -> Tensor:
    """lp(L): ``((5 + L) / 6) ** alpha`` (``"gnmt"``) or ``L ** alpha`` (``"simple"``).

    Shape:
        length: any shape (ints) -> float tensor of the same shape
    """
    length = torch.as_tensor(length, dtype=torch.float32)
    if kind == "gnmt":
        return ((5.0 + length) / 6.0) ** alpha
    if kind == "simple":
        return length**alpha
    raise ValueError(f"length penalty kind={kind!r} is not one of {PENALTIES}")


@dataclass
class Hypothesis:
    """One output: its tokens (eos included when it was emitted), score and log-probability; for a
    bidirectional model also the right-to-left hypothesis whose states it read (``r2l``, its tokens
    right to left; not part of equality)."""

    tokens: list[int]
    score: float  # log_prob / lp(len(tokens))
    log_prob: float  # Σ log p(y_t | y_<t, X) under the model (temperature 1, no filtering)
    r2l: Hypothesis | None = field(default=None, compare=False, repr=False)


def to_hypotheses(
    tokens: Tensor, lengths: Tensor, log_probs: Tensor, n: int, alpha: float, kind: str, sort: bool
) -> list[list[Hypothesis]]:
    """Rows ``i·n … i·n + n - 1`` become input i's list (best score first when ``sort``).

    Shape:
        tokens: (N, L) ids, lengths: (N,), log_probs: (N,), with N = inputs × n
    """
    scores = log_probs / length_penalty(lengths, alpha, kind)
    rows = [
        Hypothesis(t[:k], s, lp)
        for t, k, s, lp in zip(tokens.tolist(), lengths.tolist(), scores.tolist(), log_probs.tolist())
    ]
    groups = [rows[i : i + n] for i in range(0, len(rows), n)]
    return [sorted(g, key=lambda h: -h.score) if sort else g for g in groups]
