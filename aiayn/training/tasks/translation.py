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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

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
    load_parallel,
    load_translation_tokenizers,
    reverse_targets,
    save_translation_tokenizers,
    train_translation_tokenizers,
)
from aiayn.data.subword import SAMPLES_DIR, Resegmenter, pairs_report, segmentations
from aiayn.data.tokenizer import SPECIAL_IDS
from aiayn.data.views import Concat, PairView, PseudoPairs, halves
from aiayn.errors import ConfigError, DataError
from aiayn.models import BidirectionalTransformer, R2LMemory, Transformer, build_transformer
from aiayn.models.config import TransformerConfig
from aiayn.training import criteria
from aiayn.training.config import TaskOptions, TrainConfig, fail
from aiayn.training.distributed import DistInfo, main_first
from aiayn.training.pseudo import init_from_r2l, pseudo_targets, r2l_tokenizers
from aiayn.training.task import TOKENIZER_DIR, Task, register_task


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
    # model.bidirectional: the r2l states the l2r decoder reads in training: "cache" (a separate
    # right-to-left model's translations of the training sources, made once before training: r2l_model;
    # Su et al. 2019), "greedy" (the r2l decoder's own greedy translation, decoded inside every step, as
    # decoding gives it; Zhang et al. 2018: it lost to the plain model at equal time and at equal updates,
    # a documented negative result) or "reference" (the reversed reference, which the l2r decoder learns
    # to copy and will not have at decoding time: a documented negative result; docs/results.md)
    r2l_memory_from: str = "greedy"
    # a right-to-left model (a reverse_target=true run or model directory) that translates the training
    # and validation sources once for r2l_memory_from="cache" or r2l_distill; its vocabulary is this run's
    r2l_model: str = ""
    # the other half's right-to-left model: the cache is then jackknifed (r2l_model trained with
    # train_half=1, this with train_half=2, each translating only the half it did not train on)
    r2l_jackknife: str = ""
    r2l_cache_beam: int = 1  # the search that makes the cache (1 = greedy); decoding's r2l_beam follows it
    # what the r2l decoder is teacher-forced on and learns with the cache: "pseudo" (the cached translation:
    # one r2l pass gives its loss and the memory) or "reference" (the reversed reference: a second pass)
    r2l_target: str = "pseudo"
    r2l_memory_dropout: float = 0.0  # model.bidirectional: share of sentences whose memory is bos only
    r2l_init: bool = False  # start the encoder, embeddings and r2l decoder from r2l_model's weights
    # with r2l_init: the r2l decoder stays as r2l_model trained it (no r2l loss, no gradient: a cheaper step)
    r2l_freeze: bool = False
    # a plain model trained on the references plus r2l_model's translations turned left to right (the
    # distillation control of the bidirectional benchmark: the same extra data, no new sublayer)
    r2l_distill: bool = False
    train_half: int = 0  # 1 or 2: train on that half of the pairs only (a jackknife's models); 0 = all
    eval_bleu: bool = True  # greedy BLEU on the validation set at each evaluation
    eval_max_sentences: int = 0  # BLEU on the first N validation sentences; 0 = all

    ABOUT: ClassVar[dict[str, str]] = {
        "lowercase": "is for a translation model's subword vocabulary",
        "output_vocab": "picks a translation model's output ids",
        "subword_dropout": "re-segments training texts at random (task='translation' or 'classify')",
        "r_drop": "is R-Drop for translation models and classifiers",
    }

    def validate(self, cfg: TrainConfig) -> None:
        for name, choices in (("r2l_memory_from", ("reference", "greedy", "cache")),
                              ("r2l_target", ("pseudo", "reference")), ("train_half", (0, 1, 2)),
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
            fail(self, "subword_dropout_sides", "does nothing while subword_dropout=0: set it above 0")
        self._validate_r2l(cfg)
        if self.lowercase and cfg.tokenizer == "char":
            fail(self, "lowercase", f"is for a translation model's subword vocabulary; tokenizer="
                 f"{cfg.tokenizer!r} does not take it (set false)")  # fmt: skip

    def _validate_r2l(self, cfg: TrainConfig) -> None:
        bidirectional = bool(cfg.model.get("bidirectional"))
        cache = self.r2l_memory_from == "cache"
        if self.r2l_cache_beam < 1:
            fail(self, "r2l_cache_beam", "must be ≥ 1 (1 = greedy)")
        if not 0 <= self.r2l_memory_dropout < 1:
            fail(self, "r2l_memory_dropout", "must be in [0, 1)")
        if cache and not bidirectional:
            fail(self, "r2l_memory_from", "is for model.bidirectional=true (or give r2l_distill=true)")
        if cache and not self.r2l_model:
            fail(self, "r2l_memory_from", "needs r2l_model: a right-to-left model (reverse_target=true run)")
        if self.r2l_distill and (bidirectional or not self.r2l_model):
            fail(self, "r2l_distill", "trains a plain model (model.bidirectional=false) on r2l_model's "
                 "translations: give both")  # fmt: skip
        if self.r2l_model and not (cache or self.r2l_distill):
            fail(self, "r2l_model", "is read by r2l_memory_from='cache' or r2l_distill=true: give one")
        if self.r2l_jackknife and not self.r2l_model:
            fail(self, "r2l_jackknife", "is the second half's model: give r2l_model (the first half's) too")
        needs = {"r2l_target": self.r2l_target != "pseudo", "r2l_init": self.r2l_init}
        for name in (n for n, on in needs.items() if on and not cache):
            fail(self, name, "is for r2l_memory_from='cache'")
        if self.r2l_memory_dropout and not bidirectional:
            fail(self, "r2l_memory_dropout", "is for model.bidirectional=true")
        if self.r2l_freeze and not self.r2l_init:
            fail(self, "r2l_freeze", "keeps r2l_model's decoder: it needs r2l_init=true")
        if self.train_half and self.subword_dropout:
            fail(self, "train_half", "selects pairs of one segmentation: set subword_dropout=0 with it")
        if (cache or self.r2l_distill) and self.subword_dropout:
            fail(self, "subword_dropout", "re-segments the pairs the cache was made for: 0 with r2l_model")


def check_fits(pairs: EncodedParallel, corpus: ParallelCorpus, max_tokens: int) -> None:
    """Validation keeps every pair, so each must fit a batch of ``max_tokens`` (with its eos or
    bos): checked before training, not at the first evaluation, with the line to look at."""
    sizes = np.maximum(pairs.src.lengths, pairs.tgt.lengths) + 1
    over = np.flatnonzero(sizes > max_tokens)
    if len(over):
        raise DataError(
            f"{corpus.src.path} and {corpus.tgt.path}: validation line {over[0] + 1} needs {sizes[over[0]]} "
            f"ids on one side, over max_tokens={max_tokens} ({len(over)} such lines); raise max_tokens "
            "or shorten those lines (validation keeps every pair)"
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
                if o.r2l_model:  # the right-to-left model's vocabulary: its translations are in its ids
                    src_tok, tgt_tok = r2l_tokenizers(o.r2l_model, o.lowercase)
                else:
                    options = dict(joint=o.joint_vocab, model_type=cfg.tokenizer, lowercase=o.lowercase)
                    src_tok, tgt_tok = train_translation_tokenizers(train, cfg.vocab_size, **options)
                save_translation_tokenizers(tok_dir, src_tok, tgt_tok)
            return load_translation_tokenizers(tok_dir)

        self.src_tok, self.tgt_tok = main_first(dist, tokenizers)
        self.train, self.valid = main_first(dist, lambda: self._encode(train, valid))
        check_fits(self.valid, valid, cfg.max_tokens)
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
        import sacrebleu

        from aiayn.decoding.options import SearchConfig
        from aiayn.decoding.translator import Translator

        n = min(self.opts.eval_max_sentences or len(self.valid), len(self.valid))
        translator = Translator(model, self.src_tok, self.tgt_tok, reverse=self.opts.reverse_target)
        sources = [self.valid[i][0].tolist() for i in range(n)]
        hyps = translator.search(sources, SearchConfig(beam=1), self.cfg.max_tokens)
        texts = [translator.detokenize(h[0]) if h else "" for h in hyps]
        return {"bleu": round(sacrebleu.corpus_bleu(texts, [self.valid_refs[:n]]).score, 2)}

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
