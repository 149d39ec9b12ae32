"""The Task interface: a task defined here, in the test, trains through the unchanged trainer."""

import json

import pytest
import torch

from aiayn.data import LMBatch
from aiayn.models import LanguageModel
from aiayn.models.config import LMConfig
from aiayn.models.io import load_model
from aiayn.training import task as task_module
from aiayn.training.criteria import next_token_loss
from aiayn.training.recipe import load_recipe
from aiayn.training.task import Task, get_task, register_task, task_names
from aiayn.training.trainer import Trainer

VOCAB = 12


class _Position:
    """The data position of the toy task: how many batches it has handed out."""

    def __init__(self):
        self.n = 0

    def state_dict(self) -> dict:
        return {"n": self.n}

    def load_state_dict(self, state: dict) -> None:
        self.n = state["n"]


class CountingTask(Task):
    """Predict the next number of ``k, k+1, k+2, …`` (mod VOCAB-4, offset past the special ids)."""

    model_config = LMConfig

    def __init__(self, cfg, run_dir, dist):
        super().__init__(cfg, run_dir, dist)
        self.sampler = _Position()

    def build_model(self):
        return LanguageModel(LMConfig.from_dict({**self.cfg.model, "vocab_size": VOCAB}))

    def _batch(self, seed: int) -> LMBatch:
        start = torch.randint(0, VOCAB - 4, (8, 1), generator=torch.Generator().manual_seed(seed))
        seq = 4 + (start + torch.arange(9)) % (VOCAB - 4)  # (8, 9)
        return LMBatch(seq[:, :-1], seq[:, 1:])

    def train_batches(self):
        while True:
            self.sampler.n += 1
            yield self._batch(self.sampler.n)

    def valid_batches(self):
        yield self._batch(-1)

    def loss(self, model, batch, smoothing):
        return next_token_loss(model, batch, smoothing)

    def n_targets(self, batch):
        return batch.targets.numel()

    def extra_metrics(self, model, device):
        batch = next(self.valid_batches()).to(device)
        return {"accuracy": float((model(batch.ids).argmax(-1) == batch.targets).float().mean())}

    def score(self, metrics):
        return metrics["accuracy"]

    def save_tokenizers(self, directory):
        (directory / "counting.txt").write_text("numbers\n", encoding="utf-8")


@pytest.fixture
def counting(monkeypatch):
    task_names()  # the built-in tasks are registered first
    monkeypatch.setattr(task_module, "TASKS", dict(task_module.TASKS))  # the registry is left as it was
    return register_task("counting")(CountingTask)


def test_a_task_defined_outside_the_package_trains_with_the_unchanged_trainer(counting, tmp_path):
    assert "counting" in task_names() and get_task("counting") is CountingTask
    overrides = ["task=counting", f"out_dir={tmp_path / 'run'}", "max_steps=60", "eval_every=30",
                 "schedule=constant", "lr=0.01", "warmup=5", "progress=false", "label_smoothing=0.0",
                 "model.d_model=16", "model.n_heads=2", "model.d_ff=32", "model.n_layers=1",
                 "model.dropout=0.0"]  # fmt: skip
    result = Trainer(load_recipe(None, overrides)).fit()
    assert result["step"] == 60
    valid = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    valid = [v for v in valid if v["split"] == "valid"]
    assert [v["step"] for v in valid] == [30, 60] and valid[-1]["accuracy"] > 0.9, valid
    best = tmp_path / "run" / "best"
    assert (best / "counting.txt").is_file()
    assert json.loads((best / "config.json").read_text())["task"] == "counting"
    assert load_model(tmp_path / "run").config.vocab_size == VOCAB


def test_an_unknown_task_names_the_registered_ones():
    known = r"\('classify', 'clm', 'lm', 'mlm', 'rtd', 'translation'\)"
    with pytest.raises(ValueError, match=rf"task='nope' is not one of {known}"):
        load_recipe(None, ["task=nope"])


def test_a_task_checks_its_model_config_before_any_work(counting):
    with pytest.raises(ValueError, match="n_layers"):
        load_recipe(None, ["task=counting", "model.n_layers=0"])
    with pytest.raises(ValueError, match="already registered"):
        register_task("counting")(type("Other", (CountingTask,), {}))


def test_a_subword_language_model_reads_its_text_as_the_vocabulary_was_trained(tmp_path):
    """The stream (``encode_text``) has no "▁" before a line's first word, and neither has the
    vocabulary trained on those lines: a line reads the same alone (a prompt) and inside the text."""
    from aiayn.data import load_tokenizer

    overrides = ["task=lm", "dataset=shakespeare", "tokenizer=bpe", "vocab_size=500", "max_steps=1",
                 "model.d_model=32", "model.n_heads=2", "model.d_ff=64", "model.n_layers=1", "block_size=16",
                 "batch_size=2", "schedule=constant", "warmup=0", "progress=false", "threads=1",
                 f"out_dir={tmp_path / 'run'}"]  # fmt: skip
    Trainer(load_recipe(None, overrides)).fit()
    tok = load_tokenizer(tmp_path / "run" / "tokenizer")
    a, b = "First Citizen:", "Before we proceed any further, hear me speak."
    assert tok.encode(f"{a}\n{b}") == tok.encode(a) + tok.encode("\n") + tok.encode(
        b
    )  # a prompt as the stream
    assert not tok.sp.id_to_piece(tok.encode(b)[0]).startswith("\u2581")
    meta = json.loads((tmp_path / "run" / "best" / "config.json").read_text())
    assert meta["untrained_ids"] == sorted({tok.bos_id, tok.unk_id, tok.eos_id})  # not in the text stream
