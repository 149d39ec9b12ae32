"""Greedy decoding.

    y_t = argmax_y log p(y | y_<t, X)

for every row at once, until the row emits eos or reaches its maximum length. Rows that finish
leave the batch (``decoder.select``, in ``steps.decode_rows``), so a long sentence does not keep
short ones computing. The model is reached only through an adapter (``adapters.py``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from aiayn.decoding.adapters import IncrementalDecoder
from aiayn.decoding.options import SearchConfig
from aiayn.decoding.scoring import Hypothesis, to_hypotheses
from aiayn.decoding.steps import decode_rows
from aiayn.decoding.topk import topk

GREEDY = SearchConfig(beam=1)


@torch.inference_mode()
def greedy_search(
    decoder: IncrementalDecoder, inputs: Tensor, max_len: int | Tensor, config: SearchConfig = GREEDY
) -> list[list[Hypothesis]]:
    """The most probable next token at every step; one hypothesis per input.

    ``max_len`` (int or one per input) bounds the generated tokens, eos included. Of ``config``,
    ``min_len`` applies; ``lenpen`` only sets how the returned ``score`` is computed (as in
    ``beam_search``, so the two are comparable).
    """
    tokens, lengths, log_probs = decode_rows(
        decoder, inputs, 1, lambda lp, rows: topk(lp, 1)[1][:, 0], max_len, config.min_len
    )
    return to_hypotheses(tokens, lengths, log_probs, 1, config.lenpen, config.lenpen_kind, sort=False)
