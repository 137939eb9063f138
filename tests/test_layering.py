"""House rule: the layers import one way (docs/design.md, "Layers").

``encoders``, ``index`` and ``intent`` never import ``search``, the jobs around a search
(``merchandising``, ``feedback``, ``experiments``, ``conversation``), ``ingest``, ``web``, ``evals``,
``training`` or ``cli``; the jobs never import each other, ``ingest``, ``web``, ``evals``,
``training`` or ``cli``, and of ``search`` only the engine (their composition) imports them; ``ingest``, ``web`` and ``evals`` never import each other (nor ``cli``, the
composition root). ``training`` (recipes, pairs, the training loops; docs/design.md, "Training")
sits beside the runtime: it may import ``encoders``, ``intent``, ``index``, ``search``, ``evals``
and the top-level modules, and nothing but ``cli`` imports it (``search``, ``ingest``, ``web`` and
``evals`` never do). Checked on every import statement of every module, lazy ones inside functions included.
``vitrine/settings.py``, which every layer reads, imports no layer.

Inside ``search`` the engine is the top: a facade over the read path and the write path. Every
other module of ``vitrine/search`` (fusion, recommend, fallback, understanding, swap, storefront,
the reader, the state ...) is below it: it never imports ``vitrine.search.engine`` and never
names ``Engine`` (an argument, a return type, a variable), so the dependencies run engine ->
read/write paths and their steps -> index state, never back.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "vitrine"
LOWER = ("encoders", "index", "intent")
JOBS = ("merchandising", "feedback", "experiments", "conversation")  # the rooms around a search
UPPER = ("ingest", "web", "evals")
FORBIDDEN = {
    **{low: {"search", "ingest", "web", "evals", "training", "cli", *JOBS} for low in LOWER},
    **{job: ({"ingest", "web", "evals", "training", "cli"} | set(JOBS)) - {job} for job in JOBS},
    **{up: ({"cli", "training"} | set(UPPER)) - {up} for up in UPPER},
    "search": {"training", *JOBS},  # but the engine: test_only_the_engine_composes_the_jobs
    "training": {"cli", "ingest", "web"},
}
LEAVES = {"settings.py": {"encoders", "index", "intent", "search", "ingest", "web", "evals", "training", "cli"}}


def _imported_layers(path: Path) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == "vitrine" and len(parts) > 1:
                out.append((node.lineno, parts[1]))
    return out


def test_layers_import_one_way() -> None:
    bad = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT)
        layer = rel.parts[0] if len(rel.parts) > 1 else rel.name
        forbidden = FORBIDDEN.get(layer) or LEAVES.get(layer, set())
        if rel.as_posix() == ENGINE_FILE:
            forbidden = forbidden - set(JOBS)
        bad += [f"{rel}:{line} imports vitrine.{got}" for line, got in _imported_layers(path) if got in forbidden]
    assert not bad, "imports against the layering:\n" + "\n".join(bad)


ENGINE_FILE = "search/engine.py"


def test_only_the_engine_composes_the_jobs() -> None:
    """``vitrine/search`` has no module of the jobs around a search, and the read path names none
    of them: it calls the engine's list of stages (vitrine/search/stages.py)."""
    search = ROOT / "search"
    names = {p.stem for p in search.glob("*.py")}
    assert not names & {"rules", "rule_models", "stock", "patch", "feedback", "clicks", "learning", "analytics",
                        "experiments", "experiment_models", "experiment_stats", "sessions", "followups"}
    tree = ast.parse((search / "reads.py").read_text(encoding="utf-8"))
    named = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} \
        | {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)} \
        | {a.name for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names} \
        | {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    for word in ("rule", "merchandis", "feedback", "learn", "session", "conversation", "experiment", "variant"):
        assert not [n for n in named if word in n.lower()], f"reads.py names {word}"
    engine = [got for _, got in _imported_layers(search / "engine.py")]
    assert set(JOBS) - {"experiments", "feedback"} <= set(engine)  # the engine composes them


# -- inside search: nothing below the engine knows it ---------------------------------------------------
SEARCH = ROOT / "search"
ENGINE_MODULE = "vitrine.search.engine"


def engine_uses(path: Path) -> list[str]:
    """Where a module imports the engine module (lazily too) or names ``Engine`` at all (a
    signature, an annotation string, a variable)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [f"{node.lineno}: import {a.name}" for a in node.names if a.name == ENGINE_MODULE]
        elif isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if mod == ENGINE_MODULE or (mod == "vitrine.search" and any(a.name == "engine" for a in node.names)) \
                    or (node.level and (mod == "engine" or (not mod and any(a.name == "engine" for a in node.names)))):
                out.append(f"{node.lineno}: from {mod or '.'} import ...")
        elif isinstance(node, ast.Name) and node.id == "Engine":
            out.append(f"{node.lineno}: names Engine")
        elif isinstance(node, ast.Attribute) and node.attr == "Engine":
            out.append(f"{node.lineno}: names Engine")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value != "":
            # a string annotation ("Engine", "engine.Engine") is parsed for the names it holds
            try:
                sub = ast.parse(node.value, mode="eval")
            except SyntaxError:
                continue
            if any(isinstance(n, ast.Name) and n.id == "Engine" or isinstance(n, ast.Attribute) and n.attr == "Engine"
                   for n in ast.walk(sub)):
                out.append(f"{node.lineno}: names Engine in {node.value!r}")
    return sorted(out, key=lambda v: int(v.split(":")[0]))  # (ast.walk goes breadth first)


def test_nothing_below_the_engine_knows_it() -> None:
    below = [p for d in (SEARCH, *(ROOT / j for j in JOBS)) for p in sorted(d.rglob("*.py"))]
    bad = [f"{p.relative_to(ROOT)}:{v}" for p in below if p.name != "engine.py" or p.parent != SEARCH
           for v in engine_uses(p)]
    assert not bad, "modules below the engine that know it:\n" + "\n".join(bad)
    for name in ("fusion", "recommend", "fallback", "understanding", "swap"):  # the ones the issue names
        assert (SEARCH / f"{name}.py").is_file()


def test_the_engine_scan_finds_what_it_must(tmp_path: Path) -> None:
    """The scan itself: each way of knowing the engine is found; the reader is not the engine."""
    (tmp_path / "a.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from vitrine.search.engine import Engine\n"
        "import vitrine.search.engine\n"
        "from vitrine.search import engine\n"
        "from .engine import product_text\n"
        "def f(engine: 'Engine', reader: 'Reader') -> int:\n    return 1\n"
        "def g(e: Engine) -> None:\n    from vitrine.search.engine import build_encoder\n"
        "x: 'vitrine.search.engine.Engine | None' = None\n")
    assert engine_uses(tmp_path / "a.py") == [
        "3: from vitrine.search.engine import ...", "4: import vitrine.search.engine",
        "5: from vitrine.search import ...", "6: from engine import ...",
        "7: names Engine in 'Engine'", "9: names Engine", "10: from vitrine.search.engine import ...",
        "11: names Engine in 'vitrine.search.engine.Engine | None'",
    ]
    (tmp_path / "b.py").write_text("def f(reader: 'Reader', engine_count: int) -> None:\n    pass\n")
    assert engine_uses(tmp_path / "b.py") == []
