"""The BM25 signal in PostgreSQL: a weighted ``tsvector`` per product (GIN-indexed), ranked by
``ts_rank_cd`` per query word times BM25's inverse document frequency.

The words are the same as SQLite's (:func:`vitrine.index.symbolic.fields`: title, brand,
category path, attribute values), each column with a weight letter so that the column weights
of FTS5 carry over: brand A (2.0), category B (1.5), title C (1.0), attributes D (1.0).
Words are stemmed by the ``english`` text search configuration (Snowball; FTS5 uses Porter),
and English stopwords are dropped from documents as well as queries.

PostgreSQL's own ranking has no inverse document frequency: ``ts_rank_cd`` counts weighted
occurrences ("cover density") of the query's words, normalised here by ``1 + log(document
length)`` (normalisation 1). FTS5's BM25 weighs a rare word far above a common one ("leather"
above "men"), which matters for OR-queries. So a query is scored word by word::

    score(p) = sum over query words w that p contains of  idf(w) * ts_rank_cd(weights, tsv(p), w, 1)
    idf(w)   = max(ln((N - n_w + 0.5) / (n_w + 0.5)), 1e-6)        (FTS5's idf, the same floor)

with ``n_w`` the live products containing ``w`` (counted through the GIN index) and ``N`` the
live products; the store caches both for as long as its change sequence stays put (at most a
second behind other processes' writes), so a search is one query. Term frequency saturation and length normalisation are
``ts_rank_cd``'s (not BM25's k1/b): scores differ from FTS5's in scale and somewhat in order;
bench-results/scaleout.md measures what that does to the attribute and exact-word protocols.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from vitrine.index import symbolic

CONFIG = "english"
# ts_rank's weight array is {D, C, B, A}: attributes, title, category, brand (FTS5's 1, 1, 1.5, 2
# halved: PostgreSQL takes weights up to 1; a common factor does not change an order)
WEIGHTS = [0.5, 0.5, 0.75, 1.0]
COLUMN_LETTERS = ("C", "A", "B", "D")  # symbolic.COLUMNS order: title, brand, category, attrs

TSV_SQL = " || ".join(f"setweight(to_tsvector('{CONFIG}', %s), '{c}')" for c in COLUMN_LETTERS)


def tsv_args(doc: Mapping[str, Any]) -> tuple[str, str, str, str]:
    """The four column texts :data:`TSV_SQL` takes, for a stored product document."""
    return symbolic.fields(doc)


def idf(n: float, df: float) -> float:
    """FTS5's inverse document frequency (the same floor)."""
    return max(math.log((n - df + 0.5) / (df + 0.5)), 1e-6)


def live_count_sql(table: str) -> str:
    return f"SELECT count(*) FROM {table} WHERE tsv IS NOT NULL"


def df_sql(table: str) -> str:
    """(word, live products holding it) for ``%s`` words, each counted through the GIN index."""
    return (f"SELECT t.word, (SELECT count(*) FROM {table} WHERE tsv @@ plainto_tsquery('{CONFIG}', t.word)) "
            "FROM unnest(%s::text[]) AS t(word)")


def _score_sql(table: str, only: bool, limit: bool) -> str:
    return f"""
WITH w AS (SELECT DISTINCT ON (q) q, idf FROM (SELECT plainto_tsquery('{CONFIG}', t.word) AS q, t.idf
           FROM unnest(%(words)s::text[], %(idfs)s::float8[]) AS t(word, idf)) x WHERE numnode(q) > 0)
SELECT p.iid, sum(w.idf * ts_rank_cd(%(weights)s::float4[], p.tsv, w.q, 1)) AS s
FROM w JOIN {table} p ON p.tsv @@ w.q {"AND p.iid = ANY(%(only)s)" if only else ""}
GROUP BY p.iid
{"ORDER BY s DESC, p.iid LIMIT %(k)s" if limit else ""}"""


def search_query(table: str, words: Sequence[str], idfs: Sequence[float], k: int,
                 only: Sequence[int] | None) -> tuple[str, dict[str, Any]] | None:
    """SQL and parameters for the top-``k`` (iid, score) of ``words`` (:func:`query_words`)."""
    if not words or k <= 0 or (only is not None and not len(only)):
        return None
    args: dict[str, Any] = {"words": list(words), "idfs": list(idfs), "weights": WEIGHTS, "k": int(k)}
    if only is not None:
        args["only"] = [int(i) for i in only]
    return _score_sql(table, only is not None, True), args


def scores_query(table: str, words: Sequence[str], idfs: Sequence[float]) -> tuple[str, dict[str, Any]] | None:
    """SQL and parameters for the score of every product holding one of ``words``."""
    if not words:
        return None
    return _score_sql(table, False, False), {"words": list(words), "idfs": list(idfs), "weights": WEIGHTS}


query_words = symbolic.query_words
