"""Side work: what the API does beside answering shoppers (merchant analytics, experiment
reports, learning from the log, retention), on one thread of its own at a lower CPU priority.

A search must not wait for side work (issue 53). Reading analytics is a scan of the log; a
dashboard that polls it back to back keeps a core busy. On the request threads that core is
taken from searches; here the kernel gives searches the CPU first and the side work the rest:
on Linux a thread has its own nice value (``setpriority`` on the thread's id), so only this
thread is lowered. One thread: side work queues behind itself, never beside searches on more
cores than one, and a second report asked for while one runs waits instead of doubling the
scan. Elsewhere than Linux the priority stays as it is (logged once).

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
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


def lower_this_thread(nice: int) -> bool:
    """Lower the calling thread's CPU priority by ``nice`` (Linux: per thread); False where the
    platform cannot or the call was refused."""
    if nice <= 0 or not sys.platform.startswith("linux"):
        return False
    tid = threading.get_native_id()
    try:
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + nice))
    except OSError as e:
        log.warning("side work keeps the searches' CPU priority: setpriority refused (%s)", e)
        return False
    return True


class SideWork:
    """The API's side-work thread (see the module docstring); ``nice`` 0: same priority as searches."""

    def __init__(self, nice: int) -> None:
        self.nice = nice
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vitrine-side-work",
                                        initializer=self._start)
        self.lowered: bool | None = None  # known once the thread started

    def _start(self) -> None:
        self.lowered = lower_this_thread(self.nice)
        if self.nice and not self.lowered:
            log.info("side work runs at the searches' priority on this platform")

    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` on the side-work thread."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, functools.partial(fn, *args, **kwargs))

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
