"""An ensemble of translation models read as one: p(y_t | y_<t, x) = (1/M) Σ_m p_m(y_t | y_<t, x).

The members share the source and target vocabularies (and so their special ids) and are all plain
or all bidirectional (each of those decodes its own right-to-left translation for its own memory);
their sizes may differ. Averaging probabilities, not logits, is what fairseq's and OpenNMT's
ensembles do; the members of one run's last checkpoints (``aiayn.training.average.last_checkpoints``)
are the usual case. Decoding runs every member's own KV cache side by side (``aiayn.decoding.ensemble``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from aiayn.errors import ConfigError
from aiayn.models.transformer import Transformer

SHARED_FIELDS = (
    "src_vocab_size",
    "tgt_vocab_size",
    "pad_id",
    "bos_id",
    "eos_id",
    "positional",
    "bidirectional",
)


def check_members(members: Sequence[nn.Module]) -> None:
    """``ConfigError`` unless ``members`` are ≥ 1 translation models that agree on ``SHARED_FIELDS``
    (and, for learned positions, on ``max_len``: the most any of them can read; a sinusoidal table
    grows as needed). What one member's config says of those fields holds for the ensemble."""
    if not members:
        raise ConfigError("an ensemble needs at least one model")
    for i, m in enumerate(members, start=1):
        if not isinstance(m, Transformer):
            raise ConfigError(f"ensemble member {i} is a {type(m).__name__}; translation models only")
    first = members[0].config
    fields = (*SHARED_FIELDS, "max_len") if first.positional == "learned" else SHARED_FIELDS
    for i, m in enumerate(members[1:], start=2):
        for name in fields:
            if getattr(m.config, name) != getattr(first, name):
                raise ConfigError(
                    f"ensemble member {i} has {name}={getattr(m.config, name)!r} but member 1 has "
                    f"{getattr(first, name)!r}: members must share vocabularies and positions, and be all "
                    "plain or all bidirectional"
                )


class Ensemble(nn.Module):
    """M translation models with one output distribution, the mean of theirs.

    Shape:
        src: (B, S) ids, tgt: (B, T) ids (decoder input) -> log-probabilities (B, T, tgt_vocab_size)
    """

    def __init__(self, members: Sequence[Transformer]):
        super().__init__()
        check_members(members)
        self.members = nn.ModuleList(members)

    @property
    def config(self):
        """The first member's config: vocabularies, special ids and positions are the same in all."""
        return self.members[0].config

    def forward(self, src: Tensor, tgt: Tensor) -> Tensor:
        if self.config.bidirectional:  # each member would need its own right-to-left input
            raise ConfigError("a bidirectional ensemble decodes (its members' own right-to-left passes); it "
                              "does not score given targets")  # fmt: skip
        log_probs = torch.stack([m(src, tgt).float().log_softmax(-1) for m in self.members])  # (M, B, T, V)
        return log_probs.logsumexp(0) - math.log(len(self.members))
