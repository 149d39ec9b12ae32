"""One interface between the search code (greedy, beam, sampling) and every model.

A search works on N decoding *rows* (inputs × beams, or inputs × samples) and asks an adapter for
four things: ``start(inputs, n)`` prepares ``n`` rows per input and returns their first tokens,
``step(prefix)`` returns every row's next-token log-probabilities given all its tokens so far,
``reorder(index)`` follows beams to their parents (rows keep their input), and ``select(index)``
keeps some rows only (finished inputs leave the batch). A fake model for tests needs just these.

With ``use_cache=True`` an adapter feeds the model only the tokens it has not seen yet: decoder
self-attention keys and values are appended to a ``DecoderCache`` each step, and cross-attention
keys and values are projected from the encoder memory once. With ``use_cache=False`` it recomputes
the whole prefix every step: quadratic, but it is the reference the cached path is tested against.
Only the last position goes through the output projection and the log-softmax.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from aiayn.models.lm import LanguageModel
from aiayn.models.transformer import Transformer
from aiayn.modules.kv_cache import DecoderCache
from aiayn.modules.layers import DecoderContext


class IncrementalDecoder:
    """What every adapter shares: the cache, the last-position head, reordering.

    Shape:
        step: prefix (N, t) ids -> log-probs (N, vocab) of token t+1
    """

    def __init__(self, model: Transformer | LanguageModel, use_cache: bool = True):
        self.model = model
        self.use_cache = use_cache
        self.cache: DecoderCache | None = None
        self.rows: Tensor | None = None  # the cache row of each search row, when not the same (N,)
        c = model.config
        self.bos_id, self.eos_id, self.pad_id = c.bos_id, c.eos_id, c.pad_id
        self.vocab_limit: int | None = getattr(model, "vocab_limit", None)  # ids past the tokenizer's

    def _hidden(self, new: Tensor) -> Tensor:
        """Decoder states (N, T, d_model) for the ``new`` tokens (all tokens when uncached)."""
        raise NotImplementedError

    def step(self, prefix: Tensor) -> Tensor:
        new = prefix if self.cache is None else prefix[:, len(self.cache) :]
        if self.rows is None:
            h = self._hidden(new)[:, -1]  # (N, d_model): only the last position is projected
        else:  # the new tokens in the cache's row order (the inverse permutation), the states back
            h = self._hidden(new[self.rows.argsort()])[:, -1][self.rows]
        return self.model.head(h).float().log_softmax(dim=-1)  # (N, V)

    def reorder(self, index: Tensor) -> None:
        """Row i continues row ``index[i]``, which read the same input (beam reordering). The cache
        is not reordered: its rows fork (``DecoderCache.fork``), and ``rows`` says which of them
        holds each of the search's rows."""
        if self.cache is not None:
            self.rows = self.cache.fork(index if self.rows is None else self.rows[index])

    def select(self, index: Tensor) -> None:
        """Keep rows ``index`` (any rows, e.g. those of unfinished inputs), in that order."""
        self._select(index if self.rows is None else self.rows[index])
        self.rows = None

    def _select(self, index: Tensor) -> None:
        """``select`` for rows in the cache's order (not the search's)."""
        if self.cache is not None:
            self.cache.reorder(index)

    def _new_cache(self) -> DecoderCache | None:
        return self.model.new_cache() if self.use_cache else None


class Seq2SeqAdapter(IncrementalDecoder):
    """The encoder–decoder ``Transformer``: encode the source once, decode from ``bos_id``.

    Shape:
        start: src (B, S) ids, right-padded with ``pad_id`` -> first tokens (B·n, 1), all bos;
        row ``b·n + j`` decodes sentence ``b``.
    """

    model: Transformer

    def start(self, src: Tensor, n: int = 1) -> Tensor:
        return self.start_from(self.model.context(src), n)  # memory (B, S, d_model) and its mask

    def start_from(self, context: DecoderContext, n: int = 1) -> Tensor:
        """``start`` for a decoder context already computed (the encoder memory, and the memory of
        the right-to-left pass for a bidirectional model).

        The ``n`` rows of a sentence share its memory: the context (and the cross-attention keys
        and values projected from it) stay one row per sentence (``group`` = n rows each), and
        attention serves a sentence's rows with one product (``attention._grouped``)."""
        self.context, self.group = context, n
        self.cache, self.rows = self._new_cache(), None
        memory = context.memory
        return torch.full((memory.size(0) * n, 1), self.bos_id, dtype=torch.long, device=memory.device)

    def _hidden(self, new: Tensor) -> Tensor:
        return self.model.decode(new, self.context, cache=self.cache)

    def _decoder(self) -> nn.Module:
        """The decoder whose cross-attention ``prime`` projects the memory with."""
        return self.model.decoder

    def _select(self, index: Tensor) -> None:
        """Keep rows ``index``. Whole groups of rows of one sentence (what beam search keeps) keep
        sharing their sentence's memory; any other choice (samples of one input that finish at
        different steps) first gives every row its own copy."""
        g = self.group
        if g > 1 and not _whole_groups(index, g):
            sentences = torch.arange(self.context.memory.size(0), device=index.device).repeat_interleave(g)
            self.context = self.context.select(sentences)
            if self.cache is not None:
                self.cache.reorder_memory(sentences)
            self.group = g = 1
        sentences = index[::g] // g  # (rows of index) / g
        if self.cache is not None:
            self.cache.reorder(index, memory_index=sentences)
        self.context = self.context.select(sentences)

    def prime(self) -> None:
        """Project the memory's cross-attention keys and values into the (empty) cache now, so that
        these rows can join others (``join``) before their first step."""
        rows = self.context.memory.size(0) * self.group
        self._decoder().prime(self.context, self.cache, rows)

    def join(self, other: Seq2SeqAdapter) -> None:
        """Take ``other``'s rows after these (iteration-level batching, ``beam.Beams.join``): the
        caches align on their last position (``DecoderCache.join``), the memories pad to the longer.
        Both must have a cache holding their memory's keys and values (a step taken, or ``prime``)."""
        if any(a.cache is None or a.cache.layers[0]["cross"].k is None for a in (self, other)):
            raise ValueError(
                "rows join others once their memory is in their KV cache (use_cache=True, prime())"
            )
        if other.group != self.group:
            raise ValueError(f"rows per sentence differ ({self.group} and {other.group}): different searches")
        for a in (self, other):  # the cache's rows in the search's order, once per join
            if a.rows is not None:
                a.cache.reorder(a.rows, static=False)
                a.rows = None
        self.cache = self.cache.join(other.cache)
        self.context = self.context.join(other.context)


class R2LAdapter(Seq2SeqAdapter):
    """The right-to-left decoder of a ``BidirectionalTransformer``: it writes the target backwards
    (its tokens are the reversed target, then eos)."""

    def _hidden(self, new: Tensor) -> Tensor:
        return self.model.decode_r2l(new, self.context, cache=self.cache)

    def _decoder(self) -> nn.Module:
        return self.model.r2l_decoder


class LMAdapter(IncrementalDecoder):
    """The decoder-only ``LanguageModel``: the prompt is the prefix, prefilled in one pass.

    Prompts in one call must have the same length (there is no padding mask for left-padded
    prompts; the caller groups prompts by length). An empty prompt is an error: give at least
    one token (e.g. a newline, or ``bos_id`` for a model trained with one).

    ``window``: the most tokens the model reads (its trained context; None: all). A longer prefix
    is cropped to its last ``window`` tokens, as nanoGPT's sampling loop does (``idx[:, -block_size:]``):
    from then on every token's position moves with each step, so nothing can be cached and each step
    runs the whole window again.

    Shape:
        start: prompt (B, P) ids -> prefix (B·n, P); row ``b·n + j`` continues prompt ``b``.
    """

    model: LanguageModel

    def __init__(
        self,
        model: LanguageModel,
        use_cache: bool = True,
        window: int | None = None,
        never: tuple[int, ...] = (),
    ):
        super().__init__(model, use_cache)
        if window is not None and window < 1:
            raise ValueError(f"window={window} must be at least 1 (or None: the whole prefix)")
        self.window = window
        self.never = never  # ids the search never emits (``steps.restrict``): a stream LM's untrained ones

    def step(self, prefix: Tensor) -> Tensor:
        if self.window is not None and prefix.size(1) > self.window:
            self.cache, self.rows = None, None  # positions shift every step from here: recompute
            prefix = prefix[:, -self.window :]
        return super().step(prefix)

    def start(self, prompt: Tensor, n: int = 1) -> Tensor:
        if prompt.dim() != 2 or prompt.size(1) == 0:
            raise ValueError(
                f"the prompt must be a non-empty (B, P) tensor of ids, got {tuple(prompt.shape)}"
            )
        self.cache, self.rows = self._new_cache(), None
        return prompt.repeat_interleave(n, 0) if n > 1 else prompt

    def _hidden(self, new: Tensor) -> Tensor:
        return self.model.hidden(new, cache=self.cache)[0]


def _whole_groups(index: Tensor, g: int) -> bool:
    """Whether ``index`` keeps rows in groups of ``g`` consecutive entries, each from one group."""
    if index.numel() % g:
        return False
    owner = (index // g).view(-1, g)
    return bool((owner == owner[:, :1]).all())


def adapter_for(model: Transformer | LanguageModel, use_cache: bool = True) -> IncrementalDecoder:
    """The adapter that fits ``model``."""
    if isinstance(model, Transformer):
        return Seq2SeqAdapter(model, use_cache)
    if isinstance(model, LanguageModel):
        return LMAdapter(model, use_cache)
    raise TypeError(f"no decoding adapter for {type(model).__name__}; expected Transformer or LanguageModel")
