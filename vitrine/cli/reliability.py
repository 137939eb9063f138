"""``vitrine swap`` (hot swap, on a data dir or a running server) and ``vitrine snapshots``."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import click
from pydantic import BaseModel

from vitrine.cli.base import main, make_settings


@main.command()
@click.option("--data", "data_dir", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="Swap a data dir here (no server running on it)")
@click.option("--url", default=None, help="Swap a running server instead, e.g. http://127.0.0.1:8000")
@click.option("--api-key", default=None, help="The server's API key (default: VITRINE_API_KEY)")
@click.option("--adapter", default=None, help="Adapter name or folder to swap in")
@click.option("--model", default=None, help="Tower config or open_clip architecture to swap in")
@click.option("--pretrained", default=None, help="Local CLIP weights file for --model")
@click.option("--adapter-sha256", default=None, help="Expected SHA-256 of the adapter's weights file")
@click.option("--index-factory", default=None, help="FAISS factory of the new index (SQfp16, Flat, HNSW32, IVF{n},Flat)")
@click.option("--snapshot", default=None, help="A stored snapshot version (v00000012) or a snapshot folder")
@click.option("--dry-run", is_flag=True, help="Build and check the candidate; do not switch")
@click.option("--timeout", type=float, default=3600.0, show_default=True, help="Seconds to wait for a server")
def swap(data_dir: Path | None, url: str | None, api_key: str | None, dry_run: bool, timeout: float,
         **what: Any) -> None:
    """Hot swap a model version, index or snapshot: load it beside the live one, check it on the
    canary queries, switch atomically. Prints the report (JSON); exit code 3 when it is refused."""
    from vitrine.search.swap import SwapRequest

    req = SwapRequest(dry_run=dry_run, **{k: v for k, v in what.items() if v is not None})
    if (data_dir is None) == (url is None):
        raise click.UsageError("give exactly one of --data (a data dir) or --url (a running server)")
    if url:
        _swap_remote(url, api_key, req, timeout)
        return
    from vitrine.errors import SwapRefused
    from vitrine.search.engine import Engine

    engine = Engine.open(make_settings(data_dir=data_dir))
    try:
        try:
            report = engine.swap(req, progress=True)
        except SwapRefused as e:
            click.echo(json.dumps(e.report.model_dump() if isinstance(e.report, BaseModel) else {}, indent=2,
                                  default=str))
            click.echo(f"refused: {e}", err=True)
            sys.exit(3)
    finally:
        engine.close()
    click.echo(report.model_dump_json(indent=2))
    click.echo(report.reason, err=True)


def _swap_remote(url: str, api_key: str | None, req: Any, timeout: float) -> None:
    from vitrine.client import ApiError, Client, Unreachable

    key = api_key
    if key is None:
        s = make_settings()
        key = s.web.api_key.get_secret_value() if s.web.api_key else None
    if not key:
        raise click.UsageError("the server's admin actions need its API key: --api-key or VITRINE_API_KEY")
    try:
        with Client(url, api_key=key, timeout=timeout) as vc:
            report = vc.swap(req)
    except Unreachable as e:
        raise click.ClickException(f"cannot reach {url}: {e}") from e
    except ApiError as e:
        click.echo(json.dumps(e.detail if e.detail is not None else {"error": e.message}, indent=2))
        click.echo(f"refused ({e.status}): {e.message}", err=True)
        sys.exit(3 if e.status == 409 else 1)
    click.echo(report.model_dump_json(indent=2))
    click.echo(report.reason, err=True)


@main.command()
@click.option("--data", "data_dir", type=click.Path(path_type=Path, exists=True, file_okay=False), required=True)
@click.option("--verify", is_flag=True, help="Check every file of every version against its SHA-256")
def snapshots(data_dir: Path, verify: bool) -> None:
    """The index snapshot versions of a data dir, newest first (no models loaded)."""
    from vitrine.index.snapshots import SnapshotStore

    store = SnapshotStore(data_dir / "index")
    out: list[dict[str, Any]] = []
    bad = 0
    for snap in store.candidates():
        row = snap.summary()
        if verify and snap.manifest is not None:
            problems = []
            for name, sha in (snap.manifest.get("files") or {}).items():
                try:
                    got = hashlib.sha256(snap.file(name).read_bytes()).hexdigest()
                except OSError as e:
                    problems.append(f"{name}: {e}")
                    continue
                if got != sha:
                    problems.append(f"{name}: sha256 {got}, manifest says {sha}")
            row["verified"] = not problems
            row["problems"] = problems
            bad += bool(problems)
        out.append(row)
    click.echo(json.dumps({"versions": out, "partial": [p.name for p in store.partials()]}, indent=2))
    if bad:
        sys.exit(1)
