"""Symbolic retrieval: BM25 over titles, brands, categories and attribute values (SQLite FTS5).

The full-text table lives in the record store's own SQLite file and is written inside the same
transactions as the records (``RecordStore.upsert_many``/``delete_many`` call :func:`write` and
:func:`remove`), so words and records can never disagree. Rows are keyed by the product's
``iid``. FTS5 ranks by BM25; ``bm25()`` returns lower-is-better numbers, which are negated here
so a larger score is a better match. Words are stemmed (Porter), so "shirts" finds "shirt".

Chinese has no spaces, and FTS5's tokenizer makes one token of a run of Chinese characters. So
every run in a product's text and in a query is written as its words (jieba, search mode: "手提包"
-> "手提", "提包", "手提包") and its overlapping character pairs ("黑色手提包" -> "黑色", "色手",
"手提", "提包"), space separated, before FTS5 sees it: a query's words then meet a title's whatever
the segmenter made of either, and a word the segmenter does not know still matches by its pairs.
Text without Chinese is untouched (and never loads the segmenter). :data:`FTS_VERSION` names this
form: a data dir written under another rebuilds its table on open.
"""

from __future__ import annotations

import json
import logging
import re
import sqlite3
from collections.abc import Mapping, Sequence
from typing import Any

from vitrine.lang import segment

log = logging.getLogger(__name__)

TABLE = "products_fts"
COLUMNS = ("title", "brand", "category", "attrs")
# Column weights for bm25(): a word in the brand or the category counts more than one in the title.
COLUMN_WEIGHTS = (1.0, 2.0, 1.5, 1.0)
FTS_VERSION = "2"  # 2: Chinese runs as words + character pairs
SCHEMA = (f"CREATE VIRTUAL TABLE IF NOT EXISTS {TABLE} USING fts5("
           f"{', '.join(COLUMNS)}, tokenize='porter unicode61 remove_diacritics 2')")
_WORD = re.compile(r"\w+", re.UNICODE)
_CJK_RUN = re.compile(f"[{segment.CJK}]+")
STOPWORDS = frozenset({
    "a", "an", "and", "the", "for", "of", "in", "on", "with", "to", "by", "at", "or", "from", "vs", "versus",
    "is", "are", "my", "me", "i", "some", "any", "show", "find", "want", "need", "looking", "like",
})
_SKIP_ATTRS = frozenset({"year"})


def available(conn: sqlite3.Connection) -> bool:
    try:
        conn.execute("CREATE VIRTUAL TABLE IF NOT EXISTS temp.fts_probe USING fts5(x)")
        conn.execute("DROP TABLE IF EXISTS temp.fts_probe")
        return True
    except sqlite3.OperationalError:
        return False


def ensure(conn: sqlite3.Connection) -> bool:
    """Create the table (and fill it from the live records when it is new). False when this
    SQLite lacks FTS5: symbolic retrieval is then off and the records work as before."""
    if not available(conn):
        log.warning("this SQLite has no FTS5: BM25 retrieval is off")
        return False
    have = conn.execute("SELECT value FROM meta WHERE key='fts'").fetchone()
    conn.execute(SCHEMA)
    if have is None or have[0] != FTS_VERSION:
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute(f"DELETE FROM {TABLE}")
            n = 0
            rows = conn.execute("SELECT iid, doc FROM products WHERE deleted=0 AND doc IS NOT NULL").fetchall()
            for iid, doc in rows:
                write(conn, int(iid), json.loads(doc))
                n += 1
            conn.execute("INSERT OR REPLACE INTO meta VALUES ('fts', ?)", (FTS_VERSION,))
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
        if n:
            log.info("indexed %d products for BM25", n)
    return True


def chinese_terms(text: str) -> str:
    """``text`` with each run of Chinese characters written as its words and character pairs
    (see the module docstring); text without Chinese as it is."""
    if not segment.has_cjk(text):
        return text

    def expand(m: re.Match[str]) -> str:
        run = m.group(0)
        parts = segment.words(run, search_mode=True) + segment.bigrams(run)
        return " " + " ".join(dict.fromkeys(parts or [run])) + " "

    return _CJK_RUN.sub(expand, text)


def fields(doc: Mapping[str, Any]) -> tuple[str, str, str, str]:
    """The text of each column for a stored product document (Chinese as :func:`chinese_terms`)."""
    cols = _plain_fields(doc)
    if not any(segment.has_cjk(c) for c in cols):
        return cols
    return (chinese_terms(cols[0]), chinese_terms(cols[1]), chinese_terms(cols[2]), chinese_terms(cols[3]))


def _plain_fields(doc: Mapping[str, Any]) -> tuple[str, str, str, str]:
    attrs: list[str] = []
    for k, v in (doc.get("attributes") or {}).items():
        if str(k).casefold() in _SKIP_ATTRS or isinstance(v, bool):
            continue
        if isinstance(v, list):
            attrs.extend(str(x) for x in v)
        elif isinstance(v, str):
            attrs.append(v)
    return (str(doc.get("title") or ""), str(doc.get("brand") or ""), " ".join(doc.get("category") or []),
            " ".join(attrs))


def write(conn: sqlite3.Connection, iid: int, doc: Mapping[str, Any]) -> None:
    conn.execute(f"DELETE FROM {TABLE} WHERE rowid=?", (iid,))
    conn.execute(f"INSERT INTO {TABLE}(rowid, {', '.join(COLUMNS)}) VALUES (?, ?, ?, ?, ?)", (iid, *fields(doc)))


def remove(conn: sqlite3.Connection, iid: int) -> None:
    conn.execute(f"DELETE FROM {TABLE} WHERE rowid=?", (iid,))


def query_words(text: str) -> list[str]:
    """The words of ``text`` a BM25 query uses: casefolded, stopwords dropped, first 32 distinct
    (Chinese as :func:`chinese_terms`)."""
    words = [w for w in _WORD.findall(chinese_terms(text).casefold()) if w not in STOPWORDS]
    return list(dict.fromkeys(words))[:32]


def match_expression(text: str) -> str | None:
    """A safe FTS5 query: every word of ``text`` (stopwords dropped), quoted, OR-ed."""
    words = query_words(text)
    if not words:
        return None
    return " OR ".join('"' + w.replace('"', '""') + '"' for w in words)


def search(conn: sqlite3.Connection, text: str, k: int, *, only: Sequence[int] | None = None,
           weights: Sequence[float] = COLUMN_WEIGHTS) -> list[tuple[int, float]]:
    """Top-``k`` (iid, score) by BM25, best first; ``only`` restricts (and scores) those iids."""
    expr = match_expression(text)
    if expr is None or k <= 0:
        return []
    w = ", ".join(str(float(x)) for x in weights)
    sql = f"SELECT rowid, -bm25({TABLE}, {w}) AS s FROM {TABLE} WHERE {TABLE} MATCH ?"
    args: list[Any] = [expr]
    if only is not None:
        ids = [int(i) for i in only]
        if not ids:
            return []
        sql += f" AND rowid IN ({','.join('?' * len(ids))})"
        args.extend(ids)
    sql += " ORDER BY s DESC LIMIT ?"
    args.append(int(k))
    try:
        return [(int(r), float(s)) for r, s in conn.execute(sql, args)]
    except sqlite3.OperationalError as e:  # a malformed expression never reaches here, but be safe
        log.warning("BM25 query failed (%s) for %r", e, text)
        return []


def count(conn: sqlite3.Connection) -> int:
    return int(conn.execute(f"SELECT COUNT(*) FROM {TABLE}").fetchone()[0])


def scores(conn: sqlite3.Connection, text: str, *, limit: int = 200_000,
           weights: Sequence[float] = COLUMN_WEIGHTS) -> dict[int, float]:
    """BM25 score of every product matching ``text`` (one pass over the matches: a hybrid ranker
    takes its top candidates and the scores of other candidates from the same answer)."""
    expr = match_expression(text)
    if expr is None:
        return {}
    w = ", ".join(str(float(x)) for x in weights)
    try:
        cur = conn.execute(f"SELECT rowid, -bm25({TABLE}, {w}) FROM {TABLE} WHERE {TABLE} MATCH ? LIMIT ?",
                           (expr, int(limit)))
        return {int(r): float(s) for r, s in cur}
    except sqlite3.OperationalError as e:
        log.warning("BM25 query failed (%s) for %r", e, text)
        return {}
