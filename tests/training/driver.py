"""``aiayn train`` in a child process with test-only instrumentation, patched in from here so that
production code carries no test hooks.

    python tests/training/driver.py [--dump-params DIR] [--pause-checkpoint STEP:SECONDS]
                                    [--pid-dir DIR] [--fast-clock RANK:FACTOR] -- ARGS…

``--dump-params`` saves each rank's final parameters, step and batch size (max_tokens) as
DIR/rank{R}.safetensors (DDP tests compare ranks); ``--pause-checkpoint`` sleeps once checkpoint
STEP is fully written but not yet renamed into place, so that a test can kill the process
mid-write; ``--pid-dir`` writes each rank's process id to DIR/rank{R}.pid (to signal one rank);
``--fast-clock`` makes rank RANK's training clock run FACTOR times too fast (ranks that disagree
about the time budget); ``--short-on RANK`` makes rank RANK alone find its budget too short for its
batches (``short_budget``).
"""

import argparse
import os
import sys
import time
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from aiayn.cli.main import main  # noqa: E402
from aiayn.training import budget, checkpoint, trainer  # noqa: E402


def dump_params(folder: str) -> None:
    from safetensors.torch import save_model

    real_fit = trainer.Trainer.fit

    def fit(self):
        result = real_fit(self)
        path = Path(folder) / f"rank{self.dist.rank}.safetensors"
        save_model(
            self.model, str(path), metadata={"step": str(self.step), "max_tokens": str(self.max_tokens)}
        )
        return result

    trainer.Trainer.fit = fit


def pause_checkpoint(spec: str) -> None:
    step, seconds = spec.split(":")
    real_write_json = checkpoint.write_json

    def write_json(path, data):
        real_write_json(path, data)
        if Path(path).name == checkpoint.STATE_JSON and data.get("step") == int(step):
            time.sleep(float(seconds))

    checkpoint.write_json = write_json


def write_pid(folder: str) -> None:
    real_init = trainer.Trainer.__init__

    def init(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        (Path(folder) / f"rank{self.dist.rank}.pid").write_text(str(os.getpid()))

    trainer.Trainer.__init__ = init


def fast_clock(spec: str) -> None:
    rank, factor = spec.split(":")
    if os.environ.get("RANK", "0") == rank:
        real = time.perf_counter
        trainer.time = types.SimpleNamespace(perf_counter=lambda: float(factor) * real())


def short_on(rank: str) -> None:
    if os.environ.get("RANK", "0") == rank:
        budget.budget_too_short = lambda cfg, max_tokens, reachable: True


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--dump-params")
    parser.add_argument("--pause-checkpoint")
    parser.add_argument("--pid-dir")
    parser.add_argument("--fast-clock")
    parser.add_argument("--short-on")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    opts = parser.parse_args()
    if opts.dump_params:
        dump_params(opts.dump_params)
    if opts.pause_checkpoint:
        pause_checkpoint(opts.pause_checkpoint)
    if opts.pid_dir:
        write_pid(opts.pid_dir)
    if opts.fast_clock:
        fast_clock(opts.fast_clock)
    if opts.short_on:
        short_on(opts.short_on)
    args = opts.args[1:] if opts.args[:1] == ["--"] else opts.args
    sys.exit(main(["train", *args]))
