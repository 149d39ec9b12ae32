"""Every ```python block in the README and docs/ runs (each file's blocks in one namespace), every
test the architecture guides cite as ``tests/...py::test_name`` exists, and the 中文 guide keeps the
English one's sections and cited tests."""

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
def test_python_blocks_run(path, monkeypatch):
    from aiayn.training import task

    task.task_names()  # the built-in tasks registered; a page's example task is taken out afterwards
    monkeypatch.setattr(task, "TASKS", dict(task.TASKS))
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


def _sections(path: Path) -> list[tuple[int, str | None]]:
    """(level, paper section or pitfall number) of every heading outside code blocks."""
    out, fence = [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fence = not fence
        elif not fence and line.startswith("#"):
            number = re.search(r"§\s*[\d.]+|\b\d\.", line)
            out.append((len(line) - len(line.lstrip("#")), number.group(0) if number else None))
    return out


def test_the_chinese_guide_keeps_the_english_sections_and_cited_tests():
    english, chinese = ROOT / "docs" / "architecture.md", ROOT / "docs" / "architecture.zh-CN.md"
    assert _sections(chinese) == _sections(english), "the two guides' headings differ in level or number"
    cited = [set(TEST_REF.findall(p.read_text(encoding="utf-8"))) for p in (english, chinese)]
    assert cited[0] == cited[1], f"cited in one guide only: {sorted(cited[0] ^ cited[1])}"


def test_the_section_reader_sees_a_missing_section(tmp_path):
    page = tmp_path / "a.md"
    page.write_text("# A\n```python\n# not a heading\n```\n## §3.1 B\n### 1. C\n", encoding="utf-8")
    assert _sections(page) == [(1, None), (2, "§3.1"), (3, "1.")]
