"""The package, its scripts and benchmarks run on every Python that pyproject.toml's
``requires-python`` admits: vermin (a library made for this) finds the standard-library members and
syntax each file needs, so a 3.11-only call such as ``asyncio.timeout`` fails here, on 3.11."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_the_code_needs_no_newer_python_than_pyproject_admits():
    pytest.importorskip("vermin")
    floor = re.search(r'requires-python = ">=(3\.\d+)"', (ROOT / "pyproject.toml").read_text()).group(1)
    done = subprocess.run(
        [str(Path(sys.executable).parent / "vermin"), "--no-tips", "--violations", "--eval-annotations",
         f"--target={floor}-", "aiayn", "scripts", "benchmarks"],
        cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-1000:]
