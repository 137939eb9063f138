"""House rules on the shape of the code (docs/design.md, "House rules"):

- the import graph of ``vitrine/`` has no circles: every import counts, lazy ones inside
  functions and ``TYPE_CHECKING`` ones included (a circle hidden in a function is still two
  modules that cannot be understood, or split, apart);
- a file holds at most 600 lines, a class 400, a function 120;
- the CLI only parses arguments and calls: no function in ``vitrine/cli`` over 60 lines.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "vitrine"
MAX_FILE, MAX_CLASS, MAX_FUNCTION, MAX_CLI_FUNCTION = 600, 400, 120, 60


def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The vitrine modules ``name`` imports (a name imported from a package counts as its
    submodule when there is one of that name, else as the package)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    got: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            targets = [f"{module}.{a.name}" if f"{module}.{a.name}" in modules else module for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in modules:
                t = t.rpartition(".")[0]
            if t and t != name and t.startswith("vitrine"):
                got.add(t)
    return got


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


def test_circle_finder_finds_a_circle_and_nothing_else() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _circles(graph) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": set()}) == []


def test_the_import_graph_has_no_circles() -> None:
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    assert graph["vitrine.cli.app"] >= {"vitrine.cli.base", "vitrine.cli.commands"}  # the walk sees imports
    circles = _circles(graph)
    assert not circles, "import circles:\n" + "\n".join(" <-> ".join(c) for c in circles)


def _sized(tree: ast.AST) -> Iterator[tuple[str, str, int]]:
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            kind = "class" if isinstance(node, ast.ClassDef) else "function"
            yield kind, node.name, (node.end_lineno or node.lineno) - node.lineno + 1


def test_files_classes_and_functions_stay_small() -> None:
    big = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT.parent)
        text = path.read_text(encoding="utf-8")
        if (n := len(text.splitlines())) > MAX_FILE:
            big.append(f"{rel}: {n} lines (file, at most {MAX_FILE})")
        for kind, name, n in _sized(ast.parse(text)):
            limit = MAX_CLASS if kind == "class" else MAX_CLI_FUNCTION if rel.parts[1] == "cli" else MAX_FUNCTION
            if n > limit:
                big.append(f"{rel}: {kind} {name} {n} lines (at most {limit})")
    assert not big, "too big to hold in one's head:\n" + "\n".join(big)
