"""Language modelling: text -> random windows (nanoGPT's ``get_batch``) -> a decoder-only model.

The tokenizer (characters or sentencepiece) is trained once per run on the training text and
saved into the run directory, as for translation.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

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
from aiayn.data.tokenizer import SPECIAL_IDS
from aiayn.errors import DataError
from aiayn.models import LanguageModel
from aiayn.models.config import LMConfig
from aiayn.training.distributed import DistInfo, main_first
from aiayn.training.task import TOKENIZER_DIR, Task, register_task

if TYPE_CHECKING:
    from aiayn.training.config import TrainConfig


@register_task("lm")
class LMTask(Task):
    """Text -> ``LMBatch`` (ids, targets) -> decoder-only language model."""

    model_config = LMConfig

    def __init__(self, cfg: TrainConfig, run_dir: Path, dist: DistInfo):
        super().__init__(cfg, run_dir, dist)
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
                    lines = (line for chunk in train.chunks() for line in chunk.splitlines())
                    tok = SentencePieceTokenizer.train(lines, cfg.vocab_size, model_type=cfg.tokenizer)
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
            if len(tokens) <= cfg.block_size:
                raise DataError(
                    f"the {split} text of {source} has {len(tokens)} tokens, "
                    f"not more than block_size={cfg.block_size}; give more text or a smaller block_size"
                )
        self.sampler = WindowSampler(len(self.train), cfg.block_size, cfg.batch_size, seed=cfg.seed,
                                     rank=dist.rank, world_size=dist.world_size)  # fmt: skip

    def build_model(self) -> LanguageModel:
        fields = {"max_len": max(self.cfg.block_size, 1024), **self.cfg.model}
        return LanguageModel(LMConfig.from_dict({**fields, "vocab_size": self.tok.vocab_size, **SPECIAL_IDS}))

    def train_batches(self) -> Iterator[LMBatch]:
        for starts in self.sampler:
            yield lm_batch(self.train, starts, self.cfg.block_size)

    def valid_batches(self) -> Iterator[LMBatch]:
        cfg = self.cfg
        for i, starts in enumerate(sequential_windows(len(self.valid), cfg.block_size, cfg.batch_size)):
            if cfg.eval_iters and i >= cfg.eval_iters:
                return
            yield lm_batch(self.valid, starts, cfg.block_size)

    def loss(self, model: nn.Module, batch: LMBatch, smoothing: float):
        return model(batch.ids, targets=batch.targets, label_smoothing=smoothing)

    def n_targets(self, batch: LMBatch) -> int:
        return batch.targets.numel()

    def save_tokenizers(self, directory: Path) -> None:
        self.tok.save(directory)  # beside config.json, where aiayn generate looks for it
