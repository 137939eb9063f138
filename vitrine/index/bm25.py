"""FTS5's ``bm25()`` scores, computed from an in-memory copy of the full-text index.

``symbolic.scores`` asks SQLite for the BM25 score of every product matching any word of a
query. A query with a common word ("men", "black") matches most of the catalogue, and FTS5
then evaluates ``bm25()`` row by row: 15-40 ms on the full catalogue, under the record
store's one connection lock, so text searches also queue behind each other. ``MemoryBM25``
gives the same numbers from numpy postings in about a millisecond, without that lock:

- postings (product -> column-weighted term frequency) and each product's token count are
  read once from FTS5 itself (``fts5vocab`` over the live table, so tokenisation, stemming and
  diacritics are exactly FTS5's), and query words are tokenised by an in-memory FTS5 table
  with the same tokenizer;
- the score is FTS5's formula term by term (k1 = 1.2, b = 0.75, idf = log((N - n + 0.5) /
  (n + 0.5)) floored at 1e-6, row size = all its tokens, avgdl over all rows), summed in the
  same order, so results equal SQLite's;
- it follows the record store's change sequence: products changed since its snapshot are
  re-read (their FTS rows re-tokenised) before a query is answered; a large change rebuilds;
- a query it cannot answer exactly (a "word" FTS5 splits into several tokens, a phrase)
  returns None and the caller asks SQLite;
- typo tolerance (``typo_tolerance``, on by default): a query word whose term no product holds
  scores as its closest catalogue term within the edits its length allows (vitrine/index/fuzzy.py;
  the most frequent of equally close ones), so "addidas runing shoes" scores as "adidas running
  shoes". A word the catalogue holds is never corrected.
"""

from __future__ import annotations

import logging
import math
import os
import re
import sqlite3
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from vitrine.errors import StorageError
from vitrine.index import fuzzy, symbolic, vector_files
from vitrine.lru import LRU

log = logging.getLogger(__name__)

K1 = 1.2
B = 0.75
_TOKENIZE = re.search(r"tokenize='([^']*)'", symbolic.SCHEMA).group(1)  # type: ignore[union-attr]  # the schema names it
_REBUILD_FRACTION = 0.2  # more changed products than this share of the catalogue: rebuild


class _Tokenizer:
    """FTS5's tokenizer (the table's own configuration) on an in-memory table, one per thread."""

    def __init__(self) -> None:
        self._local = threading.local()
        self._words: LRU[tuple[str, ...]] = LRU(50_000)

    def _conn(self) -> sqlite3.Connection:
        c = getattr(self._local, "conn", None)
        if c is None:
            c = sqlite3.connect(":memory:", isolation_level=None)
            cols = ", ".join(symbolic.COLUMNS)
            c.execute(f"CREATE VIRTUAL TABLE t USING fts5({cols}, tokenize='{_TOKENIZE}')")
            c.execute("CREATE VIRTUAL TABLE tv USING fts5vocab(t, 'instance')")
            self._local.conn = c
        return c

    def columns(self, values: Sequence[str]) -> list[tuple[str, int]]:
        """(term, column) of every token of a row's column texts."""
        c = self._conn()
        c.execute("DELETE FROM t")
        c.execute(f"INSERT INTO t(rowid, {', '.join(symbolic.COLUMNS)}) VALUES (1, ?, ?, ?, ?)", tuple(values))
        col_ix = {name: i for i, name in enumerate(symbolic.COLUMNS)}
        return [(term, col_ix[col]) for term, col in c.execute("SELECT term, col FROM tv")]

    def word(self, w: str) -> tuple[str, ...]:
        """The tokens FTS5 makes of one query word (cached)."""
        hit = self._words.get(w)
        if hit is not None:
            return hit
        c = self._conn()
        c.execute("DELETE FROM t")
        c.execute("INSERT INTO t(rowid, title) VALUES (1, ?)", (w,))
        toks = tuple(term for (term,) in c.execute("SELECT term FROM tv ORDER BY offset"))
        self._words.put(w, toks)
        return toks


class MemoryBM25:
    """Exact ``-bm25()`` of FTS5 for OR-of-words queries, over a record store's FTS table."""

    typo_tolerance: bool = True  # Settings.typo_tolerance (the engine sets it for its process)

    def __init__(self, path: str | os.PathLike[str], weights: Sequence[float] = symbolic.COLUMN_WEIGHTS) -> None:
        self.path = str(path)
        self.weights = np.asarray(weights, dtype=np.float64)
        self._conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=30)
        self._tok = _Tokenizer()
        self._lock = threading.RLock()  # guards the snapshot (refresh vs readers)
        self._seq = -1
        self._n_rows = 0
        self._total = 0.0
        self._len = np.zeros(0, dtype=np.float64)  # tokens per row, by iid
        self._base = Postings.empty()  # as of the last build or load: arrays, no object per product
        # changed since: term -> (iids, weighted tf) (empty: none left), iid -> its terms
        self._post_delta: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self._doc_delta: dict[int, tuple[str, ...]] = {}
        self._vocab: list[str] | None = None  # the terms, for typo corrections (built on first use)
        self._fixes = fuzzy.Corrections()
        # query term -> (iids, its BM25 part per iid) until the postings change (:meth:`_vocab_changed`): a
        # common word's part (lengths, tf saturation, idf over thousands of products) was recomputed per search
        self._parts: LRU[tuple[np.ndarray, np.ndarray]] = LRU(4096, max_weight=4_000_000, weight=lambda p: len(p[0]),
                                                              locked=False)
        self.on_rebuilt: Callable[[], None] | None = None  # told when a build read the whole FTS table

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def reopened(self) -> "MemoryBM25":
        """These postings for a process forked after they were built: a new index sharing them
        (copy-on-write pages) with connections and locks of its own (a SQLite connection must not
        be used across a fork). Its changes from then on are its own."""
        other = MemoryBM25.__new__(MemoryBM25)
        other.__dict__.update(self.__dict__)
        other._conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=30)
        other._tok = _Tokenizer()
        other._lock = threading.RLock()
        other._fixes = fuzzy.Corrections()
        return other

    @property
    def seq(self) -> int:
        """The record store's change the postings reflect (-1: not built); they change only with it."""
        return self._seq

    @property
    def built(self) -> bool:
        """Whether the postings were built or loaded (else the first query builds them)."""
        return self._seq >= 0

    # -- kept with the index snapshots ----------------------------------------------------------------
    def save(self, path: str | os.PathLike[str]) -> tuple[str, dict[str, Any]] | None:
        """Write the postings (the changes since the last build merged in) to one array file;
        returns (its SHA-256, a note of the change it reflects), or None when not built."""
        with self._lock:
            if self._seq < 0:
                return None
            base, delta, lens = self._base, dict(self._post_delta), self._len.copy()
            seq, n_rows = self._seq, self._n_rows
        if delta:  # arrays are replaced, never changed in place: merged outside the lock
            post = {t: p for t in base.terms if t not in delta and (p := base.get(t)) is not None}
            post.update((t, p) for t, p in delta.items() if len(p[0]))
            base = Postings.build(post, len(lens))
        meta = {"seq": seq, "n_rows": n_rows, "terms": base.terms, "weights": self.weights.tolist(),
                "tokenize": _TOKENIZE, "fts": symbolic.FTS_VERSION}
        sha = vector_files.write_arrays(path, meta, {
            "offsets": base.offsets, "ids": base.ids, "tf": base.tf, "doc_offsets": base.doc_offsets,
            "doc_terms": base.doc_terms, "lengths": lens})
        return sha, {"seq": seq, "products": n_rows, "terms": len(base.terms)}

    def load(self, path: str | os.PathLike[str], expected_sha256: str | None) -> None:
        """Serve postings :meth:`save` wrote (the changes after them are read before the next
        query); StorageError when damaged or made with another tokenizer or column weights."""
        meta, a = vector_files.read_arrays(path, expected_sha256, what="BM25 postings")
        try:
            if meta["tokenize"] != _TOKENIZE or meta["weights"] != self.weights.tolist() \
                    or meta.get("fts", "1") != symbolic.FTS_VERSION:
                raise StorageError(f"BM25 postings {path} were made with another tokenizer or column weights")
            base = Postings(list(map(sys.intern, meta["terms"])), a["offsets"], a["ids"], a["tf"],
                            a["doc_offsets"], a["doc_terms"])
            seq, n_rows = int(meta["seq"]), int(meta["n_rows"])
        except (KeyError, TypeError, ValueError) as e:
            raise StorageError(f"BM25 postings {path} are unreadable: {e}") from e
        if len(base.offsets) != len(base.terms) + 1 or len(base.ids) != len(base.tf) \
                or int(base.offsets[-1]) != len(base.ids) or len(base.doc_terms) != len(base.ids):
            raise StorageError(f"BM25 postings {path} are inconsistent")
        with self._lock:
            self._base, self._post_delta, self._doc_delta = base, {}, {}
            self._len = a["lengths"].astype(np.float64, copy=False)
            self._n_rows, self._total, self._seq = n_rows, float(self._len.sum()), seq
            self._vocab_changed()
        log.info("BM25 postings loaded: %d products, %d terms (seq %d)", n_rows, len(base.terms), seq)

    # -- the postings, from FTS5 --------------------------------------------------------------------
    def _rebuild(self) -> None:
        c = self._conn
        c.execute("BEGIN")
        try:
            seq = int((c.execute("SELECT value FROM meta WHERE key='seq'").fetchone() or (0,))[0])
            n_rows = int(c.execute(f"SELECT count(*) FROM {symbolic.TABLE}").fetchone()[0])
            c.execute(f"CREATE VIRTUAL TABLE IF NOT EXISTS temp.vitrine_bm25_vocab USING fts5vocab("
                      f"main, '{symbolic.TABLE}', 'instance')")
            rows = c.execute("SELECT term, doc, col FROM temp.vitrine_bm25_vocab").fetchall()
        finally:
            c.execute("COMMIT")
        col_ix = {name: i for i, name in enumerate(symbolic.COLUMNS)}
        acc: dict[str, dict[int, float]] = {}
        w = self.weights
        max_iid = 0
        lens: dict[int, int] = {}
        for term, doc, col in rows:
            term = sys.intern(term)  # one str per term, not one per (term, product, column) row
            wt = float(w[col_ix[col]])
            d = acc.setdefault(term, {})
            d[doc] = d.get(doc, 0.0) + wt
            lens[doc] = lens.get(doc, 0) + 1
            if doc > max_iid:
                max_iid = doc
        self._base = Postings.build({t: _arrays(d) for t, d in acc.items()}, max_iid + 1)
        self._post_delta, self._doc_delta = {}, {}
        self._len = np.zeros(max_iid + 1, dtype=np.float64)
        for doc, n in lens.items():
            self._len[doc] = n
        self._n_rows = n_rows
        self._total = float(self._len.sum())
        self._seq = seq
        self._vocab_changed()
        log.info("BM25 in memory: %d products, %d terms (seq %d)", n_rows, len(self._base.terms), seq)
        if self.on_rebuilt is not None:
            self.on_rebuilt()

    def _refresh(self, seq: int) -> None:
        """Apply the products changed since the snapshot (or rebuild when many changed)."""
        c = self._conn
        c.execute("BEGIN")
        try:
            now = int((c.execute("SELECT value FROM meta WHERE key='seq'").fetchone() or (0,))[0])
            changed = [int(r[0]) for r in c.execute("SELECT iid FROM products WHERE seq > ?", (self._seq,))]
            if len(changed) > max(1000, _REBUILD_FRACTION * max(self._n_rows, 1)):
                c.execute("COMMIT")
                self._rebuild()
                return
            cols = ", ".join(symbolic.COLUMNS)
            texts: dict[int, tuple[str, ...]] = {}
            for s in range(0, len(changed), 500):
                part = changed[s:s + 500]
                q = f"SELECT rowid, {cols} FROM {symbolic.TABLE} WHERE rowid IN ({','.join('?' * len(part))})"
                for row in c.execute(q, part):
                    texts[int(row[0])] = tuple(str(x or "") for x in row[1:])
            n_rows = int(c.execute(f"SELECT count(*) FROM {symbolic.TABLE}").fetchone()[0])
        finally:
            if c.in_transaction:
                c.execute("COMMIT")
        touched: dict[str, dict[int, float | None]] = {}
        for iid in changed:
            for t in self._terms_of(iid):
                touched.setdefault(t, {})[iid] = None
            self._doc_delta[iid] = ()
            if iid < len(self._len):
                self._len[iid] = 0.0
        w = self.weights
        for iid, vals in texts.items():
            per: dict[str, float] = {}
            toks = self._tok.columns(vals)
            for term, col in toks:
                per[term] = per.get(term, 0.0) + float(w[col])
            self._doc_delta[iid] = tuple(sys.intern(t) for t in per)
            for t, f in per.items():
                touched.setdefault(t, {})[iid] = f
            if iid >= len(self._len):
                grown = np.zeros(max(iid + 1, int(len(self._len) * 1.5) + 1), dtype=np.float64)
                grown[: len(self._len)] = self._len
                self._len = grown
            self._len[iid] = len(toks)
        for t, changes in touched.items():
            ids, fs = self._postings(t) or (_NO_IDS, _NO_TF)
            d = dict(zip(ids.tolist(), fs.tolist()))
            for iid, change in changes.items():
                if change is None:
                    d.pop(iid, None)
                else:
                    d[iid] = change
            self._post_delta[t] = _arrays(d)  # empty: the term is gone
        self._n_rows = n_rows
        self._total = float(self._len.sum())
        self._seq = now
        self._vocab_changed()

    def _vocab_changed(self) -> None:
        self._vocab = None
        self._fixes.clear()
        self._parts.clear()

    def _postings(self, term: str) -> tuple[np.ndarray, np.ndarray] | None:
        """(iids, weighted tf) of the products holding ``term`` (None: none)."""
        got = self._post_delta.get(term)
        if got is None:
            got = self._base.get(term)
        return got if got is not None and len(got[0]) else None

    def _terms_of(self, iid: int) -> tuple[str, ...]:
        got = self._doc_delta.get(iid)
        return got if got is not None else self._base.terms_of(iid)

    def _vocabulary(self) -> list[str]:
        if self._vocab is None:
            delta = self._post_delta
            self._vocab = [t for t in self._base.terms if t not in delta] + [t for t, (ids, _) in delta.items()
                                                                             if len(ids)]
        return self._vocab

    def document_frequencies(self) -> dict[str, int]:
        """Every term the postings hold and how many products hold it (a translator's vocabulary)."""
        with self._lock:
            base = self._base
            out = dict(zip(base.terms, np.diff(base.offsets).tolist()))
            for t, (ids, _) in self._post_delta.items():
                if len(ids):
                    out[t] = len(ids)
                else:
                    out.pop(t, None)
        return out

    def frequency(self, term: str, other: str | None = None) -> int:
        """How many products hold ``term`` (and ``other``, if given); 0: none. As of the postings'
        last sync."""
        with self._lock:
            post = self._postings(term)
            if post is None or other is None:
                return 0 if post is None else len(post[0])
            with_other = self._postings(other)
            return 0 if with_other is None else len(np.intersect1d(post[0], with_other[0], assume_unique=True))

    def near(self, term: str, word: str) -> list[tuple[str, int]]:
        """The catalogue terms within the edits the typed ``word`` allows of its ``term``, as
        (term, distance), closest first (what :meth:`correct` chooses from)."""
        edits = fuzzy.max_edits(word)
        if edits == 0:
            return []
        with self._lock:
            return self._fixes.near(term, edits, self._vocabulary)

    def correct(self, term: str, word: str) -> str | None:
        """The catalogue term a query word's unknown ``term`` most likely meant (None: none close).
        ``word`` (the word as typed) sets how many edits are allowed."""
        edits = fuzzy.max_edits(word)
        if edits == 0:
            return None
        with self._lock:
            return self._fixes.best(term, edits, self._vocabulary,
                                    lambda t: float(len(p[0])) if (p := self._postings(t)) is not None else 0.0)

    def sync(self, seq: int) -> None:
        """Make the snapshot reflect the store at change sequence ``seq`` (or later)."""
        if seq == self._seq:
            return
        with self._lock:
            if self._seq < 0:
                self._rebuild()
            elif seq != self._seq:
                self._refresh(seq)

    # -- queries -----------------------------------------------------------------------------------
    def scores(self, text: str, seq: int) -> Mapping[int, float] | None:
        """iid -> BM25 score (larger is better) of every product matching any word of ``text``,
        as ``symbolic.scores`` would give; None when only SQLite can answer exactly."""
        words = symbolic.query_words(text)
        if not words:
            return {}
        terms = []
        for w in words:
            toks = self._tok.word(w)
            if len(toks) != 1:
                return None
            terms.append((toks[0], w))
        self.sync(seq)
        with self._lock:
            n = self._n_rows
            if n == 0:
                return {}
            docs, parts = [], []
            for t, w in terms:
                key = (t, fuzzy.max_edits(w), self.typo_tolerance)  # what a correction of ``t`` depends on
                hit = self._parts.get(key)
                if hit is None:
                    post = self._postings(t)
                    if post is None and self.typo_tolerance:
                        fixed = self.correct(t, w)
                        post = self._postings(fixed) if fixed is not None else None
                    if post is None:
                        continue
                    hit = self._term_part(key, post)
                docs.append(hit[0])
                parts.append(hit[1])
        if not docs:
            return {}
        if len(docs) == 1:  # one term: its postings are already sorted and unique
            return BM25Scores(docs[0], parts[0])
        # Sum per product with dense bincounts over the iid range: O(hits + products), no sort
        # (np.unique sorted every hit: a common word matches thousands). Same additions, same order.
        all_ids = np.concatenate(docs)
        size = int(all_ids.max()) + 1
        hits = np.bincount(all_ids, minlength=size)
        tot = np.bincount(all_ids, weights=np.concatenate(parts), minlength=size)
        uniq = np.flatnonzero(hits)
        return BM25Scores(uniq, tot[uniq])


    def _term_part(self, key: tuple[str, int, bool], post: tuple[np.ndarray, np.ndarray]
                   ) -> tuple[np.ndarray, np.ndarray]:
        """(iids, BM25 part per iid) of the postings ``post`` a query term read, remembered under
        ``key`` until the postings change (a misspelt term: those of its correction). Under the lock."""
        n = self._n_rows
        avgdl = self._total / n
        ids, f = post
        nhit = len(ids)
        idf = math.log((n - nhit + 0.5) / (nhit + 0.5))
        if idf <= 0.0:
            idf = 1e-6
        dl = self._len[ids]
        part = idf * ((f * (K1 + 1.0)) / (f + K1 * (1 - B + B * dl / avgdl)))
        part.flags.writeable = False  # shared by every search of the term
        self._parts.put(key, (ids, part))
        return ids, part


class BM25Scores(Mapping[int, float]):
    """iid -> score over numpy arrays (sorted iids), with a fast :meth:`top`; behaves as a
    read-only dict (the plain dict is only built if someone iterates over all of it)."""

    __slots__ = ("ids", "values_", "_dict")

    def __init__(self, ids: np.ndarray, values: np.ndarray) -> None:
        self.ids = ids
        self.values_ = values
        self._dict: dict[int, float] | None = None

    def _d(self) -> dict[int, float]:
        if self._dict is None:
            self._dict = dict(zip(self.ids.tolist(), self.values_.tolist()))
        return self._dict

    def __getitem__(self, key: int) -> float:
        i = int(np.searchsorted(self.ids, key))
        if i < len(self.ids) and self.ids[i] == key:
            return float(self.values_[i])
        raise KeyError(key)

    def get_many(self, keys: Sequence[int], default: float = 0.0) -> list[float]:
        """Scores of many iids at once (``default`` for those without one)."""
        if not len(keys):
            return []
        k = np.asarray(keys, dtype=np.int64)
        i = np.minimum(np.searchsorted(self.ids, k), max(0, len(self.ids) - 1))
        if not len(self.ids):
            return [default] * len(k)
        hit = self.ids[i] == k
        return np.where(hit, self.values_[i], default).tolist()

    def get(self, key: int, default: float | None = None) -> float | None:  # type: ignore[override]  # Mapping.get, with the None default it always had
        try:
            return self[key]
        except KeyError:
            return default

    def __contains__(self, key: object) -> bool:
        return isinstance(key, (int, np.integer)) and self.get(int(key)) is not None

    def __iter__(self):
        return iter(self.ids.tolist())

    def __len__(self) -> int:
        return len(self.ids)

    def items(self):
        return self._d().items()

    def keys(self):
        return self._d().keys()

    def values(self):
        return self._d().values()

    def top(self, n: int, allowed: np.ndarray | None = None) -> list[tuple[int, float]]:
        """The ``n`` best (iid, score), best first, ties by smaller iid (as ``heapq.nlargest``
        with key (score, -iid) orders them); ``allowed`` restricts to those iids."""
        ids, sc = self.ids, self.values_
        if allowed is not None:
            keep = np.isin(ids, np.asarray(allowed, dtype=np.int64))
            ids, sc = ids[keep], sc[keep]
        if n <= 0 or len(ids) == 0:
            return []
        if len(ids) > n:
            cut = np.partition(sc, len(sc) - n)[len(sc) - n]  # the n-th largest score
            keep = sc >= cut
            ids, sc = ids[keep], sc[keep]
        order = np.lexsort((ids, -sc))[:n]
        return list(zip(ids[order].tolist(), sc[order].tolist()))


_NO_IDS = np.zeros(0, dtype=np.int64)
_NO_TF = np.zeros(0, dtype=np.float64)


class Postings:
    """Every term's postings in three arrays (CSR: ``offsets`` into ``ids`` and ``tf``, terms in
    ``terms`` order) and each product's terms the same way (``doc_offsets`` into ``doc_terms``,
    indexes into ``terms``). Immutable: changes go to :class:`MemoryBM25`'s deltas. Arrays, not a
    dict of arrays and a tuple per product: a snapshot keeps them as they are, and processes
    forked from the one that loaded them share their pages."""

    def __init__(self, terms: list[str], offsets: np.ndarray, ids: np.ndarray, tf: np.ndarray,
                 doc_offsets: np.ndarray, doc_terms: np.ndarray) -> None:
        self.terms = terms
        self.index = {t: i for i, t in enumerate(terms)}
        self.offsets, self.ids, self.tf = offsets, ids, tf
        self.doc_offsets, self.doc_terms = doc_offsets, doc_terms

    @classmethod
    def empty(cls) -> "Postings":
        return cls([], np.zeros(1, dtype=np.int64), _NO_IDS, _NO_TF, np.zeros(1, dtype=np.int64),
                   np.zeros(0, dtype=np.int32))

    @classmethod
    def build(cls, post: Mapping[str, tuple[np.ndarray, np.ndarray]], n_docs: int) -> "Postings":
        """From term -> (sorted iids, tf); ``n_docs``: one more than the largest iid."""
        terms = [sys.intern(t) for t in post]
        sizes = np.fromiter((len(post[t][0]) for t in terms), dtype=np.int64, count=len(terms))
        offsets = np.zeros(len(terms) + 1, dtype=np.int64)
        np.cumsum(sizes, out=offsets[1:])
        ids = np.concatenate([post[t][0] for t in terms]).astype(np.int64) if terms else _NO_IDS
        tf = np.concatenate([post[t][1] for t in terms]).astype(np.float64) if terms else _NO_TF
        term_of = np.repeat(np.arange(len(terms), dtype=np.int32), sizes)
        order = np.argsort(ids, kind="stable")  # by product, each product's terms in term order
        doc_offsets = np.zeros(n_docs + 1, dtype=np.int64)
        np.cumsum(np.bincount(ids, minlength=n_docs)[:n_docs], out=doc_offsets[1:])
        return cls(terms, offsets, ids, tf, doc_offsets, term_of[order])

    def get(self, term: str) -> tuple[np.ndarray, np.ndarray] | None:
        i = self.index.get(term)
        if i is None:
            return None
        a, b = int(self.offsets[i]), int(self.offsets[i + 1])
        return self.ids[a:b], self.tf[a:b]

    def terms_of(self, iid: int) -> tuple[str, ...]:
        if not 0 <= iid < len(self.doc_offsets) - 1:
            return ()
        a, b = int(self.doc_offsets[iid]), int(self.doc_offsets[iid + 1])
        terms = self.terms
        return tuple(terms[j] for j in self.doc_terms[a:b].tolist())


def _arrays(d: dict[int, float]) -> tuple[np.ndarray, np.ndarray]:
    ids = np.fromiter(d.keys(), dtype=np.int64, count=len(d))
    fs = np.fromiter(d.values(), dtype=np.float64, count=len(d))
    order = np.argsort(ids, kind="stable")
    return ids[order], fs[order]


_SHARED_TOKENIZER = _Tokenizer()


def word_terms(word: str) -> tuple[str, ...]:
    """The FTS5 terms of one word (stemmed, diacritics removed), as BM25 matches them."""
    return _SHARED_TOKENIZER.word(word)
