"""What the two encoder-only tasks (``mlm``, ``classify``) share: one subword vocabulary with a
``<mask>`` piece, sentences encoded once, and token-budget batches of single sequences.

Each sequence is ``[bos] + pieces[: max_len - 2] + [eos]`` (``collate_sequences``), padded with
``pad``: the special ids are the run's tokenizer's (``special_ids``), in every batch and in the model
config alike, so an imported BERT's WordPiece vocabulary batches as [CLS] … [SEP] [PAD]. Batches hold
at most ``max_tokens`` padded ids and are shuffled per epoch by ``TokenBatchSampler`` (which adds
one special per side, so it is given ``length + 1``), resumable and sharded like translation's.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from torch import Tensor

from aiayn.data import SentencePieceTokenizer, TokenBatchSampler, Tokenizer, load_tokenizer
from aiayn.data.batching import collate_sequences
from aiayn.errors import ConfigError
from aiayn.models.config import EncoderConfig
from aiayn.training.config import TaskOptions, TrainConfig
from aiayn.training.distributed import DistInfo, main_first
from aiayn.training.task import TOKENIZER_DIR, Task, check_learned_positions


@dataclass
class EncoderOptions(TaskOptions):
    text_column: str = ""  # tables (TSV/CSV/JSONL): the text's column name or 0-based number
    # a vocabulary trained here lowercases all text (a normalisation rule inside the tokenizer, so
    # fine-tuning, classify and fill-mask read text as pre-training did); False = text as written
    lowercase: bool = False


class EncoderTask(Task):
    """Base of the encoder-only tasks; subclasses read their data and define the objective."""

    model_config = EncoderConfig
    options = EncoderOptions

    @classmethod
    def check_config(cls, cfg: TrainConfig) -> None:
        if cfg.tokenizer == "char":
            raise ConfigError(f"tokenizer='char' is for task='lm'; use bpe or unigram for task={cfg.task!r}")
        if cfg.max_len < 3:
            raise ConfigError(f"max_len={cfg.max_len} leaves no room for a token between bos and eos")
        if cfg.max_len > cfg.max_tokens:
            raise ConfigError(f"max_len={cfg.max_len} is over max_tokens={cfg.max_tokens}: a batch could not "
                              "hold one sequence; raise max_tokens or lower max_len")  # fmt: skip
        check_learned_positions(cfg, cfg.max_len, f"max_len={cfg.max_len}")
        super().check_config(cfg)

    def __init__(self, cfg: TrainConfig, run_dir: Path, dist: DistInfo):
        super().__init__(cfg, run_dir, dist)
        self.tok: Tokenizer | None = None

    def _tokenizer(self, sentences: Sequence[str], source: str) -> Tokenizer:
        """The run's vocabulary: trained on ``sentences`` once (rank 0) with a ``<mask>`` piece,
        saved in the run directory and read back by every rank and every resume."""
        tok_dir, cfg = self.run_dir / TOKENIZER_DIR, self.cfg

        def tokenizer():
            if not tok_dir.is_dir():
                SentencePieceTokenizer.train(
                    sentences,
                    cfg.vocab_size,
                    model_type=cfg.tokenizer,
                    source=source,
                    mask=True,
                    lowercase=cfg.options.lowercase,
                ).save(tok_dir)
            return load_tokenizer(tok_dir)

        return main_first(self.dist, tokenizer)

    def _encode(self, sentences: Sequence[str]) -> list[np.ndarray]:
        assert self.tok is not None
        return [np.asarray(ids, np.int32) for ids in self.tok.encode_batch(list(sentences))]

    @property
    def special_ids(self) -> dict[str, int]:
        """The tokenizer's pad/bos/eos/unk ids, as ``EncoderConfig`` fields."""
        assert self.tok is not None
        t = self.tok
        return dict(pad_id=t.pad_id, bos_id=t.bos_id, eos_id=t.eos_id, unk_id=t.unk_id)

    def _collate(self, rows: Sequence[np.ndarray]) -> Tensor:
        """``rows`` as the encoder's input ids, with the tokenizer's bos, eos and pad. Shape: -> (B, T)"""
        ids = self.special_ids
        return collate_sequences(rows, self.cfg.max_len, ids["pad_id"], ids["bos_id"], ids["eos_id"])

    def _sampler(self, rows: list[np.ndarray], shuffle: bool = True, seed: int = 0, distributed: bool = True):
        """Token-budget batches over ``rows`` as collated (truncated to max_len, bos and eos added)."""
        lengths = np.minimum([len(r) for r in rows], self.cfg.max_len - 2) + 1  # + bos; the sampler adds eos
        rank, world = (self.dist.rank, self.dist.world_size) if distributed else (0, 1)
        return TokenBatchSampler(lengths, lengths, self.cfg.max_tokens, shuffle=shuffle, seed=seed,
                                 rank=rank, world_size=world)  # fmt: skip

    def _valid_order(self, rows: list[np.ndarray]) -> Iterator[list[int]]:
        for idx in self._sampler(rows, shuffle=False, distributed=False).batches(0):
            yield idx.tolist()

    def encoder_config(self, **fields: Any) -> EncoderConfig:
        assert self.tok is not None
        base = {"max_len": max(self.cfg.max_len, 512), **self.cfg.model, **fields}
        return EncoderConfig.from_dict({**base, "vocab_size": self.tok.vocab_size, **self.special_ids})

    @property
    def epoch(self) -> int:
        return self.sampler.state_dict()["epoch"]

    def _batch_rng(self) -> np.random.Generator:
        """The random draws of the sampler's current training batch (masks, replacements, words left
        out), seeded by the run's seed, the rank and the batch's place (``epoch``, ``position``), so a
        resumed run draws what an uninterrupted one would."""
        s = self.sampler
        return np.random.default_rng([self.cfg.seed, self.dist.rank, s.epoch, s.position])

    def model_meta(self) -> dict[str, Any]:
        """``trained_max_len``: the longest row trained on (bos and eos included); the model's learned
        positions past it (it has ``max(max_len, 512)``) are untrained, which fine-tuning checks."""
        return {**super().model_meta(), "trained_max_len": self.cfg.max_len}

    def save_tokenizers(self, directory: Path) -> None:
        assert self.tok is not None
        self.tok.save(directory)  # beside config.json, where aiayn classify / fill-mask look for it
