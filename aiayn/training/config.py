"""``TrainConfig``: the fields every kind of training shares; each task's own fields live in its
``TaskOptions`` subclass, beside the task (``training/tasks/*.py``), as fairseq registers each criterion
with its own dataclass.

A recipe (TOML) stays flat: ``aiayn.training.recipe`` sends each key to the shared fields or to the
task's options and rejects, naming the key, one that neither takes. Unknown keys and wrong types are
errors before any work starts. This module knows no task.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar, NoReturn

from aiayn.device import max_threads
from aiayn.errors import ConfigError

TOKENIZERS = ("bpe", "unigram", "char")
PRECISIONS = ("fp32", "bf16", "fp16", "auto")
INT_LIMIT = 2**63  # an id, a count or a seed past int64 breaks torch and numpy
# sentencepiece's and the embedding's sizes: far above any real vocabulary, far below what breaks them
MAX_VOCAB = 2**20
MAX_MINUTES = 1e6  # a budget's upper bound: past it the budget's arithmetic overflows
MAX_DDP_TIMEOUT = 30 * 86400.0  # seconds; past about 1e14 the timedelta of the process group overflows


def check_numbers(obj: Any) -> None:
    """Every float field of the dataclass ``obj`` finite and every int field within int64."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{f.name}={value!r} must be a finite number")
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= INT_LIMIT:
            size = "too large" if value > 0 else "too small"
            raise ConfigError(f"{f.name}={value!r} is {size} (int64: |value| < 2**63)")


def fail(obj: Any, name: str, problem: str) -> NoReturn:
    """A ``ConfigError`` that names the field, its value and the problem."""
    raise ConfigError(f"{name}={getattr(obj, name)!r} {problem}")


@dataclass
class TaskOptions:
    """A task's own training fields (none here: each task subclasses it beside itself)."""

    # what each field is, said when another task is given it ("r_drop=1.0 is R-Drop for translation
    # models; task='lm' does not take it")
    ABOUT: ClassVar[dict[str, str]] = {}

    def validate(self, cfg: TrainConfig) -> None:
        """Raise ``ConfigError`` naming the first field that makes no sense (``cfg``: the shared
        fields, for checks across both)."""
        check_numbers(self)

    def inert(self, cfg: TrainConfig) -> dict[str, str]:
        """The fields, this task's or shared, that ``cfg`` leaves without effect, each with why
        (``inert_fields``)."""
        return {}


@dataclass
class TrainConfig:
    # -- what to learn --------------------------------------------------------------------------
    task: str = "translation"  # a registered Task: "translation", "lm", "mlm", "rtd", "clm", "classify"
    dataset: str = "multi30k"  # bundled name ("multi30k", "shakespeare"), a folder, or a file prefix
    valid_dataset: str = ""  # a different source for validation; "" = same as dataset
    # -- tokenizer ------------------------------------------------------------------------------
    tokenizer: str = "bpe"  # "bpe" or "unigram" (sentencepiece), "char" (characters)
    vocab_size: int = 8000  # sentencepiece vocabulary size (per side if not joint)
    # -- model: fields of TransformerConfig / LMConfig (vocabulary sizes and ids are filled in) ----
    model: dict[str, Any] = field(default_factory=dict)
    # -- batches --------------------------------------------------------------------------------
    max_tokens: int = 4096  # token-budget batches: padded tokens (per side) per batch (fairseq's)
    # tokens: translation drops training pairs with a longer side (or one no batch holds); mlm, classify
    # truncate
    max_len: int = 256
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
    # -- when to stop ---------------------------------------------------------------------------
    max_steps: int = 100_000  # optimizer updates
    max_epochs: int = 0  # 0 = no limit
    max_minutes: float = 0.0  # training-time budget (evaluation excluded); 0 = no limit
    horizon: str = "steps"  # cosine spans "steps" (decay_steps) or "budget": steps or max_minutes, first out
    # with max_minutes: what a run with token-budget batches does when, at update 20 (the speed of updates
    # 6–20), the budget holds under a third of max_steps (a machine far slower than the recipe's): "warn"
    # says that half-size updates train further there; "halve_max_tokens" trains on with them (once, where
    # max_tokens > 1024 and half of it holds a pair of max_len)
    short_budget: str = "warn"
    patience: int = 0  # stop after this many evaluations without improvement; 0 = off
    # -- hardware -------------------------------------------------------------------------------
    device: str = "auto"  # "auto" (cuda if available), "cpu", "cuda", "cuda:1", …
    precision: str = "fp32"  # "fp32", "bf16" (autocast; CPU or CUDA), "fp16" (CUDA, loss scaling),
    # "auto": bf16 where bfloat16 products measure ≥ 1.25× float32's at the start, else fp32 (kept on resume)
    compile: bool = False  # torch.compile the model and its loss
    threads: int = 0  # torch CPU threads; 0 = PyTorch's default
    # torchrun: seconds a rank waits in a collective before the process group gives up (HF's ddp_timeout
    # and default): the others wait while rank 0 alone trains a tokenizer, fills a cache or evaluates,
    # which on a large corpus outlasts NCCL's own default of 10 minutes
    ddp_timeout: float = 1800.0
    # -- evaluation, logging, checkpoints ---------------------------------------------------------
    eval_every: int = 1000  # updates between evaluations (and checkpoints)
    log_every: int = 10  # updates between metrics lines
    keep_last: int = 3  # checkpoints kept (plus the best)
    out_dir: str = "runs/default"
    tensorboard: bool = False
    seed: int = 1
    progress: bool = True  # a tqdm progress bar
    # -- the task's own fields (flat in a recipe; aiayn.training.recipe builds them) ---------------
    options: TaskOptions = field(default_factory=TaskOptions)

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Every field checked for type range, finiteness and agreement with its siblings, before
        any work starts; a ``ConfigError`` names the first bad field and what to do."""
        for name, choices in (("tokenizer", TOKENIZERS), ("precision", PRECISIONS),
                              ("optimizer", ("adam", "adamw")), ("horizon", ("steps", "budget")),
                              ("short_budget", ("warn", "halve_max_tokens")),
                              ("schedule", ("noam", "inverse_sqrt", "constant", "cosine"))):  # fmt: skip
            if getattr(self, name) not in choices:
                fail(self, name, f"is not one of {choices}")
        check_numbers(self)
        for name in ("vocab_size", "max_tokens", "max_len", "update_freq", "max_steps", "eval_every",
                     "log_every", "keep_last"):  # fmt: skip
            if getattr(self, name) < 1:
                fail(self, name, "must be ≥ 1")
        if self.vocab_size > MAX_VOCAB:
            fail(self, "vocab_size", f"is too large (at most {MAX_VOCAB}); real vocabularies hold thousands")
        for name in ("max_epochs", "patience", "warmup", "threads", "decay_steps", "seed"):
            if getattr(self, name) < 0:
                fail(self, name, "must be ≥ 0")
        if self.threads > max_threads():
            fail(self, "threads", f"is over {max_threads()}, four per CPU of this machine")
        if self.max_minutes > MAX_MINUTES:
            fail(self, "max_minutes", f"is over {MAX_MINUTES:g} (about two years; 0 = no limit)")
        for name in ("min_lr", "weight_decay", "clip_norm", "max_minutes"):
            if getattr(self, name) < 0:
                fail(self, name, "must be ≥ 0 (0 = off)" if name != "min_lr" else "must be ≥ 0")
        for name in ("label_smoothing", "beta1", "beta2"):
            if not 0 <= getattr(self, name) < 1:
                fail(self, name, "must be in [0, 1)")
        if self.lr <= 0:
            fail(self, "lr", "must be > 0")
        if not 0 < self.ddp_timeout <= MAX_DDP_TIMEOUT:
            fail(self, "ddp_timeout", f"must be in (0, {MAX_DDP_TIMEOUT:g}] (seconds a torchrun rank waits "
                 "for the others; 30 days at most)")  # fmt: skip
        if self.adam_eps <= 0:
            fail(self, "adam_eps", "must be > 0 (the paper's is 1e-9)")
        if self.schedule == "cosine" and self.min_lr > self.lr:
            fail(self, "min_lr", f"is above lr={self.lr}: the cosine schedule decays from lr down to min_lr")
        end = "decay_steps" if self.decay_steps else "max_steps"  # where the cosine reaches min_lr
        if self.schedule == "cosine" and self.warmup >= getattr(self, end):
            fail(self, "warmup", f"is not below {end}={getattr(self, end)}, where the cosine ends: it would "
                 "never decay; lower warmup or raise decay_steps")  # fmt: skip
        if self.horizon == "budget" and (self.schedule != "cosine" or not self.max_minutes):
            fail(
                self, "horizon", "needs schedule='cosine' and max_minutes > 0 (the budget the schedule spans)"
            )
        if not self.out_dir:
            fail(self, "out_dir", "is empty: name the run directory")
        if not self.dataset.strip():  # "" is the current folder to the file readers
            fail(self, "dataset", "is empty: name a bundled dataset (multi30k), a folder or a file prefix")
        self.options.validate(self)


def inert_fields(cfg: TrainConfig) -> dict[str, str]:
    """The fields that do nothing in ``cfg`` (``min_lr`` without the cosine schedule, say), each
    with why: an override that sets one off its default is an error (``recipe.config_from_dict``),
    while a recipe's value that an override leaves without effect (``schedule=noam`` on a cosine
    recipe) is not."""
    inert = {}
    if cfg.schedule != "cosine":
        for name in ("min_lr", "decay_steps"):
            inert[name] = f"schedule={cfg.schedule!r} does not read it (the cosine schedule does)"
    if not cfg.max_minutes:
        inert["short_budget"] = "it acts on a time budget, and max_minutes=0 sets none"
    return {**inert, **cfg.options.inert(cfg)}


def shared_fields() -> dict[str, Any]:
    """The type of every shared field (``options`` aside)."""
    hints = typing.get_type_hints(TrainConfig)
    return {f.name: hints[f.name] for f in dataclasses.fields(TrainConfig) if f.name != "options"}


def to_dict(cfg: TrainConfig) -> dict[str, Any]:
    """The config as a recipe reads it: the shared fields and the task's options, flat."""
    fields = dataclasses.asdict(cfg)
    options = fields.pop("options")
    return {**fields, **options}


def default_dict(cfg: TrainConfig) -> dict[str, Any]:
    """``to_dict`` of the defaults of ``cfg``'s task: what a field added since a run had then."""
    return to_dict(TrainConfig(task=cfg.task, options=type(cfg.options)()))
