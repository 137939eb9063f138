"""``vitrine serve --workers N``: API worker processes that share one copy of the indexes.

The supervising process opens the data dir once (the snapshot's vectors, the product graph, the
filter index, the native space), closes its stores, drops its models and forks the workers
(gunicorn with ``preload_app``; uvicorn-worker runs the ASGI app in each). Each worker loads its own
models and stores and serves the indexes it inherited (``Engine.open(..., loaded=)``), caught up
with the changes made after them: their pages stay shared copy-on-write until a worker changes
them, instead of every worker reading and building its own copy. ``gc.freeze()`` before the fork
keeps the collector from writing to (and so copying) every inherited object. gunicorn restarts a
worker that dies, forked again from the same loaded indexes.

torch and FAISS run single-threaded in the supervisor: GNU OpenMP's thread pool does not survive
a fork (a worker forked after a multi-threaded matmul hangs in its first one); the workers inherit
one torch thread each (N workers for N cores) unless ``VITRINE_TORCH_THREADS`` sets it. A worker whose
supervisor dies (killed, out of memory) is sent SIGTERM by the kernel (Linux's parent-death
signal): gunicorn's own check of its parent does not run in uvicorn's loop, and orphaned workers
kept serving, each holding its memory, after their supervisor was gone.
"""

from __future__ import annotations

import gc
import logging
import os
import signal
from typing import Any
from fastapi import FastAPI
from gunicorn.app.base import BaseApplication

from vitrine.search.engine import Engine
from vitrine.search.state import LoadedIndexes
from vitrine.settings import Settings
from vitrine.web.app import create_app
from vitrine.web.memory import libc_function, limit_heap_growth, trim_heap

log = logging.getLogger(__name__)

# a worker loads its models before it first answers gunicorn's heartbeat: give it that long
WORKER_BOOT_S = 300


def preload(settings: Settings) -> LoadedIndexes:
    """Open ``settings``' data dir in this (the supervising) process and return its indexes;
    its stores are closed and its models dropped, so only the indexes stay for the workers."""
    import torch

    from vitrine.index.vectors import set_search_threads

    if settings.web.tune_malloc:  # the models' weights come from mmap and go back when dropped
        limit_heap_growth()
    torch.set_num_threads(1)
    set_search_threads(1)
    engine = Engine.open(settings.updated(torch_threads=1, search_threads=1))
    try:
        engine.save()  # what opening rebuilt or replayed is snapshotted before the workers start
        loaded = engine.loaded_indexes()
    finally:
        engine.close()
    loaded.graph_data.mapper = None  # each worker maps categories with its own text tower
    del engine
    gc.collect()
    trim_heap()
    gc.freeze()
    return loaded


PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int) -> bool:
    """Ask the kernel to send this process SIGTERM when ``parent`` (its parent now) dies (Linux;
    elsewhere a no-op). Returns whether it is set."""
    prctl = libc_function("prctl", use_errno=True)
    if prctl is None:  # not Linux
        return False
    ok = prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0) == 0
    if os.getppid() != parent:  # it died before the signal was asked for
        os.kill(os.getpid(), signal.SIGTERM)
    return ok


def _post_fork(server: Any, worker: Any) -> None:
    die_with_parent(server.pid)


class SharedIndexServer(BaseApplication):
    """gunicorn serving the API in ``settings.web.workers`` processes forked after :func:`preload`."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        super().__init__()

    def load_config(self) -> None:
        web = self.settings.web
        host = f"[{web.host}]" if ":" in web.host else web.host  # an IPv6 address: gunicorn's [::]:port
        for key, value in {
            "bind": f"{host}:{web.port}", "workers": web.workers, "preload_app": True,
            "worker_class": "uvicorn_worker.UvicornWorker", "timeout": WORKER_BOOT_S,
            "graceful_timeout": 30, "loglevel": "warning", "accesslog": None, "post_fork": _post_fork,
        }.items():
            self.cfg.set(key, value)

    def load(self) -> FastAPI:
        loaded = preload(self.settings)
        log.info("indexes of %s loaded once (change %d), shared by %d workers", self.settings.storage.data_dir,
                 loaded.seq, self.settings.web.workers)
        return create_app(self.settings, loaded=loaded)


def serve_shared(settings: Settings) -> None:
    """Serve the API over ``settings``' data dir with ``settings.web.workers`` sharing processes."""
    SharedIndexServer(settings).run()
