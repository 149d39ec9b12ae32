"""``search``: decode with the strategy a ``SearchConfig`` selects.

``sample=True`` is ancestral sampling (``sampling.py``), ``beam=1`` greedy decoding (``greedy.py``),
anything else beam search (``beam.py``); every strategy takes the same config.
"""

from __future__ import annotations

import torch
from torch import Tensor

from aiayn.decoding.adapters import IncrementalDecoder
from aiayn.decoding.beam import beam_search
from aiayn.decoding.greedy import greedy_search
from aiayn.decoding.options import SearchConfig
from aiayn.decoding.sampling import sample
from aiayn.decoding.scoring import Hypothesis


def search(
    decoder: IncrementalDecoder,
    inputs: Tensor,
    config: SearchConfig,
    max_len: int | Tensor,
    generator: torch.Generator | None = None,
    streams: list[torch.Generator] | None = None,
) -> list[list[Hypothesis]]:
    """Decode ``inputs`` with the strategy ``config`` selects; one list of hypotheses per input
    (``generator``, ``streams``: where samples are drawn from, ``sampling.sample``); no inputs, no
    hypotheses."""
    if not inputs.size(0):
        return []
    if config.sample:
        return sample(decoder, inputs, max_len, config, generator, streams)
    if config.beam == 1:
        return greedy_search(decoder, inputs, max_len, config)
    return beam_search(decoder, inputs, max_len, config)
