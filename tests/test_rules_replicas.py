"""A rule put through one API replica applies on another within 1 s, on a shared PostgreSQL store:
two `vitrine serve --store URL` processes with data dirs of their own (nothing shared but the
database), on the tiny test towers (the wiring is under test)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import httpx
import pytest
from kafka_broker import wait_for
from test_postgres_replicas import KEY, _env, _json, _start, _stop

N = 30


@pytest.mark.slow
def test_a_rule_put_on_one_replica_applies_on_the_other_within_a_second(pg_server, pg_url, catalog_dir,
                                                                        tmp_path):
    from vitrine_bench.common import free_port

    env = _env(tmp_path, pg_url)
    recs = []
    for line in (catalog_dir / "catalog.jsonl").read_text().splitlines()[:N]:
        r = json.loads(line)
        r.pop("image")
        recs.append(r)
    (tmp_path / "catalog.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    done = subprocess.run([sys.executable, "-m", "vitrine.cli.__main__", "ingest", str(tmp_path / "catalog.jsonl"),
                           "--data", str(tmp_path / "ingest")], env=env, capture_output=True, text=True, timeout=600,
                          check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    ports = [free_port(), free_port()]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    procs = [_start(["serve", "--data", str(tmp_path / f"replica-{i}"), "--port", str(p)], env,
                    tmp_path / f"serve-{i}.log") for i, p in enumerate(ports)]
    try:
        for u in urls:
            wait_for(lambda u=u: (h := _json(u + "/health")) is not None and h["products"] == N, 300,
                     f"{u} to serve the store's products", every=0.5)
        query = {"text": recs[0]["title"], "k": 10, "use_intent": False}
        base = httpx.post(urls[1] + "/v1/search", json=query, timeout=30).json()
        pinned = next(r["id"] for r in recs[::-1] if r["id"] != base["results"][0]["id"])
        hidden = base["results"][0]["id"]
        times = []
        for n, (rule, check) in enumerate([
            ({"conditions": {"query": {"is": query["text"]}},
              "consequences": {"pin": [{"id": pinned, "position": 0}]}},
             lambda res: res["results"][0]["id"] == pinned),
            ({"conditions": {"query": {"contains": query["text"].split()[0]}},
              "consequences": {"hide": [hidden]}},
             lambda res: hidden not in [h["id"] for h in res["results"]]),
        ]):
            r = httpx.put(f"{urls[0]}/v1/rules/r{n}", json=rule, headers={"x-api-key": KEY}, timeout=30)
            assert r.status_code == 200, r.text
            t0 = time.monotonic()
            while True:
                res = httpx.post(urls[1] + "/v1/search", json=query, timeout=30).json()
                if check(res):
                    break
                assert time.monotonic() - t0 < 1.0, f"rule r{n} not applied on the other replica within 1 s"
                time.sleep(0.02)
            times.append(time.monotonic() - t0)
            assert f"r{n}" in res["rules"]
        r = httpx.delete(f"{urls[1]}/v1/rules/r0", headers={"x-api-key": KEY}, timeout=30)  # and back the other way
        assert r.status_code == 200
        t0 = time.monotonic()
        while "r0" in httpx.post(urls[0] + "/v1/search", json=query, timeout=30).json()["rules"]:
            assert time.monotonic() - t0 < 1.0
            time.sleep(0.02)
        times.append(time.monotonic() - t0)
        print(f"rule propagation between replicas: {', '.join(f'{t * 1000:.0f} ms' for t in times)}")
    finally:
        for p in procs:
            _stop(p)
