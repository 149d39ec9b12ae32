"""torchrun with 2 CPU processes (gloo): ranks stay identical and match one process that
accumulates the same global batch (update_freq=2); every decision to stop is taken by both ranks
at the same step (a time budget, a signal to one rank)."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from aiayn.models.io import load_model
from tests.helpers import assert_close
from tests.training.conftest import tiny_args

ROOT = Path(__file__).resolve().parents[2]
DRIVER = str(ROOT / "tests" / "training" / "driver.py")


@pytest.mark.slow
def test_two_process_ddp_matches_single_process_with_the_same_global_batch(corpus, tmp_path):
    ddp_matches_single(corpus, tmp_path, [])


@pytest.mark.slow
def test_ddp_on_a_cached_right_to_left_memory_matches_single_process(corpus, tmp_path, monkeypatch):
    """The bidirectional model on cached translations: rank 0 makes the cache, rank 1 reads it, and
    the two ranks train as one process would."""
    from aiayn.cli.main import main

    monkeypatch.setenv("AIAYN_CACHE_DIR", str(tmp_path / "cache"))
    r2l = tmp_path / "r2l"
    assert main(["train", *tiny_args(corpus, r2l, "reverse_target=true", "max_steps=3", "eval_every=3")]) == 0
    ddp_matches_single(
        corpus, tmp_path, ["model.bidirectional=true", "r2l_memory_from=cache", f"r2l_model={r2l}"]
    )


@pytest.mark.slow
@pytest.mark.parametrize("extra", [[], ["adversarial=1.0"]])
def test_ddp_trains_a_classifier_whose_vocabulary_head_the_loss_never_reaches(corpus, tmp_path, extra):
    """BERT's head transform and output bias (recipes/imdb-mlm.toml's encoder) stay in a classifier
    for fill-mask and export; DDP waited for their gradients, which never came, and stopped. With
    ``adversarial`` the loss takes a gradient to the embeddings inside DDP's forward, and each text's
    step is its own, so the shards still add up to the single process's batch."""
    table = ["sentence\tlabel"] + [
        f"{line}\t{'dog' if 'hund' in line.split() else 'other'}"
        for line in (corpus / "train.de").read_text(encoding="utf-8").splitlines()
    ]
    (corpus / "labelled.tsv").write_text("\n".join(table) + "\n", encoding="utf-8")

    def classify_args(_, out_dir, *extra):
        return [f"dataset={corpus / 'labelled.tsv'}", f"out_dir={out_dir}", "task=classify", "vocab_size=300",
                "max_tokens=256", "model.d_model=32", "model.n_heads=2", "model.d_ff=64", "model.n_layers=1",
                "model.head_transform=true", "model.output_bias=true", "schedule=constant", "lr=0.003",
                "warmup=5", "log_every=1", "progress=false", "threads=1", *extra]  # fmt: skip

    ddp_matches_single(corpus, tmp_path, extra, classify_args)


def ddp_matches_single(corpus, tmp_path, extra: list[str], args=tiny_args) -> None:
    env = {**os.environ, "AIAYN_CACHE_DIR": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    common = ["max_steps=6", "eval_every=6", "model.dropout=0.0", "device=cpu", *extra]
    ddp_dump, single_dump = tmp_path / "ddp", tmp_path / "single"
    ddp_dump.mkdir(), single_dump.mkdir()
    ddp = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_port=29533",
         DRIVER, "--dump-params", str(ddp_dump), "--", *args(corpus, tmp_path / "ddp_run", *common)],
        cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    single = subprocess.run(
        [sys.executable, DRIVER, "--dump-params", str(single_dump), "--",
         *args(corpus, tmp_path / "single_run", *common), "update_freq=2"],
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


def _torchrun(corpus, tmp_path, port: int, driver_options: list[str], *overrides: str) -> subprocess.Popen:
    env = {**os.environ, "AIAYN_CACHE_DIR": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    args = tiny_args(corpus, tmp_path / "run", "device=cpu", "model.dropout=0.0", *overrides)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={port}",
           DRIVER, *driver_options, "--", *args]  # fmt: skip
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)  # fmt: skip


def _finish(proc: subprocess.Popen, pids: Path, timeout: float = 180, status: int = 0) -> str:
    """Wait for torchrun (and its exit ``status``); ranks that hang are killed (torchrun starts each in
    a session of its own, so by the process ids they wrote to ``pids``) and the test fails."""
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        for pid_file in pids.glob("rank*.pid"):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
        os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
        pytest.fail(f"the two ranks hung (killed after {timeout} s):\n{err[-3000:]}")
    assert proc.returncode == status, err[-3000:]
    return err


def _same_final_state(dump: Path, run: Path) -> int:
    """Both ranks ended at one step with identical weights, and that step's checkpoint loads."""
    ranks = [safe_open(str(dump / f"rank{r}.safetensors"), "pt") for r in (0, 1)]
    steps = {int(f.metadata()["step"]) for f in ranks}
    assert len(steps) == 1, f"the ranks stopped at different steps: {steps}"
    rank0, rank1 = (load_file(str(dump / f"rank{r}.safetensors")) for r in (0, 1))
    assert all(torch.equal(rank0[k], rank1[k]) for k in rank0)
    (step,) = steps
    assert load_model(run / f"step-{step:06d}").config.d_model == 32
    return step


@pytest.mark.slow
def test_a_time_budget_stops_both_ranks_at_the_same_step(corpus, tmp_path):
    """Rank 1's clock runs 50× fast: alone it would leave the loop at once while rank 0 went on into
    the next all-reduce and both waited forever. Rank 0's clock decides for both."""
    dump, pids = tmp_path / "dump", tmp_path / "pids"
    dump.mkdir(), pids.mkdir()
    options = ["--dump-params", str(dump), "--pid-dir", str(pids), "--fast-clock", "1:50"]
    proc = _torchrun(
        corpus, tmp_path, 29541, options, "max_steps=100000", "eval_every=100000", "max_minutes=0.01"
    )
    err = _finish(proc, pids)
    assert "(max_minutes)" in err
    assert _same_final_state(dump, tmp_path / "run") > 1


@pytest.mark.slow
def test_sigterm_to_one_rank_stops_both_cleanly(corpus, tmp_path):
    dump, pids, run = tmp_path / "dump", tmp_path / "pids", tmp_path / "run"
    dump.mkdir(), pids.mkdir()
    options = ["--dump-params", str(dump), "--pid-dir", str(pids)]
    proc = _torchrun(corpus, tmp_path, 29542, options, "max_steps=100000", "eval_every=100000")
    deadline = time.time() + 120
    while not (run / "metrics.jsonl").exists() or len((run / "metrics.jsonl").read_text().splitlines()) < 5:
        assert proc.poll() is None and time.time() < deadline, "the run did not start"
        time.sleep(0.1)
    os.kill(int((pids / "rank1.pid").read_text()), signal.SIGTERM)  # rank 1 only
    err = _finish(proc, pids, status=1)  # both ranks exit 143 (stopped, not finished): torchrun fails
    assert "(SIGTERM)" in err and "exitcode  : 143" in err
    assert _same_final_state(dump, run) >= 5


@pytest.mark.slow
@pytest.mark.parametrize(("short_on", "halved", "port"), [("0", True, 29545), ("1", False, 29546)])
def test_rank_0_decides_whether_every_rank_halves_its_batches(corpus, tmp_path, short_on, halved, port):
    """short_budget: one rank alone finds the budget too short at update 20; the ranks follow rank 0,
    both halving or neither, and stay identical."""
    dump, pids = tmp_path / "dump", tmp_path / "pids"
    dump.mkdir(), pids.mkdir()
    options = ["--dump-params", str(dump), "--pid-dir", str(pids), "--short-on", short_on]
    budget = ["max_minutes=60", "max_tokens=2048", "short_budget=halve_max_tokens"]
    proc = _torchrun(corpus, tmp_path, port, options, "max_steps=30", "eval_every=100000", *budget)
    err = _finish(proc, pids)
    assert ("on with max_tokens=1024" in err) == halved
    sizes = {safe_open(str(dump / f"rank{r}.safetensors"), "pt").metadata()["max_tokens"] for r in (0, 1)}
    assert sizes == {"1024" if halved else "2048"}
    assert _same_final_state(dump, tmp_path / "run") == 30


@pytest.mark.slow
@pytest.mark.parametrize(("precision", "port"), [("bf16", 29543), ("auto", 29544)])
def test_ranks_train_in_one_precision_and_stay_identical(corpus, tmp_path, precision, port):
    """bf16 autocast under DistributedDataParallel keeps the ranks identical; with ``auto`` rank 0's
    measurement decides for both, and only rank 0 reports it."""
    dump, pids = tmp_path / "dump", tmp_path / "pids"
    dump.mkdir(), pids.mkdir()
    options = ["--dump-params", str(dump), "--pid-dir", str(pids)]
    proc = _torchrun(corpus, tmp_path, port, options, "max_steps=4", "eval_every=4", f"precision={precision}")
    err = _finish(proc, pids)
    assert err.count("precision=auto chose") == (precision == "auto"), err[-3000:]
    assert _same_final_state(dump, tmp_path / "run") == 4


def _losses(run: Path) -> dict[int, float]:
    records = map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
    return {r["step"]: r["loss"] for r in records if r["split"] == "train"}


@pytest.mark.slow
def test_a_resumed_torchrun_run_is_bit_exact_with_dropout(corpus, tmp_path):
    """Every rank's random state is in the checkpoint: rank 1's dropout masks after ``--resume`` are
    the ones it would have drawn, so losses and weights equal those of a run that never stopped (a
    rank that reseeded on resume drew other masks from the first update after it)."""
    dropout, pids = ["model.dropout=0.3", "eval_every=3"], tmp_path / "pids"
    ref, stopped = tmp_path / "ref", tmp_path / "stopped"
    for folder in (ref / "dump", stopped / "dump", pids):
        folder.mkdir(parents=True)
    options = ["--dump-params", str(ref / "dump")]
    _finish(_torchrun(corpus, ref, 29547, options, "max_steps=6", *dropout), pids)
    _finish(_torchrun(corpus, stopped, 29548, [], "max_steps=3", *dropout), pids)
    options = ["--dump-params", str(stopped / "dump")]
    _finish(_torchrun(corpus, stopped, 29549, options, "max_steps=6", *dropout, "--resume"), pids)
    losses = _losses(ref / "run")
    assert _losses(stopped / "run") == losses and sorted(losses) == [1, 2, 3, 4, 5, 6]
    resumed, reference = (load_file(str(d / "dump" / "rank1.safetensors")) for d in (stopped, ref))
    assert all(torch.equal(resumed[k], reference[k]) for k in reference)


def test_shutdown_meets_at_a_barrier_and_releases_the_gil_before_destroying_the_group(monkeypatch):
    """gloo's worker thread drops its last collective under the GIL, and destroying the group joins
    that thread while holding it: the group may only go after a barrier and a sleep (py-spy showed
    the deadlock in the 2-process tests above). Recorded with the calls replaced."""
    from aiayn.training import distributed

    calls = []
    monkeypatch.setattr(distributed.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(distributed.dist, "barrier", lambda: calls.append("barrier"))
    monkeypatch.setattr(distributed.time, "sleep", lambda s: calls.append(("sleep", s)))
    monkeypatch.setattr(distributed.dist, "destroy_process_group", lambda: calls.append("destroy"))
    distributed.shutdown(distributed.DistInfo(rank=1, local_rank=1, world_size=2))
    assert calls == ["barrier", ("sleep", distributed.GLOO_DRAIN_S), "destroy"]
    assert distributed.GLOO_DRAIN_S >= 0.01
    calls.clear()
    distributed.shutdown(distributed.DistInfo())  # one process: nothing to tear down
    assert calls == []


@pytest.mark.parametrize(
    "name, device",
    [("cuda:0", torch.device("cuda", 0)), ("cuda:1", torch.device("cuda", 1)), ("mps", torch.device("mps"))],
)
def test_a_device_the_processes_cannot_share_is_refused_before_any_joins(name, device, monkeypatch):
    """Under torchrun ``device=cuda:N`` put every process on GPU N (NCCL then fails or hangs on its first
    collective) and MPS has no backend: one line, before ``init_process_group``; ``cuda`` and ``cpu`` pass."""
    from aiayn.errors import ConfigError
    from aiayn.training import distributed

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    joined = []
    monkeypatch.setattr(distributed.dist, "is_initialized", lambda: False)

    def join(backend, timeout):
        joined.append((backend, timeout.total_seconds()))

    monkeypatch.setattr(distributed.dist, "init_process_group", join)
    with pytest.raises(ConfigError, match=rf"device='{name}' under torchrun: give device=cuda \(each"):
        distributed.init_distributed(device, name)
    assert joined == []
    assert distributed.init_distributed(torch.device("cuda", 1), "cuda").rank == 1  # its LOCAL_RANK's GPU
    distributed.init_distributed(torch.device("cpu"), "cpu", timeout=7200)
    assert joined == [("nccl", 1800), ("gloo", 7200)]  # ddp_timeout's default: not NCCL's 10 minutes


@pytest.mark.parametrize("value", ["0", "-5", "nan", "1e300"])
def test_a_timeout_that_cannot_wait_is_refused_by_name(value):
    from aiayn.errors import ConfigError
    from aiayn.training.recipe import load_recipe

    with pytest.raises(ConfigError, match=r"ddp_timeout"):
        load_recipe(None, [f"ddp_timeout={value}"])
    assert load_recipe(None, ["ddp_timeout=7200"]).ddp_timeout == 7200
