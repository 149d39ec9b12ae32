"""Every ```python block in the README and docs/ runs (each file's blocks in one namespace), and every
test the architecture guides cite as ``tests/...py::test_name`` exists."""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
GUIDES = sorted((ROOT / "docs").glob("architecture*.md"))
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
TEST_REF = re.compile(r"\b(tests/[\w/]+\.py)::(\w+)")


@pytest.mark.parametrize("path", DOCS, ids=[p.name for p in DOCS])
def test_python_blocks_run(path):
    namespace: dict = {}
    for i, block in enumerate(BLOCK.findall(path.read_text(encoding="utf-8"))):
        try:
            exec(compile(block, f"{path.name}[block {i}]", "exec"), namespace)
        except Exception as e:  # pragma: no cover - the message is the point
            raise AssertionError(f"{path.name}: python block {i} failed: {e!r}\n{block}") from e


def _test_functions(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    return {
        node.name
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_")
    }


@pytest.mark.parametrize("path", GUIDES, ids=[p.name for p in GUIDES])
def test_cited_tests_exist(path):
    """A guide that cites ``tests/x.py::test_y`` must point at a test function that is really there."""
    refs = sorted(set(TEST_REF.findall(path.read_text(encoding="utf-8"))))
    assert refs, f"{path.name} cites no tests as tests/...py::test_name"
    missing = []
    for file, name in refs:
        target = ROOT / file
        if not target.is_file():
            missing.append(f"{file}::{name} (no such file)")
        elif name not in _test_functions(target):
            missing.append(f"{file}::{name} (no such test function)")
    assert not missing, f"{path.name} cites tests that do not exist:\n" + "\n".join(missing)
