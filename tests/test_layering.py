"""House rule: the layers import one way (docs/design.md, "Layers").

``encoders``, ``index`` and ``intent`` never import ``search``, ``ingest``, ``web``, ``evals`` or
``cli``; ``ingest``, ``web`` and ``evals`` never import each other (nor ``cli``, the composition
root). Checked on every import statement of every module, lazy ones inside functions included.
``vitrine/settings.py``, which every layer reads, imports no layer.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "vitrine"
LOWER = ("encoders", "index", "intent")
UPPER = ("ingest", "web", "evals")
FORBIDDEN = {
    **{low: {"search", "ingest", "web", "evals", "cli"} for low in LOWER},
    **{up: ({"cli"} | set(UPPER)) - {up} for up in UPPER},
}
LEAVES = {"settings.py": {"encoders", "index", "intent", "search", "ingest", "web", "evals", "cli"}}


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
        bad += [f"{rel}:{line} imports vitrine.{got}" for line, got in _imported_layers(path) if got in forbidden]
    assert not bad, "imports against the layering:\n" + "\n".join(bad)
