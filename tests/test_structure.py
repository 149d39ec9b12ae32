"""How the package is built, checked rather than promised (STYLE.md, "What the second version taught
us"): models compute and tasks train, no import cycles, small modules, and docstrings that explain
instead of logging experiments."""

import ast
import inspect
import io
import re
import tokenize
from pathlib import Path

import pytest

from aiayn.models import BidirectionalTransformer, Transformer
from tests.test_layering import PACKAGE, imports, module_name

MAX_LINES = 410  # "no file over ~400 lines": one module, one job
MACHINES = re.compile(
    r"\b(AMD|Intel|EPYC|Xeon|Zen ?\d*|Graviton|Sapphire Rapids|Ice Lake|VMs?|the issue|issue \d+)\b"
    r"|\b(development|dev|2-core|two-core) (machine|VM|box)\b"
)
BLEU_FIGURE = re.compile(r"\b\d+\.\d+ (lowercased )?(BLEU|chrF)\b|\b(BLEU|chrF|accuracy) (of |at )?\d+\.\d+")
# a speed ratio is written "1.5×" or "2–2.7× as fast"; a shape, "(tokens × d_model)" or "128 × 5,322"
SPEED_FIGURE = re.compile(
    r"\d×(?!\s*\d)|\d\s*×\s*(faster|slower|as fast|more|less)\b"
    r"|\d\s*%\s*(faster|slower|more|less|of (the|a|its) (step|time|run))\b"
)
TIMING = re.compile(
    r"\b\d+(\.\d+)?\s?(ms|µs)\b|\d\s?(\w+ )?(tokens|updates|sentences|GFLOP)/s\b|(about|≈) \d+(\.\d+)? ?s\b"
)
FIGURES = (MACHINES, BLEU_FIGURE, SPEED_FIGURE, TIMING)
# settings written as ratios, not measurements: what precision="auto" requires of bfloat16
# (training.config's comment on AUTO_BF16_MIN_SPEEDUP)
SETTINGS = ("≥ 1.25× float32's",)


def _sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _graph() -> dict[str, set[str]]:
    names = {module_name(p): p for p in _sources()}
    graph = {}
    for name, path in names.items():
        edges = set()
        for _, target in imports(path):
            while target and target not in names:  # ``from aiayn.x import name``: the module aiayn.x
                target = target.rpartition(".")[0]
            if target and target != name:
                edges.add(target)
        graph[name] = edges
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_import_cycle_inside_the_package():
    """Every import counts, lazy ones inside functions too; a package's ``__init__`` re-exporting its
    own modules is the package itself, so edges into a package's parent facade are left out."""
    graph = _graph()
    for name in list(graph):  # a module importing its own package's facade is not a cycle
        graph[name] = {t for t in graph[name] if not name.startswith(t + ".")}
    cycle = _cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_finder_finds_one():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


@pytest.mark.parametrize("model", [Transformer, BidirectionalTransformer])
def test_a_model_forward_takes_inputs_and_masks_only(model):
    params = [p for p in inspect.signature(model.forward).parameters if p != "self"]
    assert len(params) <= 5, f"{model.__name__}.forward takes {params}: losses belong to the tasks"
    assert not {"targets", "label_smoothing", "r_drop"} & set(params)


def test_no_task_name_branches_outside_the_tasks():
    """``if cfg.task == "translation"`` outside ``training/tasks/`` is the seam in the wrong place: a
    task says what it is through its class (``Task.token_batches``, its options)."""
    bad = []
    for path in _sources():
        if "tasks" in path.relative_to(PACKAGE).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Compare) and any(isinstance(op, (ast.Eq, ast.NotEq)) for op in node.ops):
                sides = [node.left, *node.comparators]
                if any(isinstance(s, ast.Attribute) and s.attr == "task" for s in sides):
                    bad.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}")
    assert not bad, "task-name branches outside training/tasks: " + ", ".join(bad)


def test_modules_stay_small():
    long = {str(p.relative_to(PACKAGE.parent)): n for p in _sources()
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}  # fmt: skip
    assert not long, f"modules over {MAX_LINES} lines: {long}"


def _docstrings_and_comments(path: Path) -> list[tuple[int, str]]:
    """(first line, text) of every comment and docstring of ``path``."""
    text = path.read_text(encoding="utf-8")
    out = [(tok.start[0], tok.string) for tok in tokenize.generate_tokens(io.StringIO(text).readline)
           if tok.type == tokenize.COMMENT]  # fmt: skip
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                out.append((node.body[0].lineno, doc))
    return out


def _figures(text: str) -> list[tuple[int, str]]:
    """(line offset, matched text) of each measured figure or machine name in ``text``."""
    for setting in SETTINGS:
        text = text.replace(setting, "")
    found = [m for pattern in FIGURES for m in pattern.finditer(text)]
    return [(text.count("\n", 0, m.start()), m.group()) for m in found]


def test_no_measured_figures_or_machine_names_in_docstrings():
    """Measurements and machine names live in docs/results.md and results/, not in the code: a
    docstring or comment says what the code does and why, and points there for the figures."""
    bad = []
    for path in _sources():
        for line, text in _docstrings_and_comments(path):
            bad += [f"{path.relative_to(PACKAGE.parent)}:{line + n} {found!r}" for n, found in _figures(text)]
    assert not bad, "figures or machine names in docstrings/comments: " + ", ".join(bad)


@pytest.mark.parametrize(
    ("text", "flagged"),
    [
        ("backward on the 2-core AMD VM: 1.1–1.5× faster at 12–40 keys", True),
        ("a fresh one each time made the loss ≈ 15% slower", True),
        ("bfloat16 ones run 2–2.7× as fast", True),
        ("measured on an Intel Xeon with AMX", True),
        ("Zen 4, 3,540 updates in the hour", True),
        ("it scored 38.47 BLEU on test2016", True),
        ("4.6 ms against 0.64 padded", True),
        ("4,872 and 5,205 target tokens/s", True),
        ("about 1 s for Multi30k's 29k pairs", True),
        ("the softmax cost 27% of the step", True),
        ("a (tokens × d_model) · (d_model × d_ff) product", False),
        ("embeddings × √d_model; [L × (B, h, T, T)], (chunk, V) × (V, d), 128 × 5,322", False),
        ("15% chosen; 80% <mask>, 10% random; the first 90% of characters train", False),
        ("16 float32 lanes with AVX-512, 8 with AVX2", False),
        ("sacreBLEU's corpus BLEU and chrF, lowercased", False),
        ('"auto": bf16 where bfloat16 products measure ≥ 1.25× float32\'s at the start', False),
    ],
)
def test_the_figure_patterns(text, flagged):
    assert bool(_figures(text)) is flagged, _figures(text)
