"""Side work in a process of its own: the intake of shopper events and analytics reads.

A search must not wait for side work (issue 53). On threads of the API's own process
(vitrine/web/sidework.py), in the kernel's idle class, side work still slowed searches under an
events flood and a dashboard polling analytics (search p99 1.18-1.22x of alone): the threads
share the process's interpreter lock, and validating a batch, hashing its users, building and
encoding a report all hold it. A second ``vitrine serve`` taking the flood and the reads, the
searches' process untouched, gave 1.06-1.16x (bench-results/side-process.md). So the two jobs that run
for every event batch and every dashboard poll run in a spawned process of their own, one each
(:class:`SideProcess`): its own interpreter and lock, lowered like the side-work threads
(nice, SCHED_IDLE), paced like them. The process opens the same feedback log (the SQLite file or
PostgreSQL database the API logs searches to) and needs nothing else: no models, no indexes (it
imports only the feedback modules).

- The request keeps its contract: the batch is stored, or refused with its field named, before
  the answer leaves. The API's own search log writes what it queued first (an event posted right
  after its search always finds it; vitrine/feedback/logwriter.py).
- A process that died (killed, out of memory) is replaced on the next job; the job that was in
  it answers 503 (StorageError), and the client sends it again (an event sent twice is stored once).
- ``web.side_work_process`` off: both run on the API's threads as before.
- Spawned: a script that builds and serves the app itself must do it under ``if __name__ ==
  "__main__":`` (a spawned process imports the script that started it; docs/analytics.md). One
  that does not makes the process die as it starts: a new process answers a ping before it gets a
  job, one that died is started once more, and if that one dies too the job and every later one of
  its kind run on the API's threads (:class:`StartFailed`; logged once, with the likely cause).
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import multiprocessing.process
import os
import signal
import sys
import threading
from collections.abc import Callable
from concurrent.futures import BrokenExecutor, ProcessPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from vitrine.errors import StorageError
from vitrine.feedback import analytics
from vitrine.feedback.eventlog import EventLog
from vitrine.feedback.intake import Feedback, parse_events
from vitrine.settings import FeedbackSettings, WebSettings
from vitrine.web.sidework import Pacer, SideWork, check_duty, lower_this_thread

if TYPE_CHECKING:  # not imported at run time: a side process never loads the search stack
    from vitrine.search.engine import Engine

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass
class _Worker:
    """What a side process holds: its own handle on the feedback log, and its pacer."""

    feedback: Feedback
    pacer: Pacer


_worker: _Worker | None = None
"""Set once in each side process by :func:`_start` (its initializer); never in the API's process."""


def _start(target: str, settings: FeedbackSettings, nice: int, idle: bool, duty: float) -> None:
    global _worker
    parent = multiprocessing.parent_process()
    if parent is not None:  # a pool's worker outlives a parent killed with -9: it would wait for jobs forever
        threading.Thread(target=_exit_with, args=(parent,), name="vitrine-side-parent", daemon=True).start()
    lower_this_thread(nice, idle)  # the pool runs its jobs on this, the process's main thread
    _worker = _Worker(Feedback(EventLog(target), settings, batched=False), Pacer(duty))


def _exit_with(parent: multiprocessing.process.BaseProcess) -> None:
    parent.join()  # returns when the API process is gone, however it ended
    log.warning("the API process %s is gone; its side process %s exits", parent.pid, os.getpid())
    os.kill(os.getpid(), signal.SIGTERM)  # nobody is left to answer; the log's writes are transactions (crash safe)


def _here() -> _Worker:
    if _worker is None:  # only a bug calls a job outside a side process
        raise RuntimeError("a side-process job ran outside a side process")
    return _worker


def record_events(raw: bytes, client: str | None) -> tuple[int, int]:
    """The job of POST /v1/events: parse its body, validate and store the batch (all or nothing);
    (accepted, new). The body crosses as the bytes received: parsing a batch of a thousand events
    and pickling them took 5-10 ms of the API's interpreter lock a call."""
    w = _here()
    return w.pacer.run(lambda: w.feedback.record(parse_events(raw), client=client))


def analytics_json(since: float | None, until: float | None, granularity: analytics.Granularity,
                   top: int, bot_per_minute: int) -> bytes:
    """The job of GET /v1/analytics: the report, validated and encoded (the encoding too stays off
    the API's interpreter)."""
    w = _here()
    return w.pacer.run(lambda: analytics.report_json(w.feedback.log, since=since, until=until,
                                                     granularity=granularity, top=top, bot_per_minute=bot_per_minute))


def identity() -> tuple[int, int, int | None]:
    """(pid, nice, scheduling policy) of the side process's job thread (None off Linux): what it
    runs as, for tests and operators."""
    pid = os.getpid()
    linux = sys.platform.startswith("linux")
    return (pid, os.getpriority(os.PRIO_PROCESS, threading.get_native_id()),
            os.sched_getscheduler(0) if linux else None)


class StartFailed(Exception):
    """A side process died twice as it started: the API runs its jobs on threads."""


class SideProcess:
    """One spawned worker process running jobs of this module (:func:`record_events`,
    :func:`analytics_json`) one at a time, on the feedback log ``target``. Spawned on the first job,
    not before (an API that never takes an event never starts one)."""

    def __init__(self, name: str, target: str, settings: FeedbackSettings, *, nice: int, idle: bool,
                 duty: float = 1.0) -> None:
        check_duty(duty)  # here, not first in the spawned process
        self.name = name
        self._initargs = (target, settings, nice, idle, duty)
        self._lock = threading.Lock()
        self._pool = self._new_pool()
        self._proven: ProcessPoolExecutor | None = None  # the last pool whose process answered
        self.restarts = 0
        self.failed: str | None = None  # why it could not start (then the API's threads run its jobs)

    def _new_pool(self) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"),
                                   initializer=_start, initargs=self._initargs)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in the side process (``fn`` a job of this module; its arguments and result
        cross by pickle, in memory only). StorageError (503) when the process died under it;
        StartFailed when no process would start (:meth:`_started`)."""
        pool = await self._started()
        try:
            return await asyncio.get_running_loop().run_in_executor(pool, fn, *args)
        except BrokenExecutor as e:
            self._replace(pool)
            log.error("the %s process stopped (%s); started another", self.name, e)
            raise StorageError(f"the {self.name} process stopped while it held this request; send it again") from e

    async def _started(self) -> ProcessPoolExecutor:
        """The pool, its process known to run: a new one answers :func:`identity` before it gets a
        job, so a job never runs in a process that dies as it starts. One that died is started once
        more; when that one dies too, StartFailed, now and for every later job."""
        if self.failed is not None:
            raise StartFailed(self.failed)
        for attempt in range(2):
            pool = self._pool
            if self._proven is pool:
                return pool
            try:
                await asyncio.get_running_loop().run_in_executor(pool, identity)
            except BrokenExecutor as e:
                self._replace(pool)
                if attempt == 1:
                    self.failed = (f"the {self.name} process died twice as it started ({e}); is the app served from "
                                   "a script without `if __name__ == '__main__':`? (docs/analytics.md)")
                    log.error("%s; its jobs run on the API's threads from now on", self.failed)
                    raise StartFailed(self.failed) from e
                log.warning("the %s process died as it started (%s); starting another", self.name, e)
            else:
                self._proven = pool
                return pool
        raise AssertionError("unreachable")

    def _replace(self, pool: ProcessPoolExecutor) -> None:
        with self._lock:
            if self._pool is pool:  # the first job to see it broken replaces it
                self._pool = self._new_pool()
                self.restarts += 1

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


class FeedbackJobs:
    """Where the API stores events and builds analytics: in side processes (``processes``: the
    intake's and the reports', :class:`SideProcess`), else on its side-work threads (``intake``,
    ``side``: vitrine/web/sidework.py). The routes ask this, not which."""

    def __init__(self, engine: Engine, intake: SideWork, side: SideWork,
                 processes: tuple[SideProcess, SideProcess] | None) -> None:
        self.engine, self.intake, self.side, self.processes = engine, intake, side, processes

    @classmethod
    def open(cls, engine: Engine, intake: SideWork, side: SideWork, web: WebSettings) -> FeedbackJobs:
        if not web.side_work_process:
            return cls(engine, intake, side, None)
        fb = engine.feedback
        nice, idle = web.side_work_nice, web.side_work_idle
        return cls(engine, intake, side, (
            SideProcess("intake", fb.log.target, fb.settings, nice=nice, idle=idle),
            SideProcess("reports", fb.log.target, fb.settings, nice=nice, idle=idle, duty=web.side_work_duty)))

    async def record_events(self, raw: bytes, client: str | None) -> tuple[int, int]:
        """Parse a POST /v1/events body (InvalidBody), validate and store its batch (all or
        nothing); (accepted, new). Never parsed on the event loop."""
        done = await self._in_process(0, record_events, raw, client)
        if done is not None:
            return done
        return await self.intake.run(lambda: self.engine.record_events(parse_events(raw), client=client))

    async def analytics_json(self, since: float | None, until: float | None, granularity: analytics.Granularity,
                             top: int) -> bytes:
        """GET /v1/analytics's report, encoded."""
        bots = self.engine.feedback.settings.bot_events_per_minute
        done = await self._in_process(1, analytics_json, since, until, granularity, top, bots)
        if done is not None:
            return done
        return await self.side.run(analytics.report_json, self.engine.feedback.log, since=since, until=until,
                                   granularity=granularity, top=top, bot_per_minute=bots)

    async def _in_process(self, i: int, fn: Callable[..., T], *args: Any) -> T | None:
        """``fn(*args)`` in side process ``i`` (0 the intake's, 1 the reports'), once the searches
        queued before it are written; None when there is none or it could not start (no process ran
        the job: the caller runs it on a thread)."""
        if self.processes is None or self.processes[i].failed is not None:
            return None
        self.engine.feedback.log.check_writable()  # a store known to be down: 503 now, not after a connect timeout
        await self.intake.run(self.engine.feedback.flush)
        try:
            return await self.processes[i].run(fn, *args)
        except StartFailed:
            return None

    def close(self) -> None:
        for p in self.processes or ():
            p.close()
