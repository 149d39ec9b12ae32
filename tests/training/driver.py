"""``aiayn train`` in a child process with test-only instrumentation, patched in from here so that
production code carries no test hooks.

    python tests/training/driver.py [--dump-params DIR] [--pause-checkpoint STEP:SECONDS] -- ARGS…

``--dump-params`` saves each rank's final parameters as DIR/rank{R}.safetensors (DDP tests compare
ranks); ``--pause-checkpoint`` sleeps once checkpoint STEP is fully written but not yet renamed
into place, so that a test can kill the process mid-write.
"""

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from aiayn.cli.main import main  # noqa: E402
from aiayn.training import checkpoint, trainer  # noqa: E402


def dump_params(folder: str) -> None:
    from safetensors.torch import save_model

    real_fit = trainer.Trainer.fit

    def fit(self):
        result = real_fit(self)
        save_model(self.model, str(Path(folder) / f"rank{self.dist.rank}.safetensors"))
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


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--dump-params")
    parser.add_argument("--pause-checkpoint")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    opts = parser.parse_args()
    if opts.dump_params:
        dump_params(opts.dump_params)
    if opts.pause_checkpoint:
        pause_checkpoint(opts.pause_checkpoint)
    args = opts.args[1:] if opts.args[:1] == ["--"] else opts.args
    sys.exit(main(["train", *args]))
