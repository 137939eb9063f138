"""The FAISS index a catalogue of a given size gets under ``index_factory=auto``.

- Below ``ANN_FROM`` rows: ``SQfp16``, an exhaustive scan over float16 copies whose hits are
  scored again exactly (scores are exact; 1.1 ms per query over 20,873 x 256 on one core). Its
  cost grows with the catalogue: one query reads every row of both spaces.
- From ``ANN_FROM`` rows: ``IVF{nlist},Flat`` with ``nlist`` the power of two nearest
  ``4 * sqrt(n)`` (2048 at 250k, 4096 at 1M). Its ``nprobe`` starts at the setting (16 by
  default) and is doubled until recall@10 against exact search reaches ``RECALL_TARGET`` on a sample
  of the catalogue's own rows (:func:`calibrate_nprobe`); the snapshot keeps it. How many lists a
  catalogue needs depends on how clustered its vectors are: on 1,000,000 vectors grown from the
  fashion catalogue IVF4096,Flat reached recall@10 0.987 at 16 (bench-results/index.md); on
  250,000 synthetic products (near-duplicates in places) 16 gave 0.935 on judged query texts and the
  calibrated 256 gave 0.993 at 1.7 ms per query (bench-results/index-auto-250k/). Rows the IVF index
  has not taken in yet are searched exactly.

The switch is at 200,000 rows: there an exact scan of both spaces (256 + 384 dimensions, float16)
reads about 250 MB per query, 10-20 ms on these cores, already more than the rest of a search
costs; below it exactness is cheap. The index is re-chosen when a snapshot is saved (the point
where an index is written whole anyway) and, once IVF, only switches back to a scan below
``BACK_BELOW`` rows, so a catalogue near the line does not flip at every snapshot. The new index is
built (IVF: trained, tens of seconds at 200,000 rows on 2 cores) from a copy of the rows while the
old one keeps answering; it replaces it only if nothing was written meanwhile, else the next
snapshot tries again.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable

import numpy as np

log = logging.getLogger(__name__)

AUTO = "auto"
# recall@10 an auto IVF index must reach against exact search, with a sample of the catalogue's own
# rows as queries (each without itself); on 250,000 synthetic products that ran 0.01-0.03 above the
# recall of generated query texts, so 0.99 here held those at 0.98 (bench-results/index-auto-250k/)
RECALL_TARGET = 0.99
CALIBRATION_QUERIES = 300
SCAN = "SQfp16"
ANN_FROM = 200_000
BACK_BELOW = 160_000  # hysteresis: an IVF index stays IVF down to here


def choose(n: int, current: str | None = None) -> str:
    """The factory for ``n`` live rows (``current``: the factory the index has now)."""
    ivf = current is not None and current.startswith("IVF")
    if n < (BACK_BELOW if ivf else ANN_FROM):
        return SCAN
    nlist = 2 ** round(math.log2(4 * math.sqrt(n)))
    return f"IVF{nlist},Flat"


def fits(saved: str, configured: str) -> bool:
    """Whether an index saved as ``saved`` serves a configuration of ``configured``: the same
    factory, or under ``auto`` any factory auto chooses (a data dir that ran SQfp16 keeps its
    snapshot when the setting becomes auto)."""
    if configured == AUTO:
        return saved in (AUTO, SCAN) or re.fullmatch(r"IVF\d+,Flat", saved) is not None
    return saved == configured


def calibrate_nprobe(search: Callable[[np.ndarray, int], np.ndarray], exact: Callable[[np.ndarray, int], np.ndarray],
                     set_nprobe: Callable[[int], None], rows: np.ndarray, nlist: int, start: int, seed: int = 0) -> int:
    """The smallest ``nprobe`` of ``start``, 2 x start, ... (at most ``nlist``) at which ``search``
    (queries, k -> row numbers) has recall@10 >= RECALL_TARGET against ``exact`` (the same, by exact
    search) over ``rows``, with CALIBRATION_QUERIES of the rows as queries (each left out of its own
    answers). Leaves the index set to it (``set_nprobe``)."""
    n, m = len(rows), CALIBRATION_QUERIES
    if n <= 10 * m:
        set_nprobe(start)
        return start
    pick = np.sort(np.random.default_rng(seed).choice(n, m, replace=False))
    q = np.ascontiguousarray(rows[pick])
    exact_rows = [[r for r in row if r != p][:10] for row, p in zip(exact(q, 11).tolist(), pick.tolist())]
    nprobe, recall = max(1, start), 0.0
    while True:
        set_nprobe(nprobe)
        got = search(q, 11).tolist()
        recall = float(np.mean([len(set(g) & set(e)) / len(e) for g, e in zip(got, exact_rows)]))
        if recall >= RECALL_TARGET or nprobe >= nlist:
            break
        nprobe = min(nlist, nprobe * 2)
    log.info("IVF%d: nprobe %d gives recall@10 %.3f against exact search on %d of the catalogue's rows",
             nlist, nprobe, recall, m)
    return nprobe
