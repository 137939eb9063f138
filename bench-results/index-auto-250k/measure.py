"""The auto index built as a snapshot write builds it (switch + nprobe calibration) from the 250k data dir's
rows; recall@10 on the catalogue's real judged query texts against exact search, and ms per single query."""
import json, sys, time, os, logging
import numpy as np
logging.basicConfig(level=logging.INFO, format="%(message)s")
data, cat, out_path = sys.argv[1], sys.argv[2], sys.argv[3]
from vitrine.index.snapshots import SnapshotStore
from vitrine.index.vectors import VectorIndex, set_search_threads
from vitrine.settings import Settings
from vitrine.search.engine import build_encoder
from vitrine.encoders.queries import QueryEncoder, unit_rows
snap = SnapshotStore(os.path.join(data, "index")).candidates()[0]
texts = [json.loads(l)["text"] for l in open(os.path.join(cat, "queries.jsonl"))][:500]
enc = build_encoder(Settings()); qe = QueryEncoder(enc, runtime="torch")
qv = {"fused": np.stack(qe.text(texts)).astype(np.float32), "native": unit_rows(qe.text_features(texts)).astype(np.float32)}
out = {"queries": len(texts), "catalogue": cat}
for f in ("fused", "native"):
    old = VectorIndex.load(snap.file(f"{f}.vidx"), snap.sha256(f"{f}.vidx"))
    ids = old.ids(); X = old.get(ids); del old
    idx = VectorIndex(X.shape[1], "auto"); idx.upsert(ids, X)
    t = time.perf_counter(); idx.save(f"/tmp/m250/{f}-auto.vidx"); t_save = time.perf_counter() - t
    set_search_threads(1)
    q = qv[f]; exact = ids[np.argsort(-(q @ X.T), axis=1)[:, :10]]
    t = time.perf_counter(); got = np.stack([idx.search(q[i:i+1], 10)[1][0] for i in range(len(q))]); ms = (time.perf_counter() - t) / len(q) * 1000
    rec = float(np.mean([len(set(a) & set(b)) / 10 for a, b in zip(got.tolist(), exact.tolist())]))
    scan = VectorIndex(X.shape[1], "SQfp16"); scan.upsert(ids, X)
    t = time.perf_counter(); [scan.search(q[i:i+1], 10) for i in range(len(q))]; ms_scan = (time.perf_counter() - t) / len(q) * 1000
    set_search_threads(2)
    out[f] = {"n": int(len(ids)), "dim": int(X.shape[1]), "factory": idx.factory, "nprobe": idx.nprobe, "recall@10": round(rec, 4),
              "ms_per_query": round(ms, 3), "sqfp16_scan_ms_per_query": round(ms_scan, 3), "save_with_switch_s": round(t_save, 1)}
    print(f, out[f], flush=True)
json.dump(out, open(out_path, "w"), indent=2)
