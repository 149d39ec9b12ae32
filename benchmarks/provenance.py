"""What every benchmark's JSON records beside its figures, so that a reader can tell where they came
from and run them again: the command line, the commit (``-dirty`` when the tree had uncommitted
changes, which the commit alone does not reproduce), the machine (CPU, vector instructions, cores,
torch) and the time (UTC); and ``run_main``, which answers a wrong model, file or option in one
line, as the ``aiayn`` commands do."""

from __future__ import annotations

import datetime
import os
import shlex
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

from reproduce import git_commit  # noqa: E402  -- the recipes' results record it the same way

from aiayn.atomic import write_json  # noqa: E402
from aiayn.cli.demo import machine  # noqa: E402
from aiayn.errors import AiaynError  # noqa: E402


def provenance() -> dict[str, str]:
    return {
        "command": shlex.join([Path(sys.executable).name, *sys.argv]),
        "cwd": os.getcwd(),
        "commit": git_commit(),
        "machine": machine(),
        "utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S"),
    }


def write_result(path: str | os.PathLike, result: dict) -> None:
    """``result`` and its ``provenance`` as JSON at ``path``, written whole (temp file + rename)."""
    write_json(path, {**result, "provenance": provenance()})


def run_main(main: Callable[[], int | None]) -> None:
    """Run a benchmark's ``main`` and exit with its status; a wrong model directory, file or option
    (an ``AiaynError``) is one line naming it, not a traceback."""
    try:
        sys.exit(main())
    except AiaynError as e:
        sys.exit(f"{Path(sys.argv[0]).name}: error: {e}")
