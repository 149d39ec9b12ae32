"""One run per ``out_dir``: rank 0 holds a lock on the run directory while it trains.

A second ``aiayn train`` on the same directory stops with one line naming the first one's PID (it
used to train on, interleaving its metrics and checkpoints with the first one's); a lock of a process
killed with SIGKILL is no obstacle, since the OS drops it when the holder dies.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from aiayn.errors import OutputError
from aiayn.training.rundir import LOCK, RunLock
from tests.training.conftest import tiny_args


def _aiayn(*args: str) -> list[str]:
    return [sys.executable, "-m", "aiayn", *args]


def _wait_for(predicate, proc: subprocess.Popen, timeout: float = 240.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc.poll() is not None:
            pytest.fail(f"the first run ended early (rc {proc.returncode}): {proc.stderr.read()}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail("the first run logged no update in time")
        time.sleep(0.2)


@pytest.mark.slow
def test_a_second_run_on_the_same_out_dir_is_refused_and_a_killed_runs_lock_is_recovered(corpus, tmp_path):
    run = tmp_path / "run"
    env = {**os.environ, "AIAYN_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": str(Path.cwd())}
    args = tiny_args(corpus, run, "eval_every=100000")
    first = subprocess.Popen(
        _aiayn("train", *args, "max_steps=100000"), env=env, stderr=subprocess.PIPE, text=True
    )
    try:
        _wait_for(lambda: (run / "metrics.jsonl").is_file() and (run / "metrics.jsonl").stat().st_size, first)
        second = subprocess.run(
            _aiayn("train", *args, "max_steps=5"), env=env, capture_output=True, text=True
        )
        assert second.returncode == 1, second.stderr
        lines = second.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("aiayn train: error:"), second.stderr
        assert f"PID {first.pid}" in lines[0] and "another out_dir" in lines[0]
        assert first.poll() is None  # the first run trains on, untouched
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
        first.stderr.close()
    assert (run / LOCK).read_text().strip() == str(first.pid)  # the dead run's lock file stays behind
    assert not any(run.glob("step-*"))  # killed before its first checkpoint: a new run starts it again
    again = subprocess.run(_aiayn("train", *args, "max_steps=5"), env=env, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr
    assert "starting it again" in again.stderr
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["split"] == "train"] == [1, 2, 3, 4, 5]
    assert not (run / LOCK).exists()  # a run that ended frees its directory


def test_the_lock_names_its_holder_and_is_free_again_after_release(tmp_path):
    run = tmp_path / "run"
    held = RunLock(run, str(run))
    with pytest.raises(OutputError, match=rf"in use by another training \(PID {os.getpid()}, lock "):
        RunLock(run, str(run))
    held.release()
    assert not (run / LOCK).exists()
    again = RunLock(run, str(run))  # the file may be removed and made again while others wait on it
    assert (run / LOCK).read_text().strip() == str(os.getpid())
    again.release()


def test_a_run_that_cannot_start_leaves_no_lock_file_in_someone_elses_folder(corpus, tmp_path):
    from aiayn.cli.main import main

    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "todo.txt").write_text("mine\n", encoding="utf-8")
    assert main(["train", *tiny_args(corpus, folder, "max_steps=1")]) == 1
    assert sorted(p.name for p in folder.iterdir()) == ["todo.txt"]
    assert main(["train", *tiny_args(corpus, tmp_path / "new" / "run", "max_steps=1"), "--resume"]) == 1
    assert not (tmp_path / "new").exists()  # every folder it made is removed again


@pytest.mark.slow
def test_under_torchrun_a_held_lock_stops_every_rank_without_a_hang(corpus, tmp_path):
    """Rank 0 alone takes the lock; when it cannot, the other ranks learn it and stop too."""
    run = tmp_path / "run"
    held = RunLock(run, str(run))
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "AIAYN_CACHE_DIR": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_port=29561",
           str(root / "tests" / "training" / "driver.py"), "--",
           *tiny_args(corpus, run, "device=cpu", "max_steps=3")]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)  # fmt: skip
    try:
        _, err = proc.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
        pytest.fail(f"the ranks hung:\n{err[-3000:]}")
    finally:
        held.release()
    assert proc.returncode != 0
    assert f"is in use by another training (PID {os.getpid()}" in err
    assert "rank 0 could not lock the run directory" in err
    assert not any(run.glob("step-*"))


def test_a_lock_planted_as_a_link_is_refused_and_its_target_untouched(tmp_path):
    """The lock is truncated and written: through a planted link it overwrote any file."""
    run, victim = tmp_path / "run", tmp_path / "victim.txt"
    run.mkdir()
    victim.write_text("precious data")
    (run / LOCK).symlink_to(victim)
    with pytest.raises(OutputError, match="symbolic link"):
        RunLock(run, str(run))
    assert victim.read_text() == "precious data" and (run / LOCK).is_symlink()


def test_a_run_that_cannot_start_removes_no_other_runs_folder_inside_the_parent_it_made(
    corpus, tmp_path, monkeypatch, capsys
):
    """``out_dir=sweep/a`` makes ``sweep/``; a run started meanwhile in ``sweep/b`` lives there. When
    the first run then fails to start, it removes ``sweep/a`` and keeps ``sweep/`` with ``sweep/b``."""
    from aiayn.cli.main import main
    from aiayn.training import trainer

    other = tmp_path / "sweep" / "b"

    def meanwhile(*args, **kwargs):  # the other run starts, then this one's setup fails
        other.mkdir()
        (other / "train_config.json").write_text("{}\n", encoding="utf-8")
        raise OutputError("setup failed")

    monkeypatch.setattr(trainer, "plan_run_dir", meanwhile)
    assert main(["train", *tiny_args(corpus, tmp_path / "sweep" / "a", "max_steps=1")]) == 1
    assert "setup failed" in capsys.readouterr().err
    assert sorted(p.name for p in (tmp_path / "sweep").iterdir()) == ["b"]
    assert sorted(p.name for p in other.iterdir()) == ["train_config.json"]
    (other / "train_config.json").unlink()
    lock = RunLock(tmp_path / "new" / "run", "new/run")  # alone: every folder it made goes
    lock.remove_made()
    lock.release()
    assert not (tmp_path / "new").exists()
