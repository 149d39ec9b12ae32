"""Replaced-token detection pre-training of the encoder-only model (ELECTRA's discriminator).

The text, vocabulary, packing and batches are masked-LM's (``mlm.py``); the objective is ELECTRA's
(Clark et al. 2020): a share ``replace_prob`` of the tokens (whole words optionally) is replaced by a
generator's samples (``data/replacing.py``), and the encoder's ``detector`` head says at every real
position whether its token was replaced. Every position is a target, where masked-LM learns from the
15% it chose, and no step runs the vocabulary projection. The generator is fixed: the training
text's piece frequencies (``"unigram"``, ELECTRA §3.2) or all ordinary pieces alike (``"uniform"``);
it is computed once from the training stream. Replacements are drawn anew for every batch from a
generator seeded by (seed, rank, epoch, batch), validation's are fixed (seed 0).

Validation reports the detection loss, the accuracy over all scored positions, and the precision,
recall and F1 of "replaced" (the F1 picks the best checkpoint: a detector that calls every token
original is mostly right and has learned nothing). A fine-tuning run reads the encoder
with ``init_from`` as it reads a masked-LM one (the detector is left behind).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from aiayn.data.packing import PackedBlocks
from aiayn.data.replacing import GENERATORS, DetectionBatch, piece_distribution, replace_tokens
from aiayn.errors import ConfigError
from aiayn.models import EncoderModel
from aiayn.training import criteria
from aiayn.training.config import TrainConfig, fail
from aiayn.training.distributed import DistInfo
from aiayn.training.task import register_task
from aiayn.training.tasks.mlm import MLMTask, PretrainOptions

# [model] fields that train the vocabulary head, which detection never reads (unused parameters)
VOCABULARY_HEAD = {"head_transform": False, "output_bias": False, "tie_output": True}


@dataclass
class RTDOptions(PretrainOptions):
    replace_prob: float = 0.15  # tokens replaced by the generator's samples (ELECTRA: 15%)
    replace_from: str = "unigram"  # the generator: "unigram" piece frequencies or "uniform"

    ABOUT: ClassVar[dict[str, str]] = {
        **PretrainOptions.ABOUT,
        "replace_prob": "is replaced-token detection's share of replaced tokens (task='rtd')",
        "replace_from": "is replaced-token detection's generator (task='rtd')",
    }

    def validate(self, cfg: TrainConfig) -> None:
        super().validate(cfg)
        if not 0 < self.replace_prob < 1:
            fail(self, "replace_prob", "must be in (0, 1): the share of tokens replaced (ELECTRA: 0.15)")
        if self.replace_from not in GENERATORS:
            fail(self, "replace_from", f"is not one of {GENERATORS}")


@register_task("rtd")
class RTDTask(MLMTask):
    """Sentences -> ``DetectionBatch`` (ids, labels) -> encoder-only model, loss at every real position."""

    options = RTDOptions

    @classmethod
    def check_config(cls, cfg: TrainConfig) -> None:
        for key, keep in VOCABULARY_HEAD.items():
            if key in cfg.model and cfg.model[key] != keep:
                raise ConfigError(
                    f"model.{key}={cfg.model[key]!r} shapes the vocabulary head, which replaced-token "
                    f"detection never trains; remove it (or use task='mlm')"
                )
        if cfg.model.get("detector") is False:
            raise ConfigError("model.detector=false: replaced-token detection trains that head; remove it")
        super().check_config(cfg)

    def __init__(self, cfg: TrainConfig, run_dir: Path, dist: DistInfo):
        super().__init__(cfg, run_dir, dist)
        assert self.tok is not None
        stream = self.train.stream if isinstance(self.train, PackedBlocks) else np.concatenate(self.train)
        self.probs = piece_distribution(stream, self.tok.vocab_size, cfg.options.replace_from)

    def build_model(self) -> EncoderModel:
        return EncoderModel(self.encoder_config(detector=True))

    def _batch(self, rows: list[np.ndarray], rng: np.random.Generator) -> DetectionBatch:
        o = self.cfg.options
        ids = self._collate(rows)
        inputs, labels = replace_tokens(ids, o.replace_prob, self.probs, rng, self.word_starts)
        return DetectionBatch(inputs, labels)

    def loss(self, model: nn.Module, batch: DetectionBatch, smoothing: float):
        return criteria.replaced_token_loss(model, batch, smoothing)

    def n_targets(self, batch: DetectionBatch) -> int:
        return int((batch.labels >= 0).sum())

    def extra_metrics(self, model: nn.Module, device: torch.device) -> dict[str, float]:
        """Accuracy over the scored positions; precision, recall and F1 of "replaced"."""
        counts = torch.zeros(2, 2, dtype=torch.long)  # [label, predicted]
        for batch in self.valid_batches():
            batch = batch.to(device)
            scored = batch.labels >= 0
            predicted = (model.detect(batch.ids)[scored] > 0).long().cpu()
            counts += torch.bincount(2 * batch.labels[scored].cpu() + predicted, minlength=4).view(2, 2)
        tp, fp, fn = int(counts[1, 1]), int(counts[0, 1]), int(counts[1, 0])
        precision, recall = tp / max(tp + fp, 1), tp / max(tp + fn, 1)
        f1 = 2 * precision * recall / max(precision + recall, 1e-12)
        accuracy = int(counts.diagonal().sum()) / max(int(counts.sum()), 1)
        return {name: round(100 * v, 2) for name, v in
                dict(accuracy=accuracy, precision=precision, recall=recall, f1=f1).items()}  # fmt: skip

    def score(self, metrics: dict[str, float]) -> float:
        return metrics["f1"]

    def model_meta(self) -> dict[str, Any]:
        o = self.cfg.options
        return {**super().model_meta(), "objective": "rtd", "replace_from": o.replace_from}
