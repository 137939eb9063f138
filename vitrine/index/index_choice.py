"""The FAISS index a catalogue of a given size gets under ``index_factory=auto``.

- Below ``ANN_FROM`` rows: ``SQfp16``, an exhaustive scan over float16 copies whose hits are
  scored again exactly (scores are exact; 1.1 ms per query over 20,873 x 256 on one core). Its
  cost grows with the catalogue: one query reads every row of both spaces.
- From ``ANN_FROM`` rows: ``IVF{nlist},Flat`` with ``nlist`` the power of two nearest
  ``4 * sqrt(n)`` (4096 at 1M), searched with the ``nprobe`` setting (16 by default). On 1,000,000
  vectors grown from the catalogue, IVF4096,Flat at nprobe 16 had recall@10 0.987 against exact
  search at 2,000 single queries/s, where an exact float32 scan managed 10/s on one core
  (bench-results/index.md). Rows the IVF index has not taken in yet are searched exactly.

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

import math
import re

AUTO = "auto"
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
