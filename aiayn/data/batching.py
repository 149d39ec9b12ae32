"""Batches: token-budget buckets for translation, random windows for a language model, and the
collate functions that turn them into padded LongTensors.

**Token budget.** A translation pair with ``n`` source and ``m`` target ids (as encoded, no
specials) becomes ``src = x + [eos]`` (``n + 1``), ``tgt_in = [bos] + y`` and ``tgt_out = y + [eos]``
(``m + 1`` each). A batch of B pairs is padded to ``S = max(n) + 1`` and ``T = max(m) + 1``, and
``TokenBatchSampler`` guarantees ``B * max(S, T) <= max_tokens``: neither padded side holds more
than ``max_tokens`` ids, padding included (fairseq's ``--max-tokens``). Pairs are sorted by their
longer side so that a batch holds similar lengths, and batches are filled greedily.

**Order, resume, shards.** Each epoch: shuffle the pairs with ``(seed, epoch)`` (ties in length end
up in different batches each epoch), sort stably by length, cut into batches, shuffle the batch
order. Everything is a function of ``(seed, epoch)``, so the order is reproducible and
``state_dict() == {"epoch": e, "position": p}`` (plain ints: p batches of epoch e handed out)
resumes exactly where a run stopped. Rank r of w takes batches r, r + w, r + 2w, ... of the same
global order; the last ``n_batches % w`` batches of each epoch's shuffled order are dropped so
that every rank gets the same count (different batches each epoch; nothing is dropped for w = 1).
Positions count batches *handed out*: with a ``DataLoader`` that prefetches (``num_workers > 0``)
the sampler runs ahead of training, so resume from a ``num_workers=0`` loader or keep your own count.

**LM windows.** ``WindowSampler`` draws nanoGPT-style random windows of ``block_size + 1`` tokens;
step k's windows come from a generator seeded by ``(seed, k)``, so ``{"step": k}`` resumes it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

from aiayn.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from aiayn.errors import DataError, ModelDirError


def _check_rank(rank: int, world_size: int) -> None:
    if not 0 <= rank < world_size:
        raise ValueError(f"rank={rank} must be in 0..world_size-1 (world_size={world_size})")


class EpochPosition:
    """Where an epoch sampler stands: ``state_dict() == {"epoch": e, "position": p}`` (plain ints: p
    batches of epoch e handed out; a used-up epoch resumes at the next one's start)."""

    epoch: int
    position: int

    def __len__(self) -> int:  # batches in the current epoch
        raise NotImplementedError

    def state_dict(self) -> dict[str, int]:
        if self.position >= len(self):  # the epoch is used up: resume at the next one
            return {"epoch": self.epoch + 1, "position": 0}
        return {"epoch": self.epoch, "position": self.position}


class TokenBatchSampler(EpochPosition):
    """Batches of pair indices under a token budget, shuffled per epoch, resumable, sharded.

    Iterating yields this rank's remaining batches of the current epoch (lists of indices), then
    moves to the next epoch; pass it to ``DataLoader(dataset, batch_sampler=...)``.
    """

    def __init__(
        self,
        src_lengths: Sequence[int] | np.ndarray,  # encoded lengths, without specials
        tgt_lengths: Sequence[int] | np.ndarray,
        max_tokens: int,  # padded ids per side per batch, specials included
        max_sentences: int | None = None,  # optional cap on pairs per batch
        shuffle: bool = True,  # False: length order, same every epoch (e.g. for evaluation)
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
    ):
        _check_rank(rank, world_size)
        src = np.asarray(src_lengths, np.int64) + 1  # + eos
        tgt = np.asarray(tgt_lengths, np.int64) + 1  # + bos (tgt_in) or + eos (tgt_out)
        if src.shape != tgt.shape or src.ndim != 1 or len(src) == 0:
            raise ValueError(f"need two equal, non-empty length lists, got {src.shape} {tgt.shape}")
        self.sizes = np.maximum(src, tgt)
        # sort by the longer side, then the source side: batches then share both lengths closely
        self.keys = self.sizes * (int(src.max()) + 1) + src
        over = np.flatnonzero(self.sizes > max_tokens)
        if len(over):
            raise DataError(
                f"pair {over[0]} needs {self.sizes[over[0]]} ids on one side, over max_tokens="
                f"{max_tokens} ({len(over)} such pairs); raise max_tokens or drop long pairs "
                "with CorpusFilter(max_len=...)"
            )
        self.max_tokens, self.max_sentences = max_tokens, max_sentences or len(src)
        self.shuffle, self.seed, self.rank, self.world_size = shuffle, seed, rank, world_size
        # where batches start in sorted order: depends on the sorted sizes only, so on no epoch
        sorted_sizes = self.sizes[np.argsort(self.keys, kind="stable")].tolist()
        self.cuts = _greedy_cuts(sorted_sizes, max_tokens, self.max_sentences)
        if len(self.cuts) + 1 < world_size:
            raise DataError(
                f"{len(self.cuts) + 1} batches cannot feed {world_size} ranks; "
                "lower max_tokens or use fewer ranks"
            )
        self.epoch, self.position = 0, 0
        self._built: tuple[int, list[np.ndarray]] | None = None

    def global_batches(self, epoch: int) -> list[np.ndarray]:
        """Every rank's batches of ``epoch``, in order (before sharding and dropping)."""
        rng = np.random.default_rng([self.seed, epoch])
        order = rng.permutation(len(self.keys)) if self.shuffle else np.arange(len(self.keys))
        order = order[np.argsort(self.keys[order], kind="stable")]
        batches = np.split(order, self.cuts)
        return [batches[i] for i in rng.permutation(len(batches))] if self.shuffle else batches

    def batches(self, epoch: int) -> list[np.ndarray]:
        """This rank's batches of ``epoch``."""
        if self._built is None or self._built[0] != epoch:
            every = self.global_batches(epoch)
            kept = every[: len(every) - len(every) % self.world_size]
            self._built = epoch, kept[self.rank :: self.world_size]
        return self._built[1]

    def __len__(self) -> int:
        return (len(self.cuts) + 1) // self.world_size

    def __iter__(self) -> Iterator[list[int]]:
        batches = self.batches(self.epoch)
        while self.position < len(batches):
            self.position += 1
            yield batches[self.position - 1].tolist()
        self.epoch, self.position = self.epoch + 1, 0

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` from its first batch (as ``DistributedSampler.set_epoch``)."""
        self.epoch, self.position = int(epoch), 0

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Resume at a checkpoint's ``state_dict()``; ``ModelDirError`` if it does not fit this data."""
        epoch, position = read_position(state)
        if not (epoch >= 0 and 0 <= position <= len(self)):
            raise ModelDirError(
                f"cannot resume at epoch {epoch}, batch {position} of {len(self)}: the checkpoint was "
                "trained on other data or with other max_tokens; resume with the run's own settings"
            )
        self.epoch, self.position = epoch, position


class CorpusEpochs(EpochPosition):
    """Token-budget batches of ``(src_ids, tgt_ids)`` pairs, epoch ``e`` from corpus ``e mod n``:
    one encoded corpus gives ``TokenBatchSampler``'s epochs, n BPE-dropout samples of it
    (``aiayn/data/subword.py``) a new segmentation each epoch.

    Iterating yields this rank's remaining batches of the current epoch, then moves to the next;
    ``state_dict``/``load_state_dict`` resume exactly as ``TokenBatchSampler``'s.
    """

    def __init__(self, corpora: Sequence, max_tokens: int, seed: int = 0, rank: int = 0,
                 world_size: int = 1):  # fmt: skip
        if not corpora:
            raise ValueError("need at least one corpus")
        self.corpora, self.max_tokens = corpora, max_tokens
        self.seed, self.rank, self.world_size = seed, rank, world_size
        self.epoch, self.position = 0, 0
        self._samplers: dict[int, TokenBatchSampler] = {}  # per corpus

    def data(self, epoch: int) -> tuple[Sequence, TokenBatchSampler]:
        """Epoch ``epoch``'s corpus and its batch sampler."""
        k = epoch % len(self.corpora)
        data = self.corpora[k]
        if k not in self._samplers:
            self._samplers[k] = TokenBatchSampler(
                data.src.lengths, data.tgt.lengths, self.max_tokens,
                seed=self.seed, rank=self.rank, world_size=self.world_size,
            )  # fmt: skip
        return data, self._samplers[k]

    def __len__(self) -> int:
        """This rank's batches in the current epoch (samples differ by a few batches)."""
        return len(self.data(self.epoch)[1])

    def __iter__(self) -> Iterator[list[tuple[np.ndarray, np.ndarray]]]:
        data, sampler = self.data(self.epoch)
        sampler.load_state_dict({"epoch": self.epoch, "position": self.position})
        for idx in sampler:
            self.position += 1
            yield [data[i] for i in idx]
        self.epoch, self.position = self.epoch + 1, 0

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Resume at a checkpoint's ``state_dict()``; ``ModelDirError`` if it does not fit this data."""
        epoch, position = read_position(state)
        if epoch < 0:
            raise ModelDirError(f"cannot resume at epoch {epoch}: the trainer state is corrupt")
        self.data(epoch)[1].load_state_dict({"epoch": epoch, "position": position})  # checks the position
        self.epoch, self.position = epoch, position


def read_position(state: dict[str, int]) -> tuple[int, int]:
    """``(epoch, position)`` of an epoch sampler's ``state_dict()``; ``ModelDirError`` if it is not one."""
    try:
        return int(state["epoch"]), int(state["position"])
    except (KeyError, TypeError, ValueError):
        raise ModelDirError(
            f"the checkpoint's data position {state!r} is not {{'epoch': e, 'position': p}}: "
            "the trainer state is corrupt"
        ) from None


def _greedy_cuts(sizes: list[int], max_tokens: int, max_sentences: int) -> list[int]:
    """Start index of every batch but the first, filling each while ``n * size <= max_tokens``
    (``sizes`` ascending, so the newest pair is the longest of its batch)."""
    cuts, start = [], 0
    for j, size in enumerate(sizes):
        if (j - start + 1) * size > max_tokens or j - start == max_sentences:
            cuts.append(j)
            start = j
    return cuts


def non_pad_fraction(batches: list[np.ndarray], src_lengths, tgt_lengths) -> float:
    """Real ids / padded ids over both sides (src + eos, bos + tgt) of ``batches``."""
    src_lengths, tgt_lengths = np.asarray(src_lengths) + 1, np.asarray(tgt_lengths) + 1
    real = padded = 0
    for b in batches:
        s, t = src_lengths[b], tgt_lengths[b]
        real += int(s.sum() + t.sum())
        padded += len(b) * int(s.max() + t.max())
    return real / padded


class TranslationBatch(NamedTuple):
    """A padded translation batch (pad positions hold ``pad_id``)."""

    src: Tensor  # (B, S) source ids + eos
    tgt_in: Tensor  # (B, T) bos + target ids: the decoder's input
    tgt_out: Tensor  # (B, T) target ids + eos: what the decoder must predict
    r2l: Tensor | None = None  # (B, T') a cached right-to-left translation + eos (data/views.py)

    def to(self, device: torch.device | str, non_blocking: bool = False) -> TranslationBatch:
        return TranslationBatch(*(t if t is None else t.to(device, non_blocking=non_blocking) for t in self))


def pad_rows(rows: Sequence, pad_id: int, first: int | None = None, last: int | None = None) -> Tensor:
    """Rows of ids (lists or arrays) as one right-padded (B, max_len + specials) LongTensor, each
    row ``[first] + row + [last]`` (either optional)."""
    lead = int(first is not None)
    out = np.full((len(rows), max(map(len, rows)) + lead + (last is not None)), pad_id, np.int64)
    for i, row in enumerate(rows):
        if first is not None:
            out[i, 0] = first
        out[i, lead : lead + len(row)] = row
        if last is not None:
            out[i, lead + len(row)] = last
    return torch.from_numpy(out)


def collate_translation(
    examples: Sequence[tuple[np.ndarray, np.ndarray]],
    pad_id: int = PAD_ID,
    bos_id: int = BOS_ID,
    eos_id: int = EOS_ID,
) -> TranslationBatch:
    """``(src_ids, tgt_ids)`` pairs (e.g. from ``EncodedParallel``) -> padded ``TranslationBatch``;
    triples ``(src_ids, tgt_ids, r2l_ids)`` (``PairView`` with a cache) also fill ``r2l``.

    Shape:
        src: (B, S) with S = max(len(src_ids)) + 1
        tgt_in, tgt_out: (B, T) with T = max(len(tgt_ids)) + 1; r2l: (B, max(len(r2l_ids)) + 1)
    """
    srcs, tgts, *r2l = zip(*examples)
    src, tgt_in = pad_rows(srcs, pad_id, None, eos_id), pad_rows(tgts, pad_id, bos_id, None)
    r2l_out = pad_rows(r2l[0], pad_id, None, eos_id) if r2l else None
    return TranslationBatch(src, tgt_in, pad_rows(tgts, pad_id, None, eos_id), r2l_out)


class WindowSampler:
    """Endless batches of random window starts for LM training (nanoGPT's ``get_batch``).

    Step k draws ``world_size * batch_size`` starts in ``[0, n_tokens - block_size)`` from a
    generator seeded by ``(seed, k)``; rank r takes rows ``r * batch_size`` onwards, so ranks never
    share a draw and the global batch does not depend on how many ranks split it.
    """

    def __init__(
        self,
        n_tokens: int,
        block_size: int,
        batch_size: int,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
    ):
        _check_rank(rank, world_size)
        if n_tokens < block_size + 1:
            raise DataError(
                f"{n_tokens} tokens cannot fill one window of block_size + 1 = {block_size + 1}; "
                "lower block_size or use more text"
            )
        self.n_tokens, self.block_size, self.batch_size = n_tokens, block_size, batch_size
        self.seed, self.rank, self.world_size = seed, rank, world_size
        self.step = 0

    def starts(self, step: int) -> np.ndarray:
        """This rank's window starts at ``step``. Shape: (batch_size,)"""
        rng = np.random.default_rng([self.seed, step])
        every = rng.integers(0, self.n_tokens - self.block_size, self.world_size * self.batch_size)
        return every[self.rank * self.batch_size : (self.rank + 1) * self.batch_size]

    def __iter__(self) -> Iterator[np.ndarray]:
        while True:
            self.step += 1
            yield self.starts(self.step - 1)

    def state_dict(self) -> dict[str, int]:
        return {"step": self.step}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Resume at a checkpoint's ``state_dict()``; ``ModelDirError`` if it is not one."""
        try:
            step = int(state["step"])
        except (KeyError, TypeError, ValueError):
            step = -1
        if step < 0:
            raise ModelDirError(
                f"the checkpoint's data position {state!r} is not {{'step': k}} with k ≥ 0: "
                "the trainer state is corrupt"
            )
        self.step = step


def sequential_windows(n_tokens: int, block_size: int, batch_size: int) -> Iterator[np.ndarray]:
    """Starts of consecutive, non-overlapping whole windows from the split's start (for evaluation):
    each target is scored at most once, and the tail that fills no whole window (at most
    ``block_size`` − 1 targets: 3 of 99 for 100 tokens and block_size 8) is left out, as every
    window is scored with the same number of targets."""
    starts = np.arange(0, n_tokens - block_size, block_size)
    for i in range(0, len(starts), batch_size):
        yield starts[i : i + batch_size]


class LMBatch(NamedTuple):
    """Language-model windows and their next-token targets."""

    ids: Tensor  # (B, block_size) the model's input
    targets: Tensor  # (B, block_size) targets[:, i] == ids[:, i + 1] within a window

    def to(self, device: torch.device | str, non_blocking: bool = False) -> LMBatch:
        return LMBatch(*(t.to(device, non_blocking=non_blocking) for t in self))


def lm_batch(tokens: np.ndarray, starts: np.ndarray, block_size: int) -> LMBatch:
    """Windows of ``tokens`` at ``starts`` as inputs and next-token targets.

    Shape:
        ids, targets: (B, block_size) LongTensors, targets[:, i] == ids[:, i + 1] within a window
    """
    window = tokens[np.asarray(starts)[:, None] + np.arange(block_size + 1)].astype(np.int64)
    return LMBatch(torch.from_numpy(window[:, :-1].copy()), torch.from_numpy(window[:, 1:].copy()))


class MaskedBatch(NamedTuple):
    """Masked-LM inputs and targets (``masking.mask_tokens``)."""

    ids: Tensor  # (B, T) bos + tokens (some replaced by <mask> or a random token) + eos
    targets: Tensor  # (B, T) the original token at chosen positions, pad_id elsewhere

    def to(self, device: torch.device | str, non_blocking: bool = False) -> MaskedBatch:
        return MaskedBatch(*(t.to(device, non_blocking=non_blocking) for t in self))


class ClassifyBatch(NamedTuple):
    """Sequences and their class ids."""

    ids: Tensor  # (B, T) bos + tokens + eos, padded
    labels: Tensor  # (B,) class ids

    def to(self, device: torch.device | str, non_blocking: bool = False) -> ClassifyBatch:
        return ClassifyBatch(*(t.to(device, non_blocking=non_blocking) for t in self))


def collate_sequences(
    rows: Sequence[np.ndarray], max_len: int, pad_id: int = PAD_ID, bos_id: int = BOS_ID, eos_id: int = EOS_ID
) -> Tensor:
    """Token rows as an encoder's input: ``[bos] + row[: max_len - 2] + [eos]``, padded (bos is the
    first token that ``pooling="first"`` reads, BERT's [CLS]; eos its [SEP]).

    Shape:
        -> (B, min(max(len(row)), max_len - 2) + 2)
    """
    return pad_rows([np.asarray(r)[: max_len - 2] for r in rows], pad_id, bos_id, eos_id)


def reverse_targets(tgt_out: Tensor, pad_id: int = PAD_ID, bos_id: int = BOS_ID, eos_id: int = EOS_ID):
    """The right-to-left decoder's input and targets for a batch's ``tgt_out`` (target + eos, padded):
    ``r2l_in = [bos] + reversed(target)`` and ``r2l_out = reversed(target) + [eos]``, padded alike.

    Shape:
        tgt_out (B, T) -> r2l_in (B, T), r2l_out (B, T)
    """
    lengths = (tgt_out != pad_id).sum(1, keepdim=True) - 1  # (B, 1) target tokens, eos excluded
    pos = torch.arange(tgt_out.size(1), device=tgt_out.device).expand_as(tgt_out)  # (B, T)
    source = (lengths - 1 - pos).clamp(min=0)  # position i of the reversed target reads L-1-i
    reversed_ = tgt_out.gather(1, source)
    real = pos < lengths
    r2l_out = torch.where(real, reversed_, torch.full_like(tgt_out, pad_id))
    r2l_out = torch.where(pos == lengths, torch.full_like(tgt_out, eos_id), r2l_out)
    r2l_in = torch.cat([torch.full_like(tgt_out[:, :1], bos_id), reversed_[:, :-1]], 1)
    r2l_in = torch.where(pos <= lengths, r2l_in, torch.full_like(tgt_out, pad_id))
    r2l_in[:, 0] = bos_id
    return r2l_in, r2l_out
