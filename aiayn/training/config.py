"""``TrainConfig``: everything ``aiayn train`` needs, read from a recipe (TOML) plus overrides.

A recipe is a flat TOML file of ``TrainConfig`` fields with an optional ``[model]`` table of
model-config fields. ``key=value`` overrides on the command line use TOML literal syntax
(``lr=0.5``, ``eval_bleu=false``, ``model.d_model=256``; a bare word is a string). Unknown keys
and wrong types are errors that name the key before any work starts.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiayn.errors import ConfigError
from aiayn.textfiles import read_text

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

TOKENIZERS = ("bpe", "unigram", "char")
PRECISIONS = ("fp32", "bf16", "fp16", "auto")
EXAMPLE_RECIPE = "recipes/multi30k-de-en.toml"


@dataclass
class TrainConfig:
    # -- what to learn --------------------------------------------------------------------------
    task: str = "translation"  # a registered Task: "translation", "lm", "mlm", "classify"
    dataset: str = "multi30k"  # bundled name ("multi30k", "shakespeare"), a folder, or a file prefix
    valid_dataset: str = ""  # a different source for validation; "" = same as dataset
    extra_text: list[str] = field(default_factory=list)  # mlm: more training text (names or files)
    text_column: str = ""  # mlm/classify tables (TSV/CSV/JSONL): column name or 0-based number
    label_column: str = ""  # classify: "" = the column called "label"
    src_lang: str = "de"  # translation: file suffixes / Multi30k languages
    tgt_lang: str = "en"
    # -- tokenizer ------------------------------------------------------------------------------
    tokenizer: str = "bpe"  # "bpe" or "unigram" (sentencepiece), "char" (characters)
    vocab_size: int = 8000  # sentencepiece vocabulary size (per side if not joint)
    joint_vocab: bool = True  # one vocabulary for both sides (needed for shared embeddings)
    # translation: a vocabulary that lowercases all text, so the model reads and writes lowercased text
    # (as the Multi30k literature trains on its lowercased files); False = the text as written (the paper)
    lowercase: bool = False
    # translation: the ids the output layer scores: "all" (the paper) or "target", the pieces that occur
    # on the target side of the training data (of a joint vocabulary, the other language's pieces go)
    output_vocab: str = "all"
    # -- model: fields of TransformerConfig / LMConfig (vocabulary sizes and ids are filled in) ----
    model: dict[str, Any] = field(default_factory=dict)
    # -- batches --------------------------------------------------------------------------------
    max_tokens: int = 4096  # translation, mlm, classify: padded tokens (per side) per batch (fairseq's)
    max_len: int = 256  # translation: drop pairs with a side longer; mlm/classify: truncate (tokens)
    batch_size: int = 12  # lm: windows per batch
    block_size: int = 64  # lm: context length
    update_freq: int = 1  # gradient accumulation: batches per optimizer update
    # -- optimisation ---------------------------------------------------------------------------
    optimizer: str = "adam"  # "adam" (decoupled weight decay off) or "adamw"
    schedule: str = "noam"  # "noam" (paper), "inverse_sqrt", "constant", "cosine"
    lr: float = 1.0  # noam: the scale factor; otherwise the peak learning rate
    warmup: int = 4000  # warm-up updates
    min_lr: float = 0.0  # cosine: final learning rate
    decay_steps: int = 0  # cosine: update at which min_lr is reached (0 = max_steps)
    beta1: float = 0.9  # Adam β1 (paper)
    beta2: float = 0.98  # Adam β2 (paper)
    adam_eps: float = 1e-9  # Adam ε (paper)
    weight_decay: float = 0.0
    clip_norm: float = 0.0  # clip the gradient norm to this; 0 = off
    label_smoothing: float = 0.1  # ε_ls (paper §5.4)
    # translation, tokenizer="bpe": BPE-dropout probability (Provilkov et al. 2020): the training pairs
    # are re-segmented at random every epoch; 0 = off (the paper)
    subword_dropout: float = 0.0
    subword_dropout_sides: str = "both"  # translation: the sides subword_dropout samples ("source", "target")
    # translation: R-Drop's α (Liang et al. 2021): each batch runs twice through different dropout masks
    # and the loss adds α · ½ (KL(P_a‖P_b) + KL(P_b‖P_a)); two passes per update; 0 = off (the paper;
    # Liang et al. use 5 on IWSLT)
    r_drop: float = 0.0
    reverse_target: bool = False  # translation: learn the target right to left (for translate --rerank-with)
    r2l_weight: float = 1.0  # translation, model.bidirectional: λ of L = L_l2r + λ·L_r2l
    r2l_detach: bool = False  # translation, model.bidirectional: no gradient from L_l2r into the r2l decoder
    # translation, model.bidirectional: the r2l states the l2r decoder reads in training: "greedy" (the
    # r2l decoder's own greedy translation, as decoding gives it) or "reference" (teacher-forced on the
    # reversed reference, as the issue read Zhang et al.: the l2r decoder then copies; docs/results.md)
    r2l_memory_from: str = "greedy"
    # -- encoder-only tasks -----------------------------------------------------------------------
    mask_prob: float = 0.15  # mlm: tokens chosen for prediction (BERT)
    mask_token_prob: float = 0.8  # mlm: a chosen token becomes <mask> ...
    random_token_prob: float = 0.1  # mlm: ... or a random token (else it stays)
    whole_word_mask: bool = False  # mlm: choose whole words rather than pieces
    init_from: str = ""  # classify: a pre-trained encoder (run or model directory) to start from
    class_weights: str = "none"  # classify: "none" or "balanced" (n / (k · count) per class)
    # -- when to stop ---------------------------------------------------------------------------
    max_steps: int = 100_000  # optimizer updates
    max_epochs: int = 0  # 0 = no limit
    max_minutes: float = 0.0  # training-time budget (evaluation excluded); 0 = no limit
    horizon: str = "steps"  # cosine spans "steps" (decay_steps) or "budget": steps or max_minutes, first out
    # translation with max_minutes: what a run does when, at update 20 (the speed of updates 6–20), the budget
    # holds under a third of max_steps (a machine far slower than the recipe's): "warn" says that half-size
    # updates train further there; "halve_max_tokens" trains on with them (once, where max_tokens > 1024
    # and half of it holds a pair of max_len)
    short_budget: str = "warn"
    patience: int = 0  # stop after this many evaluations without improvement; 0 = off
    # -- hardware -------------------------------------------------------------------------------
    device: str = "auto"  # "auto" (cuda if available), "cpu", "cuda", "cuda:1", …
    precision: str = "fp32"  # "fp32", "bf16" (autocast; CPU or CUDA), "fp16" (CUDA, loss scaling),
    # "auto": bf16 where bfloat16 products measure ≥ 1.25× float32's at the start, else fp32
    compile: bool = False  # torch.compile the model
    threads: int = 0  # torch CPU threads; 0 = PyTorch's default
    # -- evaluation, logging, checkpoints ---------------------------------------------------------
    eval_every: int = 1000  # updates between evaluations (and checkpoints)
    eval_bleu: bool = True  # translation: greedy BLEU on the validation set at each evaluation
    eval_max_sentences: int = 0  # BLEU on the first N validation sentences; 0 = all
    eval_iters: int = 0  # lm: validation batches per evaluation; 0 = the whole split
    log_every: int = 10  # updates between metrics lines
    keep_last: int = 3  # checkpoints kept (plus the best)
    out_dir: str = "runs/default"
    tensorboard: bool = False
    seed: int = 1
    progress: bool = True  # a tqdm progress bar

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Every field checked for type range, finiteness and agreement with its siblings, before
        any work starts; a ``ConfigError`` names the first bad field and what to do."""

        def fail(name: str, problem: str) -> None:
            raise ConfigError(f"{name}={getattr(self, name)!r} {problem}")

        from aiayn.training.task import get_task

        task = get_task(self.task)  # a ConfigError naming the known tasks
        for name, choices in (("tokenizer", TOKENIZERS), ("precision", PRECISIONS),
                              ("optimizer", ("adam", "adamw")), ("horizon", ("steps", "budget")),
                              ("r2l_memory_from", ("reference", "greedy")),
                              ("subword_dropout_sides", ("both", "source", "target")),
                              ("output_vocab", ("all", "target")),
                              ("short_budget", ("warn", "halve_max_tokens")),
                              ("schedule", ("noam", "inverse_sqrt", "constant", "cosine"))):  # fmt: skip
            if getattr(self, name) not in choices:
                fail(name, f"is not one of {choices}")
        for f in dataclasses.fields(self):  # an id, a count or a seed past int64 breaks torch and numpy
            value = getattr(self, f.name)
            if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 2**63:
                fail(f.name, "is too large (the limit is 2**63 - 1)")
        for name in ("vocab_size", "max_tokens", "max_len", "batch_size", "block_size", "update_freq",
                     "max_steps", "eval_every", "log_every", "keep_last"):  # fmt: skip
            if getattr(self, name) < 1:
                fail(name, "must be ≥ 1")
        for name in ("max_epochs", "patience", "warmup", "eval_max_sentences", "eval_iters", "threads",
                     "decay_steps"):  # fmt: skip
            if getattr(self, name) < 0:
                fail(name, "must be ≥ 0")
        for name in ("lr", "min_lr", "beta1", "beta2", "adam_eps", "weight_decay", "clip_norm", "mask_prob",
                     "mask_token_prob", "random_token_prob", "r2l_weight", "r_drop",
                     "label_smoothing", "max_minutes", "subword_dropout"):  # fmt: skip
            if not math.isfinite(getattr(self, name)):
                fail(name, "must be a finite number")
        for name in ("min_lr", "weight_decay", "clip_norm", "max_minutes", "r2l_weight", "r_drop"):
            if getattr(self, name) < 0:
                fail(name, "must be ≥ 0 (0 = off)" if name != "min_lr" else "must be ≥ 0")
        for name in ("mask_token_prob", "random_token_prob"):
            if not 0 <= getattr(self, name) <= 1:
                fail(name, "must be in [0, 1]")
        if not 0 < self.mask_prob <= 1:
            fail("mask_prob", "must be in (0, 1]: the share of tokens the model predicts (BERT: 0.15)")
        if self.mask_token_prob + self.random_token_prob > 1:
            fail("random_token_prob", f"+ mask_token_prob={self.mask_token_prob} is more than 1")
        for name in ("label_smoothing", "beta1", "beta2", "subword_dropout"):
            if not 0 <= getattr(self, name) < 1:
                fail(name, "must be in [0, 1)")
        if self.lr <= 0:
            fail("lr", "must be > 0")
        if self.adam_eps <= 0:
            fail("adam_eps", "must be > 0 (the paper's is 1e-9)")
        if self.schedule == "cosine" and self.min_lr > self.lr:
            fail("min_lr", f"is above lr={self.lr}: the cosine schedule decays from lr down to min_lr")
        if self.horizon == "budget" and (self.schedule != "cosine" or not self.max_minutes):
            fail("horizon", "needs schedule='cosine' and max_minutes > 0 (the budget the schedule spans)")
        if self.short_budget == "halve_max_tokens" and self.task != "translation":
            fail("short_budget", f"resizes a translation run's token batches; task={self.task!r} has none to "
                 "resize (use 'warn')")  # fmt: skip
        if self.seed < 0:
            fail("seed", "must be ≥ 0")
        if not self.out_dir:
            fail("out_dir", "is empty: name the run directory")
        if not all(isinstance(x, str) and x for x in self.extra_text):
            fail("extra_text", "must be a list of dataset names or file paths")
        if self.subword_dropout and self.task != "translation":
            fail("subword_dropout", f"re-segments translation pairs; task={self.task!r} has none (set 0)")
        if self.subword_dropout and self.tokenizer != "bpe":
            fail("subword_dropout", f"is BPE-dropout: it needs tokenizer='bpe', not {self.tokenizer!r}")
        if self.subword_dropout_sides != "both" and not self.subword_dropout:
            fail("subword_dropout_sides", "does nothing while subword_dropout=0: give subword_dropout > 0")
        if self.lowercase and (self.task != "translation" or self.tokenizer == "char"):
            fail("lowercase", f"is for a translation model's subword vocabulary; task={self.task!r} with "
                 f"tokenizer={self.tokenizer!r} does not take it (set false)")  # fmt: skip
        if self.r_drop and self.task != "translation":
            fail("r_drop", f"is R-Drop for translation models; task={self.task!r} does not take it (set 0)")
        if self.output_vocab != "all" and self.task != "translation":
            fail("output_vocab", f"picks a translation model's output ids; task={self.task!r} has none")
        if self.class_weights not in ("none", "balanced"):
            fail("class_weights", "is not one of ('none', 'balanced')")
        task.check_config(self)  # what the task itself needs, the [model] table included


def _type_ok(value: Any, annotation: Any) -> bool:
    origin = typing.get_origin(annotation) or annotation
    if origin is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if origin is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, origin)


def config_from_dict(
    data: dict[str, Any], source: str = "recipe", sources: dict[str, str] | None = None
) -> TrainConfig:
    """Build a ``TrainConfig``, rejecting unknown keys and wrong types with a one-line error that
    names where the key came from (``sources[key]``, e.g. an override, else ``source``)."""
    hints = typing.get_type_hints(TrainConfig)
    for key, value in data.items():
        where = (sources or {}).get(key, source)
        if key not in hints:
            known = ", ".join(sorted(hints))
            raise ConfigError(f"{where}: unknown key {key!r} (known keys: {known})")
        if not _type_ok(value, hints[key]):
            expected = getattr(hints[key], "__name__", str(hints[key]))
            raise ConfigError(f"{where}: {key} must be {expected}, got {value!r}")
    data = {k: float(v) if hints[k] is float else v for k, v in data.items()}
    return TrainConfig(**data)


def parse_override(item: str) -> tuple[list[str], Any]:
    """``"model.d_model=256"`` -> (["model", "d_model"], 256). Values are TOML literals, else strings."""
    if "=" not in item:
        raise ConfigError(f"override {item!r} must look like key=value (e.g. lr=0.5 or model.d_model=256)")
    key, raw = item.split("=", 1)
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return key.strip().split("."), value


def load_recipe(path: str | os.PathLike | None, overrides: list[str] = ()) -> TrainConfig:
    """A recipe file (or the defaults when ``path`` is None) with ``key=value`` overrides applied."""
    data: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        if path.is_dir():
            raise ConfigError(f"recipe {path} is a directory; give a TOML file such as {EXAMPLE_RECIPE}")
        if not path.is_file():
            raise ConfigError(f"recipe {path} does not exist (e.g. {EXAMPLE_RECIPE})")
        text = read_text(path, "", ConfigError, fix="save the recipe as UTF-8")
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"recipe {path} is not valid TOML: {e}") from None
    sources = {}
    for item in overrides:
        keys, value = parse_override(item)
        target = data
        for k in keys[:-1]:
            target = target.setdefault(k, {})
            if not isinstance(target, dict):
                raise ConfigError(f"override {item!r}: {k} is not a table")
        target[keys[-1]] = value
        sources[keys[0]] = f"override {item!r}"
    return config_from_dict(data, source=f"recipe {path}" if path else "overrides", sources=sources)


def to_dict(cfg: TrainConfig) -> dict[str, Any]:
    return dataclasses.asdict(cfg)
