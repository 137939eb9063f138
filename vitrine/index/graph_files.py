"""The graph on disk, never pickle, written atomically with a SHA-256 the engine's snapshot manifest
records: one array file (vitrine/index/vector_files.py) whose meta holds the graph of values as
node-link JSON with the products' ids and fact values, and whose one array is the products' rows of
fact codes. A graph built from other graph data (another fingerprint) or in another format is
refused, and the graph is rebuilt from the records. Format 1 (node-link JSON with a node per
product) is still read."""

from __future__ import annotations

import json
from pathlib import Path

import networkx as nx

from vitrine.errors import StorageError
from vitrine.index import vector_files
from vitrine.index.graph_store import FORMAT_VERSION, GraphStore, ProductRows
from vitrine.index.snapshots import read_verified
from vitrine.index.vocabulary import GraphData


def save_graph(store: GraphStore, path: str | Path) -> str:
    """Write the store's graph and products atomically; returns the file's SHA-256."""
    with store.lock:
        store.g.graph["format"] = FORMAT_VERSION
        store.g.graph["fingerprint"] = store.data.fingerprint
        payload = nx.node_link_data(store.g, edges="edges")
        pids, values, rows = store.product_rows()
    return vector_files.write_arrays(path, {"graph": payload, "pids": pids, "values": values}, {"codes": rows})


def read_graph(path: str | Path, data: GraphData,
               expected_sha256: str | None = None) -> tuple[nx.MultiDiGraph, ProductRows | None]:
    """Read a saved graph: (the graph, its products' rows; None for format 1, whose products are
    nodes). StorageError if it is unreadable, fails its checksum, or was built from other graph
    data (then rebuild from the records)."""
    path = Path(path)
    products: ProductRows | None = None
    try:
        legacy = not vector_files.is_array_file(path)  # format 1: node-link JSON
    except OSError as e:
        raise StorageError(f"cannot read graph {path}: {e}") from e
    try:
        if legacy:
            payload = json.loads(read_verified(path, expected_sha256, "graph"))
        else:
            meta, arrays = vector_files.read_arrays(path, expected_sha256, what="graph")
            payload = meta["graph"]
            products = (list(meta["pids"]), {k: list(v) for k, v in meta["values"].items()}, arrays["codes"])
        g = nx.node_link_graph(payload, directed=True, multigraph=True, edges="edges")
    except (ValueError, KeyError, TypeError, AttributeError, nx.NetworkXError) as e:
        raise StorageError(f"graph {path} is unreadable: {e}") from e
    if g.graph.get("format") not in (1, FORMAT_VERSION) or (g.graph.get("format") == 1) != legacy:
        raise StorageError(f"graph {path} has format {g.graph.get('format')}, expected {FORMAT_VERSION}")
    if g.graph.get("fingerprint") != data.fingerprint:
        raise StorageError(f"graph {path} was built from other graph data; rebuilding")
    if not isinstance(g, nx.MultiDiGraph):
        raise StorageError(f"graph {path} is not a directed multigraph")
    return g, products
