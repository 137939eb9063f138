"""`vitrine serve --workers N`: several API processes over one data dir, as a user runs them.

On the tiny test towers (fast to load; the wiring is under test): the settings reach every
worker, every worker serves the indexes its supervisor loaded before forking it (shared
copy-on-write, vitrine/web/workers.py), a write through one worker is seen through all of them, a
hot swap is refused with a clear reason, a worker killed is replaced by one that has every write, and SIGTERM stops them all."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from conftest import REPO, SUBSET_SIZE

KEY = "workers-test-key"


def _env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "VITRINE_MODEL": "tiny-vit-test", "VITRINE_ADAPTER": "none",
            "VITRINE_CACHE_DIR": str(tmp_path / "cache"), "VITRINE_TORCH_THREADS": "1", "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1", "PYTHONPATH": str(REPO),
            # not tuned after ingest: tuning is test_tuning's, and it was 35 of this test's 60 s
            "VITRINE_TUNE_AFTER_INGEST": "false"}


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        out += [int(c) for c in task.read_text().split()]
    return out


CLI = [sys.executable, "-m", "vitrine.cli.__main__"]


@pytest.fixture(scope="module")
def ingested(catalog_dir, tmp_path_factory) -> tuple[Path, dict[str, str]]:
    tmp = tmp_path_factory.mktemp("workers")
    env, data = _env(tmp), tmp / "data"
    done = subprocess.run([*CLI, "ingest", str(catalog_dir / "catalog.jsonl"), "--data", str(data)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return data, env


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow
def test_workers_do_not_outlive_their_supervisor(ingested):
    """A supervisor killed outright (kill -9, the out-of-memory killer) takes its workers along:
    orphans would keep serving and holding their memory with nobody to stop them."""
    from vitrine_bench.common import free_port

    data, env = ingested
    proc = subprocess.Popen([*CLI, "serve", "--data", str(data), "--port", str(free_port()), "--workers", "2"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        t_end = time.monotonic() + 300
        while len(workers := _children(proc.pid)) < 2:
            assert proc.poll() is None and time.monotonic() < t_end, "the workers did not start"
            time.sleep(0.2)
        proc.kill()
        proc.wait(30)
        t_end = time.monotonic() + 60
        while any(_alive(w) for w in workers):
            assert time.monotonic() < t_end, [w for w in workers if _alive(w)]
            time.sleep(0.2)
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.slow
def test_serve_with_two_workers_shares_writes_and_refuses_hot_swap(ingested):
    from vitrine_bench.common import free_port

    data, env = ingested
    cli = CLI
    port = free_port()
    proc = subprocess.Popen([*cli, "serve", "--data", str(data), "--port", str(port), "--workers", "2"],
                            env={**env, "VITRINE_API_KEY": KEY}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        t_end = time.monotonic() + 300
        while True:
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            try:
                if httpx.get(url + "/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < t_end, "the workers did not come up"
            time.sleep(0.5)
        def health(_: int) -> dict:
            with httpx.Client(timeout=30) as c:  # a new connection each time: any worker may answer
                return c.get(url + "/health").json()

        # two worker processes under the supervisor, each with the data dir's products (the second
        # may finish loading a moment after the first answers: wait until both answer, not a fixed time)
        with ThreadPoolExecutor(8) as pool:
            while len({h["pid"] for h in pool.map(health, range(16))}) < 2 and time.monotonic() < t_end:
                time.sleep(0.2)
        workers = _children(proc.pid)
        assert len(workers) >= 2, workers

        with ThreadPoolExecutor(8) as pool:
            seen = list(pool.map(health, range(48)))
        assert all(h["products"] == SUBSET_SIZE for h in seen)
        # each worker serves the indexes loaded once before the fork, not a copy of its own
        assert all(h["recovery"].get("shared") is True for h in seen), {h["pid"]: h["recovery"] for h in seen}
        print("workers that answered:", sorted(Counter(h["pid"] for h in seen).items()))
        answered = {h["pid"] for h in seen}  # (48 connections, 8 at a time: both workers answer)
        assert len(answered) == 2 and answered <= set(workers)  # (the supervisor's children)
        # a write through whichever worker answers; every worker has it within the follow interval
        put = httpx.put(url + "/products/w-1", json={"id": "w-1", "title": "workers test blazer", "brand": "Acme"},
                        headers={"x-api-key": KEY}, timeout=60)
        assert put.status_code == 200, put.text
        def get(_: int) -> int:
            with httpx.Client(timeout=30) as c:
                return c.get(url + "/products/w-1").status_code

        t_end = time.monotonic() + 60  # the workers follow the data dir every second
        while True:
            with ThreadPoolExecutor(8) as pool:
                codes = set(pool.map(get, range(32)))
                hs = list(pool.map(health, range(32)))
            counts = {h["products"] for h in hs}
            if codes == {200} and counts == {SUBSET_SIZE + 1} and {h["pid"] for h in hs} == answered:
                break  # every worker answered, and each has the write
            assert time.monotonic() < t_end, (codes, counts)
            time.sleep(0.5)
        # (the tiny test towers rank by chance: the brand filter, an index the write fed, finds it)
        res = httpx.post(url + "/search", json={"text": "workers test blazer", "k": 3, "filters": {"brand": "Acme"}},
                         timeout=60)
        assert res.status_code == 200 and res.json()["results"][0]["id"] == "w-1"
        # a worker that dies is forked again from the supervisor's indexes and catches up with the write
        os.kill(sorted(answered)[0], signal.SIGKILL)
        t_end = time.monotonic() + 120
        while True:
            with ThreadPoolExecutor(8) as pool:
                hs = list(pool.map(health, range(32)))
            pids = {h["pid"] for h in hs}
            if len(pids) == 2 and pids != answered and {h["products"] for h in hs} == {SUBSET_SIZE + 1}:
                break
            assert time.monotonic() < t_end, (pids, answered, {h["products"] for h in hs})
            time.sleep(0.5)
        assert all(h["recovery"].get("shared") is True for h in hs)
        # hot swap would switch one process only: refused, with the reason
        swap = httpx.post(url + "/admin/swap", json={"index_factory": "HNSW32"}, headers={"x-api-key": KEY},
                          timeout=60)
        assert swap.status_code == 409 and "--workers 1" in swap.json()["error"]["message"]
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            _, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
    assert proc.returncode == 0, err[-3000:]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc and prctl: Linux")
def test_the_c_library_calls_a_worker_makes():
    """The supervisor tunes and trims glibc's heap before forking; a worker asks for SIGTERM when
    its parent dies (here: a child of this process, which does not die)."""
    import ctypes

    from vitrine.web.memory import libc_function, limit_heap_growth, trim_heap
    from vitrine.web.workers import die_with_parent

    assert libc_function("no_such_function_in_libc") is None
    assert libc_function("malloc_trim", [ctypes.c_size_t]) is not None
    assert limit_heap_growth() is True and isinstance(trim_heap(), bool)
    pid = os.fork()
    if pid == 0:  # the child: set the parent-death signal, report whether it took
        os._exit(0 if die_with_parent(os.getppid()) else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
