"""Catalogue files in: JSONL or CSV records -> validated products with their photo bytes.

A bad record (not JSON, missing id or title, unreadable photo) is reported with its line
number and skipped; the rest goes in. Photos are read relative to the catalogue's folder and
never from outside it (no path traversal), from ``file:`` URIs inside it, from http(s) URLs,
or from ``image_b64``.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import os
import queue
import threading
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlparse

from pydantic import ValidationError

from vitrine.errors import InvalidInput
from vitrine.progress import progress_bar
from vitrine.search.engine import Engine
from vitrine.search.writes import ProductInput
from vitrine.search.models import ItemError, Product, UpsertReport

if TYPE_CHECKING:
    import httpx

log = logging.getLogger(__name__)


@dataclass
class Parsed:
    line: int
    product: Product | None = None
    error: str | None = None
    raw_id: str | None = None


def describe_validation_error(e: ValidationError) -> str:
    parts = []
    for err in e.errors():
        loc = ".".join(str(x) for x in err.get("loc", ())) or "record"
        parts.append(f"{loc}: {err.get('msg', 'invalid')}")
    return "; ".join(parts)


def parse_record(obj: object, line: int) -> Parsed:
    raw_id = str(obj.get("id")) if isinstance(obj, dict) and obj.get("id") is not None else None
    try:
        return Parsed(line=line, product=Product.model_validate(obj), raw_id=raw_id)
    except ValidationError as e:
        return Parsed(line=line, error=describe_validation_error(e), raw_id=raw_id)


def read_jsonl(path: Path) -> Iterator[Parsed]:
    with open(path, encoding="utf-8-sig", errors="replace") as f:
        for n, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                yield Parsed(line=n, error=f"not valid JSON: {e.msg} at column {e.colno}")
                continue
            yield parse_record(obj, n)


def _csv_value(key: str, v: str) -> object:
    v = v.strip()
    if key == "price":
        try:
            return float(v) if v else None
        except ValueError:
            return v  # let validation say what is wrong
    if key == "version":
        return int(v) if v.isdecimal() else (v or None)  # "²" is a digit, not a decimal: int() refuses it
    if key == "attributes" and v.startswith("{"):
        try:
            return json.loads(v)
        except json.JSONDecodeError:
            return v
    return v or None


def read_csv(path: Path) -> Iterator[Parsed]:
    with open(path, encoding="utf-8-sig", errors="replace", newline="") as f:
        reader = csv.DictReader(f)
        if not reader.fieldnames or "id" not in reader.fieldnames:
            yield Parsed(line=1, error="CSV header must name an 'id' column (and 'title')")
            return
        for row in reader:
            line = reader.line_num
            if None in row:
                yield Parsed(line=line, error=f"row has {len(row[None]) + len(reader.fieldnames)} fields, "
                                                f"header has {len(reader.fieldnames)}")
                continue
            obj = {k: _csv_value(k, v or "") for k, v in row.items() if k}
            yield parse_record({k: v for k, v in obj.items() if v is not None}, line)


def read_catalog(path: str | os.PathLike[str]) -> Iterator[Parsed]:
    """Records of a ``.jsonl``/``.ndjson``/``.json`` (one object per line) or ``.csv`` file."""
    path = Path(path)
    if not path.is_file():
        raise InvalidInput(f"catalogue file {path} does not exist")
    if path.suffix.lower() == ".csv":
        return read_csv(path)
    return read_jsonl(path)


class PhotoResolver:
    """Reads a record's photo. Local paths must stay inside ``root``."""

    def __init__(self, root: Path, *, max_bytes: int = 10_000_000, timeout_s: float = 10.0,
                 allow_http: bool = True) -> None:
        self.root = root.resolve()
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s
        self.allow_http = allow_http
        self._client: httpx.Client | None = None  # made on the first URL (httpx is imported then)

    def _local(self, rel: str) -> bytes:
        p = Path(rel)
        target = (p if p.is_absolute() else self.root / p).resolve()
        if not target.is_relative_to(self.root):
            raise InvalidInput(f"photo path {rel!r} points outside the catalogue folder")
        if not target.is_file():
            raise InvalidInput(f"photo {rel!r} does not exist")
        size = target.stat().st_size
        if size > self.max_bytes:
            raise InvalidInput(f"photo {rel!r} is {size:,} bytes, over the limit of {self.max_bytes:,}")
        return target.read_bytes()

    def _http(self, url: str) -> bytes:
        import httpx

        if not self.allow_http:
            raise InvalidInput("photo URLs are disabled")
        if self._client is None:
            self._client = httpx.Client(timeout=self.timeout_s, follow_redirects=True)
        try:
            with self._client.stream("GET", url) as r:
                if r.status_code != 200:
                    raise InvalidInput(f"photo URL {url} answered HTTP {r.status_code}")
                buf = io.BytesIO()
                for chunk in r.iter_bytes():
                    buf.write(chunk)
                    if buf.tell() > self.max_bytes:
                        raise InvalidInput(f"photo URL {url} is over the limit of {self.max_bytes:,} bytes")
                return buf.getvalue()
        except httpx.HTTPError as e:
            raise InvalidInput(f"photo URL {url} unreachable: {e}") from e

    def fetch(self, ref: str) -> bytes:
        u = urlparse(ref)
        if u.scheme in ("http", "https"):
            return self._http(ref)
        if u.scheme == "file":
            return self._local(unquote(u.path))
        if u.scheme and len(u.scheme) > 1:
            raise InvalidInput(f"unsupported photo reference scheme {u.scheme!r}")
        return self._local(ref)

    def resolve(self, p: Parsed) -> ProductInput:
        prod = p.product
        assert prod is not None
        if prod.image_b64 or not prod.image:
            return ProductInput(prod, line=p.line)
        try:
            return ProductInput(prod, image=self.fetch(prod.image), line=p.line)
        except InvalidInput as e:
            return ProductInput(prod, image_error=str(e), line=p.line)
        except OSError as e:
            return ProductInput(prod, image_error=f"photo {prod.image!r} unreadable: {e}", line=p.line)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()


def ingest_records(
    engine: Engine,
    records: Iterable[Parsed],
    root: Path,
    *,
    batch_size: int = 512,
    progress: bool = True,
    total: int | None = None,
    prefetch: int = 2,
) -> UpsertReport:
    """Resolve photos (in threads) and upsert in batches; returns the merged report.

    A bounded producer/consumer pipeline: a reader thread parses the next batches and reads their
    photos (at most ``prefetch`` batches ahead) while this thread encodes and writes the current
    one, so reading overlaps the towers instead of waiting between batches (0 reads in turn). One
    snapshot at the end, not per batch."""
    s = engine.settings
    resolver = PhotoResolver(root, max_bytes=s.encoders.max_image_bytes, timeout_s=s.ingest.fetch_timeout_s)
    report = UpsertReport()
    bar: Any = progress_bar(total=total, desc="ingest", unit="product", enabled=progress)  # tqdm or NoBar
    pool = ThreadPoolExecutor(max_workers=8)
    stop = threading.Event()

    def read_batches() -> Iterator[tuple[list[Parsed], list[ProductInput]]]:
        batch: list[Parsed] = []
        for p in records:
            if stop.is_set():
                return
            batch.append(p)
            if len(batch) >= batch_size:
                yield batch, list(pool.map(resolver.resolve, [x for x in batch if x.product is not None]))
                batch = []
        if batch:
            yield batch, list(pool.map(resolver.resolve, [x for x in batch if x.product is not None]))

    def write(batch: list[Parsed], items: list[ProductInput]) -> None:
        for p in batch:
            if p.product is None:
                report.failed.append(ItemError(id=p.raw_id, line=p.line, reason=p.error or "invalid record"))
        if items:
            report.merge(engine.upsert(items))
        bar.update(len(batch))
        bar.set_postfix(upserted=report.upserted, unchanged=report.unchanged, failed=len(report.failed))

    try:
        if prefetch <= 0:
            for batch, items in read_batches():
                write(batch, items)
        else:
            for batch, items in _ahead(read_batches(), prefetch, stop):
                write(batch, items)
    finally:
        stop.set()
        pool.shutdown(wait=True, cancel_futures=True)
        bar.close()
        resolver.close()
    if report.upserted:
        engine.reads.prepare()  # kept with the snapshot below: a first serve loads them
    engine.save()
    return report


_DONE = object()


def _ahead(items: Iterator[Any], depth: int, stop: threading.Event) -> Iterator[Any]:
    """``items`` produced by a thread of their own, at most ``depth`` ahead of the consumer; an
    error in the producer is raised here, and ``stop`` (set by the consumer) ends the producer."""
    q: queue.Queue[Any] = queue.Queue(maxsize=depth)

    def put(x: Any) -> bool:
        while not stop.is_set():
            try:
                q.put(x, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for x in items:
                if not put((x, None)):
                    return
        except BaseException as e:  # noqa: BLE001 - handed to the consumer, which raises it
            put((_DONE, e))
            return
        put((_DONE, None))

    t = threading.Thread(target=produce, name="ingest-reader", daemon=True)
    t.start()
    try:
        while True:
            x, err = q.get()
            if x is _DONE:
                if err is not None:
                    raise err
                return
            yield x
    finally:
        stop.set()
        t.join(timeout=30)


def ingest_file(
    engine: Engine, path: str | os.PathLike[str], *, batch_size: int = 512, progress: bool = True,
    limit: int | None = None,
) -> UpsertReport:
    """Batch-ingest a catalogue file. Re-ingesting the same file changes nothing."""
    path = Path(path)
    records: Iterable[Parsed] = read_catalog(path)
    total = _count_lines(path)
    if limit is not None:
        records = _take(records, limit)
        total = min(total, limit)
    return ingest_records(engine, records, path.parent, batch_size=batch_size, progress=progress, total=total)


def _take(it: Iterable[Parsed], n: int) -> Iterator[Parsed]:
    for i, x in enumerate(it):
        if i >= n:
            return
        yield x


def _count_lines(path: Path) -> int:
    with open(path, "rb") as f:
        n = sum(1 for line in f if line.strip())
    return n - 1 if path.suffix.lower() == ".csv" else n
