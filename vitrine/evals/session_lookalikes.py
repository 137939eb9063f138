"""Words that only look like session cues (issue 53): a hand-written test set of follow-ups, English
and Chinese, typed mid-session (``data/session_lookalikes.jsonl``).

Each row is a standing query and a follow-up. Most follow-ups are new searches whose words hold a cue
word that is not a cue there ("non slip flip flops" after "white sports shoes": not an exclusion;
"first copy sunglasses": no reference; "budget backpacks": no relative price; "不锈钢手表", "第一次买的
太阳镜"); the rest are real cues ("the second one", "not white", "第二个", "便宜点的") that must stay
cues. A new search names a product type (``type``: an article type or sub-category of the bundled
catalogue); its right answers are the products of that type. ``via_lexicon`` says whether a
follow-up holds a phrase of the shipped look-alike list (vitrine/resources/sessions/lookalikes.json)
or rests on the structural rules alone: the figures are given for both.

The set was written by hand, not generated; it is small, and a test set: nothing was fitted to it
(the decider's weights are unchanged; the rules and the lexicon are general phrases of the language).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from vitrine.conversation.followups import mask_lookalikes

SET_PATH = Path(__file__).parent / "data" / "session_lookalikes.jsonl"


def load_set(path: Path = SET_PATH) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    for r in rows:
        r["via_lexicon"] = mask_lookalikes(r["follow"]) != r["follow"]
    return rows


def relevant(rows: Iterable[Mapping[str, str]], kind: str) -> set[str]:
    """The ids of the catalogue rows (bundled styles.csv rows) of article type or sub-category ``kind``."""
    k = kind.casefold()
    return {r["id"] for r in rows if k in (r.get("articleType", "").casefold(), r.get("subCategory", "").casefold())}


def precision_at(ids: Sequence[str], rel: set[str], k: int = 10) -> float:
    return sum(1 for i in ids[:k] if i in rel) / k


def run(search: Callable[[dict[str, Any]], dict[str, Any]], rows: Sequence[Mapping[str, str]],
        cases: Sequence[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Every case through ``search`` (a JSON request -> JSON response: the HTTP API or the engine): the
    standing query in a fresh session, then the follow-up. P@10 of new searches against the products of
    their type (only types with at least 10 products), the reading (new search or refinement) of all."""
    cases = list(cases if cases is not None else load_set())
    out: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    for n, c in enumerate(cases):
        sid = f"lookalike-{n}-{int(t0)}"
        search({"k": 10, "text": c["standing"], "session": sid})
        res = search({"k": 10, "text": c["follow"], "session": sid})
        sess = res.get("session", {})
        row: dict[str, Any] = {"standing": c["standing"], "follow": c["follow"], "lang": c["lang"],
                               "via_lexicon": c["via_lexicon"], "expected_new_search": c["new_search"],
                               "new_search": sess.get("new_search"), "decided_by": sess.get("decided_by"),
                               "read_right": sess.get("new_search") is c["new_search"]}
        if c["new_search"] and c.get("type"):
            rel = relevant(rows, c["type"])
            if len(rel) >= 10:
                ids = [h["id"] for h in res.get("results", [])]
                alone = [h["id"] for h in search({"k": 10, "text": c["follow"]}).get("results", [])]
                row.update(type=c["type"], p10=precision_at(ids, rel), p10_alone=precision_at(alone, rel))
        out.append(row)
    return summarise(out, time.perf_counter() - t0)


def _mean(xs: Sequence[float]) -> float | None:
    return round(sum(xs) / len(xs), 4) if xs else None


def summarise(rows: list[dict[str, Any]], seconds: float) -> dict[str, Any]:
    groups: dict[str, Any] = {}
    for name, keep in (("all", lambda r: True), ("en", lambda r: r["lang"] == "en"),
                       ("zh", lambda r: r["lang"] == "zh"), ("via lexicon", lambda r: r["via_lexicon"]),
                       ("structural rules only", lambda r: not r["via_lexicon"])):
        rs = [r for r in rows if keep(r)]
        news = [r for r in rs if r["expected_new_search"]]
        scored = [r for r in news if "p10" in r]
        groups[name] = {"cases": len(rs), "read_right": _mean([float(r["read_right"]) for r in rs]),
                        "new_searches": len(news), "new_searches_read_right": _mean(
                            [float(r["read_right"]) for r in news]),
                        "cues": len(rs) - len(news), "cues_read_right": _mean(
                            [float(r["read_right"]) for r in rs if not r["expected_new_search"]]),
                        "scored": len(scored), "p10_mid_session": _mean([r["p10"] for r in scored]),
                        "p10_alone": _mean([r["p10_alone"] for r in scored])}
    return {"groups": groups, "seconds": round(seconds, 1), "rows": rows}


def report_markdown(r: Mapping[str, Any]) -> str:
    """bench-results/session-lookalikes.md from :func:`run`'s result."""
    lines = [
        "# Sessions: words that only look like cues", "",
        f"Machine: {r.get('machine', '?')}; {r.get('date', '')}. Data dir: {r.get('data_dir', '?')} "
        f"({r.get('products', '?')} products). Raw numbers: `session-lookalikes.json`. Command: "
        "`vitrine eval --protocol session-lookalikes --data DATA_DIR --report bench-results`.", "",
        "The set (`vitrine/evals/data/session_lookalikes.jsonl`, written by hand, not generated, not fitted to) "
        "types each follow-up after its standing query in a fresh session. **New searches**: follow-ups whose "
        "words hold a cue word that is no cue there (\"non slip flip flops\" after \"white sports shoes\", "
        "\"no. 5 perfume\", \"budget backpacks\", \"不锈钢手表\", \"第一次买的太阳镜\"); **cues**: real "
        "references, exclusions and relative prices that must still refine. P@10 counts the products of the "
        "type the new search names (types with at least 10 products in the data dir); *alone* is the same "
        "words searched without a session. *Via lexicon*: the follow-up holds a phrase of the shipped look-alike "
        "list; the others rest on the structural rules alone.", "",
        "| group | cases | read right | new searches read right | cues read right | scored | P@10 mid-session "
        "| P@10 alone |", "|---|---|---|---|---|---|---|---|"]
    for name, g in r["groups"].items():
        lines.append(f"| {name} | {g['cases']} | {g['read_right']} | {g['new_searches_read_right']} "
                     f"({g['new_searches']}) | {g['cues_read_right']} ({g['cues']}) | {g['scored']} | "
                     f"**{g['p10_mid_session']}** | {g['p10_alone']} |")
    before = r.get("before")
    if before:
        lines += ["", f"**Before** (the same set and data dir, the session code of {before['code']}: no look-alike "
                  "list, no structural rules, no modifier rule):", "",
                  "| group | read right | new searches read right | cues read right | P@10 mid-session | P@10 alone |",
                  "|---|---|---|---|---|---|"]
        for name, g in before["groups"].items():
            lines.append(f"| {name} | {g['read_right']} | {g['new_searches_read_right']} | {g['cues_read_right']} | "
                         f"{g['p10_mid_session']} | {g['p10_alone']} |")
        wrong = [x["follow"] for x in before["rows"] if not x["read_right"]]
        lines += ["", "Read wrong before: " + ", ".join(f"`{w}`" for w in wrong) + "."]
    lines += ["", "Per follow-up:", "", "| standing | follow-up | lang | lexicon | read right | decided by | P@10 "
              "| alone |", "|---|---|---|---|---|---|---|---|"]
    for x in r["rows"]:
        lines.append(f"| {x['standing']} | {x['follow']} | {x['lang']} | {'yes' if x['via_lexicon'] else ''} | "
                     f"{x['read_right']} | {x['decided_by']} | {x.get('p10', '')} | {x.get('p10_alone', '')} |")
    lines += ["", "A small hand-written set: a reading error is 2-3 points of the rate. Shoppers' own look-alikes "
              "outside both the list and the rules (a modifier the catalogue's vocabulary lacks, typed after a "
              "standing query without any category word) are still read by the decider.", ""]
    return "\n".join(lines)
