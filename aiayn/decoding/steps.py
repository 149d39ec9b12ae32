"""What every search strategy does at each step: limits, restrictions, and the row loop.

``max_lengths`` turns the length limit into one number per input; ``restrict`` forbids padding and
an early eos; ``decode_rows`` runs one token per row until each row ends, the loop that greedy
search and sampling share (they differ only in how a token is picked). Every step first calls
``cancel.check_stop()``, so that a caller can stop a search between steps.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from aiayn.decoding.adapters import IncrementalDecoder
from aiayn.decoding.cancel import check_stop

Pick = Callable[[Tensor, Tensor], Tensor]  # log-probs (A, V), the live rows' output rows (A,) -> ids (A,)


def max_lengths(max_len: int | Tensor, n_inputs: int) -> Tensor:
    """The per-input limit on generated tokens (eos included) as a (n_inputs,) tensor, checked."""
    limits = torch.as_tensor(max_len, dtype=torch.long).expand(n_inputs).clone()
    if limits.numel() and int(limits.min()) < 1:
        raise ValueError(f"max_len must be at least 1 for every input, got {int(limits.min())}")
    return limits


# Output-token buffers start this many columns wide (fewer if no output may be longer) and double as
# outputs grow: sized up front for the longest output allowed, a large --max-len allocated its
# columns of padding for every row before the first step (gigabytes, or a failed allocation).
FIRST_WIDTH = 64


def widen(tokens: Tensor, need: int, pad_id: int, most: int | None = None) -> Tensor:
    """``tokens`` (..., W), padded with ``pad_id`` to at least ``need`` columns: to twice its width
    or ``need``, whichever is more, and at most ``most``. Unchanged if it is wide enough already."""
    width = tokens.size(-1)
    if need <= width:
        return tokens
    wider = max(need, 2 * width) if most is None else min(max(need, 2 * width), most)
    return F.pad(tokens, (0, wider - width), value=pad_id)


def restrict(log_probs: Tensor, decoder: IncrementalDecoder, step: int, min_len: int) -> Tensor:
    """Padding is never generated (as in fairseq; with Marian's bos = pad, neither is bos), nor an id
    the tokenizer has no token for (``decoder.vocab_limit``, ``interop.pretrained.limit_to``), nor an
    id the model never had as a target (``decoder.never``: a language model trained on a stream of
    text has no bos, unk or eos in it, only label smoothing's crumbs of probability), and outputs
    shorter than ``min_len`` may not end: eos gets probability 0 before then."""
    log_probs[..., decoder.pad_id] = float("-inf")
    never = getattr(decoder, "never", ())
    if never:
        log_probs[..., list(never)] = float("-inf")
    limit = getattr(decoder, "vocab_limit", None)  # an adapter of a model that was told one
    if limit is not None:
        log_probs[..., limit:] = float("-inf")
    if step < min_len:
        log_probs[..., decoder.eos_id] = float("-inf")
    return log_probs


def decode_rows(
    decoder: IncrementalDecoder, inputs: Tensor, n: int, pick: Pick, max_len: int | Tensor, min_len: int = 0
) -> tuple[Tensor, Tensor, Tensor]:
    """Run ``pick`` on every row, one token at a time, ``n`` rows per input.

    Shape:
        max_len: int or (B,); returns tokens (B·n, L ≤ max_len) padded with pad_id, lengths (B·n,),
        log_probs (B·n,) — the sum of the chosen tokens' log-probabilities
    """
    prefix = decoder.start(inputs, n)  # (N, t0)
    n_rows = prefix.size(0)
    limit = max_lengths(max_len, n_rows // n).repeat_interleave(n).to(prefix.device)  # (N,)
    longest = int(limit.max()) if n_rows else 1  # an empty batch: nothing to decode
    tokens = torch.full(
        (n_rows, min(longest, FIRST_WIDTH)), decoder.pad_id, dtype=torch.long, device=prefix.device
    )
    lengths = limit.clone()
    log_probs = torch.zeros(n_rows, device=prefix.device)
    rows = torch.arange(n_rows, device=prefix.device)  # live row -> output row
    for t in range(longest):
        check_stop()
        lp = restrict(decoder.step(prefix), decoder, t, min_len)  # (A, V)
        choice = pick(lp, rows)  # (A,)
        tokens = widen(tokens, t + 1, decoder.pad_id, longest)
        tokens[rows, t] = choice
        log_probs[rows] += lp.gather(1, choice[:, None]).squeeze(1)
        prefix = torch.cat([prefix, choice[:, None]], dim=1)
        done = (choice == decoder.eos_id) | (limit <= t + 1)
        if done.any():
            lengths[rows[done]] = t + 1
            keep = (~done).nonzero().squeeze(1)
            if keep.numel() == 0:
                break
            rows, prefix, limit = rows[keep], prefix[keep], limit[keep]
            decoder.select(keep)
    return tokens, lengths, log_probs
