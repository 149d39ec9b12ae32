"""Sequence classification with the encoder-only model: fine-tuning (or training from scratch).

Labelled TSV/CSV/JSONL files (``data/labelled.py``) -> label strings mapped to class ids (saved as
``labels`` in each checkpoint's ``config.json``) -> token-budget batches of ``ClassifyBatch`` ->
cross-entropy of the pooled classifier, optionally class-weighted ("balanced": n / (k · count)).
With ``init_from`` the run starts from a pre-trained encoder (an ``mlm``, ``rtd`` or ``clm`` run, any
encoder model directory, or a Hugging Face BERT directory): its tokenizer, embeddings, encoder and vocabulary
head are loaded as they are, the classifier (pooler included) is new; the tokenizer's special ids
(BERT's [PAD], [CLS], [SEP]) are the batches' and the model's; a ``[model]`` field that would change
the pre-trained shapes is an error. Three fine-tuning options, off by default: ``keep_classifier``
keeps a classifier's head (an aiayn run or a HF BERT classifier) when its labels are these
(intermediate-task training, Phang et al. 2018); ``reinit_layers`` starts the top encoder layers afresh
(Zhang et al. 2021); ``layer_decay`` scales the learning rate of layer l = 1…L (``encoder.layers.{l-1}``)
by decay^(L + 1 − l), the embeddings' by decay^(L + 1), the heads' by 1 (BEiT's exponents; ELECTRA
counts the heads one layer higher). Four regularisers, also off by default and open to a run from
scratch: ``word_dropout`` leaves training pieces out (Iyyer et al. 2015), ``r_drop`` adds R-Drop's
consistency term, ``mixup`` mixes pooled vectors and their labels and ``adversarial`` adds the loss
at the worst nearby embedded input (``criteria``).
A text longer than ``max_len`` is read as ``long_text`` says (``data/long_text.py``): its head (the
default, BERT's truncation), its tail, head and tail, or overlapping windows of ``max_len`` every
``window_stride`` pieces, each window a training example with its text's label and, at validation
and prediction, the text's logits the mean of its windows'. The policy and ``max_len`` are saved in
``config.json`` (``long_text``), so ``aiayn classify`` reads texts as training did.
Validation reports accuracy and macro-F1 (per text); accuracy picks the best checkpoint.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from aiayn.data.batching import ClassifyBatch
from aiayn.data.cache import Ragged
from aiayn.data.labelled import LabelMap
from aiayn.data.long_text import POLICIES, LongText, pool_windows
from aiayn.data.sentences import load_examples, split_for
from aiayn.data.subword import SAMPLES_DIR, report, sampled_texts, to_ragged
from aiayn.data.tokenizer import SentencePieceTokenizer
from aiayn.decoding.classifier import classification_metrics
from aiayn.errors import ConfigError, DataError, ModelDirError
from aiayn.interop.model_dir import check_kind, load_encoder_dir, load_encoder_tokenizer
from aiayn.models import EncoderModel
from aiayn.models.config import EncoderConfig
from aiayn.models.io import read_config, resolve_model_dir
from aiayn.training import criteria
from aiayn.training.checkpoint import latest_checkpoint, step_dirs
from aiayn.training.config import TrainConfig, fail
from aiayn.training.distributed import DistInfo, main_first
from aiayn.training.rundir import read_run_config
from aiayn.training.task import TOKENIZER_DIR, register_task
from aiayn.training.tasks.encoder import EncoderOptions, EncoderTask

# [model] fields a fine-tuning run may set on top of a pre-trained encoder: they shape no tensor
# that is loaded (the head is new), only regularise, or (causal) let a causal encoder see both ways
HEAD_FIELDS = {"pooling", "pooler", "dropout", "attn_dropout", "ff_dropout", "causal"}


@dataclass
class ClassifyOptions(EncoderOptions):
    label_column: str = ""  # "" = the column called "label"
    init_from: str = ""  # a pre-trained encoder (run or model directory) to start from
    class_weights: str = "none"  # "none" or "balanced" (n / (k · count) per class, over training rows)
    # a text over max_len - 2 pieces: "head" (BERT's truncation), "tail", "head+tail" (max_len // 4
    # first pieces + the rest from the end), "windows" (each classified, logits averaged)
    long_text: str = "head"
    window_stride: int = 0  # windows: pieces between window starts; 0 = half a window
    keep_classifier: bool = False  # init_from's classifier (and pooler), when its labels are these
    reinit_layers: int = 0  # the top encoder layers of init_from not loaded: initialised afresh
    layer_decay: float = 1.0  # layer-wise learning-rate decay (1 = one rate for all)
    word_dropout: float = 0.0  # each training piece left out with this probability (0 = off)
    r_drop: float = 0.0  # R-Drop's α: two dropout passes per batch, their symmetric KL × α (0 = off)
    mixup: float = 0.0  # α of mixup's Beta(α, α) over pooled sentence vectors (0 = off)
    adversarial: float = 0.0  # the L2 radius of each text's adversarial step on its embeddings (0 = off)
    subword_dropout: float = 0.0  # training texts re-segmented at random (BPE-dropout's p; 0 = off)

    ABOUT: ClassVar[dict[str, str]] = {
        "init_from": "starts a classifier from a pre-trained encoder (task='classify')",
        "keep_classifier": "keeps a pre-trained classifier's head (task='classify')",
        "reinit_layers": "re-initialises a pre-trained encoder's top layers (task='classify')",
        "layer_decay": "is fine-tuning's layer-wise learning-rate decay (task='classify')",
        "class_weights": "weights a classifier's loss by class (task='classify')",
        "long_text": "says how a classifier reads long texts (task='classify')",
        "word_dropout": "leaves pieces out of a classifier's training texts (task='classify')",
        "r_drop": "is R-Drop for translation models and classifiers",
        "mixup": "mixes a classifier's pooled training vectors (task='classify')",
        "adversarial": "trains a classifier on adversarially perturbed embeddings (task='classify')",
        "subword_dropout": "re-segments training texts at random (task='translation' or 'classify')",
    }

    def validate(self, cfg: TrainConfig) -> None:
        if self.class_weights not in ("none", "balanced"):
            fail(self, "class_weights", "is not one of ('none', 'balanced')")
        if self.long_text not in POLICIES:
            fail(self, "long_text", f"is not one of {POLICIES}")
        if self.lowercase and self.init_from:
            fail(self, "lowercase", f"trains a lowercasing vocabulary; init_from={self.init_from!r} brings "
                 "its own tokenizer (which lowercases if it was trained so): remove lowercase")  # fmt: skip
        if self.window_stride and self.long_text != "windows":
            fail(self, "window_stride", f"is for long_text='windows', not {self.long_text!r}; remove it")
        if self.reinit_layers < 0:
            fail(self, "reinit_layers", "must be ≥ 0")
        for name in ("keep_classifier", "reinit_layers"):
            if getattr(self, name) and not self.init_from:
                fail(self, name, "is for fine-tuning: set init_from to the pre-trained run, or remove it")
        if not 0 <= self.word_dropout < 1:
            fail(self, "word_dropout", "must be in [0, 1) (the share of training pieces left out; 0.1–0.3 "
                 "are usual)")  # fmt: skip
        if self.r_drop < 0:
            fail(self, "r_drop", "must be ≥ 0 (0 = off)")
        if self.mixup < 0:
            fail(self, "mixup", "must be ≥ 0 (Beta(α, α)'s α; 0 = off, 0.2–1 are usual)")
        for name in ("r_drop", "mixup"):
            if getattr(self, name) and self.class_weights != "none":
                fail(self, name, f"does not weigh classes: set class_weights='none' or {name}=0")
        if self.adversarial < 0:
            fail(self, "adversarial", "must be ≥ 0 (the perturbation's L2 norm per text; 0 = off)")
        losses = [name for name in ("r_drop", "mixup", "adversarial") if getattr(self, name)]
        if len(losses) > 1:
            fail(self, losses[-1], f"and {losses[0]} are two training losses: set one of them to 0")
        if not 0 <= self.subword_dropout < 1:
            fail(self, "subword_dropout", "must be in [0, 1) (BPE-dropout's p, a unigram model's α; 0.1 is "
                 "usual)")  # fmt: skip
        if self.subword_dropout and self.long_text == "windows":
            fail(self, "subword_dropout", "re-segments whole texts, and windows depend on the segmentation: "
                 "use long_text='head', 'tail' or 'head+tail', or subword_dropout=0")  # fmt: skip
        if not 0 < self.layer_decay <= 1:
            fail(self, "layer_decay", "must be in (0, 1] (1 = one learning rate for all; 0.75–0.9 are usual)")
        super().validate(cfg)
        if cfg.max_len >= 3:  # below, the encoder's own check names max_len (no window at all)
            LongText(self.long_text, self.window_stride).check(cfg.max_len)

    def inert(self, cfg: TrainConfig) -> dict[str, str]:
        why = f"init_from={self.init_from!r} brings its own tokenizer"
        return {**super().inert(cfg), **({"tokenizer": why, "vocab_size": why} if self.init_from else {})}


def drop_words(row: np.ndarray, p: float, rng: np.random.Generator) -> np.ndarray:
    """``row`` without each piece independently with probability ``p``, keeping at least one (word
    dropout, Iyyer et al. 2015: a regulariser that makes the classifier read all of a text rather
    than memorise a few pieces of each training example). Shape: (T,) -> (T',), 1 ≤ T' ≤ T"""
    keep = rng.random(len(row)) >= p
    if len(row) and not keep.any():
        keep[rng.integers(len(row))] = True
    return row[keep]


@register_task("classify")
class ClassifyTask(EncoderTask):
    """Labelled texts -> ``ClassifyBatch`` (ids, labels) -> encoder-only model + classifier."""

    options = ClassifyOptions

    @classmethod
    def check_config(cls, cfg: TrainConfig) -> None:
        if "n_classes" in cfg.model:
            raise ConfigError("model.n_classes is set from the training labels; remove it from [model]")
        super().check_config(cfg)

    def __init__(self, cfg: TrainConfig, run_dir: Path, dist: DistInfo):
        super().__init__(cfg, run_dir, dist)
        o = self.opts = cfg.options
        columns = (o.text_column, o.label_column)
        if cfg.valid_dataset:  # a file is used whole, a folder gives its train / valid table
            self.train = load_examples(cfg.dataset, split_for(cfg.dataset, "train"), *columns)
            valid = load_examples(cfg.valid_dataset, split_for(cfg.valid_dataset, "valid"), *columns)
        else:  # a folder's train and valid tables, or a file's first 90% and last 10% of rows
            self.train = load_examples(cfg.dataset, "train", *columns)
            valid = load_examples(cfg.dataset, "valid", *columns)
        self.labels = LabelMap.from_corpus(self.train)
        train_y, self.valid_text_y = self.labels.ids(self.train), self._valid_ids(valid, cfg)
        self.long_text = LongText(o.long_text, o.window_stride)
        self.pretrained = self._pretrained_dir() if o.init_from else None
        if o.init_from:  # its tokenizer, copied into the run (which a resumed run reads)
            self.tok = main_first(dist, self._copy_tokenizer)
        else:
            self.tok = self._tokenizer(self.train.texts, str(self.train.path))
        # a row per text, or per window of a long one (long_text); each row has its text's label
        train_ids = self._encode(self.train.texts)
        self.train_x, owner = self.long_text.rows(train_ids, cfg.max_len)
        self.train_y = [train_y[i] for i in owner]
        self.valid_x, self.valid_owner = self.long_text.rows(self._encode(valid.texts), cfg.max_len)
        self.valid_y = [self.valid_text_y[i] for i in self.valid_owner]
        self.sampler = self._sampler(self.train_x, seed=cfg.seed)
        self.samples = self._segmentations(train_ids) if o.subword_dropout else []
        counts = np.bincount(self.train_y, minlength=len(self.labels))
        self.class_weight = None
        if o.class_weights == "balanced":
            self.class_weight = torch.tensor(len(self.train_y) / (len(counts) * counts), dtype=torch.float32)

    def _valid_ids(self, valid, cfg: TrainConfig) -> list[int]:
        """The validation labels' ids. Where validation is the last tenth of the training file, a file
        sorted by label puts a class there alone (an unknown label) or leaves classes out of it (a
        score on some classes only): both say that the file's order is the cause and how to fix it."""
        cut = not cfg.valid_dataset and not Path(cfg.dataset).is_dir()
        fix = "the validation rows are the file's last tenth: shuffle the file, or give valid_dataset=FILE"
        try:
            ids = self.labels.ids(valid)
        except DataError as e:
            raise DataError(f"{e}; {fix}" if cut else str(e)) from None
        seen = set(ids)
        missing = [label for i, label in enumerate(self.labels.labels) if i not in seen]
        if cut and missing and self.dist.is_main:
            print(f"aiayn train: warning: no validation row has label(s) {', '.join(map(repr, missing))}, so "
                  f"its scores leave that class out; {fix}", file=sys.stderr)  # fmt: skip
        return ids

    # -- the pre-trained encoder -------------------------------------------------------------------
    def _pretrained_dir(self) -> Path | None:
        """``init_from``'s model directory; None when it is gone and this run resumes without it (the
        run holds the tokenizer's copy and checkpoints, whose weights replace the pre-trained ones)."""
        directory = resolve_model_dir(self.opts.init_from)
        try:
            check_kind(directory, ("encoder",))
        except ModelDirError as e:
            if (self.run_dir / TOKENIZER_DIR).is_dir() and latest_checkpoint(self.run_dir) is not None:
                if self.dist.is_main:
                    print(f"aiayn train: init_from={self.opts.init_from!r} no longer loads ({e}); the run's "
                          "checkpoints hold all it gave", file=sys.stderr)  # fmt: skip
                return None
            raise ModelDirError(f"init_from={self.opts.init_from!r}: {e}") from None
        return directory

    def _copy_tokenizer(self):
        tok_dir = self.run_dir / TOKENIZER_DIR
        if not tok_dir.is_dir():
            load_encoder_tokenizer(self.pretrained).save(tok_dir)
        return load_encoder_tokenizer(tok_dir)

    def build_model(self) -> EncoderModel:
        n = len(self.labels)
        if self.pretrained is None and self.opts.init_from:  # resumed without it: the run's own shape
            return EncoderModel(EncoderConfig.from_dict(self._run_shape()))
        if self.pretrained is None:
            return EncoderModel(self.encoder_config(n_classes=n))
        o, (pretrained, _, meta) = self.opts, load_encoder_dir(self.pretrained)
        base = pretrained.config.to_dict()
        may_change = HEAD_FIELDS - {"pooling", "pooler"} if o.keep_classifier else HEAD_FIELDS
        for key, value in self.cfg.model.items():
            if key not in may_change and base.get(key) != value:
                kept = " (keep_classifier keeps the pooling too)" if key in HEAD_FIELDS else ""
                raise ConfigError(
                    f"model.{key}={value!r} differs from the pre-trained encoder's {base.get(key)!r} "
                    f"(init_from={o.init_from!r}); only {sorted(may_change)} may change{kept}"
                )
        trained = self._trained_max_len(meta, base["max_len"])
        resuming = latest_checkpoint(self.run_dir) is not None  # a run started before the check goes on
        if base.get("positional") == "learned" and self.cfg.max_len > trained and not resuming:
            raise ConfigError(
                f"max_len={self.cfg.max_len} is over the {trained} positions the pre-trained encoder "
                f"learnt (init_from={o.init_from!r}); use max_len ≤ {trained} (long_text reads more)"
            )
        if o.keep_classifier:
            self._check_kept_head(pretrained, meta.get("labels"))
        if o.reinit_layers > base["n_layers"]:
            fail(o, "reinit_layers", f"is more than init_from's {base['n_layers']} layers")
        # the batches' ids; a replaced-token detector (task=rtd) stays behind with its pre-training
        fields = {**base, **self.cfg.model, "n_classes": n, "detector": False, **self.special_ids}
        model = EncoderModel(EncoderConfig.from_dict(fields))
        fresh = [f"encoder.layers.{i}." for i in range(base["n_layers"] - o.reinit_layers, base["n_layers"])]
        left = ("detector.", *fresh, *(() if o.keep_classifier else ("classifier.",)))
        state = {k: v for k, v in pretrained.state_dict().items() if not k.startswith(left)}
        missing, unexpected = model.load_state_dict(state, strict=False)
        new = [k for k in missing if not k.startswith(left)]
        if new or unexpected:
            raise ModelDirError(
                f"init_from={self.opts.init_from!r}: the pre-trained weights do not fit (missing {new[:3]}, "
                f"unexpected {unexpected[:3]})"
            )
        return model

    def _trained_max_len(self, meta: dict, rows: int) -> int:
        """How many of init_from's ``rows`` positions were trained: its ``trained_max_len``, else its
        run's ``max_len`` (a run from before the field), else all (an imported BERT)."""
        if isinstance(meta.get("trained_max_len"), int):
            return min(meta["trained_max_len"], rows)
        try:
            trained = read_run_config(self.pretrained.parent, fix="restore it (it holds init_from's max_len)")
            trained = trained.get("max_len")
        except ModelDirError:  # no run around it
            return rows
        return min(trained, rows) if isinstance(trained, int) else rows

    def _run_shape(self) -> dict:
        """The model config of this run's newest checkpoint that reads (resume skips a damaged one)."""
        errors = []
        for _, path in reversed(step_dirs(self.run_dir)):
            try:
                return read_config(path)["config"]
            except ModelDirError as e:
                errors.append(str(e))
        raise ModelDirError(
            f"cannot resume {self.run_dir}: no checkpoint's config reads ({'; '.join(errors)})"
        )

    def _check_kept_head(self, pretrained: EncoderModel, theirs: list[str] | None) -> None:
        """keep_classifier needs a classifier whose class ids name the training labels, in order
        (``theirs``: the labels ``load_encoder_dir`` read, an aiayn run's or a HF ``id2label``)."""
        if pretrained.classifier is None:
            fail(self.opts, "keep_classifier", f"needs a classifier in init_from={self.opts.init_from!r}, "
                 "which has none: remove keep_classifier")  # fmt: skip
        if theirs != self.labels.labels:
            fail(self.opts, "keep_classifier", f"needs init_from's labels {theirs} to be the training "
                 f"labels {self.labels.labels}: remove keep_classifier for a new classifier")  # fmt: skip

    def reads_every_parameter(self, model: nn.Module) -> bool:
        """False when the model keeps a vocabulary head the loss never reaches (BERT's transform and
        output bias, an untied projection: kept for fill-mask and export)."""
        read = {id(p) for part in (model.embed, model.encoder, model.classifier) for p in part.parameters()}
        return all(id(p) in read for p in model.parameters())

    def lr_scale(self, model: nn.Module) -> Callable[[str], float] | None:
        """Layer-wise decay: layer l = 1…L trains at decay^(L + 1 − l) × lr, the embeddings at
        decay^(L + 1), the final norm and the heads at lr. Scaled rates may go below ``min_lr``."""
        decay, top = self.opts.layer_decay, model.config.n_layers + 1
        if decay == 1.0:
            return None

        def scale(name: str) -> float:
            if name.startswith("embed."):
                return decay**top
            if name.startswith("encoder.layers."):
                return decay ** (top - 1 - int(name.split(".")[2]))
            return 1.0

        return scale

    # -- batches and the objective -----------------------------------------------------------------
    def _batch(self, rows, labels) -> ClassifyBatch:
        return ClassifyBatch(self._collate(rows), torch.tensor(labels))

    def _segmentations(self, plain: list[np.ndarray]) -> list[Ragged]:
        """subword_dropout's samples of the training texts (``data/subword.py``: drawn once by rank 0,
        saved in the run, read by every rank and resume); epoch e reads sample e mod their number.
        Batches are planned on the deterministic lengths (``plain``), so a sampled batch holds more
        pieces than ``max_tokens``: rank 0 says how many more, and how many texts a sample splits
        otherwise."""
        if not isinstance(self.tok, SentencePieceTokenizer):
            name = type(self.tok).__name__
            raise ConfigError(f"subword_dropout={self.opts.subword_dropout} samples a sentencepiece "
                              f"vocabulary, not this {name}: set subword_dropout=0")  # fmt: skip
        tok, p, seed = self.tok, self.opts.subword_dropout, self.cfg.seed
        samples = main_first(
            self.dist, lambda: sampled_texts(self.train.texts, tok, p, self.run_dir / SAMPLES_DIR, seed)
        )
        if self.dist.is_main:
            said = report(p, "texts", {"": (to_ragged(plain), samples)}, aligned=True)
            print(f"aiayn train: {said}", file=sys.stderr)
        return samples

    def _train_row(self, i: int) -> np.ndarray:
        """Training row ``i``: the deterministic segmentation, or this epoch's sample (its head/tail)."""
        if not self.samples:
            return self.train_x[i]
        sample = self.samples[self.sampler.epoch % len(self.samples)]
        return self.long_text.pieces(sample[i], self.cfg.max_len)[0]

    def train_batches(self) -> Iterator[ClassifyBatch]:
        p = self.opts.word_dropout
        while True:
            for idx in self.sampler:
                rows = [self._train_row(i) for i in idx]
                if p:
                    rng = self._batch_rng()
                    rows = [drop_words(row, p, rng) for row in rows]
                yield self._batch(rows, [self.train_y[i] for i in idx])

    def valid_batches(self) -> Iterator[ClassifyBatch]:
        for idx in self._valid_order(self.valid_x):
            yield self._batch([self.valid_x[i] for i in idx], [self.valid_y[i] for i in idx])

    def loss(self, model: nn.Module, batch: ClassifyBatch, smoothing: float):
        if self.opts.r_drop and model.training:
            return criteria.classification_r_drop_loss(model, batch, smoothing, self.opts.r_drop)
        if self.opts.mixup and model.training:
            return criteria.classification_mixup_loss(model, batch, smoothing, self.opts.mixup)
        weight = None if self.class_weight is None else self.class_weight.to(batch.ids.device)
        if self.opts.adversarial and model.training:
            radius = self.opts.adversarial
            return criteria.classification_adversarial_loss(model, batch, smoothing, radius, weight)
        return criteria.classification_loss(model, batch, smoothing, weight)

    def n_targets(self, batch: ClassifyBatch) -> int:
        return batch.labels.numel()

    def extra_metrics(self, model: nn.Module, device: torch.device) -> dict[str, float]:
        """Accuracy and macro-F1 per text: a text's logits are the mean of its rows' (``pool_windows``)."""
        logits = torch.empty(len(self.valid_x), len(self.labels))  # (W, C)
        for idx in self._valid_order(self.valid_x):
            ids = self._collate([self.valid_x[i] for i in idx]).to(device)
            logits[idx] = model.classify(ids).float().cpu()
        texts = pool_windows(logits, torch.from_numpy(self.valid_owner), len(self.valid_text_y))
        m = classification_metrics(self.valid_text_y, texts.argmax(-1).tolist(), len(self.labels))
        return {"accuracy": m["accuracy"], "macro_f1": m["macro_f1"]}

    def score(self, metrics: dict[str, float]) -> float:
        return metrics["accuracy"]

    def model_meta(self) -> dict[str, Any]:
        return {**super().model_meta(), "objective": "classify", "labels": self.labels.labels,
                "text_column": self.opts.text_column, "label_column": self.opts.label_column,
                "long_text": {"how": self.opts.long_text, "stride": self.opts.window_stride,
                              "max_len": self.cfg.max_len}}  # fmt: skip
