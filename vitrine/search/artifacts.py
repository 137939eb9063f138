"""The model serving an index state, and its artifacts on disk.

- :class:`ModelSpec`: which tower config, adapter and pretrained weights the serving encoder was
  built from (index snapshots and hot swaps name it);
- every artifact behind a model version with its SHA-256 and the pin it is checked against
  (tower weights, the adapter's config and weights, the intent classifier's), so a snapshot
  records what made it and a hot swap refuses a file that differs from its pin;
- ``index/active_model.json``: the model a hot swap activated, so a restart serves it.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vitrine.atomic import atomic_write_bytes
from vitrine.encoders.encoder import MultimodalEncoder
from vitrine.errors import VitrineError

ACTIVE_MODEL = "active_model.json"


@dataclass
class ModelSpec:
    model: str
    adapter: str
    pretrained: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"model": self.model, "adapter": self.adapter, "pretrained": self.pretrained}


def adapter_folder(adapter: str) -> Path | None:
    from vitrine.encoders.adapter_base import CONFIG_NAME
    from vitrine.encoders.adapters import WEIGHTS_DIR

    p = Path(adapter)
    if (p / CONFIG_NAME).is_file():
        return p
    q = WEIGHTS_DIR / adapter
    return q if (q / CONFIG_NAME).is_file() else None


def model_artifacts(spec: ModelSpec, encoder: MultimodalEncoder, intent_model: str | None = None) -> dict[str, Any]:
    """Every model artifact behind a model version with its SHA-256 (and the pin it was checked
    against): tower weights, the adapter's config and weights, the intent classifier's."""
    from vitrine.encoders.factory import resolve_package_path, sha256_file

    out: dict[str, Any] = {"towers_key": encoder.towers.key, "files": {}}
    files = out["files"]
    weights = ((encoder.towers.config or {}).get("vitrine") or {}).get("weights") or {}
    for side, w in sorted(weights.items()):
        try:
            path = resolve_package_path(f"package:{w['package']}/{w['file']}")
            files[f"towers.{side}"] = {"path": str(path), "sha256": sha256_file(path), "pinned": w.get("sha256")}
        except (KeyError, OSError, VitrineError) as e:
            files[f"towers.{side}"] = {"error": str(e)}
    if spec.pretrained:
        files["towers.pretrained"] = {"path": spec.pretrained, "sha256": _sha(Path(spec.pretrained))}
    folder = adapter_folder(spec.adapter) if spec.adapter != "none" else None
    if folder is not None:
        cfg = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        files["adapter.config"] = {"path": str(folder / "config.json"), "sha256": _sha(folder / "config.json")}
        files["adapter.weights"] = {"path": str(folder / "model.safetensors"),
                                    "sha256": _sha(folder / "model.safetensors"), "pinned": cfg.get("weights_sha256")}
    if intent_model:
        try:
            from vitrine.intent.model import CONFIG_NAME, WEIGHTS_NAME, resolve_weights

            ip = resolve_weights(intent_model)
            icfg = json.loads((ip / CONFIG_NAME).read_text(encoding="utf-8"))
            files["intent.weights"] = {"path": str(ip / WEIGHTS_NAME), "sha256": _sha(ip / WEIGHTS_NAME),
                                       "pinned": icfg.get("weights_sha256")}
        except (ImportError, OSError, ValueError, VitrineError) as e:
            files["intent.weights"] = {"error": str(e)}
    return out


def served_artifacts(spec: ModelSpec, encoder: MultimodalEncoder, intent_model: str | None = None) -> dict[str, Any]:
    """:func:`model_artifacts`, or ``{"error": ...}`` when they cannot be read (a snapshot still
    publishes: the records hold every change)."""
    try:
        return model_artifacts(spec, encoder, intent_model)
    except (OSError, ValueError, VitrineError) as e:
        return {"error": str(e)}


def verify_artifacts(artifacts: dict[str, Any]) -> list[str]:
    """Artifacts whose SHA-256 differs from their pin (one line each, naming both)."""
    bad = []
    for name, f in (artifacts.get("files") or {}).items():
        if f.get("pinned") and f.get("sha256") and f["pinned"] != f["sha256"]:
            bad.append(f"{name} {f.get('path')}: sha256 {f['sha256']}, pinned {f['pinned']}")
    return bad


def _sha(path: Path) -> str:
    from vitrine.encoders.factory import sha256_file

    return sha256_file(path)


def read_active_model(index_dir: Path) -> dict[str, Any] | None:
    try:
        d = json.loads((index_dir / ACTIVE_MODEL).read_text(encoding="utf-8"))
        return d if isinstance(d, dict) and d.get("adapter") and d.get("model") else None
    except (OSError, ValueError):
        return None


def write_active_model(index_dir: Path, spec: ModelSpec, *, model_key: str, index_factory: str, source: str) -> None:
    """Remember the model a hot swap activated (a restart serves it: ``Settings.swap.follow_swap``)."""
    body = {**spec.as_dict(), "model_key": model_key, "index_factory": index_factory,
            "activated": time.time(), "source": source}
    atomic_write_bytes(index_dir / ACTIVE_MODEL, json.dumps(body, indent=2).encode())
