"""``SearchConfig``: every decoding option in one validated dataclass.

The defaults are the paper's (§6.1): beam size 4, length penalty α = 0.6, maximum output length
= input length + 50. ``beam=1`` is greedy decoding, ``sample=True`` ancestral sampling. Every search
strategy takes this config, so an option is added in one place.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from aiayn.decoding.mbr import UTILITIES
from aiayn.decoding.scoring import PENALTIES
from aiayn.errors import ConfigError

MIN_TEMPERATURE = 1e-4  # sampling's lowest T: below it sampling is greedy, and float32 may not divide by it
MAX_TEMPERATURE = 1e4  # and its highest: far below float32's range (-inf / inf is NaN), already uniform
MAX_LENGTH = 2**31 - 1  # a length limit past it is none; the input's length plus it still fits int64
MAX_LENPEN = 5.0  # |α| at most: |Y|^α stays far inside float32 for any output length a search reaches
SAMPLING_FIELDS = ("temperature", "top_k", "top_p", "seed")  # read by sampling only


@dataclass
class SearchConfig:
    """How to decode. Every field is checked on construction (``ConfigError`` naming it)."""

    beam: int = 4  # beam size (§6.1); 1 = greedy
    nbest: int = 1  # hypotheses returned per input (≤ beam), or samples drawn with sample=True
    lenpen: float = 0.6  # α of the length penalty (§6.1); 0 = rank by log-probability
    lenpen_kind: str = "gnmt"  # "gnmt": ((5 + |Y|) / 6)^α; "simple": |Y|^α
    max_len: int | None = None  # generated tokens at most (eos included); None: see output_limit
    max_len_b: int = 50  # the "+ 50" of §6.1
    min_len: int = 0  # no eos before this many tokens (min_len = max_len: fixed-length output)
    sample: bool = False  # sample instead of searching
    temperature: float = 1.0  # sampling: divide log-probs by T (MIN_TEMPERATURE to MAX_TEMPERATURE)
    top_k: int | None = None  # sampling: keep the k most probable tokens (None = all)
    top_p: float | None = None  # sampling: keep the smallest set with probability ≥ p (None = all)
    seed: int | None = None  # sampling: seed of the torch.Generator (None = torch's global RNG)
    use_cache: bool = True  # False recomputes the whole prefix each step (the reference path)
    r2l_beam: int | None = None  # a bidirectional model's right-to-left pass: beam size (None = beam)
    mbr: str | None = None  # "bleu"/"chrf": order the beam's hypotheses by minimum Bayes risk (mbr.py)
    max_len_cap: int | None = None  # generated tokens at most whatever max_len says (a server's --max-len)

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Types, ranges, finiteness and agreement between fields; ``ConfigError`` naming the first
        bad one (the command line's option of the same name, with dashes)."""

        def fail(name: str, problem: str) -> None:
            raise ConfigError(f"{name}={getattr(self, name)!r} {problem}")

        for name in (
            "beam",
            "nbest",
            "max_len_b",
            "min_len",
            "max_len",
            "top_k",
            "seed",
            "r2l_beam",
            "max_len_cap",
        ):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
                fail(name, "must be an integer")
            if value is not None and abs(value) >= 2**63:
                fail(name, f"is {'too large' if value > 0 else 'too small'} (int64: |value| < 2**63)")
        for name in ("lenpen", "temperature", "top_p"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
                fail(name, "must be a number")
            if value is not None and not math.isfinite(value):
                fail(name, "must be a finite number")
        if self.beam < 1:
            fail("beam", "must be at least 1 (1 = greedy decoding)")
        if self.r2l_beam is not None and self.r2l_beam < 1:
            fail("r2l_beam", "must be at least 1 (or None: the same as beam)")
        if self.nbest < 1 or (not self.sample and self.nbest > self.beam):
            fail("nbest", f"must be between 1 and the beam size {self.beam}")
        if self.mbr is not None and self.mbr not in UTILITIES:
            fail("mbr", f"is not one of {UTILITIES} (or None: the beam's own order)")
        if self.mbr is not None and (self.sample or self.beam < 2):
            fail("mbr", "chooses among a beam's hypotheses: give beam 2 or more (and no sampling)")
        if self.lenpen_kind not in PENALTIES:
            fail("lenpen_kind", f"is not one of {PENALTIES}")
        if self.max_len is not None and self.max_len < 1:
            fail("max_len", "must be at least 1 (or None: input + max_len_b)")
        if self.max_len_b < 1:
            fail("max_len_b", "must be at least 1")
        for name in ("max_len", "max_len_b", "max_len_cap", "min_len"):
            if (getattr(self, name) or 0) > MAX_LENGTH:
                fail(name, f"is over {MAX_LENGTH} tokens: no output is that long")
        if self.max_len_cap is not None and self.max_len_cap < 1:
            fail("max_len_cap", "must be at least 1 (or None: no cap)")
        if abs(self.lenpen) > MAX_LENPEN:  # ((5 + |Y|) / 6)^α overflows to inf: every score -inf
            fail("lenpen", f"must be within ±{MAX_LENPEN:g} (0.6 to 1.0 are usual; 0 = log-probability)")
        if self.min_len < 0:
            fail("min_len", "must be ≥ 0")
        for name in ("max_len", "max_len_cap"):
            if getattr(self, name) is not None and self.min_len > getattr(self, name):
                fail("min_len", f"is above {name}={getattr(self, name)}: no output could satisfy both")
        if not self.temperature >= MIN_TEMPERATURE:  # below it float32 log-probs / T underflow to nothing
            fail("temperature", f"must be ≥ {MIN_TEMPERATURE:g} (use greedy decoding for T -> 0)")
        if not self.temperature <= MAX_TEMPERATURE:
            fail("temperature", f"must be ≤ {MAX_TEMPERATURE:g} (at T = 100 sampling is all but uniform)")
        if self.top_k is not None and self.top_k < 1:
            fail("top_k", "must be at least 1 (or None for no top-k filtering)")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            fail("top_p", "must be in (0, 1] (or None for no nucleus filtering)")
        if self.max_len is not None and self.max_len_b != SearchConfig.max_len_b:  # only the default's margin
            fail("max_len_b", f"does nothing with max_len={self.max_len} (the default length is input + "
                 "max_len_b): give one of them")  # fmt: skip
        for name, default in SAMPLING_DEFAULTS.items():  # given without sampling: it would be ignored
            if not self.sample and getattr(self, name) != default:
                fail(name, "applies to sampling only: sample (sample=True, --sample), or leave it out")

    def output_limit(self, input_len: int) -> int:
        """The maximum number of generated tokens for an input of ``input_len`` tokens. The default
        (``max_len=None``) is input + ``max_len_b``, or ``min_len`` + 1 where that is more: a short
        input's default must not cut the output that ``min_len`` asked for before it could end (its
        eos, the earliest allowed, is token ``min_len`` + 1)."""
        floor = self.min_len + 1 if self.min_len else 0
        limit = self.max_len if self.max_len is not None else max(input_len + self.max_len_b, floor)
        return limit if self.max_len_cap is None else min(limit, self.max_len_cap)


# sampling's fields at their defaults: what a search that does not sample holds
SAMPLING_DEFAULTS = {f.name: f.default for f in dataclasses.fields(SearchConfig) if f.name in SAMPLING_FIELDS}
