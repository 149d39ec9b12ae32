"""Causal-LM pre-training of the encoder-only model: the next piece from the pieces before it.

The text, vocabulary, packing and batches are masked-LM's (``mlm.py``); the model is the encoder with
``causal=True`` (each position attends to itself and earlier ones, a GPT's look-ahead mask) and the
objective a GPT's (Radford et al. 2018): every position predicts the piece after it (``bos`` the
first piece, a document's last piece its ``eos``). Masked-LM learns from the 15% of positions it
chose, and only once the encoder has learned where to look (until then it guesses frequent pieces
whatever the context: docs/results.md); a next-piece predictor reads its neighbour from the first
updates, every position a target. Nothing is drawn at random, so validation compares across
evaluations as it is.

The batch loops, target count and accuracy are masked-LM's: validation reports the loss, perplexity
and next-piece accuracy (which picks the best checkpoint). A
classifier fine-tuned from it (``task="classify" init_from=…``) keeps the look-ahead mask, or sees
both ways with ``model.causal=false`` (GPT fine-tunes causally; its pooled state is then the mean
over positions that each saw a prefix).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from torch import nn

from aiayn.data.batching import LMBatch
from aiayn.errors import ConfigError
from aiayn.models import EncoderModel
from aiayn.training import criteria
from aiayn.training.config import TrainConfig, fail
from aiayn.training.task import register_task
from aiayn.training.tasks.mlm import MLMTask, PretrainOptions


@dataclass
class CLMOptions(PretrainOptions):
    def validate(self, cfg: TrainConfig) -> None:
        super().validate(cfg)
        if self.whole_word_mask:
            fail(self, "whole_word_mask", "chooses what masked-LM predicts; task='clm' predicts every piece")


@register_task("clm")
class CLMTask(MLMTask):
    """Sentences or blocks -> ``LMBatch`` (ids, next ids) -> causal encoder, loss at every real position."""

    options = CLMOptions

    @classmethod
    def check_config(cls, cfg: TrainConfig) -> None:
        if cfg.model.get("causal") is False:
            raise ConfigError(
                "model.causal=false: causal-LM pre-training needs the look-ahead mask; remove it"
            )
        super().check_config(cfg)

    def build_model(self) -> EncoderModel:
        return EncoderModel(self.encoder_config(causal=True))

    def _batch(self, rows: list[np.ndarray], rng: np.random.Generator | None = None) -> LMBatch:
        """Position i predicts ids[:, i + 1]; padding is no target, nor is an ``eos`` where the text
        was cut rather than ended: the one closing each packed block (the separators between
        documents stay targets) and, with ``packing="sentences"``, the one after a line longer than
        ``max_len - 2`` pieces. ``rng`` (masked-LM's batch loops pass one) is not used.
        Shape: -> ids, targets (B, T - 1)"""
        ids = self._collate(rows)  # (B, T): bos … eos pad …
        targets = ids[:, 1:].clone()
        room = self.cfg.max_len - 2  # pieces a row keeps between bos and eos
        blocks = self.cfg.options.packing == "blocks"
        cut = [i for i, r in enumerate(rows) if blocks or len(r) > room]
        closing = [min(len(rows[i]), room) for i in cut]  # those rows' eos's target index
        targets[cut, closing] = self.special_ids["pad_id"]
        return LMBatch(ids[:, :-1], targets)

    def loss(self, model: nn.Module, batch: LMBatch, smoothing: float):
        return criteria.causal_encoder_loss(model, batch, smoothing)

    def model_meta(self) -> dict[str, Any]:
        return {**super().model_meta(), "objective": "clm"}
