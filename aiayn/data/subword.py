"""Subword regularisation: the training corpus re-segmented at random every epoch.

BPE-dropout (Provilkov et al. 2020) skips each merge of a BPE vocabulary with probability ``p``
while encoding, so the model sees each word split many ways and learns its pieces' composition;
with a unigram vocabulary the segmentation is sampled from the lattice instead (Kudo 2018). Only
training pairs are sampled: validation, test and decoding use the deterministic segmentation.

``ResegmentedEpochs`` is the translation task's sampler when ``subword_dropout > 0``: epoch ``e``
encodes every pair with seeds drawn from ``(seed, e)``, filters it like the cached corpus
(``CorpusFilter``, on the sampled lengths) and cuts it into token-budget batches with
``TokenBatchSampler``. Its state is ``{"epoch": e, "position": p}``, as ``TokenBatchSampler``'s, and
everything is a function of it, so ``--resume`` and every DDP rank see the same segmentation.
``sides`` samples only the source (or target) side and keeps the other deterministic. Each epoch
costs one encoding pass (about 1 s for Multi30k's 29k pairs on one core).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from aiayn.data.batching import EpochPosition, TokenBatchSampler, read_position
from aiayn.data.cache import Ragged
from aiayn.data.corpus import CorpusFilter, FilterStats
from aiayn.data.tokenizer import SentencePieceTokenizer
from aiayn.errors import ModelDirError

SIDES = ("both", "source", "target")


class SampledParallel:
    """One segmentation of a parallel corpus, in memory; item i is ``(src_ids, tgt_ids)`` (numpy
    arrays, no bos/eos), as ``EncodedParallel``'s; ``stats`` says what the filter dropped."""

    def __init__(self, src: Ragged, tgt: Ragged, stats: FilterStats):
        self.src, self.tgt, self.stats = src, tgt, stats

    def __len__(self) -> int:
        return len(self.src)

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        return self.src[i], self.tgt[i]


@dataclass(frozen=True)
class Resegmenter:
    """Text pairs, their tokenizers, the dropout and the filter: ``sample(seed)`` segments them anew."""

    pairs: Sequence[tuple[str, str]]
    src_tok: SentencePieceTokenizer
    tgt_tok: SentencePieceTokenizer
    dropout: float  # BPE-dropout's p (a unigram model's α); in (0, 1)
    corpus_filter: CorpusFilter
    sides: str = "both"  # which are sampled: "both", "source" or "target" (the other stays deterministic)

    def __post_init__(self) -> None:
        if not 0 < self.dropout < 1:
            raise ValueError(f"dropout={self.dropout} must be in (0, 1)")
        if self.sides not in SIDES:
            raise ValueError(f"sides={self.sides!r} is not one of {SIDES}")

    def sample(self, seed: int | list[int]) -> SampledParallel:
        src_seed, tgt_seed = np.random.default_rng(seed).integers(2**32, size=2).tolist()
        srcs, tgts = [s for s, _ in self.pairs], [t for _, t in self.pairs]
        src_p, tgt_p = (self.dropout if self.sides in (s, "both") else 0.0 for s in ("source", "target"))
        src_ids = self.src_tok.sample_batch(srcs, src_p, src_seed)
        tgt_ids = self.tgt_tok.sample_batch(tgts, tgt_p, tgt_seed)
        stats, keep = FilterStats(total=len(srcs)), []
        for i, (s, t, a, b) in enumerate(zip(srcs, tgts, src_ids, tgt_ids)):
            if why := self.corpus_filter.reason(s, t, len(a), len(b)):
                setattr(stats, why, getattr(stats, why) + 1)
            else:
                keep.append(i)
        stats.kept = len(keep)
        src, tgt = (_ragged([ids[i] for i in keep]) for ids in (src_ids, tgt_ids))
        return SampledParallel(src, tgt, stats)


def _ragged(seqs: list[list[int]]) -> Ragged:
    offsets = np.zeros(len(seqs) + 1, np.int64)
    np.cumsum([len(s) for s in seqs], out=offsets[1:])
    flat = np.fromiter((i for s in seqs for i in s), np.int64, count=int(offsets[-1]))
    return Ragged(flat, offsets)


class ResegmentedEpochs(EpochPosition):
    """Token-budget batches of ``(src_ids, tgt_ids)`` pairs, the corpus re-segmented each epoch.

    Iterating yields this rank's remaining batches of the current epoch, then moves to the next;
    ``state_dict``/``load_state_dict`` resume exactly (see the module docstring).
    """

    def __init__(self, resegmenter: Resegmenter, max_tokens: int, seed: int = 0, rank: int = 0,
                 world_size: int = 1):  # fmt: skip
        self.resegmenter, self.max_tokens = resegmenter, max_tokens
        self.seed, self.rank, self.world_size = seed, rank, world_size
        self.epoch, self.position = 0, 0
        self._built: tuple[int, SampledParallel, TokenBatchSampler] | None = None

    def data(self, epoch: int) -> tuple[SampledParallel, TokenBatchSampler]:
        """Epoch ``epoch``'s segmentation and its batch sampler (the last one built is kept)."""
        if self._built is None or self._built[0] != epoch:
            data = self.resegmenter.sample([self.seed, epoch])
            sampler = TokenBatchSampler(data.src.lengths, data.tgt.lengths, self.max_tokens, seed=self.seed,
                                        rank=self.rank, world_size=self.world_size)  # fmt: skip
            self._built = epoch, data, sampler
        return self._built[1], self._built[2]

    def __len__(self) -> int:
        """This rank's batches in the current epoch (epochs differ by a few batches)."""
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
