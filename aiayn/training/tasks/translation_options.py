"""The translation task's own fields (flat in a recipe) and the checks that name a wrong one.

Most fields are the bidirectional model's (``r2l_*``: how its right-to-left memory is made and
trained; docs/training.md) and the translation-only regularisers (BPE-dropout, R-Drop).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from aiayn.training.config import TaskOptions, TrainConfig, fail


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

    def inert(self, cfg: TrainConfig) -> dict[str, str]:
        inert = {}
        if not cfg.model.get("bidirectional"):
            for name in ("r2l_weight", "r2l_detach", "r2l_memory_from"):
                inert[name] = "it is for model.bidirectional=true"
        elif self.r2l_freeze:
            for name in ("r2l_weight", "r2l_detach"):
                inert[name] = "r2l_freeze=true keeps r2l_model's decoder: no r2l loss, no gradient"
        if not self.r2l_model:
            inert["r2l_cache_beam"] = "it is the search that translates with r2l_model, which is not given"
        if not self.eval_bleu:
            inert["eval_max_sentences"] = "eval_bleu=false turns off the validation BLEU it limits"
        if self.r2l_model:  # its translations are in its ids: the run takes its vocabulary
            for name in ("tokenizer", "vocab_size", "joint_vocab"):
                inert[name] = f"r2l_model={self.r2l_model!r} brings its own tokenizer"
        return inert

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
