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

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from aiayn.data import (
    CorpusEpochs,
    CorpusFilter,
    EncodedParallel,
    ParallelCorpus,
    TokenBatchSampler,
    TranslationBatch,
    collate_translation,
    encode_parallel,
    has_splits,
    load_parallel,
    load_translation_tokenizers,
    reverse_targets,
    save_translation_tokenizers,
    train_translation_tokenizers,
)
from aiayn.data.subword import SAMPLES_DIR, Resegmenter, pairs_report, segmentations
from aiayn.data.tokenizer import SPECIAL_IDS
from aiayn.data.views import Concat, PairView, PseudoPairs, halves
from aiayn.decoding.bleu import bleu
from aiayn.errors import ConfigError, DataError
from aiayn.models import BidirectionalTransformer, R2LMemory, Transformer, build_transformer
from aiayn.models.config import TransformerConfig
from aiayn.training import criteria
from aiayn.training.config import TrainConfig
from aiayn.training.distributed import DistInfo, main_first
from aiayn.training.pseudo import init_from_r2l, pseudo_targets, r2l_tokenizers
from aiayn.training.task import TOKENIZER_DIR, Task, check_learned_positions, learned_rows, register_task
from aiayn.training.tasks.translation_options import TranslationOptions


def check_fits(
    pairs: EncodedParallel, corpus: ParallelCorpus, max_tokens: int, positions: int | None = None
) -> None:
    """Validation keeps every pair, so each must fit a batch of ``max_tokens`` (with its eos or
    bos), and ``positions``, the rows of learned positions (None: sinusoidal, no limit): checked
    before training, not at the first evaluation, with the line to look at."""
    sizes = np.maximum(pairs.src.lengths, pairs.tgt.lengths) + 1
    for name, limit in (("max_tokens", max_tokens), ("model.max_len", positions)):
        over = np.flatnonzero(sizes > limit) if limit is not None else []
        if len(over):
            raise DataError(
                f"{corpus.src.path} and {corpus.tgt.path}: validation line {over[0] + 1} needs "
                f"{sizes[over[0]]} ids on one side, over {name}={limit} ({len(over)} such lines); raise "
                f"{name} or shorten those lines (validation keeps every pair)"
            )


def target_pieces(targets: list[np.ndarray]) -> torch.Tensor:
    """The ids that occur in the training targets (every BPE-dropout sample's included), with eos and
    the unknown piece, which every output layer must be able to give."""
    seen = np.unique(np.concatenate([np.unique(ids) for ids in targets]))
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
        if cfg.max_tokens < 16:  # a batch holds a side and its eos: max_len ≤ max_tokens - 1
            raise ConfigError(f"max_tokens={cfg.max_tokens} leaves no room for a sentence; give at least 16")
        kept = min(cfg.max_len, cfg.max_tokens - 1)  # the longest side a batch holds; +1 for its bos or eos
        check_learned_positions(cfg, kept + 1, f"max_len={kept}")
        if cfg.model.get("bidirectional") and o.r2l_detach and o.r2l_weight == 0:
            raise ConfigError("r2l_weight=0 with r2l_detach=true leaves the right-to-left decoder untrained; "
                              "give r2l_weight > 0 or r2l_detach=false")  # fmt: skip
        if "output_pieces" in cfg.model:
            raise ConfigError("model.output_pieces is set from the training data: remove it from [model] and "
                              "give output_vocab='target' instead")  # fmt: skip
        if o.r_drop and cfg.model.get("bidirectional"):
            raise ConfigError("r_drop > 0 with model.bidirectional=true: R-Drop is not implemented for the "
                              "right-to-left decoder; set r_drop=0 or bidirectional=false")  # fmt: skip
        if not o.joint_vocab and cfg.model.get("share_embeddings"):  # equal sizes, other pieces
            raise ConfigError("model.share_embeddings=true with joint_vocab=false would give a source piece "
                              "and a target piece of the same id one embedding; set joint_vocab=true or "
                              "model.share_embeddings=false")  # fmt: skip
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
        if not cfg.valid_dataset and not has_splits(cfg.dataset):  # its "valid" is these pairs again
            raise ConfigError(f"dataset={cfg.dataset!r} is one corpus ({train.src.path.name}, "
                              f"{train.tgt.path.name}) without a validation split: give "
                              "valid_dataset=PREFIX of other files, or a folder holding train.* and valid.* "
                              "(or dev.*)")  # fmt: skip
        valid = load_parallel(cfg.valid_dataset or cfg.dataset, "valid", o.src_lang, o.tgt_lang)
        if o.eval_bleu:  # a target language whose BLEU tokenizer is missing: said now, not at evaluation
            bleu(o.tgt_lang)
        tok_dir = run_dir / TOKENIZER_DIR

        def tokenizers():  # trained once (rank 0), then read back by every rank
            if not (tok_dir / "tgt").is_dir():
                if o.r2l_model:  # the right-to-left model's vocabulary: its translations are in its ids
                    src_tok, tgt_tok = r2l_tokenizers(o.r2l_model, o.lowercase)
                else:
                    options = dict(joint=o.joint_vocab, model_type=cfg.tokenizer, lowercase=o.lowercase)
                    src_tok, tgt_tok = train_translation_tokenizers(train, cfg.vocab_size, **options)
                save_translation_tokenizers(tok_dir, src_tok, tgt_tok)
            return load_translation_tokenizers(tok_dir)

        self.src_tok, self.tgt_tok = main_first(dist, tokenizers)
        self.train, self.valid = main_first(dist, lambda: self._encode(train, valid))
        check_fits(self.valid, valid, cfg.max_tokens, learned_rows(cfg, TransformerConfig.max_len))
        self.valid_refs = [tgt.lower() if self.tgt_tok.lowercase else tgt for _, tgt in valid]
        self.bidirectional = bool(cfg.model.get("bidirectional", False))
        self._r2l = {"train": [0.0, 0], "valid": [0.0, 0]}  # r2l NLL sum and count, per split
        corpora = [self._training_pairs(dist)]
        if o.subword_dropout:  # BPE-dropout: a new segmentation of the training pairs each epoch
            pairs = Resegmenter(list(train), self.src_tok, self.tgt_tok, o.subword_dropout,
                                self._training_filter(), o.subword_dropout_sides)  # fmt: skip
            corpora = main_first(dist, lambda: segmentations(pairs, run_dir / SAMPLES_DIR, cfg.seed))
            if dist.is_main:  # what the samples did to the text, said once
                said = pairs_report(o.subword_dropout, self.train, corpora, o.subword_dropout_sides)
                print(f"aiayn train: {said}", file=sys.stderr)
        self.sampler = CorpusEpochs(corpora, cfg.max_tokens, seed=cfg.seed, rank=dist.rank,
                                    world_size=dist.world_size)  # fmt: skip
        self.target_pieces = None
        if o.output_vocab == "target":
            targets = (
                [c.tgt.ids for c in corpora]
                if not (o.r2l_model or o.train_half)
                else [self.train.tgt.ids, *([self.pseudo.ids] if o.r2l_model else [])]
            )  # a view's: its corpus's
            self.target_pieces = target_pieces(targets)

    def _training_pairs(self, dist: DistInfo):
        """The pairs training batches: all or one half (``train_half``), each with its cached
        right-to-left translation (``r2l_memory_from="cache"``), or the references plus the
        translations (``r2l_distill``). The validation pairs get their translations alike."""
        o = self.opts
        index = None if not o.train_half else np.flatnonzero(halves(self.train) == o.train_half)
        if not o.r2l_model:
            return self.train if index is None else PairView(self.train, index)
        models = [o.r2l_model, *([o.r2l_jackknife] if o.r2l_jackknife else [])]
        beam, max_tokens = o.r2l_cache_beam, self.cfg.max_tokens
        pseudo = self.pseudo = main_first(dist, lambda: pseudo_targets(self.train, models, beam, max_tokens))
        if o.r2l_distill:
            return Concat(PairView(self.train, index), PseudoPairs(self.train, pseudo))
        # validation: the first model's translations (a jackknife's halves are training pairs only)
        valid_pseudo = main_first(dist, lambda: pseudo_targets(self.valid, models[:1], beam, max_tokens))
        self.valid = PairView(self.valid, None, valid_pseudo)
        return PairView(self.train, index, pseudo)

    def _training_filter(self) -> CorpusFilter:
        """Training drops pairs over ``max_len`` and those no batch holds (a side + eos over
        ``max_tokens``)."""
        return CorpusFilter(max_len=min(self.cfg.max_len, self.cfg.max_tokens - 1))

    def _encode(self, train, valid):
        encoded = encode_parallel(train, self.src_tok, self.tgt_tok, self._training_filter())
        if self.dist.is_main and encoded.stats.kept < encoded.stats.total:  # said, not only in the cache
            print(f"aiayn train: {train.name}: {encoded.stats}", file=sys.stderr)
        keep_all = CorpusFilter(drop_empty=False, max_len=None, max_ratio=None)
        return encoded, encode_parallel(valid, self.src_tok, self.tgt_tok, keep_all)

    def build_model(self) -> Transformer:
        shared = self.src_tok is self.tgt_tok
        fields = {"share_embeddings": shared, **self.cfg.model}
        fields.update(src_vocab_size=self.src_tok.vocab_size, tgt_vocab_size=self.tgt_tok.vocab_size)
        if self.target_pieces is not None:
            fields["output_pieces"] = len(self.target_pieces)
        model = build_transformer(TransformerConfig.from_dict({**fields, **SPECIAL_IDS}))
        if self.target_pieces is not None:
            model.head.set_pieces(self.target_pieces)
        if self.opts.r2l_init:
            init_from_r2l(model, self.opts.r2l_model, self.opts.r2l_freeze)
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
        total, r2l = criteria.bidirectional_loss(model, batch, smoothing, o.r2l_weight,
                                                 self._memory(model, batch), self._r2l_target)  # fmt: skip
        sums = self._r2l["train" if model.training else "valid"]
        sums[0], sums[1] = sums[0] + float(r2l.nll.detach()), sums[1] + int(r2l.n)
        return total

    @property
    def _r2l_target(self) -> str:
        return self.opts.r2l_target if self.opts.r2l_memory_from == "cache" else "reference"

    def _memory(self, model: BidirectionalTransformer, batch: TranslationBatch) -> R2LMemory:
        """The right-to-left memory a training (or validation) batch reads: ``r2l_memory_from``'s
        sequence (None: the r2l pass's own), under memory dropout in training."""
        o = self.opts
        tgt = None
        if o.r2l_memory_from == "greedy":
            tgt = criteria.greedy_memory_input(model, batch.src)
        elif o.r2l_memory_from == "cache" and o.r2l_target == "reference":
            tgt = criteria.cached_memory_input(batch, model.config)
        keep = None
        if o.r2l_memory_dropout and model.training:
            keep = torch.rand(batch.src.size(0), device=batch.src.device) >= o.r2l_memory_dropout  # (B,)
        return R2LMemory(tgt, keep, o.r2l_detach or o.r2l_freeze, o.r2l_freeze)

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
        from aiayn.decoding.options import SearchConfig
        from aiayn.decoding.translator import Translator

        n = min(self.opts.eval_max_sentences or len(self.valid), len(self.valid))
        translator = Translator(model, self.src_tok, self.tgt_tok, reverse=self.opts.reverse_target)
        sources = [self.valid[i][0].tolist() for i in range(n)]
        hyps = translator.search(sources, SearchConfig(beam=1), self.cfg.max_tokens)
        texts = [translator.detokenize(h[0]) if h else "" for h in hyps]
        return {"bleu": round(bleu(self.opts.tgt_lang).corpus_score(texts, [self.valid_refs[:n]]).score, 2)}

    def score(self, metrics: dict[str, float]) -> float:
        return metrics["bleu"] if "bleu" in metrics else -metrics["loss"]

    def model_meta(self) -> dict[str, Any]:
        o = self.opts
        meta = {**super().model_meta(), "src_lang": o.src_lang, "tgt_lang": o.tgt_lang}
        if o.train_half:
            meta["train_half"] = o.train_half  # a jackknife's model: the half it never translates
        if o.r2l_memory_from == "cache" and self.bidirectional:
            meta["r2l_beam"] = o.r2l_cache_beam  # decoding builds the memory with the cache's search
        return {**meta, "reverse_target": True} if o.reverse_target else meta

    def save_tokenizers(self, directory: Path) -> None:
        save_translation_tokenizers(directory, self.src_tok, self.tgt_tok)
