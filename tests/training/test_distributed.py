"""torchrun with 2 CPU processes (gloo): ranks stay identical and match one process that
accumulates the same global batch (update_freq=2)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.helpers import assert_close
from tests.training.conftest import tiny_args

ROOT = Path(__file__).resolve().parents[2]
DRIVER = str(ROOT / "tests" / "training" / "driver.py")


@pytest.mark.slow
def test_two_process_ddp_matches_single_process_with_the_same_global_batch(corpus, tmp_path):
    env = {**os.environ, "AIAYN_CACHE_DIR": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    common = ["max_steps=6", "eval_every=6", "model.dropout=0.0", "device=cpu"]
    ddp_dump, single_dump = tmp_path / "ddp", tmp_path / "single"
    ddp_dump.mkdir(), single_dump.mkdir()
    ddp = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_port=29533",
         DRIVER, "--dump-params", str(ddp_dump), "--", *tiny_args(corpus, tmp_path / "ddp_run", *common)],
        cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    single = subprocess.run(
        [sys.executable, DRIVER, "--dump-params", str(single_dump), "--",
         *tiny_args(corpus, tmp_path / "single_run", *common), "update_freq=2"],
        cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert single.returncode == 0, single.stderr[-3000:]

    rank0, rank1 = (
        load_file(str(ddp_dump / "rank0.safetensors")),
        load_file(str(ddp_dump / "rank1.safetensors")),
    )
    reference = load_file(str(single_dump / "rank0.safetensors"))
    assert rank0.keys() == rank1.keys() == reference.keys()
    for name in rank0:
        assert torch.equal(rank0[name], rank1[name]), f"{name} differs across ranks"
        assert_close("DDP (2 ranks) vs 1 process with update_freq=2", rank0[name], reference[name])
    assert (tmp_path / "ddp_run" / "step-000006").is_dir() and (
        tmp_path / "single_run" / "step-000006"
    ).is_dir()
