"""The package's shape (README, "Architecture"): imports run one way, down the pipeline's floors, with no circle,
and no module grows past 500 lines. Every import counts, the ones inside functions too: a late import hides a
circle from Python, not from the design."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "release"
# Bottom to top; a module imports only from its own floor or the floors below it.
FLOORS = ("core", "inputs", "quantize", "check", "measure", "publish", "pipeline", "cli", "__main__")
MAX_LINES = 500


def module_name(path: Path, root: Path) -> str:
    parts = ["release", *path.relative_to(root).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(root: Path = PACKAGE) -> dict[str, Path]:
    return {module_name(p, root): p for p in sorted(root.rglob("*.py")) if "_data" not in p.parts}


def imports(path: Path, root: Path, known: set[str]) -> set[str]:
    """The package's modules that ``path`` imports (``from pkg import submodule`` names the submodule)."""
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "release")
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            if base.split(".")[0] != "release":
                continue
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
    return found & known - {name}


def graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    mods = modules(root)
    return {name: imports(path, root, set(mods)) for name, path in mods.items()}


def floor(module: str) -> int | None:
    """The floor of a module, or None for the package's own ``__init__`` (the version; it imports nothing)."""
    parts = module.split(".")
    return FLOORS.index(parts[1]) if len(parts) > 1 else None


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component of more than one module, or a module that imports itself (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in edges.get(v, ()):
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def upward(edges: dict[str, set[str]]) -> list[str]:
    """Imports against the floors' direction: from a floor to one above it, or anything imported by the package's
    ``__init__``."""
    wrong = []
    for src, targets in sorted(edges.items()):
        for dst in sorted(targets):
            a, b = floor(src), floor(dst)
            if a is None or (b is not None and b > a):
                wrong.append(f"{src} -> {dst}")
    return wrong


def test_every_module_is_on_a_floor() -> None:
    names = [n for n in modules() if n != "release"]
    assert names
    assert [n for n in names if n.split(".")[1] not in FLOORS] == []


def test_the_import_graph_has_no_circle() -> None:
    assert circles(graph()) == []


def test_imports_run_down_the_floors() -> None:
    assert upward(graph()) == []


def test_no_module_is_over_500_lines() -> None:
    sizes = {name: len(path.read_text().splitlines()) for name, path in modules().items()}
    assert {n: s for n, s in sizes.items() if s > MAX_LINES} == {}


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A package of three floors to show that the checks catch what they are for."""
    root = tmp_path / "release"
    for rel, text in {
        "__init__.py": "",
        "core/__init__.py": "",
        "core/io.py": "import os\n",
        "inputs/__init__.py": "",
        "inputs/source.py": "from release.core.io import os\n",
        "quantize/__init__.py": "",
        "quantize/build.py": "from release.inputs import source\n",
    }.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_the_checks_see_a_clean_tree_as_clean(tree: Path) -> None:
    edges = graph(tree)
    assert edges["release.quantize.build"] == {"release.inputs.source"}
    assert circles(edges) == [] and upward(edges) == []


def test_a_late_import_up_a_floor_is_caught(tree: Path) -> None:
    (tree / "inputs/source.py").write_text("def f():\n    from release.quantize.build import x\n")
    edges = graph(tree)
    assert upward(edges) == ["release.inputs.source -> release.quantize.build"]
    assert circles(edges) == [["release.inputs.source", "release.quantize.build"]]


def test_a_circle_within_a_floor_is_caught(tree: Path) -> None:
    (tree / "core/io.py").write_text("from release.core import paths\n")
    (tree / "core/paths.py").write_text("from . import io\n")
    edges = graph(tree)
    assert upward(edges) == []
    assert circles(edges) == [["release.core.io", "release.core.paths"]]


def modelopt_imports_unguarded(root: Path = PACKAGE) -> list[str]:
    """Functions that import ModelOpt without calling ``modelopt_imported()`` before (release.core.device: the first
    import of ModelOpt in a process must not run on the caller's stack)."""
    found = []
    for name, path in modules(root).items():
        for fn in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef) or fn.name == "modelopt_imported":
                continue
            lines = [n.lineno for n in ast.walk(fn)
                     if (isinstance(n, ast.Import) and any(a.name.split(".")[0] == "modelopt" for a in n.names))
                     or (isinstance(n, ast.ImportFrom) and (n.module or "").split(".")[0] == "modelopt")]
            guards = [n.lineno for n in ast.walk(fn) if isinstance(n, ast.Call)
                      and isinstance(n.func, ast.Name) and n.func.id == "modelopt_imported"]
            if lines and not (guards and min(guards) < min(lines)):
                found.append(f"{name}.{fn.name}")
    return found


def test_every_import_of_modelopt_is_guarded() -> None:
    assert modelopt_imports_unguarded() == []


def test_an_unguarded_import_of_modelopt_is_caught(tree: Path) -> None:
    (tree / "quantize/build.py").write_text("def make():\n    import modelopt.torch.quantization\n")
    (tree / "quantize/load.py").write_text("def load():\n    modelopt_imported()\n    import modelopt\n")
    assert modelopt_imports_unguarded(tree) == ["release.quantize.build.make"]
