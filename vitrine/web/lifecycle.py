"""The API's lifespan: open (or take) the engine, warm it up, and run the background loops that
follow other writers of the data dir, snapshot the indexes and learn from the search log (learning
and retention on the side-work thread, vitrine/web/sidework.py)."""

from __future__ import annotations

import asyncio
import fcntl
import gc
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path

import anyio
from fastapi import FastAPI

from vitrine.errors import StorageError, VitrineError
from vitrine.index.vectors import set_search_threads
from vitrine.search.engine import Engine
from vitrine.search.state import LoadedIndexes
from vitrine.settings import Settings
from vitrine.web.memory import limit_heap_growth
from vitrine.web.metrics import Metrics
from vitrine.web.sideproc import FeedbackJobs
from vitrine.web.sidework import SideWork

log = logging.getLogger(__name__)


def lifespan_for(settings: Settings, engine: Engine | None, metrics: Metrics, freeze_gc: bool | None,
                 loaded: LoadedIndexes | None = None) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """The lifespan of an app serving ``engine`` (or, when None, one it opens from ``settings``,
    serving ``loaded`` when given: indexes opened before this process was forked)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        own = engine is None
        web = settings.web
        side = app.state.side_work = SideWork(web.side_work_nice, idle=web.side_work_idle, duty=web.side_work_duty)
        intake = app.state.intake = SideWork(web.side_work_nice, name="intake", idle=web.side_work_idle)
        if own and settings.web.tune_malloc:
            limit_heap_growth()
        eng = engine if engine is not None else await asyncio.to_thread(lambda: Engine.open(settings, loaded=loaded))
        app.state.engine = eng
        jobs = app.state.feedback_jobs = FeedbackJobs.open(eng, intake, side, web)
        if own:  # after the models loaded their libraries: the limits apply to loaded ones
            set_search_threads(settings.index.search_threads or 1)
        await asyncio.to_thread(eng.warm_up)  # the query fast path, BM25 and vocabularies: built before traffic
        if own if freeze_gc is None else freeze_gc:
            # Millions of long-lived objects (graph, vocabularies, model modules): a full collection
            # walked them all, a 300 ms pause for every request in flight. Freeze them out of the
            # collector; garbage made while serving is collected as before.
            gc.collect()
            gc.freeze()
        metrics.bind_engine(eng)
        app.state.search_slots = anyio.CapacityLimiter(settings.web.search_concurrency) \
            if settings.web.search_concurrency else None
        log.info("serving %d products from %s", len(eng), settings.storage.data_dir)
        snapshots = asyncio.create_task(_snapshot_loop(eng, settings.web.snapshot_interval_s)) \
            if settings.web.snapshot_interval_s > 0 else None
        follow_s = settings.web.follow_s or (0.5 if settings.storage.store else 1.0 if settings.web.workers > 1 else 0.0)
        follower = asyncio.create_task(_follow_loop(eng, follow_s)) if follow_s > 0 else None
        fb = settings.feedback
        if fb.log_searches:  # popular logged queries in suggestions; learning from the log as it grows
            await asyncio.to_thread(eng.suggestions.set_popular, eng.feedback.popular_queries)
        learner = asyncio.create_task(_learn_loop(eng, side, fb.learn_interval_s)) \
            if fb.log_searches and fb.learn_interval_s > 0 else None
        retention = asyncio.create_task(_retention_loop(eng, side, fb.events_purge_interval_s)) \
            if fb.log_searches and fb.events_purge_interval_s > 0 else None
        try:
            yield
        finally:
            if follower is not None:
                follower.cancel()
            if learner is not None:
                learner.cancel()
            if retention is not None:
                retention.cancel()
            if snapshots is not None:
                snapshots.cancel()
                await asyncio.to_thread(eng.wait_for_writes)  # a snapshot in flight finishes first
            jobs.close()
            side.close()
            intake.close()
            if own:
                await asyncio.to_thread(eng.close)

    return lifespan


async def _follow_loop(eng: Engine, every_s: float) -> None:
    """Other processes write this data dir too (sibling workers, an ingest worker): replay
    their changes every ``every_s`` (cheap when nothing changed)."""
    while True:
        await asyncio.sleep(every_s)
        try:
            n = await asyncio.to_thread(eng.refresh)
            if n:
                log.info("picked up %d products changed by other processes", n)
        except (StorageError, OSError, VitrineError) as e:
            log.error("catching up with the data dir failed (%s); trying again in %gs", e, every_s)
        except Exception:  # a follower that dies silently serves stale results forever
            log.exception("catching up with the data dir failed; trying again in %gs", every_s)


async def _learn_loop(eng: Engine, side: SideWork, every_s: float) -> None:
    """Learn from the search log every ``every_s`` when new events arrived (vitrine/feedback/learning.py:
    a candidate is kept only if it beats what serves on a later slice of the log). One process of a
    data dir at a time (a lock file): sibling workers read the result from ``learned.json``."""
    seen = -1
    lock_path = Path(eng.data_dir) / "learn.lock"
    while True:
        await asyncio.sleep(every_s)
        try:
            n = (await side.run(eng.feedback.log.counts))["events"]
            if n == seen:
                continue
            with open(lock_path, "a+") as lock:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue  # a sibling worker is learning
                await side.run(eng.learn_from_log)
            seen = n
        except (StorageError, OSError, VitrineError) as e:
            log.error("learning from the search log failed (%s); trying again in %gs", e, every_s)
        except Exception:  # the loop must outlive one bad run
            log.exception("learning from the search log failed; trying again in %gs", every_s)


async def _retention_loop(eng: Engine, side: SideWork, every_s: float) -> None:
    """Forget searches and events older than the retention every ``every_s`` (the first time right
    away): retention holds without anyone running ``vitrine events purge``."""
    while True:
        try:
            n = await side.run(eng.feedback.purge)
            if n:
                log.info("retention: forgot %d searches and events", n)
        except (StorageError, OSError, VitrineError) as e:
            log.error("retention purge failed (%s); trying again in %gs", e, every_s)
        await asyncio.sleep(every_s)


async def _snapshot_loop(eng: Engine, every_s: float) -> None:
    """Writes are durable in the record store when they return; this snapshots the indexes
    every ``every_s`` when they changed, so a restart replays few changes."""
    while True:
        await asyncio.sleep(every_s)
        if not eng.needs_snapshot:
            continue
        try:
            await asyncio.to_thread(eng.save)
        except (StorageError, OSError) as e:
            log.error("index snapshot failed (%s); the record store still holds every change", e)
