"""When an ingest worker saves the engine's index snapshot: every ``kafka_snapshot_interval_s``
(0: after every batch), and once more on the way out. A snapshot is an optimisation only: the
record store already holds every applied change."""

from __future__ import annotations

import logging
import time

from vitrine.errors import StorageError
from vitrine.ingest.kafka.status import WorkerStats
from vitrine.search.engine import Engine
from vitrine.settings import Settings

log = logging.getLogger(__name__)


class Snapshots:
    """Saves ``engine``'s index snapshots on a worker's schedule, counting them in ``stats``."""

    def __init__(self, engine: Engine, settings: Settings, stats: WorkerStats) -> None:
        self.engine = engine
        self.interval_s = settings.ingest.kafka_snapshot_interval_s
        self.stats = stats
        self._last_mono = time.monotonic()

    @property
    def every_batch(self) -> bool:
        return self.interval_s == 0

    def maybe(self, force: bool = False) -> None:
        """Save when the interval has passed (``force``: now); a failure is logged, not raised."""
        if not force and (self.interval_s == 0 or time.monotonic() - self._last_mono < self.interval_s):
            return
        self._last_mono = time.monotonic()
        try:
            saved = self.engine.save()
        except (StorageError, OSError) as e:  # an optimisation only: the record store is durable
            log.error("index snapshot failed (%s); the record store still holds every change", e)
            return
        if saved:
            self._count()

    def final(self) -> None:
        """The snapshot on the way out (errors propagate)."""
        if self.engine.save():
            self._count()

    def _count(self) -> None:
        with self.stats.lock:
            self.stats.snapshots += 1
            self.stats.last_snapshot = time.time()
