"""The API's side-work threads (vitrine/web/sidework.py): paced to a share of one core, so a
dashboard polling analytics back to back waits its turn instead of taking the searches' CPU."""

from __future__ import annotations

import asyncio
import time

import pytest
from vitrine.web.sidework import MAX_REST_S, SideWork


def burn(seconds: float) -> tuple[float, float, float]:
    """Spin this thread's CPU for ``seconds``; (wall start, wall end, CPU used)."""
    t0, c0 = time.monotonic(), time.thread_time()
    while time.thread_time() - c0 < seconds:
        sum(range(1000))
    return t0, time.monotonic(), time.thread_time() - c0


def run_jobs(side: SideWork, n: int, cpu_s: float) -> list[tuple[float, float, float]]:
    async def jobs() -> list[tuple[float, float, float]]:
        return [await side.run(burn, cpu_s) for _ in range(n)]

    return asyncio.run(jobs())


def test_back_to_back_jobs_rest_in_proportion_to_the_cpu_they_used():
    side = SideWork(0, duty=0.25)  # a job using c s of CPU earns 3c s of rest
    try:
        jobs = run_jobs(side, 3, 0.04)
        for (_, end, cpu), (start, _, _) in zip(jobs, jobs[1:]):
            assert start - end >= 3 * cpu * 0.95, (start - end, cpu)
        assert 0 < side.rest_s() <= 3 * jobs[-1][2]  # the last job's rest, still running
        time.sleep(side.rest_s())
        assert side.rest_s() == 0  # a job asked for after the rest starts at once
    finally:
        side.close()


def test_a_long_job_rests_at_most_max_rest_s():
    """A learn from the whole log may take seconds of CPU: the next analytics read must not wait three
    times that (a request would time out)."""
    side = SideWork(0, duty=0.01)  # a job using c s of CPU would earn 99c s of rest
    try:
        run_jobs(side, 1, 0.05)  # 4.95 s uncapped
        assert 0 < side.rest_s() <= MAX_REST_S
    finally:
        side.close()


def test_duty_one_never_rests_and_out_of_range_is_refused():
    side = SideWork(0)
    try:
        run_jobs(side, 2, 0.02)
        assert side.rest_s() == 0
    finally:
        side.close()
    for bad in (0.0, 1.5, -1.0):
        with pytest.raises(ValueError):
            SideWork(0, duty=bad)
