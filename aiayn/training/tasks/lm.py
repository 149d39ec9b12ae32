"""Language modelling: text -> random windows (nanoGPT's ``get_batch``) -> a decoder-only model.

The tokenizer (characters or sentencepiece) is trained once per run on the training text and
saved into the run directory, as for translation.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from torch import nn

from aiayn.data import (
    CharTokenizer,
    LMBatch,
    SentencePieceTokenizer,
    WindowSampler,
    encode_text,
    lm_batch,
    load_text,
    load_tokenizer,
    sequential_windows,
)
from aiayn.data.files import split_lines
from aiayn.data.tokenizer import SPECIAL_IDS
from aiayn.errors import DataError
from aiayn.models import LanguageModel
from aiayn.models.config import LMConfig
from aiayn.training import criteria
from aiayn.training.config import TaskOptions, TrainConfig, fail
from aiayn.training.distributed import DistInfo, main_first
from aiayn.training.task import TOKENIZER_DIR, Task, check_learned_positions, register_task


@dataclass
class LMOptions(TaskOptions):
    batch_size: int = 12  # windows per batch
    block_size: int = 64  # context length
    eval_iters: int = 0  # validation batches per evaluation; 0 = the whole split

    ABOUT: ClassVar[dict[str, str]] = {
        "batch_size": "is a language model's windows per batch (task='lm'; other tasks batch by max_tokens)",
        "block_size": "is a language model's context (task='lm'; the other tasks read max_len)",
    }

    def validate(self, cfg: TrainConfig) -> None:
        super().validate(cfg)
        for name in ("batch_size", "block_size"):
            if getattr(self, name) < 1:
                fail(self, name, "must be ≥ 1")
        if self.eval_iters < 0:
            fail(self, "eval_iters", "must be ≥ 0")

    def inert(self, cfg: TrainConfig) -> dict[str, str]:
        inert = {
            "max_len": "task='lm' trains on windows of block_size tokens",
            "max_tokens": "task='lm' batches batch_size windows",
        }
        if cfg.tokenizer == "char":
            inert["vocab_size"] = "tokenizer='char' takes every character it sees"
        return inert


@register_task("lm")
class LMTask(Task):
    """Text -> ``LMBatch`` (ids, targets) -> decoder-only language model."""

    model_config = LMConfig
    options = LMOptions

    def batch_tokens(self) -> int:
        return self.opts.batch_size * self.opts.block_size

    @classmethod
    def check_config(cls, cfg: TrainConfig) -> None:
        check_learned_positions(cfg, cfg.options.block_size, f"block_size={cfg.options.block_size}")
        super().check_config(cfg)

    def __init__(self, cfg: TrainConfig, run_dir: Path, dist: DistInfo):
        super().__init__(cfg, run_dir, dist)
        o = self.opts = cfg.options
        if cfg.valid_dataset:
            train, valid = load_text(cfg.dataset, "all"), load_text(cfg.valid_dataset, "all")
        else:
            train, valid = load_text(cfg.dataset, "train"), load_text(cfg.dataset, "valid")
        tok_dir = run_dir / TOKENIZER_DIR

        def tokenizer():  # trained once (rank 0), then read back by every rank
            if not tok_dir.is_dir():
                if cfg.tokenizer == "char":
                    tok = CharTokenizer.train(train.chunks())
                else:
                    # trained on the lines of the text it then encodes as a stream (encode_text): no
                    # "▁" before each line's first word, which the stream does not have either
                    lines = (line for chunk in train.chunks() for line in split_lines(chunk))
                    tok = SentencePieceTokenizer.train(
                        lines, cfg.vocab_size, model_type=cfg.tokenizer, add_dummy_prefix=False
                    )
                tok.save(tok_dir)
            return load_tokenizer(tok_dir)

        self.tok = main_first(dist, tokenizer)
        encoded = main_first(dist, lambda: (encode_text(train, self.tok), encode_text(valid, self.tok)))
        self.train, self.valid = (np.asarray(e.tokens) for e in encoded)
        splits = (
            ("training", self.train, cfg.dataset),
            ("validation", self.valid, cfg.valid_dataset or cfg.dataset),
        )
        for split, tokens, source in splits:
            if len(tokens) <= o.block_size:
                raise DataError(
                    f"the {split} text of {source} has {len(tokens)} tokens, "
                    f"not more than block_size={o.block_size}; give more text or a smaller block_size"
                )
        self.sampler = WindowSampler(len(self.train), o.block_size, o.batch_size, seed=cfg.seed,
                                     rank=dist.rank, world_size=dist.world_size)  # fmt: skip

    def build_model(self) -> LanguageModel:
        fields = {"max_len": max(self.opts.block_size, 1024), **self.cfg.model}
        return LanguageModel(LMConfig.from_dict({**fields, "vocab_size": self.tok.vocab_size, **SPECIAL_IDS}))

    def train_batches(self) -> Iterator[LMBatch]:
        for starts in self.sampler:
            yield lm_batch(self.train, starts, self.opts.block_size)

    def valid_batches(self) -> Iterator[LMBatch]:
        o = self.opts
        for i, starts in enumerate(sequential_windows(len(self.valid), o.block_size, o.batch_size)):
            if o.eval_iters and i >= o.eval_iters:
                return
            yield lm_batch(self.valid, starts, o.block_size)

    def loss(self, model: nn.Module, batch: LMBatch, smoothing: float):
        return criteria.next_token_loss(model, batch, smoothing)

    def n_targets(self, batch: LMBatch) -> int:
        return batch.targets.numel()

    def model_meta(self) -> dict[str, Any]:
        """``trained_max_len``: the context trained on (``block_size``); generation reads no more
        (``decoding/generator.py``), since the model's positions past it (it has
        ``max(block_size, 1024)``) never trained. ``untrained_ids``: the special ids the text stream
        never holds (bos, unk, eos), which only label smoothing gave any probability: generation
        never emits them (a sampled eos ended a server's answer after a few tokens)."""
        c = self.tok
        untrained = sorted({c.bos_id, c.unk_id, c.eos_id} - {c.pad_id})
        return {**super().model_meta(), "trained_max_len": self.opts.block_size, "untrained_ids": untrained}

    def save_tokenizers(self, directory: Path) -> None:
        self.tok.save(directory)  # beside config.json, where aiayn generate looks for it
