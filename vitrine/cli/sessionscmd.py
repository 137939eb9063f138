"""``vitrine eval --protocol sessions``: scripted shopping sessions over the bundled catalogue's
test split, and the refine-or-new-search decider on held-out turns (vitrine/evals/sessions.py)."""

from __future__ import annotations

import base64
import json
import logging
import platform
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

log = logging.getLogger("vitrine")


def build_test_engine(settings: Any, work: Path, limit: int | None = None) -> Any:
    """A data dir of the bundled catalogue's test split (every product with its photo)."""
    from vitrine.bundled import bundled_dir, read_splits, read_styles
    from vitrine.ingest.catalog import ingest_file
    from vitrine.ingest.fashion import to_record
    from vitrine.search.engine import Engine

    source = bundled_dir()
    splits = read_splits(source)
    ids = [i for i, s in splits.items() if s == "test"][:limit]
    path = work / "catalog.jsonl"
    (work / "images").mkdir(parents=True, exist_ok=True)
    for i in ids:  # ingest reads photos only inside the catalogue's folder
        dst = work / "images" / f"{i}.jpg"
        if not dst.exists():
            shutil.copyfile(source / "images" / f"{i}.jpg", dst)
    keep = set(ids)
    with open(path, "w", encoding="utf-8") as f:
        for r in read_styles(source):
            if r["id"] in keep:
                f.write(json.dumps(to_record(r, f"images/{r['id']}.jpg"), ensure_ascii=False) + "\n")
    eng = Engine.open(settings.updated(data_dir=work / "data"))
    if len(eng) < len(ids):
        rep = ingest_file(eng, path, progress=False)
        if rep.failed:
            log.warning("%d products failed to ingest, e.g. %s", len(rep.failed), rep.failed[0])
    return eng


def sessions_eval(settings: Any, data_dir: Path | None, n: int, json_out: Path | None, report_dir: Path | None,
                  *, lookalikes: bool = False) -> None:
    if lookalikes:  # follow-ups that only look like cues, mid-session (issue 53)
        if data_dir is None:
            raise click.UsageError("--protocol session-lookalikes needs --data (a data dir of the bundled catalogue)")
        lookalikes_eval(settings, data_dir, json_out, report_dir)
        return
    from vitrine.bundled import bundled_dir
    from vitrine.evals import sessions as S
    from vitrine.search.models import SearchRequest
    from vitrine.conversation.followups import Decider

    work = data_dir or Path(tempfile.mkdtemp(prefix="vitrine-sessions-"))
    t0 = time.perf_counter()
    engine = build_test_engine(settings.updated(session_store="memory"), work)
    log.info("test split data dir ready in %.0fs (%d products)", time.perf_counter() - t0, len(engine))
    train = S.Catalogue.load("train")
    test = S.Catalogue.load("test", vocab_rows=train.rows)
    scripts = S.make_scripts(test, n)
    source = bundled_dir()

    def photo_b64(pid: str) -> str:
        return base64.b64encode((source / "images" / f"{pid}.jpg").read_bytes()).decode()

    def search(body: dict[str, Any]) -> dict[str, Any]:
        return engine.search(SearchRequest(**body)).model_dump(exclude_none=True)

    result = S.run_scripts(search, scripts, test, photo_b64)
    result["decider"] = S.evaluate_decider(Decider.load())
    result["machine"] = f"{platform.platform()}, Python {platform.python_version()}"
    result["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    engine.close()
    click.echo(json.dumps({k: v for k, v in result.items() if k not in ("rows",)}, indent=1, ensure_ascii=False))
    _write(result, json_out, report_dir, "sessions", S.report_markdown)


def lookalikes_eval(settings: Any, data_dir: Path, json_out: Path | None, report_dir: Path | None) -> None:
    """The look-alike follow-ups of vitrine/evals/data/session_lookalikes.jsonl over ``data_dir`` (a data
    dir of the bundled catalogue, or of a part of it), sessions in memory (the data dir is not written)."""
    from vitrine.bundled import bundled_dir, read_styles
    from vitrine.evals import session_lookalikes as L
    from vitrine.search.engine import Engine
    from vitrine.search.models import SearchRequest

    engine = Engine.open(settings.updated(data_dir=data_dir, session_store="memory"))
    try:
        ids = set(engine.records.ids())
        rows = [r for r in read_styles(bundled_dir()) if r["id"] in ids]

        def search(body: dict[str, Any]) -> dict[str, Any]:
            return engine.search(SearchRequest(**body)).model_dump(exclude_none=True)

        result = L.run(search, rows)
        result.update(machine=f"{platform.platform()}, Python {platform.python_version()}",
                      date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), data_dir=str(data_dir),
                      products=len(engine))
    finally:
        engine.close()
    click.echo(json.dumps(result["groups"], indent=1, ensure_ascii=False))
    _write(result, json_out, report_dir, "session-lookalikes", L.report_markdown)


def _write(result: dict[str, Any], json_out: Path | None, report_dir: Path | None, stem: str,
           markdown: Callable[[dict[str, Any]], str]) -> None:
    """An eval's result as JSON at ``json_out`` and as ``stem``.json/.md in ``report_dir``."""
    text = json.dumps(result, indent=1, ensure_ascii=False) + "\n"
    if json_out:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(text)
    if report_dir:
        report_dir.mkdir(parents=True, exist_ok=True)
        (report_dir / f"{stem}.json").write_text(text)
        (report_dir / f"{stem}.md").write_text(markdown(result))
