"""The graph on disk: node-link JSON (never pickle), written atomically, with a SHA-256 the
engine's snapshot manifest records. A snapshot built from other graph data (another fingerprint)
or in another format is refused, and the graph is rebuilt from the records."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import networkx as nx

from vitrine.atomic import atomic_write_bytes
from vitrine.errors import StorageError
from vitrine.index.graph_store import FORMAT_VERSION, GraphStore
from vitrine.index.snapshots import read_verified
from vitrine.index.vocabulary import GraphData


def save_graph(store: GraphStore, path: str | Path) -> str:
    """Write the store's graph as node-link JSON atomically; returns its SHA-256."""
    with store.lock:
        store.g.graph["format"] = FORMAT_VERSION
        store.g.graph["fingerprint"] = store.data.fingerprint
        payload = nx.node_link_data(store.g, edges="edges")
        data = json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode()
    atomic_write_bytes(Path(path), data)
    return hashlib.sha256(data).hexdigest()


def read_graph(path: str | Path, data: GraphData, expected_sha256: str | None = None) -> nx.MultiDiGraph:
    """Read a node-link JSON snapshot; StorageError if it is unreadable, fails its checksum,
    or was built from other graph data (then rebuild from the records)."""
    path = Path(path)
    raw = read_verified(path, expected_sha256, "graph")
    try:
        payload = json.loads(raw)
        g = nx.node_link_graph(payload, directed=True, multigraph=True, edges="edges")
    except (ValueError, KeyError, TypeError, nx.NetworkXError) as e:
        raise StorageError(f"graph {path} is unreadable: {e}") from e
    if g.graph.get("format") != FORMAT_VERSION:
        raise StorageError(f"graph {path} has format {g.graph.get('format')}, expected {FORMAT_VERSION}")
    if g.graph.get("fingerprint") != data.fingerprint:
        raise StorageError(f"graph {path} was built from other graph data; rebuilding")
    if not isinstance(g, nx.MultiDiGraph):
        raise StorageError(f"graph {path} is not a directed multigraph")
    return g
