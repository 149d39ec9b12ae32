"""Temporary names, and the recovery of what killed writers left behind them.

An atomic write (``aiayn/atomic.py``) writes under ``.tmp-NAME-PID-RANDOM`` beside its output: NAME cut
short so that any legal name fits, PID so that a later writer can tell whether its writer died. A
two-step directory replace records its plan in a journal (``.replace``) before its first rename;
``recover`` completes such a replace killed between its renames and removes the temporaries of dead
processes, trusting of a journal only what ``replace_dir`` could have written: its own temporary and
a name in the same folder. ``usual_mode`` gives a file a writer made the mode a new file gets;
``remove_tree`` deletes a directory renamed aside first, so that a kill leaves only a temporary.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
from pathlib import Path

TMP_PREFIX = ".tmp-"
JOURNAL = ".replace"  # suffix of the file that records a two-step directory replace in progress
OLD = ".old"  # suffix of the old directory during a two-step replace
_TMP_NAME = re.compile(r"^\.tmp-.*-(\d+)-[0-9a-f]{8}(\.replace|\.old)?$")


def temporary_name(path: Path) -> Path:
    """A private name beside ``path`` (same folder, so the final rename stays on one file system),
    short enough for any legal name, with this process's PID so a later start can tell if it died."""
    return path.with_name(f"{TMP_PREFIX}{path.name[:64]}-{os.getpid()}-{secrets.token_hex(4)}")


def remove_tree(path: Path) -> None:
    """Delete the directory ``path``, renamed to a temporary name first: a kill mid-delete leaves a
    temporary that the next writer there removes (``recover``), never half a directory under its name."""
    doomed = temporary_name(path)
    path.rename(doomed)
    shutil.rmtree(doomed)


def _umask() -> int | None:
    """This process's umask, read without changing it (``os.umask`` sets it, which threads would
    see); None where /proc does not say."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    return None


def usual_mode(path: Path) -> None:
    """Give a file a writer made the mode a new file gets (0o666 less the umask): safetensors creates
    its files 0o600, so a model's weights were unreadable where its config.json beside them was not."""
    umask = _umask()
    with contextlib.suppress(OSError):
        if umask is not None and path.is_file() and not path.is_symlink():  # unknown: left as written
            os.chmod(path, 0o666 & ~umask)


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's, and alive
        return True
    return True


def _remove(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            p.unlink()


def _plain_name(name: object) -> bool:
    """A file name in a folder: no separator, not empty, not "." or ".."."""
    return isinstance(name, str) and name not in ("", ".", "..") and "/" not in name and "\0" not in name


def recover(folder: str | os.PathLike) -> None:
    """Finish what writers killed in ``folder`` left: a two-step replace interrupted between its
    renames is completed (its journal is written only once the new directory is whole), then every
    temporary of a dead process goes. Those of live processes are theirs and stay."""
    folder = Path(folder)
    try:
        entries = list(folder.iterdir())
    except OSError:
        return
    stale = [p for p in entries if (m := _TMP_NAME.match(p.name)) and not _alive(int(m.group(1)))]
    for journal in (p for p in stale if p.name.endswith(JOURNAL)):
        try:
            plan = json.loads(journal.read_text(encoding="utf-8"))
            target, new = plan["target"], plan["new"]
        except (OSError, ValueError, KeyError, TypeError):  # torn before the first rename: nothing moved
            continue
        # only what replace_dir writes: the journal's own temporary and a name in this folder (a planted
        # journal naming "../x" or an absolute path must not move anything from or to elsewhere)
        if new != journal.name.removesuffix(JOURNAL) or not _plain_name(target):
            continue
        target, new = folder / target, folder / new
        if not os.path.lexists(target) and new.is_dir() and not new.is_symlink():
            os.rename(new, target)
    for p in sorted(stale, key=lambda p: p.name.endswith(JOURNAL)):  # journals last
        _remove(p)


def remove_temporaries(folder: str | os.PathLike) -> None:
    """Delete what interrupted atomic writes left in ``folder`` (``recover``), and temporaries
    named as older versions named them."""
    recover(folder)
    for p in Path(folder).glob(TMP_PREFIX + "*"):
        if not _TMP_NAME.match(p.name):
            _remove(p)
