"""``SearchConfig``: every decoding option in one validated dataclass.

The defaults are the paper's (§6.1): beam size 4, length penalty α = 0.6, maximum output length
= input length + 50. ``beam=1`` is greedy decoding, ``sample=True`` ancestral sampling. Every search
strategy takes this config, so an option is added in one place.
"""

from __future__ import annotations

from dataclasses import dataclass

from aiayn.decoding.scoring import PENALTIES


def check_sampling(temperature: float, top_k: int | None, top_p: float | None) -> None:
    if not temperature > 0:
        raise ValueError(f"temperature={temperature} must be > 0 (use greedy decoding for T -> 0)")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k={top_k} must be at least 1 (or None for no top-k filtering)")
    if top_p is not None and not 0 < top_p <= 1:
        raise ValueError(f"top_p={top_p} must be in (0, 1] (or None for no nucleus filtering)")


@dataclass
class SearchConfig:
    """How to decode. Every field is checked on construction (``ValueError`` naming it)."""

    beam: int = 4  # beam size (§6.1); 1 = greedy
    nbest: int = 1  # hypotheses returned per input (≤ beam), or samples drawn with sample=True
    lenpen: float = 0.6  # α of the length penalty (§6.1); 0 = rank by log-probability
    lenpen_kind: str = "gnmt"  # "gnmt": ((5 + |Y|) / 6)^α; "simple": |Y|^α
    max_len: int | None = None  # generated tokens at most (eos included); None = input + max_len_b
    max_len_b: int = 50  # the "+ 50" of §6.1
    min_len: int = 0  # no eos before this many tokens (min_len = max_len: fixed-length output)
    sample: bool = False  # sample instead of searching
    temperature: float = 1.0  # sampling: divide log-probs by T
    top_k: int | None = None  # sampling: keep the k most probable tokens (None = all)
    top_p: float | None = None  # sampling: keep the smallest set with probability ≥ p (None = all)
    seed: int | None = None  # sampling: seed of the torch.Generator (None = torch's global RNG)
    use_cache: bool = True  # False recomputes the whole prefix each step (the reference path)

    def __post_init__(self) -> None:
        if self.beam < 1:
            raise ValueError(f"beam={self.beam} must be at least 1 (1 = greedy decoding)")
        if self.nbest < 1 or (not self.sample and self.nbest > self.beam):
            raise ValueError(f"nbest={self.nbest} must be between 1 and the beam size {self.beam}")
        if self.lenpen_kind not in PENALTIES:
            raise ValueError(f"lenpen_kind={self.lenpen_kind!r} is not one of {PENALTIES}")
        if self.max_len is not None and self.max_len < 1:
            raise ValueError(f"max_len={self.max_len} must be at least 1 (or None: input + max_len_b)")
        if self.max_len_b < 1:
            raise ValueError(f"max_len_b={self.max_len_b} must be at least 1")
        if self.min_len < 0:
            raise ValueError(f"min_len={self.min_len} must be ≥ 0")
        if self.sample:
            check_sampling(self.temperature, self.top_k, self.top_p)

    def output_limit(self, input_len: int) -> int:
        """The maximum number of generated tokens for an input of ``input_len`` tokens."""
        return self.max_len if self.max_len is not None else input_len + self.max_len_b
