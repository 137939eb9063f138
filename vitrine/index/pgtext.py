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

with ``n_w`` the live products containing ``w`` (counted through the GIN index, inside the same
query) and ``N`` the live products. Term frequency saturation and length normalisation are
``ts_rank_cd``'s (not BM25's k1/b): scores differ from FTS5's in scale and somewhat in order;
bench-results/scaleout.md measures what that does to the attribute and exact-word protocols.
"""

from __future__ import annotations

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


def _score_sql(table: str, only: bool, limit: bool) -> str:
    return f"""
WITH w AS (SELECT plainto_tsquery('{CONFIG}', t.word) AS q FROM unnest(%(words)s::text[]) AS t(word)),
     wq AS (SELECT DISTINCT q FROM w WHERE numnode(q) > 0),
     n AS MATERIALIZED (SELECT count(*)::float8 AS n FROM {table} WHERE tsv IS NOT NULL),
     df AS MATERIALIZED (SELECT wq.q, (SELECT count(*) FROM {table} p WHERE p.tsv @@ wq.q)::float8 AS df FROM wq)
SELECT p.iid, sum(greatest(ln((n.n - df.df + 0.5) / (df.df + 0.5)), 1e-6)
                  * ts_rank_cd(%(weights)s::float4[], p.tsv, df.q, 1)) AS s
FROM df, n, {table} p
WHERE p.tsv @@ df.q {"AND p.iid = ANY(%(only)s)" if only else ""}
GROUP BY p.iid
{"ORDER BY s DESC, p.iid LIMIT %(k)s" if limit else ""}"""


def search_query(table: str, text: str, k: int, only: Sequence[int] | None) -> tuple[str, dict[str, Any]] | None:
    """SQL and parameters for the top-``k`` (iid, score) of ``text``; None when no word is left."""
    words = symbolic.query_words(text)
    if not words or k <= 0 or (only is not None and not len(only)):
        return None
    args: dict[str, Any] = {"words": words, "weights": WEIGHTS, "k": int(k)}
    if only is not None:
        args["only"] = [int(i) for i in only]
    return _score_sql(table, only is not None, True), args


def scores_query(table: str, text: str) -> tuple[str, dict[str, Any]] | None:
    """SQL and parameters for the score of every product matching a word of ``text``."""
    words = symbolic.query_words(text)
    if not words:
        return None
    return _score_sql(table, False, False), {"words": words, "weights": WEIGHTS}
