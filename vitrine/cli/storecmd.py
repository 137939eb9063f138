"""``vitrine store copy``: move a SQLite data dir's records (vectors and photos included) into a
PostgreSQL store, so that replicas start from it without re-embedding anything."""

from __future__ import annotations

from pathlib import Path

import click

from vitrine.cli.base import main


@main.group("store")
def store_group() -> None:
    """The record store: SQLite in a data dir, or a shared PostgreSQL (docs/postgresql.md)."""


@store_group.command("copy")
@click.option("--data", "data_dir", type=click.Path(path_type=Path, file_okay=False, exists=True), required=True,
              help="SQLite data dir to copy from (records.sqlite + images/)")
@click.option("--store", required=True, metavar="URL", help="postgresql://... store to copy into")
@click.option("--batch-size", type=int, default=500, show_default=True)
def store_copy(data_dir: Path, store: str, batch_size: int) -> None:
    """Copy every live product (document, version, vectors, photo) into the store, one
    transaction per batch; a product already there at a newer version, or unchanged, is kept."""
    from vitrine.index.records import ImageStore, RecordStore
    from vitrine.index.store import open_stores

    src = RecordStore(data_dir / "records.sqlite")
    photos = ImageStore(data_dir / "images")
    dst, dst_photos = open_stores(store, data_dir / ".store-copy-cache")
    n = skipped = 0
    try:
        batch = []
        for row in src.iter_rows(with_vectors=True):
            batch.append(row)
            if len(batch) >= batch_size:
                c, s = _copy(batch, dst, dst_photos, photos)
                n, skipped, batch = n + c, skipped + s, []
        if batch:
            c, s = _copy(batch, dst, dst_photos, photos)
            n, skipped = n + c, skipped + s
    finally:
        src.close()
        dst.close()
    click.echo(f"copied {n} products into {dst.location} ({skipped} already there, newer or unchanged)")


def _copy(batch, dst, dst_photos, photos) -> tuple[int, int]:
    have = dst.get_many([r.id for r in batch], include_deleted=True)
    def kept(r) -> bool:  # already there: newer, or the same product by the same model
        old = have.get(r.id)
        if old is None:
            return False
        if old.version is not None and r.version is not None and old.version > r.version:
            return True
        return (not old.deleted and old.content_hash == r.content_hash and old.model_key == r.model_key
                and old.version == r.version)

    todo = [r for r in batch if not kept(r)]
    imgs = {r.image_key: photos.get(r.image_key) for r in todo if r.image_key}
    dst_photos.put_many({k: v for k, v in imgs.items() if v is not None})
    if todo:
        dst.upsert_many(todo)
    return len(todo), len(batch) - len(todo)
