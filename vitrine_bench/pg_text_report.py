"""Writes bench-results/postgres_text.md/.json from `vitrine eval --json` results of the same
queries on a SQLite data dir (FTS5 BM25) and on a PostgreSQL store holding the same products
(tsvector ranking, vitrine/index/pgtext.py). Usage:
    python -m vitrine_bench.pg_text_report DIR_WITH_EVAL_JSONS OUT_DIR
with files named {sqlite,pg}-{attr,words}-{signals}.json."""

from __future__ import annotations

import json
import sys
from pathlib import Path

METRICS = ("nDCG@10", "MRR@10", "P@10", "R@10")


def main(src: Path, out: Path) -> None:
    rows, raw = [], {}
    for f in sorted(src.glob("sqlite-*.json")):
        other = src / f.name.replace("sqlite-", "pg-", 1)
        if not other.is_file():
            continue
        _, protocol, signals = f.stem.split("-", 2)
        a, b = json.loads(f.read_text()), json.loads(other.read_text())
        raw[f"{protocol}/{signals}"] = {"sqlite_fts5": a, "postgresql": b}
        for m in METRICS:
            rows.append((protocol, signals, m, a["metrics"][m], b["metrics"][m]))
    out.mkdir(parents=True, exist_ok=True)
    (out / "postgres_text.json").write_text(json.dumps(raw, indent=2) + "\n")
    lines = ["# Text ranking: PostgreSQL tsvector vs SQLite FTS5 BM25", "",
             "The same products (5,120 of the catalogue, vectors copied with `vitrine store copy`, nothing "
             "re-embedded) in a SQLite data dir and in a PostgreSQL 16 store; the same test-split queries "
             "(`vitrine make-queries --split test` for attr, `--kind words --n 300` for exact-word); "
             "`vitrine eval --queries Q --data DIR [--store URL] --signals S --no-intent`. Only the BM25 "
             "signal's source differs (vitrine/index/pgtext.py: ts_rank_cd per word x BM25 idf).", "",
             "| protocol | fused signals | metric | SQLite FTS5 | PostgreSQL | difference |", "|---|---|---|---|---|---|"]
    for p, s, m, a, b in rows:
        lines.append(f"| {p} | vector + {s} | {m} | {a:.4f} | {b:.4f} | {b - a:+.4f} |")
    lines += ["", "Search latency inside `vitrine eval` (one query at a time, in process; 2 shared cores under "
              "heavy load from other jobs: noisy). PostgreSQL's BM25 is one SQL query per search scoring "
              "every product that holds a query word; SQLite's comes from in-memory postings "
              "(vitrine/index/bm25.py).", "",
              "| protocol | SQLite p50 / p99 ms | PostgreSQL p50 / p99 ms |", "|---|---|---|"]
    for key, v in raw.items():
        a, b = v["sqlite_fts5"]["latency_ms"], v["postgresql"]["latency_ms"]
        lines.append(f"| {key} | {a['p50']:.0f} / {a['p99']:.0f} | {b['p50']:.0f} / {b['p99']:.0f} |")
    (out / "postgres_text.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
