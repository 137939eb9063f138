"""Side work: what the API does beside answering shoppers (merchant analytics, experiment
reports, learning from the log, retention, and the intake of shopper events), on threads of
their own at a lower CPU priority. By default the intake of events and analytics reports run in
processes of their own instead (vitrine/web/sideproc.py: their own interpreter lock), lowered and
paced with this module's helpers; experiment reports, learning and retention stay on a thread here.

A search must not wait for side work (issue 53). Reading analytics is a scan of the log; a
dashboard that polls it back to back keeps a core busy. On the request threads that core is
taken from searches; here the kernel gives searches the CPU first and the side work the rest:
on Linux a thread has its own nice value (``setpriority`` on the thread's id), so only this
thread is lowered, and by default also put in the kernel's idle class (SCHED_IDLE): nice +10
still took a share of a core from searches under an events flood (search p99 1.39x of alone),
the idle class takes only what they leave (1.25x; bench-results/side-work.md). One thread:
side work queues behind itself, never beside searches on more cores than one, and a second
report asked for while one runs waits instead of doubling the scan. The side-work thread is also
paced (``duty``): after each job it rests in proportion to the CPU the job used (at most
:data:`MAX_REST_S`), so back-to-back jobs hold at most that share of a core (1.18-1.22x with a
quarter); events are never paced. Elsewhere than Linux the priority stays as it is (logged once).

Python's interpreter lock is shared, so the lower priority only helps while the side work runs
outside it: the SQL of analytics and of learning does (SQLite and the PostgreSQL driver let the
lock go while the store works), the Python around it is short.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

MAX_REST_S = 1.0
"""The longest rest after one job: a long one (a learn from the whole log) must not hold the next
analytics read for three times its own length."""


def lower_this_thread(nice: int, idle: bool = False) -> bool:
    """Lower the calling thread's CPU priority by ``nice`` and, with ``idle``, to the kernel's idle
    class (``SCHED_IDLE``: it runs only on a core no other thread wants, and a waking search takes
    the core from it at once; nice 19 still competes for a share). Linux only, per thread; False
    where the platform cannot or the call was refused."""
    if (nice <= 0 and not idle) or not sys.platform.startswith("linux"):
        return False
    tid = threading.get_native_id()
    try:
        if nice > 0:
            os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + nice))
        if idle:
            os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
    except OSError as e:
        log.warning("side work keeps the searches' CPU priority: the kernel refused (%s)", e)
        return False
    return True


def check_duty(duty: float) -> float:
    """``duty``, a share of one core in (0, 1]; ValueError otherwise."""
    if not 0.0 < duty <= 1.0:
        raise ValueError(f"duty: {duty}; a share of one core in (0, 1]")
    return duty


class Pacer:
    """Paces the jobs of one thread to ``duty`` of a core: a job that took ``c`` s of this thread's
    CPU is followed by ``c * (1 / duty - 1)`` s of rest (at most :data:`MAX_REST_S`), so back-to-back
    jobs hold at most ``duty`` of one core. A job that arrives after the rest starts at once. Used
    by one thread only (a side-work thread, or a side-work process's: vitrine/web/sideproc.py)."""

    def __init__(self, duty: float = 1.0) -> None:
        self.duty = check_duty(duty)
        self._rest_until = 0.0

    def rest_s(self) -> float:
        """Seconds before the next job may start (0: at once)."""
        return max(0.0, self._rest_until - time.monotonic())

    def run(self, fn: Callable[[], T]) -> T:
        """``fn()`` after the rest its predecessor earned."""
        rest = self.rest_s()
        if rest > 0:
            time.sleep(rest)
        cpu = time.thread_time()
        try:
            return fn()
        finally:
            if self.duty < 1.0:
                rest = min(MAX_REST_S, (time.thread_time() - cpu) * (1.0 / self.duty - 1.0))
                self._rest_until = time.monotonic() + rest


class SideWork:
    """One side-work thread (see the module docstring); ``nice`` 0: same priority as searches.
    The API keeps two: ``side-work`` (reports, learning, retention) and ``intake`` (shopper events),
    so a batch of events never queues behind an analytics scan."""

    def __init__(self, nice: int, name: str = "side-work", *, idle: bool = False, duty: float = 1.0) -> None:
        self.nice, self.name, self.idle, self.duty = nice, name, idle, duty
        self._pacer = Pacer(duty)  # used by the pool's one thread only
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"vitrine-{name}",
                                        initializer=self._start)
        self.lowered: bool | None = None  # known once the thread started

    def _start(self) -> None:
        self.lowered = lower_this_thread(self.nice, self.idle)
        if (self.nice or self.idle) and not self.lowered:
            log.info("%s runs at the searches' priority on this platform", self.name)

    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` on the side-work thread, paced to ``duty``."""
        return await asyncio.get_running_loop().run_in_executor(
            self._pool, self._pacer.run, functools.partial(fn, *args, **kwargs))

    def rest_s(self) -> float:
        """Seconds before the next job may start (0: at once)."""
        return self._pacer.rest_s()

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
