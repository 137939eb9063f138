"""Kafka clients: connection options (brokers, TLS, SASL from ``Settings``), the dead-letter topic's
name, and creating topics explicitly (never relying on broker auto-creation). They take the
ingest section of the settings (``settings.ingest``)."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from vitrine.errors import InvalidInput, MissingExtra
from vitrine.settings import IngestSettings

log = logging.getLogger(__name__)


def kafka_module() -> Any:
    """kafka-python, or a clear error naming the extra to install."""
    try:
        import kafka
        import kafka.errors  # loads the submodule: callers catch k.errors.KafkaError
    except ImportError as e:
        raise MissingExtra("Kafka ingest needs kafka-python: pip install 'vitrine[kafka]'") from e
    return kafka


# -- clients -----------------------------------------------------------------------------------------
def client_options(s: IngestSettings, client_id: str = "vitrine",
                   bootstrap_timeout_ms: int = 10_000) -> dict[str, Any]:
    """kafka-python keyword arguments common to every client: brokers, TLS and SASL (from the
    ingest section of the settings)."""
    opts: dict[str, Any] = {
        "bootstrap_servers": [b.strip() for b in s.kafka_bootstrap.split(",") if b.strip()],
        "client_id": client_id,
        "security_protocol": s.kafka_security_protocol,
        "bootstrap_timeout_ms": bootstrap_timeout_ms,
    }
    if s.kafka_security_protocol in ("SSL", "SASL_SSL"):
        opts["ssl_check_hostname"] = s.kafka_ssl_check_hostname
        for key, value in (("ssl_cafile", s.kafka_ssl_cafile), ("ssl_certfile", s.kafka_ssl_certfile),
                           ("ssl_keyfile", s.kafka_ssl_keyfile)):
            if value is not None:
                opts[key] = str(value)
    if s.kafka_security_protocol.startswith("SASL"):
        if not s.kafka_sasl_mechanism:
            raise InvalidInput(f"security protocol {s.kafka_security_protocol} needs kafka_sasl_mechanism")
        opts["sasl_mechanism"] = s.kafka_sasl_mechanism
        opts["sasl_plain_username"] = s.kafka_sasl_username
        opts["sasl_plain_password"] = s.kafka_sasl_password.get_secret_value() if s.kafka_sasl_password else None
    return opts


def dlq_topic_for(s: IngestSettings, topic: str) -> str:
    return s.kafka_dlq_topic or f"{topic}.dlq"


def ensure_topics(s: IngestSettings, topics: Iterable[str], partitions: int | None = None,
                  bootstrap_timeout_ms: int = 10_000) -> list[str]:
    """Create the topics that do not exist (never relying on broker auto-creation, which makes
    4 partitions on Tansu). Returns the ones created; a broker that refuses is logged, not fatal."""
    k = kafka_module()
    from kafka.admin import NewTopic

    topics = list(dict.fromkeys(topics))
    admin = k.KafkaAdminClient(**client_options(s, "vitrine-admin", bootstrap_timeout_ms),
                               request_timeout_ms=10_000)
    created: list[str] = []
    try:
        existing = set(admin.list_topics())
        for t in topics:
            if t in existing:
                continue
            try:
                admin.create_topics([NewTopic(t, partitions or s.kafka_partitions, s.kafka_replication)],
                                    timeout_ms=10_000)
                created.append(t)
            except k.errors.TopicAlreadyExistsError:
                pass
            except k.errors.KafkaError as e:
                log.warning("could not create topic %s (%s); relying on it being created elsewhere", t, e)
    finally:
        admin.close()
    if created:
        log.info("created topics %s", created)
    return created
