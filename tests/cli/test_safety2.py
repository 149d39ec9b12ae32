"""Hardening, round 2 (issue 57): every path a command reads is protected, outputs never replace
what is not a regular file, directories are replaced whole under SIGKILL, inputs are streamed,
and a full disk is one line.

The workspace and the "one line, nothing changed" check are test_safety's; the SIGKILL cases run
the command in a child process that kills itself at each step of the replace (a hook installed by
the child script, never by the package).
"""

# ruff: noqa: F811 -- the workspace fixtures are test_safety's

from __future__ import annotations

import argparse
import errno
import hashlib
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from safetensors import SafetensorError, safe_open

from aiayn.cli import decode_options
from aiayn.cli.main import main
from tests.cli.test_safety import DE, TR, originals, refused, snapshot, ws  # noqa: F401 -- fixtures

M2 = "run/step-000002"  # a second model directory of the workspace
EV = ["evaluate", "--model", "model", "--src", "in.txt", "--ref", "ref.txt"]


def _socket(ws: Path) -> None:
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(ws / "sock"))
    s.close()


CASES = [
    ("ensemble-output-onto-the-second-model", None,
     [*TR, "--ensemble-with", M2, "--output", f"{M2}/config.json"], "an input of this command"),
    ("rerank-output-into-the-scorer", None,
     [*TR, "--beam", "2", "--rerank-with", M2, "--output", f"{M2}/tokenizer.json"], "an input of this"),
    ("evaluate-json-onto-an-ensemble-member", None,
     [*EV, "--ensemble-with", M2, "--json", f"{M2}/model.safetensors"], "an input of this command"),
    ("output-onto-a-file-of-a-run-given-as-model", None,
     ["translate", "--model", "run", "--input", "in.txt", "--output", "run/train_config.json"], "an input"),
    ("export-over-a-checkpoint-of-the-run-exported", None,
     ["export", "--model", "run", "--to", "hf", "run/step-000002", "--force"], "an input of this command"),
    ("output-onto-a-socket", _socket, [*TR, "--output", "sock"], "not a regular file"),
    ("output-a-dangling-symlink", lambda ws: (ws / "gone").symlink_to(ws / "nowhere" / "x"),
     [*TR, "--output", "gone"], "symbolic link to nothing"),
]  # fmt: skip


@pytest.mark.parametrize(("setup", "argv", "fragment"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_every_input_is_protected(ws, capsys, setup, argv, fragment):
    err, _, before, after = refused(ws, capsys, setup, argv)
    assert len(err) == 1 and err[0].startswith(f"aiayn {argv[0]}: error: ") and fragment in err[0], err
    assert after == before


# -- outputs that are not regular files --------------------------------------------------------------


def test_a_symlink_to_a_device_is_written_through_not_replaced(ws, capsys):
    (ws / "null").symlink_to("/dev/null")
    assert main([*TR, "--output", "null"]) == 0
    assert (ws / "null").is_symlink() and stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_a_symlink_to_a_file_keeps_the_link(ws, capsys):
    (ws / "real.txt").write_text("old\n")
    (ws / "out.txt").symlink_to(ws / "real.txt")
    assert main([*TR, "--output", "out.txt"]) == 0
    assert (ws / "out.txt").is_symlink()
    assert len((ws / "real.txt").read_text().splitlines()) == len(DE)


def test_a_fifo_is_streamed_into(ws, capsys):
    os.mkfifo(ws / "fifo")
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append((ws / "fifo").read_bytes()), daemon=True)
    reader.start()
    code = main([*TR, "--output", "fifo"])
    reader.join(timeout=30)
    if reader.is_alive():  # nothing was written into it: unblock the reader
        with open(ws / "fifo", "wb"):
            pass
    assert code == 0 and stat.S_ISFIFO(os.lstat(ws / "fifo").st_mode)
    assert len(got[0].decode().splitlines()) == len(DE)


def test_a_link_to_stdout_is_streamed_into(ws):
    (ws / "out").symlink_to("/proc/self/fd/1")
    for stdout in (subprocess.PIPE, open(ws / "captured", "wb")):  # noqa: SIM115 -- closed below
        child = [sys.executable, "-c", LIMITED, *TR, "--output", "out"]
        proc = subprocess.run(child, stdout=stdout, stderr=subprocess.PIPE, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        if stdout is not subprocess.PIPE:
            stdout.close()
        got = proc.stdout if stdout is subprocess.PIPE else (ws / "captured").read_bytes()
        assert len(got.decode().splitlines()) == len(DE)
        assert (ws / "out").is_symlink() and not list(ws.glob(".tmp-*"))


def test_dash_is_stdout(ws, capsys):
    assert main([*TR, "--output", "-"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == len(DE)
    assert not (ws / "-").exists()


def test_a_legal_long_name_is_written(ws, capsys):
    name = "h" * 250
    assert main([*TR, "--output", name]) == 0
    assert len((ws / name).read_text().splitlines()) == len(DE)
    assert main(["export", "--model", "model", "--to", "hf", "d" * 250]) == 0
    assert not list(ws.glob(".tmp-*"))


# -- streaming ---------------------------------------------------------------------------------------


def test_input_is_decoded_in_chunks_with_its_line_numbers(ws, capsys, monkeypatch):
    argv = [*TR, "--beam", "2", "--nbest", "2"]
    assert main(argv) == 0
    whole = capsys.readouterr().out
    monkeypatch.setattr(decode_options, "CHUNK_LINES", 2)
    chunks = list(decode_options.read_chunks(argparse.Namespace(input="in.txt")))
    assert [(start, len(lines)) for start, lines in chunks] == [(0, 2), (2, 1)]
    assert main(argv) == 0
    assert capsys.readouterr().out == whole  # n-best indices count across chunks


# the child's address space: 2 GiB over what it maps once torch is loaded (a CUDA build maps far more
# than the CPU one; the CLI imports torch only when it runs, so it is imported here first), so that
# reading without a bound fails while a bounded read does not. The CPU only: a CUDA context maps more.
LIMITED = """
import os, resource, sys
os.environ["CUDA_VISIBLE_DEVICES"] = ""
import torch
from aiayn.cli.main import main
vm = int(next(line for line in open("/proc/self/status") if line.startswith("VmSize:")).split()[1]) << 10
resource.setrlimit(resource.RLIMIT_AS, (vm + (2 << 30), vm + (2 << 30)))
sys.exit(main(sys.argv[1:]))
"""


def test_an_endless_line_is_an_error_not_a_memory_error(ws):
    argv = ["translate", "--model", "model", "--input", "/dev/zero"]
    proc = subprocess.run([sys.executable, "-c", LIMITED, *argv], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines() == [
        f"aiayn translate: error: /dev/zero: line 1 is longer than {decode_options.MAX_LINE_BYTES} "
        "bytes (MAX_LINE_BYTES); is it a text file, one text per line?"
    ]


def test_a_long_line_is_named(ws, capsys, monkeypatch):
    monkeypatch.setattr(decode_options, "MAX_LINE_BYTES", 20)
    (ws / "long.txt").write_text("ok\n" + "x" * 21 + "\n", encoding="utf-8")
    assert main(["translate", "--model", "model", "--input", "long.txt", "--output", "o.txt"]) == 1
    assert "long.txt: line 2 is longer than 20 bytes" in capsys.readouterr().err
    assert not (ws / "o.txt").exists() and not list(ws.glob(".tmp-*"))


# -- a full disk -------------------------------------------------------------------------------------


def _full_disk(*args, **kwargs):
    raise SafetensorError("Error while serializing: IoError(Os { code: 28, kind: StorageFull })")


def _enospc(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@pytest.mark.parametrize("writer", [_full_disk, _enospc], ids=["safetensor-error", "oserror"])
@pytest.mark.parametrize(
    "argv",
    [["average", "run", "--last", "2", "--out", "lm", "--force"], ["export", "--model", "model", "--to", "hf",
                                                                   "lm", "--force"]],
    ids=["average", "export"],
)  # fmt: skip
def test_a_full_disk_is_one_line_and_changes_nothing(ws, capsys, monkeypatch, writer, argv):
    import aiayn.interop.hf
    import aiayn.models.io

    monkeypatch.setattr(aiayn.models.io, "_save_weights", writer)
    monkeypatch.setattr(aiayn.interop.hf, "save_file", writer)
    before = snapshot(ws)
    assert main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"aiayn {argv[0]}: error: cannot write "), err
    assert snapshot(ws) == before and not list(ws.glob(".tmp-*"))


# -- SIGKILL while a directory is replaced ----------------------------------------------------------

CHILD = """
import os, shutil, signal, sys
from pathlib import Path
import aiayn.atomic as atomic
from aiayn.cli.main import main

kill_at, fallback, argv = int(sys.argv[1]), sys.argv[2] == "1", sys.argv[4:]
folder = Path(sys.argv[3]).resolve()
if fallback:  # a system without renameat2: the two-step replace
    atomic._renameat2 = lambda: None
calls = 0


def hooked(fn):
    def step(*args, **kwargs):  # each step that moves or removes an entry of the output's folder
        global calls
        if any(isinstance(a, (str, os.PathLike)) and Path(a).resolve().parent == folder for a in args[:2]):
            if calls == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
            calls += 1
        return fn(*args, **kwargs)
    return step


os.rename, os.replace, shutil.rmtree = hooked(os.rename), hooked(os.replace), hooked(shutil.rmtree)
if hasattr(atomic, "exchange"):
    atomic.exchange = hooked(atomic.exchange)
sys.exit(main(argv))
"""


def _digest(p: Path) -> str:
    """A file's hash; a safetensors file's by content (its header's metadata order varies by run)."""
    if p.suffix != ".safetensors":
        return hashlib.sha256(p.read_bytes()).hexdigest()
    h = hashlib.sha256()
    with safe_open(str(p), "pt") as f:
        h.update(repr(sorted(f.metadata().items())).encode())
        for key in sorted(f.keys()):
            h.update(key.encode() + f.get_tensor(key).numpy().tobytes())
    return h.hexdigest()


def _tree(path: Path) -> dict[str, str] | None:
    if not path.is_dir():
        return None
    return {str(p.relative_to(path)): _digest(p) for p in sorted(path.rglob("*")) if p.is_file()}


def _killed_at_every_step(ws: Path, argv: list[str], out: str, fallback: bool) -> None:
    """Kill ``argv`` before each step of replacing ``out`` (which holds another model): ``out`` is
    at every instant the old model or the new one (after the next start's recovery, with
    ``fallback``), and the next run leaves no temporary behind."""
    assert main([*argv, "--force"]) == 0  # the new model, for reference
    new = _tree(ws / out)
    shutil.rmtree(ws / out)
    for k in range(12):
        shutil.copytree(ws / "lm", ws / out, dirs_exist_ok=True)
        old = _tree(ws / out)
        child = [
            sys.executable,
            "-c",
            CHILD,
            str(k),
            str(int(fallback)),
            str((ws / out).parent),
            *argv,
            "--force",
        ]
        proc = subprocess.run(child, cwd=ws, capture_output=True, text=True, timeout=300)
        if proc.returncode == 0:
            assert _tree(ws / out) == new and not list((ws / out).parent.glob(".tmp-*"))
            return
        assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
        if not fallback:
            assert _tree(ws / out) in (old, new), f"killed before step {k}: {out} is neither model"
        assert main([*argv, "--force"]) == 0, f"killed before step {k}"  # the next start recovers
        assert _tree(ws / out) == new
        assert not list((ws / out).parent.glob(".tmp-*")), f"killed before step {k}: temporaries left"
        shutil.rmtree(ws / out)
    raise AssertionError("the command never finished")


@pytest.mark.slow
@pytest.mark.parametrize("fallback", [False, True], ids=["exchange", "two-step"])
def test_average_force_is_whole_under_sigkill(ws, capsys, fallback):
    _killed_at_every_step(ws, ["average", "run", "--last", "2", "--out", "avg/out"], "avg/out", fallback)


@pytest.mark.slow
def test_export_is_whole_under_sigkill(ws, capsys):
    _killed_at_every_step(ws, ["export", "--model", "model", "--to", "hf", "exp/out"], "exp/out", False)
