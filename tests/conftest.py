"""Shared fixtures: a small real subset of the bundled catalogue, session-scoped models."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

REPO = Path(__file__).resolve().parents[1]
pytest_plugins = ("pg_server", "kafka_broker")  # PostgreSQL (pg_server, pg_url) and Kafka (broker, stream) fixtures
SOURCE = REPO / "data" / "fashion-small"
SUBSET_SIZE = 240


@pytest.fixture(scope="session")
def subset_rows():
    from vitrine.bundled import read_styles
    from vitrine.ingest.fashion import demo_subset

    keep = set(demo_subset(SOURCE, SUBSET_SIZE))
    return [r for r in read_styles(SOURCE) if r["id"] in keep]


@pytest.fixture(scope="session")
def catalog_dir(tmp_path_factory, subset_rows) -> Path:
    """A catalogue folder: catalog.jsonl + images/ for the subset (copied, real photos)."""
    from vitrine.ingest.fashion import to_record

    d = tmp_path_factory.mktemp("catalog")
    (d / "images").mkdir()
    with open(d / "catalog.jsonl", "w") as f:
        for r in subset_rows:
            shutil.copy(SOURCE / "images" / f"{r['id']}.jpg", d / "images" / f"{r['id']}.jpg")
            f.write(json.dumps(to_record(r, f"images/{r['id']}.jpg")) + "\n")
    return d


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cache")


def settings_maker(cache_dir: Path, **defaults):
    """Settings for a test data dir over the shared feature cache; ``defaults`` apply unless overridden."""
    from vitrine.settings import Settings

    def make(data_dir: Path, **kw):
        return Settings(data_dir=data_dir, cache_dir=cache_dir, _env_file=None, **(defaults | kw))

    return make


SQLITE_FILES = shutil.ignore_patterns("*.sqlite", "*.sqlite-wal", "*.sqlite-shm", "*.sqlite-journal")


def copy_sqlite(src: Path, dst: Path) -> None:
    """A copy of a SQLite file this process may have open, through SQLite's online backup. Never a
    plain file copy: opening and closing a live SQLite file outside SQLite drops every lock this
    process holds on it (sqlite.org/howtocorrupt.html 2.2), and a forked child or another process
    could then checkpoint and delete its live write-ahead log (tests/test_sqlite.py)."""
    with closing(sqlite3.connect(src)) as a, closing(sqlite3.connect(dst)) as b:
        a.backup(b)


def copy_data_dir(src: Path, dst: Path) -> Path:
    """A copy of a data dir an engine of this process may have open: its SQLite files through
    :func:`copy_sqlite`, the rest file by file."""
    shutil.copytree(src, dst, ignore=SQLITE_FILES)
    for f in src.rglob("*.sqlite"):
        copy_sqlite(f, dst / f.relative_to(src))
    return dst


def engine_copy(engine, settings_factory, encoder, dst: Path, **settings_kw):
    """An engine of its own over a copy of ``engine``'s data dir (the shared subset: nothing is
    ingested again), without its feedback log or learned re-ranking: for tests that write, log
    or learn. ``settings_kw``: settings of the copy (an API key ...)."""
    from vitrine.search.engine import Engine

    engine.save()
    copy_data_dir(engine.data_dir, dst)
    for f in [*dst.glob("events.sqlite*"), *dst.glob("sessions.sqlite*"), dst / "learned.json"]:
        f.unlink(missing_ok=True)
    return Engine(settings_factory(dst, **settings_kw), encoder)


@pytest.fixture(scope="module")
def client(engine):
    """A TestClient over the shared engine's app (read-mostly tests; a module that writes or learns
    makes its own with :func:`engine_and_client`, which overrides this one)."""
    from fastapi.testclient import TestClient

    from vitrine.web.app import create_app

    with TestClient(create_app(engine=engine)) as c:
        yield c


def new_sid() -> str:
    """A session id of a test's own."""
    import uuid

    return "t-" + uuid.uuid4().hex[:12]


def search10(client, **body) -> dict:
    """POST /v1/search with ten results unless ``body`` says otherwise; the answer, checked 200."""
    r = client.post("/v1/search", json={"k": 10, **body})
    assert r.status_code == 200, r.text
    return r.json()


def engine_and_client(folder: str, *, engine_name: str = "eng", **settings_kw):
    """A test module's own engine and API: ``eng, client = engine_and_client("rules", api_key=...)``
    at module level gives two module-scoped fixtures, an engine over a copy of the shared data dir
    (:func:`engine_copy`, in ``folder``; named ``engine_name``) and a TestClient over its app."""

    @pytest.fixture(scope="module", name=engine_name)
    def own(engine, settings_factory, encoder, tmp_path_factory):
        e = engine_copy(engine, settings_factory, encoder, tmp_path_factory.mktemp(folder) / "data", **settings_kw)
        yield e
        e.close()

    @pytest.fixture(scope="module", name="client")
    def client(request):
        from fastapi.testclient import TestClient

        from vitrine.web.app import create_app

        with TestClient(create_app(engine=request.getfixturevalue(engine_name))) as c:
            yield c

    return own, client


def subset_engine_of(settings, encoder, catalog_dir: Path):
    """An engine over the subset catalogue, ingested."""
    from vitrine.ingest.catalog import ingest_file
    from vitrine.search.engine import Engine

    eng = Engine(settings, encoder)
    report = ingest_file(eng, catalog_dir / "catalog.jsonl", progress=False)
    assert report.upserted == SUBSET_SIZE and not report.failed
    return eng


@pytest.fixture(scope="session")
def settings_factory(cache_dir):
    return settings_maker(cache_dir)


@pytest.fixture(scope="session")
def encoder(settings_factory, tmp_path_factory):
    """The default encoder (shipped adapter) — loaded once per test session."""
    from vitrine.search.engine import build_encoder

    return build_encoder(settings_factory(tmp_path_factory.mktemp("unused")))


@pytest.fixture(scope="session")
def mlp_encoder(encoder):
    """The same towers with the shipped MLP aligner, for checks that need a photo query to score 1.0
    against its own product: the MLP embeds a photo alone, while the default MoE gate routes a
    product's photo together with its title, so the photo alone scores about 0.9 against it."""
    from vitrine.encoders.adapters import load_adapter
    from vitrine.encoders.encoder import MultimodalEncoder

    return MultimodalEncoder(encoder.towers, load_adapter("mlp"), cache=encoder.cache)


@pytest.fixture(scope="session")
def engine(settings_factory, encoder, catalog_dir, tmp_path_factory):
    """An engine over the subset, ingested once; tests must not modify it."""
    eng = subset_engine_of(settings_factory(tmp_path_factory.mktemp("data")), encoder, catalog_dir)
    yield eng
    eng.close()


@pytest.fixture()
def fresh_engine(settings_factory, encoder, tmp_path):
    """An empty engine of its own, for tests that write."""
    from vitrine.search.engine import Engine

    eng = Engine(settings_factory(tmp_path / "data"), encoder)
    yield eng
    eng.records.close()


@pytest.fixture(scope="session")
def browser():
    """One headless Chromium for every UI test module (tests/test_ui.py launches it)."""
    from test_ui import chromium_session

    yield from chromium_session()
