"""``LayerConfig``: what every layer of every stack needs, validated on construction.

The defaults are the paper's base model (Table 3, "base": d_model=512, d_ff=2048, h=8, P_drop=0.1,
post-norm residuals, sinusoidal positions, embeddings scaled by √d_model). Every deviation is a
named field; a bad value raises ``ConfigError`` (a ``ValueError``) naming the field, the value and
the fix. Configs round-trip through plain dicts (``to_dict`` / ``from_dict``) for ``config.json``.
The model configs (vocabulary, depth) extend it in ``aiayn.models.config``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, TypeVar

from aiayn.errors import ConfigError
from aiayn.modules.embedding import EMB_SCALES, POSITIONALS
from aiayn.modules.feed_forward import ACTIVATIONS

C = TypeVar("C", bound="LayerConfig")
# max_len at most: 131,072 positions (a learned table of them: 0.5 GB at d_model 1024)
MAX_POSITIONS = 1 << 17


@dataclass
class LayerConfig:
    """What every layer of every stack needs. Subclasses add vocabulary and depth."""

    d_model: int = 512  # model width, §3.1
    n_heads: int = 8  # h, parallel attention heads, §3.2.2
    d_k: int | None = None  # query/key width per head; None = d_model / n_heads
    d_v: int | None = None  # value width per head; None = d_model / n_heads
    d_ff: int = 2048  # inner width of the feed-forward network, §3.3
    dropout: float = 0.1  # P_drop on sublayer outputs and on embedding + position sums, §5.4
    attn_dropout: float = 0.0  # dropout on attention weights (the paper has none)
    ff_dropout: float = 0.0  # dropout after the feed-forward activation (the paper has none)
    activation: str = "relu"  # "relu" (paper), "gelu", "gelu_tanh" (GPT-2), "silu" (OPUS-MT)
    norm_first: bool = False  # False: post-norm LayerNorm(x + Sublayer(x)) as in the paper
    ln_eps: float = 1e-5  # ε inside LayerNorm's square root
    bias: bool = True  # biases in linear layers and LayerNorm
    positional: str = "sinusoidal"  # "sinusoidal" (paper), "sinusoidal_halves" (Marian), "learned"
    max_len: int = 1024  # positions precomputed (sinusoidal: grows past it; learned: hard limit)
    emb_scale: str = "emb"  # "emb": embeddings × √d_model (§3.4); "prj": a tied output ÷ √d_model (an
    # untied one learns its own scale: as "none"); "none"
    pad_id: int = 0  # special token ids, fixed by the tokenizer
    bos_id: int = 1
    eos_id: int = 2
    unk_id: int = 3

    def __post_init__(self) -> None:
        self.validate()

    # -- validation -------------------------------------------------------------------------
    def _fail(self, field: str, problem: str, fix: str) -> None:
        value = getattr(self, field)
        raise ConfigError(f"{type(self).__name__}.{field}={value!r} {problem}; {fix}")

    def _positive(self, *fields: str, optional: tuple[str, ...] = ()) -> None:
        for f in fields:
            v = getattr(self, f)
            if v is None and f in optional:
                continue
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                self._fail(f, "must be a positive integer", f"set {f} to an integer ≥ 1")

    def _choice(self, field: str, choices: tuple[str, ...] | list[str]) -> None:
        if getattr(self, field) not in choices:
            self._fail(field, f"is not one of {tuple(choices)}", f"choose one of {tuple(choices)}")

    def _index(self, *fields: str) -> None:
        for f in fields:
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                self._fail(f, "must be an integer ≥ 0", f"set {f} to a token id")

    def _flag(self, *fields: str) -> None:
        for f in fields:
            if not isinstance(getattr(self, f), bool):
                self._fail(f, "must be true or false", f"set {f} to true or false")

    def _probability(self, *fields: str) -> None:
        for f in fields:
            v = getattr(self, f)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0.0 <= v < 1.0:
                self._fail(f, "must be in [0, 1)", f"set {f} to a probability such as 0.1")

    def validate(self) -> None:
        for f in dataclasses.fields(self):  # sizes past int64 overflow torch long before memory runs out
            value = getattr(self, f.name)
            if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 2**63:
                self._fail(f.name, "is too large", "use a size below 2**63")
        self._positive("d_model", "n_heads", "d_k", "d_v", "d_ff", "max_len", optional=("d_k", "d_v"))
        if self.max_len > MAX_POSITIONS:  # its position table alone would take gigabytes
            self._fail(
                "max_len", f"is over {MAX_POSITIONS} positions", f"set max_len to at most {MAX_POSITIONS}"
            )
        if (self.d_k is None or self.d_v is None) and self.d_model % self.n_heads:
            self._fail(
                "d_model",
                f"must be divisible by n_heads={self.n_heads}",
                "choose d_model as a multiple of n_heads (e.g. 512 with 8 heads), or set d_k and d_v",
            )
        self._probability("dropout", "attn_dropout", "ff_dropout")
        self._flag("norm_first", "bias")
        self._choice("activation", list(ACTIVATIONS))
        self._choice("positional", POSITIONALS)
        self._choice("emb_scale", EMB_SCALES)
        if self.positional != "learned" and self.d_model % 2:
            self._fail("d_model", "is odd", "sinusoidal positions need an even d_model")
        if not (isinstance(self.ln_eps, float) and 0 < self.ln_eps < math.inf):
            self._fail("ln_eps", "must be a positive float", "use e.g. 1e-5")
        self._index("pad_id", "bos_id", "eos_id", "unk_id")
        if self.pad_id == self.eos_id:
            self._fail("pad_id", f"equals eos_id={self.eos_id}", "give padding its own id")
        if self.pad_id == self.unk_id:  # the padding mask would hide every unknown token
            self._fail("pad_id", f"equals unk_id={self.unk_id}", "give padding its own id")

    def _vocab_check(self, field: str) -> None:
        self._positive(field)
        size = getattr(self, field)
        for name in ("pad_id", "bos_id", "eos_id", "unk_id"):
            if not 0 <= getattr(self, name) < size:
                self._fail(name, f"is outside the vocabulary ({field}={size})", "use ids < vocab size")

    # -- (de)serialisation --------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls: type[C], data: dict[str, Any]) -> C:
        """The config of a dict such as ``config.json``'s ``"config"``; ``ConfigError`` if ``data``
        is not a dict, has a field the config lacks, or a value of the wrong type or range."""
        if not isinstance(data, dict):
            raise ConfigError(f"{cls.__name__}: config must be a JSON object, got {type(data).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(map(str, set(data) - known))
        if unknown:
            raise ConfigError(f"{cls.__name__}: unknown field(s) {unknown}; known fields are {sorted(known)}")
        return cls(**data)

    def replace(self: C, **changes: Any) -> C:
        return dataclasses.replace(self, **changes)
