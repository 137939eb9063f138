"""The Kafka catalogue stream: a consumer-group ingest worker, a publisher, and worker status.

Modules (import each name from its own): :mod:`.client` (connection options, topics),
:mod:`.publisher` (catalogue -> events), :mod:`.worker` (the consume loop), :mod:`.apply` (a batch
-> the engine), :mod:`.delivery` (the worker's Kafka clients, partitions, dead letters, commits),
:mod:`.snapshots` (index snapshots), :mod:`.status` (counters, status files, group lag, dead-letter
reading). Operations: docs/kafka.md.

Write path of one worker batch (docs/design.md)::

    poll <= kafka_batch_size events -> parse + validate (events.py) -> resolve photos
      -> Engine.upsert / Engine.delete   (one SQLite transaction each: durable on return)
      -> dead letters produced and acknowledged
      -> only then: commit the batch's offsets

At-least-once delivery plus idempotent application (unchanged records are skipped, versioned
ones never go backwards) gives exactly-once index state: a worker killed anywhere in that
sequence re-reads at most the uncommitted batch, and re-applying it changes nothing.

Index snapshots (``Engine.save``) are not needed for durability (the record store is the source
of truth and a restarted engine replays what its snapshot lacks); the worker writes one every
``kafka_snapshot_interval_s`` to keep restarts fast, and when it stops.

Bad messages never stop the worker: they go to the dead-letter topic (``<topic>.dlq`` by
default) with the original key and value bytes untouched and the reason in headers
(``vitrine.reason``, ``vitrine.kind``, ``vitrine.topic``, ``vitrine.partition``,
``vitrine.offset``), and are counted. Kinds: ``json``, ``schema``, ``key``, ``photo``,
``internal``.

Broker trouble (timeouts, a broker that went away, a broker restarted with its memory wiped) is
handled by closing and recreating the clients with backoff; a partition whose log end is behind
the worker's position (the broker lost the log) is re-read from the beginning, since Tansu
answers such fetches with nothing instead of OFFSET_OUT_OF_RANGE. Lag comes from the consumer's
``highwater()`` (Tansu's ListOffsets answer, hence ``end_offsets()``, is wrong).

Status: :meth:`.worker.IngestWorker.status` returns a plain dict (lag per partition, events by result,
events/s, dead letters, last-commit age, freshness); the worker also writes it atomically to
``<data dir>/kafka/<group>.<worker id>.json`` for ``vitrine consume --status``.
"""
