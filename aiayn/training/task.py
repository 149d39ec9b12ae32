"""The ``Task`` interface: everything one kind of training gives the shared loop, and its registry.

The loop (``trainer.py``) knows nothing about translation or language modelling: it asks the task
for a model, batches, a loss and metrics. A new kind of training is one module under
``training/tasks/`` that subclasses ``Task`` and registers itself by name::

    @dataclass
    class MyOptions(TaskOptions):
        my_weight: float = 1.0  # the task's own fields, flat in a recipe

    @register_task("my_task")
    class MyTask(Task):
        model_config = LMConfig
        options = MyOptions
        ...

after which ``aiayn train task=my_task my_weight=0.5 …`` runs it (``TrainConfig.task`` is checked
against the registry). The loop trains the task's ``objective``: a module around the model whose
forward is the task's ``loss``, so DDP and ``torch.compile`` wrap the loss with the model and the loss
may call any method of the bare model.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar, Protocol

import torch
from torch import Tensor, nn

from aiayn.errors import ConfigError
from aiayn.modules.config import LayerConfig
from aiayn.training.config import TaskOptions, TrainConfig
from aiayn.training.distributed import DistInfo

BUILTIN = "aiayn.training.tasks"  # importing it registers the built-in tasks
TOKENIZER_DIR = "tokenizer"  # where a run keeps the tokenizers trained for it


def learned_rows(cfg: TrainConfig, default: int | None = None) -> int | None:
    """The rows of learned positions ``cfg.model`` asks for (``model.max_len``, else ``default``), or
    None where there is no such limit (sinusoidal positions grow; no max_len given nor defaulted)."""
    rows = cfg.model.get("max_len", default)
    return rows if cfg.model.get("positional") == "learned" and isinstance(rows, int) else None


def check_learned_positions(cfg: TrainConfig, positions: int, limit: str) -> None:
    """Refuse learned positions (``model.max_len`` rows, a hard limit) too few for the ``positions``
    that the task's ``limit`` (e.g. ``"max_len=128"``) lets a sequence have: such a run would stop at
    its first long batch or evaluation, not before it starts."""
    rows = learned_rows(cfg)
    if rows is not None and rows < positions:
        raise ConfigError(f"model.max_len={rows}: learned positions cannot hold the {positions} positions "
                          f"that {limit} allows; raise model.max_len to {positions} or lower "
                          f"{limit.split('=')[0]}")  # fmt: skip


class Batch(Protocol):
    """What a task's batch is to the loop: named tensors (a ``NamedTuple``) with ``.to(device)``."""

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch: ...


class ModelTableError(ConfigError):
    """A ``[model]`` table its model config refuses."""


class Task:
    """One kind of training. The class describes the task; an instance holds its data for one run.

    A task is built once per process as ``Task(cfg, run_dir, dist)``: it reads its data, trains its
    tokenizer(s) on rank 0 (``distributed.main_first``) and keeps them in ``run_dir``.
    """

    name: ClassVar[str] = ""  # set by ``register_task``
    model_config: ClassVar[type[LayerConfig]]  # the config class of the model it trains
    options: ClassVar[type[TaskOptions]] = TaskOptions  # its own fields (``cfg.options``)
    token_batches: ClassVar[bool] = False  # batches of max_tokens, which ``rebatch`` can resize

    def __init__(self, cfg: TrainConfig, run_dir: Path, dist: DistInfo):
        if not isinstance(cfg.options, self.options):
            raise ConfigError(f"task={cfg.task!r} needs its options ({self.options.__name__}), not "
                              f"{type(cfg.options).__name__}: build the config with "
                              "aiayn.training.recipe")  # fmt: skip
        self.cfg, self.run_dir, self.dist = cfg, run_dir, dist

    # -- the config, before any work -----------------------------------------------------------
    @classmethod
    def check_config(cls, cfg: TrainConfig) -> None:
        """Raise ``ConfigError`` naming the field if ``cfg`` makes no sense for this task. The
        default checks the ``[model]`` table against ``model_config`` with placeholder vocabulary
        sizes (the real ones come from the tokenizer)."""
        if cfg.short_budget == "halve_max_tokens" and not cls.token_batches:
            raise ConfigError(f"short_budget='halve_max_tokens' resizes a run's token batches; "
                              f"task={cls.name!r} has none to resize (use 'warn')")  # fmt: skip
        if cfg.max_epochs and cls.epoch is Task.epoch:  # a task that samples endlessly never ends an epoch
            raise ConfigError(
                f"max_epochs={cfg.max_epochs}: task={cls.name!r} samples its training data endlessly and "
                "counts no epochs; stop it with max_steps or max_minutes"
            )
        cls.check_model(cfg)

    @classmethod
    def check_model(cls, cfg: TrainConfig) -> None:
        """The ``[model]`` table against ``model_config``, with placeholder vocabulary sizes; its
        refusal is a ``ModelTableError``, which the recipe's reader names with the table's source.
        The vocabulary's sizes and special ids come from the run's tokenizer: set there, they would be
        replaced without a word, so they are refused."""
        filled = sorted(set(cls.vocab_placeholder(1)) | {"pad_id", "bos_id", "eos_id", "unk_id"})
        if given := [k for k in filled if k in cfg.model]:
            raise ModelTableError(f"model.{given[0]} is set from the run's tokenizer: remove it from [model] "
                                  "and give vocab_size (or init_from's tokenizer) instead")  # fmt: skip
        try:
            cls.model_config.from_dict({**cfg.model, **cls.vocab_placeholder(max(cfg.vocab_size, 256))})
        except ConfigError as e:
            raise ModelTableError(str(e)) from None

    @classmethod
    def vocab_placeholder(cls, size: int) -> dict[str, int]:
        """The model config's vocabulary-size fields, all set to ``size``."""
        return {"vocab_size": size}

    # -- the model and its data ---------------------------------------------------------------
    def build_model(self) -> nn.Module:
        raise NotImplementedError

    sampler: Any  # the training data position: ``state_dict()`` / ``load_state_dict()``

    @property
    def epoch(self) -> int:
        """Completed passes over the training data (0 for tasks that sample endlessly)."""
        return 0

    def train_batches(self) -> Iterator[Batch]:
        """Endless training batches of this rank, continuing from ``sampler``'s position."""
        raise NotImplementedError

    def valid_batches(self) -> Iterator[Batch]:
        raise NotImplementedError

    def rebatch(self, max_tokens: int) -> None:
        """Training batches of ``max_tokens`` from here on, the current epoch again from its start
        (``TrainConfig.short_budget``); ``train_batches()`` afterwards iterates them. Only tasks with
        token-budget batches can."""
        raise NotImplementedError(f"task {self.cfg.task!r} has no token-budget batches to resize")

    def reads_every_parameter(self, model: nn.Module) -> bool:
        """Whether every step's loss reaches all of ``model``'s parameters; when not,
        ``DistributedDataParallel`` is told to look for the unused ones (or it would wait for them)."""
        return True

    def batch_tokens(self) -> int:
        """The tokens of one training batch, about: what ``precision="auto"`` times its products on."""
        return self.cfg.max_tokens

    def lr_scale(self, model: nn.Module) -> Callable[[str], float] | None:
        """The learning rate's factor for each parameter name of ``model`` (``make_optimizer``), e.g.
        layer-wise decay when fine-tuning; ``None``: one rate for all."""
        return None

    # -- the objective ----------------------------------------------------------------------------
    def loss(self, model: nn.Module, batch: Batch, smoothing: float) -> tuple[Tensor, Tensor, Tensor]:
        """Summed training loss, summed NLL and the number of targets of ``batch``. ``model`` is the
        bare model (the loop wraps the ``objective``, never the model), and ``model.training`` says
        whether this is a training or a validation batch."""
        raise NotImplementedError

    def objective(self, model: nn.Module) -> Objective:
        """The module the loop trains and evaluates: ``model`` and this task's ``loss``."""
        return Objective(self, model)

    def pop_metrics(self, split: str) -> dict[str, float]:
        """Metrics the task gathered itself from the ``loss`` calls of ``split`` ("train": since the
        last log line; "valid": this evaluation), e.g. a second objective's loss; then forgets them."""
        return {}

    def n_targets(self, batch: Batch) -> int:
        """The number of targets the loss of ``batch`` sums over (the loop normalises by it)."""
        raise NotImplementedError

    # -- evaluation and what a checkpoint records ------------------------------------------------
    def extra_metrics(self, model: nn.Module, device: torch.device) -> dict[str, float]:
        """Metrics beyond loss and perplexity computed at each evaluation (rank 0 only)."""
        return {}

    def score(self, metrics: dict[str, float]) -> float:
        """The number that picks the best checkpoint (higher is better)."""
        return -metrics["loss"]

    def model_meta(self) -> dict[str, Any]:
        """Fields written into each checkpoint's ``config.json`` beside the model."""
        return {"task": self.cfg.task, "dataset": self.cfg.dataset}

    def save_tokenizers(self, directory: Path) -> None:
        """Write the tokenizer(s) into a checkpoint, where the inference commands look for them."""
        raise NotImplementedError


class Objective(nn.Module):
    """A model and its task's loss as one module: ``objective(batch, smoothing)`` is
    ``task.loss(model, batch, smoothing)``. The loop wraps this (``DistributedDataParallel``,
    ``torch.compile``) rather than the model, so the loss may call any method of the model (its
    decoder states for the fused projection + loss, say) and still runs through the wrappers."""

    def __init__(self, task: Task, model: nn.Module):
        super().__init__()
        self.model = model
        self.task = task  # a plain attribute: the task holds data, not parameters

    def forward(self, batch: Batch, smoothing: float) -> tuple[Tensor, Tensor, Tensor]:
        return self.task.loss(self.model, batch, smoothing)


TASKS: dict[str, type[Task]] = {}


def register_task(name: str) -> Callable[[type[Task]], type[Task]]:
    """Class decorator: make a ``Task`` subclass available as ``TrainConfig.task = name``."""

    def register(cls: type[Task]) -> type[Task]:
        if name in TASKS and TASKS[name] is not cls:
            raise ValueError(f"a task named {name!r} is already registered ({TASKS[name].__name__})")
        cls.name = name
        TASKS[name] = cls
        return cls

    return register


def task_names() -> list[str]:
    importlib.import_module(BUILTIN)
    return sorted(TASKS)


def get_task(name: str) -> type[Task]:
    """The task class registered as ``name``; a ``ConfigError`` listing the known ones otherwise."""
    importlib.import_module(BUILTIN)
    if name not in TASKS:
        raise ConfigError(f"task={name!r} is not one of {tuple(task_names())}")
    return TASKS[name]
