"""Subword regularisation: the training corpus re-segmented at random, a new sample each epoch.

BPE-dropout (Provilkov et al. 2020) skips each merge of a BPE vocabulary with probability ``p``
while encoding, so the model sees each word split many ways and learns its pieces' composition.
Only training pairs are sampled: validation, test and decoding use the deterministic segmentation.

**Samples are made once and saved.** sentencepiece's sampling repeats for a seed within one process
but not across processes (measured: same seed, same model, other ids in a new process), so neither
DDP ranks nor a resumed run could redraw a sample. ``segmentations`` therefore draws
``SEGMENTATIONS`` samples of the corpus once (rank 0), saves them in the run directory (``.npz``,
no pickle) and every rank and every resume reads those files. Each sample is filtered like the
cached corpus (``CorpusFilter``, on the sampled lengths); the translation task hands them to
``batching.CorpusEpochs``, so epoch ``e`` is batched from sample ``e mod SEGMENTATIONS``. ``sides``
samples only the source (or target) side and keeps the other deterministic. A sample costs one
encoding pass of the training pairs and one ``.npz`` file (docs/results.md has the figures for
Multi30k). ``sampled_texts`` does the same for one side of texts, a classifier's training texts.
"""

from __future__ import annotations

import io
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from aiayn.atomic import write_bytes
from aiayn.data.cache import EncodedParallel, Ragged
from aiayn.data.corpus import CorpusFilter, FilterStats
from aiayn.data.tokenizer import SentencePieceTokenizer
from aiayn.errors import DataError

SIDES = ("both", "source", "target")
SEGMENTATIONS = 8  # samples a run cycles through: epoch e reads sample e mod 8
SAMPLES_DIR = "subword"  # where a run keeps its saved samples (translation pairs or classifier texts)


class SampledParallel:
    """One segmentation of a parallel corpus, in memory; item i is ``(src_ids, tgt_ids)`` (numpy
    arrays, no bos/eos), as ``EncodedParallel``'s; ``stats`` says what the filter dropped."""

    def __init__(self, src: Ragged, tgt: Ragged, stats: FilterStats | None = None):
        self.src, self.tgt, self.stats = src, tgt, stats

    def save(self, path: Path) -> None:
        _save_raggeds(path, src=self.src, tgt=self.tgt)

    @classmethod
    def load(cls, path: Path) -> SampledParallel:
        return cls(*_load_raggeds(path, "src", "tgt"))

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
        stats = FilterStats()
        keep = self.corpus_filter.keep(srcs, tgts, src_ids, tgt_ids, stats)
        if not keep:
            raise DataError(f"every pair of this segmentation was filtered out ({stats}): relax the filter")
        src, tgt = (to_ragged([ids[i] for i in keep]) for ids in (src_ids, tgt_ids))
        return SampledParallel(src, tgt, stats)


def segmentations(resegmenter: Resegmenter, directory: Path, seed: int, n: int = SEGMENTATIONS
                  ) -> list[SampledParallel]:  # fmt: skip
    """The run's ``n`` samples: drawn (seeded by ``(seed, k)``) and saved where ``directory`` lacks
    them, then read back, so that whoever calls this later reads the very same ids."""
    directory.mkdir(parents=True, exist_ok=True)
    samples = []
    for k in range(n):
        path = directory / f"segmentation-{k}.npz"
        if not path.is_file():
            resegmenter.sample([seed, k]).save(path)
        samples.append(SampledParallel.load(path))
    return samples


def sampled_texts(texts: Sequence[str], tok: SentencePieceTokenizer, dropout: float, directory: Path,
                  seed: int, n: int = SEGMENTATIONS) -> list[Ragged]:  # fmt: skip
    """``n`` segmentations of ``texts`` (one side, unfiltered: a classifier's training texts), drawn
    with ``dropout`` (seeded by ``(seed, k)``) and saved where ``directory`` lacks them, then read
    back, as ``segmentations`` does for pairs."""
    if not 0 < dropout < 1:
        raise ValueError(f"dropout={dropout} must be in (0, 1)")
    directory.mkdir(parents=True, exist_ok=True)
    samples = []
    for k in range(n):
        path = directory / f"texts-{k}.npz"
        if not path.is_file():
            seed_k = int(np.random.default_rng([seed, k]).integers(2**32))
            _save_raggeds(path, texts=to_ragged(tok.sample_batch(list(texts), dropout, seed_k)))
        (sample,) = _load_raggeds(path, "texts")
        if len(sample) != len(texts):
            raise DataError(f"{path} segments {len(sample)} texts, not these {len(texts)}; delete it")
        samples.append(sample)
    return samples


def pairs_report(
    dropout: float,
    plain: EncodedParallel | SampledParallel,
    samples: Sequence[SampledParallel],
    sides: str = "both",
) -> str:
    """``report`` for a corpus of pairs: each sampled side of ``samples`` against ``plain`` (the
    deterministic ``EncodedParallel``). The samples are filtered on their own lengths, so text i
    of a sample need not be pair i of ``plain``: only pieces per sentence are compared, and the
    pairs each kept (longer segmentations pass a length filter less often: said, not silent)."""
    named = {"source": "src", "target": "tgt"}
    compared = {f"{name}: ": (getattr(plain, side), [getattr(s, side) for s in samples])
                for name, side in named.items() if sides in (name, "both")}  # fmt: skip
    kept = sorted(len(s) for s in samples)
    among = f"{kept[0]:,}" if kept[0] == kept[-1] else f"{kept[0]:,}–{kept[-1]:,}"
    return (report(dropout, "pairs", compared, aligned=False)
            + f"; {among} pairs kept by the filter in each against {len(plain):,} deterministic")  # fmt: skip


Sides = dict[str, tuple[Ragged, Sequence[Ragged]]]  # a side's name: (deterministic, samples)


def report(dropout: float, what: str, sides: Sides, aligned: bool) -> str:
    """One line on what subword regularisation did to the training text: for each side (name:
    (deterministic, samples)), the pieces per text in the samples (their mean) against the
    deterministic segmentation's, and where text i of a sample is text i of the deterministic
    one (``aligned``), the share of texts a sample splits otherwise (the samples' mean)."""
    parts = []
    for name, (plain, drawn) in sides.items():
        base, got = float(plain.lengths.mean()), float(np.mean([d.lengths.mean() for d in drawn]))
        change = got / base - 1 if base else 0.0  # texts of no pieces at all: nothing to lengthen
        part = f"{name}{got:.2f} pieces a text against {base:.2f} deterministic ({change:+.1%})"
        if aligned:
            share = np.mean([split_otherwise(plain, d).mean() for d in drawn])
            part += f", {share:.1%} of texts split otherwise"
        parts.append(part)
    n = len(next(iter(sides.values()))[1])
    return f"subword_dropout={dropout}: {n} segmentations of the training {what}; " + "; ".join(parts)


def split_otherwise(a: Ragged, b: Ragged) -> np.ndarray:
    """Per text, whether ``a`` and ``b`` (the same texts, in the same order) hold other pieces."""
    if len(a) != len(b):
        raise ValueError(f"{len(a)} texts against {len(b)}: not the same texts")
    la, lb = a.lengths, b.lengths
    differ = la != lb
    same = np.flatnonzero(~differ)  # texts of equal length: compare their pieces one by one
    lengths = la[same]
    text = np.repeat(np.arange(len(same)), lengths)  # each compared position's text (among ``same``)
    within = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    unequal = a.ids[a.offsets[same][text] + within] != b.ids[b.offsets[same][text] + within]
    differ[same] = np.bincount(text, weights=unequal, minlength=len(same)) > 0
    return differ


def _save_raggeds(path: Path, **raggeds: Ragged) -> None:
    """Each ``name=ragged`` as its ``name_ids`` and ``name_offsets`` arrays in one ``.npz`` (no pickle)."""
    arrays = {f"{name}_{part}": getattr(ragged, part)
              for name, ragged in raggeds.items() for part in ("ids", "offsets")}  # fmt: skip
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    write_bytes(path, buffer.getvalue())


def _load_raggeds(path: Path, *names: str) -> list[Ragged]:
    """The ``names``' ragged arrays that ``_save_raggeds`` wrote to ``path``."""
    try:
        with np.load(path, allow_pickle=False) as z:
            return [Ragged(z[f"{name}_ids"], z[f"{name}_offsets"]) for name in names]
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as e:
        raise DataError(f"{path}: not a saved segmentation ({e}); delete it to draw it again") from None


def to_ragged(seqs: Sequence[Sequence[int]]) -> Ragged:
    """Sequences of ids as one ``Ragged`` (flat int32 ids, int64 offsets)."""
    offsets = np.zeros(len(seqs) + 1, np.int64)
    np.cumsum([len(s) for s in seqs], out=offsets[1:])
    flat = np.fromiter((i for s in seqs for i in s), np.int32, count=int(offsets[-1]))
    return Ragged(flat, offsets)
