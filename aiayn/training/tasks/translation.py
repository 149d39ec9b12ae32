"""Translation: a parallel corpus -> token-budget batches -> the encoder–decoder (paper §5).

The tokenizers (joint or per side) are trained once per run on the training split and saved into
the run directory; a resumed run or another rank reads them from there, so every process and every
checkpoint agrees on the vocabulary. Each evaluation adds greedy BLEU on the validation set
(sacreBLEU), which then picks the best checkpoint. With ``subword_dropout > 0`` each epoch reads
another of 8 BPE-dropout samples of the training pairs, drawn once and saved in the run directory
(``aiayn/data/subword.py``); evaluation is never sampled. With ``output_vocab="target"`` the model's
output layer scores only the pieces that occur on the target side of the training data
(``OutputProjection`` pieces): of a joint vocabulary, the source language's own pieces drop out of
the largest matrix product of a step.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from aiayn.data import (
    CorpusEpochs,
    CorpusFilter,
    TokenBatchSampler,
    TranslationBatch,
    collate_translation,
    encode_parallel,
    load_parallel,
    load_translation_tokenizers,
    reverse_targets,
    save_translation_tokenizers,
    train_translation_tokenizers,
)
from aiayn.data.subword import Resegmenter, segmentations
from aiayn.data.tokenizer import SPECIAL_IDS
from aiayn.errors import ConfigError
from aiayn.models import Transformer, build_transformer
from aiayn.models.config import TransformerConfig
from aiayn.training import criteria
from aiayn.training.config import TaskOptions, TrainConfig, fail
from aiayn.training.distributed import DistInfo, main_first
from aiayn.training.task import TOKENIZER_DIR, Task, register_task

SUBWORD_DIR = "subword"  # subword_dropout: the run's saved training-set samples


@dataclass
class TranslationOptions(TaskOptions):
    src_lang: str = "de"  # file suffixes / Multi30k languages
    tgt_lang: str = "en"
    joint_vocab: bool = True  # one vocabulary for both sides (needed for shared embeddings)
    # a vocabulary that lowercases all text, so the model reads and writes lowercased text (as the
    # Multi30k literature trains on its lowercased files); False = the text as written (the paper)
    lowercase: bool = False
    # the ids the output layer scores: "all" (the paper) or "target", the pieces that occur on the target
    # side of the training data (of a joint vocabulary, the other language's pieces go)
    output_vocab: str = "all"
    # tokenizer="bpe": BPE-dropout probability (Provilkov et al. 2020): the training pairs are
    # re-segmented at random every epoch; 0 = off (the paper)
    subword_dropout: float = 0.0
    subword_dropout_sides: str = "both"  # the sides subword_dropout samples ("source", "target")
    # R-Drop's α (Liang et al. 2021): each batch runs twice through different dropout masks and the loss
    # adds α · ½ (KL(P_a‖P_b) + KL(P_b‖P_a)); two passes per update; 0 = off (the paper; Liang et al.
    # use 5 on IWSLT)
    r_drop: float = 0.0
    reverse_target: bool = False  # learn the target right to left (for translate --rerank-with)
    r2l_weight: float = 1.0  # model.bidirectional: λ of L = L_l2r + λ·L_r2l
    r2l_detach: bool = False  # model.bidirectional: no gradient from L_l2r into the r2l decoder
    # model.bidirectional: the r2l states the l2r decoder reads in training: "greedy" (the r2l decoder's
    # own greedy translation, as decoding gives it) or "reference" (teacher-forced on the reversed
    # reference: the l2r decoder can then copy the answer it will not have at decoding time)
    r2l_memory_from: str = "greedy"
    eval_bleu: bool = True  # greedy BLEU on the validation set at each evaluation
    eval_max_sentences: int = 0  # BLEU on the first N validation sentences; 0 = all

    ABOUT: ClassVar[dict[str, str]] = {
        "lowercase": "is for a translation model's subword vocabulary",
        "output_vocab": "picks a translation model's output ids",
        "subword_dropout": "re-segments translation pairs",
        "r_drop": "is R-Drop for translation models",
    }

    def validate(self, cfg: TrainConfig) -> None:
        for name, choices in (("r2l_memory_from", ("reference", "greedy")),
                              ("subword_dropout_sides", ("both", "source", "target")),
                              ("output_vocab", ("all", "target"))):  # fmt: skip
            if getattr(self, name) not in choices:
                fail(self, name, f"is not one of {choices}")
        super().validate(cfg)
        if self.eval_max_sentences < 0:
            fail(self, "eval_max_sentences", "must be ≥ 0")
        for name in ("r2l_weight", "r_drop"):
            if getattr(self, name) < 0:
                fail(self, name, "must be ≥ 0 (0 = off)")
        if not 0 <= self.subword_dropout < 1:
            fail(self, "subword_dropout", "must be in [0, 1)")
        if self.subword_dropout and cfg.tokenizer != "bpe":
            fail(self, "subword_dropout", f"is BPE-dropout: it needs tokenizer='bpe', not {cfg.tokenizer!r}")
        if self.subword_dropout_sides != "both" and not self.subword_dropout:
            fail(
                self,
                "subword_dropout_sides",
                "does nothing while subword_dropout=0: give subword_dropout > 0",
            )
        if self.lowercase and cfg.tokenizer == "char":
            fail(self, "lowercase", f"is for a translation model's subword vocabulary; tokenizer="
                 f"{cfg.tokenizer!r} does not take it (set false)")  # fmt: skip


def target_pieces(corpora) -> torch.Tensor:
    """The ids that occur on the target side of the training data (every BPE-dropout sample's
    included), with eos and the unknown piece, which every output layer must be able to give."""
    seen = np.unique(np.concatenate([np.unique(c.tgt.ids) for c in corpora]))
    ids = torch.from_numpy(seen.astype(np.int64))
    return torch.cat([ids, torch.tensor([SPECIAL_IDS["eos_id"], SPECIAL_IDS["unk_id"]])]).unique()


@register_task("translation")
class TranslationTask(Task):
    """Parallel corpus -> ``TranslationBatch`` (src, tgt_in, tgt_out) -> encoder–decoder."""

    model_config = TransformerConfig
    options = TranslationOptions
    token_batches = True

    @classmethod
    def check_config(cls, cfg: TrainConfig) -> None:
        o = cfg.options
        if o.src_lang == o.tgt_lang:
            raise ConfigError(
                f"tgt_lang={o.tgt_lang!r} equals src_lang: a translation task needs two languages"
            )
        if cfg.tokenizer == "char":
            raise ConfigError("tokenizer='char' is for task='lm'; use bpe or unigram for translation")
        if cfg.model.get("bidirectional") and o.r2l_detach and o.r2l_weight == 0:
            raise ConfigError("r2l_weight=0 with r2l_detach=true leaves the right-to-left decoder untrained; "
                              "give r2l_weight > 0 or r2l_detach=false")  # fmt: skip
        if "output_pieces" in cfg.model:
            raise ConfigError("model.output_pieces is set from the training data: remove it from [model] and "
                              "give output_vocab='target' instead")  # fmt: skip
        if o.r_drop and cfg.model.get("bidirectional"):
            raise ConfigError("r_drop > 0 with model.bidirectional=true: R-Drop is not implemented for the "
                              "right-to-left decoder; set r_drop=0 or bidirectional=false")  # fmt: skip
        if o.reverse_target and cfg.model.get("bidirectional"):
            raise ConfigError("reverse_target=true and model.bidirectional=true: a bidirectional model "
                              "already has its right-to-left decoder; choose one")  # fmt: skip
        super().check_config(cfg)

    @classmethod
    def vocab_placeholder(cls, size: int) -> dict[str, int]:
        return {"src_vocab_size": size, "tgt_vocab_size": size}

    def __init__(self, cfg: TrainConfig, run_dir: Path, dist: DistInfo):
        super().__init__(cfg, run_dir, dist)
        o = self.opts = cfg.options
        train = load_parallel(cfg.dataset, "train", o.src_lang, o.tgt_lang)
        valid = load_parallel(cfg.valid_dataset or cfg.dataset, "valid", o.src_lang, o.tgt_lang)
        tok_dir = run_dir / TOKENIZER_DIR

        def tokenizers():  # trained once (rank 0), then read back by every rank
            if not (tok_dir / "tgt").is_dir():
                options = dict(joint=o.joint_vocab, model_type=cfg.tokenizer, lowercase=o.lowercase)
                src_tok, tgt_tok = train_translation_tokenizers(train, cfg.vocab_size, **options)
                save_translation_tokenizers(tok_dir, src_tok, tgt_tok)
            return load_translation_tokenizers(tok_dir)

        self.src_tok, self.tgt_tok = main_first(dist, tokenizers)
        self.train, self.valid = main_first(dist, lambda: self._encode(train, valid))
        self.valid_refs = [tgt.lower() if self.tgt_tok.lowercase else tgt for _, tgt in valid]
        self.bidirectional = bool(cfg.model.get("bidirectional", False))
        self._r2l = {"train": [0.0, 0], "valid": [0.0, 0]}  # r2l NLL sum and count, per split
        corpora = [self.train]
        if o.subword_dropout:  # BPE-dropout: a new segmentation of the training pairs each epoch
            pairs = Resegmenter(list(train), self.src_tok, self.tgt_tok, o.subword_dropout,
                                CorpusFilter(max_len=min(cfg.max_len, cfg.max_tokens - 1)),  # fits a batch
                                o.subword_dropout_sides)  # fmt: skip
            corpora = main_first(dist, lambda: segmentations(pairs, run_dir / SUBWORD_DIR, cfg.seed))
        self.sampler = CorpusEpochs(corpora, cfg.max_tokens, seed=cfg.seed, rank=dist.rank,
                                    world_size=dist.world_size)  # fmt: skip
        self.target_pieces = target_pieces(corpora) if o.output_vocab == "target" else None

    def _encode(self, train, valid):
        keep_all = CorpusFilter(drop_empty=False, max_len=None, max_ratio=None)
        return (
            encode_parallel(train, self.src_tok, self.tgt_tok, CorpusFilter(max_len=self.cfg.max_len)),
            encode_parallel(valid, self.src_tok, self.tgt_tok, keep_all),
        )

    def build_model(self) -> Transformer:
        shared = self.src_tok is self.tgt_tok
        fields = {"share_embeddings": shared, **self.cfg.model}
        fields.update(src_vocab_size=self.src_tok.vocab_size, tgt_vocab_size=self.tgt_tok.vocab_size)
        if self.target_pieces is not None:
            fields["output_pieces"] = len(self.target_pieces)
        model = build_transformer(TransformerConfig.from_dict({**fields, **SPECIAL_IDS}))
        if self.target_pieces is not None:
            model.head.set_pieces(self.target_pieces)
        return model

    @property
    def epoch(self) -> int:
        return self.sampler.state_dict()["epoch"]

    def _collate(self, pairs) -> TranslationBatch:
        batch = collate_translation(pairs)
        if self.opts.reverse_target:  # a right-to-left model: bos + reversed target -> reversed target + eos
            return TranslationBatch(batch.src, *reverse_targets(batch.tgt_out))
        return batch

    def train_batches(self) -> Iterator[TranslationBatch]:
        while True:
            for pairs in self.sampler:
                yield self._collate(pairs)

    def rebatch(self, max_tokens: int) -> None:
        old = self.sampler
        self.sampler = CorpusEpochs(old.corpora, max_tokens, seed=old.seed, rank=old.rank,
                                    world_size=old.world_size)  # fmt: skip
        self.sampler.load_state_dict({"epoch": old.state_dict()["epoch"], "position": 0})

    def valid_batches(self) -> Iterator[TranslationBatch]:
        sampler = TokenBatchSampler(self.valid.src.lengths, self.valid.tgt.lengths, self.cfg.max_tokens,
                                    shuffle=False)  # fmt: skip
        for idx in sampler.batches(0):
            yield self._collate([self.valid[i] for i in idx])

    def loss(self, model: Transformer, batch: TranslationBatch, smoothing: float) -> criteria.LossSums:
        """The label-smoothed loss (``aiayn.training.criteria``), with R-Drop's consistency term in
        training when ``r_drop`` > 0 (in evaluation both passes would be equal); a bidirectional model
        adds r2l_weight · the right-to-left decoder's loss on the reversed target, whose NLL is logged
        as ``r2l_nll``."""
        o = self.opts
        if not self.bidirectional:
            if o.r_drop and model.training:
                return criteria.r_drop_loss(model, batch, smoothing, o.r_drop)
            return criteria.label_smoothed_loss(model, batch, smoothing)
        memory_tgt = criteria.greedy_memory_input(model, batch.src) if o.r2l_memory_from == "greedy" else None
        total, r2l = criteria.bidirectional_loss(model, batch, smoothing, o.r2l_weight, memory_tgt,
                                                 o.r2l_detach)  # fmt: skip
        sums = self._r2l["train" if model.training else "valid"]
        sums[0] += float(r2l.nll.detach())
        sums[1] += int(r2l.n)
        return total

    def pop_metrics(self, split: str) -> dict[str, float]:
        if not self.bidirectional:
            return {}
        nll, n = self._r2l[split]
        self._r2l[split] = [0.0, 0]
        return {"r2l_nll": nll / n} if n else {}

    def n_targets(self, batch: TranslationBatch) -> int:
        return int((batch.tgt_out != SPECIAL_IDS["pad_id"]).sum())

    def extra_metrics(self, model: nn.Module, device: torch.device) -> dict[str, float]:
        """Greedy translations of the validation sources, scored with sacreBLEU."""
        if not self.opts.eval_bleu:
            return {}
        import sacrebleu

        from aiayn.decoding.options import SearchConfig
        from aiayn.decoding.translator import Translator

        n = self.opts.eval_max_sentences or len(self.valid)
        translator = Translator(model, self.src_tok, self.tgt_tok, reverse=self.opts.reverse_target)
        sources = [self.valid[i][0].tolist() for i in range(n)]
        hyps = translator.search(sources, SearchConfig(beam=1), self.cfg.max_tokens)
        texts = [translator.detokenize(h[0]) if h else "" for h in hyps]
        return {"bleu": round(sacrebleu.corpus_bleu(texts, [self.valid_refs[:n]]).score, 2)}

    def score(self, metrics: dict[str, float]) -> float:
        return metrics["bleu"] if "bleu" in metrics else -metrics["loss"]

    def model_meta(self) -> dict[str, Any]:
        meta = {**super().model_meta(), "src_lang": self.opts.src_lang, "tgt_lang": self.opts.tgt_lang}
        return {**meta, "reverse_target": True} if self.opts.reverse_target else meta

    def save_tokenizers(self, directory: Path) -> None:
        save_translation_tokenizers(directory, self.src_tok, self.tgt_tok)
