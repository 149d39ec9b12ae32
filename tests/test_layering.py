"""Dependencies inside the package flow one way (README, "What is where"); the base is masks, errors,
atomic, outputs, temporaries, textfiles, version, device and malloc:

    cli → serve → training → decoding → interop → data → models → modules → base

A module may import from its own layer or any layer to its right, never to its left; ``viz``
imports the base only, and only cli imports viz. Every ``import`` statement is read with ``ast`` (those inside
functions and ``TYPE_CHECKING`` blocks included), so a lazy import cannot hide an upward edge.
"""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "aiayn"
ORDER = ["base", "modules", "models", "data", "interop", "decoding", "training", "serve", "cli"]
BASE = {"masks", "errors", "atomic", "outputs", "temporaries", "textfiles", "version", "device", "malloc"}
LAYERED = BASE | set(ORDER) | {"viz"}
FACADES = {"__init__", "__main__"}  # the package's public face and entry point may import anything


def layer(module: str) -> str | None:
    """``aiayn.x.y`` -> the layer of ``x`` (None for the package root's facades)."""
    parts = module.split(".")
    if parts[0] != "aiayn" or len(parts) == 1:
        return None
    top = parts[1]
    if top in BASE:
        return "base"
    if top in ORDER or top == "viz":
        return top
    raise AssertionError(f"aiayn/{top} belongs to no layer: add it to tests/test_layering.py")


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every aiayn import in ``path``, relative imports resolved."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("aiayn")]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            if name == "aiayn":  # ``from aiayn import x``: x is a module, or a name of the facade
                found += [
                    (node.lineno, f"aiayn.{a.name}" if a.name in LAYERED else "aiayn") for a in node.names
                ]
            elif name.startswith("aiayn."):
                found.append((node.lineno, name))
    return found


def violations(path: Path) -> list[str]:
    source = module_name(path)
    if path.stem in FACADES and path.parent == PACKAGE:
        return []
    here = layer(source)
    bad = []
    for line, target in imports(path):
        there = layer(target)
        if there is None:
            bad.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports the package root ({target})")
        elif here == "viz" and there != "viz" and there != "base":
            bad.append(f"{path.relative_to(PACKAGE.parent)}:{line}: viz imports {target}")
        elif there == "viz" and here not in ("viz", "cli"):
            bad.append(f"{path.relative_to(PACKAGE.parent)}:{line}: {here} imports {target} (viz is for cli)")
        elif here != "viz" and there != "viz" and ORDER.index(there) > ORDER.index(here):
            bad.append(
                f"{path.relative_to(PACKAGE.parent)}:{line}: {here} imports {target} ({there} is above it)"
            )
    return bad


def test_dependencies_flow_one_way():
    bad = [v for path in sorted(PACKAGE.rglob("*.py")) for v in violations(path)]
    assert not bad, "imports against the layer order:\n" + "\n".join(bad)


@pytest.mark.parametrize(
    ("where", "code", "expected"),
    [
        ("modules/x.py", "from aiayn.models.config import TransformerConfig", "modules imports aiayn.models"),
        ("models/x.py", "def f():\n    from aiayn.training import trainer", "models imports aiayn.training"),
        ("decoding/x.py", "from ..training.config import TrainConfig", "decoding imports aiayn.training"),
        ("data/x.py", "from aiayn import __version__", "imports the package root"),
        ("viz/x.py", "from aiayn.models import Transformer", "viz imports aiayn.models"),
    ],
)
def test_the_checker_catches_upward_edges(tmp_path, monkeypatch, where, code, expected):
    """The checker itself, on planted files: each upward edge is reported (a test that can fail)."""
    fake = tmp_path / "aiayn"
    (fake / where).parent.mkdir(parents=True)
    (fake / where).write_text(code + "\n", encoding="utf-8")
    monkeypatch.setattr(__import__(__name__, fromlist=["PACKAGE"]), "PACKAGE", fake)
    found = violations(fake / where)
    assert found and expected in found[0], found


def test_downward_and_sideways_edges_pass(tmp_path, monkeypatch):
    fake = tmp_path / "aiayn"
    (fake / "training").mkdir(parents=True)
    code = "from aiayn.decoding import search\nfrom aiayn.training import schedule\nfrom aiayn import masks\n"
    (fake / "training" / "x.py").write_text(code, encoding="utf-8")
    monkeypatch.setattr(__import__(__name__, fromlist=["PACKAGE"]), "PACKAGE", fake)
    assert violations(fake / "training" / "x.py") == []


def test_the_package_exports_every_name_it_lists_and_imports_them_on_first_use():
    import aiayn

    assert set(aiayn.__all__) == {*aiayn._WHERE, "__version__"}  # the list and the lazy table agree
    for name in aiayn.__all__:
        assert getattr(aiayn, name) is not None, name
    assert set(aiayn.__all__) <= set(dir(aiayn))
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        aiayn.nope  # noqa: B018
