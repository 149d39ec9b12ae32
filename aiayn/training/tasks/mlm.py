"""Masked-language-model pre-training of the encoder-only model (BERT's objective).

Sentences of ``dataset`` (plus ``extra_text``) -> one subword vocabulary with ``<mask>`` ->
token-budget batches corrupted by ``mask_tokens`` (15% chosen; 80% ``<mask>``, 10% random, 10%
kept; whole words optionally) -> loss at the chosen positions only. Masks are drawn anew for
every batch from a generator seeded by (seed, rank, epoch, batch), so each epoch sees new masks
and a resumed run the same ones. Validation masks are fixed (seed 0), so evaluations compare;
besides loss and perplexity at the masked positions it reports masked-token accuracy, which picks
the best checkpoint.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from aiayn.data import PAD_ID
from aiayn.data.batching import MaskedBatch
from aiayn.data.masking import Masking, mask_tokens
from aiayn.data.sentences import load_sentences, split_for
from aiayn.errors import ConfigError
from aiayn.models import EncoderModel
from aiayn.training import criteria
from aiayn.training.config import TrainConfig, fail
from aiayn.training.distributed import DistInfo
from aiayn.training.task import register_task
from aiayn.training.tasks.encoder import EncoderOptions, EncoderTask


@dataclass
class MLMOptions(EncoderOptions):
    extra_text: list[str] = field(default_factory=list)  # more training text (names or files)
    mask_prob: float = 0.15  # tokens chosen for prediction (BERT)
    mask_token_prob: float = 0.8  # a chosen token becomes <mask> ...
    random_token_prob: float = 0.1  # ... or a random token (else it stays)
    whole_word_mask: bool = False  # choose whole words rather than pieces

    def validate(self, cfg: TrainConfig) -> None:
        super().validate(cfg)
        for name in ("mask_token_prob", "random_token_prob"):
            if not 0 <= getattr(self, name) <= 1:
                fail(self, name, "must be in [0, 1]")
        if not 0 < self.mask_prob <= 1:
            fail(self, "mask_prob", "must be in (0, 1]: the share of tokens the model predicts (BERT: 0.15)")
        if self.mask_token_prob + self.random_token_prob > 1:
            fail(self, "random_token_prob", f"+ mask_token_prob={self.mask_token_prob} is more than 1")
        if not all(isinstance(x, str) and x for x in self.extra_text):
            fail(self, "extra_text", "must be a list of dataset names or file paths")


@register_task("mlm")
class MLMTask(EncoderTask):
    """Sentences -> ``MaskedBatch`` (ids, targets) -> encoder-only model, loss at masked positions."""

    options = MLMOptions

    @classmethod
    def check_config(cls, cfg: TrainConfig) -> None:
        if cfg.model.get("n_classes"):
            raise ConfigError("model.n_classes is for task='classify'; masked-LM pre-training has no classes")
        super().check_config(cfg)

    def __init__(self, cfg: TrainConfig, run_dir: Path, dist: DistInfo):
        super().__init__(cfg, run_dir, dist)
        o = cfg.options
        self.masking = Masking(o.mask_prob, o.mask_token_prob, o.random_token_prob, o.whole_word_mask)
        separate = bool(cfg.valid_dataset)  # else validation is the dataset's own split (or last tenth)
        train_split = split_for(cfg.dataset, "train") if separate else "train"
        train, source = load_sentences(cfg.dataset, train_split, o.text_column)
        for extra in o.extra_text:  # more training text: a file whole, a name or folder its train split
            more, name = load_sentences(extra, split_for(extra, "train"), o.text_column)
            train, source = train + more, f"{source} and {name}"
        valid_source = cfg.valid_dataset or cfg.dataset
        valid_split = split_for(valid_source, "valid") if separate else "valid"
        valid, _ = load_sentences(valid_source, valid_split, o.text_column)
        self.tok = self._tokenizer(train, source)
        self.train, self.valid = self._encode(train), self._encode(valid)
        self.word_starts = torch.tensor(self.tok.word_starts()) if o.whole_word_mask else None
        self.sampler = self._sampler(self.train, seed=cfg.seed)

    def build_model(self) -> EncoderModel:
        return EncoderModel(self.encoder_config())

    def _batch(self, rows: list[np.ndarray], rng: np.random.Generator) -> MaskedBatch:
        ids = self._collate(rows)
        assert self.tok is not None and self.tok.mask_id is not None
        inputs, targets = mask_tokens(ids, self.masking, self.tok.mask_id, self.tok.vocab_size, rng,
                                      self.word_starts)  # fmt: skip
        return MaskedBatch(inputs, targets)

    def train_batches(self) -> Iterator[MaskedBatch]:
        s = self.sampler
        while True:
            for idx in s:  # s.epoch, s.position: this batch's place, which seeds its masks
                rng = np.random.default_rng([self.cfg.seed, self.dist.rank, s.epoch, s.position])
                yield self._batch([self.train[i] for i in idx], rng)

    def valid_batches(self) -> Iterator[MaskedBatch]:
        for k, idx in enumerate(self._valid_order(self.valid)):
            yield self._batch([self.valid[i] for i in idx], np.random.default_rng([0, k]))

    def loss(self, model: nn.Module, batch: MaskedBatch, smoothing: float):
        return criteria.masked_lm_loss(model, batch, smoothing)

    def n_targets(self, batch: MaskedBatch) -> int:
        return int((batch.targets != PAD_ID).sum())

    def extra_metrics(self, model: nn.Module, device: torch.device) -> dict[str, float]:
        """Masked-token accuracy: the share of chosen positions whose top prediction is right."""
        right = total = 0
        for batch in self.valid_batches():
            batch = batch.to(device)
            chosen = batch.targets != PAD_ID
            h = model.encode(batch.ids)[0][chosen]  # (N, d_model)
            predicted = model.head(model.token_states(h)).argmax(-1)
            right += int((predicted == batch.targets[chosen]).sum())
            total += int(chosen.sum())
        return {"accuracy": round(100 * right / max(total, 1), 2)}

    def score(self, metrics: dict[str, float]) -> float:
        return metrics["accuracy"]

    def model_meta(self) -> dict[str, Any]:
        return {**super().model_meta(), "objective": "mlm"}
