"""Opening a data dir: the in-memory indexes from the newest usable snapshot version, then the
record store's changes since it.

Every snapshot file is checked against its manifest's SHA-256; a refused version falls back to
the previous one, and with none usable everything is rebuilt from the records. What was found
and done goes to the log and to ``IndexState.recovery`` (/health).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from vitrine.errors import StorageError
from vitrine.index import index_choice, vector_files
from vitrine.index.filters import FilterIndex
from vitrine.index.graph import ProductGraph
from vitrine.index.snapshots import Snapshot
from vitrine.index.vectors import VectorIndex, VectorIndexAPI
from vitrine.search import native
from vitrine.search.snapshot_parts import load_text_index
from vitrine.search.state import (
    FILTERS_FILE,
    GRAPH_FILE,
    INDEX_FIELDS,
    LEGACY_GRAPH_FILE,
    IndexState,
    LoadedIndexes,
)

log = logging.getLogger(__name__)


def open_indexes(state: IndexState, reembed: Callable[[], int] | None = None,
                 shared: LoadedIndexes | None = None) -> dict[str, Any]:
    """Load ``state``'s indexes (see the module docstring); ``reembed`` re-embeds the products
    another model embedded (None: only warn about them). With ``shared`` (indexes the process this
    one was forked from opened) those serve, caught up with the later changes, when they were made
    by this model over this record store. Returns and keeps the recovery report."""
    t0 = time.time()
    if shared is not None:
        why = _unshareable(state, shared)
        if why is None:
            return _adopt(state, shared, t0)
        log.warning("not serving the indexes loaded before the fork: %s; opening the data dir", why)
    records, s = state.records, state.options
    # Read first: everything up to it is in what follows; later changes (other writers of a
    # shared store) are replayed by the next refresh. Read after the replay, it could claim a
    # change committed during it that the replay did not see.
    target = records.seq
    rec: dict[str, Any] = {"records_seq": target, "snapshot": None, "snapshot_seq": None,
                           "refused": [], "skipped": [], "partial": [p.name for p in state.snapshots.partials()]}
    loaded: Snapshot | None = None
    graph_loaded = False
    # pgvector: the vectors live in the database, nothing of them is snapshotted locally
    for snap in state.snapshots.candidates() if s.vector_backend == "faiss" else []:
        why, fatal, graph_loaded = _try_snapshot(state, snap)
        if why is None:
            loaded = snap
            break
        (rec["refused"] if fatal else rec["skipped"]).append({"version": snap.name, "reason": why})
        (log.warning if fatal else log.info)("index snapshot %s not used: %s", snap.name, why)
    if loaded is None:
        state.restore({f: state.new_index(f) for f in INDEX_FIELDS}, state.new_native(), None, 0, None)
        graph_loaded = False
    else:
        rec["snapshot"], rec["snapshot_seq"] = loaded.name, state.seq
        state.parts.opened_from = loaded
        rec["text_index_loaded"] = load_text_index(state.parts, records)
    if not graph_loaded:  # no usable graph snapshot: build it from every record
        state.rebuild_graph()
    filters_rebuilt = not state.filters_loaded
    if filters_rebuilt:
        state.mark_changed()  # the next version keeps them: a restart then loads them
    # Vectors, graph and filters replay what the snapshot lacks (filters it lacks: rebuilt from the records).
    replayed, stale_model = state.replay(target)
    if loaded is None:
        state.mark_changed()
    rec.update(replayed=replayed, rebuilt=loaded is None, graph_rebuilt=not graph_loaded,
               filters_rebuilt=filters_rebuilt, products=records.count(), stale_model=stale_model)
    if stale_model and reembed is not None:
        log.warning("%d products were embedded by another model; re-embedding them with %s",
                    stale_model, state.model_key)
        rec["reembedded"] = reembed()
        stale_model = 0
    rec["seconds"] = round(time.time() - t0, 3)
    rec["summary"] = summary(rec)
    state.recovery = rec
    (log.warning if rec["refused"] or rec["partial"] else log.info)(
        "opened %s: %d products in %.2fs; %s", state.data_dir, records.count(), time.time() - t0, rec["summary"])
    if stale_model:
        log.warning(
            "%d products were embedded by another model; run `vitrine reindex --data %s` to re-embed",
            stale_model, state.data_dir,
        )
    return rec


def _unshareable(state: IndexState, loaded: LoadedIndexes) -> str | None:
    if state.options.vector_backend != "faiss":  # pgvector: the forking process closed its connections
        return f"the vectors live in the database ({state.options.vector_backend})"
    if loaded.model_key != state.model_key:
        return f"made by another model ({loaded.model_key})"
    if loaded.store_id != state.store_id:
        return "made over another record store"
    if loaded.seq > state.records.seq:
        return f"they reflect change {loaded.seq} but the record store is at {state.records.seq}"
    return None


def _adopt(state: IndexState, loaded: LoadedIndexes, t0: float) -> dict[str, Any]:
    replayed = state.adopt(loaded)
    rec: dict[str, Any] = {
        "records_seq": state.records.seq, "snapshot": loaded.snapshot_version, "snapshot_seq": loaded.seq,
        "refused": [], "skipped": [], "partial": [], "shared": True, "replayed": replayed, "rebuilt": False,
        "graph_rebuilt": False, "filters_rebuilt": False, "products": state.records.count(), "stale_model": 0,
        "seconds": round(time.time() - t0, 3)}
    rec["summary"] = (f"serving the indexes loaded before the fork (change {loaded.seq}, shared copy-on-write); "
                      f"replayed {replayed} later changes")
    state.recovery = rec
    log.info("opened %s: %s", state.data_dir, rec["summary"])
    return rec


def _try_snapshot(state: IndexState, snap: Snapshot) -> tuple[str | None, bool, bool]:
    """Load one snapshot version into ``state``. Returns (why not, whether that is damage rather
    than a different model or index, whether its graph was loaded)."""
    s = state.options
    m = snap.manifest
    if m is None:
        return snap.error or "no manifest", True, False
    if m.get("model_key") != state.model_key:
        return f"built by another model ({m.get('model_key')})", False, False
    if not index_choice.fits(str(m.get("factory")), s.index_factory):
        return f"a {m.get('factory')} index (configured: {s.index_factory})", False, False
    try:
        seq = int(m["seq"])
    except (KeyError, TypeError, ValueError):
        return "manifest has no change sequence number", True, False
    if seq > state.records.seq:
        return (f"it reflects change {seq} but the record store is at {state.records.seq} "
                "(the records were replaced by an older copy)"), True, False
    store = (m.get("records") or {}).get("store_id")
    if store and store != state.store_id:
        return "it belongs to another record store", True, False
    try:
        files = m.get("files") or {}
        nat = state.new_native()
        with_native = native.FILE in files and m.get("native_towers") == nat.towers_key
        # the large files first, checked side by side; then loaded without checking again
        vidx = [f"{f}.vidx" for f in INDEX_FIELDS] + ([native.FILE] if with_native else [])
        vector_files.verify_many([(snap.file(n), snap.sha256(n)) for n in vidx], "vector index")
        vectors: dict[str, VectorIndexAPI] = {
            f: VectorIndex.load(snap.file(f"{f}.vidx"), None, mmap=s.mmap_indexes,
                                auto=s.index_factory == "auto", nprobe=s.nprobe, ef_search=s.ef_search)
            for f in INDEX_FIELDS}
        graph = None
        same_graph = m.get("graph_fingerprint") in (None, state.graph_data.fingerprint)
        graph_file = next((f for f in (GRAPH_FILE, LEGACY_GRAPH_FILE) if f in files), None)
        if graph_file is not None and same_graph:
            graph = ProductGraph.load(snap.file(graph_file), state.graph_data, snap.sha256(graph_file))
        filters = None
        if FILTERS_FILE in files:  # older versions lack it: rebuilt from the records
            filters = FilterIndex.load(snap.file(FILTERS_FILE), snap.sha256(FILTERS_FILE), state.filters.fields)
        if with_native:
            nat.load(snap.file(native.FILE).parent, None, mmap=s.mmap_indexes,
                     auto=s.index_factory == "auto", nprobe=s.nprobe, ef_search=s.ef_search)
    except StorageError as e:
        return str(e), True, False
    except (KeyError, ValueError, OSError) as e:
        return f"unreadable: {e}", True, False
    state.restore(vectors, nat, graph, seq, snap.name, filters)  # missing native: filled after replay
    if graph is not None and graph_file == LEGACY_GRAPH_FILE:
        state.mark_changed()  # the next version keeps the graph as it is written now
    return None, False, graph is not None


def summary(rec: dict[str, Any]) -> str:
    """One line saying what opening the data dir found and did."""
    parts = []
    if rec.get("snapshot"):
        parts.append(f"loaded snapshot {rec['snapshot']} (change {rec['snapshot_seq']})")
    else:
        parts.append("no usable snapshot: rebuilt from the records")
    parts.append(f"replayed {rec.get('replayed', 0)} later changes")
    for r in rec.get("refused", []):
        parts.append(f"refused {r['version']}: {r['reason']}")
    if rec.get("partial"):
        parts.append(f"ignored {len(rec['partial'])} half-written snapshot(s) left by a crash")
    if rec.get("reembedded"):
        parts.append(f"re-embedded {rec['reembedded']} products made by another model")
    return "; ".join(parts)
