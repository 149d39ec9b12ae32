"""``aiayn``'s command table: ``aiayn --help`` lists every command without importing any, and a
command line imports only the module of the command it names (each imports torch)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from aiayn.cli.commands import COMMANDS
from aiayn.cli.main import build_parser

ROOT = Path(__file__).parents[2]


def imported_after(argv: list[str]) -> tuple[str, set[str]]:
    """``aiayn ARGV``'s standard output and the modules of torch and aiayn.cli it imported, in a
    fresh interpreter."""
    code = "\n".join([
        "import json, sys",
        "from aiayn.cli.main import main",
        "try:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass",
        "print(json.dumps([m for m in sys.modules if m == 'torch' or m.startswith('aiayn.cli.')]))",
    ])  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", code, *argv], env=env, capture_output=True, text=True, check=True
    )
    *out, modules = done.stdout.splitlines()
    return "\n".join(out), set(json.loads(modules))


def test_help_lists_every_command_with_its_line_and_imports_none_of_them():
    out, modules = imported_after(["--help"])
    assert modules == {"aiayn.cli.main", "aiayn.cli.commands"}  # no torch, no command
    listed = " ".join(out.split())
    for command, (_, line) in COMMANDS.items():
        assert f"{command} {line}" in listed


def test_a_command_line_imports_its_command_only():
    out, modules = imported_after(["fill-mask", "--help"])
    assert out.startswith("usage: aiayn fill-mask") and "--top-k" in out
    assert "torch" in modules and "aiayn.cli.fill_mask" in modules
    assert not {f"aiayn.cli.{m}" for m, _ in COMMANDS.values() if m != "fill_mask"} & modules


@pytest.mark.parametrize("command", list(COMMANDS))
def test_each_command_is_built_whole_by_its_module_under_its_name(command):
    sub = next(a for a in build_parser([command])._actions if a.dest == "command")
    whole = sub.choices[command]
    assert len(whole._actions) > 1  # more than -h: the module's own parser, not the listing's
    assert whole.prog == f"aiayn {command}"
    others = [c for c in COMMANDS if c != command]
    assert all(len(sub.choices[c]._actions) == 1 for c in others)  # only listed: -h
