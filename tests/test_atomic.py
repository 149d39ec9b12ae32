"""aiayn.atomic and aiayn.temporaries: short temporary names, directory replace that is whole at
every instant, and the recovery of what a killed writer left (its PID is in the temporary's name)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from aiayn import atomic, outputs, temporaries
from aiayn.errors import OutputError


@pytest.fixture(scope="module")
def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _dir(path: Path, content: str) -> Path:
    path.mkdir()
    (path / "f").write_text(content)
    return path


def test_temporary_names_fit_any_legal_name(tmp_path):
    tmp = temporaries.temporary_name(tmp_path / ("n" * 255))
    assert len(tmp.name) <= 255 and f"-{os.getpid()}-" in tmp.name and tmp.parent == tmp_path
    atomic.write_text(tmp_path / ("n" * 255), "ok")
    assert (tmp_path / ("n" * 255)).read_text() == "ok"


def test_recover_removes_the_temporaries_of_dead_writers_only(tmp_path, dead_pid):
    dead = _dir(tmp_path / f".tmp-x-{dead_pid}-0123abcd", "dead")
    mine = _dir(tmp_path / f".tmp-x-{os.getpid()}-0123abcd", "mine")
    parent = _dir(tmp_path / f".tmp-x-{os.getppid()}-0123abcd", "alive")
    (tmp_path / f".tmp-y-{dead_pid}-89abcdef").write_text("a torn file")
    temporaries.recover(tmp_path)
    assert not dead.exists() and mine.exists() and parent.exists()
    assert not (tmp_path / f".tmp-y-{dead_pid}-89abcdef").exists()


def test_recover_completes_a_two_step_replace_killed_between_its_renames(tmp_path, dead_pid):
    base = f".tmp-out-{dead_pid}-0123abcd"
    _dir(tmp_path / base, "new")
    _dir(tmp_path / (base + ".old"), "old")
    (tmp_path / (base + ".replace")).write_text(json.dumps({"target": "out", "new": base}))
    temporaries.recover(tmp_path)
    assert (tmp_path / "out" / "f").read_text() == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_recover_leaves_the_target_when_the_journal_is_torn(tmp_path, dead_pid):
    base = f".tmp-out-{dead_pid}-0123abcd"
    _dir(tmp_path / "out", "old")
    _dir(tmp_path / base, "new")
    (tmp_path / (base + ".replace")).write_text('{"target": "ou')
    temporaries.recover(tmp_path)
    assert (tmp_path / "out" / "f").read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2", "two-step"])
def test_atomic_dir_replaces_a_directory_whole(tmp_path, monkeypatch, exchange):
    if not exchange:
        monkeypatch.setattr(atomic, "_renameat2", lambda: None)
    _dir(tmp_path / "out", "old")
    with atomic.atomic_dir(tmp_path / "out") as tmp:
        (tmp / "g").write_text("new")
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["g"]
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_a_link_to_a_directory_is_itself_replaced(tmp_path):
    """As a run's ``best`` link is moved from one checkpoint to the next."""
    _dir(tmp_path / "a", "a")
    _dir(tmp_path / "b", "b")
    (tmp_path / "best").symlink_to("a")
    with atomic.atomic_path(tmp_path / "best") as tmp:
        tmp.symlink_to("b")
    assert os.readlink(tmp_path / "best") == "b" and (tmp_path / "a" / "f").read_text() == "a"


def test_outputs_that_are_not_files(tmp_path):
    assert atomic.output_target("/dev/null") == (Path("/dev/null"), True)
    with pytest.raises(OutputError, match="is a directory"):
        atomic.output_target(tmp_path)
    (tmp_path / "real").write_text("x")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert atomic.output_target(tmp_path / "link") == ((tmp_path / "real").resolve(), False)


def test_a_folder_that_takes_no_file_is_refused_before_the_work(tmp_path, monkeypatch):
    def refuse(path, *args):  # a read-only or immutable folder (chmod does not stop root; this does)
        raise PermissionError(1, "Operation not permitted", str(path))

    monkeypatch.setattr(atomic.os, "open", refuse)
    with pytest.raises(
        OutputError, match=r"--json .*out/o.json: cannot write in .*out \(Operation not permitted\)"
    ):
        (tmp_path / "out").mkdir()
        outputs.check_output(tmp_path / "out" / "o.json", option="--json")


def test_a_failed_write_names_the_output_not_its_temporary(tmp_path):
    target = tmp_path / "o.txt"
    failing = pytest.raises(OutputError, match=r"cannot write .*o\.txt: Operation not permitted")
    with failing as e, atomic.atomic_path(target) as tmp:
        raise PermissionError(1, "Operation not permitted", str(tmp))
    assert ".tmp-" not in str(e.value) and not list(tmp_path.iterdir())


def test_a_full_standard_output_is_one_error(monkeypatch):
    class Full:
        def write(self, data):
            return len(data)

        def flush(self):
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(atomic.sys, "stdout", type("Out", (), {"buffer": Full()})())
    full = pytest.raises(OutputError, match="cannot write to standard output: No space left on device")
    with full, atomic.open_output(None) as f:
        f.write(b"x\n")


def test_dev_stdout_appended_to_a_file_is_written_into_not_replaced(tmp_path):
    log = tmp_path / "log.txt"
    log.write_text("a\n", encoding="utf-8")
    code = "from aiayn.atomic import write_text; write_text('/dev/stdout', 'b\\n')"
    with open(log, "a") as out:
        subprocess.run([sys.executable, "-c", code], stdout=out, check=True)
    assert log.read_text(encoding="utf-8") == "a\nb\n"  # renamed over, it held b alone


@pytest.mark.parametrize(
    "plan",
    [
        {"target": "../outside", "new": "{base}"},  # the target out of the folder
        {"target": "out", "new": "../victim"},  # the new directory from out of it
        {"target": "{tmp}/absolute-target", "new": "{base}"},  # an absolute path
        {"target": "out", "new": ".tmp-other-{dead}-89abcdef"},  # not the journal's own temporary
    ],
)
def test_a_planted_journal_moves_nothing_from_or_to_another_folder(tmp_path, dead_pid, plan):
    folder, base = tmp_path / "run", f".tmp-out-{dead_pid}-0123abcd"
    folder.mkdir()
    victim = _dir(tmp_path / "victim", "precious")
    _dir(folder / base, "new")
    _dir(folder / f".tmp-other-{dead_pid}-89abcdef", "another's")  # a temporary a journal could name
    plan = {k: v.format(base=base, tmp=tmp_path, dead=dead_pid) for k, v in plan.items()}
    (folder / (base + ".replace")).write_text(json.dumps(plan))
    temporaries.recover(folder)
    assert (victim / "f").read_text() == "precious"
    assert not (tmp_path / "outside").exists() and not (tmp_path / "absolute-target").exists()
    assert not (folder / "out").exists()  # a journal that replace_dir could not have written: ignored


def test_a_written_file_gets_the_mode_of_a_new_file_not_its_writers(tmp_path):
    """safetensors creates its files 0o600: a model's weights were unreadable where its config was not."""
    old = os.umask(0o022)
    try:
        with atomic.atomic_path(tmp_path / "w.bin") as tmp:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT, 0o600)
            os.close(fd)
    finally:
        os.umask(old)
    assert (tmp_path / "w.bin").stat().st_mode & 0o777 == 0o644


def test_a_marian_export_with_two_vocabularies_holds_a_model(tmp_path):
    """``aiayn export --force`` refused to replace its own export of separate vocabularies: its
    target_vocab.json was a file no model holds."""
    from aiayn.outputs import holds_model

    names = ["config.json", "model.safetensors", "generation_config.json", "source.spm", "target.spm",
             "vocab.json", "target_vocab.json", "tokenizer_config.json"]  # fmt: skip
    for name in names:
        (tmp_path / name).write_text("{}")
    assert holds_model(tmp_path)
    (tmp_path / "notes.txt").write_text("mine")
    assert not holds_model(tmp_path)


def test_a_run_holds_a_model_with_its_folders_and_a_project_does_not(tmp_path):
    """A run with its subword samples, a killed run's lock, tensorboard events and checkpoints holds a
    model (--force may replace it); a project whose config.json and src/ only share a model's names
    does not (--force replaced it)."""
    from aiayn.outputs import holds_model

    run = tmp_path / "run"
    names = ["train_config.json", "metrics.jsonl", ".train.lock", "subword/segmentation-0.npz",
             "tensorboard/events.out", "tokenizer/src/spm.model", "tokenizer/src/tokenizer.json",
             "step-000010/config.json", "step-000010/model.safetensors",
             "step-000010/src/spm.model"]  # fmt: skip
    for name in names:
        (run / name).parent.mkdir(parents=True, exist_ok=True)
        (run / name).write_text("x")
    assert holds_model(run)
    (run / "step-000010" / "notes.txt").write_text("mine")  # inside a checkpoint: not a model's
    assert not holds_model(run)
    project = tmp_path / "project"
    (project / "src").mkdir(parents=True)
    (project / "config.json").write_text('{"kind": "transformer", "config": {}}')
    (project / "src" / "main.c").write_text("int x;")
    assert not holds_model(project)
    (project / "src" / "main.c").unlink()
    (project / "config.json").write_text('{"name": "a project"}')  # any JSON is no model's config
    assert not holds_model(project)
    (project / "config.json").write_text('{"model_type": "marian"}')
    assert holds_model(project)
