"""What differs between training a translation model and a language model: the data, the
tokenizers, the model config, and how a batch becomes a loss. The loop in ``trainer`` is shared.

A task's tokenizers are trained once per run (on the training split) and saved into the run
directory; a resumed run or another rank loads them from there, so every process and every
checkpoint agrees on the vocabulary.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from aiayn.config import LMConfig, TransformerConfig
from aiayn.data import (
    CharTokenizer,
    CorpusFilter,
    SentencePieceTokenizer,
    TokenBatchSampler,
    WindowSampler,
    collate_translation,
    encode_parallel,
    encode_text,
    lm_batch,
    load_parallel,
    load_text,
    load_tokenizer,
    load_translation_tokenizers,
    save_translation_tokenizers,
    sequential_windows,
    train_translation_tokenizers,
)
from aiayn.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from aiayn.models import LanguageModel, Transformer
from aiayn.training.config import TrainConfig
from aiayn.training.distributed import DistInfo, main_first
from aiayn.training.loss import linear_label_smoothed_nll_loss

TOKENIZER_DIR = "tokenizer"
SPECIAL_IDS = dict(pad_id=PAD_ID, bos_id=BOS_ID, eos_id=EOS_ID, unk_id=UNK_ID)


def translation_loss(model: nn.Module, batch: tuple[Tensor, ...], smoothing: float):
    """Summed label-smoothed loss, summed NLL, target tokens; the output projection and the
    softmax are computed at real target positions only, never at padding.

    Shape:
        batch: src (B, S), tgt_in (B, T), tgt_out (B, T) -> three scalars
    """
    src, tgt_in, tgt_out = batch
    real = tgt_out != PAD_ID  # (B, T)
    h = model(src, tgt_in, logits_mask=real, features_only=True)  # (N, d_model), N = real targets
    return head_loss(model, h, tgt_out[real], smoothing, smoothing_exclude=PAD_ID)


def head_loss(model: nn.Module, h: Tensor, target: Tensor, smoothing: float, **kw):
    """The model's output projection and the label-smoothed loss, fused (``linear_label_…``)."""
    while hasattr(model, "module") or hasattr(model, "_orig_mod"):  # DDP / torch.compile wrappers
        model = getattr(model, "module", None) or model._orig_mod
    head = model.head
    return linear_label_smoothed_nll_loss(h, head.proj.weight, target, smoothing, head.bias, head.scale, **kw)


class TranslationTask:
    """Parallel corpus -> token-budget batches of (src, tgt_in, tgt_out) -> encoder–decoder."""

    def __init__(self, cfg: TrainConfig, run_dir: Path, dist: DistInfo):
        self.cfg, self.dist = cfg, dist
        train = load_parallel(cfg.dataset, "train", cfg.src_lang, cfg.tgt_lang)
        valid = load_parallel(cfg.valid_dataset or cfg.dataset, "valid", cfg.src_lang, cfg.tgt_lang)
        tok_dir = run_dir / TOKENIZER_DIR

        def tokenizers():  # trained once (rank 0), then read back by every rank
            if not (tok_dir / "tgt").is_dir():
                if cfg.tokenizer == "char":
                    raise ValueError("tokenizer='char' is for task='lm'; use bpe or unigram for translation")
                src_tok, tgt_tok = train_translation_tokenizers(
                    train, cfg.vocab_size, joint=cfg.joint_vocab, model_type=cfg.tokenizer
                )
                save_translation_tokenizers(tok_dir, src_tok, tgt_tok)
            return load_translation_tokenizers(tok_dir)

        self.src_tok, self.tgt_tok = main_first(dist, tokenizers)
        self.train, self.valid = main_first(dist, lambda: self._encode(train, valid))
        self.valid_refs = [tgt for _, tgt in valid]
        self.sampler = TokenBatchSampler(
            self.train.src.lengths, self.train.tgt.lengths, cfg.max_tokens,
            seed=cfg.seed, rank=dist.rank, world_size=dist.world_size,
        )  # fmt: skip

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
        return Transformer(TransformerConfig.from_dict({**fields, **SPECIAL_IDS}))

    def save_tokenizers(self, directory: Path) -> None:
        save_translation_tokenizers(directory, self.src_tok, self.tgt_tok)

    @property
    def epoch(self) -> int:
        return self.sampler.state_dict()["epoch"]

    def train_batches(self) -> Iterator[tuple[Tensor, ...]]:
        while True:
            for idx in self.sampler:
                yield tuple(collate_translation([self.train[i] for i in idx]))

    def loss(self, model: nn.Module, batch: tuple[Tensor, ...], smoothing: float):
        return translation_loss(model, batch, smoothing)

    @staticmethod
    def n_targets(batch: tuple[Tensor, ...]) -> int:
        return int((batch[2] != PAD_ID).sum())

    def valid_batches(self) -> Iterator[tuple[Tensor, ...]]:
        sampler = TokenBatchSampler(self.valid.src.lengths, self.valid.tgt.lengths, self.cfg.max_tokens,
                                    shuffle=False)  # fmt: skip
        for idx in sampler.batches(0):
            yield tuple(collate_translation([self.valid[i] for i in idx]))

    def bleu(self, model: Transformer, device: torch.device) -> dict[str, float]:
        """Greedy translations of the validation sources, scored with sacreBLEU."""
        import sacrebleu

        from aiayn.decoding.search import SearchConfig
        from aiayn.decoding.translator import Translator

        n = self.cfg.eval_max_sentences or len(self.valid)
        translator = Translator(model, self.src_tok, self.tgt_tok)
        sources = [self.valid[i][0].tolist() for i in range(n)]
        hyps = translator.search(sources, SearchConfig(beam=1), self.cfg.max_tokens)
        texts = [translator.detokenize(h[0]) if h else "" for h in hyps]
        return {"bleu": round(sacrebleu.corpus_bleu(texts, [self.valid_refs[:n]]).score, 2)}


class LMTask:
    """Text -> random windows (nanoGPT's get_batch) -> decoder-only language model."""

    def __init__(self, cfg: TrainConfig, run_dir: Path, dist: DistInfo):
        self.cfg, self.dist = cfg, dist
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
        self.sampler = WindowSampler(len(self.train), cfg.block_size, cfg.batch_size, seed=cfg.seed,
                                     rank=dist.rank, world_size=dist.world_size)  # fmt: skip

    def build_model(self) -> LanguageModel:
        fields = {"max_len": max(self.cfg.block_size, 1024), **self.cfg.model}
        return LanguageModel(LMConfig.from_dict({**fields, "vocab_size": self.tok.vocab_size, **SPECIAL_IDS}))

    def save_tokenizers(self, directory: Path) -> None:
        self.tok.save(directory)  # beside config.json, where aiayn generate looks for it

    epoch = 0

    def train_batches(self) -> Iterator[tuple[Tensor, ...]]:
        for starts in self.sampler:
            yield lm_batch(self.train, starts, self.cfg.block_size)

    def loss(self, model: nn.Module, batch: tuple[Tensor, ...], smoothing: float):
        x, y = batch
        return head_loss(model, model(x, features_only=True).flatten(0, 1), y.flatten(), smoothing)

    @staticmethod
    def n_targets(batch: tuple[Tensor, ...]) -> int:
        return batch[1].numel()

    def valid_batches(self) -> Iterator[tuple[Tensor, ...]]:
        cfg = self.cfg
        for i, starts in enumerate(sequential_windows(len(self.valid), cfg.block_size, cfg.batch_size)):
            if cfg.eval_iters and i >= cfg.eval_iters:
                return
            yield lm_batch(self.valid, starts, cfg.block_size)

    def bleu(self, model, device) -> dict[str, float]:
        return {}


def make_task(cfg: TrainConfig, run_dir: Path, dist: DistInfo) -> TranslationTask | LMTask:
    return (TranslationTask if cfg.task == "translation" else LMTask)(cfg, run_dir, dist)
