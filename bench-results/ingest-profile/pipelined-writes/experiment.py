"""Experiment (not product code): does overlapping an ingest batch's writes with the next batch's
encode pay on this machine?

``python experiment.py serial|pipe ingest CATALOG --data D`` runs ``vitrine ingest`` as shipped
(``serial``: each batch encodes, then writes its photos and commits, under the write lock) or with
the write of batch N (photo store + ``IndexState.commit``: SQLite, FTS5, graph, FAISS, filters) in a
writer thread while batch N+1 encodes (``pipe``; the read-index preparation waits for the last write).
The pipe variant skips the unchanged/stale checks: run it only into an empty data dir.
Results: README.md beside this file.
"""

import hashlib
import sys
from concurrent.futures import Future, ThreadPoolExecutor

import vitrine.search.reads as reads
import vitrine.search.writes as writes
from vitrine.cli.app import main
from vitrine.search.writes import UpsertReport

writer = ThreadPoolExecutor(1)
pending: list[Future] = []


def piped_upsert(self, items, *, progress=False):
    st = self.state
    report = UpsertReport()
    todo = [(it, it.image, hashlib.sha256(it.image).hexdigest() if it.image is not None else None) for it in items]
    with st.write_lock:
        rows = self.encode_rows(todo, report, progress=False)
    if pending:
        pending.pop().result()
    photos = {it.product.id: img for it, img, _ in todo if img is not None}

    def finish():
        with st.write_lock:
            st.images.put_many({r.image_key: photos[r.id] for r in rows if r.image_key})
            st.commit(rows)

    pending.append(writer.submit(finish))
    report.upserted += len(rows)
    return report


if sys.argv[1] == "pipe":
    writes.WritePath.upsert = piped_upsert
    prepare = reads.ReadPath.prepare

    def prepare_after_writes(self):
        if pending:
            pending.pop().result()
        return prepare(self)

    reads.ReadPath.prepare = prepare_after_writes
sys.argv = ["vitrine"] + sys.argv[2:]
main()
