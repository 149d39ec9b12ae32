"""Masked-language-model pre-training of the encoder-only model (BERT's objective).

Sentences of ``dataset`` (plus ``extra_text``) -> one subword vocabulary with ``<mask>`` ->
sequences -> token-budget batches corrupted by ``mask_tokens`` (15% chosen; 80% ``<mask>``, 10%
random, 10% kept; whole words optionally) -> loss at the chosen positions only. The sequences are
chosen by ``packing``: ``"sentences"`` (the default) reads each line or table row as one sequence,
truncated to ``max_len``, as fine-tuning on single sentences will; ``"blocks"`` packs the documents
(a line or row each) into full blocks of ``max_len`` ids across document boundaries, separated by
``eos`` (``data/packing.py``: BERT's and RoBERTa's pre-training inputs), so no position is padding
and no piece of a long document is cut off. A text file's stream is encoded through the cache
(``encode_text``). Masks are drawn anew for every batch from a generator seeded by (seed, rank,
epoch, batch), so each epoch sees new masks of the same sequences (RoBERTa's dynamic masking) and a
resumed run the same ones. Validation masks are fixed (seed 0), so evaluations compare; besides loss
and perplexity at the masked positions it reports masked-token accuracy, which picks the best
checkpoint.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from aiayn.data.batching import MaskedBatch
from aiayn.data.corpus import load_text
from aiayn.data.masking import Masking, mask_tokens
from aiayn.data.packing import PackedBlocks, encode_documents, join_documents
from aiayn.data.sentences import is_text_file, load_sentences, split_for
from aiayn.errors import ConfigError
from aiayn.models import EncoderModel
from aiayn.training import criteria
from aiayn.training.config import TrainConfig, fail
from aiayn.training.distributed import DistInfo, main_first
from aiayn.training.task import register_task
from aiayn.training.tasks.encoder import EncoderOptions, EncoderTask

PACKINGS = ("sentences", "blocks")


@dataclass
class PretrainOptions(EncoderOptions):
    """What the pre-training tasks (``mlm``, ``rtd``, ``clm``) share: their text and how it is cut."""

    extra_text: list[str] = field(default_factory=list)  # more training text (names or files)
    whole_word_mask: bool = False  # choose whole words rather than pieces
    # "sentences": a line or row per sequence, truncated to max_len; "blocks": documents packed into
    # full max_len blocks across their boundaries, separated by eos (BERT, RoBERTa; data/packing.py)
    packing: str = "sentences"
    eval_max_sentences: int = 0  # validate on the first N lines or rows (documents); 0 = all

    ABOUT: ClassVar[dict[str, str]] = {
        "extra_text": "adds pre-training text (task='mlm', 'rtd' or 'clm')",
        "whole_word_mask": "masks whole words for pre-training (task='mlm', 'rtd' or 'clm')",
        "packing": "cuts pre-training text into blocks (task='mlm', 'rtd' or 'clm')",
    }

    def validate(self, cfg: TrainConfig) -> None:
        super().validate(cfg)
        if self.packing not in PACKINGS:
            fail(self, "packing", f"is not one of {PACKINGS} (one sequence per sentence, or full blocks)")
        if self.eval_max_sentences < 0:
            fail(self, "eval_max_sentences", "must be ≥ 0 (0 = every validation line or row)")
        if not all(isinstance(x, str) and x for x in self.extra_text):
            fail(self, "extra_text", "must be a list of dataset names or file paths")


@dataclass
class MLMOptions(PretrainOptions):
    mask_prob: float = 0.15  # tokens chosen for prediction (BERT)
    mask_token_prob: float = 0.8  # a chosen token becomes <mask> ...
    random_token_prob: float = 0.1  # ... or a random token (else it stays)

    ABOUT: ClassVar[dict[str, str]] = {
        **PretrainOptions.ABOUT,
        "mask_prob": "is masked-LM's share of tokens to predict (task='mlm')",
        "mask_token_prob": "is masked-LM's share of chosen tokens shown as <mask> (task='mlm')",
        "random_token_prob": "is masked-LM's share of chosen tokens replaced at random (task='mlm')",
    }

    def validate(self, cfg: TrainConfig) -> None:
        super().validate(cfg)
        for name in ("mask_token_prob", "random_token_prob"):
            if not 0 <= getattr(self, name) <= 1:
                fail(self, name, "must be in [0, 1]")
        if not 0 < self.mask_prob <= 1:
            fail(self, "mask_prob", "must be in (0, 1]: the share of tokens the model predicts (BERT: 0.15)")
        if self.mask_token_prob + self.random_token_prob > 1:
            fail(self, "random_token_prob", f"+ mask_token_prob={self.mask_token_prob} is more than 1")

    def masking(self) -> Masking:
        return Masking(self.mask_prob, self.mask_token_prob, self.random_token_prob, self.whole_word_mask)


@register_task("mlm")
class MLMTask(EncoderTask):
    """Sentences -> ``MaskedBatch`` (ids, targets) -> encoder-only model, loss at masked positions."""

    options = MLMOptions

    @classmethod
    def check_config(cls, cfg: TrainConfig) -> None:
        if cfg.model.get("n_classes"):
            raise ConfigError("model.n_classes is for task='classify'; pre-training has no classes")
        if cfg.model.get("detector") and cfg.task != "rtd":
            raise ConfigError(f"model.detector is task='rtd''s head; task={cfg.task!r} would never train it")
        super().check_config(cfg)

    def __init__(self, cfg: TrainConfig, run_dir: Path, dist: DistInfo):
        super().__init__(cfg, run_dir, dist)
        o = cfg.options
        separate = bool(cfg.valid_dataset)  # else validation is the dataset's own split (or last tenth)
        # more training text (extra_text): a file whole, a name or folder its train split
        train_parts = [(cfg.dataset, split_for(cfg.dataset, "train") if separate else "train")]
        train_parts += [(extra, split_for(extra, "train")) for extra in o.extra_text]
        valid_source = cfg.valid_dataset or cfg.dataset
        valid_part = (valid_source, split_for(valid_source, "valid") if separate else "valid")
        texts = [load_sentences(name, split, o.text_column) for name, split in train_parts]
        train = [line for lines, _ in texts for line in lines]
        valid, _ = load_sentences(*valid_part, o.text_column)
        valid = valid[: o.eval_max_sentences or None]
        self.tok = self._tokenizer(train, " and ".join(source for _, source in texts))
        if o.packing == "blocks":
            train_stream = self._stream(zip(train_parts, [lines for lines, _ in texts], strict=True))
            self.train = PackedBlocks(train_stream, cfg.max_len - 2)
            valid_stream = join_documents(self.tok.encode_batch(valid), self.tok.eos_id)  # small: in memory
            self.valid = PackedBlocks(valid_stream, cfg.max_len - 2)
        else:
            self.train, self.valid = self._encode(train), self._encode(valid)
        self.word_starts = torch.tensor(self.tok.word_starts()) if o.whole_word_mask else None
        self.sampler = self._sampler(self.train, seed=cfg.seed)

    def _stream(self, parts: Iterable[tuple[tuple[str, str], list[str]]]) -> np.ndarray:
        """The documents of ``parts`` ((source, split), its lines) as one stream (``data/packing.py``):
        a text file's through the encoded-text cache (rank 0 first), a table's or a bundled corpus's
        from its lines in memory."""
        assert self.tok is not None
        streams = []
        for (name, split), lines in parts:
            if is_text_file(name):
                corpus = load_text(name, split, whole_lines=True)  # as load_sentences cuts it
                streams.append(main_first(self.dist, lambda c=corpus: encode_documents(c, self.tok)))
            else:
                streams.append(join_documents(self.tok.encode_batch(lines), self.tok.eos_id))
        return streams[0] if len(streams) == 1 else np.concatenate(streams)

    def build_model(self) -> EncoderModel:
        return EncoderModel(self.encoder_config())

    def _batch(self, rows: list[np.ndarray], rng: np.random.Generator) -> MaskedBatch:
        ids = self._collate(rows)
        assert self.tok is not None and self.tok.mask_id is not None
        tok, masking = self.tok, self.cfg.options.masking()
        inputs, targets = mask_tokens(ids, masking, tok.mask_id, tok.vocab_size, rng, self.word_starts)
        return MaskedBatch(inputs, targets)

    def train_batches(self) -> Iterator[MaskedBatch]:
        while True:
            for idx in self.sampler:
                yield self._batch([self.train[i] for i in idx], self._batch_rng())

    def valid_batches(self) -> Iterator[MaskedBatch]:
        for k, idx in enumerate(self._valid_order(self.valid)):
            yield self._batch([self.valid[i] for i in idx], np.random.default_rng([0, k]))

    def loss(self, model: nn.Module, batch: MaskedBatch, smoothing: float):
        return criteria.masked_lm_loss(model, batch, smoothing)

    def n_targets(self, batch: MaskedBatch) -> int:
        return int((batch.targets != self.special_ids["pad_id"]).sum())

    def extra_metrics(self, model: nn.Module, device: torch.device) -> dict[str, float]:
        """The share of scored positions (targets not padding) whose top prediction is right:
        masked-token accuracy here, next-piece accuracy for ``clm``."""
        right = total = 0
        for batch in self.valid_batches():
            batch = batch.to(device)
            chosen = batch.targets != self.special_ids["pad_id"]  # the pad the targets were built with
            h = model.encode(batch.ids)[0][chosen]  # (N, d_model)
            predicted = model.head(model.token_states(h)).argmax(-1)
            right += int((predicted == batch.targets[chosen]).sum())
            total += int(chosen.sum())
        return {"accuracy": round(100 * right / max(total, 1), 2)}

    def score(self, metrics: dict[str, float]) -> float:
        return metrics["accuracy"]

    def model_meta(self) -> dict[str, Any]:
        return {**super().model_meta(), "objective": "mlm", "packing": self.cfg.options.packing}
